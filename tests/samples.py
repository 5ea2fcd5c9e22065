"""The one sample generator every test kind uses.

A `Sample` is one call of one loss: its `self`/`target` (and a `grad_output` for the backward op), a
reduction, beta (smooth L1), delta (Huber) or log_target (KL), and a `differentiable` flag that is True only
when every broadcast element is far from the kinks (|d| == 0 for L1 and smooth L1, |d| == beta for smooth L1,
|d| == delta for Huber, target <= 0 for KL with a probability target; MSE has none), so gradcheck/gradgradcheck can use
it. Huber's delta is kept in the `beta` field (both are the width of the quadratic zone; `Sample.delta`
reads it), so the code shared by the two needs no second branch.

Sources:
  * `samples(loss, ...)`: our own grid over shapes (0-dim, empty, 1, odd sizes, broadcast among all three
    arguments, 8-dim, multi-chunk sizes), layouts (transposed, sliced with a step, expanded), dtypes,
    reductions, betas and log_target.
  * `opinfo_samples(loss, ...)`: PyTorch's own OpInfo samples, converted to the same `Sample`.

Every tensor is made from a seeded generator, so the samples are the same on every run.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import zlib
from typing import Iterator

import torch

from npu_loss_ops import _C
from npu_loss_ops._reduction import REDUCTION_ENUMS

# The elementwise losses and their ops, read from their declarations (csrc/losses.h, through _C._losses()), so a
# new loss reaches every test that iterates over LOSSES; test_registration checks the declared schemas against
# ATen's. The row losses (the distillation family) have their own tests (test_distillation.py).
_DECLS = {d["forward"]: d for d in _C._losses() if d["kind"] == "elementwise"}
LOSSES = tuple(_DECLS)
BACKWARD_OP = {loss: d["backward"] for loss, d in _DECLS.items()}
# The out= overload's name (ATen's: "grad_input" for smooth L1, L1 and MSE, "out" for Huber) ...
OUT_OVERLOAD = {loss: d["out_overload"] for loss, d in _DECLS.items()}
# ... and the name of its out tensor.
OUT_ARG = {loss: d["out_arg"] for loss, d in _DECLS.items()}
# Each loss's scalar argument (beta, delta, log_target) or None.
SCALAR = {loss: d["scalar"] for loss, d in _DECLS.items()}
# The losses with a width parameter (smooth L1's beta, Huber's delta), kept in Sample.beta.
WIDTH_LOSSES = ("smooth_l1_loss", "huber_loss")
# The ops' reductions by name, with their int (the package's own table).
REDUCTIONS = REDUCTION_ENUMS
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
BETAS = (0.0, 0.5, 1.0, 2.0)
# Huber's deltas (> 0; inf gives 0.5 * d**2 everywhere), and the ones the checks reject (ValueError).
DELTAS = (1e-3, 0.25, 1.0, 3.0, 1e4, math.inf)
BAD_DELTAS = (0.0, -1.0, math.nan)

# How far from a kink every element of a differentiable sample stays (gradcheck's eps is 1e-6).
KINK_MARGIN = 1e-2


@dataclasses.dataclass
class Sample:
    loss: str
    self: torch.Tensor
    target: torch.Tensor
    grad_output: torch.Tensor
    reduction: str = "mean"  # "none" | "mean" | "sum" | "batchmean" (KL's functional API only)
    beta: float = 1.0  # smooth L1's beta, or Huber's delta
    log_target: bool = False
    differentiable: bool = False
    name: str = ""

    # ---- what is called ----
    @property
    def delta(self) -> float:
        """Huber's delta (stored in `beta`)."""
        return self.beta

    @property
    def reduction_enum(self) -> int:
        return REDUCTIONS[self.reduction]

    @property
    def op_compatible(self) -> bool:
        """False for 'batchmean', which only the functional API knows."""
        return self.reduction in REDUCTIONS

    @property
    def broadcast_shape(self) -> torch.Size:
        return torch.broadcast_shapes(self.self.shape, self.target.shape)

    @property
    def backward_shape(self) -> torch.Size:
        return torch.broadcast_shapes(self.grad_output.shape, self.self.shape, self.target.shape)

    def forward_op(self):
        return getattr(torch.ops.npu_loss, self.loss).default

    def run_forward(self, self_=None, target=None) -> torch.Tensor:
        """torch.ops.npu_loss.<loss> on this sample (or on other self/target tensors)."""
        args, kwargs = self.forward_args(self_, target)
        return self.forward_op()(*args, **kwargs)

    def run_backward(self, grad_output=None, self_=None, target=None) -> torch.Tensor:
        """The loss's backward op on this sample (or on other grad_output/self/target tensors)."""
        args, kwargs = self.backward_args(grad_output, self_, target)
        return self.backward_op()(*args, **kwargs)

    def backward_op(self):
        return getattr(torch.ops.npu_loss, BACKWARD_OP[self.loss]).default

    def out_op(self):
        return getattr(getattr(torch.ops.npu_loss, BACKWARD_OP[self.loss]), OUT_OVERLOAD[self.loss])

    @property
    def out_name(self) -> str:
        return OUT_ARG[self.loss]

    def forward_args(self, self_=None, target=None):
        """(args, kwargs) for torch.ops.npu_loss.<loss>."""
        x = self.self if self_ is None else self_
        t = self.target if target is None else target
        if self.loss in WIDTH_LOSSES:
            return (x, t, self.reduction_enum, self.beta), {}
        if SCALAR[self.loss] is None:
            return (x, t, self.reduction_enum), {}
        return (x, t, self.reduction_enum), {"log_target": self.log_target}

    def backward_args(self, grad_output=None, self_=None, target=None):
        """(args, kwargs) for torch.ops.npu_loss.<loss>_backward (kl: kl_div_target_backward); smooth L1's and
        Huber's take beta/delta last, positionally, as their schemas order them."""
        g = self.grad_output if grad_output is None else grad_output
        x = self.self if self_ is None else self_
        t = self.target if target is None else target
        if self.loss in WIDTH_LOSSES:
            return (g, x, t, self.reduction_enum, self.beta), {}
        if SCALAR[self.loss] is None:
            return (g, x, t, self.reduction_enum), {}
        return (g, x, t, self.reduction_enum, self.log_target), {}

    def functional_kwargs(self) -> dict:
        """Keyword arguments for npu_loss_ops.<loss> and torch.nn.functional.<loss>."""
        return functional_kwargs(self.loss, self.reduction, self.beta, self.log_target)

    # ---- helpers ----
    def map_tensors(self, fn) -> "Sample":
        return dataclasses.replace(
            self, self=fn(self.self), target=fn(self.target), grad_output=fn(self.grad_output)
        )

    def to(self, device) -> "Sample":
        """The same sample on `device`, every tensor the same kind of view it is here (see `to_device`)."""
        return self.map_tensors(lambda t: to_device(t, device))

    @property
    def has_float64(self) -> bool:
        """float64 anywhere: rejected on the NPU (TypeError, docs/validation.md), so value tests skip it there."""
        return torch.float64 in (self.self.dtype, self.target.dtype, self.grad_output.dtype)

    @property
    def dtype(self) -> torch.dtype:
        """The lowest-precision dtype among the inputs (picks the tolerance)."""
        return lowest_precision(self.self.dtype, self.target.dtype, self.grad_output.dtype)

    def features(self) -> set:
        """What this sample covers (the device suite keeps a subset of samples that covers all of it): the
        op, dtypes, reduction, beta class / log_target, shapes (the broadcast kinds), grad_output's kind and
        the layouts, alone and in the pairs that choose different code paths."""
        loss = self.loss
        dtypes = tuple(str(t.dtype).removeprefix("torch.") for t in (self.self, self.target, self.grad_output))
        variant = f"logt={self.log_target}" if loss == "kl_div" else (
            f"beta={self.beta:g}" if loss == "smooth_l1_loss" else (
                f"delta={self.beta:g}" if loss == "huber_loss" else ""))
        if self.grad_output.shape == self.backward_shape:
            gkind = "full" if self.grad_output.dim() else "0dim"
        elif self.backward_shape != self.broadcast_shape:
            gkind = "enlarging"
        else:
            gkind = "0dim" if self.grad_output.dim() == 0 else "partial"
        layouts = tuple(layout_kind(t) for t in (self.self, self.target, self.grad_output))
        shapes = (tuple(self.self.shape), tuple(self.target.shape))
        zero_target = loss == "kl_div" and bool((self.target == 0).any())
        return {
            ("dtypes", loss, dtypes),
            ("reduction", loss, self.reduction),
            ("variant", loss, variant),
            ("shapes", loss, shapes),
            ("grad_output", loss, gkind),
            ("layouts", loss, layouts),
            ("zero_target", loss, zero_target),
            ("dtype-reduction", loss, dtypes[0], self.reduction),
            ("variant-reduction", loss, variant, self.reduction),
            ("layout-dtype", loss, layouts[0], dtypes[0]),
            ("grad_output-reduction", loss, gkind, self.reduction),
        }

    def __repr__(self) -> str:
        return f"Sample({self.name})"


