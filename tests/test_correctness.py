"""Values, shapes and dtypes of every op against float64 references (torch.nn.functional for the forwards
and their autograd, SPEC.md's formulas for the backward ops), over the shared samples."""
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import npu_loss_ops
from reference import (
    assert_close,
    grad_magnitudes,
    lowest,
    reference_backward,
    reference_forward,
    reference_grads,
)
from samples import LOSSES, all_samples, ids, opinfo_samples

ALL = [s for loss in LOSSES for s in all_samples(loss)]
OPINFO = [s for loss in LOSSES for s in opinfo_samples(loss)]
OPINFO_LOW = [s for loss in LOSSES for dt in (torch.float32, torch.bfloat16) for s in opinfo_samples(loss, dt)]


def _forward_check(s):
    args, kwargs = s.forward_args()
    out = s.forward_op()(*args, **kwargs)
    value, mag, dtype, shape = reference_forward(s)
    assert out.dtype == dtype, f"result dtype {out.dtype}, SPEC says {dtype}"
    assert out.shape == shape, f"result shape {tuple(out.shape)}, SPEC says {tuple(shape)}"
    assert_close(out, value, mag, msg=s.name)


@pytest.mark.parametrize("s", ALL, ids=ids(ALL))
def test_forward_op(s):
    _forward_check(s)


@pytest.mark.parametrize("s", [s for s in OPINFO + OPINFO_LOW if s.op_compatible],
                         ids=ids([s for s in OPINFO + OPINFO_LOW if s.op_compatible]))
def test_forward_op_opinfo(s):
    _forward_check(s)


@pytest.mark.parametrize("s", ALL, ids=ids(ALL))
def test_backward_op(s):
    args, kwargs = s.backward_args()
    out = s.backward_op()(*args, **kwargs)
    value, mag, dtype, shape = reference_backward(s)
    assert out.dtype == dtype, f"result dtype {out.dtype}, SPEC says {dtype}"
    assert out.shape == shape, f"result shape {tuple(out.shape)}, SPEC says {tuple(shape)}"
    assert_close(out, value, mag, msg=s.name)


SMOOTH_SAME_SHAPE = [
    s for s in all_samples("smooth_l1_loss")
    if s.self.shape == s.backward_shape and s.self.numel() <= 5000 and s.self.dtype == s.target.dtype == s.grad_output.dtype
]


@pytest.mark.parametrize("s", SMOOTH_SAME_SHAPE, ids=ids(SMOOTH_SAME_SHAPE))
def test_smooth_l1_backward_op_matches_aten(s):
    """The drop-in promise: same numbers as ATen's own smooth_l1_loss_backward (computed in float64)."""
    args, _ = s.backward_args()
    ours = s.backward_op()(*args)
    g, x, t = (a.double() for a in args[:3])
    aten = torch.ops.aten.smooth_l1_loss_backward(g, x, t, s.reduction_enum, s.beta)
    if s.beta == 0:
        # ATen's backward kernel returns -g at d == 0 for beta == 0 (its forward takes the L1 path, whose
        # gradient there is 0); SPEC: sign(0) = 0.
        aten = torch.where(x == t, 0.0, aten)
    _, mag, _, _ = reference_backward(s)
    assert_close(ours, aten, mag, msg=s.name)


def _output_grad(s, out):
    """The sample's grad_output made to fit `out` (broadcast down or summed), in out's dtype."""
    g = s.grad_output
    if g.shape != out.shape:
        try:
            g = g.expand(out.shape)
        except RuntimeError:
            g = g.sum_to_size(out.shape)
    return g.to(out.dtype)


