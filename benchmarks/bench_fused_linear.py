"""The fused linear JSD: npu_loss_ops.fused_linear_jsd_loss against Liger-Kernel, the matmuls alone and TRL.

One run measures, for each (dtype, N, H_s, V, weight_hard_loss), the forward + backward of each method on the
same seeded inputs (hidden states of the student, H_s, and of the teacher, H_t = 2 H_s; `lm_head` weights (V, H)
scaled by 1/sqrt(H); a quarter of the tokens ignored; beta = 0.5, temperature 1; the student's input and weight
require grad, the teacher's do not, as in distillation):

    ours            npu_loss_ops.fused_linear_jsd_loss (its default chunk)
    liger           Liger-Kernel's LigerFusedLinearJSDLoss with the same weights (hard weight_hard_loss, soft
                    1.0), `compiled` and `chunk_size` at their defaults (True, 1,024); the compiling call and a
                    warm one are not timed
    matmul          the four matmuls alone, unchunked: both logits (x @ w.T), then the student's input and
                    weight gradients from a (N, V) gradient (the logits' buffer reused): the floor, as both
                    fused methods are GEMM-bound
    matmul-chunked  the same four matmuls in ours' default chunk (addmm into reused buffers, the teacher's
                    logits in halves of the chunk, the weight's gradient summed over the chunks): the floor
                    within the memory bound ours keeps (0.25x one N x V tensor)
    trl             the logits made (x @ w.T), then TRL 1.16's GKDTrainer.generalized_jsd_loss (its formula from
                    tests/reference.py where trl is not installed) plus weight_hard_loss times the cross entropy
                    divided by the kept tokens, as Liger weighs it; only where its projected peak fits --limit-gib

Each method runs in a fresh process at --threads threads: a warm call (Liger: two), the peak memory of one
forward + backward (the process's peak resident size above the inputs, the weights and the gradients, in
units of one N x V tensor of the dtype: tests/test_fused_linear_jsd.py's protocol), then --reps timed calls
(median, p20 and p80). Every baseline's student weight gradient is compared with ours (max |difference| / max
|ours|). Liger's torch.compile and TRL need `pip install liger-kernel trl` in the venv that runs this (the
default venv does not have them: they are skipped, and said so).

Writes --out/bench_fused_linear.csv, .md and .png (needs matplotlib). --from-csv redraws without timing.

    python benchmarks/bench_fused_linear.py                    # the trimmed grid (about 25 minutes on 2 cores)
    python benchmarks/bench_fused_linear.py --quick            # N = 512, H = 256, V = 32,768: about a minute
    python benchmarks/bench_fused_linear.py --from-csv benchmarks/results/bench_fused_linear.csv --out benchmarks/results
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_common import (REPO, WORKER_PRELUDE, cpu_model, git_revision, load_average, quantile,  # noqa: E402
                          ratio_with_spread, read_csv_with_meta, run_worker, write_csv_with_meta)
from loss_bench.progress import Progress  # noqa: E402

METHODS = ("ours", "liger", "matmul", "matmul-chunked", "trl")
# (dtype, N, H_s, V, weight_hard_loss): the grid trimmed to what runs in under an hour on two cores
# (the matmuls of N = 8,192 at H_s = 2,048 and V = 151,936 alone take minutes per call).
FULL_GRID = ([(d, 2048, 1024, 32768, wh) for d in ("float32", "bfloat16") for wh in (0.0, 0.5)]
             + [(d, 2048, 2048, 32768, 0.0) for d in ("float32", "bfloat16")]
             + [("bfloat16", 2048, 1024, 151936, wh) for wh in (0.0, 0.5)]
             + [("float32", 2048, 1024, 151936, 0.0)]
             + [("bfloat16", 8192, 1024, 32768, wh) for wh in (0.0, 0.5)]
             + [("float32", 8192, 1024, 32768, 0.0)])
QUICK_GRID = [(d, 512, 256, 32768, wh) for d in ("float32", "bfloat16") for wh in (0.0, 0.5)]
# The targets: at most these multiples of the baseline's median time, and of Liger's peak memory.
TARGETS = {"matmul": 1.1, "liger": 1.0}
MEMORY_BOUND = 0.25

WORKER = WORKER_PRELUDE + r"""

