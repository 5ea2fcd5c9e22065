#!/usr/bin/env bash
# Set up a fresh machine (venv, torch 2.13.0 or the release NPU_LOSS_OPS_TORCH_VERSION names, the built
# extension) and run the test suite: about 2 minutes on 2 cores, after a 3 to 5 minute first build.
# Extra arguments go to pytest, e.g. `bash scripts/run_tests.sh -k smooth_l1 -x`; a test path among them
# runs only that (without one, pytest runs pyproject.toml's testpaths: tests/). Every skip's reason is
# summarised at the end, one line per reason (-rs).
set -euo pipefail
# shellcheck source=setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
setup_env pytest expecttest numpy hypothesis mypy==2.4.1
cd "$REPO_ROOT"
status=0
python -m pytest -q -rs "$@" || status=$?
if ((status == 5)); then
  echo "run_tests: pytest collected no tests; that is a failure" >&2
fi
exit "$status"
