"""The distillation family on a vocabulary split: each rank of a gloo group against one process on the whole tensors.

For each case, on the same seeded inputs (hidden states and `lm_head` weights scaled by 1/sqrt(H), a quarter of the
tokens ignored, beta 0.5, temperature 1; the student's tensors require grad, the teacher's do not):

    single   one process at one thread: the function on the whole tensors (the CPU kernels)
    split    `torchrun --nproc-per-node P` (gloo, loopback), each rank at one thread: the same function on its
             slice of the vocabulary with `vocab_parallel_group=`, each rank timed alone (a barrier before each
             call); the bytes each rank sends through torch.distributed per call, counted at the calls, against
             what an all-gather of the student's and the teacher's logits would send (2 x N x V x (P - 1) / P
             elements of the dtype per rank)

The cases:

    fused    fused_linear_jsd_loss from hidden states, N 2,048, H 1,024, V 151,936, float32 (--quick: N 512,
             H 256, V 32,768): time per forward + backward (median, p20, p80 of --reps calls after a warm one)
    logits   generalized_jsd_loss from logits, N 2,048, V 151,936, float32 (--quick: N 512, V 32,768), at P 2
             and 4: the peak resident size of one call above the process's size with its inputs made (a fresh
             process per rank), against the single process's, and against the target 1 / P of it plus 5 %

The time target is each rank at most 0.6x the single process (fused, P 2). Its bound: each rank makes 1/P of
the matmuls and of the elementwise work, so P = 2 ranks on 2 physical cores give at best 0.5x; the collectives are
a few floats per row (microseconds each on loopback). On 2 hyperthreads of one core the two ranks share one core's
arithmetic, and the bound is near 1.0x: lscpu's "Thread(s) per core" says which this machine has, and the table
prints it.

Writes --out/bench_vocab_parallel.csv and .md; --plot CSV draws the figure beside it (needs matplotlib).

    python benchmarks/bench_vocab_parallel.py            # N 2,048, V 151,936: about 12 minutes on 2 cores
    python benchmarks/bench_vocab_parallel.py --quick    # about a minute
    python benchmarks/bench_vocab_parallel.py --plot benchmarks/results/bench_vocab_parallel.csv   # the figure
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_common import REPO, cpu_model, git_revision, load_average, quantile, write_csv_with_meta  # noqa: E402

# The worker: one process (the single case) or one torchrun rank (the split case). It builds the whole tensors
# from the seed, keeps its rank's slice, and measures.
WORKER = r'''
import ctypes, json, os, sys, time
import torch
cfg = json.loads(sys.argv[1])
torch.set_num_threads(1)
import npu_loss_ops


def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024


split = "RANK" in os.environ
rank, world = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) if split else (0, 1)
sent = [0]
if split:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    for name in ("all_reduce", "all_gather"):
        real = getattr(dist, name)

        def counted(*args, _real=real, **kwargs):
            tensors = args[0] if isinstance(args[0], list) else [args[0]]
            if _real.__name__ == "all_gather":
                tensors = [args[1]]
            sent[0] += sum(t.numel() * t.element_size() for t in tensors)
            return _real(*args, **kwargs)
        setattr(dist, name, counted)
dtype = getattr(torch, cfg["dtype"])
n, h, v = cfg["n"], cfg["h"], cfg["v"]
lo, hi = (v * rank) // world, (v * (rank + 1)) // world
g = torch.Generator().manual_seed(0)
labels = torch.randint(0, v, (n,), generator=g)
labels[torch.randperm(n, generator=g)[: n // 4]] = -100
kw = {"vocab_parallel_group": dist.group.WORLD} if split else {}
if cfg["case"] == "fused":
    hs = torch.randn(n, h, generator=g).to(dtype).requires_grad_()
    ws = (torch.randn(v, h, generator=g) / h ** 0.5).to(dtype)[lo:hi].clone().requires_grad_()
    ht = torch.randn(n, h, generator=g).to(dtype)
    wt = (torch.randn(v, h, generator=g) / h ** 0.5).to(dtype)[lo:hi].clone()

    def step():
        hs.grad = ws.grad = None
        npu_loss_ops.fused_linear_jsd_loss(hs, ws, ht, wt, labels, **kw).backward()
elif cfg["case"] == "matmul":
    # The floor: the four products of the fused form's forward + backward on this process's rows of the heads,
    # unchunked (both logits, then the input's and the weight's gradients from an N x V_r gradient).
    hs = torch.randn(n, h, generator=g).to(dtype)
    ws = (torch.randn(v, h, generator=g) / h ** 0.5).to(dtype)[lo:hi].clone()
    ht = torch.randn(n, h, generator=g).to(dtype)
    wt = (torch.randn(v, h, generator=g) / h ** 0.5).to(dtype)[lo:hi].clone()

    def step():
        logits = hs @ ws.t()
        del logits
        logits = ht @ wt.t()
        logits @ ws
        logits.t() @ hs
else:
    xs = (torch.randn(n, v, generator=g) * 2).to(dtype)[:, lo:hi].clone().requires_grad_()
    xt = (torch.randn(n, v, generator=g) * 2).to(dtype)[:, lo:hi].clone()

    def step():
        xs.grad = None
        npu_loss_ops.generalized_jsd_loss(xs, xt, labels, **kw).backward()

times = []
for i in range(cfg["reps"] + 1):
    if i == 1:  # after the warm call (its lazy imports and gloo's buffers): the peak of one call above the inputs
        step_grads = [t for t in (globals().get("xs"), globals().get("hs"), globals().get("ws")) if t is not None]
        for t in step_grads:
            t.grad = None
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = status("VmRSS:")
    if split:
        dist.barrier()
    sent[0] = 0
    start = time.perf_counter()
    step()
    if i:
        times.append(time.perf_counter() - start)
    if i == 1:
        peak = status("VmHWM:") - before
        call_bytes = sent[0]
        # The gradients the family's bound leaves out (it counts what the call adds beyond the inputs, the
        # weights and their gradients): the fused form's input and weight gradients.
        grad_bytes = sum(t.grad.numel() * t.grad.element_size() for t in (hs, ws)) if cfg["case"] == "fused" else 0
row = {"rank": rank, "world": world, "times": times, "peak_bytes": peak, "sent_bytes": call_bytes,
       "grad_bytes": grad_bytes, "width": hi - lo}
if split:
    every = [None] * world
    dist.all_gather_object(every, row)
    if rank == 0:
        print(json.dumps(every))
    dist.barrier()
    os._exit(0)
print(json.dumps([row]))
'''

FULL = {"fused": dict(n=2048, h=1024, v=151936), "logits": dict(n=2048, h=0, v=151936)}
QUICK = {"fused": dict(n=512, h=256, v=32768), "logits": dict(n=512, h=0, v=32768)}


def run(cfg: dict, world: int, port: int) -> list[dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(WORKER)
    try:
        if world == 1:
            cmd = [sys.executable, f.name, json.dumps(cfg)]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}",
                   f"--master-port={port}", f.name, json.dumps(cfg)]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=3600)
    finally:
        os.unlink(f.name)
    lines = [line for line in out.stdout.splitlines() if line.startswith("[")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{cfg} at world {world} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def threads_per_core() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("Thread(s) per core:"):
            return line.split(":", 1)[1].strip()
    return "?"


def buffers(row: dict) -> float:
    """A process's peak beyond its inputs and the gradients, in units of its own N x V_r float32."""
    return (row["peak_bytes"] - row["grad_bytes"]) / (FULL_OR_QUICK["n"] * row["width"] * 4)


