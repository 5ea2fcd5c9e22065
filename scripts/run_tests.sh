#!/usr/bin/env bash
# Set up a fresh machine (venv, torch 2.13.0 or the release NPU_LOSS_OPS_TORCH_VERSION names, the built
# extension) and run the test suite in pytest-xdist workers, one per CPU up to 4 (NPU_LOSS_OPS_TEST_WORKERS=1:
# in one process): about 8 minutes on 2 cores (the README says the same), after a 4 to 5 minute first build.
# Extra arguments go to pytest, e.g. `bash scripts/run_tests.sh -k smooth_l1 -x`; a test path among them
# runs only that (without one, pytest runs pyproject.toml's testpaths: tests/). Every skip's reason is
# summarised at the end, one line per reason (-rs).
set -euo pipefail
# shellcheck source=setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
setup_env pytest pytest-xdist==3.8.0 expecttest numpy hypothesis mypy==2.4.1
workers="$(test_workers)"
cd "$REPO_ROOT"
status=0
# shellcheck disable=SC2086  # $workers is "-n N" or "-p no:xdist"
python -m pytest $workers -q -rs "$@" || status=$?
if ((status == 5)); then
  echo "run_tests: pytest collected no tests; that is a failure" >&2
fi
exit "$status"
