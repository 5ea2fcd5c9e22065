#!/usr/bin/env bash
# CI stage: TRL 1.16.0's real trainers (trl.DistillationTrainer and trl.experimental.gkd.GKDTrainer) on tiny
# randomly initialised models, each run plain and inside npu_loss_ops.trl.patch() (tests/with_trl).
#
# They run in a venv of their own, .venv-trl beside .venv (TRL_VENV names another path), which reuses .venv's torch
# build and its built npu_loss_ops instead of installing torch: a .pth file in .venv-trl's site-packages adds
# .venv's site-packages behind its own (site.addsitedir, so .venv's editable-install finder for npu_loss_ops is
# installed too). Everything else comes from scripts/trl_constraints.txt, exact pins of trl, transformers,
# accelerate, datasets and all they require (torch excepted), installed with --no-deps before the .pth exists, so
# every listed package lands in .venv-trl itself and pip never considers torch. With the .pth in place the stage
# then checks that torch is .venv's, that no torch or nvidia-* package is in .venv-trl, that `pip check` finds no
# broken requirement, and that the resolver, given the pins as constraints, has nothing left to install.
#
# A second run reuses .venv-trl while its stamp matches: the digest of the constraints file, .venv's site-packages
# path, its torch and Python versions. Anything else builds it from scratch: about 50 s on 2 cores, nearly all of it
# pip fetching and installing the 51 wheels (about 20 s to reuse it, and about 20 s for the tests).
#
# .venv must exist with npu_loss_ops built (bash scripts/run_example.sh or scripts/run_tests.sh make it; in CI the
# build stage does): this script neither builds nor changes it. The tests download nothing (HF_HUB_OFFLINE=1,
# TRANSFORMERS_OFFLINE=1, HF_DATASETS_OFFLINE=1, and an empty HF_HOME): models, tokenizer and prompts are made in
# the tests. NPU_LOSS_OPS_REQUIRE_TRL=1 makes a missing trl a failure rather than a skip.
#
# Environment knobs:
#   TRL_VENV       the venv to create or reuse (default: <repo>/.venv-trl)
#   TRL_BASE_VENV  the venv whose torch and npu_loss_ops are reused (default: <repo>/.venv)
#   TRL_FRESH_VENV 1 = delete and recreate TRL_VENV
# Extra arguments go to pytest (e.g. -k gkd -x). Exit status: pytest's (5, no test collected, counts as failure).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE_VENV="${TRL_BASE_VENV:-$REPO_ROOT/.venv}"
TRL_VENV="${TRL_VENV:-$REPO_ROOT/.venv-trl}"
CONSTRAINTS="$REPO_ROOT/scripts/trl_constraints.txt"
# What the resolver check asks for: the packages the stage needs by name (their versions come from the constraints).
TOP_LEVEL=(trl pytest)
PTH_NAME="_npu_loss_ops_base_venv.pth"
STAMP_NAME=".trl-stage.stamp"

t_start=$SECONDS
t_venv=""
t_tests=""
venv_state="not ready"
_log() { printf '[trl-stage %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
_die() {
  _log "$*"
  exit 1
}
# shellcheck disable=SC2317  # run by the EXIT trap
_report_time() {
  local status=$?
  echo "trl-stage: venv ${venv_state} in ${t_venv:-?}s, tests ${t_tests:-not run}${t_tests:+s};" \
    "stage total $((SECONDS - t_start))s, exit $status"
}
trap _report_time EXIT

export PIP_DISABLE_PIP_VERSION_CHECK=1
[[ -f "$CONSTRAINTS" ]] || _die "missing $CONSTRAINTS"

# ---- the base venv: its site-packages, torch and npu_loss_ops, as it sees them itself (asked from /, so the
# checkout's own files do not answer for it)
base_py="$BASE_VENV/bin/python"
[[ -x "$base_py" ]] || _die "no venv at $BASE_VENV: make it first with bash scripts/run_example.sh" \
  "(this stage reuses its torch and its build of npu_loss_ops)"
base_info="$(cd / && "$base_py" -W ignore - <<'PY'
import os, platform, sysconfig
import torch
import npu_loss_ops
print(sysconfig.get_paths()["purelib"])
print(torch.__version__)
print(platform.python_version())
print(os.path.dirname(os.path.realpath(npu_loss_ops.__file__)))
PY
)" || _die "$BASE_VENV cannot import torch and npu_loss_ops; build it first with bash scripts/run_example.sh"
{ read -r base_purelib; read -r base_torch; read -r base_python; read -r base_pkg; } <<<"$base_info"
_log "base venv $BASE_VENV: Python $base_python, torch $base_torch, npu_loss_ops from $base_pkg"

stamp_value="$(
  cat "$CONSTRAINTS"
  printf 'layout 1\nbase %s\ntorch %s\npython %s\n' "$base_purelib" "$base_torch" "$base_python"
)"
stamp_value="$(sha256sum <<<"$stamp_value" | cut -d' ' -f1)"
trl_py="$TRL_VENV/bin/python"

_venv_usable() {
  [[ "${TRL_FRESH_VENV:-0}" != "1" && -x "$trl_py" && -f "$TRL_VENV/$STAMP_NAME" ]] || return 1
  [[ "$(cat "$TRL_VENV/$STAMP_NAME")" == "$stamp_value" ]] || return 1
  (cd / && "$trl_py" -W ignore -c 'import trl, torch, npu_loss_ops, pytest' >/dev/null 2>&1)
}

