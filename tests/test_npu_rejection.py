"""A rejected aclnn call on the emulated CANN: each aclnn API the package calls on a chip family, rejected in turn
(161002 from its first phase, as a chip whose CANN lacks it), under TASK_QUEUE_ENABLE 0, 1 and 2.

Each family and queue mode runs _rejection_worker.py in a process of its own (the emulator's environment, with
the trace telling the package's own first phases from torch_npu's). Per API it asserts: no hang (the worker's
per-API timeout, and this test's), the composite's results (within tolerance of the CPU kernels'), exactly one
warning naming the API, the rejected first phase called once, nothing enqueued after it that failed (no other
rejection), and the next five calls in the same process right. docs/npu_paths.md, "A rejected aclnn call".

Needs the built emulator: scripts/run_npu_emulated.sh runs this file with NPU_LOSS_OPS_EMULATOR_DIR set.
"""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "npu_emulator"))
import emulator  # noqa: E402

EMU_DIR = os.environ.get("NPU_LOSS_OPS_EMULATOR_DIR", "")
pytestmark = pytest.mark.skipif(
    not os.path.isfile(os.path.join(EMU_DIR, "lib", "libopapi.so")),
    reason="needs the built emulated CANN in NPU_LOSS_OPS_EMULATOR_DIR (scripts/run_npu_emulated.sh runs this file)")

FAMILIES = list(emulator.SOCS)
WORKER_TIMEOUT = 900


def _declared_apis(family):
    """The APIs the path rows (csrc/losses.h) name for this family's chips: each must be among those called."""
    from npu_loss_ops import _C

    key = "910B" if family == "910_93" else family
    return {row["api"] for row in _C._chip_paths()
            if row["api"] != "composite" and (row["chip"] == "any" or key in row["chip"].split(", "))}


@pytest.mark.parametrize("task_queue", [0, 1, 2])
@pytest.mark.parametrize("family", FAMILIES)
def test_each_rejected_api_runs_the_composite(family, task_queue):
    env = emulator.env(family, EMU_DIR, task_queue=task_queue)
    env["NPU_EMU_TRACE_PACKAGE"] = "1"
    env["NPU_EMU_LOG"] = "0"
    env.pop("NPU_EMU_TRACE_FILE", None)  # the rejections are the point here, not a failure of a suite's trace
    env.pop("NPU_LOSS_OPS_TEST_DEVICE", None)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "_rejection_worker.py")], env=env,
                          capture_output=True, text=True, timeout=WORKER_TIMEOUT, stdin=subprocess.DEVNULL)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, (
        f"{family}, TASK_QUEUE_ENABLE={task_queue}: the worker exited {proc.returncode} (a hang ends it with a "
        f"traceback)\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    found, per_api = lines[0], lines[1:]
    assert found["problems"] == [], found
    apis = set(found["apis"])
    if family == "310B":
        assert apis == set(), f"310B runs the composite only; the package called {sorted(apis)}"
    else:
        assert apis, f"{family}: the package called no aclnn API"
        # 310P's GJSD is composite-only; the elementwise rows' APIs are always among what was called.
        missing = _declared_apis(family) - apis
        assert not missing, f"{family}: the path rows name {sorted(missing)}, which no case called"
    assert len(per_api) == len(apis), per_api
    for r in per_api:
        where = f"{family}, TASK_QUEUE_ENABLE={task_queue}, {r['api']} rejected (first in '{r['case']}')"
        assert r["problems"] == [], f"{where}: {r['problems']}"
        assert r["rejected_calls"] == 1, f"{where}: its first phase was called {r['rejected_calls']} times"
        assert len(r["warnings"]) == 1, f"{where}: warnings {r['warnings']}"
        assert found["soc"] in r["warnings"][0] and "161002" in r["warnings"][0], r["warnings"][0]
        assert r["other_rejections"] == {}, f"{where}: {r['other_rejections']}"
        assert r["package_rejected"] == [r["api"]], f"{where}: {r['package_rejected']}"
