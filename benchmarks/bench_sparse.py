"""A served teacher's sparse divergence: npu_loss_ops.sparse_jsd_loss against TRL's sparse path, eager and compiled.

TRL 1.16's ServerDistillationTrainer distils from a teacher behind a server that returns, for each token, only
its top-K log-probabilities and their token ids. At beta 0 (forward KL over the teacher's top-K, the tail bucket
on) its loss is the student's whole log_softmax gathered at the ids, the tail bucket on both sides, the divergence
per entry and the mean over the kept rows. One run measures, for each (dtype, N, V, K), the forward + backward of
each method on the same seeded inputs:

    ours            npu_loss_ops.sparse_jsd_loss(student_logits, teacher_logprobs, teacher_token_ids, labels,
                    support_mask=mask, beta=0.0, add_tail=True)
    trl             TRL's own functions composed as its forward-KL server path composes them:
                    log_softmax(student / T), the gather at the ids (id 0 where masked), -inf where masked,
                    _add_tail_bucket on both sides, _jsd_divergence, _reduce_divergence_loss(..., "batchmean");
                    where trl is not installed, tests/reference.py's sparse_jsd_reference in the inputs' dtype
                    (the output says which)
    trl-compiled    torch.compile(that function, dynamic=False), default mode, not fullgraph; the compile and
                    two warm calls are not timed

The inputs: the student's logits (N, V) in the dtype, seeded, requiring grad; a quarter of the labels -100; the
teacher's top-K of a random teacher's log_softmax (float32, not requiring grad) with their ids; the support mask
all true except in every 16th row, where the last K - K // 2 entries are a server's padding (id 0, log-probability
-inf, masked) when K > 1.

Each method runs in a fresh process, at --threads threads: a warm call (for trl-compiled the compiling call and
two warm ones), then the peak memory of one forward + backward (the process's peak resident size above the
inputs, in units of one N x V tensor of the logits' dtype: tests/test_distillation.py's protocol), then --reps
timed calls (median and p20/p80). A baseline runs only where its projected peak (its largest measured multiple
at a smaller size of its dtype times N x V, plus the logits) is at most --limit-gib; ours runs at every size.
Every method's student gradient is compared with ours (max |difference| / max |ours|).

The bound, "two passes over N x V": the logits read once at the bandwidth of aten.add on 64M-float32 tensors,
plus the gradient allocated and written once (torch.empty(N, V).fill_(0), timed: the page faults of fresh memory
are most of a gradient's cost). The sparse divergence needs no more than that: one pass for the row's
log-sum-exp, and the gradient written from it (softmax minus the teacher's entries). It is reported as the
bound's time / ours' time (1 is the floor reached).

Writes --out/bench_sparse[_quick].csv and .md (the table, the targets, the bound). --from-csv reprints the table
from a CSV without timing anything.

    python benchmarks/bench_sparse.py                 # N in {2048, 8192} x V in {32768, 151936} x K in {1, 8, 64}
    python benchmarks/bench_sparse.py --quick         # N = 256, V = 32768, K = 8: under a minute
    python benchmarks/bench_sparse.py --n 2048 --v 151936 --k 64 --dtype bfloat16
    python benchmarks/bench_sparse.py --from-csv benchmarks/out/bench_sparse.csv
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_common import (REPO, WORKER_PRELUDE, cpu_model, git_revision, load_average, quantile,  # noqa: E402
                          ratio_with_spread, read_csv_with_meta, run_worker, write_csv_with_meta)
from distill_bounds import bandwidth_gbs, fresh_write_s  # noqa: E402
from loss_bench.progress import Progress  # noqa: E402

METHODS = ("ours", "trl", "trl-compiled")
FULL = {"n": [2048, 8192], "v": [32768, 151936], "k": [1, 8, 64]}
QUICK = {"n": [256], "v": [32768], "k": [8]}
# The targets: ours / baseline, forward + backward.
TARGETS = {"trl": 0.2, "trl-compiled": 0.5}

# ---- the worker: one method, one configuration, in its own process ----

WORKER = WORKER_PRELUDE + r"""

TEMPERATURE = 1.0  # TRL divides the logits by its temperature even at 1, which copies them; ours does not need to


