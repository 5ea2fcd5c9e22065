"""Distillation at vocabulary scale: npu_loss_ops.generalized_jsd_loss against TRL's function, eager and compiled.

One run measures, for each (dtype, N, V), the forward + backward of each method on the same seeded inputs
(a quarter of the tokens ignored, the teacher not requiring grad; one extra row with the teacher's gradient):

    ours            npu_loss_ops.generalized_jsd_loss (the CPU kernels, at --isa or the best instruction set)
    trl             TRL 1.16's GKDTrainer.generalized_jsd_loss where trl is installed, else its formula as TRL
                    writes it (tests/reference.py restates it line by line)
    trl-compiled    torch.compile(that function, dynamic=False), default mode, not fullgraph; the compile
                    and two warm calls are not timed

Each method runs in a fresh process, at --threads threads: a warm call (for trl-compiled the compiling
call and two warm ones), then the peak memory of one
forward + backward (the process's peak resident size above the inputs, in units of one N x V tensor of the
logits' dtype: tests/test_distillation.py's protocol), then --reps timed calls (median and p20/p80). A
baseline runs only where its projected peak (its measured multiple at the smallest size of its dtype times
N x V, plus the inputs) is at most --limit-gib; ours runs at every size. Every method's student gradient is
compared with ours (max |difference| / max |ours|), which shows a baseline that computes wrong gradients.

The bound beside each target, over the rows kept (an ignored row only has its gradient zeroed): the
package's vector exp and log measured per instruction set (ns per value, one thread, in L2, without the
call's fixed cost), times the least work of a two-pass kernel (2 exp + 1 log per logit: one exp per side for
the softmaxes, one log for the mixture), as the threads share the rows; or the memory floor: each kept logit
read once at the bandwidth of aten.add on 64M-float32 tensors, plus the second pass that reads both rows again
at the bandwidth torch.sum reaches on one thread re-reading a working set of one student row and one teacher
row (the cache effect: 256 KiB at V = 32,768 float32 fits a core's L2, 1.16 MiB at V = 151,936 may not),
times the threads, plus each gradient allocated and written once (torch.empty(N, V).fill_(0), timed: the page
faults of fresh memory are most of a gradient's cost); the larger of the two, divided by the baseline's time.

Writes --out/bench_distill[_quick].csv, .md (the table, the targets, the bounds) and .png (needs
matplotlib). --from-csv redraws the table and figure from a CSV without timing anything.

    python benchmarks/bench_distill.py                 # the issue's sizes: N in {1024, 4096} x V in {32768, 151936}
    python benchmarks/bench_distill.py --quick         # N = 256, V in {32768, 151936}: a couple of minutes
    python benchmarks/bench_distill.py --isa avx2      # ours at AVX2 (and ATen's kernels at AVX2)
    python benchmarks/bench_distill.py --from-csv benchmarks/results/bench_distill_avx2.csv --out benchmarks/results
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_common import (ISAS, REPO, WORKER_PRELUDE, cpu_model, git_revision, load_average,  # noqa: E402
                          quantile, ratio_with_spread, read_csv_with_meta, run_worker, write_csv_with_meta)
from distill_bounds import (MIN_EXP, MIN_LOG, REREAD_STREAMS, bandwidth_gbs, bound_seconds,  # noqa: E402
                            fresh_write_s, reread_gbs, vector_math_ns)
from loss_bench.progress import Progress  # noqa: E402

METHODS = ("ours", "trl", "trl-compiled")
FULL_SHAPES = [(1024, 32768), (4096, 32768), (1024, 151936), (4096, 151936)]
QUICK_SHAPES = [(256, 32768), (256, 151936)]
# The targets (docs: benchmarks/README.md, "Distillation"): ours / baseline, forward + backward.
TARGETS = {"trl-compiled": 0.25, "trl": 0.06}

# ---- the worker: one method, one configuration, in its own process ----

WORKER = WORKER_PRELUDE + r"""


def trl_function():
    try:
        from trl.experimental.gkd.gkd_trainer import GKDTrainer
        return GKDTrainer.generalized_jsd_loss, "trl " + __import__("trl").__version__
    except Exception:
        from reference import trl_generalized_jsd_loss
        return trl_generalized_jsd_loss, "TRL 1.16's formula (tests/reference.py)"


