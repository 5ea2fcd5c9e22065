"""The timed callables of one configuration, and a correctness check for each of ours.

Per configuration (threads, dtype, reduction, size):

  backward ops (g full-size for 'none', 0-dim as autograd passes it for 'mean'/'sum'):
    smooth_l1_loss_backward      ours, ours_out (.grad_input)   vs  aten.smooth_l1_loss_backward, aten_out (.grad_input)
    huber_loss_backward          ours, ours_out (.out)          vs  aten.huber_loss_backward, aten_out (.out)
    l1_loss_backward             ours, ours_out (.grad_input)   vs  composite: torch.sgn(x - t) * g  ('mean': .div_(n)),
                                                                    composite_out (the last op with out=),
                                                                    autograd: torch.autograd.grad of F.l1_loss through
                                                                    the retained graph (the backward alone)
    kl_div_target_backward       ours, ours_out (.grad_target)  vs  composite: g * (torch.log(t) + 1 - x), composite_out,
    kl_div_target_backward[log]                                     autograd;  [log]: g * torch.exp(t) * (t + 1 - x)
  forward ops:
    smooth_l1_loss, huber_loss, l1_loss, kl_div, kl_div[log]   ours  vs  aten (torch.ops.aten.<op>, what F calls)
  a training step, reduction 'mean' only (x.grad = None before each):
    step:<loss>                  npu_loss_ops.<loss>(x, t).backward()  vs  F: torch.nn.functional.<loss>(x, t).backward()
                                 (kl_div: input and target both require grad, so the target-gradient kernel runs),
                                 compiled: torch.compile(F.<loss>, fullgraph=True, dynamic=False)(x, t).backward(),
                                 Inductor's fused forward and backward; compiled before the timing (setup_s: the
                                 first call's seconds), Dynamo reset before each configuration
  rooflines: an ATen op with the same number of read and write streams, through torch.ops like ours,
             allocating (functional) and preallocated (out=):
    roofline_3r1w   aten.addcmul(g, x, t)   backward 'none'
    roofline_2r1w   aten.add(x, t)          backward 'mean'/'sum' (g 0-dim), forward 'none'
    roofline_2r0w   forward 'mean'/'sum': float32 aten.dot(x, t); 16-bit floats: aten.sum of one (2, n) buffer
                    (both operands' bytes in one reduction), as aten.dot is not bandwidth-bound for bfloat16 on
                    CPU (~50x slower at 16M elements) and the sum was the fastest 2-read alternative measured.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

import npu_loss_ops

from .common import BACKWARD_OPS, BETA, DTYPES, FORWARD_OPS, REDUCTIONS, STEP_OPS, Config, backward_roofline, \
    forward_roofline

Check = Callable[[], bool]


@dataclass
class Variant:
    op: str
    variant: str  # ours, ours_out, aten, aten_out, composite, composite_out, autograd, F, functional, out
    fn: Callable[[], object]
    streams: int  # element streams of the op's minimal memory traffic, for the effective GB/s
    roofline: tuple[str, str] | None = None  # (roofline op, variant) this is compared with
    desc: str = ""  # rooflines: the ATen op as called
    setup_s: float | None = None  # compiled variants: seconds of the first call (compilation), not timed
    # Filled by timing.time_variants: the per-call time of every timed block, and each round's block size.
    times: list[float] = field(default_factory=list)
    block_sizes: list[int] = field(default_factory=list)
    cpu_per_wall: list[float] = field(default_factory=list)  # per round: the process's CPU s per wall s
    rounds: int = 0

    @property
    def key(self) -> tuple[str, str]:
        return self.op, self.variant


class Inputs:
    """The tensors of one configuration, shared by every variant (made once: 64M-element inputs take seconds)."""

    def __init__(self, cfg: Config):
        self.dtype, self.n = DTYPES[cfg.dtype], cfg.numel
        self.reduction, self.r = cfg.reduction, REDUCTIONS[cfg.reduction]
        gen = torch.Generator().manual_seed(0)
        n, dtype = self.n, self.dtype
        self.x = torch.randn(n, generator=gen).to(dtype)
        self.t = torch.randn(n, generator=gen).to(dtype)
        # KL: probabilities bounded away from 0 (autograd's xlogy gradient is NaN at 0), and their logs.
        self.tp = (torch.rand(n, generator=gen) * 0.98 + 0.01).to(dtype)
        self.tl = self.tp.log()
        none = cfg.reduction == "none"
        self.g = torch.randn(n, generator=gen).to(dtype) if none else torch.tensor(1.0, dtype=dtype)
        self.out = torch.empty(n, dtype=dtype)  # shared by every out= variant (they run one after another)
        self.out.zero_()  # fault its pages in
        self._f64: dict[str, torch.Tensor] = {}

    def f64(self, name: str) -> torch.Tensor:
        """A float64 copy of input `name` for the reference results, made on first use: the checks run after
        the timing, so the copies (twice the memory of the inputs) do not exist while anything is timed."""
        if name not in self._f64:
            self._f64[name] = getattr(self, name).double()
        return self._f64[name]

    def scaled(self, v: torch.Tensor) -> torch.Tensor:
        """A reference gradient of the sum, scaled as 'mean' scales it."""
        return v / self.n if self.reduction == "mean" else v

    def close(self, ours: torch.Tensor, ref: torch.Tensor) -> bool:
        """|ours - ref| <= tol * (|ref| + max |ref|) everywhere (torch.allclose is 10x slower at 16M)."""
        ref = ref.double()
        tol = 1e-5 if self.dtype == torch.float32 else 2e-2
        bound = ref.abs()
        scale = bound.max().item() if bound.numel() else 0.0
        bound.add_(scale).mul_(tol)
        return bool(torch.le(torch.sub(ours.double(), ref).abs_(), bound).all())


class VariantSet:
    """Collects the variants of one configuration and the checks of ours, keyed by (op, variant)."""

    def __init__(self, cfg: Config, with_autograd: bool, with_compile: bool):
        self.cfg, self.with_autograd, self.with_compile = cfg, with_autograd, with_compile
        self.inp = Inputs(cfg)
        self.variants: list[Variant] = []
        self.checks: dict[tuple[str, str], Check] = {}
        self.rooflines: set[str] = set()  # the rooflines the added ops are compared with

    def add(self, op: str, variant: str, fn: Callable[[], object], streams: int, roofline: str | None = None,
            desc: str = "", setup_s: float | None = None) -> None:
        """Adds a timed callable; `roofline` names the roofline op it is compared with, in the same form."""
        roof = None
        if roofline is not None:
            roof = (roofline, "out" if variant.endswith("_out") else "functional")
            self.rooflines.add(roofline)
        self.variants.append(Variant(op, variant, fn, streams, roof, desc=desc, setup_s=setup_s))

    def check(self, op: str, variant: str, ours: Callable[[], torch.Tensor], ref: Callable[[], torch.Tensor]):
        self.checks[(op, variant)] = lambda: self.inp.close(ours(), ref())


# Each add_* function adds one op's variants. They are separate functions so that each op's lambdas close over
# their own variables.


def add_aten_backward(vs: VariantSet, op: str) -> None:
    """smooth L1's, Huber's and MSE's gradients, against ATen's op of the same name and schema (beta / delta =
    1; MSE has no scalar)."""
    i, npu, aten = vs.inp, torch.ops.npu_loss, torch.ops.aten
    g, x, t, r, out = i.g, i.x, i.t, i.r, i.out
    s = () if op == "mse_loss_backward" else (BETA,)
    out_overload = "out" if op == "huber_loss_backward" else "grad_input"  # ATen's overload names
    fn, fn_out = getattr(npu, op), getattr(getattr(npu, op), out_overload)
    ref_fn, ref_out = getattr(aten, op), getattr(getattr(aten, op), out_overload)
    roof, streams = backward_roofline(i.reduction), backward_streams(i.reduction)
    vs.add(op, "ours", lambda: fn(g, x, t, r, *s), streams, roof)
    vs.add(op, "ours_out", lambda: fn_out(g, x, t, r, *s, grad_input=out), streams, roof)
    vs.add(op, "aten", lambda: ref_fn(g, x, t, r, *s), streams, roof)
    vs.add(op, "aten_out", lambda: ref_out(g, x, t, r, *s, grad_input=out), streams, roof)
    ref = lambda: ref_fn(i.f64("g"), i.f64("x"), i.f64("t"), r, *s)  # noqa: E731
    vs.check(op, "ours", lambda: fn(g, x, t, r, *s), ref)
    vs.check(op, "ours_out", lambda: fn_out(g, x, t, r, *s, grad_input=out.clone()), ref)


def add_l1_backward(vs: VariantSet, op: str) -> None:
    i, npu = vs.inp, torch.ops.npu_loss
    g, x, t, r, out, n = i.g, i.x, i.t, i.r, i.out, i.n
    fn, fn_out = npu.l1_loss_backward, npu.l1_loss_backward.grad_input
    roof, streams = backward_roofline(i.reduction), backward_streams(i.reduction)
    # The composite autograd runs for F.l1_loss: sgn(x - t) * g, then the division of 'mean'.
    if i.reduction == "mean":
        comp = lambda: (torch.sgn(x - t) * g).div_(n)  # noqa: E731
        comp_out = lambda: torch.mul(torch.sgn(x - t), g, out=out).div_(n)  # noqa: E731
    else:
        comp = lambda: torch.sgn(x - t) * g  # noqa: E731
        comp_out = lambda: torch.mul(torch.sgn(x - t), g, out=out)  # noqa: E731
    vs.add(op, "ours", lambda: fn(g, x, t, r), streams, roof)
    vs.add(op, "ours_out", lambda: fn_out(g, x, t, r, grad_input=out), streams, roof)
    vs.add(op, "composite", comp, streams, roof)
    vs.add(op, "composite_out", comp_out, streams, roof)
    if vs.with_autograd:
        xr = x.detach().requires_grad_()
        graph = F.l1_loss(xr, t, reduction=i.reduction)
        vs.add(op, "autograd", lambda: torch.autograd.grad(graph, xr, g, retain_graph=True), streams, roof)
    ref = lambda: i.scaled(torch.sgn(i.f64("x") - i.f64("t")) * i.f64("g"))  # noqa: E731
    vs.check(op, "ours", lambda: fn(g, x, t, r), ref)
    vs.check(op, "ours_out", lambda: fn_out(g, x, t, r, grad_input=out.clone()), ref)


def add_kl_target_backward(vs: VariantSet, op: str, log_target: bool) -> None:
    i, npu = vs.inp, torch.ops.npu_loss
    g, x, r, out, n = i.g, i.x, i.r, i.out, i.n
    tk, tname = (i.tl, "tl") if log_target else (i.tp, "tp")
    fn, fn_out = npu.kl_div_target_backward, npu.kl_div_target_backward.grad_target
    roof, streams = backward_roofline(i.reduction), backward_streams(i.reduction)
    # The composite autograd runs for F.kl_div's target gradient, then the division of 'mean'.
    if log_target:
        formula = lambda: g * torch.exp(tk) * (tk + 1 - x)  # noqa: E731
        formula_out = lambda: torch.mul(g * torch.exp(tk), tk + 1 - x, out=out)  # noqa: E731
        ref = lambda: i.scaled(i.f64("g") * torch.exp(i.f64(tname)) * (i.f64(tname) + 1 - i.f64("x")))  # noqa: E731
    else:
        formula = lambda: g * (torch.log(tk) + 1 - x)  # noqa: E731
        formula_out = lambda: torch.mul(g, torch.log(tk) + 1 - x, out=out)  # noqa: E731
        ref = lambda: i.scaled(i.f64("g") * (torch.log(i.f64(tname)) + 1 - i.f64("x")))  # noqa: E731
    if i.reduction == "mean":
        comp, comp_out = (lambda: formula().div_(n)), (lambda: formula_out().div_(n))
    else:
        comp, comp_out = formula, formula_out
    vs.add(op, "ours", lambda: fn(g, x, tk, r, log_target), streams, roof)
    vs.add(op, "ours_out", lambda: fn_out(g, x, tk, r, log_target, grad_target=out), streams, roof)
    vs.add(op, "composite", comp, streams, roof)
    vs.add(op, "composite_out", comp_out, streams, roof)
    if vs.with_autograd:
        tr = tk.detach().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # KL's 'mean' deprecation warning
            graph = F.kl_div(x, tr, reduction=i.reduction, log_target=log_target)
        vs.add(op, "autograd", lambda: torch.autograd.grad(graph, tr, g, retain_graph=True), streams, roof)
    vs.check(op, "ours", lambda: fn(g, x, tk, r, log_target), ref)
    vs.check(op, "ours_out", lambda: fn_out(g, x, tk, r, log_target, grad_target=out.clone()), ref)


def add_forward(vs: VariantSet, op: str) -> None:
    i, npu, aten = vs.inp, torch.ops.npu_loss, torch.ops.aten
    x, t, tp, tl, r = i.x, i.t, i.tp, i.tl, i.r
    # op -> (ours, ATen's, the float64 reference), called as F calls ATen
    ours, theirs, ref = {
        "smooth_l1_loss": (lambda: npu.smooth_l1_loss(x, t, r, BETA), lambda: aten.smooth_l1_loss(x, t, r, BETA),
                           lambda: aten.smooth_l1_loss(i.f64("x"), i.f64("t"), r, BETA)),
        "huber_loss": (lambda: npu.huber_loss(x, t, r, BETA), lambda: aten.huber_loss(x, t, r, BETA),
                       lambda: aten.huber_loss(i.f64("x"), i.f64("t"), r, BETA)),
        "l1_loss": (lambda: npu.l1_loss(x, t, r), lambda: aten.l1_loss(x, t, r),
                    lambda: aten.l1_loss(i.f64("x"), i.f64("t"), r)),
        "mse_loss": (lambda: npu.mse_loss(x, t, r), lambda: aten.mse_loss(x, t, r),
                     lambda: aten.mse_loss(i.f64("x"), i.f64("t"), r)),
        "kl_div": (lambda: npu.kl_div(x, tp, r), lambda: aten.kl_div(x, tp, r),
                   lambda: aten.kl_div(i.f64("x"), i.f64("tp"), r)),
        "kl_div[log]": (lambda: npu.kl_div(x, tl, r, log_target=True),
                        lambda: aten.kl_div(x, tl, r, log_target=True),
                        lambda: aten.kl_div(i.f64("x"), i.f64("tl"), r, log_target=True)),
    }[op]
    roof = forward_roofline(i.reduction)
    streams = 3 if i.reduction == "none" else 2
    vs.add(op, "ours", ours, streams, roof)
    vs.add(op, "aten", theirs, streams, roof)
    vs.check(op, "ours", ours, ref)


def add_step(vs: VariantSet, op: str) -> None:
    """A forward + backward training step with reduction 'mean', ours against torch.nn.functional."""
    i = vs.inp
    # op -> (our loss, F's loss, whether the target requires grad too, element streams: x, t, x.grad and
    # (KL) t.grad, each read or written once in the forward and once in the backward, roughly)
    ours, theirs, both, streams = {
        "step:smooth_l1_loss": (npu_loss_ops.smooth_l1_loss, F.smooth_l1_loss, False, 5),
        "step:huber_loss": (npu_loss_ops.huber_loss, F.huber_loss, False, 5),
        "step:mse_loss": (npu_loss_ops.mse_loss, F.mse_loss, False, 5),
        "step:l1_loss": (npu_loss_ops.l1_loss, F.l1_loss, False, 5),
        "step:kl_div": (npu_loss_ops.kl_div, F.kl_div, True, 6),
    }[op]
    xs = i.x.detach().requires_grad_()
    ts = i.tp.detach().requires_grad_() if both else i.t

    def step(loss_fn):
        def run():
            xs.grad = None
            if both:
                ts.grad = None
            loss_fn(xs, ts).backward()
        return run

    def grads(loss_fn) -> list[torch.Tensor]:
        step(loss_fn)()
        return [xs.grad.clone()] + ([ts.grad.clone()] if both else [])

    vs.add(op, "ours", step(ours), streams)
    vs.add(op, "F", step(theirs), streams)
    if vs.with_compile:
        compiled = torch.compile(theirs, fullgraph=True, dynamic=False)
        start = time.perf_counter()
        step(compiled)()  # compiles the forward and, through AOTAutograd, the backward
        setup_s = time.perf_counter() - start
        vs.add(op, "compiled", step(compiled), streams, setup_s=setup_s)
        vs.checks[(op, "compiled")] = lambda: all(i.close(a, b) for a, b in zip(grads(compiled), grads(theirs)))
    # F's gradients in the same dtype are the reference here (a float64 step would need float64 leaves).
    vs.checks[(op, "ours")] = lambda: all(i.close(a, b) for a, b in zip(grads(ours), grads(theirs)))


def add_rooflines(vs: VariantSet) -> None:
    """The rooflines the ops added so far are compared with."""
    i, aten = vs.inp, torch.ops.aten
    g, x, t, out = i.g, i.x, i.t, i.out
    if "roofline_3r1w" in vs.rooflines:
        vs.add("roofline_3r1w", "functional", lambda: aten.addcmul(g, x, t), 4, desc="aten.addcmul(g, x, t)")
        vs.add("roofline_3r1w", "out", lambda: aten.addcmul.out(g, x, t, out=out), 4, desc="aten.addcmul.out")
    if "roofline_2r1w" in vs.rooflines:
        vs.add("roofline_2r1w", "functional", lambda: aten.add.Tensor(x, t), 3, desc="aten.add(x, t)")
        vs.add("roofline_2r1w", "out", lambda: aten.add.out(x, t, out=out), 3, desc="aten.add.out")
    if "roofline_2r0w" in vs.rooflines:
        if i.dtype == torch.float32:
            vs.add("roofline_2r0w", "functional", lambda: aten.dot(x, t), 2, desc="aten.dot(x, t)")
        else:  # aten.dot is not bandwidth-bound for 16-bit floats on CPU (~50x slower than this)
            both = torch.stack([x, t])
            vs.add("roofline_2r0w", "functional", lambda: aten.sum.default(both), 2,
                   desc="aten.sum of a (2, n) buffer")


def backward_streams(reduction: str) -> int:
    return 4 if reduction == "none" else 3


BACKWARD_BUILDERS = {
    "smooth_l1_loss_backward": add_aten_backward,
    "huber_loss_backward": add_aten_backward,
    "mse_loss_backward": add_aten_backward,
    "l1_loss_backward": add_l1_backward,
    "kl_div_target_backward": lambda vs, op: add_kl_target_backward(vs, op, log_target=False),
    "kl_div_target_backward[log]": lambda vs, op: add_kl_target_backward(vs, op, log_target=True),
}
assert list(BACKWARD_BUILDERS) == BACKWARD_OPS


def build_variants(cfg: Config, ops: list[str], with_autograd: bool = True, with_compile: bool = True
                   ) -> tuple[list[Variant], dict[tuple[str, str], Check]]:
    """The timed callables of one configuration and, per (op, variant) of ours, a correctness check."""
    vs = VariantSet(cfg, with_autograd, with_compile)
    if with_compile:
        torch._dynamo.reset()  # each configuration compiles its own graphs, never hitting the recompile limit
    for op in BACKWARD_OPS:
        if op in ops:
            BACKWARD_BUILDERS[op](vs, op)
    for op in FORWARD_OPS:
        if op in ops:
            add_forward(vs, op)
    if cfg.reduction == "mean":  # the training steps use 'mean' only, as training does
        for op in STEP_OPS:
            if op in ops:
                add_step(vs, op)
    add_rooflines(vs)
    return vs.variants, vs.checks