def trl_function():
    # TRL's forward-KL server path (ServerDistillationTrainer._compute_server_forward_kl_loss after its
    # log_softmax), from TRL's own functions, on a 2-D batch of rows; without trl, the reference's restatement.
    try:
        import trl
        from trl.experimental.server_distillation import server_distillation_trainer as server
    except Exception:
        from reference import sparse_jsd_reference

        def fallback(student, teacher, ids, labels, mask):
            return sparse_jsd_reference(student, teacher, ids, labels, mask, beta=0.0, temperature=TEMPERATURE,
                                        add_tail=True)

        return fallback, "trl missing: tests/reference.py's sparse_jsd_reference in the inputs' dtype"
    add_tail, divergence = server._add_tail_bucket, server._jsd_divergence
    reduce = server.ServerDistillationTrainer._reduce_divergence_loss

    def trl_sparse(student, teacher, ids, labels, mask):
        log_p = F.log_softmax(student / TEMPERATURE, dim=-1)
        neg_inf = torch.full((), float("-inf"), dtype=log_p.dtype, device=log_p.device)
        s = torch.where(mask, log_p.gather(-1, torch.where(mask, ids, 0)), neg_inf)
        t = torch.where(mask, teacher, neg_inf)
        (s, support), (t, _) = add_tail(s, mask), add_tail(t, mask)
        jsd = divergence(s, t, 0.0, support)
        return reduce(jsd, labels != -100, "batchmean", None)

    return trl_sparse, "trl " + trl.__version__


def ours_function(student, teacher, ids, labels, mask):
    return npu_loss_ops.sparse_jsd_loss(student, teacher, ids, labels, support_mask=mask, beta=0.0,
                                        add_tail=True)


n, v, k, dtype = cfg["n"], cfg["v"], cfg["k"], getattr(torch, cfg["dtype"])
# The inputs a block of rows at a time, so that no whole random teacher (N x V float32) is ever made.
gen = torch.Generator().manual_seed(0)
student = torch.empty(n, v, dtype=dtype)
teacher = torch.empty(n, k)
ids = torch.empty(n, k, dtype=torch.long)
for start in range(0, n, 256):
    rows = slice(start, min(n, start + 256))
    count = rows.stop - rows.start
    student[rows] = torch.randn(count, v, generator=gen)
    teacher[rows], ids[rows] = (torch.randn(count, v, generator=gen) * 3).log_softmax(-1).topk(k, -1)
