#!/usr/bin/env bash
# The NPU build check: in the venv with torch-npu==2.13.0 (scripts/npu_env.sh), build npu_loss_ops with
# NPU_LOSS_OPS_NPU=1 and run scripts/check_npu_build.py (the _C_npu library, its libtorch_npu.so
# dependency, the symbol guard, the aclnn names it calls, the compile-time type guard, and an import
# without CANN). scripts/run_npu_emulated.sh then runs the kernels on the emulated CANN.
set -euo pipefail
# shellcheck source=npu_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/npu_env.sh"
setup_npu_venv
build_npu_package
cd "$(mktemp -d)"
TORCH_DEVICE_BACKEND_AUTOLOAD=0 python "$REPO_ROOT/scripts/check_npu_build.py"
