"""The benchmark's verdicts (benchmarks/loss_bench), on synthetic results: a cell timed while another process
took the CPU is marked unreliable, neither passed nor failed, through the CSV the benchmark writes and reads
back (bench_losses.py --from-csv). No timing here: the benchmarks themselves never run in tests."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

from loss_bench.common import TARGET_SIZE, Config  # noqa: E402
from loss_bench.report import FLOAT_COLUMNS, markdown_targets, read_csv, write_csv  # noqa: E402
from loss_bench.targets import compare, targets_of  # noqa: E402

OURS = ("smooth_l1_loss_backward", "ours_out")
ROOF = ("roofline_3r1w", "out")
GROUP = "16M: backward out= <= 1.10x preallocated roofline"


def _row(key, median_ms, disturbed):
    row = {"op": key[0], "variant": key[1], "dtype": "float32", "reduction": "none", "numel": TARGET_SIZE,
           "threads": 2, "samples": 7, "calls_per_sample": 1, "streams": 4}
    row.update({c: "" for c in FLOAT_COLUMNS})
    row.update(median_ms=median_ms, p20_ms=median_ms, p80_ms=median_ms, GBps=1.0,
               cpu_per_wall=0.9 if disturbed else 1.95, disturbed=disturbed, matches_reference="")
    return row


def _target(tmp_path, ours_ms, ours_disturbed, roof_disturbed=False):
    """The out= roofline target row for smooth L1's gradient, after a round trip through the CSV."""
    path = os.path.join(tmp_path, "synthetic.csv")
    write_csv([_row(OURS, ours_ms, ours_disturbed), _row(ROOF, 10.0, roof_disturbed)], {"benchmark": "test"}, path)
    rows, _ = read_csv(path)
    comparisons, threads = compare(rows, ["float32"], ["none"])
    (target,) = [c for c in targets_of(comparisons) if c.group == GROUP and c.row == OURS]
    return target, threads


def _markdown(target, threads):
    meta = {k: "x" for k in ("command", "wall_seconds", "npu_loss_ops", "git_sha", "cpu_kernel_isa", "torch",
                             "cpu_capability", "cpu", "logical_cpus", "load_average_1min_start",
                             "load_average_1min_end", "date")}
    return markdown_targets([target], threads, ["float32"], ["none"], meta, "x.csv", [], [])


@pytest.mark.parametrize("ours_disturbed, roof_disturbed", [(True, False), (False, True)])
def test_a_disturbed_cell_is_unreliable_not_a_miss(tmp_path, ours_disturbed, roof_disturbed):
    target, threads = _target(tmp_path, 13.0, ours_disturbed, roof_disturbed)  # 1.30x: a miss if judged
    assert target.unreliable[("float32", "none")]
    assert target.result == "UNRELIABLE"
    text = _markdown(target, threads)
    assert "| 1.30? |" in text and "**1.30**" not in text
    assert "0/1 target rows pass, 0 miss, 1 unreliable" in text


def test_an_undisturbed_cell_is_judged(tmp_path):
    missed, threads = _target(tmp_path, 13.0, False)
    assert missed.result == "MISS" and "**1.30**" in _markdown(missed, threads)
    passed, _ = _target(tmp_path, 10.5, False)
    assert passed.result == "PASS" and "| 1.05 |" in _markdown(passed, threads)


def test_a_disturbed_cell_that_would_pass_is_not_counted_as_a_pass(tmp_path):
    target, _ = _target(tmp_path, 10.0, True)
    assert target.result == "UNRELIABLE"


@pytest.mark.parametrize("threads, numel, cpu_per_wall, expected", [
    (2, TARGET_SIZE, [1.95, 1.9, 1.97], False),  # both threads busy all the time
    (2, TARGET_SIZE, [1.1, 0.9, 1.0], True),     # one core taken by another process
    (2, 4096, [0.98, 1.0], False),               # below the parallel grain: one thread is all it uses
    (2, 4096, [0.5, 0.6, 0.4], True),
    (1, TARGET_SIZE, [0.99], False),
])
def test_disturbed_from_the_cpu_time_the_process_got(threads, numel, cpu_per_wall, expected):
    from loss_bench.run import disturbed
    from loss_bench.variants import Variant

    v = Variant("smooth_l1_loss_backward", "ours", lambda: None, 4)
    v.cpu_per_wall = cpu_per_wall
    assert disturbed(v, Config(threads, "float32", "none", numel)) is expected


# ---- bench_distill.py's verdicts, on synthetic rows through its CSV ----

def _distill_rows(ours_s, eager_s, compiled_s):
    import bench_distill

    def row(method, median, status="ran"):
        r = {"dtype": "float32", "n": 1024, "v": 32768, "grads": "student", "method": method, "status": status,
             "bound_compute_s": 0.01, "bound_memory_s": 0.02}
        if status == "ran":
            r.update(median_s=median, p20_s=median * 0.9, p80_s=median * 1.1, peak_x=1.0, warm_s=1.0,
                     grad_err=1e-7 if method != "ours" else "", source="s", isa="avx512")
        return r

    rows = [row("ours", ours_s), row("trl", eager_s), row("trl-compiled", compiled_s)]
    big = [dict(r, n=4096, v=151936) for r in rows]
    big[1] = {**big[1], "status": "not run (needs ~40 GiB)"}
    for r in big[1:2]:
        for k in ("median_s", "p20_s", "p80_s", "peak_x", "warm_s", "grad_err"):
            r.pop(k, None)
    return bench_distill, rows + big


@pytest.mark.parametrize("isa,ours_s,verdicts", [
    ("avx512", 0.05, ("PASS", "PASS")),       # 0.05x eager, 0.2x compiled
    ("avx512", 0.3, ("MISS", "MISS")),        # 0.3x eager, 1.2x compiled
    ("avx2", 0.05, ("PASS", "not judged")),   # compiled TRL is AVX-512's target only
])
def test_distill_verdicts(tmp_path, isa, ours_s, verdicts):
    bench, rows = _distill_rows(ours_s, 1.0, 0.25)
    meta = {"date": "d", "revision": "r", "cpu": "c", "isa": isa, "threads": "2", "torch": "t", "exp_ns": "0.5",
            "log_ns": "0.6", "bandwidth_gbs": "20", "load_average": "0", "limit_gib": "16"}
    path = os.path.join(tmp_path, "d.csv")
    bench.write_csv(path, meta, rows)
    meta2, rows2 = bench.read_csv(path)
    bench.report(meta2, rows2, str(tmp_path), "d")
    text = open(os.path.join(tmp_path, "d.md")).read()
    line = next(x for x in text.splitlines() if x.startswith("| float32 | 1024 x 32768"))
    eager_cell, compiled_cell = line.split(" | ")[7], line.split(" | ")[9]
    assert eager_cell.startswith(f"<= 0.06x: {verdicts[0]}")
    assert compiled_cell.startswith(f"<= 0.25x: {verdicts[1]}")
    assert f"bound {0.02 / 1.0:.3f}x" in eager_cell  # the larger floor over the baseline's time
    big = next(x for x in text.splitlines() if x.startswith("| float32 | 4096 x 151936"))
    assert "not run (needs ~40 GiB)" in big and big.split(" | ")[7] == "-"  # no eager verdict there
    judged = sum(v != "not judged" for v in verdicts) + (1 if isa == "avx512" else 0)
    assert f"Targets judged: {judged}," in text
