"""Autograd and torch.func overhead of npu_loss_ops against torch.nn.functional, on small tensors.

One run, every variant interleaved round-robin (rotating start), each round a
torch.utils.benchmark.Timer.blocked_autorange; the per-call times of all rounds give the median and the
p20/p80 spread. Measured, float32, reduction 'mean':

  step:<loss>        4K elements: loss(x, t).backward() (KL: x and t require grad), x.grad = None first
  per-sample:<loss>  64x64 batch: torch.func.vmap(torch.func.grad(loss))(x, t), 64 per-sample gradients of
                     64-element predictions
  per-sample-params:<loss>
                     the torch.func tutorial's pattern: vmap(grad(loss of functional_call(Linear(64, 64))),
                     in_dims=(None, 0, 0)) over a 64x64 batch
  vmap-rule:<op>     64x64: vmap of the op through the package's C++ FuncTorchBatched rule, against the same rule
                     written in Python with torch.library.register_vmap (on a mirror op that calls ours), the
                     choice the package made
  enabled:<loss>     4K and 16M elements: the step above written with F (F.<loss>(x, t).backward()) under
                     npu_loss_ops.enable(), against npu_loss_ops.<loss>'s own step: what the routing kernels
                     (csrc/enable/aten_kernels.cpp) add to a call. The floor is F's own Python prelude (argument checks,
                     the reduction's name to its enum), which runs either way.

Targets: step <= 0.95x F's time, per-sample <= 1.2x F's time, enabled <= 1.05x the package's own step.
Prints a markdown table (and writes it to --markdown). --sections picks the measurements (all by default);
the enabled rows are meant for --threads 2 --clock wall (the 16M step runs on both cores).

--clock wall (the default) times wall-clock; --clock thread times the CPU time of the calling thread
(time.thread_time). Nothing measured here is big enough to run in parallel (4K elements is far below ATen's
parallel grain) and the CPU autograd engine runs on the calling thread, so on a machine shared with other
work the thread clock measures the same work without the time spent waiting for a core; use it with
--threads 1, so that no work runs on another thread.

    python benchmarks/bench_autograd.py [--rounds 7] [--min-run-time 0.05] [--threads 2] [--clock wall|thread]
                                        [--sections step,per-sample,...] [--markdown PATH]
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

import npu_loss_ops
from bench_common import cpu_model, git_revision, quantile  # the same run metadata as the kernel benchmark

LOSSES = ("smooth_l1_loss", "huber_loss", "mse_loss", "l1_loss", "kl_div")
SECTIONS = ("step", "per-sample", "per-sample-params", "vmap-rule", "enabled")
ENABLED = "F under enable()"  # the variants timed with npu_loss_ops.enable() on


def inputs(loss: str, shape, requires_grad_target: bool = False):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen)
    if loss == "kl_div":
        x = x.log_softmax(-1)
        t = torch.rand(shape, generator=gen).softmax(-1)
    else:
        t = torch.randn(shape, generator=gen)
    return x, (t.requires_grad_() if requires_grad_target else t)


# ---------------------------------------------------------------------------------------------------- variants


def step_fn(loss: str, fn, n: int):
    """One forward + backward step of fn on n elements (KL: the target requires grad too), own inputs."""
    both = loss == "kl_div"
    x, t = inputs(loss, (n,), requires_grad_target=both)
    x.requires_grad_()

    def run():
        x.grad = None
        if both:
            t.grad = None
        fn(x, t).backward()

    return run


def step_variants(n: int):
    return {(f"step:{loss}", impl): step_fn(loss, getattr(mod, loss), n)
            for loss in LOSSES for impl, mod in (("ours", npu_loss_ops), ("F", F))}


def enabled_variants(sizes):
    """The same step: F under enable() against the package's own function."""
    return {(f"enabled:{loss}@{n}", impl): step_fn(loss, getattr(mod, loss), n)
            for n in sizes for loss in LOSSES for impl, mod in (("ours", npu_loss_ops), (ENABLED, F))}


def per_sample_variants(batch: int, features: int):
    out = {}
    for loss in LOSSES:
        x, t = inputs(loss, (batch, features))
        for impl, mod in (("ours", npu_loss_ops), ("F", F)):
            per_sample = torch.func.vmap(torch.func.grad(getattr(mod, loss)))
            out[(f"per-sample:{loss}", impl)] = lambda f=per_sample, x=x, t=t: f(x, t)
    return out