n, v, dtype = cfg["n"], cfg["v"], getattr(torch, cfg["dtype"])
gen = torch.Generator().manual_seed(0)
student = torch.randn(n, v, generator=gen).to(dtype)
teacher = torch.randn(n, v, generator=gen).to(dtype)
labels = torch.randint(0, v, (n,), generator=gen)
labels[torch.rand(n, generator=gen) < 0.25] = -100
student.requires_grad_(True)
teacher.requires_grad_(cfg["grads"] == "both")
source = "npu_loss_ops " + npu_loss_ops.__version__
if cfg["method"] == "ours":
    fn = npu_loss_ops.generalized_jsd_loss
else:
    fn, source = trl_function()
    if cfg["method"] == "trl-compiled":
        fn = torch.compile(fn, dynamic=False)


def step():
    student.grad = teacher.grad = None
    fn(student, teacher, labels, beta=0.5).backward()


def reset():
    student.grad = teacher.grad = None  # the warm calls' gradients are not the inputs: the peak counts them again


# the compiling call and two warm ones; eager: one
times, peak, compile_s = measure(step, 3 if cfg["method"] == "trl-compiled" else 1, reset,
                                 n * v * student.element_size())
err = None
if cfg["method"] != "ours":  # the baseline's student gradient against ours
    grad = student.grad
    student.grad = teacher.grad = None
    npu_loss_ops.generalized_jsd_loss(student, teacher, labels, beta=0.5).backward()
    err = relative_error(grad, student.grad)
print(json.dumps({"times": times, "peak": peak, "warm_s": compile_s, "grad_err": err, "source": source,
                  "isa": npu_loss_ops.build_info()["cpu_isa"], "kept": int((labels != -100).sum())}))
