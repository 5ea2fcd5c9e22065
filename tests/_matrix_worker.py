"""Runs cases of the error matrix (test_errors.py) in this process, on every path each case has, and prints
one JSON line per case and path: {"case": i, "id": ..., "path": ..., "cls": ..., "msg": ...}. Used by
test_errors.test_error_matrix, which runs batches of cases in subprocesses so that a crash (segfault,
abort) is counted instead of killing the test run.

    python _matrix_worker.py DEVICE FIRST LAST     # cases FIRST..LAST-1 of all_cases(DEVICE)
"""
import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(device: str, first: int, last: int) -> None:
    if device == "npu":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "npu_emulator"))
        import emulator

        emulator.import_torch_npu()  # before npu_loss_ops, which registers its NPU kernels only with torch_npu
        emulator.pin_jit_compile_off()
    import torch

    import test_errors as matrix

    # FakeTensorMode logs every exception a Meta kernel raises; here they are the point.
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    torch.manual_seed(0)
    cases = matrix.all_cases(device)
    for i in range(first, min(last, len(cases))):
        case = cases[i][1]
        for path in matrix.paths(case, device):
            cls, msg = matrix.run_path(case, path, device)
            print(json.dumps({"case": i, "id": case.id, "path": path, "cls": cls.__name__ if cls else None,
                              "msg": msg}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
