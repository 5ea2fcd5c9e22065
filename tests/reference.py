"""float64 references written from docs/semantics.md's Math section, result shapes/dtypes from its table, and the
comparison every correctness test uses (per-dtype tolerance, relative to each element's magnitude).

A reference that shares code or logic with what it checks cannot catch its bugs, so nothing here comes from
npu_loss_ops: values are torch.nn.functional's or written from docs/semantics.md, result dtypes are PyTorch's
own promotion (aten_result_type), shapes torch.broadcast_shapes'. The package is asked only which NPU chip
and aclnn APIs it runs on (npu_soc, smooth_l1_tbe_divisor), to know which documented chip behaviour to expect."""
from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

from samples import Sample

# Relative tolerance by the dtype of the result being checked, against float64 references computed from the
# very (rounded) inputs the op saw, relative to each element's magnitude. float16/bfloat16 results are
# computed in float32 and rounded once (docs/semantics.md, "Reduced precision"), at most half an epsilon
# off: 1e-3 and 1e-2 are about one epsilon (9.8e-4, 7.8e-3). float32 and float64 leave room for the kernels'
# own math (float32 log/exp within 2 ulp, csrc/cpu/vec_math.h; the aclnn kernels on the NPU) and long sums:
# 1e-5 is about 84 float32 epsilons, 1e-12 about 4500 float64 ones.
RTOL = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 1e-3,
    torch.bfloat16: 1e-2,
}


def aten_result_type(*tensors: torch.Tensor) -> torch.dtype:
    """at::result_type of two or three tensors (docs/semantics.md's result dtype), as PyTorch computes it, so
    that no promotion rule is written out here a second time: torch.result_type for two; for three, the
    dtype of an ATen ternary elementwise op, whose TensorIterator promotes all its inputs by
    at::result_type (torch.addcmul, on stand-ins with each tensor's dtype and its 0-dim-ness)."""
    if len(tensors) == 2:
        return torch.result_type(*tensors)
    a, b, c = (torch.zeros((1,) * min(t.dim(), 1), dtype=t.dtype) for t in tensors)
    return torch.addcmul(a, b, c).dtype


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
        if s.loss == "huber_loss":
            v = F.huber_loss(x, t, reduction="none", delta=s.delta)
            return v, v.abs()
        if s.loss == "mse_loss":
            v = F.mse_loss(x, t, reduction="none")
            return v, v.abs()
        v = F.kl_div(x, t, reduction="none", log_target=s.log_target)
        x, t = torch.broadcast_tensors(x, t)
        if s.log_target:
            mag = t.exp() * (t.abs() + x.abs())
        else:
            mag = torch.xlogy(t, t).abs() + (t * x).abs()
        return v, mag


def reference_forward(s: Sample):
    """(value, magnitude, dtype, shape) of torch.ops.npu_loss.<loss> per docs/semantics.md."""
    x, t = _d64(s.self, s.target)
    v, mag = elementwise_forward(s, x, t)
    if s.reduction == "none":
        value = v
    elif s.reduction == "sum":
        value, mag = v.sum(), mag.sum()
    else:
        value, mag = v.mean(), mag.mean()
    shape = s.broadcast_shape if s.reduction == "none" else torch.Size([])
    return value, mag, aten_result_type(s.self, s.target), shape


# ---------------------------------------------------------------------------------------------------
# Backward ops


def smooth_l1_slope(d: torch.Tensor, beta: float, divisor: float | None = None) -> torch.Tensor:
    # docs/semantics.md: d/beta where |d| < beta, sign(d) elsewhere; beta == 0 is sign(d). A NaN d stays NaN for
    # beta > 0 (ATen's CPU kernel: neither branch of the comparisons is taken, x * g / beta).
    # `divisor`: what the quadratic branch divides by instead of beta (the TBE kernels' beta + 1e-6).
    if beta == 0:
        return sign(d)
    return torch.where(d.abs() >= beta, sign(d), d / (beta if divisor is None else divisor))


