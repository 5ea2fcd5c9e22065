#!/usr/bin/env bash
# Set up a fresh machine (venv, torch 2.13.0 or the release NPU_LOSS_OPS_TORCH_VERSION names, the built
# extension) and run the main job:
# examples/train.py trains a small model with npu_loss_ops' losses next to torch.nn's and checks they agree.
set -euo pipefail
# shellcheck source=setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
setup_env
cd "$REPO_ROOT"
exec python examples/train.py "$@"
