"""Benchmark every npu_loss_ops op against ATen, autograd's composite formulas and the memory-bandwidth roofline.

One run times, for each (threads, dtype, reduction, size), every variant below, interleaved round-robin:

  backward ops (g full-size for 'none', 0-dim as autograd passes it for 'mean'/'sum'):
    smooth_l1_loss_backward      ours, ours_out (.grad_input)   vs  aten.smooth_l1_loss_backward, aten_out (.grad_input)
    l1_loss_backward             ours, ours_out (.grad_input)   vs  composite: torch.sgn(x - t) * g  ('mean': .div_(n)),
                                                                    composite_out (the last op with out=),
                                                                    autograd: torch.autograd.grad of F.l1_loss through
                                                                    the retained graph (the backward alone)
    kl_div_target_backward       ours, ours_out (.grad_target)  vs  composite: g * (torch.log(t) + 1 - x), composite_out,
    kl_div_target_backward[log]                                     autograd;  [log]: g * torch.exp(t) * (t + 1 - x)
  forward ops:
    smooth_l1_loss, l1_loss, kl_div, kl_div[log]   ours  vs  aten (torch.ops.aten.<op>, what F calls)
  a training step, reduction 'mean' only (x.grad = None before each):
    step:<loss>                  npu_loss_ops.<loss>(x, t).backward()  vs  F: torch.nn.functional.<loss>(x, t).backward()
                                 (kl_div: input and target both require grad, so the target-gradient kernel runs)
  rooflines: an ATen op with the same number of read and write streams, through torch.ops like ours,
             allocating (functional) and preallocated (out=):
    roofline_3r1w   aten.addcmul(g, x, t)   backward 'none'
    roofline_2r1w   aten.add(x, t)          backward 'mean'/'sum' (g 0-dim), forward 'none'
    roofline_2r0w   forward 'mean'/'sum': float32 aten.dot(x, t); 16-bit floats: aten.sum of one (2, n) buffer
                    (both operands' bytes in one reduction), as aten.dot is not bandwidth-bound for bfloat16 on
                    CPU (~50x slower at 16M elements) and the sum was the fastest 2-read alternative measured.

Each sample times a batch of calls sized to last about --sample-ms; the repeats are capped so that one variant
takes at most --max-variant-s at the large sizes. Reported per call: median with p20/p80, effective GB/s (the
op's minimal bytes / time), the ratio to the roofline and to the baseline. Writes a CSV (metadata in '#' lines
and in columns), a PNG of effective GB/s against size, and benchmarks/README_table.md (the targets, PASS/MISS).

    python benchmarks/bench_losses.py            # 4K..64M elements, float32+bfloat16, 1 and all threads
    python benchmarks/bench_losses.py --quick    # 4K, 256K, 16M, 2 threads, fewer repeats: under two minutes
    python benchmarks/bench_losses.py --sizes 16M --dtypes float32 --threads 2 --ops smooth_l1_loss_backward
"""
from __future__ import annotations

import argparse
import csv
import datetime
import gc
import math
import os
import platform
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

import npu_loss_ops
from bench_common import HERE, REPO, cpu_model, extension_stamp, git_revision, load_average, quantile
from npu_loss_ops.version import __version__ as npu_loss_ops_version

REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
FULL_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
QUICK_SIZES = [4 << 10, 256 << 10, 16 << 20]
TARGET_SIZE, SMALL_SIZE, TARGET_THREADS = 16 << 20, 4 << 10, 2
BETA = 1.0

