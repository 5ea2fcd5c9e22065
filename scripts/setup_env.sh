# Sourced by every script in scripts/ (and so by .ci/run): the one place that turns a fresh machine into a
# venv with a torch release build_config.py names and npu_loss_ops built into it, for the CPU or with the
# NPU kernels.
#
#   setup_env [pip packages...]       .venv: torch (CPU build), the build tools, the packages, and npu_loss_ops
#                                     built in place (editable; skipped when up to date)
#   setup_npu_env [pip packages...]   .venv-npu: the same torch, torch-npu of the same version (--no-deps: its
#                                     requirements would pull another torch), the test tools, the packages, and
#                                     npu_loss_ops installed with its NPU kernels (skipped when the sources'
#                                     digest matches the last build's)
#   setup_venv DIR [pip packages...]  what both share: prerequisites, create or reuse the venv DIR and activate
#                                     it, torch and the build tools
#   sources_digest PATH...            one digest of the files under PATHs (the NPU build's and the emulator's
#                                     up-to-date stamps)
#
# Environment knobs:
#   NPU_LOSS_OPS_TORCH_VERSION  the torch release to install and build against (default: build_config.py's
#                            DEFAULT_TORCH; tested: its TESTED_RELEASES); torch_npu's release comes from the
#                            same table.
#   NPU_LOSS_OPS_FRESH_VENV  1 = delete and recreate the venv (CI does this)
#   PYTHON                   interpreter to build a venv from (default: python3.11, else python3 if 3.11)
#   NPU_LOSS_OPS_REBUILD     1 = rebuild the extension even when it looks up to date
#   MAX_JOBS                 parallel compile jobs (default 2)
#   NPU_LOSS_OPS_TORCH       which build of the pinned torch to install (see _install_torch):
#                              cpu (default)  the CPU build: a +cpu wheel pip already finds without an index
#                                             (a local wheel directory), else PyTorch's CPU wheel index; when
#                                             that index cannot be reached, the configured one (as pypi)
#                              pypi           whatever the configured index gives (from PyPI on x86-64
#                                             Linux: the CUDA build and its nvidia-* packages, several GB)
#   NPU_LOSS_OPS_TORCH_INDEX the index `cpu` installs from (default: PyTorch's CPU wheel index; e.g. a mirror)
#
# The one venv naming rule: <repo>/.venv, with "-npu" for the NPU venv, "-sanitize" for the sanitized build's
# (scripts/run_sanitized.sh) and "-torch<release>" for a release other than the default (.venv, .venv-npu,
# .venv-sanitize, .venv-torch2.9.1, .venv-npu-torch2.9.1).

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# PyTorch's CPU wheel index, or the mirror NPU_LOSS_OPS_TORCH_INDEX names.
TORCH_CPU_INDEX="${NPU_LOSS_OPS_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
DEBIAN_PACKAGES="python3 python3-dev python3-venv g++"
# What the installed package is built from: a change to any of them means a rebuild.
BUILD_INPUTS=(csrc npu_loss_ops setup.py pyproject.toml build_config.py)

_setup_log() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

_is_python311() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; }

_find_python() {
  local candidate
  for candidate in ${PYTHON:-} python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && _is_python311 "$candidate"; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}

_has_python_headers() {
  "$1" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null
}

_has_venv_module() { "$1" -c 'import venv, ensurepip' 2>/dev/null; }

_has_compiler() { command -v "${CXX:-g++}" >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1; }

