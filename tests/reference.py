"""float64 references written from SPEC.md's Math section, result shapes/dtypes from its table, and the
comparison every correctness test uses (per-dtype tolerance, relative to each element's magnitude)."""
from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

from samples import Sample, lowest_precision as lowest  # noqa: F401  (re-exported)

# Relative tolerance by the dtype of the result being checked.
RTOL = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 1e-3,
    torch.bfloat16: 1e-2,
}


def result_type(*tensors: torch.Tensor) -> torch.dtype:
    """at::result_type for floating tensors: 0-dim tensors promote only when no dimensioned one exists."""
    pool = [t.dtype for t in tensors if t.dim() > 0] or [t.dtype for t in tensors]
    dtype = pool[0]
    for d in pool[1:]:
        dtype = torch.promote_types(dtype, d)
    return dtype


def sign(d: torch.Tensor) -> torch.Tensor:
    """sign with sign(0) = sign(NaN) = 0."""
    return (d > 0).to(d.dtype) - (d < 0).to(d.dtype)


def _scale(reduction: str, count: int) -> float:
    if reduction != "mean":
        return 1.0
    return 1.0 / count if count else math.inf


def _d64(*tensors):
    return [t.detach().to(torch.float64) for t in tensors]


# ---------------------------------------------------------------------------------------------------
# Forwards


def elementwise_forward(s: Sample, x, t):
    """(loss, magnitude) elementwise in float64, torch.nn.functional's formulas."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if s.loss == "smooth_l1_loss":
            v = F.smooth_l1_loss(x, t, reduction="none", beta=s.beta)
            return v, v.abs()
        if s.loss == "l1_loss":
            v = F.l1_loss(x, t, reduction="none")
            return v, v.abs()
        v = F.kl_div(x, t, reduction="none", log_target=s.log_target)
        x, t = torch.broadcast_tensors(x, t)
        if s.log_target:
            mag = t.exp() * (t.abs() + x.abs())
        else:
            mag = torch.xlogy(t, t).abs() + (t * x).abs()
        return v, mag


def reference_forward(s: Sample):
    """(value, magnitude, dtype, shape) of torch.ops.npu_loss.<loss> per SPEC."""
    x, t = _d64(s.self, s.target)
    v, mag = elementwise_forward(s, x, t)
    if s.reduction == "none":
        value = v
    elif s.reduction == "sum":
        value, mag = v.sum(), mag.sum()
    else:
        value, mag = v.mean(), mag.mean()
    shape = s.broadcast_shape if s.reduction == "none" else torch.Size([])
    return value, mag, result_type(s.self, s.target), shape


# ---------------------------------------------------------------------------------------------------
# Backward ops


def smooth_l1_slope(d: torch.Tensor, beta: float) -> torch.Tensor:
    # SPEC: d/beta where |d| < beta, sign(d) elsewhere; beta == 0 is sign(d). A NaN d stays NaN for
    # beta > 0 (ATen's CPU kernel: neither branch of the comparisons is taken, x * g / beta).
    if beta == 0:
        return sign(d)
    return torch.where(d.abs() >= beta, sign(d), d / beta)


def reference_backward(s: Sample):
    """(value, magnitude, dtype, shape) of the backward op per SPEC's Math and table."""
    g, x, t = _d64(s.grad_output, s.self, s.target)
    if s.loss == "smooth_l1_loss":
        shape = torch.broadcast_shapes(g.shape, x.shape, t.shape)
        gs = g * _scale(s.reduction, x.numel())  # "mean" divides by self.numel()
        value = (gs * smooth_l1_slope(x - t, s.beta)).expand(shape)
        return value, gs.abs().expand(shape), s.self.dtype, shape
    if s.loss == "l1_loss":
        shape = torch.broadcast_shapes(g.shape, x.shape, t.shape)
        gs = g * _scale(s.reduction, shape.numel())  # the broadcast result's count
        value = (gs * sign(x - t)).expand(shape)
        return value, gs.abs().expand(shape), result_type(s.grad_output, s.self, s.target), shape
    bshape = torch.broadcast_shapes(x.shape, t.shape)
    gs = g * _scale(s.reduction, bshape.numel())
    if s.log_target:
        v = gs * t.exp() * (t + 1 - x)
        mag = gs.abs() * t.exp() * (t.abs() + 1 + x.abs())
    else:
        zero = t == 0
        # +inf gives NaN, as PyTorch's autograd (xlogy's t / t) does.
        v = torch.where(zero, 0.0, torch.where(t.isposinf(), math.nan, gs * (t.log() + 1 - x)))
        mag = torch.where(zero, 0.0, gs.abs() * (t.log().abs() + 1 + x.abs()))
    value = v.expand(bshape).sum_to_size(t.shape) if t.shape != bshape else v.expand(bshape)
    mag = mag.expand(bshape).sum_to_size(t.shape) if t.shape != bshape else mag.expand(bshape)
    return value, mag, s.target.dtype, s.target.shape