n, h, v, dtype, wh = cfg["n"], cfg["h"], cfg["v"], getattr(torch, cfg["dtype"]), cfg["wh"]
gen = torch.Generator().manual_seed(0)
xs = torch.randn(n, h, generator=gen).to(dtype)
xt = torch.randn(n, 2 * h, generator=gen).to(dtype)
ws = (torch.randn(v, h, generator=gen) / h ** 0.5).to(dtype)
wt = (torch.randn(v, 2 * h, generator=gen) / (2 * h) ** 0.5).to(dtype)
labels = torch.randint(0, v, (n,), generator=gen)
labels[torch.rand(n, generator=gen) < 0.25] = -100
xs.requires_grad_(True)
ws.requires_grad_(True)
method, source = cfg["method"], ""


def ours():
    npu_loss_ops.fused_linear_jsd_loss(xs, ws, xt, wt, labels, beta=0.5, weight_hard_loss=wh).backward()


if method == "ours":
    fn, source = ours, "npu_loss_ops " + npu_loss_ops.__version__
elif method == "liger":
    import liger_kernel
    from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss
    liger = LigerFusedLinearJSDLoss(weight_hard_loss=wh, weight_soft_loss=1.0, beta=0.5)
    fn = lambda: liger(xs, ws, xt, wt, labels).backward()
    source = "liger-kernel " + getattr(liger_kernel, "__version__", "")
elif method == "trl":
    try:
        from trl.experimental.gkd.gkd_trainer import GKDTrainer
        jsd, source = GKDTrainer.generalized_jsd_loss, "trl " + __import__("trl").__version__
    except Exception:
        from reference import trl_generalized_jsd_loss as jsd
        source = "TRL 1.16's formula (tests/reference.py)"

    def fn():
        zs = xs @ ws.T
        with torch.no_grad():
            zt = xt @ wt.T
        loss = jsd(zs, zt, labels, beta=0.5)
        if wh:
            kept = (labels != -100).sum().clamp(min=1)
            loss = loss + wh * F.cross_entropy(zs, labels, ignore_index=-100, reduction="sum") / kept
        loss.backward()
else:  # the matmuls alone, in chunks of `rows` (N: unchunked), the teacher's logits in halves of them as ours'
    rows = n if method == "matmul" else cfg["chunk"]
    half = n if method == "matmul" else (rows + 1) // 2
    zs_buf, zt_buf = torch.empty(min(rows, n), v, dtype=dtype), torch.empty(min(half, n), v, dtype=dtype)
    source = f"torch.addmm, chunks of {rows} rows" + ("" if method == "matmul" else f" (the teacher's {half})")

    def fn():
        with torch.no_grad():
            gx, gw = torch.empty_like(xs), torch.zeros_like(ws)
            for start in range(0, n, rows):
                m = min(rows, n - start)
                a, b = xs[start:start + m], xt[start:start + m]
                zs = zs_buf[:m]
                torch.addmm(zs, a, ws.T, beta=0, out=zs)
                for first in range(0, m, half):
                    zt = zt_buf[:min(half, m - first)]
                    torch.addmm(zt, b[first:first + zt.shape[0]], wt.T, beta=0, out=zt)
                torch.mm(zs, ws, out=gx[start:start + m])
                gw.addmm_(zs.T, a)
            xs.grad, ws.grad = gx, gw


def step():
    xs.grad = ws.grad = None
    fn()


def reset():
    xs.grad = ws.grad = None


times, peak, warm_s = measure(step, 2 if method == "liger" else 1, reset,  # Liger: the compiling call and a warm one
                              n * v * xs.element_size(), counted_bytes=(xs.numel() + ws.numel()) * xs.element_size())
err = None
if method in ("liger", "trl"):
    grad = ws.grad
    xs.grad = ws.grad = None
    ours()
    err = float((grad.float() - ws.grad.float()).abs().max() / ws.grad.float().abs().max().clamp(min=1e-30))
