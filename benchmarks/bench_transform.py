"""What the logit transform costs: forward + backward of both forms of the generalized JSD with a scale or both
softcaps against the same call without them, interleaved in one process.

    python benchmarks/bench_transform.py             # N 1,024; fused H 1,024 (teacher 2,048); V 32,768
    python benchmarks/bench_transform.py --rounds 9

Each round times each variant once, in turn; a variant's ratio per round is its time over the plain call's in
the same round, reported as the median with the smallest and largest (the spread). The issue's target for a
softcap is 1.1x the plain call (the bound: 1.00x plus the tanh, a few ns per logit against the products' or the
row passes' cost).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import npu_loss_ops

VARIANTS = {"plain": {}, "scale": {"student_logit_scale": 0.5, "teacher_logit_scale": 2.0},
            "softcap": {"student_softcap": 30.0, "teacher_softcap": 30.0}}


def _cases(n: int, h: int, v: int):
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        xs = torch.randn(n, h, generator=gen).to(dtype)
        ws = (torch.randn(v, h, generator=gen) / h ** 0.5).to(dtype)
        xt = torch.randn(n, 2 * h, generator=gen).to(dtype)
        wt = (torch.randn(v, 2 * h, generator=gen) / (2 * h) ** 0.5).to(dtype)
        zs = (torch.randn(n, v, generator=gen) * 2).to(dtype)
        zt = (torch.randn(n, v, generator=gen) * 2).to(dtype)
        labels = torch.randint(0, v, (n,), generator=gen)

        def fused(kw, xs=xs, ws=ws, xt=xt, wt=wt, labels=labels):
            x, w = xs.detach().requires_grad_(), ws.detach().requires_grad_()
            npu_loss_ops.fused_linear_jsd_loss(x, w, xt, wt, labels, beta=0.5, **kw).backward()

        def logits(kw, zs=zs, zt=zt, labels=labels):
            s = zs.detach().requires_grad_()
            npu_loss_ops.generalized_jsd_loss(s, zt, labels, beta=0.5, **kw).backward()

        yield f"fused linear {n}x{h}x{v}", dtype, fused
        yield f"from logits {n}x{v}", dtype, logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--h", type=int, default=1024)
    parser.add_argument("--v", type=int, default=32768)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.rounds} interleaved rounds, {args.threads} threads, ISA {npu_loss_ops.build_info()['cpu_isa']}\n")
    print("| call | dtype | plain | scale / plain | softcap / plain |")
    print("|---|---|---|---|---|")
    for name, dtype, run in _cases(args.n, args.h, args.v):
        for kw in VARIANTS.values():
            run(kw)  # warm up
        times: dict[str, list[float]] = {k: [] for k in VARIANTS}
        for _ in range(args.rounds):
            for key, kw in VARIANTS.items():
                start = time.perf_counter()
                run(kw)
                times[key].append(time.perf_counter() - start)
        cells = []
        for key in ("scale", "softcap"):
            ratios = [t / p for t, p in zip(times[key], times["plain"])]
            cells.append(f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
        print(f"| {name} | {str(dtype).removeprefix('torch.')} | {statistics.median(times['plain']):.3f} s | "
              f"{cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
