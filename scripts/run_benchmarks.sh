#!/usr/bin/env bash
# Set up a fresh machine (venv, torch, the built extension, matplotlib for the figures and tqdm for the
# progress bar) and run both benchmarks: benchmarks/bench_losses.py (the kernels), then
# benchmarks/bench_autograd.py (what autograd and torch.func add on small tensors), then its enable() rows
# (F under npu_loss_ops.enable() against the package's own step, 4K and 16M, 2 threads, wall clock).
# benchmarks/README.md says what they measure.
#
#   bash scripts/run_benchmarks.sh [bench_losses.py arguments] [-- bench_autograd.py arguments]
#   bash scripts/run_benchmarks.sh --quick
#   bash scripts/run_benchmarks.sh --quick -- --threads 1 --clock thread
#   bash scripts/run_benchmarks.sh --from-csv benchmarks/results/bench_losses.csv --out benchmarks/results
#   bash scripts/run_benchmarks.sh --help
#
# Results go to benchmarks/out/ (not tracked) unless --out says otherwise; bench_autograd.py's tables go to
# the same directory as bench_autograd.md and bench_enabled.md (arguments after -- apply to the first; a
# --markdown or --sections there replaces the defaults, and the enable() rows are then not run separately).
# --from-csv times nothing, so it runs bench_autograd.py neither.
set -euo pipefail
# shellcheck source=setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"

losses_args=()
while (($#)) && [[ "$1" != "--" ]]; do
  losses_args+=("$1")
  shift
done
(($#)) && shift  # the "--"
autograd_args=("$@")

out_dir=benchmarks/out from_csv=0 help=0
for i in "${!losses_args[@]}"; do
  case "${losses_args[i]}" in
    --out | --out-dir) out_dir="${losses_args[i + 1]:-$out_dir}" ;;
    --out=* | --out-dir=*) out_dir="${losses_args[i]#*=}" ;;
    --from-csv | --from-csv=*) from_csv=1 ;;
    -h | --help) help=1 ;;
  esac
done
has_markdown=0 has_sections=0
for arg in "${autograd_args[@]}"; do
  case "$arg" in
    --markdown | --markdown=*) has_markdown=1 ;;
    --sections | --sections=*) has_sections=1 ;;
    -h | --help) help=1 ;;
  esac
done

# --help sets nothing up: this script's usage, then the two programs' options if the venv already exists.
if ((help)); then
  sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
  if "$VENV_DIR/bin/python" -c 'import torch' 2>/dev/null; then
    cd "$REPO_ROOT"
    echo
    "$VENV_DIR/bin/python" benchmarks/bench_losses.py --help
    echo
    echo "Arguments after -- go to benchmarks/bench_autograd.py:"
    exec "$VENV_DIR/bin/python" benchmarks/bench_autograd.py --help
  fi
  echo
  echo "The options of benchmarks/bench_losses.py and bench_autograd.py are listed here once $VENV_DIR exists"
  echo "(any other run of this script, or scripts/run_tests.sh, creates it)."
  exit 0
fi
# Pinned, so that a figure redrawn from a committed CSV comes out the same.
setup_env matplotlib==3.11.2 tqdm==4.70.1
cd "$REPO_ROOT"
python benchmarks/bench_losses.py "${losses_args[@]}"
if ((from_csv)); then
  echo "run_benchmarks: --from-csv times nothing; benchmarks/bench_autograd.py not run" >&2
  exit 0
fi
if ((!has_markdown)); then
  mkdir -p "$out_dir"
  autograd_args+=(--markdown "$out_dir/bench_autograd.md")
fi
if ((has_sections)); then
  echo "run_benchmarks: benchmarks/bench_autograd.py ${autograd_args[*]}" >&2
  exec python benchmarks/bench_autograd.py "${autograd_args[@]}"
fi
echo "run_benchmarks: benchmarks/bench_autograd.py ${autograd_args[*]} (about a minute)" >&2
python benchmarks/bench_autograd.py --sections step,per-sample,per-sample-params,vmap-rule "${autograd_args[@]}"
mkdir -p "$out_dir"
enabled_args=(--sections enabled --threads 2 --clock wall --min-run-time 0.2 --markdown "$out_dir/bench_enabled.md")
echo "run_benchmarks: benchmarks/bench_autograd.py ${enabled_args[*]} (about a minute)" >&2
exec python benchmarks/bench_autograd.py "${enabled_args[@]}"
