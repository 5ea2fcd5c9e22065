#!/usr/bin/env bash
# What CI leaves out (README, "Supported versions"), run from a clean clone of the committed HEAD; each
# result is a row of docs/releases.md with the commit it ran on.
#
#   bash scripts/check_releases.sh                   every check below (hours: each release is a 5 GB install)
#   bash scripts/check_releases.sh 2.8.0 aarch64     only these (a torch release of build_config.py's table,
#                                                    aarch64, aarch64-npu, large, debug, rebuild,
#                                                    sanitizers, emulated);
#                                                    their rows are replaced
#   bash scripts/check_releases.sh 2.11.0/cpu        only that release's CPU suite
#   bash scripts/check_releases.sh 2.14.0/npu        only that release's NPU checks
#   bash scripts/check_releases.sh --verify          what CI runs: every row passed on a commit whose
#                                                    csrc/compat and release table are today's, and every
#                                                    release has its CPU suite and NPU build check in CI or
#                                                    here; rows due (aarch64 after a change to csrc/cpu,
#                                                    rebuild after one to setup.py) are listed
#
# CI runs the default release on x86-64 only. Per other torch release of the table: the CPU suite without the
# tests over 2**31 elements, and, where the release has a torch_npu, the NPU build check and the emulated NPU
# suite on 910B. "aarch64": the cross-build and the whole suite under qemu (scripts/aarch64.sh full);
# "aarch64-npu": the NPU build check against the aarch64 torch_npu wheel (scripts/aarch64.sh npu). "large": the
# tests over 2**31 elements at the default release. "debug": the whole suite (without those tests) from a
# DEBUG=1 build (-O0 -g), whose sums must have the release build's bits (tests/test_same_bits.py). "rebuild":
# the README's install command at the default release and then at the newest torch in one venv
# (scripts/check_rebuild.sh) and a slice of the suite from it. What CI runs in rotation, here in full:
# "sanitizers", the whole ASan and UBSan selection at every instruction set (scripts/run_sanitized.sh);
# "emulated", the whole device suite on every emulated chip family (scripts/run_npu_emulated.sh). The releases
# come from build_config.py; pip installs exactly torch==<release> (the registry's build: a CUDA build of about
# 5 GB for every release but the default) with its torch-npu.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TABLE="$REPO_ROOT/docs/releases.md"
cd "$REPO_ROOT"

if [[ "${1:-}" == "--verify" ]]; then
  exec python3 "$REPO_ROOT/scripts/release_table.py" verify "$TABLE"
fi

