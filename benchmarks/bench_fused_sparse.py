"""The served teacher's divergence from hidden states: npu_loss_ops.fused_linear_sparse_jsd_loss against the three
matmuls alone and TRL's sparse path on the logits.

One run measures, for each (dtype, N, H, V, K), the forward + backward of each method on the same seeded inputs
(the student's hidden states (N, H) and `lm_head` weight (V, H) scaled by 1/sqrt(H), both requiring grad; the
teacher's top-K log-probabilities of a random teacher with their ids, float32, not requiring grad; a quarter of the
tokens ignored; beta 0, the tail bucket, temperature 1, as TRL's ServerDistillationTrainer's top-k support):

    ours            npu_loss_ops.fused_linear_sparse_jsd_loss (its default chunk)
    matmul          the three matmuls alone, unchunked: the student's logits (x @ w.T), then the input's and the
                    weight's gradients from an (N, V) gradient (the logits' buffer reused): the floor, as the
                    fused op is GEMM-bound
    matmul-chunked  the same three matmuls in ours' default chunk (addmm into one reused buffer, the weight's
                    gradient summed over the chunks): the floor within ours' memory bound
    trl             the logits made (x @ w.T), then TRL 1.16's sparse path (log_softmax, the gather, the tail
                    bucket, _jsd_divergence, batchmean; tests/reference.py's restatement where trl is not
                    installed); only where its projected peak fits --limit-gib

Each method runs in a fresh process at --threads threads: one warm call, the peak memory of one forward +
backward (the process's peak resident size above the inputs, the weight and their gradients, in units of one
N x V tensor of the dtype: tests/test_fused_sparse_jsd.py's protocol), then --reps timed calls (median, p20, p80).

Writes --out/bench_fused_sparse.csv, .md and .png (needs matplotlib). --from-csv redraws without timing.

    python benchmarks/bench_fused_sparse.py                 # the grid below
    python benchmarks/bench_fused_sparse.py --quick         # N = 512, H = 256, V = 32,768: under a minute
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
from loss_bench.progress import Progress  # noqa: E402

METHODS = ("ours", "matmul", "matmul-chunked", "trl")
# (dtype, N, H, V, K): the memory sizes (N 2,048 and 8,192, V 151,936, H 1,024) and its H 2,048.
FULL_GRID = ([(d, 2048, 1024, 151936, 8) for d in ("float32", "bfloat16")]
             + [("bfloat16", 2048, 2048, 151936, 8), ("bfloat16", 2048, 1024, 151936, 64)]
             + [(d, 8192, 1024, 151936, 8) for d in ("bfloat16", "float32")])
QUICK_GRID = [(d, 512, 256, 32768, 8) for d in ("float32", "bfloat16")]
TARGET = 1.1  # ours / the three matmuls alone
MEMORY_BOUND = 0.2

WORKER = WORKER_PRELUDE + r"""
n, h, v, k, dtype = cfg["n"], cfg["h"], cfg["v"], cfg["k"], getattr(torch, cfg["dtype"])
gen = torch.Generator().manual_seed(0)
x = torch.randn(n, h, generator=gen).to(dtype).requires_grad_()
w = (torch.randn(v, h, generator=gen) / h ** 0.5).to(dtype).requires_grad_()
teacher = torch.empty(n, k)
ids = torch.empty(n, k, dtype=torch.long)
for first in range(0, n, 256):  # the teacher's top-K, a block of rows at a time
    rows = slice(first, min(first + 256, n))
    teacher[rows], ids[rows] = (torch.randn(rows.stop - first, v, generator=gen) * 3).log_softmax(-1).topk(k, -1)
labels = torch.randint(0, v, (n,), generator=gen)
labels[torch.rand(n, generator=gen) < 0.25] = -100
method, source = cfg["method"], ""

if method == "ours":
    fn = lambda: npu_loss_ops.fused_linear_sparse_jsd_loss(x, w, teacher, ids, labels).backward()  # noqa: E731
    source = "npu_loss_ops " + npu_loss_ops.__version__
elif method == "trl":
    try:
        from trl.experimental.server_distillation import server_distillation_trainer as server
        source = "trl " + __import__("trl").__version__

        mask = torch.ones_like(ids, dtype=torch.bool)

        def divergence(z):  # as ServerDistillationTrainer's forward-KL path, after the logits
            s = F.log_softmax(z, dim=-1).gather(-1, ids)
            (s, support), (t, _) = server._add_tail_bucket(s, mask), server._add_tail_bucket(teacher, mask)
            jsd = server._jsd_divergence(s, t, 0.0, support)
            return server.ServerDistillationTrainer._reduce_divergence_loss(jsd, labels != -100, "batchmean", None)
    except Exception:
        from reference import sparse_jsd_reference
        source = "TRL 1.16's sparse path (tests/reference.py)"
        divergence = lambda z: sparse_jsd_reference(z, teacher, ids, labels)  # noqa: E731
    fn = lambda: divergence(x @ w.T).backward()  # noqa: E731
