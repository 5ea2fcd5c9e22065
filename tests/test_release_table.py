"""scripts/release_table.py's verify, which CI runs (docs/releases.md): a row fails it when it did not pass or
when csrc/compat or the table of releases changed since its commit; a row that alone runs some code is listed
as due, without failing, when that code changed (the aarch64 suite: csrc/cpu, which CI builds only for x86-64;
the rebuild check: setup.py). Run in a repository of its own, made here: the files verify reads, committed,
then changed one at a time."""
import os
import shutil
import subprocess
import sys

import pytest

from helpers import REPO_ROOT, build_config, repo_module

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

HEADER = "| torch | torch_npu | arch | check | result | time | commit | date |\n|---|---|---|---|---|---|---|---|\n"
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}


def _git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, check=True, capture_output=True,
                          text=True).stdout.strip()


def _commit(repo, path, text):
    full = os.path.join(repo, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as f:
        f.write(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"change {path}")
    return _git(repo, "rev-parse", "HEAD")


def _verify(repo, rows):
    table = os.path.join(repo, "docs", "releases.md")
    with open(table, "w") as f:
        f.write(HEADER + "".join(f"| {' | '.join(row)} |\n" for row in rows))
    return subprocess.run([sys.executable, os.path.join(repo, "scripts", "release_table.py"), "verify", table],
                          capture_output=True, text=True)


@pytest.fixture
def repo(tmp_path):
    os.makedirs(tmp_path / "scripts")
    os.makedirs(tmp_path / "docs")
    shutil.copy(os.path.join(REPO_ROOT, "build_config.py"), tmp_path)
    shutil.copy(os.path.join(REPO_ROOT, "scripts", "release_table.py"), tmp_path / "scripts")
    _git(tmp_path, "init", "-q")
    for path in ("csrc/compat/torch_compat.h", "csrc/cpu/kernels.cpp", "csrc/npu/l1_loss.cpp", "setup.py"):
        _commit(tmp_path, path, "// first\n")
    return str(tmp_path)


def _rows(commit):
    config = build_config()
    default, newest = config.DEFAULT_TORCH, max(config.TESTED_RELEASES, key=config._key)
    old = min(config.TESTED_RELEASES, key=config._key)
    return {
        "cpu": [old, "x", "x86_64", "CPU suite", "passed: 1 passed", "1 min", commit, "2026-12-02"],
        "aarch64": [default, "x", "aarch64", "whole suite (qemu)", "passed: 1 passed", "1 min", commit, "2026-12-02"],
        "rebuild": [newest, "none", "x86_64", f"rebuild over {default} (one venv), a slice of the suite",
                    "passed: 1 passed", "1 min", commit, "2026-12-02"],
    }


def test_rows_on_todays_code_pass(repo):
    result = _verify(repo, _rows(_git(repo, "rev-parse", "HEAD")).values())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 rows" in result.stdout


def _named(rows, text, marker=""):
    """The rows whose line in verify's output holds `marker`, by name."""
    lines = [line for line in text.splitlines() if marker in line]
    return {name for name, row in rows.items() if any(f"{row[2]} {row[3]} ({row[6]})" in line for line in lines)}


@pytest.mark.parametrize("path, stale, due", [
    ("csrc/npu/l1_loss.cpp", set(), set()),  # CI runs it at every commit
    ("csrc/cpu/kernels.cpp", set(), {"aarch64"}),
    ("setup.py", set(), {"rebuild"}),
    ("csrc/compat/torch_compat.h", {"cpu", "aarch64", "rebuild"}, set()),
])
def test_a_row_fails_or_is_due_when_the_code_it_covers_changes(repo, path, stale, due):
    rows = _rows(_git(repo, "rev-parse", "HEAD"))
    _commit(repo, path, "// second\n")
    result = _verify(repo, rows.values())
    assert _named(rows, result.stdout, "due (not failing)") == due, result.stdout
    assert _named(rows, result.stdout) - due == stale, result.stdout
    assert result.returncode == (1 if stale else 0), result.stdout
    assert f"{len(due)} due" in result.stdout or stale
    if "aarch64" in stale | due:
        assert "run bash scripts/check_releases.sh aarch64" in result.stdout
    if "cpu" in stale:
        assert f"run bash scripts/check_releases.sh {rows['cpu'][0]}/cpu" in result.stdout


def test_a_change_to_the_release_table_makes_every_row_stale(repo):
    rows = _rows(_git(repo, "rev-parse", "HEAD"))
    with open(os.path.join(repo, "build_config.py")) as f:
        source = f.read()
    _commit(repo, "build_config.py", source.replace('DEFAULT_TORCH = "', 'DEFAULT_TORCH = "9.', 1))
    result = _verify(repo, rows.values())
    assert result.returncode == 1
    assert result.stdout.count("changed since") == 3, result.stdout


def test_a_row_that_did_not_pass_fails(repo):
    rows = _rows(_git(repo, "rev-parse", "HEAD"))
    rows["cpu"][4] = "failed (exit 1)"
    result = _verify(repo, rows.values())
    assert result.returncode == 1 and "failed (exit 1)" in result.stdout, result.stdout


def test_a_rows_counts_sum_the_logs_pytest_runs(tmp_path):
    counts = repo_module("scripts/release_table.py").counts
    log = tmp_path / "one.log"
    log.write_text("== 425 passed, 3 skipped in 29.26s ==\n")
    assert counts(str(log)) == "425 passed, 3 skipped"
    # Two runs, one of them repeated by a script's table of its runs (the same line, its time included), and a
    # table line without a time, which is not a run's closing line.
    log.write_text("3731 passed, 48 skipped, 15162 deselected, 1 warning in 85.43s\n"
                   "18 passed, 1 failed in 97.56s\n"
                   "  suite-910B  ok  86s  3731 passed, 48 skipped, 15162 deselected, 1 warning in 85.43s\n"
                   "npu-suite test_x: 30 passed, 0 failed, 0 skipped\n")
    assert counts(str(log)) == "3749 passed, 1 failed, 48 skipped in 2 pytest runs"
    log.write_text("no tests here\n")
    assert counts(str(log)) is None