labels = torch.randint(0, v, (n,), generator=gen)
labels[torch.randperm(n, generator=gen)[: n // 4]] = -100
if k > 1:  # a server that returned fewer than K entries there: padding with id 0 and -inf, masked
    teacher[::16, k // 2:] = float("-inf")
    ids[::16, k // 2:] = 0
mask = teacher > float("-inf")
student.requires_grad_(True)
source = "npu_loss_ops " + npu_loss_ops.__version__
if cfg["method"] == "ours":
    fn = ours_function
else:
    fn, source = trl_function()
    if cfg["method"] == "trl-compiled":
        fn = torch.compile(fn, dynamic=False)


def step():
    student.grad = None
    fn(student, teacher, ids, labels, mask).backward()


def reset():
    student.grad = None  # the warm calls' gradient is not an input: the peak counts it again


# the compiling call and two warm ones; eager: one
times, peak, warm_s = measure(step, 3 if cfg["method"] == "trl-compiled" else 1, reset,
                              n * v * student.element_size())
err = None
if cfg["method"] != "ours":  # the baseline's student gradient against ours
    grad = student.grad
    student.grad = None
    ours_function(student, teacher, ids, labels, mask).backward()
    err = relative_error(grad, student.grad)
print(json.dumps({"times": times, "peak": peak, "warm_s": warm_s, "grad_err": err, "source": source,
                  "isa": npu_loss_ops.build_info()["cpu_isa"], "kept": int((labels != -100).sum()),
                  "masked": int((~mask).sum())}))
"""


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="N = 256, V = 32768, K = 8, 2 timed calls")
    p.add_argument("--n", type=_ints, help="rows, comma-separated (default 2048,8192; --quick 256)")
    p.add_argument("--v", type=_ints, help="vocabulary sizes, comma-separated (default 32768,151936; --quick 32768)")
    p.add_argument("--k", type=_ints, help="the teacher's top-K, comma-separated (default 1,8,64; --quick 8)")
    p.add_argument("--dtype", default="float32,bfloat16", help="the logits' dtypes, comma-separated")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, help="timed forward + backward calls per method (default 3; --quick 2)")
    p.add_argument("--limit-gib", type=float, default=16.0, help="a baseline's largest projected peak")
    p.add_argument("--out", default=os.path.join(HERE, "out"))
    p.add_argument("--from-csv", help="print the table from this CSV; time nothing")
    return p.parse_args()


FIELDS = ["dtype", "n", "v", "k", "method", "status", "median_s", "p20_s", "p80_s", "peak_x", "warm_s",
          "grad_err", "source", "isa", "kept", "masked", "bound_s"]


def main() -> None:
    args = parse_args()
    if args.from_csv:
        meta, rows = read_csv(args.from_csv)
        report(meta, rows, args.out, os.path.splitext(os.path.basename(args.from_csv))[0])
        return
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TRL_EXPERIMENTAL_SILENCE": "1"}
    grid = QUICK if args.quick else FULL
    ns, vs, ks = args.n or grid["n"], args.v or grid["v"], args.k or grid["k"]
    reps = args.reps or (2 if args.quick else 3)
    dtypes, methods = args.dtype.split(","), args.methods.split(",")
    shapes = sorted(((n, v) for n in ns for v in vs), key=lambda s: s[0] * s[1])
    configs = [(d, n, v, k) for d in dtypes for n, v in shapes for k in sorted(ks)]

    import torch

    import npu_loss_ops

    gbs = bandwidth_gbs(args.threads)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "revision": git_revision(),
            "cpu": cpu_model(), "isa": npu_loss_ops.build_info()["cpu_isa"], "threads": str(args.threads),
            "torch": torch.__version__, "bandwidth_gbs": f"{gbs:.1f}", "load_average": f"{load_average():.2f}",
            "limit_gib": str(args.limit_gib), "reps": str(reps)}
    print(f"aten.add bandwidth {gbs:.1f} GB/s at {args.threads} threads; ours at {meta['isa']}; load average "
          f"{meta['load_average']}", flush=True)

    multiples: dict[tuple[str, str], float] = {}
    fresh: dict[tuple[int, int, str], float] = {}
    rows = []
    progress = Progress(len(configs) * len(methods))
    for dtype, n, v, k in configs:
        elsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        if (n, v, dtype) not in fresh:
            fresh[(n, v, dtype)] = fresh_write_s(n, v, dtype, args.threads)
        bound = n * v * elsize / (gbs * 1e9) + fresh[(n, v, dtype)]
        for method in methods:
            progress.begin(f"{method} {n}x{v} k{k} {dtype}")
            row = {"dtype": dtype, "n": n, "v": v, "k": k, "method": method, "bound_s": bound}
            known = multiples.get((method, dtype))
            # The inputs beside the peak: the logits (the teacher's N x K entries are small).
            needs = ((known or 0) + 1) * n * v * elsize / 2**30
            if method != "ours" and known is not None and needs > args.limit_gib:
                row["status"] = f"not run (needs ~{needs:.0f} GiB)"
            else:
                cfg = {"method": method, "n": n, "v": v, "k": k, "dtype": dtype, "threads": args.threads,
                       "reps": reps, "repo": REPO}
                r = run_worker(WORKER, cfg, env, timeout=3600)
                multiples[(method, dtype)] = max(known or 0, r["peak"])
                row.update(status="ran", median_s=quantile(r["times"], 0.5), p20_s=quantile(r["times"], 0.2),
                           p80_s=quantile(r["times"], 0.8), peak_x=r["peak"], warm_s=r["warm_s"],
                           grad_err=r["grad_err"] if r["grad_err"] is not None else "", source=r["source"],
                           isa=r["isa"], kept=r["kept"], masked=r["masked"])
                if r["grad_err"] is not None:
                    print(f"{method} {n}x{v} k{k} {dtype}: student gradient against ours, max |diff| / max |ours| "
                          f"= {r['grad_err']:.2e}", file=sys.stderr, flush=True)
            rows.append(row)
            progress.end()
    progress.close()
    os.makedirs(args.out, exist_ok=True)
    name = "bench_sparse_quick" if args.quick else "bench_sparse"
    write_csv_with_meta(os.path.join(args.out, name + ".csv"), meta, rows, FIELDS)
    report(meta, rows, args.out, name)


# ---- the report ----

def read_csv(path: str) -> tuple[dict, list[dict]]:
    return read_csv_with_meta(path, ("n", "v", "k"), ("median_s", "p20_s", "p80_s", "peak_x", "warm_s", "grad_err",
                                                      "bound_s"))


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    if row["status"] != "ran":
        return row["status"]
    return f"{row['median_s']:.4f} s ({row['p20_s']:.4f}-{row['p80_s']:.4f}), {row['peak_x']:.2f}x"


def report(meta: dict, rows: list[dict], out: str, name: str) -> None:
    order = list(dict.fromkeys(r["dtype"] for r in rows))  # the dtypes in the order they were run
    keys = sorted({(r["dtype"], r["n"], r["v"], r["k"]) for r in rows},
                  key=lambda c: (order.index(c[0]), c[1] * c[2], c[3]))
    by = {(r["dtype"], r["n"], r["v"], r["k"], r["method"]): r for r in rows}
    sources = sorted({r["source"] for r in rows if r["method"] != "ours" and r["status"] == "ran"})
    lines = [f"Sparse divergence of a served teacher (beta 0, the tail bucket), forward + backward, "
             f"{meta['threads']} threads, ours at {meta['isa']}; {meta['cpu']}, torch {meta['torch']}, revision "
             f"{meta['revision']}, {meta['date']} UTC, load average {meta['load_average']} at the start.",
             "",
             f"Baseline: {'; '.join(sources) or '-'} (TRL's forward-KL server path from its own functions).",
             "",
             f"Bound, two passes over N x V: the logits read once at aten.add's {float(meta['bandwidth_gbs']):.1f} "
             f"GB/s, plus the gradient allocated and written once (torch.empty(N, V).fill_(0), page faults "
             f"included); shown as the bound's time / ours' time.",
             "",
             "Each cell: median time (p20-p80) and peak memory above the inputs (x one N x V tensor of the dtype).",
             "",
             "| dtype | N x V | K | ours | TRL eager | TRL compiled | ours / eager (spread) | target "
             "| ours / compiled (spread) | target | bound / ours | max grad diff (eager, compiled) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    verdicts = []
    for dtype, n, v, k in keys:
        ours = by.get((dtype, n, v, k, "ours"))
        ours_ran = ours is not None and ours["status"] == "ran"
        cells = [dtype, f"{n} x {v}", str(k), _cell(ours)]
        cells += [_cell(by.get((dtype, n, v, k, m))) for m in ("trl", "trl-compiled")]
        errs = []
        for method in ("trl", "trl-compiled"):
            base = by.get((dtype, n, v, k, method))
            if base is None or base["status"] != "ran":
                cells += ["-", "-"]
                errs.append("-")
                continue
            errs.append(f"{base['grad_err']:.1e}" if base["grad_err"] is not None else "-")
            if not ours_ran:
                cells += ["-", "-"]
                continue
            ratio, lo, hi = ratio_with_spread(ours, base)
            verdict = "PASS" if ratio <= TARGETS[method] else "MISS"
            verdicts.append(verdict)
            cells += [f"{ratio:.3f}x ({lo:.3f}-{hi:.3f})", f"<= {TARGETS[method]}x: {verdict}"]
        cells.append(f"{ours['bound_s'] / ours['median_s']:.2f}" if ours_ran else "-")
        cells.append(", ".join(errs))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Targets judged: {len(verdicts)}, passed: {verdicts.count('PASS')}."]
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name + ".md"), "w") as f:
        f.write(text)
    figure(meta, keys, by, os.path.join(out, name + ".png"))


def figure(meta: dict, keys: list, by: dict, path: str) -> None:
    """Each method's seconds per call (median, p20-p80 whiskers) per shape and K, one panel per dtype, with the
    two-pass bound as a dashed line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no figure", file=sys.stderr)
        return
    dtypes = list(dict.fromkeys(k[0] for k in keys))
    fig, axes = plt.subplots(1, len(dtypes), figsize=(7 * len(dtypes), 4.8), squeeze=False, sharey=True)
    colors = {"ours": "tab:green", "trl": "tab:red", "trl-compiled": "tab:orange"}
    for ax, dtype in zip(axes[0], dtypes):
        cells = [(n, v, k) for d, n, v, k in keys if d == dtype]
        for j, method in enumerate(METHODS):
            xs, ys, err = [], [], [[], []]
            for i, (n, v, k) in enumerate(cells):
                r = by.get((dtype, n, v, k, method))
                if r is None or r["status"] != "ran":
                    continue
                xs.append(i + (j - 1) * 0.27)
                ys.append(r["median_s"])
                err[0].append(r["median_s"] - r["p20_s"])
                err[1].append(r["p80_s"] - r["median_s"])
            ax.bar(xs, ys, width=0.27, color=colors[method], yerr=err, label=method, log=True)
        for i, (n, v, k) in enumerate(cells):
            r = by.get((dtype, n, v, k, "ours"))
            if r is not None and r["status"] == "ran":
                ax.plot([i - 0.45, i + 0.45], [r["bound_s"]] * 2, "k--", lw=1, label="bound" if i == 0 else None)
        ax.set_xticks(range(len(cells)), [f"{n}x{v}\nK {k}" for n, v, k in cells], fontsize=8)
        ax.set_title(f"{dtype}, forward + backward")
        ax.set_ylabel("seconds per call (log)")
        ax.legend(loc="upper left", fontsize=9)
    fig.suptitle(f"sparse JSD (served teacher): ours at {meta['isa']} against TRL's sparse path, "
                 f"{meta['threads']} threads ({meta['cpu']})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