BACKWARD_OPS = ["smooth_l1_loss_backward", "l1_loss_backward", "kl_div_target_backward", "kl_div_target_backward[log]"]
FORWARD_OPS = ["smooth_l1_loss", "l1_loss", "kl_div", "kl_div[log]"]
STEP_OPS = ["step:smooth_l1_loss", "step:l1_loss", "step:kl_div"]
ROOFLINES = {  # name -> (ATen op as called, element streams)
    "roofline_3r1w": ("aten.addcmul", 4),
    "roofline_2r1w": ("aten.add", 3),
    "roofline_2r0w": ("aten.dot for float32, aten.sum of one (2, n) buffer for 16-bit floats", 2),
}
ALL_OPS = BACKWARD_OPS + FORWARD_OPS + STEP_OPS
# The baseline each of our variants is compared with (same form), by op.
BASELINE = {
    "smooth_l1_loss_backward": {"ours": "aten", "ours_out": "aten_out"},
    "l1_loss_backward": {"ours": "composite", "ours_out": "composite_out"},
    "kl_div_target_backward": {"ours": "composite", "ours_out": "composite_out"},
    "kl_div_target_backward[log]": {"ours": "composite", "ours_out": "composite_out"},
    **{op: {"ours": "aten"} for op in FORWARD_OPS},
    **{op: {"ours": "F"} for op in STEP_OPS},
}


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def format_size(n: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


@dataclass
class Variant:
    op: str
    variant: str  # ours, ours_out, aten, aten_out, composite, composite_out, autograd, F, functional, out
    fn: Callable[[], object]
    streams: int  # element streams of the op's minimal memory traffic, for the effective GB/s
    roofline: tuple[str, str] | None = None  # (roofline op, variant) this is compared with
    desc: str = ""  # rooflines: the ATen op as called
    samples: list[float] = field(default_factory=list)
    inner: int = 1
    repeats: int = 1

    @property
    def key(self) -> tuple[str, str]:
        return self.op, self.variant


@dataclass
class Config:
    threads: int
    dtype: str
    reduction: str
    numel: int

    @property
    def label(self) -> str:
        return f"{self.threads}t {DTYPE_SHORT[self.dtype]} {self.reduction} {format_size(self.numel)}"


# ----------------------------------------------------------------------------------------------- variants


def build_variants(cfg: Config, ops: list[str], with_autograd: bool = True
                   ) -> tuple[list[Variant], dict[tuple[str, str], Callable[[], bool]]]:
    """The timed callables of one configuration and, per (op, variant) of ours, a correctness check."""
    dtype, r, n = DTYPES[cfg.dtype], REDUCTIONS[cfg.reduction], cfg.numel
    none = cfg.reduction == "none"
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=gen).to(dtype)
    t = torch.randn(n, generator=gen).to(dtype)
    # KL: probabilities bounded away from 0 (autograd's xlogy gradient is NaN at 0), and their logs.
    tp = (torch.rand(n, generator=gen) * 0.98 + 0.01).to(dtype)
    tl = tp.log()
    g = torch.randn(n, generator=gen).to(dtype) if none else torch.tensor(1.0, dtype=dtype)
    out = torch.empty(n, dtype=dtype)  # shared by every out= variant (they run one after another)
    out.zero_()  # fault its pages in
    npu, aten = torch.ops.npu_loss, torch.ops.aten
    variants: list[Variant] = []
    checks: dict[tuple[str, str], Callable[[], bool]] = {}
    bwd_roof = "roofline_3r1w" if none else "roofline_2r1w"
    fwd_roof = "roofline_2r1w" if none else "roofline_2r0w"
    bwd_streams, fwd_streams = (4, 3) if none else (3, 2)

    def add(op, variant, fn, streams, roofline_op=None, desc=""):
        roof = None
        if roofline_op is not None:
            roof = (roofline_op, "out" if variant.endswith("_out") else "functional")
        variants.append(Variant(op, variant, fn, streams, roof, desc=desc))

    def close(ours: torch.Tensor, ref: torch.Tensor) -> bool:
        """|ours - ref| <= tol * (|ref| + max |ref|) everywhere (torch.allclose is 10x slower at 16M)."""
        ref = ref.double()
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        bound = ref.abs()
        scale = bound.max().item() if bound.numel() else 0.0
        bound.add_(scale).mul_(tol)
        return bool(torch.le(torch.sub(ours.double(), ref).abs_(), bound).all())

    class Lazy64:  # float64 copies for the checks, made after the timing (they double the memory)
        def __getattr__(self, name):
            value = {"x": x, "t": t, "tp": tp, "tl": tl, "g": g}[name].double()
            setattr(self, name, value)
            return value

    d64 = Lazy64()

    def scaled(v: torch.Tensor) -> torch.Tensor:
        return v / n if cfg.reduction == "mean" else v

    need_roofs = set()

    # Backward ops. One function per op, so that each op's lambdas close over their own variables.
    def smooth_l1_backward(op):
        fn, fn_out = npu.smooth_l1_loss_backward, npu.smooth_l1_loss_backward.grad_input
        ref_fn, ref_out = aten.smooth_l1_loss_backward, aten.smooth_l1_loss_backward.grad_input
        add(op, "ours", lambda: fn(g, x, t, r, BETA), bwd_streams, bwd_roof)
        add(op, "ours_out", lambda: fn_out(g, x, t, r, BETA, grad_input=out), bwd_streams, bwd_roof)
        add(op, "aten", lambda: ref_fn(g, x, t, r, BETA), bwd_streams, bwd_roof)
        add(op, "aten_out", lambda: ref_out(g, x, t, r, BETA, grad_input=out), bwd_streams, bwd_roof)
        ref = lambda: ref_fn(d64.g, d64.x, d64.t, r, BETA)  # noqa: E731
        checks[(op, "ours")] = lambda: close(fn(g, x, t, r, BETA), ref())
        checks[(op, "ours_out")] = lambda: close(fn_out(g, x, t, r, BETA, grad_input=out.clone()), ref())

    def l1_backward(op):
        fn, fn_out = npu.l1_loss_backward, npu.l1_loss_backward.grad_input
        if cfg.reduction == "mean":
            comp = lambda: (torch.sgn(x - t) * g).div_(n)  # noqa: E731
            comp_out = lambda: torch.mul(torch.sgn(x - t), g, out=out).div_(n)  # noqa: E731
        else:
            comp = lambda: torch.sgn(x - t) * g  # noqa: E731
            comp_out = lambda: torch.mul(torch.sgn(x - t), g, out=out)  # noqa: E731
        xr = x.detach().requires_grad_()
        graph = F.l1_loss(xr, t, reduction=cfg.reduction)
        add(op, "ours", lambda: fn(g, x, t, r), bwd_streams, bwd_roof)
        add(op, "ours_out", lambda: fn_out(g, x, t, r, grad_input=out), bwd_streams, bwd_roof)
        add(op, "composite", comp, bwd_streams, bwd_roof)
        add(op, "composite_out", comp_out, bwd_streams, bwd_roof)
        if with_autograd:
            add(op, "autograd", lambda: torch.autograd.grad(graph, xr, g, retain_graph=True), bwd_streams, bwd_roof)
        ref = lambda: scaled(torch.sgn(d64.x - d64.t) * d64.g)  # noqa: E731
        checks[(op, "ours")] = lambda: close(fn(g, x, t, r), ref())
        checks[(op, "ours_out")] = lambda: close(fn_out(g, x, t, r, grad_input=out.clone()), ref())

    def kl_target_backward(op, log_target):
        tk = tl if log_target else tp
        fn, fn_out = npu.kl_div_target_backward, npu.kl_div_target_backward.grad_target
        if log_target:
            formula = lambda: g * torch.exp(tk) * (tk + 1 - x)  # noqa: E731
            formula_out = lambda: torch.mul(g * torch.exp(tk), tk + 1 - x, out=out)  # noqa: E731
            ref = lambda: scaled(d64.g * torch.exp(d64.tl) * (d64.tl + 1 - d64.x))  # noqa: E731
        else:
            formula = lambda: g * (torch.log(tk) + 1 - x)  # noqa: E731
            formula_out = lambda: torch.mul(g, torch.log(tk) + 1 - x, out=out)  # noqa: E731
            ref = lambda: scaled(d64.g * (torch.log(d64.tp) + 1 - d64.x))  # noqa: E731
        if cfg.reduction == "mean":
            comp, comp_out = (lambda: formula().div_(n)), (lambda: formula_out().div_(n))
        else:
            comp, comp_out = formula, formula_out
        tr = tk.detach().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = F.kl_div(x, tr, reduction=cfg.reduction, log_target=log_target)
        add(op, "ours", lambda: fn(g, x, tk, r, log_target), bwd_streams, bwd_roof)
        add(op, "ours_out", lambda: fn_out(g, x, tk, r, log_target, grad_target=out), bwd_streams, bwd_roof)
        add(op, "composite", comp, bwd_streams, bwd_roof)
        add(op, "composite_out", comp_out, bwd_streams, bwd_roof)
        if with_autograd:
            add(op, "autograd", lambda: torch.autograd.grad(graph, tr, g, retain_graph=True), bwd_streams, bwd_roof)
        checks[(op, "ours")] = lambda: close(fn(g, x, tk, r, log_target), ref())
        checks[(op, "ours_out")] = lambda: close(fn_out(g, x, tk, r, log_target, grad_target=out.clone()), ref())

    backward_builders = {
        "smooth_l1_loss_backward": smooth_l1_backward,
        "l1_loss_backward": l1_backward,
        "kl_div_target_backward": lambda op: kl_target_backward(op, False),
        "kl_div_target_backward[log]": lambda op: kl_target_backward(op, True),
    }
    for op, build in backward_builders.items():
        if op in ops:
            build(op)
            need_roofs.add(bwd_roof)

    # Forward ops.
    fwd_defs = {
        "smooth_l1_loss": (lambda: npu.smooth_l1_loss(x, t, r, BETA), lambda: aten.smooth_l1_loss(x, t, r, BETA),
                           lambda: aten.smooth_l1_loss(d64.x, d64.t, r, BETA)),
        "l1_loss": (lambda: npu.l1_loss(x, t, r), lambda: aten.l1_loss(x, t, r),
                    lambda: aten.l1_loss(d64.x, d64.t, r)),
        "kl_div": (lambda: npu.kl_div(x, tp, r), lambda: aten.kl_div(x, tp, r),
                   lambda: aten.kl_div(d64.x, d64.tp, r)),
        "kl_div[log]": (lambda: npu.kl_div(x, tl, r, log_target=True),
                        lambda: aten.kl_div(x, tl, r, log_target=True),
                        lambda: aten.kl_div(d64.x, d64.tl, r, log_target=True)),
    }
    for op, (ours_fn, aten_fn, ref_fn) in fwd_defs.items():
        if op in ops:
            add(op, "ours", ours_fn, fwd_streams, fwd_roof)
            add(op, "aten", aten_fn, fwd_streams, fwd_roof)
            checks[(op, "ours")] = (lambda o, rf: lambda: close(o(), rf()))(ours_fn, ref_fn)
            need_roofs.add(fwd_roof)
    # Training steps, reduction 'mean' only.
    if cfg.reduction == "mean":
        xs = x.detach().requires_grad_()
        ts = tp.detach().requires_grad_()

        def step(loss_fn, both):
            def run():
                xs.grad = None
                if both:
                    ts.grad = None
                    loss_fn(xs, ts).backward()
                else:
                    loss_fn(xs, t).backward()
            return run

        def step_grads(loss_fn, both):
            step(loss_fn, both)()
            return [xs.grad.clone()] + ([ts.grad.clone()] if both else [])

        step_defs = {
            "step:smooth_l1_loss": (npu_loss_ops.smooth_l1_loss, F.smooth_l1_loss, False, 5),
            "step:l1_loss": (npu_loss_ops.l1_loss, F.l1_loss, False, 5),
            "step:kl_div": (npu_loss_ops.kl_div, F.kl_div, True, 6),
        }
        for op, (ours_loss, f_loss, both, streams) in step_defs.items():
            if op in ops:
                add(op, "ours", step(ours_loss, both), streams)
                add(op, "F", step(f_loss, both), streams)
                checks[(op, "ours")] = (lambda o, f, b: lambda: all(
                    close(a, c) for a, c in zip(step_grads(o, b), step_grads(f, b))))(ours_loss, f_loss, both)
    # Rooflines.
    if "roofline_3r1w" in need_roofs:
        add("roofline_3r1w", "functional", lambda: aten.addcmul(g, x, t), 4, desc="aten.addcmul(g, x, t)")
        add("roofline_3r1w", "out", lambda: aten.addcmul.out(g, x, t, out=out), 4, desc="aten.addcmul.out")
    if "roofline_2r1w" in need_roofs:
        add("roofline_2r1w", "functional", lambda: aten.add.Tensor(x, t), 3, desc="aten.add(x, t)")
        add("roofline_2r1w", "out", lambda: aten.add.out(x, t, out=out), 3, desc="aten.add.out")
    if "roofline_2r0w" in need_roofs:
        if dtype == torch.float32:
            add("roofline_2r0w", "functional", lambda: aten.dot(x, t), 2, desc="aten.dot(x, t)")
        else:  # aten.dot is not bandwidth-bound for 16-bit floats on CPU (~50x slower than this)
            both = torch.stack([x, t])
            add("roofline_2r0w", "functional", lambda: aten.sum.default(both), 2,
                desc="aten.sum of a (2, n) buffer")
    return variants, checks


