"""The roofline of bench_distill.py: what the generalized JSD's forward + backward could take at best on this CPU,
from its least work per logit (the package's own vector exp and log, measured per instruction set) and its least
memory traffic (the machine's bandwidth, measured), in the same run as the timings (benchmarks/README.md,
"Distillation", writes the bound beside each target)."""
from __future__ import annotations

import math
import time

# The least work of a two-pass kernel per logit (docs/cpu_kernels.md, "Rows"): one exp per side for the
# softmaxes, one log for the mixture. Its memory: each side of a kept row read once from memory, both read
# again for the values and gradients, and each gradient allocated and written once (fresh_write_s).
MIN_EXP, MIN_LOG = 2, 1
READ_STREAMS, REREAD_STREAMS = 2, 2


def vector_math_ns(isa: str) -> dict[str, float]:
    """ns per value of the package's vector exp and log on `isa`, one thread: the slope between calls on 4,096
    and 32,768 floats (both in L2), so that a call's fixed cost (about 2 us) is not counted; the best of 7."""
    import torch

    import npu_loss_ops

    out = {}
    for fn in ("exp", "log"):
        per_call = {}
        for n in (4096, 32768):
            data = torch.rand(n) * 20 - 10
            data = data.abs() + 1e-3 if fn == "log" else data
            npu_loss_ops._C._vec_math(fn, data, isa)
            best = math.inf
            for _ in range(7):
                start = time.perf_counter()
                for _ in range(200):
                    npu_loss_ops._C._vec_math(fn, data, isa)
                best = min(best, (time.perf_counter() - start) / 200)
            per_call[n] = best
        out[fn] = (per_call[32768] - per_call[4096]) / (32768 - 4096) * 1e9
    return out


def bandwidth_gbs(threads: int) -> float:
    """GB/s of aten.add over three 64M-float32 streams (two reads, one write), the best of five calls."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.rand(1 << 26), torch.rand(1 << 26)
    c = torch.empty_like(a)
    best = math.inf
    for _ in range(6):
        start = time.perf_counter()
        torch.add(a, b, out=c)
        best = min(best, time.perf_counter() - start)
    return 3 * a.numel() * 4 / best / 1e9


def reread_gbs(v: int, elsize: int) -> float:
    """GB/s of torch.sum on one thread re-reading a working set of one student row and one teacher row (2 x V
    elements of elsize bytes, read as float32): one call over a zero-stride view that repeats the set to 1 GiB,
    so no call's overhead counts; the best of three."""
    import torch

    torch.set_num_threads(1)
    rows = torch.rand(2 * v * elsize // 4)
    repeated = rows.as_strided((max(1, (1 << 30) // rows.nbytes), rows.numel()), (0, 1))
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        repeated.sum()
        best = min(best, time.perf_counter() - start)
    return repeated.numel() * 4 / best / 1e9


def fresh_write_s(n: int, v: int, dtype: str, threads: int) -> float:
    """Seconds to allocate an N x V tensor of `dtype` and write it once (torch.empty(...).fill_(0) at `threads`
    threads, the best of three): a gradient's least cost, page faults of its fresh memory included."""
    import torch

    torch.set_num_threads(threads)
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        torch.empty((n, v), dtype=getattr(torch, dtype)).fill_(0)
        best = min(best, time.perf_counter() - start)
    return best


def bound_seconds(kept: int, v: int, elsize: int, threads: int, math_ns: dict, gbs: float, reread: float,
                  fresh: float, both: bool = False) -> tuple[float, float]:
    """(compute floor, memory floor) of one forward + backward of N x V logits of which `kept` rows are kept,
    in seconds; `both`: the teacher's gradient is made too. `reread`: reread_gbs's GB/s per thread; `fresh`:
    fresh_write_s of one gradient."""
    compute = kept * v * (MIN_EXP * math_ns["exp"] + MIN_LOG * math_ns["log"]) * 1e-9 / threads
    reads = kept * v * READ_STREAMS * elsize / (gbs * 1e9)
    rereads = kept * v * REREAD_STREAMS * elsize / (reread * threads * 1e9)
    return compute, reads + rereads + fresh * (1 + both)


# ---- the run ----