def functional_kwargs(loss: str, reduction: str, beta: float, log_target: bool) -> dict:
    """Keyword arguments for npu_loss_ops.<loss> and torch.nn.functional.<loss>: the reduction, and beta
    (smooth L1), delta (Huber, passed as `beta`) or log_target (KL) where the loss has it."""
    kwargs = {"reduction": reduction}
    if loss == "smooth_l1_loss":
        kwargs["beta"] = beta
    if loss == "huber_loss":
        kwargs["delta"] = beta
    if loss == "kl_div":
        kwargs["log_target"] = log_target
    return kwargs


def lowest_precision(*dtypes: torch.dtype) -> torch.dtype:
    order = [torch.bfloat16, torch.float16, torch.float32, torch.float64]
    return min(dtypes, key=order.index)


# ---------------------------------------------------------------------------------------------------
# Tensor construction


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _values(shape, gen: torch.Generator, kind: str) -> torch.Tensor:
    """float64 values: 'signed' in [-3, 3], 'prob' in [0.1, 1], 'logprob' in [-3, 0]."""
    u = torch.rand(shape, generator=gen, dtype=torch.float64)
    if kind == "signed":
        return u * 6 - 3
    if kind == "prob":
        return u * 0.9 + 0.1
    return u * -3


def make_layout(values: torch.Tensor, layout: str) -> torch.Tensor:
    """`values` (contiguous) re-laid out: the same shape and values, different strides. Every layout but
    "contiguous" is a non-contiguous view wherever one exists (more than one element), so the kernels' strided
    paths see it."""
    if layout == "contiguous" or values.dim() == 0 or values.numel() == 0:
        return values.clone()
    if layout == "transposed":
        if values.dim() >= 2:
            view = values.mT.contiguous().mT
            if not view.is_contiguous():
                return view
        # One dim of size > 1 (a 1-D tensor, or one like (5, 1)) has no dense layout but the contiguous one,
        # and torch has no negative strides to reverse it: read it with stride 2 from the odd positions of a
        # NaN buffer twice as long (a storage offset too, where "sliced" starts at 0).
        buf = torch.full((2 * values.numel(),), float("nan"), dtype=values.dtype)
        view = buf[1::2].view(values.shape)
        view.copy_(values)
        return view
    if layout == "sliced":
        # Every other element of a buffer twice as long in the last dim.
        shape = list(values.shape)
        shape[-1] *= 2
        buf = torch.full(shape, float("nan"), dtype=values.dtype)
        view = buf[..., ::2]
        view.copy_(values)
        return view
    if layout == "expanded":
        # Values constant along dim 0 (keep the first row), read through a stride-0 view.
        if values.shape[0] <= 1:
            return values.clone()
        return values[:1].clone().expand(values.shape)
    raise ValueError(layout)


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """`t` on `device` with the same sizes, strides and storage offset: the whole storage it views is copied
    and the view is rebuilt over the copy on the device, so a transposed, sliced (gaps included) or
    expanded (stride 0) tensor stays that kind of view. (`t.to(device)` would make it contiguous.)"""
    device = torch.device(device)
    if t.device == device:
        return t
    extent = t.untyped_storage().nbytes() // t.element_size()
    storage = t.detach().as_strided((extent,), (1,), 0).to(device)
    return storage.as_strided(t.shape, t.stride(), t.storage_offset())


