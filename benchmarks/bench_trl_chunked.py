"""The fused JSD against TRL's chunked divergence loss: npu_loss_ops.trl.chunked_divergence_loss against TRL 1.16's
trl.trainer.distillation_trainer._chunked_divergence_loss (DistillationTrainer's loss) on its torch path.

One run measures, for each (N, V, H_s, beta, dtype), the forward + backward of each method on the same seeded
inputs (bench_fused_linear.py's: hidden states of the student, H_s, and of the teacher, H_t = 2 H_s; `lm_head`
weights (V, H) scaled by 1/sqrt(H); no bias; temperature 1; the student's hidden states and weight require
grad, the teacher's do not), shaped (B, N / B, H) with B = 8 sequences, and a completion mask with about 10 %
zeros at random positions (--mask-zeros; the fraction drawn is in the results):

    package         npu_loss_ops.trl.chunked_divergence_loss (fused_linear_jsd_loss, its default chunk)
    trl             TRL 1.16's _chunked_divergence_loss, imported from trl: on a CPU its torch path (tiles of
                    4,096 tokens x 32,768 vocabulary, projected in float32, two passes over the tiles for
                    0 < beta < 1, one for beta 0 or 1, a third projection of both sides in the backward)
    matmul          the package's matmul floor: its four products alone (the student's and the teacher's
                    logits, the student's input and weight gradients), in the inputs' dtype, unchunked
    matmul-chunked  the same products in the package's chunk (N/8 rows, the teacher's logits in halves of it)

The two matmul methods are bench_fused_linear.py's own, run through its worker; the package's and TRL's calls
are added to that worker, so the three share one protocol: each method in a fresh process at --threads
threads, a warm call, then the peak memory of one forward + backward (the process's peak resident size above the
inputs, the weights and the student's gradients, in units of one N x V tensor of the logits' dtype), then the
rest of --repeats timed calls. Where one call takes more than --max-call-s, that method's repeats drop to 1
(the record says how many ran). A floor is measured once per (dtype, N, H_s, V) and serves each beta.

Once per case, the TRL process also runs the package and raises (failing the run) unless the two losses agree
within rtol 1e-4 (float32) or 3e-2 (bfloat16); the student weight gradients' difference is recorded
(max |difference| / max |package|).

Ratios are the medians' ratio with the spread over the repeats (the package's fastest over the other's slowest
to its slowest over the other's fastest). Writes JSON lines (one record per case, appended as each case ends)
and a Markdown table, --out/trl_chunked_<avx512|avx2>[_quick].jsonl and .md; --from-jsonl rewrites the table
from a JSONL file without timing anything.

    python benchmarks/bench_trl_chunked.py --quick          # N 512, H 256, V 16,384: under a minute
    python benchmarks/bench_trl_chunked.py --n 2048 --v 32768 --h 1024 --beta 0.5,0 --dtype float32,bfloat16
    python benchmarks/bench_trl_chunked.py --n 2048 --v 151936 --h 1024 --beta 0.5 --append --deadline 1767000000
    python benchmarks/bench_trl_chunked.py --from-jsonl benchmarks/results/trl_chunked_avx512.jsonl

It needs trl 1.16 where it runs (the package beside it): `.venv-trl/bin/python` here.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_common import (REPO, cpu_model, extension_stamp, git_revision, load_average, quantile,  # noqa: E402
                          ratio_with_spread, run_worker)
from bench_fused_linear import WORKER as LINEAR_WORKER, default_chunk  # noqa: E402
from loss_bench.progress import Progress  # noqa: E402

FLOORS = ("matmul", "matmul-chunked")
# The quick mode: both dtypes, both of TRL's paths (two passes at 0 < beta < 1, one at beta 0).
QUICK_GRID = [(512, 16384, 256, 0.5, "float32"), (512, 16384, 256, 0.0, "bfloat16")]
# The targets, per CPU kind: the package's time over its matmul floor's and over TRL's; its peak in N x V of
# the logits' dtype, and over TRL's peak.
TIME_TARGETS = {"avx512": {"matmul": 1.1, "trl": 0.5}, "avx2": {"matmul": 1.2}}
PEAK_BOUND, PEAK_OVER_TRL = 0.25, 0.5
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}

# The package's and TRL's calls, added to bench_fused_linear.py's worker before its own methods: `ours` is
# rebound to the package's call, so that the worker's tail, which runs `ours()` after a baseline's timed calls
# to compare the student weight gradients, also checks the two losses (in ours(): it raises when they differ).
METHODS = r'''if method in ("package", "trl"):
    import npu_loss_ops.trl
    beta, batch = cfg["beta"], 8 if n % 8 == 0 else 1
    shape = (batch, n // batch)
    mask = (torch.rand(shape, generator=torch.Generator().manual_seed(1)) >= cfg["mask_zeros"]).long()
    losses = {}
    source = {"mask_zeros": float((mask == 0).float().mean())}

    def run(name, loss_fn):
        start = time.perf_counter()
        loss = loss_fn(xs.view(*shape, h), xt.view(*shape, 2 * h), ws, wt, mask, beta)[0]
        loss.backward()
        losses[name] = float(loss)
        if time.perf_counter() - start > cfg["max_call_s"]:
            cfg["reps"] = 1  # read by the worker's timing loop after its first timed call

    def ours():
        run("package", npu_loss_ops.trl.chunked_divergence_loss)
        if "trl" in losses:
            source["losses"] = dict(losses)
            if not math.isclose(losses["package"], losses["trl"], rel_tol=cfg["rtol"]):
                raise AssertionError(f"the losses differ: package {losses['package']!r}, TRL {losses['trl']!r}")

    if method == "package":
        fn, source["impl"] = ours, "npu_loss_ops " + npu_loss_ops.__version__
    else:
        from trl.trainer.distillation_trainer import _chunked_divergence_loss
        from trl.kernels.chunked_logprob import _use_triton
        assert not _use_triton(xs.device), "TRL would take its Triton path"
        fn = lambda: run("trl", _chunked_divergence_loss)  # noqa: E731
        source["impl"] = "trl " + __import__("trl").__version__ + " _chunked_divergence_loss, torch path"
elif method == "ours":
'''
_ANCHOR = 'if method == "ours":\n'
assert _ANCHOR in LINEAR_WORKER, "bench_fused_linear.py's worker changed: its method dispatch is not found"
WORKER = LINEAR_WORKER.replace(_ANCHOR, METHODS, 1)


def cpu_kind() -> str:
    """'avx512' where the CPU has AVX-512 F (lscpu's flags), else 'avx2' where it has AVX2, else 'baseline'."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    return "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "baseline"


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="N 512, H 256, V 16,384: float32 at beta 0.5, bfloat16 at 0")
    p.add_argument("--n", type=_ints, default=[2048, 8192], help="tokens N, a comma list")
    p.add_argument("--v", type=_ints, default=[32768, 151936], help="vocabulary V, a comma list")
    p.add_argument("--h", type=_ints, default=[1024, 2048], help="the student's H (the teacher's is twice it)")
    p.add_argument("--beta", type=_floats, default=[0.5, 0.0], help="a comma list")
    p.add_argument("--dtype", type=lambda s: s.split(","), default=["float32", "bfloat16"], help="a comma list")
    p.add_argument("--repeats", type=int, default=3, help="timed forward + backward calls per method")
    p.add_argument("--max-call-s", type=float, default=60.0, help="above this, a method's repeats drop to 1")
    p.add_argument("--floors", default=",".join(FLOORS), help="which matmul floors to time")
    p.add_argument("--mask-zeros", type=float, default=0.1, help="the completion mask's fraction of zeros")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--deadline", type=float, help="Unix time after which no further case starts")
    p.add_argument("--append", action="store_true", help="add to the JSONL file rather than start it afresh")
    p.add_argument("--out", help="default: benchmarks/results (benchmarks/out with --quick)")
    p.add_argument("--from-jsonl", help="write the table from this JSONL file; time nothing")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.from_jsonl:
        report(read_jsonl(args.from_jsonl), os.path.splitext(args.from_jsonl)[0] + ".md")
        return
    out = args.out or os.path.join(HERE, "out" if args.quick else "results")
    name = f"trl_chunked_{cpu_kind()}" + ("_quick" if args.quick else "")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, name + ".jsonl")
    grid = QUICK_GRID if args.quick else [(n, v, h, beta, dtype) for n in args.n for v in args.v for h in args.h
                                          for beta in args.beta for dtype in args.dtype]
    if not args.append and os.path.exists(path):
        os.remove(path)
    run_grid(args, grid, path)
    report(read_jsonl(path), os.path.join(out, name + ".md"))


