"""The error matrix of test_errors.py run in subprocesses, so that a crash is counted rather than taking
the test run down with it: every bad input (every rule of docs/validation.md's table x every op and out=
overload) on the CPU kernels, the composite fallback, fake tensors and meta tensors must raise the Python
exception docs/validation.md names. Cases run in batches (importing torch costs seconds); a batch whose process dies is
re-run one case at a time to name the case that crashed."""
import json
import os
import subprocess
import sys

import npu_loss_ops
import test_errors as matrix

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_matrix_worker.py")
BATCH = 200


def _env():
    # The worker imports the same npu_loss_ops this process uses (installed or from a source checkout).
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(npu_loss_ops.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in [root, env.get("PYTHONPATH")] if p)
    return env


def _run(first, last):
    proc = subprocess.run([sys.executable, WORKER, str(first), str(last)], capture_output=True, text=True,
                          timeout=600, env=_env())
    # A negative code is a signal (segfault, abort): a crash. A positive one is a Python error in the worker.
    assert proc.returncode <= 0, f"worker failed:\n{proc.stderr[-3000:]}"
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc.returncode, rows, proc.stderr


def test_error_matrix_in_subprocesses_has_no_crash():
    cases = [p.values[1] for p in matrix.ALL_CASES]
    rows, crashes = [], []
    for first in range(0, len(cases), BATCH):
        last = min(first + BATCH, len(cases))
        code, batch_rows, _ = _run(first, last)
        if code == 0:
            rows += batch_rows
            continue
        for i in range(first, last):  # find the case(s) that killed the process
            code, case_rows, err = _run(i, i + 1)
            rows += case_rows
            if code != 0:
                crashes.append((cases[i].id, code, err[-500:]))
    wrong = []
    for row in rows:
        case = cases[row["case"]]
        if row["cls"] != case.exc.__name__ or case.words[0] not in (row["msg"] or ""):
            wrong.append((case.id, row["path"], row["cls"], row["msg"]))
    paths = len(rows)
    print(f"\nerror matrix: {len(cases)} bad inputs on {paths} (input, path) runs, {len(crashes)} crashes, "
          f"{len(wrong)} wrong exceptions")
    assert not crashes, crashes
    assert not wrong, wrong[:10]
    expected_runs = sum(4 if c.meta_ok else 3 for c in cases)
    assert paths == expected_runs, (paths, expected_runs)
