"""Two builds of the package against each other: a change's new/old time ratio on the distillation family.

    python benchmarks/ab_builds.py --old /path/to/old_tree --new .          # each a directory holding npu_loss_ops/
    python benchmarks/ab_builds.py --old ../old --new . --rounds 7 --quick

The two builds register the same op names, so they cannot share a process: each runs in a worker process of
its own (PYTHONPATH set to its directory, --threads threads), started once and kept warm. The driver then
interleaves them: every round times each case on both builds one after the other, the order alternating from
round to round, so that a drift of the machine (another job, the clock) falls on both. A case's time in a
round is the median of --calls forward + backward calls; its ratio is new/old per round, reported as the
median over the rounds with the spread (min, max). The cases are bench_distill.py's generalized JSD
(student and teacher logits, a quarter of the labels ignored) and bench_fused_linear.py's fused linear JSD
(hidden states and lm_head weights, the student's input and weight requiring grad), in float32 and bfloat16.

--bits times nothing: each build computes the same grid of small cases (the generalized JSD's forward, its
forward with gradients, its backward, and the fused linear JSD with its gradients; six dtype pairs, three
vocabularies, five (beta, T), every reduction, with and without labels, contiguous and strided logits) and the
driver compares every output's bytes: the check that a change which must not touch the arithmetic did not
(run it once per instruction set, NPU_LOSS_OPS_CPU_ISA=avx512 / avx2 / baseline). It exits 1 when one differs.

The old tree is typically a worktree of the commit before a change, built in place
(`git worktree add ../old HEAD~1 && cd ../old && python setup.py build_ext --inplace`), or a copy of the
package directory taken before rebuilding. Prints a table; --out writes it as Markdown.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

Case = tuple[str, str, int, int, int]  # (op, dtype, N, H, V)

CASES_FULL: list[Case] = [
    ("jsd", "float32", 1024, 0, 32768), ("jsd", "bfloat16", 1024, 0, 32768),
    ("jsd", "float32", 256, 0, 151936), ("jsd", "bfloat16", 256, 0, 151936),
    ("linear", "float32", 1024, 1024, 32768), ("linear", "bfloat16", 1024, 1024, 32768),
    ("linear", "bfloat16", 512, 1024, 151936),
]
CASES_QUICK: list[Case] = [
    ("jsd", "float32", 256, 0, 32768), ("jsd", "bfloat16", 256, 0, 32768),
    ("linear", "float32", 512, 256, 32768), ("linear", "bfloat16", 512, 256, 32768),
]


def worker(calls: int) -> None:
    """Reads one case per line (JSON) and answers the median time of `calls` forward + backward calls."""
    import torch

    import npu_loss_ops

    current = ""
    call: Callable[[], Any] | None = None
    inputs: list[torch.Tensor] = []
    for line in sys.stdin:
        kind, dtype_name, n, h, v = json.loads(line)
        dtype = getattr(torch, dtype_name)
        if line != current:  # one case's inputs alive at a time
            current, call, inputs = line, None, []
            g = torch.Generator().manual_seed(0)
            labels = torch.randint(0, v, (n,), generator=g)
            labels[torch.randperm(n, generator=g)[: n // 4]] = -100
            if kind == "jsd":
                s = torch.randn(n, v, generator=g).to(dtype).requires_grad_()
                t = torch.randn(n, v, generator=g).to(dtype)
                call, inputs = (lambda: npu_loss_ops.generalized_jsd_loss(s, t, labels, beta=0.5)), [s]
            else:
                xs = torch.randn(n, h, generator=g).to(dtype).requires_grad_()
                ws = (torch.randn(v, h, generator=g) * h ** -0.5).to(dtype).requires_grad_()
                xt = torch.randn(n, 2 * h, generator=g).to(dtype)
                wt = (torch.randn(v, 2 * h, generator=g) * (2 * h) ** -0.5).to(dtype)
                call = lambda: npu_loss_ops.fused_linear_jsd_loss(xs, ws, xt, wt, labels, beta=0.5)  # noqa: E731
                inputs = [xs, ws]
        assert call is not None
        run = call

        def step() -> None:
            for x in inputs:
                x.grad = None
            run().backward()

        step()  # warm
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        print(json.dumps(statistics.median(times)), flush=True)


def bits_worker() -> None:
    """Prints one JSON object: each case's outputs as hashes of their bytes."""
    import hashlib
    import itertools

    import torch

    import npu_loss_ops

    def digest(t: torch.Tensor | None) -> str:
        if t is None:
            return "-"
        data = t.detach().reshape(-1).contiguous()
        return hashlib.sha1(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"").hexdigest()[:16]

    ops = torch.ops.npu_loss
    declared = {a.name: a.default_value for a in ops.generalized_jsd_loss.default._schema.arguments[4:]}
    out: dict[str, list[str]] = {}
    pairs = [(torch.float32,) * 2, (torch.bfloat16,) * 2, (torch.float16,) * 2, (torch.float64,) * 2,
             (torch.float32, torch.bfloat16), (torch.float16, torch.float64)]
    for (ds, dt), v, (beta, temp) in itertools.product(
            pairs, [7, 1001, 4099], [(0.0, 1.0), (1.0, 1.0), (0.5, 1.0), (0.3, 2.0), (0.9, 0.7)]):
        g = torch.Generator().manual_seed(v)
        # By name, the rest of the scalars a build declares at their forward's defaults: the same call on either
        # build.
        scalars = {**declared, "beta": beta, "temperature": temp, "ignore_index": -100}
        s, t = (torch.randn(5, v, generator=g) * 3).to(ds), (torch.randn(5, v, generator=g) * 3).to(dt)
        for red, lab, strided in itertools.product([0, 1, 2], [None, torch.tensor([1, -100, 3, 0, -100])],
                                                   [False, True]):
            ss = torch.cat([s, s], 1)[:, ::2] if strided else s
            grads: tuple[torch.Tensor | None, ...] = (None,) * 4
            if red:
                grads = ops._generalized_jsd_loss_and_grads(ss, t, lab, red, **scalars, output_mask=[True, True])
            f = ops.generalized_jsd_loss(ss, t, lab, red, **scalars)
            go = torch.rand(f.shape, generator=g).to(f.dtype) if red == 0 else torch.tensor(0.7, dtype=f.dtype)
            back = ops.generalized_jsd_loss_backward(go, ss, t, lab, red, **scalars, output_mask=[True, True])
            key = f"jsd/{ds}/{dt}/{v}/{beta}/{temp}/{red}/{lab is not None}/{strided}"
            out[key] = [digest(x) for x in (*grads, f, *back)]
    for dtype, (beta, temp, hard) in itertools.product(
            [torch.float32, torch.bfloat16, torch.float16], [(0.5, 1.0, 0.0), (0.0, 2.0, 0.5), (1.0, 1.0, 0.3)]):
        g = torch.Generator().manual_seed(3)
        xs = torch.randn(9, 32, generator=g).to(dtype).requires_grad_()
        xt = torch.randn(9, 48, generator=g).to(dtype)
        ws = (torch.randn(3001, 32, generator=g) * 0.2).to(dtype).requires_grad_()
        wt = (torch.randn(3001, 48, generator=g) * 0.2).to(dtype)
        labels = torch.randint(0, 3001, (9,), generator=g)
        labels[2] = -100
        loss = npu_loss_ops.fused_linear_jsd_loss(xs, ws, xt, wt, labels, beta=beta, temperature=temp,
                                                  weight_hard_loss=hard)
        assert isinstance(loss, torch.Tensor)
        loss_any: Any = loss  # Tensor.backward is untyped in some torch releases
        loss_any.backward()
        out[f"linear/{dtype}/{beta}/{temp}/{hard}"] = [digest(loss), digest(xs.grad), digest(ws.grad)]
    print(json.dumps(out))