# What is missing for the build, empty when nothing is.
_missing_prerequisites() {
  local py missing=()
  if ! py="$(_find_python)"; then
    missing+=("python3.11")
  else
    _has_python_headers "$py" || missing+=("Python 3.11 headers (Python.h)")
    _has_venv_module "$py" || missing+=("Python 3.11 venv/ensurepip module")
  fi
  _has_compiler || missing+=("a C++ compiler (g++)")
  if ((${#missing[@]})); then
    local IFS=", "
    printf '%s' "${missing[*]}"
  fi
}

# Install the system prerequisites with apt-get only when something is missing and we are allowed to.
_ensure_prerequisites() {
  local missing
  missing="$(_missing_prerequisites)"
  [[ -z "$missing" ]] && return 0
  if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
    _setup_log "missing: $missing; installing $DEBIAN_PACKAGES with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    # shellcheck disable=SC2086
    apt-get install -y -q $DEBIAN_PACKAGES
    missing="$(_missing_prerequisites)"
    [[ -z "$missing" ]] && return 0
  fi
  cat >&2 <<EOF
npu_loss_ops needs Python 3.11 (with its headers and the venv module) and a C++ compiler.
Still missing: $missing
On Debian/Ubuntu (as root): apt-get install -y $DEBIAN_PACKAGES   (python3 must be 3.11 there)
Elsewhere: install Python 3.11 (e.g. with pyenv) and g++, or point PYTHON=/path/to/python3.11.
The torch CPU wheel this project pins (build_config.py) is built for CPython 3.11.
EOF
  return 1
}

# The exact torch release to install (a looser pin pulls a multi-GB CUDA build), and torch_npu's release for
# it from build_config.py's table (empty for a release the table lacks: the CPU build still works).
_read_torch_pin() {
  if [[ ! "$TORCH_VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    _setup_log "NPU_LOSS_OPS_TORCH_VERSION must name an exact release such as $DEFAULT_TORCH, got '$TORCH_VERSION'"
    return 1
  fi
  TORCH_PIN="torch==$TORCH_VERSION"
  if TORCH_NPU_VERSION="$("$1" "$REPO_ROOT/build_config.py" --torch-npu-version "$TORCH_VERSION" 2>/dev/null)"; then
    [[ -n "$TORCH_NPU_VERSION" ]] || _setup_log "torch $TORCH_VERSION has no torch_npu line (build_config.py): the CPU part only"
  else
    TORCH_NPU_VERSION=""
    _setup_log "torch $TORCH_VERSION is not a tested release ($("$1" "$REPO_ROOT/build_config.py" --tested | paste -sd, -)); building against it anyway"
  fi
  TORCH_NPU_PIN="torch-npu==$TORCH_NPU_VERSION"
}

# True when PyTorch's CPU wheel index answers (it is the default source of a CPU build).
_cpu_index_reachable() {
  python - "$TORCH_CPU_INDEX" <<'PY' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=15)
PY
}

# _make_venv PYTHON DIR: create (or reuse) the venv DIR and activate it.
_make_venv() {
  local py="$1" dir="$2"
  if [[ "${NPU_LOSS_OPS_FRESH_VENV:-0}" == "1" && -e "$dir" ]]; then
    _setup_log "removing $dir (fresh venv requested)"
    rm -rf "$dir"
  fi
  if [[ -x "$dir/bin/python" ]] && _is_python311 "$dir/bin/python"; then
    _setup_log "reusing venv $dir"
  else
    rm -rf "$dir"
    _setup_log "creating venv $dir from $py"
    "$py" -m venv "$dir"
  fi
  # shellcheck disable=SC1091
  source "$dir/bin/activate"
}

_pip() {
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  local quiet=()
  [[ -n "${CI:-}" ]] && quiet=(--progress-bar off)
  python -m pip install "${quiet[@]}" "$@"
}

# The torch already in the venv (its full version), or nothing.
_installed_torch() {
  python - <<'PY' 2>/dev/null
import importlib.metadata as m
try:
    print(m.version("torch"))
except m.PackageNotFoundError:
    pass
PY
}

# The pinned torch wheel pip resolves without any index (from find-links, such as a local wheel
# directory in pip's configuration), as "version location", or nothing. Nothing is downloaded.
_local_torch_wheel() {
  local report
  report="$(python -m pip install --dry-run --no-index --no-deps --ignore-installed --quiet --report - \
    "$TORCH_PIN" 2>/dev/null)" || return 0
  python -c 'import json, sys
items = json.loads(sys.stdin.read() or "{}").get("install", [])
if items:
    from urllib.parse import unquote
    print(items[0]["metadata"]["version"], unquote(items[0]["download_info"]["url"]))' <<<"$report" 2>/dev/null
}

# Installs the pinned torch unless the venv has it (any build), saying which build and from where
# (NPU_LOSS_OPS_TORCH).
_install_torch() {
  local choice="${NPU_LOSS_OPS_TORCH:-cpu}" have local_wheel cmd
  have="$(_installed_torch)"
  if [[ "$have" == "$TORCH_VERSION" || "$have" == "$TORCH_VERSION"+* ]]; then
    _setup_log "torch $have is already in the venv; keeping it"
    return 0
  fi
  case "$choice" in
    cpu)
      local_wheel="$(_local_torch_wheel)"
      if [[ "${local_wheel%% *}" == *+cpu ]]; then
        _setup_log "torch: the CPU build torch ${local_wheel%% *}, which pip finds without an index: ${local_wheel#* }"
        cmd=(python -m pip install "$TORCH_PIN")
      elif _cpu_index_reachable; then
        _setup_log "torch: the CPU build from PyTorch's CPU wheel index $TORCH_CPU_INDEX"
        cmd=(python -m pip install "$TORCH_PIN" --index-url "$TORCH_CPU_INDEX")
      else
        _setup_log "torch: PyTorch's CPU wheel index $TORCH_CPU_INDEX cannot be reached; $TORCH_PIN as the configured index resolves it (from PyPI on x86-64 Linux: the CUDA build, several GB)"
        cmd=(python -m pip install "$TORCH_PIN")
      fi
      ;;
    pypi)
      _setup_log "torch: $TORCH_PIN as the configured index resolves it (from PyPI on x86-64 Linux: the CUDA build, several GB)"
      cmd=(python -m pip install "$TORCH_PIN")
      ;;
    *)
      _setup_log "NPU_LOSS_OPS_TORCH must be 'cpu' or 'pypi', got '$choice'"
      return 1
      ;;
  esac
  _setup_log "running: ${cmd[*]}"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "${cmd[@]}" ${CI:+--progress-bar off} || {
    _setup_log "installing torch failed: is the index reachable? NPU_LOSS_OPS_TORCH_INDEX=<url> names a mirror of $TORCH_CPU_INDEX, NPU_LOSS_OPS_TORCH=pypi uses the configured index"
    return 1
  }
  _setup_log "installed torch $(_installed_torch)"
}

# True when this venv has the package installed as this checkout's editable install, it imports there (it
# was built against this torch), and the compiled _C is newer than every build input. The venv is asked
# from outside the repository: from its root, Python would find the checkout's own files (an egg-info or
# in-place library another venv's build left) and answer for that venv instead.
_extension_up_to_date() {
  [[ "${NPU_LOSS_OPS_REBUILD:-0}" == "1" ]] && return 1
  local imported
  imported="$(cd / && python -c 'import os, npu_loss_ops; print(os.path.dirname(os.path.realpath(npu_loss_ops.__file__)))' 2>/dev/null)" \
    || return 1
  [[ "$imported" == "$(cd "$REPO_ROOT" && pwd -P)/npu_loss_ops" ]] || return 1
  local so
  so="$(compgen -G "$REPO_ROOT/npu_loss_ops/_C.*.so" | head -n 1)" || return 1
  [[ -n "$so" ]] || return 1
  [[ -z "$(cd "$REPO_ROOT" && find csrc setup.py pyproject.toml build_config.py -newer "$so" -print -quit)" ]]
}

# Editable install: the compiled _C lands inside npu_loss_ops/ in the repo, so running pytest or the
# example from the repo root imports the package together with its extension (a plain install would let
# the source directory shadow the installed copy, which has the .so). pip builds editables in a temporary
# directory, i.e. from scratch every time, hence the up-to-date check. pip runs verbosely into a log, and
# ninja's "[n/m]" step lines are shown as they come, one per compiled file.
_build_extension() {
  if _extension_up_to_date; then
    _setup_log "extension up to date, not rebuilding (NPU_LOSS_OPS_REBUILD=1 forces it)"
    return 0
  fi
  local log="$REPO_ROOT/build/pip-build.log" status
  mkdir -p "$REPO_ROOT/build"
  _setup_log "building npu_loss_ops with MAX_JOBS=${MAX_JOBS:-2}: 1 to 5 minutes on 2 cores (full log: $log)"
  (cd "$REPO_ROOT" && MAX_JOBS="${MAX_JOBS:-2}" python -m pip install -v --no-build-isolation --no-deps \
    ${CI:+--progress-bar off} -e . 2>&1; echo "pip-exit-status $?") | tee "$log" | _show_build_progress
  status="$(sed -n 's/^pip-exit-status //p' "$log" | tail -n 1)"
  if [[ "$status" != "0" ]]; then
    _setup_log "the build failed (pip exit status ${status:-unknown}); the end of $log:"
    grep -v '^pip-exit-status' "$log" | tail -n 60 >&2
    return 1
  fi
}

# Ninja's "[3/11] c++ ... -c /path/csrc/enable/aten_kernels.cpp -o ..." lines become "[build 12:00:01] [3/11] compiled
# csrc/enable/aten_kernels.cpp", and the link of each library "[build 12:00:09] linked npu_loss_ops/_C....so".
_show_build_progress() {
  local line compiled='^[[:space:]]*\[([0-9]+/[0-9]+)\] .* -c ([^ ]+)' linked=' -shared .* -o [^ ]*(npu_loss_ops/[^ /]+[.]so)'
  while IFS= read -r line; do
    if [[ "$line" =~ $compiled ]]; then
      printf '[build %s] [%s] compiled %s\n' "$(date +%H:%M:%S)" "${BASH_REMATCH[1]}" \
        "${BASH_REMATCH[2]#"$REPO_ROOT"/}" >&2
    elif [[ "$line" =~ $linked ]]; then
      printf '[build %s] linked %s\n' "$(date +%H:%M:%S)" "${BASH_REMATCH[1]}" >&2
    fi
  done
}

# The files under PATHs (relative to the repository) that git tracks or would track: untracked ones too, not
# ignored ones, nor tracked ones deleted in the work tree. NUL-separated, in a fixed order.
_source_files() {
  (cd "$REPO_ROOT" && git ls-files -z -co --exclude-standard -- "$@" | LC_ALL=C sort -z \
    | while IFS= read -r -d '' file; do if [[ -f "$file" ]]; then printf '%s\0' "$file"; fi; done)
}

# One digest of the names and contents of the files under PATHs: it changes with any edit, addition or removal.
sources_digest() {
  _source_files "$@" | (cd "$REPO_ROOT" && xargs -0r sha256sum) | sha256sum | cut -d' ' -f1
}

# in_rotation ITEM...: the one CI runs at this commit (HEAD's hash picks it, so a rerun of a commit runs the
# same one; docs/usage.md, "CI and the release checks").
in_rotation() {
  local commit
  commit="$(git -C "$REPO_ROOT" rev-parse HEAD)"
  shift "$((16#${commit:0:8} % $#))"
  echo "$1"
}

# The pytest-xdist workers the test scripts start: NPU_LOSS_OPS_TEST_WORKERS, or the CPUs this process may
# use, at most 4 (a distillation test holds up to 2 GB); 1 runs the tests in pytest's own process.
test_workers() {
  local n="${NPU_LOSS_OPS_TEST_WORKERS:-}"
  if [[ -z "$n" ]]; then
    n="$(nproc 2>/dev/null || echo 1)"
    ((n <= 4)) || n=4
  fi
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "NPU_LOSS_OPS_TEST_WORKERS must be a positive integer, got '$n'" >&2; return 1; }
  if ((n == 1)); then echo "-p no:xdist"; else echo "-n $n"; fi
}

