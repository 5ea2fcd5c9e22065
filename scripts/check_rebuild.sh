#!/usr/bin/env bash
# The rebuild check: the README's install command in one venv and one checkout, at one torch release and then
# at another; the second build must compile objects of its own (setup.py's build key), never link the first
# one's, and the package it installs must import against the second torch.
#
#   bash scripts/check_rebuild.sh VENV FROM TO [TEST...]
#
# VENV is made afresh; FROM and TO are exact releases (each installed as `pip install torch==X.Y.Z`, the cap
# of this machine's pip configuration lifted); TEST... (paths under tests/) then run from VENV, outside the
# checkout. scripts/check_releases.sh runs it from the default release to the newest torch ("rebuild" in
# docs/releases.md; the row goes stale when setup.py changes).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
(($# >= 3)) || { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' >&2; exit 2; }
venv="$1" from="$2" to="$3"
shift 3
export PIP_CONSTRAINT=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
# The venv's own tools first, as in an activated venv: its ninja, not another one on PATH (a ninja of another
# version rewrites the build directory's dependency log, and every ninja after it recompiles everything).
[[ "$venv" == /* ]] || venv="$PWD/$venv"
export PATH="$venv/bin:$PATH"
pip_q() { "$venv/bin/python" -m pip install -q --progress-bar off "$@"; }
_log() { printf '[rebuild %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# The installed package, asked from outside the checkout: its torch is exactly RELEASE, and it computes.
installed_against() {
  (cd / && "$venv/bin/python" - "$1" <<'PY'
import sys
import torch, npu_loss_ops
want = sys.argv[1]
built = npu_loss_ops.build_info()["torch_version"]
if torch.__version__.split("+")[0] != want or built.split("+")[0] != want:
    sys.exit(f"rebuild: torch {torch.__version__}, npu_loss_ops built against {built}; expected {want}")
x = torch.tensor([0.0, 0.5, 3.0])
got = torch.ops.npu_loss.smooth_l1_loss_backward(torch.ones(3), x, torch.zeros(3), 0, 1.0)
assert torch.equal(got, torch.tensor([0.0, 0.5, 1.0])), got
print(f"[rebuild] torch {torch.__version__}: npu_loss_ops built against {built}, computes")
PY
  )
}

t0=$SECONDS
rm -rf "$venv"
python3 -m venv "$venv"
_log "torch $from, then the README's install command"
pip_q "torch==$from" ninja setuptools wheel pytest pytest-xdist==3.8.0 expecttest numpy hypothesis mypy==2.4.1
(cd "$REPO_ROOT" && MAX_JOBS="${MAX_JOBS:-2}" "$venv/bin/python" -m pip install -q --progress-bar off --no-build-isolation .)
installed_against "$from"
_log "torch $to over it, then the README's install command again"
pip_q "torch==$to"
(cd "$REPO_ROOT" && MAX_JOBS="${MAX_JOBS:-2}" "$venv/bin/python" -m pip install -q --progress-bar off --no-build-isolation .)
installed_against "$to"
_log "rebuilt over a $from build in $((SECONDS - t0))s"
if (($#)); then
  paths=()
  for path in "$@"; do paths+=("$REPO_ROOT/$path"); done
  (cd "$(mktemp -d)" && "$venv/bin/python" -m pytest "${paths[@]}" -q -p no:cacheprovider -rs)
fi