# The rows CI does not run, unless named on the command line.
if (($#)); then
  CHECKS=("$@")
else
  mapfile -t CHECKS < <(python3 scripts/release_table.py pending)
  CHECKS+=(aarch64 aarch64-npu large debug rebuild sanitizers emulated)
fi

COMMIT="$(git rev-parse HEAD)"
if [[ -n "$(git status --porcelain -- csrc npu_loss_ops tests setup.py build_config.py scripts)" ]]; then
  echo "check_releases: uncommitted changes are not checked; the rows name $COMMIT, as committed" >&2
fi
WORK="$REPO_ROOT/build/check_releases/${COMMIT:0:12}"
if [[ ! -d "$WORK/.git" ]]; then
  rm -rf "$WORK"
  git clone -q --no-hardlinks "$REPO_ROOT" "$WORK"
  git -C "$WORK" checkout -q "$COMMIT"
fi
# This machine's pip configuration caps torch below the newest release; each install here names its exact
# release, so the cap is lifted for them.
export PIP_CONSTRAINT=/dev/null NPU_LOSS_OPS_TORCH=pypi

_log() { printf '[check-releases %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# record TORCH ARCH CHECK LOG STATUS SECONDS: one row of the table, its counts read from the log.
record() {
  python3 "$REPO_ROOT/scripts/release_table.py" record "$TABLE" "$COMMIT" "$@"
}

# run TORCH ARCH CHECK COMMAND...: the command in the clean clone, logged, and its row recorded.
run() {
  local torch="$1" arch="$2" check="$3" status=0 t0=$SECONDS
  shift 3
  local log="$REPO_ROOT/build/check_releases/${torch}-${arch}-${check// /_}.log"
  _log "torch $torch, $arch: $check"
  (cd "$WORK" && "$@") >"$log" 2>&1 </dev/null || status=$?
  record "$torch" "$arch" "$check" "$log" "$status" "$((SECONDS - t0))"
  tail -n 3 "$log" >&2
}

# The CPU suite of one release, and its NPU build check and emulated 910B suite unless CI checks its NPU part
# (release_table.py pending --npu says which).
release_checks() {
  local torch="$1" only="${2:-}"
  export NPU_LOSS_OPS_TORCH_VERSION="$torch"
  if [[ "$only" != npu ]]; then
    run "$torch" x86_64 "CPU suite" env NPU_LOSS_OPS_FRESH_VENV=1 bash scripts/run_tests.sh -m "not large" -p no:cacheprovider
    rm -rf "$WORK/.venv-torch$torch"
  fi
  if [[ "$only" != cpu ]] && python3 "$REPO_ROOT/scripts/release_table.py" needs-npu "$torch"; then
    run "$torch" x86_64 "NPU build check" env NPU_LOSS_OPS_FRESH_VENV=1 bash scripts/check_npu.sh
    run "$torch" x86_64 "emulated NPU 910B" env NPU_LOSS_OPS_EMULATOR_DIR="$WORK/build/npu_emulator-torch$torch" \
      NPU_LOSS_OPS_EMULATOR_LOGS="$WORK/build/npu_emulator_logs-torch$torch" bash scripts/run_npu_emulated.sh 910B
    rm -rf "$WORK/.venv-npu-torch$torch"
  fi
  unset NPU_LOSS_OPS_TORCH_VERSION
}

mkdir -p "$REPO_ROOT/build/check_releases"
for check in "${CHECKS[@]}"; do
  case "$check" in
    aarch64)
      # The checkout's sysroot and aarch64 venv serve every clean clone (their torch is the default release's).
      run "$(python3 build_config.py --torch-version)" aarch64 "whole suite (qemu)" \
        env NPU_LOSS_OPS_AARCH64_DIR="$REPO_ROOT/build/aarch64" bash scripts/aarch64.sh full
      ;;
    aarch64-npu)
      run "$(python3 build_config.py --torch-version)" aarch64 "NPU build check (cross-built)" \
        env NPU_LOSS_OPS_AARCH64_DIR="$REPO_ROOT/build/aarch64" bash scripts/aarch64.sh npu
      ;;
    large)
      # NPU_LOSS_OPS_REBUILD=1 here and in "debug": the two share the clone's in-place build.
      run "$(python3 build_config.py --torch-version)" x86_64 "tests over 2**31 elements" \
        env NPU_LOSS_OPS_TORCH=cpu NPU_LOSS_OPS_REBUILD=1 NPU_LOSS_OPS_LARGE_TESTS=1 bash scripts/run_tests.sh -m large -p no:cacheprovider
      ;;
    debug)
      run "$(python3 build_config.py --torch-version)" x86_64 "whole suite from a DEBUG=1 build (-O0)" \
        env NPU_LOSS_OPS_TORCH=cpu NPU_LOSS_OPS_REBUILD=1 DEBUG=1 bash scripts/run_tests.sh -m "not large" -p no:cacheprovider
      ;;
    rebuild)
      newest="$(python3 build_config.py --role newest)"
      run "$newest" x86_64 "rebuild over $(python3 build_config.py --torch-version) (one venv), a slice of the suite" \
        bash scripts/check_rebuild.sh "$WORK/.venv-rebuild" "$(python3 build_config.py --torch-version)" "$newest" \
        tests/test_import.py tests/test_registration.py tests/test_signatures.py tests/test_functional.py
      rm -rf "$WORK/.venv-rebuild"
      ;;
    sanitizers)
      run "$(python3 build_config.py --torch-version)" x86_64 "sanitizers (ASan, UBSan), every instruction set" \
        env NPU_LOSS_OPS_TORCH=cpu bash scripts/run_sanitized.sh
      rm -rf "$WORK/.venv-sanitize"
      ;;
    emulated)
      run "$(python3 build_config.py --torch-version)" x86_64 "emulated NPU, every chip family" \
        env NPU_LOSS_OPS_TORCH=cpu bash scripts/run_npu_emulated.sh
      ;;
    [0-9]*/cpu) release_checks "${check%/cpu}" cpu ;;
    [0-9]*/npu) release_checks "${check%/npu}" npu ;;
    [0-9]*) release_checks "$check" ;;
    *) echo "check_releases: unknown check '$check' (a release of build_config.py, aarch64, aarch64-npu, large, debug, rebuild, sanitizers or emulated)" >&2; exit 2 ;;
  esac
done
python3 "$REPO_ROOT/scripts/release_table.py" verify "$TABLE"