def huber_slope(d: torch.Tensor, delta: float, divisor: float | None = None) -> torch.Tensor:
    """docs/semantics.md: Huber's gradient is d inside |d| < delta and delta * sign(d) outside, i.e. d clamped to
    [-delta, delta]; a NaN d stays NaN, delta = inf leaves d as it is. `divisor`: on the TBE chips Huber runs
    smooth L1's kernel with beta = delta, whose quadratic branch divides by delta + 1e-6: d * delta / divisor."""
    if divisor is None:
        return d.clamp(-delta, delta)
    return torch.where(d.abs() >= delta, delta * sign(d), d * (delta / divisor))


def l1_sign(x: torch.Tensor, t: torch.Tensor, at_nan: float = 0.0) -> torch.Tensor:
    """sign(x - t) with sign(0) = 0; `at_nan` where x or t is NaN (docs/semantics.md: 0; the TBE chips' L1 kernel: -1)."""
    d = x - t
    if at_nan == 0:
        return sign(d)
    x, t = torch.broadcast_tensors(x, t)
    return torch.where(x.isnan() | t.isnan(), at_nan, sign(d))


def reference_backward(s: Sample, l1_at_nan: float = 0.0, smooth_l1_divisor: float | None = None):
    """(value, magnitude, dtype, shape) of the backward op per docs/semantics.md's Math and table. `l1_at_nan`: L1's
    sign at a NaN input (-1 where a chip's documented difference applies, see l1_nan_gives_minus_grad);
    `smooth_l1_divisor`: see smooth_l1_tbe_divisor."""
    g, x, t = _d64(s.grad_output, s.self, s.target)
    if s.loss == "smooth_l1_loss":
        shape = torch.broadcast_shapes(g.shape, x.shape, t.shape)
        gs = g * _scale(s.reduction, x.numel())  # "mean" divides by self.numel()
        value = (gs * smooth_l1_slope(x - t, s.beta, smooth_l1_divisor)).expand(shape)
        return value, gs.abs().expand(shape), s.self.dtype, shape
    if s.loss == "huber_loss":
        # Smooth L1's divisor, dtype and shape; the slope reaches delta instead of 1.
        shape = torch.broadcast_shapes(g.shape, x.shape, t.shape)
        gs = g * _scale(s.reduction, x.numel())  # "mean" divides by self.numel()
        slope = huber_slope(x - t, s.delta, smooth_l1_divisor)
        return (gs * slope).expand(shape), (gs * slope).abs().expand(shape), s.self.dtype, shape
    if s.loss == "mse_loss":
        # Smooth L1's divisor, dtype and shape; the slope is 2 * d.
        shape = torch.broadcast_shapes(g.shape, x.shape, t.shape)
        gs = g * _scale(s.reduction, x.numel())  # "mean" divides by self.numel()
        slope = 2 * (x - t)
        return (gs * slope).expand(shape), (gs * slope).abs().expand(shape), s.self.dtype, shape
    if s.loss == "l1_loss":
        shape = torch.broadcast_shapes(g.shape, x.shape, t.shape)
        gs = g * _scale(s.reduction, shape.numel())  # the broadcast result's count
        value = (gs * l1_sign(x, t, l1_at_nan)).expand(shape)
        return value, gs.abs().expand(shape), aten_result_type(s.grad_output, s.self, s.target), shape
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