# setup_venv DIR [pip packages...]: the prerequisites, the venv DIR (activated), torch and the build tools.
setup_venv() {
  local dir="$1" py t0=$SECONDS
  shift
  _ensure_prerequisites || return 1
  py="$(_find_python)" || return 1
  _read_torch_pin "$py" || return 1
  _make_venv "$py" "$dir" || return 1
  _install_torch || return 1
  _setup_log "installing tools: ninja setuptools wheel $*"
  _pip "$TORCH_PIN" ninja setuptools wheel "$@" || return 1
  _setup_log "packages ready in $((SECONDS - t0))s"
}

setup_env() {
  local t0=$SECONDS t1
  setup_venv "$VENV_DIR" "$@" || return 1
  t1=$SECONDS
  _build_extension || return 1
  _setup_log "extension ready in $((SECONDS - t1))s"
  # torch's own "Failed to initialize NumPy" warning (NumPy is optional) is left to the command that follows.
  python -W "ignore:Failed to initialize NumPy" -c 'import torch, npu_loss_ops; print("[setup] torch",
      torch.__version__, "| npu_loss_ops from", npu_loss_ops.__file__)' >&2 || return 1
  _setup_log "environment ready in $((SECONDS - t0))s"
}

# Builds and installs npu_loss_ops with NPU_LOSS_OPS_NPU=1 into the active venv, unless the sources' digest
# matches the one stamped by the last build there.
_build_npu_package() {
  local stamp="$VIRTUAL_ENV/.npu_loss_ops.digest" digest
  digest="$(sources_digest "${BUILD_INPUTS[@]}")"
  if [[ "${NPU_LOSS_OPS_REBUILD:-0}" != "1" && -f "$stamp" && "$(cat "$stamp")" == "$digest" ]]; then
    _setup_log "npu_loss_ops with _C_npu is up to date in $VIRTUAL_ENV (NPU_LOSS_OPS_REBUILD=1 forces a build)"
    return 0
  fi
  # Built in the checkout: setup.py compiles into a directory per build key (torch, torch_npu, architecture,
  # compiler, flags), so the CPU venv's objects of the same torch are reused and no other build's are.
  local log="$REPO_ROOT/build/pip-build-npu.log" status
  mkdir -p "$REPO_ROOT/build"
  _setup_log "building npu_loss_ops with NPU_LOSS_OPS_NPU=1 (MAX_JOBS=${MAX_JOBS:-2}; 2 to 8 minutes on 2 cores; log: $log)"
  # Without CANN, torch_npu's backend autoload would make `import torch` in setup.py fail.
  (cd "$REPO_ROOT" && TORCH_DEVICE_BACKEND_AUTOLOAD=0 NPU_LOSS_OPS_NPU=1 MAX_JOBS="${MAX_JOBS:-2}" \
    python -m pip install -v --progress-bar off --no-build-isolation --no-deps --force-reinstall . 2>&1
    echo "pip-exit-status $?") | tee "$log" | _show_build_progress
  status="$(sed -n 's/^pip-exit-status //p' "$log" | tail -n 1)"
  if [[ "$status" != "0" ]]; then
    _setup_log "the build failed (pip exit status ${status:-unknown}); the end of $log:"
    grep -v '^pip-exit-status' "$log" | tail -n 60 >&2
    return 1
  fi
  echo "$digest" >"$stamp"
}