FULL_OR_QUICK: dict = {}


def stats(times: list[float]) -> tuple[float, float, float]:
    return quantile(times, 0.5), quantile(times, 0.2), quantile(times, 0.8)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--cases", default="fused,logits", help="which of fused, logits")
    p.add_argument("--out", default=os.path.join(HERE, "out"))
    args = p.parse_args()
    sizes = QUICK if args.quick else FULL
    FULL_OR_QUICK.update(sizes["fused"])
    os.makedirs(args.out, exist_ok=True)
    rows = []
    lines = [f"CPU {cpu_model()}, threads per core {threads_per_core()}, revision {git_revision()}, load "
             f"{load_average():.2f}; float32, one thread per process", ""]
    cases = args.cases.split(",")
    fused = dict(sizes["fused"], case="fused", dtype="float32", reps=args.reps)
    single = run(fused, 1, 0)[0] if "fused" in cases else None
    ranks = run(fused, 2, 29641) if single else []
    floor = run(dict(fused, case="matmul"), 1, 0)[0] if single else None
    floor_ranks = run(dict(fused, case="matmul"), 2, 29644) if single else []
    s_med, s_p20, s_p80 = stats(single["times"]) if single else (1.0, 1.0, 1.0)
    title = f"### fused_linear_jsd_loss, N {fused['n']}, H {fused['h']}, V {fused['v']}: forward + backward"
    lines += [] if not single else [title, "",
              "| process | median s | p20 .. p80 s | / single (spread) | bytes sent per call | all-gather of the "
              "logits would send | peak beyond the gradients, x its N x V_r float32 (bound 0.25) |",
              "|---|---|---|---|---|---|---|",
              f"| single, 1 thread | {s_med:.2f} | {s_p20:.2f} .. {s_p80:.2f} | 1.00 | 0 | | "
              f"{buffers(single):.3f} |"]
    gather = 2 * fused["n"] * fused["v"] * 4 // 2
    for r in ranks:
        med, p20, p80 = stats(r["times"])
        lines.append(f"| rank {r['rank']} of 2, 1 thread | {med:.2f} | {p20:.2f} .. {p80:.2f} | {med / s_med:.3f} "
                     f"({p20 / s_p80:.3f} .. {p80 / s_p20:.3f}) | {r['sent_bytes']:,} | {gather:,} | "
                     f"{buffers(r):.3f} |")
        rows.append(dict(case="fused", world=2, rank=r["rank"], median_s=med, p20_s=p20, p80_s=p80,
                         ratio=med / s_med, sent_bytes=r["sent_bytes"], gather_bytes=gather,
                         peak_bytes=r["peak_bytes"], single_median_s=s_med, single_peak_bytes=single["peak_bytes"],
                         buffers=buffers(r), single_buffers=buffers(single)))
    if single:
        f_med = stats(floor["times"])[0]
        r_med = max(stats(r["times"])[0] for r in floor_ranks)
        lines += [f"| the four products unchunked, whole V (the floor), 1 process | {f_med:.2f} | | "
                  f"{f_med / s_med:.3f} | | | |",
                  f"| the four products unchunked, V / 2, each of 2 processes | {r_med:.2f} | | {r_med / s_med:.3f} "
                  "| | | |", "",
                  "Target: each rank at most 0.6x the single process. Bound: each rank makes half the products and "
                  "half the elementwise work, so 0.5x at the single process's efficiency; the table's floor rows "
                  "are the products' own time on each side.", ""]
        rows.append(dict(case="matmul", world=1, rank=0, median_s=f_med, ratio=f_med / s_med))
        rows.append(dict(case="matmul", world=2, rank=-1, median_s=r_med, ratio=r_med / s_med))
    logits = dict(sizes["logits"], case="logits", dtype="float32", reps=1)
    single = run(logits, 1, 0)[0] if "logits" in cases else None
    title = f"### generalized_jsd_loss, N {logits['n']}, V {logits['v']}: peak above the inputs, one call"
    lines += [] if not single else [title, "",
              "| processes | rank | peak MiB | / single | target (1/P + 5 %) | bytes sent per call |",
              "|---|---|---|---|---|---|",
              f"| 1 | | {single['peak_bytes'] / 2**20:.0f} | 1.000 | | 0 |"]
    for world, port in ((2, 29642), (4, 29643)) if single else ():
        for r in run(logits, world, port):
            ratio = r["peak_bytes"] / single["peak_bytes"]
            lines.append(f"| {world} | {r['rank']} | {r['peak_bytes'] / 2**20:.0f} | {ratio:.3f} | "
                         f"{1 / world + 0.05:.3f} | {r['sent_bytes']:,} |")
            rows.append(dict(case="logits", world=world, rank=r["rank"], peak_bytes=r["peak_bytes"],
                             single_peak_bytes=single["peak_bytes"], ratio=ratio, sent_bytes=r["sent_bytes"],
                             median_s=quantile(r["times"], 0.5)))
    table = "\n".join(lines) + "\n"
    print(table)
    name = ("bench_vocab_parallel_quick" if args.quick else "bench_vocab_parallel") + (
        "" if set(cases) == {"fused", "logits"} else "_" + "_".join(cases))
    with open(os.path.join(args.out, name + ".md"), "w") as f:
        f.write(table)
    write_csv_with_meta(os.path.join(args.out, name + ".csv"),
                        {"cpu": cpu_model(), "threads_per_core": threads_per_core(), "revision": git_revision()},
                        rows, ["case", "world", "rank", "median_s", "p20_s", "p80_s", "ratio", "sent_bytes",
                               "gather_bytes", "peak_bytes", "single_median_s", "single_peak_bytes", "buffers",
                               "single_buffers"])