def layout_kind(t: torch.Tensor) -> str:
    """Which of make_layout's layouts `t` has, as far as its strides tell (a "transposed" tensor with one
    dim of size > 1 is a view with gaps, and reads as "sliced")."""
    if t.is_contiguous():
        return "contiguous"
    if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)):
        return "expanded"
    if t.untyped_storage().nbytes() > t.numel() * t.element_size():
        return "sliced"
    return "transposed"


def _kinks_ok(loss: str, x: torch.Tensor, t: torch.Tensor, beta: float, log_target: bool) -> bool:
    x, t = torch.broadcast_tensors(x.double(), t.double())
    if x.numel() == 0:
        return False
    if loss == "kl_div":
        return bool(log_target or (t > KINK_MARGIN).all())
    if loss == "mse_loss":  # smooth everywhere
        return True
    d = (x - t).abs()
    ok = bool((d > KINK_MARGIN).all())
    if loss in WIDTH_LOSSES and beta > 0:
        ok = ok and bool(((d - beta).abs() > KINK_MARGIN).all())
    # Huber at delta = inf is 0.5 * d**2 everywhere, smooth; smooth L1 at beta = inf is 0 (not tested so).
    return ok and (math.isfinite(beta) or loss == "huber_loss")


def away_from_kinks(s: "Sample") -> bool:
    """Every broadcast element of the sample, as passed, is at least KINK_MARGIN from a kink (non-empty)."""
    return _kinks_ok(s.loss, s.self, s.target, s.beta, s.log_target)