def reference_grads(s: Sample, grad_output: torch.Tensor, l1_at_nan: float = 0.0):
    """(grad_self, grad_target) of F.<loss> in float64 for the given output gradient; KL's target gradient
    is exactly 0 where target == 0 (docs/semantics.md's deliberate difference; PyTorch gives NaN). `l1_at_nan` = -1: the
    TBE chips' L1 gradient, -grad for self AND target where either is NaN (the target gradient is the same
    kernel with the arguments swapped)."""
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
    if s.loss == "l1_loss" and l1_at_nan != 0:
        xb, tb = torch.broadcast_tensors(x.detach(), t.detach())
        nan = xb.isnan() | tb.isnan()
        scale = _scale(s.reduction, xb.numel()) if s.reduction != "batchmean" else 1.0 / max(x.shape[0], 1)
        extra = torch.where(nan, l1_at_nan * g * scale, 0.0)  # F (sgn) gives 0 there
        gx = gx + extra.sum_to_size(x.shape)
        gt = gt + extra.sum_to_size(t.shape)
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
    elif s.loss == "huber_loss":
        mx = mt = (ga * (x - t).abs().clamp(max=s.delta)).expand(bshape)
    elif s.loss == "mse_loss":
        mx = mt = (ga * 2 * (x - t).abs()).expand(bshape)
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
                 dtype: torch.dtype | None = None, msg: str = "", rtol: float | None = None,
                 atol: float = 0.0) -> None:
    """|actual - expected| <= RTOL[dtype] * magnitude + tiny + atol, elementwise; NaN where expected is NaN
    and equal infinities. `dtype` defaults to actual's; `rtol` overrides RTOL[dtype]."""
    dtype = dtype or actual.dtype
    rtol = RTOL[dtype] if rtol is None else rtol
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
    bound = rtol * torch.where(m.isfinite(), m, e.abs()) + torch.finfo(dtype).tiny + atol
    err = (a - e).abs()
    bad = ~(err <= bound)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise AssertionError(
            f"{msg}: {int(bad.sum())}/{bad.numel()} elements differ beyond rtol {rtol} "
            f"({dtype}); first: actual={a[i].item()!r} expected={e[i].item()!r} "
            f"magnitude={m[i].item()!r}; max err/bound={(err / bound).max().item():.3g}"
        )


def assert_matches(actual: torch.Tensor, reference, msg: str = "") -> None:
    """`actual` has the dtype and shape of `reference` = (value, magnitude, dtype, shape), as
    reference_forward and reference_backward return it, and values within tolerance of it."""
    value, magnitude, dtype, shape = reference
    assert_dtype_and_shape(actual, dtype, shape, msg)
    assert_close(actual, value, magnitude, msg=msg)


def assert_dtype_and_shape(actual: torch.Tensor, dtype: torch.dtype, shape, msg: str = "") -> None:
    """The result dtype and shape docs/semantics.md's table gives (as a reference_* function returns them)."""
    assert actual.dtype == dtype, f"{msg}: result dtype {actual.dtype}, docs/semantics.md says {dtype}"
    assert actual.shape == shape, f"{msg}: result shape {tuple(actual.shape)}, docs/semantics.md says {tuple(shape)}"


# ---------------------------------------------------------------------------------------------------
# Double backward, from torch.nn.functional's autograd in float64


