# Sourced by scripts/check_npu.sh and scripts/run_npu_emulated.sh: one place that makes the venv with the
# real torch-npu wheel (no CANN on this machine) and installs npu_loss_ops into it with its NPU kernels.
#
#   setup_npu_venv       create or reuse the venv, install torch==2.13.0, torch-npu==2.13.0 and the tools
#   build_npu_package    build and install npu_loss_ops with NPU_LOSS_OPS_NPU=1 (skipped when up to date)
#
# Environment knobs:
#   NPU_LOSS_OPS_NPU_VENV    venv directory (default: <repo>/.venv-npu)
#   NPU_LOSS_OPS_FRESH_VENV  1 = delete and recreate the venv (CI does this)
#   PYTHON                   interpreter to build the venv from (default: python3.11, else python3)
#   MAX_JOBS                 parallel compile jobs (default 2)

# The torch pin, its installer (_install_torch: which build, from where, printed) and the build progress
# filter come from setup_env.sh.
# shellcheck source=setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
NPU_VENV_DIR="${NPU_LOSS_OPS_NPU_VENV:-$REPO_ROOT/.venv-npu}"
TORCH_NPU_PIN="torch-npu==${TORCH_PIN#torch==}"  # torch_npu releases match torch's version

_npu_log() { printf '[npu %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

setup_npu_venv() {
  local py="${PYTHON:-python3.11}"
  command -v "$py" >/dev/null 2>&1 || py=python3
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  if [[ "${NPU_LOSS_OPS_FRESH_VENV:-0}" == "1" ]]; then
    _npu_log "removing $NPU_VENV_DIR (fresh venv requested)"
    rm -rf "$NPU_VENV_DIR"
  fi
  if [[ ! -x "$NPU_VENV_DIR/bin/python" ]]; then
    _npu_log "creating $NPU_VENV_DIR"
    "$py" -m venv "$NPU_VENV_DIR"
  fi
  # shellcheck disable=SC1091
  source "$NPU_VENV_DIR/bin/activate"
  # find_spec, never import: torch_npu's import needs CANN.
  if ! python -c 'import importlib.util as u, sys
sys.exit(not all(u.find_spec(m) for m in ("torch", "torch_npu", "ninja", "pytest", "hypothesis", "expecttest", "numpy")))'; then
    _install_torch || return 1
    _npu_log "installing $TORCH_NPU_PIN (--no-deps: its requirements would pull another torch) and tools"
    python -m pip install -q --progress-bar off "$TORCH_PIN" ninja setuptools wheel pyyaml numpy pytest \
      expecttest hypothesis
    python -m pip install -q --progress-bar off --no-deps "$TORCH_NPU_PIN"
  fi
}

# A digest of everything the installed package is built from.
_npu_sources_digest() {
  (cd "$REPO_ROOT" && git ls-files -co --exclude-standard -- csrc npu_loss_ops setup.py pyproject.toml \
    | LC_ALL=C sort | xargs -d '\n' sha256sum | sha256sum | cut -d' ' -f1)
}

build_npu_package() {
  local stamp="$NPU_VENV_DIR/.npu_loss_ops.digest" digest
  digest="$(_npu_sources_digest)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$digest" ]]; then
    _npu_log "npu_loss_ops with _C_npu is up to date in $NPU_VENV_DIR"
    return 0
  fi
  # Build from a copy of the sources so this build's artefacts never mix with the CPU venv's editable build.
  local src
  src="$(mktemp -d)"
  (cd "$REPO_ROOT" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$src")
  local log="$REPO_ROOT/build/pip-build-npu.log" status
  mkdir -p "$REPO_ROOT/build"
  _npu_log "building npu_loss_ops with NPU_LOSS_OPS_NPU=1 (MAX_JOBS=${MAX_JOBS:-2}; 5 to 8 minutes on 2 cores; log: $log)"
  # Without CANN, torch_npu's backend autoload would make `import torch` in setup.py fail.
  (cd "$src" && TORCH_DEVICE_BACKEND_AUTOLOAD=0 NPU_LOSS_OPS_NPU=1 MAX_JOBS="${MAX_JOBS:-2}" \
    python -m pip install -v --progress-bar off --no-build-isolation --no-deps --force-reinstall . 2>&1
    echo "pip-exit-status $?") | tee "$log" | REPO_ROOT="$src" _show_build_progress
  rm -rf "$src"
  status="$(sed -n 's/^pip-exit-status //p' "$log" | tail -n 1)"
  if [[ "$status" != "0" ]]; then
    _npu_log "the build failed (pip exit status ${status:-unknown}); the end of $log:"
    grep -v '^pip-exit-status' "$log" | tail -n 60 >&2
    return 1
  fi
  echo "$digest" >"$stamp"
}