def _grad_shape(shape_kind: str, reduction: str, bshape, loss: str):
    if shape_kind == "scalar" or (shape_kind == "auto" and reduction != "none"):
        return ()
    if shape_kind == "auto":
        return tuple(bshape)
    if shape_kind == "partial":
        # Broadcasts to bshape without being it: the last dim kept, the others 1.
        return (1,) * (len(bshape) - 1) + tuple(bshape[-1:]) if len(bshape) else ()
    if shape_kind == "partial_last":
        # Broadcasts to bshape with its last dim 1.
        return tuple(bshape[:-1]) + (1,) if len(bshape) else ()
    if shape_kind == "enlarging":  # only legal for smooth L1 and L1
        assert loss != "kl_div"
        return (2,) + tuple(bshape)
    raise ValueError(shape_kind)


def make_sample(
    loss: str,
    self_shape,
    target_shape,
    *,
    dtype=torch.float64,
    target_dtype=None,
    grad_dtype=None,
    reduction="mean",
    beta=1.0,
    log_target=False,
    layout="contiguous",
    grad_kind="auto",
    self_layout=None,
    target_layout=None,
    grad_layout=None,
    name=None,
    zero_targets=False,
    retries=40,
) -> Sample:
    """One deterministic sample; retries seeds until it is differentiable (if that is reachable)."""
    target_dtype = target_dtype or dtype
    grad_dtype = grad_dtype or dtype
    bshape = torch.broadcast_shapes(torch.Size(self_shape), torch.Size(target_shape))
    gshape = _grad_shape(grad_kind, reduction, bshape, loss)
    key = (loss, self_shape, target_shape, str(dtype), reduction, beta, log_target, layout, grad_kind)
    target_kind = "signed" if loss != "kl_div" else ("logprob" if log_target else "prob")
    self_kind = "signed" if loss != "kl_div" else "logprob"
    wants_differentiable = (
        not zero_targets and dtype == target_dtype == grad_dtype == torch.float64 and bshape.numel() <= 1000
    )
    for attempt in range(retries if wants_differentiable else 1):
        gen = torch.Generator().manual_seed(_seed(key, attempt))
        x = _values(self_shape, gen, self_kind)
        t = _values(target_shape, gen, target_kind)
        g = _values(gshape, gen, "signed")
        if zero_targets and t.numel():
            t.view(-1)[:: 3] = 0.0
        # Rounded to the sample's dtypes before the kink check, so it sees the values the ops will see.
        x, t, g = x.to(dtype), t.to(target_dtype), g.to(grad_dtype)
        if not wants_differentiable or _kinks_ok(loss, x, t, beta, log_target):
            break
    differentiable = wants_differentiable and _kinks_ok(loss, x, t, beta, log_target)
    x = make_layout(x, self_layout or layout)
    t = make_layout(t, target_layout or layout)
    g = make_layout(g, grad_layout or layout)
    # An expanded layout makes rows equal: re-check the kinks on what is actually passed.
    differentiable = differentiable and _kinks_ok(loss, x, t, beta, log_target)
    if name is None:
        dt = str(dtype).removeprefix("torch.")
        extra = (f"-beta{beta:g}" if loss == "smooth_l1_loss" else f"-delta{beta:g}" if loss == "huber_loss"
                 else ("-logt" if log_target else ""))
        name = (
            f"{loss}-{_fmt(self_shape)}x{_fmt(target_shape)}-g{_fmt(gshape)}-{dt}-{reduction}"
            f"{extra}-{layout}"
        )
    return Sample(loss, x, t, g, reduction, beta, log_target, differentiable, name)


