"""Runs cases of the error matrix (test_errors.py) in this process and prints one JSON line per case and
path: {"case": i, "path": ..., "cls": ..., "msg": ...}. Used by test_crash_matrix.py, which runs batches of
cases in subprocesses so that a crash (segfault, abort) is counted instead of killing the test run.

    python _matrix_worker.py FIRST LAST     # cases FIRST..LAST-1 of ALL_CASES
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import test_errors as matrix  # noqa: E402

PATHS = {
    "cpu": matrix.run_cpu,
    "composite": matrix.run_composite,
    "fake": matrix.run_fake,
    "meta": matrix.run_meta,
}


def cases():
    return [p.values[1] for p in matrix.ALL_CASES]


def main(first: int, last: int) -> None:
    torch.manual_seed(0)
    all_cases = cases()
    for i in range(first, min(last, len(all_cases))):
        case = all_cases[i]
        for path, run in PATHS.items():
            if path == "meta" and not case.meta_ok:
                continue
            cls, msg = run(case.call)
            print(json.dumps({"case": i, "path": path, "cls": cls.__name__ if cls else None, "msg": msg}),
                  flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