def run_grid(args: argparse.Namespace, grid: list[tuple], path: str) -> None:
    import torch
    import trl

    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TRL_EXPERIMENTAL_SILENCE": "1"}
    floors = [f for f in args.floors.split(",") if f]
    command = " ".join([os.path.relpath(sys.executable, REPO), os.path.relpath(__file__, REPO)] + sys.argv[1:])
    meta = {"command": command, "revision": git_revision(), "cpu": cpu_model(), "cpu_kind": cpu_kind(),
            "threads": args.threads, "torch": torch.__version__, "trl_version": trl.__version__}
    measured: dict[tuple, dict] = {}  # the floors of this run, per (dtype, N, H_s, V)
    progress = Progress(len(grid))
    for n, v, h, beta, dtype in grid:
        progress.begin(f"{dtype} N={n} V={v} H={h} beta={beta:g}")
        # The extension as loaded by this case (it is rebuilt in place during development).
        record = {**meta, "extension": extension_stamp(), "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                  "n": n, "v": v, "h": h, "beta": beta, "dtype": dtype, "load_average": round(load_average(), 2)}
        if args.deadline is not None and time.time() > args.deadline:
            record["status"] = "not run (time: the deadline had passed)"
        else:
            started = time.time()
            elsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
            cfg = {"n": n, "h": h, "v": v, "dtype": dtype, "wh": 0.0, "beta": beta, "threads": args.threads,
                   "reps": args.repeats, "repo": REPO, "chunk": default_chunk(n, v, elsize),
                   "mask_zeros": args.mask_zeros, "rtol": TOLERANCE[dtype], "max_call_s": args.max_call_s}
            for method in ("package", "trl"):
                record[method] = run_worker(WORKER, {**cfg, "method": method}, env, timeout=4 * 3600)
            for method in floors:
                key = (dtype, n, h, v, method)
                if key not in measured:
                    measured[key] = run_worker(WORKER, {**cfg, "method": method}, env, timeout=4 * 3600)
                record[method] = measured[key]
            record.update(status="ran", chunk=cfg["chunk"], minutes=round((time.time() - started) / 60, 2))
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
        progress.end()
    progress.close()


def read_jsonl(path: str) -> list[dict]:
    """The records, the last of each case where a case was measured more than once."""
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    by_case = {(r["n"], r["v"], r["h"], r["beta"], r["dtype"]): r for r in records}
    return list(by_case.values())


def _extremes(result: dict) -> dict:
    """A method's times as ratio_with_spread reads them, with the fastest and slowest call in the quantiles'
    places: its spread is then the package's fastest over the other's slowest .. its slowest over the other's
    fastest."""
    t = result["times"]
    return {"median_s": quantile(t, 0.5), "p20_s": min(t), "p80_s": max(t)}


def _seconds(result: dict) -> str:
    t = result["times"]
    return f"{quantile(t, 0.5):.2f} ({min(t):.2f}-{max(t):.2f})" + ("" if len(t) > 1 else " [1 call]")


def _judge(value: float, bound: float | None) -> str:
    return "" if bound is None else " ✓" if value <= bound else " ✗"


def report(records: list[dict], path: str) -> None:
    ran = [r for r in records if r.get("status") == "ran"]
    first = ran[0] if ran else (records[0] if records else {})
    kind = first.get("cpu_kind", cpu_kind())
    targets = TIME_TARGETS.get(kind, {})
    commands = list(dict.fromkeys(r["command"] for r in records if "command" in r))
    fractions = [r["trl"]["source"]["mask_zeros"] for r in ran]
    zeros = " to ".join(dict.fromkeys(f"{100 * x:.1f} %" for x in (min(fractions), max(fractions)))) if ran else "no"
    lines = [f"# The fused JSD against TRL's chunked divergence loss ({first.get('date', '')}, "
             + ", ".join(dict.fromkeys(r.get("revision", "") for r in records)) + ")", "",
             f"CPU: {first.get('cpu', '?')} ({kind}), {first.get('threads', '?')} threads, torch "
             f"{first.get('torch', '?')}, trl {first.get('trl_version', '?')}; the package's "
             + ", ".join(dict.fromkeys(r["extension"] for r in records if "extension" in r)) + ". Commands:", ""]
    lines += [f"    {c}" for c in commands]
    lines += ["", "Seconds per forward + backward: median (fastest-slowest) of the repeats; the package's ratios with "
              "the spread over the repeats (its fastest over the other's slowest to its slowest over the other's "
              "fastest); peak memory above the inputs, the weights and the student's gradients, in units of one "
              "N x V tensor of the logits' dtype, each measured in a fresh process. H_t = 2 H_s; no bias; a "
              f"completion mask with {zeros} zeros at random positions. Targets: package / floor ≤ "
              + " and package / TRL ≤ ".join(f"{b}x" for b in targets.values())
              + f" ({kind}); peak ≤ {PEAK_BOUND}x N x V and ≤ {PEAK_OVER_TRL}x TRL's.", "",
              "The floor is the bound of the time ratios (the package's products cannot run faster than the "
              "products alone): 1.00x for package / floor, floor / TRL for package / TRL.", "",
              "| dtype | N | H_s | V | β | package s | TRL s | floor s | floor (chunked) s | package / floor | "
              "package / chunked floor | package / TRL | bound: floor / TRL | package peak | TRL peak | "
              "package / TRL peak | loss rel. diff. | weight grad diff. |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    judged = passed = 0
    for r in ran:
        pkg, trl = r["package"], r["trl"]
        cells = [r["dtype"], f"{r['n']:,}", f"{r['h']:,}", f"{r['v']:,}", f"{r['beta']:g}", _seconds(pkg),
                 _seconds(trl)]
        cells += [_seconds(r[f]) if f in r else "not run" for f in FLOORS]
        for base in ("matmul", "matmul-chunked", "trl"):
            if base not in r:
                cells.append("")
                continue
            ratio, lo, hi = ratio_with_spread(_extremes(pkg), _extremes(r[base]))
            mark = _judge(ratio, targets.get(base))
            judged, passed = judged + bool(mark), passed + (mark == " ✓")
            cells.append(f"{ratio:.2f}x ({lo:.2f}-{hi:.2f}){mark}")
        cells.append(f"{ratio_with_spread(_extremes(r['matmul']), _extremes(trl))[0]:.3f}x" if "matmul" in r else "")
        peak_over = pkg["peak"] / trl["peak"]
        # Below 0 at small sizes (the allocator reuses what the warm call freed): not judged.
        marks = ("", "") if pkg["peak"] < 0 else (_judge(pkg["peak"], PEAK_BOUND), _judge(peak_over, PEAK_OVER_TRL))
        judged, passed = judged + 2 - marks.count(""), passed + marks.count(" ✓")
        losses = trl["source"]["losses"]
        rel = abs(losses["package"] - losses["trl"]) / abs(losses["trl"])
        cells += [f"{pkg['peak']:.3f}x{marks[0]}", f"{trl['peak']:.2f}x", f"{peak_over:.3f}x{marks[1]}",
                  f"{rel:.1e}", f"{trl['grad_err']:.1e}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Targets judged: {judged}, met: {passed}."]
    skipped = [r for r in records if r.get("status") != "ran"]
    if skipped:
        lines += ["", "Not measured: " + "; ".join(f"{r['dtype']} N {r['n']} V {r['v']} H {r['h']} β {r['beta']:g} "
                                                     f"({r['status']})" for r in skipped) + "."]
    drops = [f"{r['dtype']} N {r['n']} V {r['v']} H {r['h']} β {r['beta']:g}: {m} (warm call {r[m]['warm_s']:.1f} s)"
             for r in ran for m in ("package", "trl", *FLOORS) if m in r and len(r[m]["times"]) < 2]
    if drops:
        lines += ["", "One timed call only (the warm call or the first timed one took longer than --max-call-s): "
                  + "; ".join(drops) + "."]
    text = "\n".join(lines)
    print(text)
    with open(path, "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