def reference_double_backward(s: Sample, grad_output: torch.Tensor, vx: torch.Tensor, vt: torch.Tensor):
    """The gradients of <grad_self, vx> + <grad_target, vt> w.r.t. (self, target, grad_output), where
    grad_self/grad_target are F.<loss>'s autograd gradients for `grad_output`: [(value, magnitude)] * 3 in
    float64. Computed per broadcast element (the reduction's scale folded into the output gradient), so the
    magnitudes are the sums of |terms| that each result adds up."""
    x, t, g, vx, vt = _d64(s.self, s.target, grad_output, vx, vt)
    bshape = torch.broadcast_shapes(x.shape, t.shape)
    if s.reduction == "batchmean":
        scale = 1.0 / x.shape[0] if x.dim() else 1.0
    else:
        scale = _scale(s.reduction, bshape.numel())
    xb = x.expand(bshape).clone().requires_grad_(True)
    tb = t.expand(bshape).clone().requires_grad_(True)
    gb = (g * scale).expand(bshape).clone().requires_grad_(True)
    kwargs = {k: v for k, v in s.functional_kwargs().items() if k != "reduction"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = getattr(F, s.loss)(xb, tb, reduction="none", **kwargs)
    gxb, gtb = torch.autograd.grad(loss, (xb, tb), gb, create_graph=True)
    parts = []
    for first, v in ((gxb, vx), (gtb, vt)):
        if not first.requires_grad:
            parts.append([torch.zeros(bshape, dtype=torch.float64)] * 3)
            continue
        grads = torch.autograd.grad((first * v.expand(bshape)).sum(), (xb, tb, gb), allow_unused=True,
                                    retain_graph=True)
        parts.append([torch.zeros(bshape, dtype=torch.float64) if d is None else d.detach() for d in grads])
    results = []
    for i, (like, factor) in enumerate(((x, 1.0), (t, 1.0), (g, scale))):
        a, b = parts[0][i] * factor, parts[1][i] * factor
        results.append(((a + b).sum_to_size(like.shape), (a.abs() + b.abs()).sum_to_size(like.shape)))
    if s.loss == "kl_div":
        # KL's second derivatives add terms that cancel (log t + 1 - x): bound them by the |terms|.
        xa, ta, ga = xb.detach(), tb.detach(), gb.detach().abs()
        vxa, vta = vx.abs().expand(bshape), vt.abs().expand(bshape)
        if s.log_target:
            e = ta.exp()
            mag_t = ga * e * (vxa + (ta.abs() + 2 + xa.abs()) * vta)
            mag_g = e * (vxa + (ta.abs() + 1 + xa.abs()) * vta) * scale
        else:
            mag_t = ga * (vxa + vta / ta.abs())
            mag_g = (ta.abs() * vxa + (ta.log().abs() + 1 + xa.abs()) * vta) * scale
        results[1] = (results[1][0], mag_t.sum_to_size(t.shape))
        results[2] = (results[2][0], mag_g.sum_to_size(g.shape))
    return results


# ---------------------------------------------------------------------------------------------------
# Devices: a result on any device against the float64 reference and, off the CPU, the CPU kernels


def skip_if_unsupported(s: Sample, device: str) -> None:
    """The NPU rejects float64 (TypeError, docs/validation.md; test_errors covers it): value tests skip such samples."""
    if device == "npu" and s.has_float64:
        import pytest

        pytest.skip("float64 is rejected on the NPU (TypeError; the error matrix checks it)")


def cpu_result(fn, s: Sample, device: str):
    """fn(s) on the CPU sample when the test runs on another device (the result the device's is compared
    with, `cpu=` of assert_close_on_device); None on the CPU."""
    return None if device == "cpu" else fn(s)


def on_device(s: Sample, device: str) -> Sample:
    skip_if_unsupported(s, device)
    return s.to(device)


def assert_close_on_device(actual: torch.Tensor, expected: torch.Tensor, magnitude: torch.Tensor | None = None,
                           dtype: torch.dtype | None = None, msg: str = "", *, device: str,
                           cpu: torch.Tensor | None = None, chip_differs: torch.Tensor | None = None,
                           rtol: float | None = None, atol: float = 0.0) -> None:
    """`actual` is on `device` and within tolerance of the float64 `expected`; off the CPU it is also within
    tolerance of `cpu`, the CPU kernels' result for the same inputs (same dtype and shape), except where
    `chip_differs` marks a documented chip difference (there `expected` already holds the chip's value)."""
    assert actual.device.type == device, f"{msg}: result on {actual.device}, inputs on {device}"
    assert_close(actual.cpu(), expected, magnitude, dtype, msg, rtol, atol)
    if device == "cpu":
        return
    assert cpu is not None, f"{msg}: no CPU result to compare with"
    assert cpu.device.type == "cpu"
    assert (actual.dtype, actual.shape) == (cpu.dtype, cpu.shape), (
        f"{msg}: {device} gives {actual.dtype}{tuple(actual.shape)}, the CPU {cpu.dtype}{tuple(cpu.shape)}")
    if chip_differs is not None:
        cpu = torch.where(chip_differs, expected.to(cpu.dtype), cpu)
    assert_close(actual.cpu(), cpu, magnitude, dtype, f"{msg}: {device} vs the CPU kernels", rtol, atol)


# The TBE chip families (SoC names as aclrtGetSocName() reports them), and those of them without bf16
# kernels (their bf16 calls run the composite fallback): docs/npu_paths.md, "Which chips run which path".
TBE_SOC_PREFIXES = ("Ascend910", "Ascend310P")


def npu_soc() -> str:
    import npu_loss_ops

    return str(npu_loss_ops.build_info().get("npu_soc", ""))


def _tbe_with_bf16(soc: str) -> bool:
    # Ascend910B<n> / 910B<n>C / 910B<n>-1 (Atlas A2) and Ascend910_93xx (Atlas A3); a bare "Ascend910B" and
    # Ascend910A/910ProB are Atlas A1 parts (no bf16 kernels).
    return soc.startswith("Ascend910_9") or (soc.startswith("Ascend910B") and len(soc) > len("Ascend910B"))


def l1_nan_gives_minus_grad(device: str, *tensors: torch.Tensor) -> bool:
    """The one documented chip difference (docs/npu_paths.md): on the TBE families (Ascend910*, 910B*, 910_93*, 310P*) the
    aclnn L1 gradient at a NaN input (self or target) is -grad_output (PyTorch and the CPU kernels: 0).
    Ascend 950 gives 0; 310B and bf16 calls on Ascend 910/310P run the composite fallback (0). `tensors`:
    every tensor of the L1 gradient call (grad_output, self, target, out=)."""
    if device != "npu":
        return False
    soc = npu_soc()
    if not soc.startswith(TBE_SOC_PREFIXES):
        return False
    return _tbe_with_bf16(soc) or not any(t.dtype == torch.bfloat16 for t in tensors)


# The TBE families' smooth L1 gradient divides by beta + TBE_BETA_BIAS, a relative error of about
# TBE_BETA_BIAS / beta. TBE_BIAS_TOLERANCE is how much of it each result dtype tolerates before the NPU kernels
# run the composite instead: docs/npu_paths.md's beta limits (float32 0.1, float16 1e-3, bfloat16 6.25e-5)
# are 1e-6 divided by these. float16's is about its epsilon (9.8e-4), bfloat16's two epsilons (2 * 7.8e-3),
# float32's its RTOL above. csrc/chips/paths.cpp classifies by the same numbers.
TBE_BETA_BIAS = 1e-6
TBE_BIAS_TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1.6e-2}