def _fmt(shape) -> str:
    return "(" + ",".join(str(s) for s in shape) + ")"


# (self shape, target shape, what it covers)
SHAPES = [
    ((), ()),
    ((0,), (0,)),
    ((0, 3), (3,)),  # empty self, non-empty target (KL's zero-filled target gradient)
    ((1,), (1,)),
    ((7, 13), (7, 13)),
    ((4, 1), (1, 5)),  # broadcast both ways
    ((5,), ()),  # 0-dim target
    ((), (5,)),  # 0-dim self
    ((2, 3, 4), (3, 1)),
    ((3, 1, 4), (2, 1)),
    ((33, 65), (33, 65)),  # vector tails
    ((1, 2, 1, 2, 1, 2, 1, 2), (2, 1, 2, 1, 2, 1, 2, 1)),  # 8 dims, broadcast
]
# Large: more than one reduction chunk (4096) / more than one thread's grain (32768); fewer dtypes.
BIG_SHAPES = [
    (((5000,), (5000,)), (torch.float32, torch.float16)),
    (((200, 200), (200, 1)), (torch.float32,)),
]
LAYOUTS = ("transposed", "sliced", "expanded")


def _loss_variants(loss: str, index: int):
    """(beta, log_target) combinations, cycled through the shapes so each appears often."""
    if loss == "smooth_l1_loss":
        return [(BETAS[index % len(BETAS)], False)]
    if loss == "huber_loss":
        return [(DELTAS[index % len(DELTAS)], False)]
    if loss == "kl_div":
        return [(1.0, bool(index % 2)), (1.0, not bool(index % 2))]
    return [(1.0, False)]