else:  # the three matmuls, in chunks of `rows` (N: unchunked)
    rows = n if method == "matmul" else cfg["chunk"]
    buf = torch.empty(min(rows, n), v, dtype=dtype)
    source = f"torch.addmm, chunks of {rows} rows"

    def fn():
        with torch.no_grad():
            gx, gw = torch.empty_like(x), torch.zeros_like(w)
            for start in range(0, n, rows):
                m = min(rows, n - start)
                a, z = x[start:start + m], buf[:m]
                torch.addmm(z, a, w.T, beta=0, out=z)
                torch.mm(z, w, out=gx[start:start + m])
                gw.addmm_(z.T, a)
            x.grad, w.grad = gx, gw


def step():
    x.grad = w.grad = None
    fn()


def reset():
    x.grad = w.grad = None


times, peak, warm_s = measure(step, 1, reset, n * v * x.element_size(),
                              counted_bytes=(x.numel() + w.numel()) * x.element_size(), trim=True)
err = None
if method == "trl":
    grad = w.grad
    x.grad = w.grad = None
    npu_loss_ops.fused_linear_sparse_jsd_loss(x, w, teacher, ids, labels).backward()
    err = float((grad.float() - w.grad.float()).abs().max() / w.grad.float().abs().max().clamp(min=1e-30))