print(json.dumps({"times": times, "peak": peak, "warm_s": warm_s, "grad_err": err, "source": source}))
"""


def default_chunk(n: int, v: int, elsize: int) -> int:
    """ours' default rows per chunk (csrc/composite/linear.cpp, linear_chunk_rows) for the float32 and bfloat16
    calls timed here: the CPU's step writes the gradients over the logits and makes the cross entropy in the
    same passes, and the teacher (no gradient) has its logits made in halves of the chunk, so a row holds the
    student's logits and half the teacher's, within 3/16 of one N x V tensor and 1 GiB (with torch's own
    products: oneDNN's bfloat16 kernels, as on the AVX-512 machines this grid was run on)."""
    return max(1, min(n, min(n * v * elsize * 3 // 16, 1 << 30) // (v * (elsize + elsize // 2))))


def available(module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


FIELDS = ["dtype", "n", "h", "v", "wh", "method", "status", "median_s", "p20_s", "p80_s", "peak_x", "warm_s",
          "grad_err", "source", "chunk"]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="N = 512, H = 256, V = 32,768")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=2, help="timed forward + backward calls per method")
    p.add_argument("--limit-gib", type=float, default=16.0, help="TRL's largest projected peak")
    p.add_argument("--out", default=os.path.join(HERE, "out"))
    p.add_argument("--from-csv", help="print and redraw from this CSV; time nothing")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.from_csv:
        meta, rows = read_csv(args.from_csv)
        report(meta, rows, args.out, os.path.splitext(os.path.basename(args.from_csv))[0])
        return
    import torch

    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TRL_EXPERIMENTAL_SILENCE": "1"}
    grid = QUICK_GRID if args.quick else FULL_GRID
    methods = [m for m in args.methods.split(",")]
    missing = {m: mod for m, mod in (("liger", "liger_kernel"),) if m in methods and not available(mod)}
    meta = {"date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "revision": git_revision(), "cpu": cpu_model(),
            "threads": str(args.threads), "torch": torch.__version__, "load_average": f"{load_average():.2f}",
            "limit_gib": str(args.limit_gib), "skipped": ", ".join(f"{m} ({mod} not installed)"
                                                                   for m, mod in missing.items()) or "none"}
    rows = []
    trl_peak: dict[str, float] = {}
    progress = Progress(len(grid) * len(methods))
    started = time.time()
    for dtype, n, h, v, wh in grid:
        elsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        chunk = default_chunk(n, v, elsize)
        for method in methods:
            progress.begin(f"{method} {dtype} N={n} H={h} V={v} hard={wh:g}")
            row = {"dtype": dtype, "n": n, "h": h, "v": v, "wh": wh, "method": method, "chunk": chunk}
            known = trl_peak.get(dtype)
            needs = ((known or 4.0) + 1) * n * v * elsize / 2**30
            if method in missing:
                row["status"] = f"not run ({missing[method]} not installed)"
            elif method == "trl" and needs > args.limit_gib:
                row["status"] = f"not run (needs ~{needs:.0f} GiB)"
            else:
                cfg = {"method": method, "n": n, "h": h, "v": v, "dtype": dtype, "wh": wh, "threads": args.threads,
                       "reps": args.reps, "repo": REPO, "chunk": chunk}
                r = run_worker(WORKER, cfg, env, timeout=3600)
                if method == "trl":
                    trl_peak[dtype] = max(trl_peak.get(dtype, 0.0), r["peak"])
                row.update(status="ran", median_s=quantile(r["times"], 0.5), p20_s=quantile(r["times"], 0.2),
                           p80_s=quantile(r["times"], 0.8), peak_x=r["peak"], warm_s=r["warm_s"],
                           grad_err=r["grad_err"] if r["grad_err"] is not None else "", source=r["source"])
            rows.append(row)
            progress.end()
    progress.close()
    meta["minutes"] = f"{(time.time() - started) / 60:.1f}"
    os.makedirs(args.out, exist_ok=True)
    name = "bench_fused_linear_quick" if args.quick else "bench_fused_linear"
    write_csv(os.path.join(args.out, name + ".csv"), meta, rows)
    report(meta, rows, args.out, name)


def write_csv(path: str, meta: dict, rows: list[dict]) -> None:
    write_csv_with_meta(path, meta, rows, FIELDS)


def read_csv(path: str) -> tuple[dict, list[dict]]:
    meta, rows = read_csv_with_meta(path, ("n", "h", "v", "chunk"),
                                    ("wh", "median_s", "p20_s", "p80_s", "peak_x", "warm_s", "grad_err"))
    return meta, rows


_ratio = ratio_with_spread


def _key(row: dict) -> tuple:
    return (row["dtype"], row["n"], row["h"], row["v"], row["wh"])


def report(meta: dict, rows: list[dict], out: str, name: str) -> None:
    by = {(_key(r), r["method"]): r for r in rows}
    keys = list(dict.fromkeys(_key(r) for r in rows))
    ran = lambda r: r is not None and r.get("status") == "ran"  # noqa: E731
    lines = [f"# Fused linear JSD ({meta.get('date', '')}, {meta.get('revision', '')})", "",
             f"CPU: {meta.get('cpu', '')}, {meta.get('threads', '')} threads, torch {meta.get('torch', '')}; the run "
             f"took {meta.get('minutes', '?')} minutes; skipped: {meta.get('skipped', 'none')}.", "",
             "Seconds per forward + backward (median, p20 to p80); peak memory above the inputs, weights and "
             "gradients in units of one N x V tensor of the dtype; ratios are ours over the baseline, with the "
             "spread (ours' p20 over its p80 to ours' p80 over its p20). H_t = 2 H_s; beta 0.5; the student's "
             "gradients.", "",
             "| dtype | N | H_s | V | hard | ours s | ours peak | chunk | matmul s | ours / matmul | matmul-chunked s "
             "| ours / chunked | liger s | liger peak | ours / liger | trl s | trl peak | ours / trl |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    judged = passed = 0
    for k in keys:
        o = by.get((k, "ours"))
        if not ran(o):
            continue
        cells = [k[0], f"{k[1]:,}", f"{k[2]:,}", f"{k[3]:,}", f"{k[4]:g}", f"{o['median_s']:.2f}",
                 f"{o['peak_x']:.2f}x", str(o["chunk"])]
        for method in ("matmul", "matmul-chunked", "liger", "trl"):
            b = by.get((k, method))
            if not ran(b):
                status = b.get("status", "not run") if b else "not run"
                cells += [status, ""] + ([""] if method in ("liger", "trl") else [])
                continue
            r, lo, hi = _ratio(o, b)
            ratio = f"{r:.2f}x ({lo:.2f}-{hi:.2f})"
            if method in TARGETS:
                judged += 1
                ok = r <= TARGETS[method]
                passed += ok
                ratio += " ✓" if ok else " ✗"
            cells += [f"{b['median_s']:.2f}"] + ([f"{b['peak_x']:.2f}x"] if method in ("liger", "trl") else []) + [ratio]
            if method == "liger":
                judged += 1
                ok = o["peak_x"] <= b["peak_x"]
                passed += ok
                cells[-2] += " ✓" if ok else " ✗"
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Targets judged: {judged}, passed: {passed} (time: ≤ {TARGETS['matmul']}x the matmuls alone, ≤ "
              f"Liger's; memory: ≤ Liger's peak, and ≤ {MEMORY_BOUND}x N x V by the contract).", ""]
    errs = [f"{r['method']} {_key(r)}: {r['grad_err']:.1e}" for r in rows if ran(r) and r.get("grad_err") not in (None, "")]
    if errs:
        lines += ["Student weight gradient against ours (max |difference| / max |ours|): " + "; ".join(errs) + ".", ""]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out, name + ".md"), "w") as f:
        f.write(text + "\n")
    figure(rows, keys, by, os.path.join(out, name + ".png"))


def figure(rows: list[dict], keys: list, by: dict, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no figure")
        return
    fig, ax = plt.subplots(figsize=(11, 4.5))
    labels, width = [], 0.2
    colors = {"matmul": "#888888", "matmul-chunked": "#bbbbbb", "liger": "#d62728", "trl": "#1f77b4"}
    shown = [k for k in keys if (k, "ours") in by and by[(k, "ours")].get("status") == "ran"]
    for i, k in enumerate(shown):
        o = by[(k, "ours")]
        labels.append(f"{k[0][:4]} N={k[1]}\nH={k[2]} V={k[3] // 1024}K\nhard={k[4]:g}")
        for j, method in enumerate(colors):
            b = by.get((k, method))
            if b is None or b.get("status") != "ran":
                continue
            r, lo, hi = _ratio(o, b)
            ax.bar(i + (j - 1.5) * width, r, width, color=colors[method], yerr=[[r - lo], [hi - r]], capsize=2,
                   label=method if i == 0 or method not in ax.get_legend_handles_labels()[1] else None)
    ax.axhline(1.1, color="#444444", linestyle="--", linewidth=0.8)
    ax.axhline(1.0, color="#d62728", linestyle=":", linewidth=0.8)
    ax.set_xticks(range(len(shown)), labels, fontsize=7)
    ax.set_ylabel("ours / baseline (time)")
    ax.set_title("fused linear JSD, forward + backward: ours over each baseline (dashed: 1.1x the matmuls)")
    handles, names = ax.get_legend_handles_labels()
    ax.legend(dict(zip(names, handles)).values(), dict(zip(names, handles)).keys(), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