# ------------------------------------------------------------------------------------------------- timing


def time_variants(variants: list[Variant], args) -> None:
    """Fills each variant's per-call samples; variants interleaved round-robin with a rotating start."""
    sample_s = args.sample_ms / 1e3
    for v in variants:
        # Warm-up (first-touch page faults, thread-pool start, lazy init, autograd caches), and an estimate of
        # the call time. A long first call is warm enough: the same variant ran at the smaller sizes before.
        start = time.perf_counter()
        v.fn()
        once = time.perf_counter() - start
        if once < 2 * sample_s:
            start = time.perf_counter()
            v.fn()
            once = time.perf_counter() - start
        if once < 2e-3:  # small: a few more warm-up calls, then time a batch for a better estimate
            for _ in range(3):
                v.fn()
            start = time.perf_counter()
            for _ in range(10):
                v.fn()
            once = (time.perf_counter() - start) / 10
        once = max(once, 1e-7)
        v.inner = max(1, round(sample_s / once))
        budget = math.ceil(args.max_variant_s / (v.inner * once))
        # Variants too slow for --min-repeats samples within the budget (the composite baselines at 64M) get 3.
        floor = args.min_repeats if budget >= args.min_repeats else min(3, args.min_repeats)
        v.repeats = max(floor, min(args.repeats, budget))
        v.samples = []
    rounds = max(v.repeats for v in variants)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for rep in range(rounds):
            k = rep % len(variants)
            for v in variants[k:] + variants[:k]:
                if len(v.samples) >= v.repeats:
                    continue
                fn, inner = v.fn, v.inner
                start = time.perf_counter()
                for _ in range(inner):
                    fn()
                v.samples.append((time.perf_counter() - start) / inner)
    finally:
        if gc_was_enabled:
            gc.enable()