def _autograd_check(s, fn):
    x = s.self.detach().requires_grad_(True)
    t = s.target.detach().requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fn(x, t, **s.functional_kwargs())
    g = _output_grad(s, out)
    gx, gt = torch.autograd.grad(out, (x, t), g)
    ex, et = reference_grads(s, g)
    mx, mt = grad_magnitudes(s, g)
    assert gx.dtype == x.dtype and gx.shape == x.shape
    assert gt.dtype == t.dtype and gt.shape == t.shape
    assert_close(gx, ex, mx, msg=f"{s.name}: grad w.r.t. self")
    assert_close(gt, et, mt, msg=f"{s.name}: grad w.r.t. target")


@pytest.mark.parametrize("s", ALL, ids=ids(ALL))
def test_autograd_vs_functional(s):
    """npu_loss_ops.<loss> gradients w.r.t. input AND target equal torch.nn.functional's (float64)."""
    _autograd_check(s, getattr(npu_loss_ops, s.loss))


@pytest.mark.parametrize("s", OPINFO + OPINFO_LOW, ids=ids(OPINFO + OPINFO_LOW))
def test_autograd_vs_functional_opinfo(s):
    _autograd_check(s, getattr(npu_loss_ops, s.loss))


@pytest.mark.parametrize("s", OPINFO + OPINFO_LOW, ids=ids(OPINFO + OPINFO_LOW))
def test_functional_forward_opinfo(s):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = getattr(npu_loss_ops, s.loss)(s.self, s.target, **s.functional_kwargs())
        ref = getattr(F, s.loss)(s.self.double(), s.target.double(), **s.functional_kwargs())
    assert ours.dtype == s.self.dtype and ours.shape == ref.shape
    assert_close(ours, ref, msg=s.name)


# ---------------------------------------------------------------------------------------------------
# Exact values the SPEC singles out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("target_shape", [(3, 4), (1, 4)])
def test_kl_target_grad_is_exactly_zero_at_zero_target(dtype, reduction, target_shape):
    x = torch.randn(3, 4, dtype=dtype).log_softmax(-1)
    t = torch.rand(target_shape, dtype=dtype) + 0.1
    t[..., 1] = 0
    t = t.requires_grad_(True)
    loss = npu_loss_ops.kl_div(x, t, reduction=reduction)
    (gt,) = torch.autograd.grad(loss, t, torch.ones_like(loss))
    assert torch.equal(gt[..., 1], torch.zeros_like(gt[..., 1])), gt
    assert torch.isfinite(gt).all()
    g = torch.ones(3, 4, dtype=dtype) if reduction == "none" else torch.tensor(1.0, dtype=dtype)
    direct = torch.ops.npu_loss.kl_div_target_backward(g, x, t.detach(), {"none": 0, "mean": 1, "sum": 2}[reduction], False)
    assert torch.equal(direct[..., 1], torch.zeros_like(direct[..., 1]))
    # and the non-zero entries match PyTorch
    ref = reference_grads(make_sample_from(x, t, reduction), g)[1]
    assert_close(gt[..., [0, 2, 3]], ref[..., [0, 2, 3]], dtype=dtype)


def make_sample_from(x, t, reduction, loss="kl_div", **kw):
    from samples import Sample

    g = torch.ones(()) if reduction != "none" else torch.ones(torch.broadcast_shapes(x.shape, t.shape))
    return Sample(loss, x.detach(), t.detach(), g, reduction, name="adhoc", **kw)


SPECIALS_X = [math.nan, math.inf, -math.inf, 1.0, 0.0, math.inf, math.nan, 2.0, -math.inf, 0.5, 3.0, -1.0]
SPECIALS_T = [0.0, math.inf, 1.0, math.inf, math.nan, -math.inf, 1.0, 2.0, -math.inf, 0.0, 0.0, -1.0]