"""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="N = 256 at both vocabularies, 2 timed calls")
    p.add_argument("--shapes", help="NxV,NxV,... (default: the issue's four)")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=3, help="timed forward + backward calls per method")
    p.add_argument("--limit-gib", type=float, default=16.0, help="a baseline's largest projected peak")
    p.add_argument("--isa", choices=sorted(ISAS), help="ours at this instruction set, ATen's kernels at its level")
    p.add_argument("--out", default=os.path.join(HERE, "out"))
    p.add_argument("--from-csv", help="print and redraw from this CSV; time nothing")
    return p.parse_args()


FIELDS = ["dtype", "n", "v", "grads", "method", "status", "median_s", "p20_s", "p80_s", "peak_x", "warm_s",
          "grad_err", "source", "isa", "bound_compute_s", "bound_memory_s"]


def main() -> None:
    args = parse_args()
    if args.from_csv:
        meta, rows = read_csv(args.from_csv)
        report(meta, rows, args.out, os.path.splitext(os.path.basename(args.from_csv))[0])
        return
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TRL_EXPERIMENTAL_SILENCE": "1"}
    if args.isa:
        env["NPU_LOSS_OPS_CPU_ISA"], env["ATEN_CPU_CAPABILITY"] = args.isa, ISAS[args.isa]
    shapes = QUICK_SHAPES if args.quick else FULL_SHAPES
    if args.shapes:
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    shapes = sorted(shapes, key=lambda s: s[0] * s[1])
    reps = 2 if args.quick and args.reps == 3 else args.reps
    dtypes, methods = args.dtypes.split(","), args.methods.split(",")
    configs = [(d, n, v, "student") for d in dtypes for n, v in shapes]
    configs.append((dtypes[0], *shapes[0], "both"))  # the teacher's gradient too, at the smallest size

    import torch

    import npu_loss_ops

    isa = args.isa or npu_loss_ops.build_info()["cpu_isa"]
    every_isa = {name: vector_math_ns(name) for name in npu_loss_ops.build_info()["cpu_isas_available"]}
    math_ns = every_isa.get(isa) or vector_math_ns(isa)
    gbs = bandwidth_gbs(args.threads)
    sizes = sorted({torch.empty((), dtype=getattr(torch, d)).element_size() for d in dtypes})
    rereads = {(v, size): reread_gbs(v, size) for v in sorted({v for _, v in shapes}) for size in sizes}
    meta = {"date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "revision": git_revision(),
            "cpu": cpu_model(), "isa": isa, "threads": str(args.threads), "torch": torch.__version__,
            "exp_ns": f"{math_ns['exp']:.3f}", "log_ns": f"{math_ns['log']:.3f}", "bandwidth_gbs": f"{gbs:.1f}",
            "load_average": f"{load_average():.2f}", "limit_gib": str(args.limit_gib),
            "vector_math": "; ".join(f"{name} exp {ns['exp']:.3f} log {ns['log']:.3f}" for name, ns in every_isa.items()),
            "reread_gbs": "; ".join(f"{2 * v * size / 2**20:.2f} MiB {gb:.1f}" for (v, size), gb in rereads.items())}
    print(f"vector math at {isa}: exp {math_ns['exp']:.2f} ns, log {math_ns['log']:.2f} ns per value (one "
          f"thread); aten.add bandwidth {gbs:.1f} GB/s at {args.threads} threads; every instruction set: "
          f"{meta['vector_math']}; re-reading a row pair on one thread (working set, GB/s): {meta['reread_gbs']}",
          flush=True)

    multiples: dict[tuple[str, str, str], float] = {}
    rows = []
    progress = Progress(len(configs) * len(methods))
    for dtype, n, v, grads in configs:
        elsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        kept = None  # the rows kept, as the first worker reports them (the same seeded labels for every method)
        fresh = fresh_write_s(n, v, dtype, args.threads)
        for method in methods:
            progress.begin(f"{method} {n}x{v} {dtype}{' both' if grads == 'both' else ''}")
            row = {"dtype": dtype, "n": n, "v": v, "grads": grads, "method": method}
            known = multiples.get((method, dtype, grads))
            needs = ((known or 0) + 2) * n * v * elsize / 2**30
            if method != "ours" and known is not None and needs > args.limit_gib:
                row["status"] = f"not run (needs ~{needs:.0f} GiB)"
            else:
                cfg = {"method": method, "n": n, "v": v, "dtype": dtype, "grads": grads, "threads": args.threads,
                       "reps": reps, "repo": REPO}
                r = run_worker(WORKER, cfg, env, timeout=3600)
                multiples[(method, dtype, grads)] = max(known or 0, r["peak"])
                row.update(status="ran", median_s=quantile(r["times"], 0.5), p20_s=quantile(r["times"], 0.2),
                           p80_s=quantile(r["times"], 0.8), peak_x=r["peak"], warm_s=r["warm_s"],
                           grad_err=r["grad_err"] if r["grad_err"] is not None else "", source=r["source"],
                           isa=r["isa"])
                kept = r["kept"]
            if kept is not None:
                row["bound_compute_s"], row["bound_memory_s"] = bound_seconds(
                    kept, v, elsize, args.threads, math_ns, gbs, rereads[(v, elsize)], fresh, grads == "both")
            rows.append(row)
            progress.end()
    progress.close()
    os.makedirs(args.out, exist_ok=True)
    name = "bench_distill_quick" if args.quick else "bench_distill"
    write_csv(os.path.join(args.out, name + ".csv"), meta, rows)
    report(meta, rows, args.out, name)


# ---- the report ----

def write_csv(path: str, meta: dict, rows: list[dict]) -> None:
    write_csv_with_meta(path, meta, rows, FIELDS)


def read_csv(path: str) -> tuple[dict, list[dict]]:
    return read_csv_with_meta(path, ("n", "v"), ("median_s", "p20_s", "p80_s", "peak_x", "warm_s", "grad_err",
                                                 "bound_compute_s", "bound_memory_s"))


_ratio = ratio_with_spread


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    if row["status"] != "ran":
        return row["status"]
    return f"{row['median_s']:.3f} s ({row['p20_s']:.3f}-{row['p80_s']:.3f}), {row['peak_x']:.2f}x"


def judged(method: str, meta: dict) -> str | None:
    """Why a target is not judged on this run's instruction set, or None."""
    if method == "trl-compiled" and meta["isa"] != "avx512":
        return f"not judged at {meta['isa']} (the target is AVX-512's)"
    return None