def bits(old: str, new: str) -> int:
    """Runs bits_worker() in each build and compares; the number of cases whose outputs differ."""
    results = {}
    for name, tree in (("old", old), ("new", new)):
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
        results[name] = json.loads(subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--worker-bits"], env=env, cwd="/", check=True,
            capture_output=True, text=True).stdout)
    differ = sorted(k for k in results["old"] if results["old"][k] != results["new"].get(k))
    print(f"{len(results['old'])} cases, {len(differ)} differ" + "".join(f"\n  {k}" for k in differ[:20]))
    return len(differ)


def start(tree: str, threads: int, calls: int) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), OMP_NUM_THREADS=str(threads))
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--worker", "--calls", str(calls)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd="/")


def ask(proc: subprocess.Popen[str], case: Case) -> float:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(case) + "\n")
    proc.stdin.flush()
    return float(proc.stdout.readline())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", help="the directory holding the old build's npu_loss_ops/")
    p.add_argument("--new", default=".", help="the directory holding the new build's npu_loss_ops/")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=3, help="timed calls per case per round (their median)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", help="write the table here (Markdown)")
    p.add_argument("--bits", action="store_true", help="compare the two builds' output bits; time nothing")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker-bits", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.calls)
        return
    if args.worker_bits:
        bits_worker()
        return
    if not args.old:
        p.error("--old is required")
    if args.bits:
        sys.exit(1 if bits(args.old, args.new) else 0)
    cases = CASES_QUICK if args.quick else CASES_FULL
    procs = {"old": start(args.old, args.threads, args.calls), "new": start(args.new, args.threads, args.calls)}
    ratios: dict[Case, list[float]] = {c: [] for c in cases}
    for r in range(args.rounds):
        for case in cases:
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            t = {name: ask(procs[name], case) for name in order}
            ratios[case].append(t["new"] / t["old"])
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    lines = [f"{args.rounds} interleaved rounds, {args.calls} calls each, {args.threads} threads", "",
             "| op | dtype | N | H | V | new/old median | min | max |", "|---|---|---|---|---|---|---|---|"]
    medians = []
    for case, rs in ratios.items():
        kind, dtype, n, h, v = case
        medians.append(statistics.median(rs))
        lines.append(f"| {'generalized_jsd_loss' if kind == 'jsd' else 'fused_linear_jsd_loss'} | {dtype} | {n} | "
                     f"{h or ''} | {v} | {statistics.median(rs):.3f} | {min(rs):.3f} | {max(rs):.3f} |")
    lines += ["", f"median over the cases: {statistics.median(medians):.3f}; largest case: {max(medians):.3f}"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