def tbe_bias_ok(beta: float, dtype: torch.dtype) -> bool:
    """The TBE smooth L1 kernel's divisor bias is within `dtype`'s TBE_BIAS_TOLERANCE at this beta (beta == 0
    divides by nothing)."""
    tolerance = TBE_BIAS_TOLERANCE.get(dtype)
    return tolerance is not None and (beta == 0 or TBE_BETA_BIAS / beta <= tolerance)


def smooth_l1_tbe_divisor(device: str, beta: float, *tensors: torch.Tensor) -> float | None:
    """What the NPU's smooth L1 gradient divides by inside |d| < beta, when that is not beta itself: the TBE
    families' aclnn kernel divides by beta + 1e-6 (in float32), and the NPU kernels keep that kernel while
    the bias 1e-6 / beta stays inside the result dtype's TBE_BIAS_TOLERANCE and the kernel serves the call (no bf16 on Ascend 910/310P; a CANN without the API): docs/npu_paths.md,
    "Which chips run which path" and "Deliberate differences from raw aclnn". None elsewhere. The bias is
    inside every tolerance, but it moves exact ties of low-precision products off the tie, so such results
    round differently from d/beta in a few per cent of float16/bfloat16 elements."""
    if device != "npu" or beta == 0 or not math.isfinite(beta):
        return None
    soc = npu_soc()
    if not soc.startswith(TBE_SOC_PREFIXES):
        return None
    bf16 = any(t.dtype == torch.bfloat16 for t in tensors)
    if bf16 and not _tbe_with_bf16(soc):
        return None
    result_dtype = tensors[0].dtype if tensors else torch.float32
    if not tbe_bias_ok(beta, result_dtype):
        return None
    import npu_loss_ops

    if not npu_loss_ops._C_npu.aclnn_api_available("aclnnSmoothL1LossBackward"):
        return None
    return float(torch.tensor(beta, dtype=torch.float32) + torch.tensor(TBE_BETA_BIAS, dtype=torch.float32))


# ---------------------------------------------------------------------------------------------------
# The generalized JSD (the distillation family), from TRL 1.16's GKDTrainer.generalized_jsd_loss