# ----------------------------------------------------------------------------------------------- metadata


def metadata(args, command: str) -> dict[str, str]:
    info = npu_loss_ops.build_info()
    return {
        "benchmark": "npu_loss_ops ops vs ATen / autograd composites / F, and the memory roofline",
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "npu_loss_ops": npu_loss_ops_version,
        "git_sha": git_revision(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "logical_cpus": str(os.cpu_count()),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_kernel_isa": str(info.get("cpu_kernel_isa")),
        "openmp": str(info.get("openmp")),
        "extension": extension_stamp(),
        "threads": ",".join(map(str, args.threads)),
        "load_average_1min_start": f"{load_average():.2f}",
        "beta": str(BETA),
        "repeats": f"{args.repeats}, fewer to keep a variant within {args.max_variant_s} s per configuration, "
                   f"at least {args.min_repeats} (3 for calls slower than {args.max_variant_s / args.min_repeats:.2g} s)",
        "autograd_variants": str(args.autograd),
        "checked_up_to": f"{format_size(args.check_max)} elements (matches_reference empty above)",
        "sample_ms": str(args.sample_ms),
        "timing": "time.perf_counter per batch of calls, variants interleaved; median, p20, p80 of the per-call time",
        "roofline_ops": "; ".join(f"{k}: {v[0]} ({v[1]} streams)" for k, v in ROOFLINES.items()),
        "GBps": "the op's minimal bytes (element streams x numel x itemsize) / median time",
    }


# -------------------------------------------------------------------------------------------------- progress


class Progress:
    """tqdm when installed, else a plain counter on stderr."""

    def __init__(self, total: int):
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        self.bar = tqdm(total=total, file=sys.stderr, dynamic_ncols=True,
                        bar_format="{desc:<24} {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]") if tqdm else None
        self.total, self.done, self.start = total, 0, time.perf_counter()

    def step(self, label: str, weight: float = 1.0) -> None:
        self.done += weight
        if self.bar is not None:
            self.bar.set_description(label)
            self.bar.update(weight)
        else:
            print(f"\r[{self.done:.0f}/{self.total:.0f}] {label:<40} {time.perf_counter() - self.start:5.0f} s",
                  end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            print(file=sys.stderr)


# ------------------------------------------------------------------------------------------------------ run


def run(args, meta: dict[str, str]) -> list[dict]:
    configs = [Config(th, d, red, n) for th in args.threads for d in args.dtypes for red in args.reductions
               for n in args.sizes]
    # Progress weighted by the bytes touched, so the bar's rate and ETA mean something.
    weights = [1.0 + c.numel / (1 << 20) * DTYPES[c.dtype].itemsize / 4 / (c.threads ** 0.5) for c in configs]
    scale = len(configs) / sum(weights)
    progress = Progress(len(configs))
    rows: list[dict] = []
    static = {k: meta[k] for k in ("cpu", "torch", "cpu_capability", "cpu_kernel_isa", "npu_loss_ops", "git_sha")}
    default_threads = torch.get_num_threads()
    try:
        for cfg, w in zip(configs, weights):
            torch.set_num_threads(cfg.threads)
            variants, checks = build_variants(cfg, args.ops, args.autograd)
            time_variants(variants, args)
            ok = {key: check() for key, check in checks.items()} if cfg.numel <= args.check_max else {}
            stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            load = f"{load_average():.2f}"
            by_key = {v.key: v for v in variants}
            itemsize = DTYPES[cfg.dtype].itemsize
            for v in variants:
                med = statistics.median(v.samples)
                row = {
                    "op": v.op, "variant": v.variant, "dtype": cfg.dtype, "reduction": cfg.reduction,
                    "numel": cfg.numel, "threads": cfg.threads,
                    "median_ms": med * 1e3, "p20_ms": quantile(v.samples, 0.2) * 1e3,
                    "p80_ms": quantile(v.samples, 0.8) * 1e3, "samples": len(v.samples), "calls_per_sample": v.inner,
                    "streams": v.streams, "GBps": v.streams * cfg.numel * itemsize / med / 1e9,
                    "roofline_op": "", "roofline_ms": "", "ratio_to_roofline": "",
                    "baseline": "", "baseline_ms": "", "ratio_to_baseline": "", "ratio_to_autograd": "",
                    "matches_reference": ok.get(v.key, ""),
                }
                if v.op.startswith("roofline"):
                    row["roofline_op"] = v.desc
                roof = by_key.get(v.roofline) if v.roofline else None
                if roof is not None:
                    roof_med = statistics.median(roof.samples)
                    row.update(roofline_op=f"{roof.op}:{roof.variant} ({roof.desc})",
                               roofline_ms=roof_med * 1e3, ratio_to_roofline=med / roof_med)
                base_name = BASELINE.get(v.op, {}).get(v.variant)
                base = by_key.get((v.op, base_name)) if base_name else None
                if base is not None:
                    base_med = statistics.median(base.samples)
                    row.update(baseline=base_name, baseline_ms=base_med * 1e3, ratio_to_baseline=med / base_med)
                autograd = by_key.get((v.op, "autograd"))
                if autograd is not None and v.variant.startswith("ours"):
                    row["ratio_to_autograd"] = med / statistics.median(autograd.samples)
                row.update(static, load_average_1min=load, date=stamp)
                rows.append(row)
            del variants, checks, by_key
            gc.collect()
            progress.step(cfg.label, w * scale)
    finally:
        progress.close()
        torch.set_num_threads(default_threads)
    return rows


# ------------------------------------------------------------------------------------------------- targets


@dataclass
class Target:
    group: str  # the issue's target, verbatim-ish
    label: str  # the row: op and form
    limit: float
    speedup: bool  # True: measured = baseline / ours, must be >= limit; else ours / ref, must be <= limit
    cells: dict[tuple[str, str], float | None]  # (dtype, reduction) -> measured

    def passed(self, value: float) -> bool:
        return value >= self.limit if self.speedup else value <= self.limit

    @property
    def values(self) -> list[float]:
        return [v for v in self.cells.values() if v is not None]

    @property
    def result(self) -> str:
        if not self.values:
            return "n/a"
        return "PASS" if all(self.passed(v) for v in self.values) else "MISS"


def evaluate_targets(rows: list[dict], dtypes: list[str], reductions: list[str]) -> tuple[list[Target], int | None]:
    threads_present = sorted({r["threads"] for r in rows})
    if not threads_present:
        return [], None
    threads = TARGET_THREADS if TARGET_THREADS in threads_present else max(threads_present)
    med = {(r["op"], r["variant"], r["dtype"], r["reduction"], r["numel"]): r["median_ms"]
           for r in rows if r["threads"] == threads}

    def m(op, variant, dtype, red, size):
        return med.get((op, variant, dtype, red, size))

    def ratio(a, b):
        return a / b if a is not None and b is not None else None

    def cells(fn, reds=None):
        return {(d, red): fn(d, red) for d in dtypes for red in (reds or reductions)}

    def bwd_roof(red):
        return "roofline_3r1w" if red == "none" else "roofline_2r1w"

    targets: list[Target] = []
    big, small = TARGET_SIZE, SMALL_SIZE
    g1 = "16M: backward out= <= 1.15x preallocated roofline"
    g2 = "16M: backward allocating <= 1.15x allocating roofline"
    for op in BACKWARD_OPS:
        targets.append(Target(g1, f"{op} out=", 1.15, False, cells(
            lambda d, red, op=op: ratio(m(op, "ours_out", d, red, big), m(bwd_roof(red), "out", d, red, big)))))
    for op in BACKWARD_OPS:
        targets.append(Target(g2, f"{op}", 1.15, False, cells(
            lambda d, red, op=op: ratio(m(op, "ours", d, red, big), m(bwd_roof(red), "functional", d, red, big)))))
    targets.append(Target("16M: >= 2x faster than ATen's out= form", "smooth_l1_loss_backward out=", 2.0, True,
                          cells(lambda d, red: ratio(m("smooth_l1_loss_backward", "aten_out", d, red, big),
                                                     m("smooth_l1_loss_backward", "ours_out", d, red, big)))))
    for op in BACKWARD_OPS[1:]:
        targets.append(Target("16M: >= 4x faster than autograd's composite formula", op, 4.0, True, cells(
            lambda d, red, op=op: ratio(m(op, "composite", d, red, big), m(op, "ours", d, red, big)))))
    for op in STEP_OPS:
        targets.append(Target("16M: fwd+bwd step (mean) >= 2x faster than torch.nn.functional", op, 2.0, True,
                              cells(lambda d, red, op=op: ratio(m(op, "F", d, red, big), m(op, "ours", d, red, big)),
                                    ["mean"])))
    g6 = "4K: each op call <= 1.2x aten.smooth_l1_loss_backward (same form)"
    for op in BACKWARD_OPS:
        for variant, form in (("ours", "functional"), ("ours_out", "out")):
            ref_variant = "aten" if form == "functional" else "aten_out"
            targets.append(Target(g6, f"{op}{' out=' if form == 'out' else ''}", 1.2, False, cells(
                lambda d, red, op=op, v=variant, rv=ref_variant: ratio(
                    m(op, v, d, red, small), m("smooth_l1_loss_backward", rv, d, red, small)))))
    for op in FORWARD_OPS:
        targets.append(Target(g6, op, 1.2, False, cells(
            lambda d, red, op=op: ratio(m(op, "ours", d, red, small), m("smooth_l1_loss_backward", "aten", d, red,
                                                                         small)))))
    for op in STEP_OPS:
        targets.append(Target("4K: fwd+bwd step (mean) no slower than torch.nn.functional", op, 1.0, False,
                              cells(lambda d, red, op=op: ratio(m(op, "ours", d, red, small), m(op, "F", d, red, small)),
                                    ["mean"])))
    targets = [tg for tg in targets if tg.values]
    return targets, threads


def format_cell(tg: Target, value: float | None, markdown: bool) -> str:
    if value is None:
        return "–" if markdown else "-"
    text = f"{value:.2f}"
    if not tg.passed(value):
        text = f"**{text}**" if markdown else f"{text}!"
    return text


def target_columns(dtypes: list[str], reductions: list[str]) -> list[tuple[str, str]]:
    return [(d, red) for d in dtypes for red in reductions]


def print_targets(targets: list[Target], threads: int | None, dtypes: list[str], reductions: list[str]) -> None:
    if not targets:
        print("\n(no target configuration in this run: the targets need 4K and/or 16M elements)")
        return
    cols = target_columns(dtypes, reductions)
    print(f"\nTargets ({threads} threads): time ratios ours/reference (<= limit) or speedups reference/ours "
          "(>= limit); '!' marks a cell that misses")
    header = f"{'op':<34}" + "".join(f"{DTYPE_SHORT[d] + ' ' + red:>10}" for d, red in cols) + f"{'limit':>8}  result"
    group = None
    for tg in targets:
        if tg.group != group:
            group = tg.group
            print(f"\n{group}")
            print(header)
            print("-" * len(header))
        limit = f"{'>=' if tg.speedup else '<='}{tg.limit:g}{'x' if tg.speedup else ''}"
        print(f"{tg.label:<34}" + "".join(f"{format_cell(tg, tg.cells.get(c), False):>10}" for c in cols)
              + f"{limit:>8}  {tg.result}")
    passed = sum(tg.result == "PASS" for tg in targets)
    print(f"\n{passed}/{len(targets)} target rows PASS")


def markdown_targets(targets: list[Target], threads: int | None, dtypes: list[str], reductions: list[str],
                     meta: dict[str, str], csv_rel: str, png_rel: str) -> str:
    cols = target_columns(dtypes, reductions)
    lines = [
        f"Measured with `{meta['command']}` ({meta['wall_seconds']} s): npu_loss_ops {meta['npu_loss_ops']} "
        f"(git {meta['git_sha']}, CPU kernels {meta['cpu_kernel_isa']}), torch {meta['torch']} "
        f"(CPU capability {meta['cpu_capability']}), {meta['cpu']}, {meta['logical_cpus']} logical CPUs, "
        f"targets at {threads} threads, 1-minute load average {meta['load_average_1min_start']} at the start and "
        f"{meta['load_average_1min_end']} at the end, "
        f"{meta['date'][:10]}. Full results: `{csv_rel}`, plot: `{png_rel}`.",
        "",
        "Time ratios ours/reference (target: at most the limit) or speedups reference/ours (target: at least the "
        "limit), median per call; a bold cell misses. Backward 'mean'/'sum' take a 0-dim gradient, as autograd "
        "passes it. Composite formulas: L1 `torch.sgn(x - t) * g`, KL `g * (torch.log(t) + 1 - x)`, KL log-target "
        "`g * torch.exp(t) * (t + 1 - x)` ('mean': then `.div_(n)`). Rooflines: `aten.addcmul` (3 reads + 1 "
        "write, backward 'none') and `aten.add` (2 reads + 1 write, backward 'mean'/'sum').",
        "",
        "| target | op | " + " | ".join(f"{DTYPE_SHORT[d]} {red}" for d, red in cols) + " | limit | result |",
        "|---|---|" + "---:|" * len(cols) + "---:|---|",
    ]
    for tg in targets:
        limit = f"{'≥' if tg.speedup else '≤'} {tg.limit:g}{'×' if tg.speedup else ''}"
        lines.append(f"| {tg.group} | `{tg.label}` | "
                     + " | ".join(format_cell(tg, tg.cells.get(c), True) for c in cols)
                     + f" | {limit} | {tg.result} |")
    passed = sum(tg.result == "PASS" for tg in targets)
    lines += ["", f"{passed}/{len(targets)} target rows pass."]
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------------- output


def print_details(rows: list[dict], sizes: list[int]) -> None:
    """A compact per-op table at the target sizes: median ms of each variant and the two ratios of ours."""
    show = [s for s in (SMALL_SIZE, TARGET_SIZE) if s in sizes] or sizes[-1:]
    print("\nmedian ms per call [p20, p80]; ours/roof and ours/base are median time ratios")
    header = (f"{'op':<30} {'variant':<14} {'dtype':<5} {'red':<4} {'n':>4} {'th':>2} {'median [p20, p80]':>28} "
              f"{'GB/s':>6} {'/roof':>6} {'/base':>6}")
    print(header)
    print("-" * len(header))
    for row in rows:
        if row["numel"] not in show:
            continue

        def fmt(v):
            return f"{v:6.2f}" if isinstance(v, float) else f"{'':6}"

        print(f"{row['op']:<30} {row['variant']:<14} {DTYPE_SHORT[row['dtype']]:<5} {row['reduction']:<4} "
              f"{format_size(row['numel']):>4} {row['threads']:>2} "
              f"{row['median_ms']:>9.4f} [{row['p20_ms']:>7.4f}, {row['p80_ms']:>7.4f}] "
              f"{row['GBps']:6.1f} {fmt(row['ratio_to_roofline'])} {fmt(row['ratio_to_baseline'])}"
              + ("" if row["matches_reference"] in ("", True) else "  DIFFERS FROM THE REFERENCE"))


def write_csv(rows: list[dict], meta: dict[str, str], path: str) -> None:
    with open(path, "w", newline="") as f:
        for key, value in meta.items():
            f.write(f"# {key}: {value}\n")
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.5g}" if isinstance(v, float) else v) for k, v in row.items()})


STYLE = {  # variant -> (color, marker)
    "ours": ("tab:blue", "o"), "ours_out": ("tab:cyan", "o"), "aten": ("tab:red", "s"),
    "aten_out": ("tab:orange", "s"), "composite": ("tab:red", "s"), "composite_out": ("tab:orange", "s"),
    "autograd": ("tab:purple", "^"), "F": ("tab:red", "s"),
    "roofline": ("black", "."), "roofline_out": ("gray", "."),
}


def write_plot(rows: list[dict], meta: dict[str, str], path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the plot (pip install matplotlib)", file=sys.stderr)
        return False
    threads = max(r["threads"] for r in rows)
    rows = [r for r in rows if r["threads"] == threads and r["reduction"] in ("none", "mean")]
    ops = [op for op in ALL_OPS if any(r["op"] == op for r in rows)]
    dtypes = [d for d in DTYPES if any(r["dtype"] == d for r in rows)]
    if not ops:
        return False
    fig, axes = plt.subplots(len(ops), len(dtypes), figsize=(6.5 * len(dtypes), 3.4 * len(ops)), squeeze=False)
    for i, op in enumerate(ops):
        for j, dtype in enumerate(dtypes):
            ax = axes[i][j]
            sel = [r for r in rows if r["op"] == op and r["dtype"] == dtype]
            # The roofline each variant of this op is compared with, per reduction.
            roof_rows = {}
            for r in sel:
                if r["roofline_op"]:
                    name, form = r["roofline_op"].split(" ")[0].split(":")
                    roof_rows[(name, form, r["reduction"])] = True
            series = {}
            for r in sel:
                series.setdefault((r["variant"], r["reduction"]), []).append(r)
            for (name, form, red) in roof_rows:
                series[("roofline" if form == "functional" else "roofline_out", red)] = [
                    r for r in rows if r["op"] == name and r["variant"] == form and r["dtype"] == dtype
                    and r["reduction"] == red]
            for (variant, red), pts in sorted(series.items()):
                pts = sorted(pts, key=lambda r: r["numel"])
                color, marker = STYLE.get(variant, ("tab:green", "x"))
                ax.plot([p["numel"] for p in pts], [p["GBps"] for p in pts], "-" if red == "none" else "--",
                        color=color, marker=marker, markersize=3.5, linewidth=1.2, label=f"{variant} ({red})")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{op}, {dtype}", fontsize=9)
            ax.set_xlabel("elements", fontsize=8)
            ax.set_ylabel("effective GB/s", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=6, ncol=2)
    fig.suptitle(f"npu_loss_ops {meta['npu_loss_ops']} (git {meta['git_sha']}), torch {meta['torch']}, "
                 f"{threads} threads, {meta['cpu_capability']}, {meta['cpu']}; solid: reduction none, "
                 f"dashed: mean ('sum' is in the CSV)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.25 / len(ops)))
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"sizes {', '.join(map(format_size, QUICK_SIZES))}, {TARGET_THREADS} threads, "
                             "fewer repeats (under two minutes)")
    parser.add_argument("--sizes", type=lambda s: [parse_size(v) for v in s.split(",")],
                        help="comma-separated element counts, e.g. 4K,1M,16M (default 4K..64M, x4)")
    parser.add_argument("--dtypes", type=lambda s: s.split(","), default=["float32", "bfloat16"],
                        help="comma-separated: float32, bfloat16, float16 (default float32,bfloat16)")
    parser.add_argument("--reductions", type=lambda s: s.split(","), default=list(REDUCTIONS),
                        help="comma-separated: none, mean, sum (default all three)")
    parser.add_argument("--ops", type=lambda s: s.split(","), default=ALL_OPS,
                        help=f"comma-separated subset of: {', '.join(ALL_OPS)}")
    parser.add_argument("--threads", type=lambda s: [int(v) for v in s.split(",")],
                        help=f"comma-separated thread counts (default: all ({torch.get_num_threads()}) and 1; "
                             f"--quick: {TARGET_THREADS})")
    parser.add_argument("--autograd", action=argparse.BooleanOptionalAction,
                        help="also time autograd's backward alone for the L1 and KL gradients (informative, no "
                             "target; default on, --quick off)")
    parser.add_argument("--repeats", type=int, help="samples per variant (default 21, --quick 5)")
    parser.add_argument("--min-repeats", type=int, help="samples per variant at least (default 7, --quick 3)")
    parser.add_argument("--max-variant-s", type=float,
                        help="cap on the timed seconds per variant and configuration, which bounds the repeats "
                             "at large sizes (default 1.0, --quick 0.15)")
    parser.add_argument("--sample-ms", type=float, help="target duration of one sample (default 10, --quick 4)")
    parser.add_argument("--check-max", type=parse_size, default=4 << 20,
                        help="check ours against a float64 reference up to this many elements (default 4M; the "
                             "same kernels run above, and the checks cost seconds there)")
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--name", help="output file stem (default bench_losses[_quick|_custom])")
    parser.add_argument("--table", help="where to write the markdown target table (default: a full run "
                        "benchmarks/README_table.md, --quick results/bench_losses_quick.md, others none)")
    args = parser.parse_args()

    for d in args.dtypes:
        if d not in DTYPES:
            parser.error(f"unknown dtype {d!r}; choose from {', '.join(DTYPES)}")
    for r in args.reductions:
        if r not in REDUCTIONS:
            parser.error(f"unknown reduction {r!r}; choose from {', '.join(REDUCTIONS)}")
    for op in args.ops:
        if op not in ALL_OPS:
            parser.error(f"unknown op {op!r}; choose from {', '.join(ALL_OPS)}")
    custom = args.sizes is not None or args.ops != ALL_OPS or args.threads is not None
    args.sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    all_threads = torch.get_num_threads()
    args.threads = args.threads or ([TARGET_THREADS] if args.quick else sorted({all_threads, 1}, reverse=True))
    args.repeats = args.repeats or (5 if args.quick else 21)
    args.min_repeats = min(args.min_repeats or (3 if args.quick else 7), args.repeats)
    if args.autograd is None:
        args.autograd = not args.quick
    args.max_variant_s = args.max_variant_s or (0.15 if args.quick else 1.0)
    args.sample_ms = args.sample_ms or (4.0 if args.quick else 10.0)
    name = args.name or "bench_losses" + ("_custom" if custom else "_quick" if args.quick else "")

    command = "python benchmarks/bench_losses.py" + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else "")
    meta = metadata(args, command)
    if float(meta["load_average_1min_start"]) > 0.5 * (os.cpu_count() or 1):
        print(f"warning: load average {meta['load_average_1min_start']} on {os.cpu_count()} CPUs; "
              "timings will be noisy", file=sys.stderr)
    warnings.filterwarnings("ignore", message="reduction: 'mean' divides the total loss")
    start = time.perf_counter()
    rows = run(args, meta)
    meta["wall_seconds"] = f"{time.perf_counter() - start:.0f}"
    meta["load_average_1min_end"] = f"{load_average():.2f}"

    print(f"npu_loss_ops {meta['npu_loss_ops']} (git {meta['git_sha']}, {meta['cpu_kernel_isa']}), "
          f"torch {meta['torch']} ({meta['cpu_capability']}), {meta['cpu']}, threads {meta['threads']}, "
          f"load {meta['load_average_1min_start']} -> {meta['load_average_1min_end']}")
    print_details(rows, args.sizes)
    targets, threads = evaluate_targets(rows, args.dtypes, args.reductions)
    print_targets(targets, threads, args.dtypes, args.reductions)

    os.makedirs(args.out_dir, exist_ok=True)
    csv_path = os.path.join(args.out_dir, name + ".csv")
    write_csv(rows, meta, csv_path)
    written = [csv_path]
    png_path = os.path.join(args.out_dir, name + ".png")
    if write_plot(rows, meta, png_path):
        written.append(png_path)
    if args.table is None and not custom:
        args.table = os.path.join(args.out_dir, name + ".md") if args.quick else os.path.join(HERE, "README_table.md")
    if args.table and targets:
        with open(args.table, "w") as f:
            f.write(markdown_targets(targets, threads, args.dtypes, args.reductions, meta,
                                     os.path.relpath(csv_path, REPO), os.path.relpath(png_path, REPO)))
        written.append(args.table)
    print(f"\nwrote {', '.join(os.path.relpath(p) for p in written)} (benchmark took {meta['wall_seconds']} s)")
    bad = [f"{r['op']} {r['variant']} {r['dtype']} {r['reduction']} {format_size(r['numel'])}"
           for r in rows if r["matches_reference"] is False]
    if bad:
        print("results that differ from the reference:\n  " + "\n  ".join(bad), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