def plot(rows: list[dict], path: str) -> None:
    """Two panels: each rank's time over the single process's (the target and the half-the-work line), and each
    rank's peak over the single process's (the 1 / P + 5 % target). Needs matplotlib; skipped, and said, without."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no figure")
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    fused = [r for r in rows if r["case"] == "fused"]
    left.bar([f"rank {r['rank']}" for r in fused], [r["ratio"] for r in fused], color="#4c72b0")
    left.errorbar(range(len(fused)), [r["ratio"] for r in fused],
                  yerr=[[r["ratio"] - r["p20_s"] / r["single_median_s"] for r in fused],
                        [r["p80_s"] / r["single_median_s"] - r["ratio"] for r in fused]], fmt="none", color="black")
    left.axhline(0.6, color="red", linestyle="--", label="target 0.6x")
    left.axhline(0.5, color="gray", linestyle=":", label="half the work")
    left.set_ylim(0, 1.0)
    left.set_ylabel("time / one process (1 thread)")
    left.set_title("fused linear JSD, P = 2", fontsize=10)
    left.legend(fontsize=8)
    logits = [r for r in rows if r["case"] == "logits"]
    labels = [f"P{r['world']} r{r['rank']}" for r in logits]
    right.bar(labels, [r["ratio"] for r in logits], color="#55a868")
    for world in sorted({r["world"] for r in logits}):
        xs = [i for i, r in enumerate(logits) if r["world"] == world]
        right.hlines(1 / world + 0.05, min(xs) - 0.4, max(xs) + 0.4, color="red", linestyle="--")
    right.set_ylabel("peak / one process's")
    right.set_title("generalized JSD from logits: peak per rank (target 1/P + 5 %)", fontsize=10)
    right.set_ylim(0, 0.7)
    fig.suptitle("The vocabulary split over gloo ranks, N 2,048, V 151,936, float32", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--plot":  # redraw from a CSV: --plot results/bench_vocab_parallel.csv
        from bench_common import read_csv_with_meta

        _, table = read_csv_with_meta(sys.argv[2], ("world", "rank"), ("median_s", "p20_s", "p80_s", "ratio",
                                                                       "single_median_s"))
        plot(table, sys.argv[2].replace(".csv", ".png"))
    else:
        main()