# ---- checks made once the .pth is in place (on a new venv; a reused one passed them when it was made)
_verify_venv() {
  local trl_purelib="$1" report
  (cd / && "$trl_py" -W ignore - "$base_purelib" "$trl_purelib" <<'PY'
import importlib.metadata as md, os, sys
base, own = (os.path.realpath(p) for p in sys.argv[1:3])
import torch, npu_loss_ops, trl, transformers
def under(path, root):
    return os.path.realpath(path).startswith(root + os.sep)
problems = []
if not under(torch.__file__, base):
    problems.append(f"torch imports from {torch.__file__}, not from {base}")
torch_home = os.path.realpath(str(md.distribution("torch").locate_file("")))
if torch_home != base:
    problems.append(f"torch's metadata is in {torch_home}, not in {base}")
own_dists = [d.metadata["Name"] for d in md.distributions(path=[own])]
bad = sorted(n for n in own_dists if n.lower() == "torch" or n.lower().startswith("nvidia"))
if bad:
    problems.append(f"{own} has its own {', '.join(bad)}")
if problems:
    sys.exit("trl-stage: " + "; ".join(problems))
print(f"[trl-stage] torch {torch.__version__} from {os.path.dirname(torch.__file__)} (its .venv); "
      f"npu_loss_ops from {os.path.dirname(npu_loss_ops.__file__)}; trl {trl.__version__}, "
      f"transformers {transformers.__version__}; {len(own_dists)} distributions in {own}, "
      "none of them torch or nvidia-*",
      file=sys.stderr)
PY
  ) || return 1
  "$trl_py" -m pip check || { _log "pip check found broken requirements in $TRL_VENV"; return 1; }
  # The resolver, seeing .venv's torch through the .pth, must have nothing left to install.
  report="$TRL_VENV/resolver-check.json"
  (cd / && "$trl_py" -m pip install --dry-run --quiet --report "$report" -c "$CONSTRAINTS" "${TOP_LEVEL[@]}") \
    || { _log "pip's resolver rejected the pins (above)"; return 1; }
  "$trl_py" - "$report" "${TOP_LEVEL[@]}" <<'PY'
import json, sys
with open(sys.argv[1]) as f:
    items = json.load(f).get("install", [])
would = [item["metadata"]["name"] + "==" + item["metadata"]["version"] for item in items]
if would:
    sys.exit("trl-stage: with the pins as constraints, pip would still install " + " ".join(would)
             + " (scripts/trl_constraints.txt is incomplete or inconsistent)")
print("[trl-stage] pip resolves " + " ".join(sys.argv[2:]) + " under the pins with nothing to install", file=sys.stderr)
PY
}

_make_venv() {
  local log trl_purelib
  if [[ -e "$TRL_VENV" ]]; then
    _log "removing $TRL_VENV (new constraints, another base venv, TRL_FRESH_VENV=1, or an unfinished build)"
    rm -rf "$TRL_VENV"
  fi
  # From .venv's interpreter, so the new venv has the same base Python (ABI) as the torch it reuses.
  _log "creating $TRL_VENV"
  "$base_py" -m venv "$TRL_VENV"
  printf '*\n' >"$TRL_VENV/.gitignore"  # keep the venv out of git status (Python 3.13's venv writes the same)
  trl_purelib="$("$trl_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  log="$TRL_VENV/pip-install.log"
  _log "installing the pins of $CONSTRAINTS (--no-deps: torch is never a candidate; log: $log)"
  (cd / && "$trl_py" -m pip install --no-deps --progress-bar off -r "$CONSTRAINTS" 2>&1; echo "pip-exit-status $?") \
    | tee "$log" | grep -E '^(Successfully installed|ERROR)' >&2 || true
  if [[ "$(sed -n 's/^pip-exit-status //p' "$log" | tail -n 1)" != "0" ]]; then
    tail -n 40 "$log" >&2
    _die "pip install failed (log: $log)"
  fi
  if grep -Eiq '^ *(Collecting|Downloading|Processing|Using cached) [^ ]*(torch|nvidia)' "$log"; then
    _die "pip fetched torch or an nvidia-* package (see $log)"
  fi
  # Only now .venv becomes visible: behind .venv-trl's own site-packages, its .pth files processed.
  "$trl_py" - "$trl_purelib/$PTH_NAME" "$base_purelib" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write(f"import site; site.addsitedir({sys.argv[2]!r})\n")
PY
  _verify_venv "$trl_purelib" || _die "$TRL_VENV failed its checks"
  echo "$stamp_value" >"$TRL_VENV/$STAMP_NAME"
}

t0=$SECONDS
if _venv_usable; then
  venv_state="reused"
  _log "reusing $TRL_VENV (stamp matches $CONSTRAINTS and $BASE_VENV)"
else
  venv_state="built"
  _make_venv
fi
t_venv=$((SECONDS - t0))
_log "venv ready in ${t_venv}s"

# ---- the tests
t0=$SECONDS
hf_home="$TRL_VENV/hf-home-empty"
rm -rf "$hf_home"
mkdir -p "$hf_home"
status=0
(
  cd "$REPO_ROOT"
  export NPU_LOSS_OPS_REQUIRE_TRL=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HOME="$hf_home"
  export TOKENIZERS_PARALLELISM=false HF_HUB_DISABLE_TELEMETRY=1 DO_NOT_TRACK=1
  # No pytest plugins by entry point: .venv's (pytest-xdist, hypothesis, whatever it has) are visible here too.
  export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
  exec "$trl_py" -m pytest -q -rs tests/with_trl "$@"
) || status=$?
t_tests=$((SECONDS - t0))
if ((status == 5)); then
  _log "pytest collected no tests; that is a failure"
fi
exit "$status"