def trl_generalized_jsd_loss(student_logits, teacher_logits, labels=None, beta=0.5, temperature=1.0,
                             reduction="batchmean", num_items_in_batch=None, ignore_index=-100):
    """TRL 1.16's function (trl/experimental/gkd/gkd_trainer.py), restated line by line, with `ignore_index`
    in place of its -100. Run in float64 it is the reference; in another dtype, TRL's own numbers."""
    student_logits = student_logits / temperature
    teacher_logits = teacher_logits / temperature
    student_log_probs = F.log_softmax(student_logits, dim=-1)
    teacher_log_probs = F.log_softmax(teacher_logits, dim=-1)
    if beta == 0:
        jsd = F.kl_div(student_log_probs, teacher_log_probs, reduction="none", log_target=True)
    elif beta == 1:
        jsd = F.kl_div(teacher_log_probs, student_log_probs, reduction="none", log_target=True)
    else:
        beta_t = torch.tensor(beta, dtype=student_log_probs.dtype, device=student_log_probs.device)
        mixture_log_probs = torch.logsumexp(
            torch.stack([student_log_probs + torch.log1p(-beta_t), teacher_log_probs + torch.log(beta_t)]), dim=0)
        kl_teacher = F.kl_div(mixture_log_probs, teacher_log_probs, reduction="none", log_target=True)
        kl_student = F.kl_div(mixture_log_probs, student_log_probs, reduction="none", log_target=True)
        jsd = beta_t * kl_teacher + (1 - beta_t) * kl_student
    return trl_reduce(jsd, labels, reduction, num_items_in_batch, ignore_index)


def trl_reduce(jsd, labels=None, reduction="batchmean", num_items_in_batch=None, ignore_index=-100):
    """TRL 1.16's reduction of per-entry divergences (`_reduce_divergence_loss`, the same in GKDTrainer and the
    served teacher's trainer), restated with `ignore_index`: the rows labels keep, then sum / num_items_in_batch
    when given, else "batchmean" (sum / max(kept rows, 1)), "sum", "mean" (over the kept rows' entries) or
    "none" ((kept, entries) with labels)."""
    if labels is not None:
        mask = labels != ignore_index
        jsd = jsd[mask]
    if num_items_in_batch is not None:
        jsd_sum = jsd.sum()
        if isinstance(num_items_in_batch, torch.Tensor):
            num_items_in_batch = num_items_in_batch.to(jsd_sum.device)
        return jsd_sum / num_items_in_batch
    if reduction == "batchmean":
        denom = mask.sum().clamp_min(1) if labels is not None else max(jsd.size(0), 1)
        return jsd.sum() / denom
    if reduction == "sum":
        return jsd.sum()
    if reduction == "mean":
        return jsd.mean()
    return jsd


def transformed(z, scale=1.0, softcap=None):
    """The logit transform in TRL's DistillationTrainer order: the scale, then the softcap (c * tanh(x / c))."""
    x = z * scale
    return x if softcap is None else softcap * torch.tanh(x / softcap)


def student_entropy(logits, labels=None, temperature=1.0, scale=1.0, softcap=None, ignore_index=-100):
    """TRL's entropy, log Z - sum(p * z) of z = transformed(logits) / T per row, in float64 from the logits' own
    values; 0 on the rows labels drop."""
    z = transformed(logits.detach().double(), scale, softcap) / temperature
    entropy = torch.logsumexp(z, -1) - (torch.softmax(z, -1) * z).sum(-1)
    return entropy if labels is None else entropy.masked_fill(labels == ignore_index, 0.0)


