"""TRL's real trainers with npu_loss_ops.trl.patch() (test_trainers.py): only where trl imports.

These tests need trl 1.16 and its requirements, which the default venv (.venv) does not have: there the
directory is skipped, one skip per test module with the reason, and the rest of the suite runs as before.
scripts/trl_stage.sh runs them in a venv of their own (.venv-trl) with NPU_LOSS_OPS_REQUIRE_TRL=1, under which a
trl that cannot be imported fails the collection with the reason instead of skipping it.

Nothing is downloaded: where trl is installed, the Hugging Face libraries are put offline here before any of them
is imported (the stage sets the same variables), and the models, the tokenizer and the prompts are made by the
tests.
"""
from __future__ import annotations

import importlib
import importlib.util
import os

import pytest

REQUIRE_VARIABLE = "NPU_LOSS_OPS_REQUIRE_TRL"
REQUIRED = os.environ.get(REQUIRE_VARIABLE, "").strip() == "1"


def _offline() -> None:
    """huggingface_hub, transformers and datasets read these when they are first imported: set before trl is."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(name, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _trl_problem() -> str | None:
    """Why trl cannot be used here, or None."""
    spec = importlib.util.find_spec("trl")
    # A namespace package of that name (no origin: a directory "trl" on sys.path) is not trl.
    if spec is None or spec.origin is None:
        return "trl is not installed"
    _offline()
    try:
        importlib.import_module("trl")
        # What the tests use, imported now so that a broken install is reported here, once, with its reason.
        importlib.import_module("trl.trainer.distillation_trainer")
        importlib.import_module("trl.experimental.gkd")
    except Exception as exc:  # noqa: BLE001  (any failure to import is the reason reported)
        return f"import trl failed: {type(exc).__name__}: {exc}"
    return None


TRL_PROBLEM = _trl_problem()
_REPORT = pytest.StashKey[list]()


@pytest.fixture
def trl_report(request) -> list:
    """Lines for the terminal summary's TRL section (what each trainer's two runs gave)."""
    return request.config.stash.setdefault(_REPORT, [])


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = config.stash.get(_REPORT, [])
    if lines:
        terminalreporter.section("TRL trainers, TRL's loss against npu_loss_ops.trl.patch()")
        for line in lines:
            terminalreporter.write_line(line)


if TRL_PROBLEM is not None:

    class _UnusableModule(pytest.Module):
        """A test module of this directory where trl cannot be used: skipped with the reason, or a
        collection error under NPU_LOSS_OPS_REQUIRE_TRL=1. Its file is never imported."""

        def collect(self):
            if REQUIRED:
                pytest.fail(f"{REQUIRE_VARIABLE}=1 but {TRL_PROBLEM} (scripts/trl_stage.sh makes a venv with trl "
                            "1.16.0, .venv-trl)", pytrace=False)
            pytest.skip(f"{TRL_PROBLEM}: TRL's trainers run in scripts/trl_stage.sh's venv "
                        f"({REQUIRE_VARIABLE}=1 there makes this a failure)")

    def pytest_pycollect_makemodule(module_path, parent):
        # A hook of this conftest: it sees only the test modules in this directory.
        return _UnusableModule.from_parent(parent, path=module_path)