print(json.dumps({"times": times, "peak": peak, "warm_s": warm_s, "grad_err": err, "source": source}))
"""


def default_chunk(n: int, v: int, elsize: int) -> int:
    """ours' default rows per chunk (csrc/composite/linear.cpp, linear_chunk_rows): the student's logits alone
    (the CPU's step writes the gradient over them), within an eighth of one N x V tensor and 1 GiB."""
    return max(1, min(n, min(n * v * elsize * 2 // 16, 1 << 30) // (v * elsize)))


FIELDS = ["dtype", "n", "h", "v", "k", "method", "status", "median_s", "p20_s", "p80_s", "peak_x", "warm_s",
          "grad_err", "source", "chunk"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=2, help="timed forward + backward calls per method")
    p.add_argument("--limit-gib", type=float, default=16.0, help="TRL's largest projected peak")
    p.add_argument("--grid", help="only these cells of the grid, by index (e.g. 0,1)")
    p.add_argument("--out", default=os.path.join(HERE, "out"))
    p.add_argument("--from-csv", help="print and redraw from this CSV; time nothing")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.from_csv:
        meta, rows = read_csv_with_meta(args.from_csv, ("n", "h", "v", "k", "chunk"),
                                        ("median_s", "p20_s", "p80_s", "peak_x", "warm_s", "grad_err"))
        report(meta, rows, args.out, os.path.splitext(os.path.basename(args.from_csv))[0])
        return
    import torch

    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TRL_EXPERIMENTAL_SILENCE": "1"}
    grid = QUICK_GRID if args.quick else FULL_GRID
    if args.grid:
        grid = [grid[int(i)] for i in args.grid.split(",")]
    methods = args.methods.split(",")
    meta = {"date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "revision": git_revision(), "cpu": cpu_model(),
            "threads": str(args.threads), "torch": torch.__version__, "load_average": f"{load_average():.2f}"}
    rows = []
    progress = Progress(len(grid) * len(methods))
    started = time.time()
    for dtype, n, h, v, k in grid:
        elsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        chunk = default_chunk(n, v, elsize)
        for method in methods:
            progress.begin(f"{method} {dtype} N={n} H={h} V={v} K={k}")
            row = {"dtype": dtype, "n": n, "h": h, "v": v, "k": k, "method": method, "chunk": chunk}
            needs = (4.0 + 1) * n * v * 4 / 2**30  # TRL: the logits, log_softmax (float32) and their gradients
            if method == "trl" and needs > args.limit_gib:
                row["status"] = f"not run (needs ~{needs:.0f} GiB)"
            else:
                cfg = {"method": method, "n": n, "h": h, "v": v, "k": k, "dtype": dtype, "threads": args.threads,
                       "reps": args.reps, "repo": REPO, "chunk": chunk}
                r = run_worker(WORKER, cfg, env, timeout=3600)
                row.update(status="ran", median_s=quantile(r["times"], 0.5), p20_s=quantile(r["times"], 0.2),
                           p80_s=quantile(r["times"], 0.8), peak_x=r["peak"], warm_s=r["warm_s"],
                           grad_err=r["grad_err"] if r["grad_err"] is not None else "", source=r["source"])
            rows.append(row)
            progress.end()
    progress.close()
    meta["minutes"] = f"{(time.time() - started) / 60:.1f}"
    os.makedirs(args.out, exist_ok=True)
    name = "bench_fused_sparse_quick" if args.quick else "bench_fused_sparse"
    write_csv_with_meta(os.path.join(args.out, name + ".csv"), meta, rows, FIELDS)
    report(meta, rows, args.out, name)


def _key(row: dict) -> tuple:
    return (row["dtype"], row["n"], row["h"], row["v"], row["k"])


def report(meta: dict, rows: list[dict], out: str, name: str) -> None:
    by = {(_key(r), r["method"]): r for r in rows}
    keys = list(dict.fromkeys(_key(r) for r in rows))
    ran = lambda r: r is not None and r.get("status") == "ran"  # noqa: E731
    lines = [f"# Fused sparse JSD ({meta.get('date', '')}, {meta.get('revision', '')})", "",
             f"CPU: {meta.get('cpu', '')}, {meta.get('threads', '')} threads, torch {meta.get('torch', '')}; the run "
             f"took {meta.get('minutes', '?')} minutes.", "",
             "Seconds per forward + backward (median, p20 to p80); peak memory above the inputs, the weight and "
             "their gradients in units of one N x V tensor of the dtype; ratios are ours over the baseline with the "
             "spread (ours' p20 over its p80 to ours' p80 over its p20). beta 0, the tail, K entries per row.", "",
             "| dtype | N | H | V | K | ours s | ours peak | chunk | matmul s | ours / matmul | matmul-chunked s "
             "| ours / chunked | trl s | trl peak | ours / trl |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    judged = passed = 0
    for k in keys:
        o = by.get((k, "ours"))
        if not ran(o):
            continue
        ok_memory = o["peak_x"] <= MEMORY_BOUND
        judged, passed = judged + 1, passed + ok_memory
        cells = [k[0], f"{k[1]:,}", f"{k[2]:,}", f"{k[3]:,}", str(k[4]), f"{o['median_s']:.2f}",
                 f"{o['peak_x']:.3f}x " + ("✓" if ok_memory else "✗"), str(o["chunk"])]
        for method in ("matmul", "matmul-chunked", "trl"):
            b = by.get((k, method))
            if not ran(b):
                cells += [(b or {}).get("status", "not run"), ""] + ([""] if method == "trl" else [])
                continue
            r, lo, hi = ratio_with_spread(o, b)
            ratio = f"{r:.2f}x ({lo:.2f}-{hi:.2f})"
            if method == "matmul":
                judged += 1
                passed += r <= TARGET
                ratio += " ✓" if r <= TARGET else " ✗"
            cells += [f"{b['median_s']:.2f}"] + ([f"{b['peak_x']:.2f}x"] if method == "trl" else []) + [ratio]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Targets judged: {judged}, passed: {passed} (time: ≤ {TARGET}x the three matmuls alone; memory: "
              f"≤ {MEMORY_BOUND}x N x V). The bound beside the time target is the matmuls themselves (1.0x): the "
              "divergence's own passes over each chunk's logits are what ours adds.", ""]
    errs = [f"{_key(r)}: {r['grad_err']:.1e}" for r in rows if ran(r) and r.get("grad_err") not in (None, "")]
    if errs:
        lines += ["TRL's weight gradient against ours (max |difference| / max |ours|): " + "; ".join(errs) + ".", ""]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out, name + ".md"), "w") as f:
        f.write(text + "\n")
    figure(keys, by, os.path.join(out, name + ".png"))


def figure(keys: list, by: dict, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no figure")
        return
    fig, ax = plt.subplots(figsize=(9, 4))
    colors = {"matmul": "#888888", "matmul-chunked": "#bbbbbb", "trl": "#1f77b4"}
    shown = [k for k in keys if by.get((k, "ours"), {}).get("status") == "ran"]
    for i, k in enumerate(shown):
        for j, method in enumerate(colors):
            b = by.get((k, method))
            if b is None or b.get("status") != "ran":
                continue
            r, lo, hi = ratio_with_spread(by[(k, "ours")], b)
            ax.bar(i + (j - 1) * 0.25, r, 0.25, color=colors[method], yerr=[[r - lo], [hi - r]], capsize=2,
                   label=method if method not in ax.get_legend_handles_labels()[1] else None)
    ax.axhline(TARGET, color="#444444", linestyle="--", linewidth=0.8)
    ax.set_xticks(range(len(shown)), [f"{k[0][:4]} N={k[1]}\nH={k[2]} V={k[3] // 1024}K K={k[4]}" for k in shown],
                  fontsize=7)
    ax.set_ylabel("ours / baseline (time)")
    ax.set_title("fused sparse JSD, forward + backward (dashed: 1.1x the three matmuls)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
