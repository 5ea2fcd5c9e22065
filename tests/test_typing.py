"""Typing: the package ships py.typed, passes ``mypy --strict`` (tests/typing_usage.py, a user's typed code,
and the package itself), and mypy flags ill-typed calls of the public API."""
import importlib.util
import os
import subprocess
import sys
import sysconfig

import pytest
from helpers import built_package_dir, install_built_copy, package_parent, venv_with_this_torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_MYPY = importlib.util.find_spec("mypy") is not None
needs_mypy = pytest.mark.skipif(
    not HAS_MYPY, reason="mypy is not installed (scripts/run_tests.sh installs the pinned mypy)"
)


def _mypy(*args):
    """`python -m mypy --strict` with pyproject.toml's [tool.mypy], finding the package under test: an
    installed copy in site-packages (by its py.typed), a checkout's (editable or in-place build) through
    MYPYPATH, as mypy cannot see an editable install's import hook. It runs in tests/, where typing_usage
    is a module, and never in site-packages, whose every module mypy would take for the user's own. Its cache
    (the repository's .mypy_cache) makes reruns take seconds; the first run reads torch's annotations and
    takes about a minute."""
    env = {k: v for k, v in os.environ.items() if k != "MYPYPATH"}
    installed = {os.path.realpath(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")}
    if os.path.realpath(package_parent()) not in installed:
        env["MYPYPATH"] = package_parent()
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-color-output", "--no-error-summary",
         "--config-file", os.path.join(ROOT, "pyproject.toml"), "--cache-dir", os.path.join(ROOT, ".mypy_cache"),
         *args],
        cwd=os.path.join(ROOT, "tests"), env=env, capture_output=True, text=True, timeout=900,
    )


def test_py_typed_is_shipped():
    assert os.path.isfile(os.path.join(ROOT, "npu_loss_ops", "py.typed"))
    assert os.path.isfile(os.path.join(built_package_dir(), "py.typed"))  # in the package under test too
    with open(os.path.join(ROOT, "MANIFEST.in")) as f:
        assert "npu_loss_ops/py.typed" in f.read().split()


@needs_mypy
def test_strict_mypy_passes_on_typed_usage_and_the_package():
    result = _mypy("-m", "typing_usage", "-p", "npu_loss_ops")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "", result.stdout


@needs_mypy
def test_strict_mypy_passes_on_the_installed_package_from_outside_the_repository(tmp_path):
    """`mypy --strict -p npu_loss_ops` as a user runs it on an installed copy, away from pyproject.toml:
    the package needs no settings of its own."""
    python = venv_with_this_torch(str(tmp_path / "venv"))
    install_built_copy(python)
    result = subprocess.run(
        [python, "-m", "mypy", "--strict", "--no-color-output", "--cache-dir", os.path.join(ROOT, ".mypy_cache"),
         "-p", "npu_loss_ops"],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pyproject.toml" not in result.stderr


@pytest.mark.filterwarnings("ignore:size_average and reduce args will be deprecated:UserWarning")
def test_typed_usage_runs():
    import typing_usage

    typing_usage.main()


# Each line of the snippet, and whether mypy must reject it.
BAD_CALLS = [
    ("import torch", False),
    ("from npu_loss_ops import HuberLoss, KLDivLoss, L1Loss, MSELoss, SmoothL1Loss, huber_loss, kl_div, l1_loss, "
     "mse_loss, smooth_l1_loss", False),
    ("x = torch.zeros(3)", False),
    ('SmoothL1Loss(beta="oops")', True),
    ('smooth_l1_loss(x, x, beta="oops")', True),
    ('SmoothL1Loss(size_average="yes")', True),
    ("L1Loss(reduce=1.5)", True),
    ('KLDivLoss(log_target="yes")', True),
    ("l1_loss(x, x, reduction=2)", True),
    ("kl_div(x, x, log_target=None)", True),
    ("smooth_l1_loss(x, x, size_average=None, reduce=True, reduction='sum', beta=0)", False),
    ("SmoothL1Loss(None, None, 'none', 0.5)", False),
    ('HuberLoss(delta="oops")', True),
    ('huber_loss(x, x, delta="oops")', True),
    ("huber_loss(x, x, weight=1.0)", True),
    ("l1_loss(x, x, weight=[1.0])", True),
    ("HuberLoss(size_average=False)", True),  # torch.nn.HuberLoss has no legacy arguments
    ("huber_loss(x, x, 'sum', 2.0, x)", False),
    ("HuberLoss('none', 0.5)", False),
    ("mse_loss(x, x, reduction=1)", True),
    ("mse_loss(x, x, weight=2.0)", True),
    ('MSELoss(reduce="no")', True),
    ("mse_loss(x, x, None, None, 'sum', x)", False),
    ("MSELoss(None, None, 'none')", False),
]


@needs_mypy
def test_mypy_rejects_ill_typed_calls(tmp_path):
    snippet = tmp_path / "ill_typed.py"
    snippet.write_text("".join(line + "\n" for line, _ in BAD_CALLS))
    result = _mypy(str(snippet))
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    flagged = {int(line.split(":")[1]) for line in errors}
    expected = {n for n, (_, bad) in enumerate(BAD_CALLS, start=1) if bad}
    assert flagged == expected, result.stdout + result.stderr
    # Only the snippet: nothing in the package. (mypy's cache may name the snippet's path from an earlier run
    # of the same content.)
    assert all(os.path.basename(line.split(":")[0]) == snippet.name for line in errors), result.stdout
    assert 'Argument "beta" to "SmoothL1Loss" has incompatible type "str"; expected "float"' in result.stdout
    assert 'Argument "beta" to "smooth_l1_loss" has incompatible type "str"; expected "float"' in result.stdout
