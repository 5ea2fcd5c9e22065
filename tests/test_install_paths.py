"""The install paths a new user takes, end to end in temporary venvs (each gets this torch through a .pth
file, never a second install, and nothing else from the test's own environment):

- a new venv beside a checkout where the package was installed into another venv (its egg-info and an
  in-place library are in the checkout): scripts/setup_env.sh's up-to-date check must answer for the new
  venv, so it builds there instead of claiming "up to date";
- `python -c "import npu_loss_ops"` from the repository root after a plain install: the source folder
  shadows the installed package, and the error must say so and what to do.

The checkout each test works in is a copy of this one's files (git's tracked and untracked ones), so the
repository itself is never changed.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import npu_loss_ops
from helpers import REPO_ROOT, built_package_dir, install_built_copy, venv_with_this_torch


def _copy_checkout(dest: str) -> str:
    files = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout.decode().split("\0")
    for name in filter(None, files):
        src = os.path.join(REPO_ROOT, name)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, name))
    return dest


def test_up_to_date_check_asks_the_venv_it_runs_in(tmp_path):
    checkout = _copy_checkout(str(tmp_path / "checkout"))
    # What an install into the user's own environment leaves in the checkout: the compiled library in place
    # (with the torch it was built against) and the egg-info.
    for built in glob.glob(os.path.join(built_package_dir(), "_C*.so")) + [
        os.path.join(built_package_dir(), "_build_torch.py")
    ]:
        shutil.copy2(built, os.path.join(checkout, "npu_loss_ops"))
    egg = os.path.join(checkout, "npu_loss_ops.egg-info")
    os.makedirs(egg)
    with open(os.path.join(egg, "PKG-INFO"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: npu_loss_ops\nVersion: {npu_loss_ops.__version__}\n")
    # From the checkout's root, that package is importable in any venv: the trap the check fell into.
    python = venv_with_this_torch(str(tmp_path / "new-venv"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    trap = subprocess.run([python, "-c", "import npu_loss_ops"], cwd=checkout, env=env, capture_output=True)
    assert trap.returncode == 0, trap.stderr.decode()
    script = (
        f'source "{checkout}/scripts/setup_env.sh"; '
        f'if _extension_up_to_date; then echo "up to date"; else echo "needs a build"; fi'
    )
    env["PATH"] = os.path.dirname(python) + os.pathsep + env["PATH"]
    result = subprocess.run(["bash", "-c", script], cwd=checkout, env=env, capture_output=True, text=True)
    assert result.stdout.strip() == "needs a build", result.stdout + result.stderr


def test_importing_the_unbuilt_source_folder_says_what_happened(tmp_path):
    checkout = _copy_checkout(str(tmp_path / "checkout"))
    python = venv_with_this_torch(str(tmp_path / "user-venv"))
    installed = install_built_copy(python)  # a plain install's result
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    ok = subprocess.run([python, "-c", "import npu_loss_ops"], cwd=str(tmp_path), env=env, capture_output=True)
    assert ok.returncode == 0, ok.stderr.decode()  # from anywhere else the installed package imports
    result = subprocess.run(
        [python, "-c", "import npu_loss_ops"], cwd=checkout, env=env, capture_output=True, text=True
    )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: npu_loss_ops was imported from " + os.path.join(checkout, "npu_loss_ops")), last
    assert "has no compiled extension (_C)" in last and f"The installed copy is in {installed}" in last, last
    assert "run from outside the repository" in last and "pip install --no-build-isolation -e ." in last, last
    assert "circular import" not in result.stderr, result.stderr


def test_setup_without_torch_says_what_to_install_first():
    """pip's isolated build (or an environment without torch) runs setup.py with no torch importable: it
    stops with the order to follow, for the CPU and for Ascend."""
    code = (
        "import runpy, sys\n"
        "sys.modules['torch'] = None  # import torch raises ImportError\n"
        "sys.argv = ['setup.py', '--name']\n"
        "runpy.run_path('setup.py', run_name='__main__')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 1, result.stdout + result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert "none is importable here" in message, message
    assert "on Ascend: install the CPU torch first" in message and "then torch_npu" in message, message
    assert "pip install --no-build-isolation ." in message, message