def samples(
    loss: str,
    *,
    dtypes=FLOAT_DTYPES,
    reductions=("none", "mean", "sum"),
    layouts=True,
    big=True,
) -> Iterator[Sample]:
    """Our own grid of samples for `loss`."""
    grid = [(shapes, dtypes) for shapes in SHAPES]
    if big:
        grid += [(shapes, [d for d in dts if d in dtypes]) for shapes, dts in BIG_SHAPES]
    for i, ((xs, ts), shape_dtypes) in enumerate(grid):
        for dtype in shape_dtypes:
            for r, reduction in enumerate(reductions):
                for beta, log_target in _loss_variants(loss, i + r):
                    yield make_sample(loss, xs, ts, dtype=dtype, reduction=reduction, beta=beta,
                                      log_target=log_target)
    if not layouts:
        return
    # Layouts: each on each 2-D-or-more shape, a subset of dtypes, all reductions.
    for (xs, ts), layout in itertools.product([((7, 13), (7, 13)), ((4, 6), (4, 6)), ((3, 5, 4), (5, 1))],
                                              LAYOUTS):
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            for r, reduction in enumerate(reductions):
                for beta, log_target in _loss_variants(loss, r):
                    yield make_sample(loss, xs, ts, dtype=dtype, reduction=reduction, beta=beta,
                                      log_target=log_target, layout=layout)
    # Broadcast among all three arguments and grads of other shapes.
    for reduction in reductions:
        yield make_sample(loss, (4, 1), (1, 5), reduction=reduction, grad_kind="partial",
                          dtype=torch.float32, name=f"{loss}-gpartial-{reduction}")
        yield make_sample(loss, (3, 4, 1), (1, 5), reduction=reduction, grad_kind="partial_last",
                          dtype=torch.float32, name=f"{loss}-gpartial-last-{reduction}")
        yield make_sample(loss, (4, 5), (4, 5), reduction=reduction, grad_kind="scalar",
                          dtype=torch.float32, name=f"{loss}-gscalar-{reduction}")
        if loss != "kl_div":
            yield make_sample(loss, (4, 1), (1, 5), reduction=reduction, grad_kind="enlarging",
                              dtype=torch.float32, name=f"{loss}-genlarging-{reduction}")
    # Mixed dtypes (result type is at::result_type; the backward op's dtype per docs/semantics.md's table).
    for reduction in reductions:
        yield make_sample(loss, (6, 7), (6, 7), dtype=torch.float32, target_dtype=torch.float16,
                          reduction=reduction, name=f"{loss}-f32xf16-{reduction}")
        yield make_sample(loss, (6, 7), (), dtype=torch.float16, target_dtype=torch.float64,
                          reduction=reduction, name=f"{loss}-f16x0dimf64-{reduction}")
        yield make_sample(loss, (6, 7), (6, 7), dtype=torch.bfloat16, target_dtype=torch.float32,
                          grad_dtype=torch.float64, reduction=reduction, name=f"{loss}-bf16xf32gf64-{reduction}")
    # Non-contiguous grad_output only.
    for reduction in ("none",):
        yield make_sample(loss, (7, 13), (7, 13), reduction=reduction, dtype=torch.float32,
                          self_layout="contiguous", target_layout="contiguous", grad_layout="transposed",
                          name=f"{loss}-gtransposed")
    if loss == "smooth_l1_loss":
        for reduction in reductions:
            yield make_sample(loss, (7, 13), (7, 13), beta=math.inf, reduction=reduction,
                              dtype=torch.float32, name=f"{loss}-betainf-{reduction}")
            yield make_sample(loss, (7, 13), (7, 13), beta=1e-3, reduction=reduction,
                              dtype=torch.float32, name=f"{loss}-beta1e-3-{reduction}")
    if loss == "huber_loss":
        # Every delta with every reduction on one shape (the grid above cycles them through the shapes), and
        # the ones where delta * smoothl1 breaks: fp16/bf16 with a huge or tiny delta (delta * g, 1/delta
        # leave the range), and inf (0.5 * d**2, where delta * smoothl1 is 0 * inf).
        for delta in DELTAS:
            for reduction in reductions:
                yield make_sample(loss, (7, 13), (7, 13), beta=delta, reduction=reduction, dtype=torch.float32,
                                  name=f"{loss}-delta{delta:g}-{reduction}")
                for dtype in (torch.float16, torch.bfloat16):
                    if delta in (1e-3, 1e4, math.inf):
                        yield make_sample(loss, (7, 13), (7, 13), beta=delta, reduction=reduction,
                                          dtype=dtype, name=f"{loss}-delta{delta:g}-{dtype}-{reduction}")
        # fp16 'none' with delta = 1e4 and d = 1e-2: 5e-5 (delta * smoothl1 in fp16 would give 0).
        for reduction in reductions:
            x = torch.full((4, 5), 1e-2, dtype=torch.float16)
            t = torch.zeros((4, 5), dtype=torch.float16)
            g = torch.ones(() if reduction != "none" else (4, 5), dtype=torch.float16)
            yield Sample(loss, x, t, g, reduction, 1e4, False, False, f"{loss}-fp16-small-d-delta1e4-{reduction}")
    if loss == "kl_div":
        for reduction in reductions:
            for shapes in [((4, 5), (4, 5)), ((4, 5), (1, 5))]:
                for dtype in (torch.float32, torch.float16):
                    yield make_sample(loss, *shapes, reduction=reduction, dtype=dtype, zero_targets=True,
                                      name=f"{loss}-zerotarget-{_fmt(shapes[1])}-{dtype}-{reduction}")


