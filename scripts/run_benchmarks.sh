#!/usr/bin/env bash
# Set up a fresh machine (venv, torch==2.13.0, the built extension, matplotlib for the figures and tqdm for
# the progress bar) and run the kernel benchmark. Arguments go to benchmarks/bench_losses.py, e.g.
#   bash scripts/run_benchmarks.sh --quick
#   bash scripts/run_benchmarks.sh --from-csv benchmarks/results/bench_losses.csv --out benchmarks/results
# Results go to benchmarks/out/ (not tracked) unless --out says otherwise.
set -euo pipefail
# shellcheck source=setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
# Pinned, so that a figure redrawn from a committed CSV comes out the same.
setup_env matplotlib==3.11.2 tqdm==4.70.1
cd "$REPO_ROOT"
exec python benchmarks/bench_losses.py "$@"
