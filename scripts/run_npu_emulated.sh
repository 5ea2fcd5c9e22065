#!/usr/bin/env bash
# Run the NPU kernels for real without an NPU: the unmodified torch_npu 2.13.0 over the host-emulated CANN
# in tests/npu_emulator/, once per emulated chip family, each in its own process.
#
#   bash scripts/run_npu_emulated.sh                 # all six families (910_93, the 910B family's second SoC:
#                                                    # its chip-path tests), the older-CANN run, the examples
#   bash scripts/run_npu_emulated.sh 910B 950        # only these families
#   NPU_EMU_PYTEST_ARGS="-x -k backward" bash scripts/run_npu_emulated.sh 910B
#   NPU_LOSS_OPS_EMU_SUITE_FAMILIES="910B 310P" bash scripts/run_npu_emulated.sh
#                                                    # the whole suite on these two only; on the others the
#                                                    # chip-path tests and the launch check
#   bash scripts/run_npu_emulated.sh --ci            # CI's: the same with 910B and one of 950, 910, 310P
#                                                    # and 310B, in rotation by commit
#
# Per family: the device-parametrised test suite on device="npu" (NPU_LOSS_OPS_TEST_DEVICE=npu), compared
# with the CPU kernels, plus tests/test_npu_paths.py, which asserts from the emulator's trace which aclnn
# API each op ran on that chip; then benchmarks/npu_launches.py, which counts the aclnn launches of every
# loss x dtype x reduction and fails if any row launches more than benchmarks/results/npu_launches.json
# (to update that table after a deliberate change: see benchmarks/README.md, "NPU launches"). Then one run over an emulated older CANN that lacks the loss APIs
# (every op must take the composite path, without an error), examples/train.py and examples/distill.py on
# the emulated NPU, and tests/test_npu_rejection.py (each aclnn API the package calls, rejected in turn on every
# family and TASK_QUEUE_ENABLE).
set -euo pipefail
# shellcheck source=setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"

ALL_FAMILIES=(910B 910_93 950 910 310P 310B)
if [[ "${1:-}" == "--ci" ]]; then
  shift
  # 910B, and one of the families after it and 910_93 (its second SoC, the same chip paths)
  NPU_LOSS_OPS_EMU_SUITE_FAMILIES="910B $(in_rotation "${ALL_FAMILIES[@]:2}")"
  echo "run_npu_emulated: the whole suite on $NPU_LOSS_OPS_EMU_SUITE_FAMILIES (the second in rotation by commit)"