def report(meta: dict, rows: list[dict], out: str, name: str) -> None:
    keys = sorted({(r["dtype"], r["n"], r["v"], r["grads"]) for r in rows},
                  key=lambda k: (k[3] != "student", k[0], k[1] * k[2]))
    by = {(r["dtype"], r["n"], r["v"], r["grads"], r["method"]): r for r in rows}
    lines = [f"Distillation, forward + backward, {meta['threads']} threads, ours at {meta['isa']}; "
             f"{meta['cpu']}, torch {meta['torch']}, revision {meta['revision']}, {meta['date']} UTC.",
             "",
             f"Vector math at {meta['isa']}: exp {float(meta['exp_ns']):.2f} ns and log "
             f"{float(meta['log_ns']):.2f} ns per value on one thread; aten.add moves "
             f"{float(meta['bandwidth_gbs']):.1f} GB/s; re-reading a student row and a teacher row on one thread "
             f"(working set, GB/s): {meta.get('reread_gbs', '-')}. Every instruction set's vector math (ns): "
             f"{meta.get('vector_math', '-')}.",
             "",
             f"Bound, over the rows kept: a two-pass kernel's {MIN_EXP} exp + {MIN_LOG} log per logit over "
             f"{meta['threads']} threads; or each kept logit read once at aten.add's bandwidth, plus "
             f"{REREAD_STREAMS} re-read streams at the row pair's re-read bandwidth times {meta['threads']} "
             f"threads, plus each gradient allocated and written once (torch.empty(N, V).fill_(0), page faults "
             f"included); the larger.",
             "",
             "Each cell: median time (p20-p80) and peak memory above the inputs (x one N x V tensor of the dtype).",
             "",
             "| dtype | N x V | grads | ours | TRL eager | TRL compiled | ours / eager (spread) | target, bound "
             "| ours / compiled (spread) | target, bound | max grad diff (eager, compiled) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    verdicts = []
    for dtype, n, v, grads in keys:
        ours = by.get((dtype, n, v, grads, "ours"))
        cells = [dtype, f"{n} x {v}", grads, _cell(ours)]
        cells += [_cell(by.get((dtype, n, v, grads, m))) for m in ("trl", "trl-compiled")]
        errs = []
        for method in ("trl", "trl-compiled"):
            base = by.get((dtype, n, v, grads, method))
            if ours is None or ours["status"] != "ran" or base is None or base["status"] != "ran":
                cells += ["-", "-"]
                errs.append("-")
                continue
            errs.append(f"{base['grad_err']:.1e}" if base["grad_err"] is not None else "-")
            ratio, lo, hi = _ratio(ours, base)
            bound = max(ours["bound_compute_s"], ours["bound_memory_s"]) / base["median_s"]
            why = judged(method, meta)
            verdict = why or ("PASS" if ratio <= TARGETS[method] else "MISS")
            if why is None:
                verdicts.append((dtype, n, v, method, verdict))
            cells += [f"{ratio:.3f}x ({lo:.3f}-{hi:.3f})", f"<= {TARGETS[method]}x: {verdict}; bound {bound:.3f}x"]
        cells.append(", ".join(errs))
        lines.append("| " + " | ".join(cells) + " |")
    passed = sum(v[-1] == "PASS" for v in verdicts)
    lines += ["", f"Targets judged: {len(verdicts)}, passed: {passed}."]
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name + ".md"), "w") as f:
        f.write(text)
    figure(meta, rows, keys, by, os.path.join(out, name + ".png"))


def figure(meta: dict, rows: list[dict], keys: list, by: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no figure", file=sys.stderr)
        return
    dtypes = sorted({k[0] for k in keys if k[3] == "student"})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(7 * len(dtypes), 4.8), squeeze=False, sharey=True)
    colors = {"ours": "tab:green", "trl": "tab:red", "trl-compiled": "tab:orange"}
    for ax, dtype in zip(axes[0], dtypes):
        shapes = [(n, v) for d, n, v, g in keys if d == dtype and g == "student"]
        for j, method in enumerate(METHODS):
            xs, ys, err = [], [], [[], []]
            for i, (n, v) in enumerate(shapes):
                r = by.get((dtype, n, v, "student", method))
                if r is None or r["status"] != "ran":
                    continue
                xs.append(i + (j - 1) * 0.27)
                ys.append(r["median_s"])
                err[0].append(r["median_s"] - r["p20_s"])
                err[1].append(r["p80_s"] - r["median_s"])
            ax.bar(xs, ys, width=0.27, color=colors[method], yerr=err, label=method, log=True)
        for i, (n, v) in enumerate(shapes):
            r = by[(dtype, n, v, "student", "ours")]
            ax.plot([i - 0.45, i + 0.45], [max(r["bound_compute_s"], r["bound_memory_s"])] * 2, "k--", lw=1,
                    label="bound" if i == 0 else None)
        ax.set_xticks(range(len(shapes)), [f"{n}x{v}" for n, v in shapes])
        ax.set_title(f"{dtype}, forward + backward")
        ax.set_ylabel("seconds per call (log)")
        ax.legend(loc="upper left", fontsize=9)
    fig.suptitle(f"generalized JSD: ours at {meta['isa']} against TRL's function, {meta['threads']} threads "
                 f"({meta['cpu']})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