@pytest.mark.parametrize("loss,beta,log_target", [
    ("smooth_l1_loss", 1.0, False), ("smooth_l1_loss", 0.0, False), ("smooth_l1_loss", math.inf, False),
    ("smooth_l1_loss", 0.5, False), ("l1_loss", 1.0, False), ("kl_div", 1.0, False), ("kl_div", 1.0, True),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_nan_inf_like_pytorch(loss, beta, log_target, dtype, reduction):
    """NaN / inf inputs give what PyTorch's CPU kernels give (forward and gradients)."""
    x = torch.tensor(SPECIALS_X, dtype=dtype)
    t = torch.tensor(SPECIALS_T, dtype=dtype)
    if loss == "kl_div" and not log_target:
        # probabilities: no negative finite ones; +inf targets have their own test below
        t = t.abs().nan_to_num(posinf=5.0)
    from samples import Sample

    n = x.numel()
    g = torch.linspace(-2, 2, n, dtype=dtype) if reduction == "none" else torch.tensor(1.5, dtype=dtype)
    s = Sample(loss, x, t, g, reduction, beta, log_target, name=f"specials-{loss}")
    _forward_check(s)
    args, _ = s.backward_args()
    out = s.backward_op()(*args)
    value, mag, _, _ = reference_backward(s)
    assert_close(out, value, mag, msg=f"{s.name} backward op")
    # Against PyTorch's own autograd (KL's target gradient at target == 0 excepted, per SPEC).
    _autograd_check(s, getattr(npu_loss_ops, loss))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kl_target_grad_at_inf_target_like_pytorch(dtype):
    x = torch.tensor([1.0, -2.0, 0.0], dtype=dtype)
    t = torch.tensor([math.inf, math.inf, math.inf], dtype=dtype, requires_grad=True)
    (ours,) = torch.autograd.grad(npu_loss_ops.kl_div(x, t, reduction="sum"), t)
    (ref,) = torch.autograd.grad(F.kl_div(x, t, reduction="sum"), t)
    assert torch.equal(ours.isnan(), ref.isnan()), (ours, ref)


def test_l1_grad_at_nan_is_zero():
    x = torch.tensor([math.nan, 1.0, math.nan], requires_grad=True)
    t = torch.tensor([0.0, math.nan, math.nan], requires_grad=True)
    gx, gt = torch.autograd.grad(npu_loss_ops.l1_loss(x, t, reduction="sum"), (x, t))
    assert torch.equal(gx, torch.zeros(3)) and torch.equal(gt, torch.zeros(3))
    out = torch.ops.npu_loss.l1_loss_backward(torch.tensor(1.0), x.detach(), t.detach(), 2)
    assert torch.equal(out, torch.zeros(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_smooth_l1_beta_inf_and_zero(dtype):
    x = torch.tensor([-math.inf, -2.0, -0.5, 0.0, 0.5, 2.0, math.inf], dtype=dtype)
    t = torch.zeros(7, dtype=dtype)
    g = torch.full((7,), 3.0, dtype=dtype)
    inf_grad = torch.ops.npu_loss.smooth_l1_loss_backward(g, x, t, 0, math.inf)
    assert torch.equal(inf_grad, torch.tensor([-3.0, 0, 0, 0, 0, 0, 3.0], dtype=dtype)), inf_grad
    zero_grad = torch.ops.npu_loss.smooth_l1_loss_backward(g, x, t, 0, 0.0)
    assert torch.equal(zero_grad, torch.tensor([-3.0, -3, -3, 0, 3, 3, 3], dtype=dtype)), zero_grad
    # exactly +-g at |d| == beta
    at_beta = torch.ops.npu_loss.smooth_l1_loss_backward(g, x, t, 0, 0.5)
    assert at_beta[2].item() == -3.0 and at_beta[4].item() == 3.0
    # beta == 0 forward is exactly L1
    assert torch.equal(torch.ops.npu_loss.smooth_l1_loss(x, t, 0, 0.0), x.abs())


@pytest.mark.parametrize("beta", [1e-7, 1e-30, 5e-324])
def test_smooth_l1_tiny_beta_no_epsilon(beta):
    """Divides by beta itself (no epsilon): d/beta inside the tiny band, sign(d) outside."""
    x = torch.tensor([0.5e-7, -1.0, 0.0, 2.0], dtype=torch.float64)
    t = torch.zeros(4, dtype=torch.float64)
    out = torch.ops.npu_loss.smooth_l1_loss_backward(torch.ones(4, dtype=torch.float64), x, t, 0, beta)
    expected = torch.where(x.abs() >= beta, torch.sign(x), x / beta)
    assert torch.equal(out, expected)


# ---------------------------------------------------------------------------------------------------
# Empty tensors


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_empty_forward(loss, dtype):
    x = torch.empty(0, 3, dtype=dtype)
    t = torch.empty(0, 3, dtype=dtype)
    op = getattr(torch.ops.npu_loss, loss)
    assert op(x, t, 0).shape == (0, 3)
    s = op(x, t, 2)
    assert s.shape == () and s.dtype == dtype and s.item() == 0
    m = op(x, t, 1)
    assert m.shape == () and m.dtype == dtype and math.isnan(m.item())


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_empty_backward(loss, reduction):
    x = torch.empty(0, 3)
    t = torch.rand(3) + 0.5
    g = torch.empty(0, 3) if reduction == 0 else torch.tensor(1.0)
    if loss == "smooth_l1_loss":
        out = torch.ops.npu_loss.smooth_l1_loss_backward(g, x, t, reduction, 1.0)
        assert out.shape == (0, 3)
    elif loss == "l1_loss":
        out = torch.ops.npu_loss.l1_loss_backward(g, x, t, reduction)
        assert out.shape == (0, 3)
    else:
        for log_target in (False, True):
            out = torch.ops.npu_loss.kl_div_target_backward(g, x, t, reduction, log_target)
            assert out.shape == (3,) and torch.equal(out, torch.zeros(3)), out
            buf = torch.full((3,), math.nan)
            torch.ops.npu_loss.kl_div_target_backward.grad_target(g, x, t, reduction, log_target, grad_target=buf)
            assert torch.equal(buf, torch.zeros(3)), buf


# ---------------------------------------------------------------------------------------------------
# out= overloads

OUT_SAMPLES = [
    s for s in ALL
    if s.op_compatible and 0 < s.backward_shape.numel() <= 5000 and s.dtype != torch.float64
]


def _call_out(s, out, args=None):
    args = args if args is not None else s.backward_args()[0]
    return s.out_op()(*args, **{s.out_name: out})


def _result_spec(s):
    _, _, dtype, shape = reference_backward(s)
    return dtype, shape


@pytest.mark.parametrize("s", OUT_SAMPLES, ids=ids(OUT_SAMPLES))
def test_out_matches_functional(s):
    dtype, shape = _result_spec(s)
    expected = s.backward_op()(*s.backward_args()[0])
    out = torch.full(shape, math.nan, dtype=dtype)
    res = _call_out(s, out)
    assert res is out
    assert torch.equal(out, expected)


def _non_contiguous_cases():
    for s in OUT_SAMPLES[::3]:
        shape = _result_spec(s)[1]
        if len(shape) >= 2 and shape[-1] > 1 and shape[-2] > 1:
            yield pytest.param(s, "transposed", id=f"{s.name}-transposed")
        if len(shape) >= 1 and shape[-1] > 1:
            yield pytest.param(s, "sliced", id=f"{s.name}-sliced")


@pytest.mark.parametrize("s,layout", list(_non_contiguous_cases()))
def test_out_non_contiguous(s, layout):
    dtype, shape = _result_spec(s)
    expected = s.backward_op()(*s.backward_args()[0])
    if layout == "transposed":
        out = torch.full(tuple(shape[:-2]) + (shape[-1], shape[-2]), math.nan, dtype=dtype).mT
    else:
        buf = torch.full(tuple(shape[:-1]) + (shape[-1] * 2,), math.nan, dtype=dtype)
        out = buf[..., 1::2]
    assert not out.is_contiguous()
    res = _call_out(s, out)
    assert res is out
    # A strided output takes the TensorIterator route, whose log/exp may differ from the dense fast path's
    # in the last bit: compare to rounding, and to the float64 reference.
    value, mag, _, _ = reference_backward(s)
    assert_close(out, value, mag, msg=f"{s.name} non-contiguous out=")
    assert_close(out, expected, mag, msg=f"{s.name} non-contiguous out= vs functional")
    if layout == "sliced":
        assert buf[..., ::2].isnan().all(), "wrote outside the out= view"


@pytest.mark.parametrize("s", OUT_SAMPLES[::2], ids=ids(OUT_SAMPLES[::2]))
def test_out_other_float_dtype(s):
    dtype, shape = _result_spec(s)
    value, mag, _, _ = reference_backward(s)
    for out_dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        if s.loss == "kl_div" and out_dtype != dtype:
            continue  # grad_target must have target's dtype (an error case, see test_errors)
        out = torch.full(shape, math.nan, dtype=out_dtype)
        assert _call_out(s, out) is out
        assert_close(out, value, mag, dtype=lowest(dtype, out_dtype), msg=f"{s.name} into {out_dtype}")


ALIAS_SAMPLES = [
    s for s in OUT_SAMPLES
    if s.self.shape == s.target.shape == s.grad_output.shape == s.backward_shape
    and s.self.dtype == s.target.dtype == s.grad_output.dtype
    and s.self.stride() == s.target.stride() == s.grad_output.stride()
    and all(st != 0 for st in s.self.stride())
]


@pytest.mark.parametrize("s", ALIAS_SAMPLES, ids=ids(ALIAS_SAMPLES))
@pytest.mark.parametrize("which", [0, 1, 2])
def test_out_exact_alias_of_an_input(s, which):
    """out=self (or grad_output, or target): allowed where the result has the broadcast shape."""
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in s.backward_args()[0]]
    expected = s.backward_op()(*args)
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in s.backward_args()[0]]
    # clone() of a non-dense view is contiguous: make all three the same layout again
    args[:3] = [a.contiguous() for a in args[:3]]
    out = args[which]
    res = _call_out(s, out, args)
    assert res is out
    assert torch.equal(out, expected), f"out= aliasing argument {which}"


# ---------------------------------------------------------------------------------------------------
# Reduced precision: computed in float32, rounded once (SPEC)

COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutograd


@pytest.mark.parametrize("path", ["cpu", "composite"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("loss,log_target", [("smooth_l1_loss", False), ("l1_loss", False), ("kl_div", False),
                                             ("kl_div", True)])
def test_reduced_precision_is_rounded_once(loss, log_target, dtype, reduction, layout, path):
    """float16/bfloat16 results are the float64 reference correctly rounded (float32 math may flip a rare
    tie), never off by more than one unit in the last place: no intermediate rounding to the low dtype."""
    from samples import make_sample

    s = make_sample(loss, (64, 80), (64, 80), dtype=dtype, reduction=reduction, beta=0.5,
                    log_target=log_target, layout=layout)
    call = (lambda op, *a, **k: op._op_dk(COMPOSITE, *a, **k)) if path == "composite" else (
        lambda op, *a, **k: op(*a, **k))
    for kind in ("forward", "backward"):
        if kind == "forward":
            args, kwargs = s.forward_args()
            out = call(s.forward_op(), *args, **kwargs)
            value = reference_forward(s)[0]
        else:
            args, kwargs = s.backward_args()
            out = call(s.backward_op(), *args, **kwargs)
            value = reference_backward(s)[0]
        rounded = value.to(dtype)
        exact = (out == rounded).double().mean().item()
        assert exact >= 0.99, f"{kind}: only {exact:.2%} correctly rounded"
        err = (out.double() - value).abs()
        assert (err <= torch.finfo(dtype).eps * value.abs() + torch.finfo(dtype).tiny).all(), f"{kind}: > 1 ulp"
