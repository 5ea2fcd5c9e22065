#!/usr/bin/env bash
# The NPU check CI can run without an NPU: in a second venv with torch-npu==2.13.0 (no CANN), build
# npu_loss_ops with NPU_LOSS_OPS_NPU=1 and run scripts/check_npu_build.py (the _C_npu library, its
# libtorch_npu.so dependency, the aclnn names it calls, the compile-time type guard, and a CPU import).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_DIR="${NPU_LOSS_OPS_NPU_VENV:-$REPO_ROOT/.venv-npu}"
PYTHON_BIN="${PYTHON:-python3.11}"
command -v "$PYTHON_BIN" >/dev/null 2>&1 || PYTHON_BIN=python3
log() { printf '[check_npu %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Without CANN, torch_npu's backend autoload would make `import torch` itself fail.
export TORCH_DEVICE_BACKEND_AUTOLOAD=0
export PIP_DISABLE_PIP_VERSION_CHECK=1

rm -rf "$VENV_DIR"
log "creating $VENV_DIR"
"$PYTHON_BIN" -m venv "$VENV_DIR"
# shellcheck disable=SC1091
source "$VENV_DIR/bin/activate"
python -m pip install -q --progress-bar off torch==2.13.0 ninja setuptools wheel pyyaml numpy
# --no-deps: torch-npu's own requirements would pull another torch.
python -m pip install -q --progress-bar off --no-deps torch-npu==2.13.0

# Build from a copy of the tracked sources so this build's artefacts never mix with the CPU venv's.
src="$(mktemp -d)"
trap 'rm -rf "$src"' EXIT
git -C "$REPO_ROOT" ls-files -z | (cd "$REPO_ROOT" && xargs -0 cp --parents -t "$src")
log "building with NPU_LOSS_OPS_NPU=1 (MAX_JOBS=${MAX_JOBS:-2})"
(cd "$src" && NPU_LOSS_OPS_NPU=1 MAX_JOBS="${MAX_JOBS:-2}" python -m pip install -q --progress-bar off \
  --no-build-isolation --no-deps .)

cd "$(mktemp -d)"
python "$REPO_ROOT/scripts/check_npu_build.py"