# The venv with the real torch-npu wheel (no CANN needed to install or build) and npu_loss_ops with _C_npu.
setup_npu_env() {
  local t0=$SECONDS t1
  local py
  if py="$(_find_python)" && [[ -z "$("$py" "$REPO_ROOT/build_config.py" --torch-npu-version "$TORCH_VERSION" 2>/dev/null)" ]]; then
    _setup_log "no torch_npu release is paired with torch $TORCH_VERSION (build_config.py, TESTED_RELEASES)"
    return 1
  fi
  setup_venv "$NPU_VENV_DIR" pyyaml numpy pytest expecttest hypothesis mypy==2.4.1 "$@" || return 1
  _setup_log "installing $TORCH_NPU_PIN (--no-deps: its requirements would pull another torch)"
  _pip --no-deps "$TORCH_NPU_PIN" || return 1
  t1=$SECONDS
  _build_npu_package || return 1
  _setup_log "NPU package ready in $((SECONDS - t1))s; environment ready in $((SECONDS - t0))s"
}

# The release to install and the venvs' names (the one naming rule above), from build_config.py: any python3
# reads it, and where there is none yet, _ensure_prerequisites installs one first.
_release_and_venvs() {
  DEFAULT_TORCH="$(python3 "$REPO_ROOT/build_config.py" --torch-version)" || return 1
  TORCH_VERSION="${NPU_LOSS_OPS_TORCH_VERSION:-$DEFAULT_TORCH}"
  local suffix=""
  [[ "$TORCH_VERSION" == "$DEFAULT_TORCH" ]] || suffix="-torch$TORCH_VERSION"
  VENV_DIR="$REPO_ROOT/.venv$suffix"
  NPU_VENV_DIR="$REPO_ROOT/.venv-npu$suffix"
}
if ! command -v python3 >/dev/null 2>&1; then
  _ensure_prerequisites || return 1
fi
_release_and_venvs || return 1
