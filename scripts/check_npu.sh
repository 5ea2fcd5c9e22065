#!/usr/bin/env bash
# The NPU build check: in the venv with torch-npu (setup_npu_env in scripts/setup_env.sh), build npu_loss_ops
# with NPU_LOSS_OPS_NPU=1 and run scripts/check_npu_build.py (the _C_npu library, its libtorch_npu.so
# dependency, the symbol guard, the aclnn names it calls, the compile-time type guard, and an import
# without CANN). scripts/run_npu_emulated.sh then runs the kernels on the emulated CANN.
set -euo pipefail
# shellcheck source=setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
setup_npu_env
cd "$(mktemp -d)"
TORCH_DEVICE_BACKEND_AUTOLOAD=0 python "$REPO_ROOT/scripts/check_npu_build.py"