# ---------------------------------------------------------------------------------------------------
# Gradients of the forwards, from torch.nn.functional's autograd in float64


def reference_grads(s: Sample, grad_output: torch.Tensor):
    """(grad_self, grad_target) of F.<loss> in float64 for the given output gradient; KL's target gradient
    is exactly 0 where target == 0 (SPEC's deliberate difference; PyTorch gives NaN)."""
    x, t, g = _d64(s.self, s.target, grad_output)
    x.requires_grad_(True)
    t.requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = getattr(F, s.loss)
        out = fn(x, t, **s.functional_kwargs())
    gx, gt = torch.autograd.grad(out, (x, t), g, allow_unused=True)
    if gx is None:
        gx = torch.zeros_like(x)
    if gt is None:
        gt = torch.zeros_like(t)
    if s.loss == "kl_div" and not s.log_target:
        gt = torch.where(t.detach() == 0, 0.0, gt)
    return gx.detach(), gt.detach()


def grad_magnitudes(s: Sample, grad_output: torch.Tensor):
    """Upper bounds of the summed |terms| of each gradient (for the tolerance of broadcast sums)."""
    x, t, g = _d64(s.self, s.target, grad_output)
    bshape = torch.broadcast_shapes(x.shape, t.shape)
    n = bshape.numel()
    if s.reduction == "batchmean":
        scale = 1.0 / x.shape[0] if x.dim() else 1.0
    else:
        scale = _scale(s.reduction, n)
    ga = g.abs() * scale
    if s.loss in ("smooth_l1_loss", "l1_loss"):
        mx = mt = ga.expand(bshape)
    elif s.log_target:
        mx = (ga * t.exp()).expand(bshape)
        mt = (ga * t.exp() * (t.abs() + 1 + x.abs())).expand(bshape)
    else:
        mx = (ga * t.abs()).expand(bshape)
        mt = torch.where(t == 0, 0.0, ga * (t.abs().log().abs() + 1 + x.abs())).expand(bshape)
    return mx.sum_to_size(x.shape), mt.sum_to_size(t.shape)


# ---------------------------------------------------------------------------------------------------
# Comparison


def assert_close(actual: torch.Tensor, expected: torch.Tensor, magnitude: torch.Tensor | None = None,
                 dtype: torch.dtype | None = None, msg: str = "") -> None:
    """|actual - expected| <= RTOL[dtype] * magnitude + tiny, elementwise; NaN where expected is NaN and
    equal infinities. `dtype` defaults to actual's."""
    dtype = dtype or actual.dtype
    assert actual.shape == expected.shape, f"{msg}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a = actual.detach().to(torch.float64)
    e = expected.detach().to(torch.float64)
    m = (e.abs() if magnitude is None else magnitude.detach().to(torch.float64).abs()).expand(e.shape)
    nan_a, nan_e = a.isnan(), e.isnan()
    assert torch.equal(nan_a, nan_e), (
        f"{msg}: NaN positions differ: actual has {int(nan_a.sum())} NaN, expected {int(nan_e.sum())}; "
        f"actual={a[nan_a != nan_e][:5].tolist()} expected={e[nan_a != nan_e][:5].tolist()}"
    )
    # A finite float64 value beyond the result dtype's range rounds to inf (fp16 sums overflow, as in
    # PyTorch): expect that inf.
    e = torch.where(e.abs() > torch.finfo(dtype).max, e.to(dtype).to(torch.float64), e)
    inf_e = e.isinf()
    assert torch.equal(a[inf_e], e[inf_e]), f"{msg}: infinities differ"
    finite = ~(nan_e | inf_e)
    a, e, m = a[finite], e[finite], m[finite]
    bound = RTOL[dtype] * torch.where(m.isfinite(), m, e.abs()) + torch.finfo(dtype).tiny
    err = (a - e).abs()
    bad = ~(err <= bound)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise AssertionError(
            f"{msg}: {int(bad.sum())}/{bad.numel()} elements differ beyond rtol {RTOL[dtype]} "
            f"({dtype}); first: actual={a[i].item()!r} expected={e[i].item()!r} "
            f"magnitude={m[i].item()!r}; max err/bound={(err / bound).max().item():.3g}"
        )