fi
if (($#)); then FAMILIES=("$@"); else FAMILIES=("${ALL_FAMILIES[@]}"); fi
EMU_DIR="${NPU_LOSS_OPS_EMULATOR_DIR:-$REPO_ROOT/build/npu_emulator}"
LOG_DIR="${NPU_LOSS_OPS_EMULATOR_LOGS:-$REPO_ROOT/build/npu_emulator_logs}"
read -r -a PYTEST_ARGS <<<"${NPU_EMU_PYTEST_ARGS:-}"

_emu_log() { printf '[npu-emulated %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

setup_npu_env
emu_digest="$(sources_digest tests/npu_emulator)"
if [[ -f "$EMU_DIR/.digest" && "$(cat "$EMU_DIR/.digest")" == "$emu_digest" ]]; then
  _emu_log "the emulated CANN in $EMU_DIR is up to date"
else
  _emu_log "building the emulated CANN into $EMU_DIR"
  PATH="$NPU_VENV_DIR/bin:$PATH" bash "$REPO_ROOT/tests/npu_emulator/build.sh" "$EMU_DIR"
  echo "$emu_digest" >"$EMU_DIR/.digest"
fi
mkdir -p "$LOG_DIR"

# `export` lines for the emulator's environment of one family (tests/npu_emulator/emulator.py).
emulator_exports() {
  python - "$REPO_ROOT/tests/npu_emulator" "$EMU_DIR" "$@" <<'PY'
import os, shlex, sys
sys.path.insert(0, sys.argv[1])
import emulator
family, variant = sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else ""
env = emulator.env(family, sys.argv[2], without_loss_apis=(variant == "without-loss-apis"))
for key in sorted(set(os.environ) - set(env)):
    print(f"unset {key}")
for key, value in sorted(env.items()):
    if os.environ.get(key) != value:
        print(f"export {key}={shlex.quote(value)}")
PY
}

# The aclnn APIs the chip paths name (csrc/losses.h, through _C._chip_paths()), in their order, read once from
# the installed package (outside the checkout; torch_npu's backend autoload off: no CANN here).
LOSS_APIS="$(cd / && TORCH_DEVICE_BACKEND_AUTOLOAD=0 python -c '
from npu_loss_ops import _C
print(" ".join(dict.fromkeys(r["api"] for r in _C._chip_paths() if r["api"] != "composite")))')"
_emu_log "the loss APIs of the chip paths: $LOSS_APIS"

# The emulator's counts for a whole run: each loss API, the rest in one line, and any aclop or rejection.
print_trace() {
  python - "$@" <<'PY'
import json, os, sys
name, path, loss = sys.argv[1], sys.argv[2], tuple(sys.argv[3].split())
if not os.path.exists(path):
    sys.exit(print(f"trace {name}: none written"))
trace = json.load(open(path))
print(f"trace {name}: " + ", ".join(f"{api} {trace.get(api, 0)}" for api in loss))
other = {k: v for k, v in trace.items() if k.startswith("aclnn") and k not in loss and ":" not in k}
rejected = {k: v for k, v in trace.items() if "GetWorkspaceSize:" in k}
aclop = {k: v for k, v in trace.items() if k.startswith("aclop:")}
print(f"trace {name}: {len(other)} other aclnn operators, {sum(other.values())} calls; "
      f"rejected calls {sum(rejected.values())}; aclop calls {sum(aclop.values())}")
# The kernels must never send a call the chip rejects (it poisons torch_npu's queue), nor reach aclop.
if rejected or aclop:
    sys.exit(print(f"trace {name}: FAIL: {rejected} {aclop}"))
PY
}

# run NAME FAMILY VARIANT COMMAND...: one emulated process, its output in $LOG_DIR/NAME.log.
# Runs go NPU_LOSS_OPS_EMU_JOBS at a time (default 2: each is one process, mostly single-threaded Python, and
# the families are independent); each writes its log, its report (the lines below) and its summary line into
# LOG_DIR, printed in the order the runs started once all have finished.
JOBS="${NPU_LOSS_OPS_EMU_JOBS:-2}"
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || { echo "NPU_LOSS_OPS_EMU_JOBS must be a positive integer, got '$JOBS'" >&2; exit 2; }
declare -a NAMES=()
run() {
  local name="$1" family="$2" variant="$3"
  shift 3
  local t0=$SECONDS rc=0 log="$LOG_DIR/$name.log" report="$LOG_DIR/$name.report"
  _emu_log "[$name] emulated $family${variant:+ ($variant)}: $*"
  (
    eval "$(emulator_exports "$family" "$variant")"
    export NPU_LOSS_OPS_TEST_DEVICE=npu
    export NPU_EMU_TRACE_FILE="$LOG_DIR/$name.trace.json"
    cd "$(mktemp -d)"  # import the installed package, never the source tree
    "$@"
  ) >"$log" 2>&1 || rc=$?
  {
    # The per-kind counts and the pytest summary, into CI's log.
    grep -E '^(npu-suite|NPU |=+ .*(passed|failed|error)|[0-9]+ (passed|failed)|OK:|MISMATCH)' "$log" || tail -n 30 "$log"
    if [[ "$name" == launches-* ]]; then
      : # torch_npu's own F may reach aclop or an API the emulator lacks: the table says so in that cell
    else
      print_trace "$name" "$LOG_DIR/$name.trace.json" "$LOSS_APIS" || rc=1
    fi
    if ((rc != 0)); then
      echo "[$name] failed (exit $rc); last lines of $log:"
      tail -n 40 "$log"
    fi
  } >"$report" 2>&1
  printf '%-28s %-6s %4ss  %s\n' "$name" "$([[ $rc == 0 ]] && echo ok || echo FAIL)" "$((SECONDS - t0))" \
    "$(grep -Eo '[0-9]+ passed[^=]*' "$log" | tail -n 1)" >"$LOG_DIR/$name.summary"
  _emu_log "[$name] $([[ $rc == 0 ]] && echo ok || echo FAILED) after $((SECONDS - t0))s"
  return "$rc"
}
# start NAME ...: run in the background once fewer than JOBS runs are going.
start() {
  while (($(jobs -rp | wc -l) >= JOBS)); do wait -n || true; done
  rm -f "$LOG_DIR/$1.report" "$LOG_DIR/$1.summary"
  NAMES+=("$1")
  run "$@" &
}

LAUNCH_TABLE="$REPO_ROOT/benchmarks/results/npu_launches.json"
t_all=$SECONDS
# 910_93 (Atlas A3) is the 910B family's second SoC: the same chip paths (csrc/chips/paths.cpp) and, in the
# emulator, the same kernels. In the run of all families it takes the chip-path tests (which API each op
# runs there, its SoC name's family) and the launch check; named on the command line, the whole suite.
SAME_AS_910B=()
(($#)) || SAME_AS_910B=(910_93)
# NPU_LOSS_OPS_EMU_SUITE_FAMILIES="910B 310P": only these families run the whole suite; the others run the
# chip-path tests and the launch check (CI: 910B and one family in rotation; docs/usage.md, "Testing").
read -r -a SUITE_FAMILIES <<<"${NPU_LOSS_OPS_EMU_SUITE_FAMILIES:-}"
for family in "${SUITE_FAMILIES[@]}"; do
  [[ " ${ALL_FAMILIES[*]} " == *" $family "* ]] || { echo "NPU_LOSS_OPS_EMU_SUITE_FAMILIES: unknown family '$family' (${ALL_FAMILIES[*]})" >&2; exit 2; }
done
for family in "${FAMILIES[@]}"; do
  if [[ " ${SAME_AS_910B[*]} " == *" $family "* ]] \
      || { ((${#SUITE_FAMILIES[@]})) && [[ " ${SUITE_FAMILIES[*]} " != *" $family "* ]]; }; then
    start "paths-$family" "$family" "" python -m pytest "$REPO_ROOT/tests/test_npu_paths.py" -q -p no:cacheprovider \
      "${PYTEST_ARGS[@]}"
  else
    start "suite-$family" "$family" "" python -m pytest "$REPO_ROOT/tests" -q -p no:cacheprovider "${PYTEST_ARGS[@]}"
  fi
  # The launch table's rows for this family; fails if a row of ours launches more than the committed table.
  start "launches-$family" "$family" "" python "$REPO_ROOT/benchmarks/npu_launches.py" \
    --json "$LOG_DIR/launches-$family.json" --check "${NPU_LOSS_OPS_LAUNCH_TABLE:-$LAUNCH_TABLE}" \
    ${NPU_LOSS_OPS_LAUNCH_BASELINES:+--baselines}
done
if (($# == 0)); then
  start "older-cann-910B" 910B without-loss-apis \
    python -m pytest "$REPO_ROOT/tests/test_npu_paths.py" -q -p no:cacheprovider "${PYTEST_ARGS[@]}"
  # The examples import torch_npu as users do; run_script.py imports it first, through the harness's step.
  start "example-train-910B" 910B "" python "$REPO_ROOT/tests/npu_emulator/run_script.py" \
    "$REPO_ROOT/examples/train.py" --device npu
  start "example-distill-910B" 910B "" python "$REPO_ROOT/tests/npu_emulator/run_script.py" \
    "$REPO_ROOT/examples/distill.py" --device npu --steps 5 --vocab 2048
  # Each aclnn API the package calls, rejected in turn on every family under TASK_QUEUE_ENABLE 0, 1 and 2 (the
  # test starts one emulated worker per family and mode; it is not a device-suite run itself).
  start "rejections" 910B "" env -u NPU_LOSS_OPS_TEST_DEVICE NPU_LOSS_OPS_EMULATOR_DIR="$EMU_DIR" \
    python -m pytest "$REPO_ROOT/tests/test_npu_rejection.py" -q -p no:cacheprovider -rs
fi
wait

status=0
for name in "${NAMES[@]}"; do
  echo "== $name"
  cat "$LOG_DIR/$name.report" 2>/dev/null || { echo "[$name] wrote no report"; status=1; }
done
echo "emulated NPU runs, $JOBS at a time, $((SECONDS - t_all))s in all (logs in $LOG_DIR):"
for name in "${NAMES[@]}"; do
  line="$(cat "$LOG_DIR/$name.summary" 2>/dev/null || printf '%-28s FAIL   (no summary)' "$name")"
  printf '  %s\n' "$line"
  [[ "$line" =~ ^[^[:space:]]+[[:space:]]+ok[[:space:]] ]] || status=1
done
exit "$status"