def jsd_magnitudes(student_logits, teacher_logits, labels, beta, temperature, ignore_index=-100):
    """The scale of each element's float32 rounding errors in the generalized JSD, in float64, for
    assert_close's magnitude: each term of the value with |log-probability| + 1 factors in place of the
    differences that cancel (the value: elementwise; each gradient: its term plus p (or q) times the sum of
    its row's terms, divided by T). Rows that labels drop are 0."""
    s = F.log_softmax(student_logits.double() / temperature, dim=-1)
    t = F.log_softmax(teacher_logits.double() / temperature, dim=-1)
    p, q = s.exp(), t.exp()
    if beta == 0:
        ds = dt = q * ((t - s).abs() + 1) * (t.abs() + s.abs() + 1)
    elif beta == 1:
        ds = dt = p * ((s - t).abs() + 1) * (s.abs() + t.abs() + 1)
    else:
        m = torch.logsumexp(torch.stack([s + math.log1p(-beta), t + math.log(beta)]), dim=0)
        ds = (1 - beta) * p * ((s - m).abs() + 1) * (s.abs() + 1)
        dt = beta * q * ((t - m).abs() + 1) * (t.abs() + 1)
    value = ds + dt
    if labels is not None:
        keep = (labels != ignore_index).unsqueeze(-1).double()
        value, ds, dt = value * keep, ds * keep, dt * keep
    grad_s = (ds + p * ds.sum(-1, keepdim=True)) / temperature
    grad_t = (dt + q * dt.sum(-1, keepdim=True)) / temperature
    return value, grad_s, grad_t


# ---------------------------------------------------------------------------------------------------
# The sparse divergence of a served teacher, from TRL 1.16's ServerDistillationTrainer


def sparse_jsd_reference(student_logits, teacher_logprobs, teacher_token_ids, labels=None, support_mask=None,
                         beta=0.0, temperature=1.0, add_tail=True, reduction="batchmean", num_items_in_batch=None,
                         ignore_index=-100, student_logit_scale=1.0, student_softcap=None):
    """The generalized JSD over a sparse support (docs/semantics.md), written from the served teacher's trainer
    in TRL 1.16 (trl/experimental/server_distillation): the student's full log_softmax of its transformed logits
    over T, gathered at the support's ids; masked entries -inf on both sides (they add nothing to any sum and
    contribute 0); then either the tail bucket log(1 - sum p), its log-sum clamped to at most -1e-7, appended to
    both sides and never masked, or each side renormalized over its support; then the divergence per entry in
    probability space (beta 0: forward KL, 1: reverse KL, else the mixture clamped at the dtype's tiny before
    its log), NaN made 0; then TRL's reduction. Run in float64 it is the reference; in another dtype, TRL's
    numbers."""
    z = transformed(student_logits, student_logit_scale, student_softcap) / temperature
    log_p = F.log_softmax(z, dim=-1)
    mask = (torch.ones(teacher_token_ids.shape, dtype=torch.bool, device=z.device) if support_mask is None
            else support_mask.to(torch.bool))
    ids = torch.where(mask, teacher_token_ids.long(), 0)
    neg_inf = torch.full((), float("-inf"), dtype=log_p.dtype, device=log_p.device)
    s = torch.where(mask, log_p.gather(-1, ids), neg_inf)
    t = torch.where(mask, teacher_logprobs.to(log_p.dtype), neg_inf)
    if add_tail:
        def with_tail(x):
            log_sum = torch.logsumexp(x, dim=-1, keepdim=True).clamp(max=-1e-7)
            return torch.cat([x, torch.log(-torch.expm1(log_sum))], dim=-1)

        s, t = with_tail(s), with_tail(t)
        mask = torch.cat([mask, torch.ones_like(mask[..., :1])], dim=-1)
    else:
        s = s - torch.logsumexp(s, dim=-1, keepdim=True)
        t = t - torch.logsumexp(t, dim=-1, keepdim=True)
    zero = torch.zeros((), dtype=s.dtype, device=s.device)
    s0, t0 = torch.where(mask, s, zero), torch.where(mask, t, zero)
    p, q = torch.where(mask, s.exp(), zero), torch.where(mask, t.exp(), zero)
    if beta == 0:
        jsd = torch.nan_to_num(q * (t0 - s0), nan=0.0)
    elif beta == 1:
        jsd = torch.nan_to_num(p * (s0 - t0), nan=0.0)
    else:
        m = torch.where(mask, torch.log(((1 - beta) * p + beta * q).clamp_min(torch.finfo(p.dtype).tiny)), zero)
        jsd = beta * torch.nan_to_num(q * (t0 - m), nan=0.0) + (1 - beta) * torch.nan_to_num(p * (s0 - m), nan=0.0)
    return trl_reduce(jsd, labels, reduction, num_items_in_batch, ignore_index)