def per_sample_param_variants(batch: int, features: int):
    out = {}
    torch.manual_seed(0)
    model = torch.nn.Linear(features, features)
    params = {k: v.detach() for k, v in model.named_parameters()}
    for loss in LOSSES:
        x, t = inputs(loss, (batch, features))
        for impl, mod in (("ours", npu_loss_ops), ("F", F)):
            loss_fn = getattr(mod, loss)

            def compute(params, xi, ti, loss_fn=loss_fn, log_softmax=loss == "kl_div"):
                out = torch.func.functional_call(model, params, (xi.unsqueeze(0),))
                return loss_fn(out.log_softmax(-1) if log_softmax else out, ti.unsqueeze(0))

            per_sample = torch.func.vmap(torch.func.grad(compute), in_dims=(None, 0, 0))
            out[(f"per-sample-params:{loss}", impl)] = lambda f=per_sample, x=x, t=t: f(params, x, t)
    return out


def python_vmap_mirror():
    """torch.ops.npu_loss_bench.smooth_l1_loss(_backward): our ops behind a Python torch.library.register_vmap
    rule that does what csrc/autograd/vmap.h does."""
    lib = torch.library.Library("npu_loss_bench", "DEF")
    lib.define("smooth_l1_loss(Tensor self, Tensor target, int reduction, float beta) -> Tensor")
    lib.define(
        "smooth_l1_loss_backward(Tensor grad_output, Tensor self, Tensor target, int reduction, float beta) -> Tensor")
    lib.impl("smooth_l1_loss", torch.ops.npu_loss.smooth_l1_loss, "CompositeExplicitAutograd")
    lib.impl("smooth_l1_loss_backward", torch.ops.npu_loss.smooth_l1_loss_backward, "CompositeExplicitAutograd")

    def front(t, d, rank):
        if d is None:
            return t
        t = t.movedim(d, 0)
        return t.reshape(t.shape[:1] + (1,) * (rank - (t.dim() - 1)) + t.shape[1:])

    def forward_rule(info, in_dims, x, t, reduction, beta):
        rank = max(a.dim() - (d is not None) for a, d in zip((x, t), in_dims))
        values = torch.ops.npu_loss.smooth_l1_loss(front(x, in_dims[0], rank), front(t, in_dims[1], rank), 0, beta)
        if reduction == 0:
            return values, 0
        rows = values.reshape(values.shape[0], -1)
        return (rows.mean(1) if reduction == 1 else rows.sum(1)), 0

    def backward_rule(info, in_dims, g, x, t, reduction, beta):
        rank = max(a.dim() - (d is not None) for a, d in zip((g, x, t), in_dims))
        g = front(g, in_dims[0], rank)
        if reduction == 1:
            g = g / (x.numel() // (x.shape[in_dims[1]] if in_dims[1] is not None else 1))
        return torch.ops.npu_loss.smooth_l1_loss_backward(
            g, front(x, in_dims[1], rank), front(t, in_dims[2], rank), 2, beta), 0

    torch.library.register_vmap("npu_loss_bench::smooth_l1_loss", forward_rule, lib=lib)
    torch.library.register_vmap("npu_loss_bench::smooth_l1_loss_backward", backward_rule, lib=lib)
    return lib


def vmap_rule_variants(batch: int, features: int):
    out = {}
    x, t = inputs("smooth_l1_loss", (batch, features))
    g = torch.randn(batch)
    for impl, ns in (("C++", torch.ops.npu_loss), ("Python", torch.ops.npu_loss_bench)):
        fwd = torch.func.vmap(lambda a, b, op=ns.smooth_l1_loss: op(a, b, 1, 1.0))
        bwd = torch.func.vmap(lambda c, a, b, op=ns.smooth_l1_loss_backward: op(c, a, b, 1, 1.0))
        out[("vmap-rule:smooth_l1_loss", impl)] = lambda f=fwd: f(x, t)
        out[("vmap-rule:smooth_l1_loss_backward", impl)] = lambda f=bwd: f(g, x, t)
    return out


def check_results(variants) -> None:
    """Ours and the reference compute the same gradients (a benchmark of wrong results means nothing)."""
    for (name, impl), fn in variants.items():
        if impl in ("ours", "C++") and name.startswith(("per-sample", "vmap-rule")):
            ref = variants[(name, "F" if impl == "ours" else "Python")]
            a, b = fn(), ref()
            for u, v in zip(torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)):
                torch.testing.assert_close(u, v, rtol=1e-4, atol=1e-6, msg=f"{name}: results differ")


# ------------------------------------------------------------------------------------------------------ timing


CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def routing(key):
    """enable() for the variants that measure it (a switch is not timed), nothing for the others."""
    return npu_loss_ops.enable() if key[1] == ENABLED else contextlib.nullcontext()