def differentiable_samples(loss: str) -> Iterator[Sample]:
    """float64, small, away from the kinks: for gradcheck/gradgradcheck."""
    for s in all_samples(loss):
        if s.differentiable:
            yield s
    # Broadcast between self and target and grads of other shapes, in float64.
    extra = [((4, 1), (1, 5), "partial"), ((3,), (2, 3), "auto"), ((2, 3), (), "auto"),
             ((2, 3, 1), (1, 4), "partial_last")]
    if loss != "kl_div":
        extra.append(((3, 1), (1, 2), "enlarging"))
    for reduction in ("none", "mean", "sum"):
        for xs, ts, gk in extra:
            for beta, log_target in _loss_variants(loss, 1):
                s = make_sample(loss, xs, ts, reduction=reduction, beta=beta, log_target=log_target,
                                grad_kind=gk, name=f"{loss}-{_fmt(xs)}x{_fmt(ts)}-g{gk}-{reduction}-b{beta}"
                                f"{'-logt' if log_target else ''}")
                if s.differentiable:
                    yield s


# ---------------------------------------------------------------------------------------------------
# PyTorch's OpInfo samples


@functools.lru_cache(maxsize=None)
def _opinfo(loss: str):
    from torch.testing._internal.common_methods_invocations import op_db

    name = {"smooth_l1_loss": "nn.functional.smooth_l1_loss", "l1_loss": "nn.functional.l1_loss",
            "kl_div": "nn.functional.kl_div", "huber_loss": "nn.functional.huber_loss",
            "mse_loss": "nn.functional.mse_loss"}[loss]
    (info,) = [o for o in op_db if o.name == name]
    return info


def opinfo_samples(loss: str, dtype=torch.float64, requires_grad=False) -> Iterator[Sample]:
    """PyTorch's OpInfo sample inputs for F.<loss>, as Samples ('batchmean' kept: functional API only)."""
    info = _opinfo(loss)
    for i, s in enumerate(info.sample_inputs("cpu", dtype, requires_grad=requires_grad)):
        kwargs = dict(s.kwargs)
        x, (t, *rest) = s.input, s.args
        assert not rest, rest
        reduction = kwargs.pop("reduction", "mean")
        beta = float(kwargs.pop("beta", kwargs.pop("delta", 1.0)))  # smooth L1's beta or Huber's delta
        log_target = bool(kwargs.pop("log_target", False))
        assert not kwargs, kwargs
        if loss == "kl_div" and not log_target:
            # OpInfo's targets may be <= 0 (F's xlogy gives 0 or NaN there); we use probabilities.
            with torch.no_grad():
                t = t.detach().abs().add(0.1).requires_grad_(t.requires_grad)
        bshape = torch.broadcast_shapes(x.shape, t.shape)
        gen = torch.Generator().manual_seed(_seed(loss, "opinfo", i))
        gshape = tuple(bshape) if reduction == "none" else ()
        g = _values(gshape, gen, "signed").to(dtype)
        differentiable = dtype == torch.float64 and _kinks_ok(loss, x.detach(), t.detach(), beta, log_target)
        yield Sample(loss, x, t, g, reduction, beta, log_target, differentiable,
                     f"opinfo-{loss}-{i}-{_fmt(x.shape)}-{reduction}-b{beta:g}{'-logt' if log_target else ''}")


@functools.lru_cache(maxsize=None)
def all_samples(loss: str) -> tuple[Sample, ...]:
    """The full grid, built once per session (tests must not modify the tensors in place)."""
    return tuple(samples(loss))


def ids(samples_list) -> list[str]:
    return [s.name for s in samples_list]


def params(samples_list, known_bugs=None):
    """pytest.param per sample, id = its name; `known_bugs(sample)` may return a reason string, which marks
    the case xfail(strict=True): it fails today because of a reported product bug, and the strict mark
    turns the fix into a reminder to drop the mark."""
    import pytest

    out = []
    for s in samples_list:
        reason = known_bugs(s) if known_bugs else None
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(s, id=s.name, marks=marks))
    return out
