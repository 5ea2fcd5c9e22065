#!/usr/bin/env bash
# The test suite under AddressSanitizer and UBSan (docs/usage.md, "A sanitized build"). In the venv
# .venv-sanitize (the same torch as .venv), npu_loss_ops is installed with NPU_LOSS_OPS_SANITIZE=address,undefined
# (-O1 -g1 -fno-wrapv, the runtimes linked), then pytest runs with the ASan runtime preloaded (torch is not
# instrumented, so it must come first) and every report written under build/sanitizer-logs/. Any report
# fails the run, a spawned worker's (DDP, DTensor) too.
#
#   bash scripts/run_sanitized.sh              the whole selection (scripts/check_releases.sh's "sanitizers"
#                                              row): the kernel, out=, layout, autograd and enable() tests at
#                                              the best instruction set the CPU has (the ISA tests run every
#                                              sample at every other one), then the kernel and out= tests at
#                                              the baseline
#   bash scripts/run_sanitized.sh --build-only the venv and the sanitized build, no test (CI, in the background)
#   bash scripts/run_sanitized.sh --ci         CI's: the kernels' and autograd's tests (test_sanitizer.py,
#                                              test_correctness.py, test_layouts.py, test_autograd_nodes.py) at
#                                              one instruction set the CPU runs, in rotation by commit
#                                              (NPU_LOSS_OPS_SANITIZE_ISA names one)
#   bash scripts/run_sanitized.sh tests/test_dtensor.py tests/test_ddp.py
#                                              the distributed tests, which CI's selection leaves out
#   bash scripts/run_sanitized.sh tests/X.py   pytest arguments instead (run from outside the checkout, so
#                                              paths are made absolute: tests/... means $REPO_ROOT/tests/...)
#
# The emulated NPU suite is not run here, nor the tests over 2**31 elements (they are opt-in).
set -euo pipefail
# shellcheck source=setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
SANITIZERS=address,undefined
t0=$SECONDS
setup_venv "$REPO_ROOT/.venv-sanitize" pytest pytest-xdist==3.8.0 expecttest numpy hypothesis
# The build is skipped when the venv holds one of these very sources (a stamp of their digest): CI builds it
# ahead, in the background (--build-only), and runs the tests later.
stamp="$VIRTUAL_ENV/.npu_loss_ops.sanitized-digest"
digest="$(sources_digest "${BUILD_INPUTS[@]}")-$SANITIZERS"
if [[ "${NPU_LOSS_OPS_REBUILD:-0}" != 1 && -f "$stamp" && "$(cat "$stamp")" == "$digest" ]]; then
  _setup_log "the sanitized build in $VIRTUAL_ENV is up to date (NPU_LOSS_OPS_REBUILD=1 forces a build)"
else
  rm -f "$stamp"
  _setup_log "building npu_loss_ops with NPU_LOSS_OPS_SANITIZE=$SANITIZERS (MAX_JOBS=${MAX_JOBS:-2}; log: build/pip-build-sanitize.log)"
  mkdir -p "$REPO_ROOT/build"
  (cd "$REPO_ROOT" && NPU_LOSS_OPS_SANITIZE=$SANITIZERS MAX_JOBS="${MAX_JOBS:-2}" python -m pip install -v \
    --progress-bar off --no-build-isolation --no-deps --force-reinstall . >build/pip-build-sanitize.log 2>&1) || {
    tail -n 60 "$REPO_ROOT/build/pip-build-sanitize.log" >&2
    exit 1
  }
  echo "$digest" >"$stamp"
  _setup_log "sanitized build installed in $((SECONDS - t0))s"
fi
[[ "${1:-}" != "--build-only" ]] || exit 0

logs="$REPO_ROOT/build/sanitizer-logs"
rm -rf "$logs"
mkdir -p "$logs"
asan_runtime="$(${CXX:-c++} -print-file-name=libasan.so)"
[[ -f "$asan_runtime" ]] || { echo "run_sanitized: the compiler has no libasan.so ($asan_runtime)" >&2; exit 1; }
# libstdc++ preloaded with it: python does not link it, and ASan's __cxa_throw interceptor, which looks for the
# real function when the runtime starts, would otherwise find none (a CHECK failure at torch's first throw).
# detect_leaks=0: CPython and torch keep their allocations to exit. allocator_may_return_null=1: a failed
# allocation raises in torch as under glibc, instead of ASan stopping the process.
export LD_PRELOAD="$asan_runtime $(${CXX:-c++} -print-file-name=libstdc++.so)"
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:log_path=$logs/asan"
export UBSAN_OPTIONS="print_stacktrace=1:log_path=$logs/ubsan"
export NPU_LOSS_OPS_EXPECT_SANITIZERS=$SANITIZERS
unset NPU_LOSS_OPS_CPU_ISA

# From outside the checkout, so that the installed (sanitized) package is imported, not the source folder.
workers="$(test_workers)"
# In pytest-xdist workers (scripts/run_tests.sh): each inherits LD_PRELOAD and the options, and the reports
# are per process (log_path.PID).
run_pytest() {
  # shellcheck disable=SC2086  # $workers is "-n N" or "-p no:xdist"
  (cd "$(mktemp -d)" && python -m pytest $workers -q -p no:cacheprovider -rs "$@")
}
status=0
if [[ "${1:-}" == "--ci" ]]; then
  shift
  T="$REPO_ROOT/tests"
  # The instruction sets this CPU runs, as the sanitized build reports them; the commit picks one.
  read -r -a isas <<<"$(cd / && python -c 'import npu_loss_ops; print(*npu_loss_ops.build_info()["cpu_isas_available"])')"
  ((${#isas[@]})) || { echo "run_sanitized: the build reports no instruction set" >&2; exit 1; }
  isa="${NPU_LOSS_OPS_SANITIZE_ISA:-$(in_rotation "${isas[@]}")}"
  echo "run_sanitized: CI's selection at $isa (of ${isas[*]}: one per commit, in rotation)"
  NPU_LOSS_OPS_CPU_ISA="$isa" run_pytest "$T/test_sanitizer.py" "$T/test_correctness.py" "$T/test_layouts.py" \
    "$T/test_autograd_nodes.py" "$@" || status=$?
elif (($#)); then
  args=()
  for arg in "$@"; do
    if [[ "$arg" == tests/* ]]; then args+=("$REPO_ROOT/$arg"); else args+=("$arg"); fi
  done
  run_pytest "${args[@]}" || status=$?
else
  T="$REPO_ROOT/tests"
  # Not DTensor's and DDP's tests: their gloo workers each start torch under the ASan runtime, the kernels they
  # reach are test_correctness.py's, and CI's 90 minutes do not hold them (run them by name, as below).
  best=(test_sanitizer.py test_same_bits.py test_correctness.py test_properties.py test_layouts.py
    test_memory_format.py test_determinism.py test_cpu_isa.py test_autograd_nodes.py test_enable.py
    test_robustness.py)
  run_pytest "${best[@]/#/$T/}" || status=$?
  NPU_LOSS_OPS_CPU_ISA=baseline run_pytest "$T/test_correctness.py" -k "op or out" || status=$?
fi
reports=("$logs"/*)
if [[ -e "${reports[0]}" ]]; then
  echo "run_sanitized: ${#reports[@]} sanitizer report(s):" >&2
  for report in "${reports[@]}"; do
    echo "== $report" >&2
    head -n 40 "$report" >&2
  done
  status=1
else
  echo "run_sanitized: 0 sanitizer reports"
fi
echo "run_sanitized: exit $status after $((SECONDS - t0))s"
exit "$status"