def time_interleaved(variants, rounds: int, min_run_time: float, clock: str) -> dict:
    keys = list(variants)
    samples = {k: [] for k in keys}
    for k, fn in variants.items():  # warm up (and trigger every lazy initialisation)
        with routing(k):
            for _ in range(3):
                fn()
    for r in range(rounds):
        start = r % len(keys)
        for k in keys[start:] + keys[:start]:
            # Timer sets torch's thread count to its num_threads (default 1) while it measures: pass --threads.
            timer = Timer(stmt="fn()", globals={"fn": variants[k]}, timer=CLOCKS[clock],
                          num_threads=torch.get_num_threads())
            with routing(k):
                m = timer.blocked_autorange(min_run_time=min_run_time)
            samples[k].extend(m.times)
        print(f"  round {r + 1}/{rounds} done", file=sys.stderr)
    return samples


def stats_us(times: list[float]) -> tuple[float, float, float]:
    return tuple(1e6 * v for v in (statistics.median(times), quantile(times, 0.2), quantile(times, 0.8)))


TARGETS = {"step": 0.95, "per-sample": 1.2, "enabled": 1.05}


def table(samples, args) -> str:
    info = npu_loss_ops.build_info()
    command = " ".join(["python benchmarks/bench_autograd.py", *sys.argv[1:]])
    lines = [
        f"Measured with `{command}` on {datetime.date.today().isoformat()}: "
        f"npu_loss_ops {npu_loss_ops.__version__} (git {git_revision()}, CPU kernels {info['cpu_kernel_isa']}), "
        f"torch {torch.__version__}, {cpu_model()}, {os.cpu_count()} logical CPUs, "
        f"{torch.get_num_threads()} thread{'s' if torch.get_num_threads() != 1 else ''}, "
        f"1-minute load average {args.load_start:.2f} at the start and {os.getloadavg()[0]:.2f} at the end; "
        f"{args.rounds} interleaved rounds of blocked_autorange, "
        f"{'wall-clock' if args.clock == 'wall' else 'CPU time of the calling thread'}, median [p20, p80] per call.",
        "",
        "| measurement (float32, 'mean') | measured µs | reference µs | measured / reference | target | result |",
        "|---|---:|---:|---:|---:|---|",
    ]
    names = list(dict.fromkeys(name for name, _ in samples))
    for name in names:
        kind = name.split(":")[0]
        ours_key, ref_key = {
            "vmap-rule": ((name, "C++"), (name, "Python")),
            "enabled": ((name, ENABLED), (name, "ours")),
        }.get(kind, ((name, "ours"), (name, "F")))
        o, r = stats_us(samples[ours_key]), stats_us(samples[ref_key])
        ratio = o[0] / r[0]
        limit = TARGETS.get(kind)
        verdict = "–" if limit is None else ("PASS" if ratio <= limit else "**MISS**")
        ref_name = "Python register_vmap" if kind == "vmap-rule" else "F"
        what, _, size = name.split(":")[1].partition("@")
        label = {
            "step": "4K fwd+bwd step",
            "per-sample": "64x64 vmap(grad) per-sample",
            "per-sample-params": "64x64 per-sample Linear(64, 64) params",
            "vmap-rule": "64x64 vmap, C++ rule vs " + ref_name,
            "enabled": "{size} step, F under enable() vs the package's own",
        }[kind]
        if kind == "enabled":
            n = int(size)
            label = label.format(size=f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K")
        lines.append(
            f"| {label}: `{what}` | {o[0]:.1f} [{o[1]:.1f}, {o[2]:.1f}] | "
            f"{r[0]:.1f} [{r[1]:.1f}, {r[2]:.1f}] | {ratio:.2f} | {'–' if limit is None else f'≤ {limit}'} | "
            f"{verdict} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-run-time", type=float, default=0.05, help="seconds per blocked_autorange")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated measurements to run, of {', '.join(SECTIONS)} (default: all)")
    args = parser.parse_args()
    args.load_start = os.getloadavg()[0]
    # KL's 'mean' deprecation warning (PyTorch's own, reproduced by the package) on every call.
    warnings.filterwarnings("ignore", message="reduction: 'mean' divides the total loss")
    torch.set_num_threads(args.threads)
    sections = args.sections.split(",")
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"--sections: unknown {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    python_vmap_mirror_lib = python_vmap_mirror()  # noqa: F841  (kept alive for the whole run)
    builders = {
        "step": lambda: step_variants(4096),
        "per-sample": lambda: per_sample_variants(64, 64),
        "per-sample-params": lambda: per_sample_param_variants(64, 64),
        "vmap-rule": lambda: vmap_rule_variants(64, 64),
        "enabled": lambda: enabled_variants((4096, 1 << 24)),
    }
    variants = {}
    for section in sections:
        variants.update(builders[section]())
    check_results(variants)
    samples = time_interleaved(variants, args.rounds, args.min_run_time, args.clock)
    text = table(samples, args)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
