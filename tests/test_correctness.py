"""Values, shapes and dtypes of every op against float64 references (torch.nn.functional for the forwards
and their autograd, docs/semantics.md's formulas for the backward ops), over the shared samples.

Tests that take `device` run on each device of the run (conftest.py): off the CPU every result is also
compared with the CPU kernels' result for the same inputs."""
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import npu_loss_ops
from npu_loss_ops._reduction import REDUCTION_ENUMS as REDUCTIONS
from reference import (
    RTOL,
    assert_close,
    assert_close_on_device,
    assert_dtype_and_shape,
    cpu_result,
    grad_magnitudes,
    l1_nan_gives_minus_grad,
    on_device,
    reference_backward,
    reference_double_backward,
    reference_forward,
    reference_grads,
    smooth_l1_tbe_divisor,
)
from samples import BACKWARD_OP, LOSSES, Sample, all_samples, away_from_kinks, ids, lowest_precision, opinfo_samples

ALL = [s for loss in LOSSES for s in all_samples(loss)]
OPINFO = [s for loss in LOSSES for s in opinfo_samples(loss)]
OPINFO_LOW = [s for loss in LOSSES for dt in (torch.float32, torch.bfloat16) for s in opinfo_samples(loss, dt)]


def _forward_check(s, device):
    out = on_device(s, device).run_forward()
    value, mag, dtype, shape = reference_forward(s)
    assert_dtype_and_shape(out, dtype, shape, s.name)
    assert_close_on_device(out, value, mag, msg=s.name, device=device, cpu=cpu_result(Sample.run_forward, s, device))


@pytest.mark.parametrize("s", ALL, ids=ids(ALL))
def test_forward_op(s, device):
    _forward_check(s, device)


@pytest.mark.parametrize("s", [s for s in OPINFO + OPINFO_LOW if s.op_compatible],
                         ids=ids([s for s in OPINFO + OPINFO_LOW if s.op_compatible]))
def test_forward_op_opinfo(s, device):
    _forward_check(s, device)


def _backward_check(s, device):
    ds = on_device(s, device)
    out = ds.run_backward()
    chip = s.loss == "l1_loss" and l1_nan_gives_minus_grad(device, out, *ds.backward_args()[0][:3])
    value, mag, dtype, shape = reference_backward(s, l1_at_nan=-1.0 if chip else 0.0)
    assert_dtype_and_shape(out, dtype, shape, s.name)
    differs = _differs(value, reference_backward(s)[0]) if chip else None
    assert_close_on_device(out, value, mag, msg=s.name, device=device, cpu=cpu_result(Sample.run_backward, s, device),
                           chip_differs=differs)


def _differs(a, b):
    """Where two float64 references differ (NaN equal to NaN)."""
    return ~((a == b) | (a.isnan() & b.isnan()))


@pytest.mark.parametrize("s", ALL, ids=ids(ALL))
def test_backward_op(s, device):
    _backward_check(s, device)


SMOOTH_SAME_SHAPE = [
    s for s in all_samples("smooth_l1_loss")
    if s.self.shape == s.backward_shape and s.self.numel() <= 5000 and s.self.dtype == s.target.dtype == s.grad_output.dtype
]


@pytest.mark.parametrize("s", SMOOTH_SAME_SHAPE, ids=ids(SMOOTH_SAME_SHAPE))
def test_smooth_l1_backward_op_matches_aten(s, device):
    """The drop-in promise: same numbers as ATen's own smooth_l1_loss_backward (computed in float64 on the
    CPU)."""
    ours = on_device(s, device).run_backward()
    args, _ = s.backward_args()
    g, x, t = (a.double() for a in args[:3])
    aten = torch.ops.aten.smooth_l1_loss_backward(g, x, t, s.reduction_enum, s.beta)
    if s.beta == 0:
        # ATen's backward kernel returns -g at d == 0 for beta == 0 (its forward takes the L1 path, whose
        # gradient there is 0); docs/semantics.md: sign(0) = 0.
        aten = torch.where(x == t, 0.0, aten)
    _, mag, _, _ = reference_backward(s)
    assert_close_on_device(ours, aten, mag, msg=s.name, device=device, cpu=cpu_result(Sample.run_backward, s, device))


# The losses whose backward op has ATen's schema and numbers exactly (smooth L1's differs at beta == 0, above).
TWIN_SAME_SHAPE = [
    s for loss in ("huber_loss", "mse_loss") for s in all_samples(loss)
    if s.self.shape == s.backward_shape and s.self.numel() <= 5000 and s.self.dtype == s.target.dtype == s.grad_output.dtype
]


@pytest.mark.parametrize("s", TWIN_SAME_SHAPE, ids=ids(TWIN_SAME_SHAPE))
def test_backward_op_matches_aten_twin(s, device):
    """The drop-in promise for Huber and MSE: same numbers as ATen's own huber_loss_backward and
    mse_loss_backward (in float64 on the CPU)."""
    ours = on_device(s, device).run_backward()
    args, _ = s.backward_args()
    g, x, t = (a.double() for a in args[:3])
    aten = getattr(torch.ops.aten, BACKWARD_OP[s.loss])(g, x, t, *args[3:])
    _, mag, _, _ = reference_backward(s)
    assert_close_on_device(ours, aten, mag, msg=s.name, device=device, cpu=cpu_result(Sample.run_backward, s, device))


def _output_grad(s, out):
    """The sample's grad_output made to fit `out` (broadcast down or summed), in out's dtype."""
    g = s.grad_output
    if g.shape != out.shape:
        try:
            g = g.expand(out.shape)
        except RuntimeError:
            g = g.sum_to_size(out.shape)
    return g.to(out.dtype)


def _grads(s, fn, create_graph=False):
    """(x, t, g, out, (grad_self, grad_target)) of fn(self, target) for the sample's output gradient."""
    x = s.self.detach().requires_grad_(True)
    t = s.target.detach().requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fn(x, t, **s.functional_kwargs())
    g = _output_grad(s, out).detach().requires_grad_(create_graph)
    return x, t, g, out, torch.autograd.grad(out, (x, t), g, create_graph=create_graph)


def _autograd_check(s, fn, device):
    ds = on_device(s, device)
    x, t, g, _, (gx, gt) = _grads(ds, fn)
    chip = s.loss == "l1_loss" and l1_nan_gives_minus_grad(device, x, t, g)
    g_cpu = g.detach().cpu()
    ex, et = reference_grads(s, g_cpu, l1_at_nan=-1.0 if chip else 0.0)
    mx, mt = grad_magnitudes(s, g_cpu)
    assert gx.dtype == x.dtype and gx.shape == x.shape
    assert gt.dtype == t.dtype and gt.shape == t.shape
    cx = ct = dx = dt = None
    if device != "cpu":
        _, _, _, _, (cx, ct) = _grads(s, fn)
        if chip:
            fx, ft = reference_grads(s, g_cpu)
            dx, dt = _differs(ex, fx), _differs(et, ft)
    assert_close_on_device(gx, ex, mx, msg=f"{s.name}: grad w.r.t. self", device=device, cpu=cx, chip_differs=dx)
    assert_close_on_device(gt, et, mt, msg=f"{s.name}: grad w.r.t. target", device=device, cpu=ct,
                           chip_differs=dt)


@pytest.mark.parametrize("s", ALL, ids=ids(ALL))
def test_autograd_vs_functional(s, device):
    """npu_loss_ops.<loss> gradients w.r.t. input AND target equal torch.nn.functional's (float64)."""
    _autograd_check(s, getattr(npu_loss_ops, s.loss), device)


@pytest.mark.parametrize("s", OPINFO + OPINFO_LOW, ids=ids(OPINFO + OPINFO_LOW))
def test_autograd_vs_functional_opinfo(s, device):
    _autograd_check(s, getattr(npu_loss_ops, s.loss), device)


# Double backward: kink-free samples (there F's and our piecewise second derivatives are both defined),
# every other one (the first-order checks above already run on all of them).
DOUBLE = [s for s in ALL if away_from_kinks(s) and s.broadcast_shape.numel() <= 5000][::2]


@pytest.mark.parametrize("s", DOUBLE, ids=ids(DOUBLE))
def test_double_backward_vs_functional(s, device):
    """Gradients of <grad_self, vx> + <grad_target, vt> w.r.t. self, target and the output gradient (our
    backward ops' autograd) equal torch.nn.functional's double backward (float64)."""
    ds = on_device(s, device)
    gen = torch.Generator().manual_seed(1)
    # in the gradients' dtypes, so the reference sees the very values used
    vx = torch.rand(s.self.shape, generator=gen, dtype=torch.float64).mul_(2).sub_(1).to(s.self.dtype)
    vt = torch.rand(s.target.shape, generator=gen, dtype=torch.float64).mul_(2).sub_(1).to(s.target.dtype)

    def second(sample, dev):
        x, t, g, _, (gx, gt) = _grads(sample, getattr(npu_loss_ops, s.loss), create_graph=True)
        total = (gx * vx.to(dev)).sum() + (gt * vt.to(dev)).sum()
        return g, torch.autograd.grad(total, (x, t, g), allow_unused=True, materialize_grads=True)

    g, results = second(ds, device)
    cpu = second(s, "cpu")[1] if device != "cpu" else (None,) * 3
    expected = reference_double_backward(s, g.detach().cpu(), vx, vt)
    for name, like, res, (value, mag), c in zip(("self", "target", "grad_output"), (ds.self, ds.target, g),
                                                results, expected, cpu):
        assert res.dtype == like.dtype and res.shape == like.shape, name
        # d/dgrad_output is the backward op itself (rounded once); d/dself and d/dtarget are ATen formulas
        # (autograd.cpp, as derivatives.yaml's) evaluated in the inputs' dtype, two roundings in float16 /
        # bfloat16 (a product and a scale or quotient), as PyTorch's own double backward.
        rtol = 2 * RTOL[s.dtype] if name != "grad_output" and s.dtype in (torch.float16, torch.bfloat16) else None
        assert_close_on_device(res, value, mag, dtype=s.dtype, msg=f"{s.name}: d/d{name}", device=device, cpu=c,
                               rtol=rtol)


@pytest.mark.parametrize("s", OPINFO + OPINFO_LOW, ids=ids(OPINFO + OPINFO_LOW))
def test_functional_forward_opinfo(s, device):
    ds = on_device(s, device)

    def call(sample):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return getattr(npu_loss_ops, s.loss)(sample.self, sample.target, **s.functional_kwargs())

    ours = call(ds)
    ref = getattr(F, s.loss)(s.self.double(), s.target.double(), **s.functional_kwargs())
    assert ours.dtype == s.self.dtype and ours.shape == ref.shape
    assert_close_on_device(ours, ref, msg=s.name, device=device, cpu=cpu_result(call, s, device))


# ---------------------------------------------------------------------------------------------------
# Exact values docs/semantics.md singles out


def _skip_float64_on_npu(dtype, device):
    if device == "npu" and dtype == torch.float64:
        pytest.skip("float64 is rejected on the NPU (TypeError; the error matrix checks it)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("target_shape", [(3, 4), (1, 4)])
def test_kl_target_grad_is_exactly_zero_at_zero_target(dtype, reduction, target_shape, device):
    _skip_float64_on_npu(dtype, device)
    x = torch.randn(3, 4, dtype=dtype).log_softmax(-1)
    t = torch.rand(target_shape, dtype=dtype) + 0.1
    t[..., 1] = 0
    g = torch.ones(3, 4, dtype=dtype) if reduction == "none" else torch.tensor(1.0, dtype=dtype)

    def grads(dev):
        xd, td = x.to(dev), t.to(dev).requires_grad_(True)
        loss = npu_loss_ops.kl_div(xd, td, reduction=reduction)
        (gt,) = torch.autograd.grad(loss, td, torch.ones_like(loss))
        direct = torch.ops.npu_loss.kl_div_target_backward(g.to(dev), xd, td.detach(), REDUCTIONS[reduction], False)
        assert gt.device.type == direct.device.type == dev
        return gt.cpu(), direct.cpu()

    gt, direct = grads(device)
    assert torch.equal(gt[..., 1], torch.zeros_like(gt[..., 1])), gt
    assert torch.isfinite(gt).all()
    assert torch.equal(direct[..., 1], torch.zeros_like(direct[..., 1]))
    # and the non-zero entries match PyTorch
    ref = reference_grads(make_sample_from(x, t, reduction), g)[1]
    assert_close(gt[..., [0, 2, 3]], ref[..., [0, 2, 3]], dtype=dtype)
    if device != "cpu":
        cpu_gt, cpu_direct = grads("cpu")
        assert_close(gt, cpu_gt, ref.abs(), dtype=dtype, msg=f"{device} vs the CPU kernels (autograd)")
        assert_close(direct, cpu_direct, ref.abs(), dtype=dtype, msg=f"{device} vs the CPU kernels (backward op)")


def make_sample_from(x, t, reduction, loss="kl_div", **kw):
    g = torch.ones(()) if reduction != "none" else torch.ones(torch.broadcast_shapes(x.shape, t.shape))
    return Sample(loss, x.detach(), t.detach(), g, reduction, name="adhoc", **kw)


SPECIALS_X = [math.nan, math.inf, -math.inf, 1.0, 0.0, math.inf, math.nan, 2.0, -math.inf, 0.5, 3.0, -1.0]
SPECIALS_T = [0.0, math.inf, 1.0, math.inf, math.nan, -math.inf, 1.0, 2.0, -math.inf, 0.0, 0.0, -1.0]


@pytest.mark.parametrize("loss,beta,log_target", [
    ("smooth_l1_loss", 1.0, False), ("smooth_l1_loss", 0.0, False), ("smooth_l1_loss", math.inf, False),
    ("smooth_l1_loss", 0.5, False), ("l1_loss", 1.0, False), ("kl_div", 1.0, False), ("kl_div", 1.0, True),
    ("huber_loss", 1.0, False), ("huber_loss", 0.5, False), ("huber_loss", 1e-3, False), ("huber_loss", 1e4, False),
    ("huber_loss", math.inf, False), ("mse_loss", 1.0, False),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_nan_inf_like_pytorch(loss, beta, log_target, dtype, reduction, device):
    """NaN / inf inputs give what PyTorch's CPU kernels give (forward and gradients); on the TBE chips the
    L1 gradient at a NaN is -grad (docs/semantics.md's one documented chip difference, asserted exactly there)."""
    _skip_float64_on_npu(dtype, device)
    x = torch.tensor(SPECIALS_X, dtype=dtype)
    t = torch.tensor(SPECIALS_T, dtype=dtype)
    if loss == "kl_div" and not log_target:
        # probabilities: no negative finite ones; +inf targets have their own test below
        t = t.abs().nan_to_num(posinf=5.0)

    n = x.numel()
    g = torch.linspace(-2, 2, n, dtype=dtype) if reduction == "none" else torch.tensor(1.5, dtype=dtype)
    s = Sample(loss, x, t, g, reduction, beta, log_target, name=f"specials-{loss}")
    _forward_check(s, device)
    _backward_check(s, device)
    # Against PyTorch's own autograd (KL's target gradient at target == 0 excepted, per docs/semantics.md).
    _autograd_check(s, getattr(npu_loss_ops, loss), device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kl_target_grad_at_inf_target_like_pytorch(dtype, device):
    _skip_float64_on_npu(dtype, device)
    x = torch.tensor([1.0, -2.0, 0.0], dtype=dtype)
    t = torch.tensor([math.inf, math.inf, math.inf], dtype=dtype)
    td = t.to(device).requires_grad_(True)
    (ours,) = torch.autograd.grad(npu_loss_ops.kl_div(x.to(device), td, reduction="sum"), td)
    t.requires_grad_(True)
    (ref,) = torch.autograd.grad(F.kl_div(x, t, reduction="sum"), t)
    assert ours.device.type == device
    assert torch.equal(ours.cpu().isnan(), ref.isnan()), (ours, ref)


def test_l1_grad_at_nan(device):
    """0 at a NaN input, as PyTorch; -grad on the TBE chips (docs/semantics.md's one documented chip difference)."""
    x = torch.tensor([math.nan, 1.0, math.nan])
    t = torch.tensor([0.0, math.nan, math.nan])
    expected = torch.full((3,), -1.0 if l1_nan_gives_minus_grad(device, x, t) else 0.0)
    xd, td = x.to(device).requires_grad_(True), t.to(device).requires_grad_(True)
    gx, gt = torch.autograd.grad(npu_loss_ops.l1_loss(xd, td, reduction="sum"), (xd, td))
    assert gx.device.type == device
    assert torch.equal(gx.cpu(), expected) and torch.equal(gt.cpu(), expected), (gx, gt)
    out = torch.ops.npu_loss.l1_loss_backward(torch.tensor(1.0).to(device), xd.detach(), td.detach(), 2)
    assert torch.equal(out.cpu(), expected), out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_smooth_l1_beta_inf_and_zero(dtype, device):
    _skip_float64_on_npu(dtype, device)
    x = torch.tensor([-math.inf, -2.0, -0.5, 0.0, 0.5, 2.0, math.inf], dtype=dtype, device=device)
    t = torch.zeros(7, dtype=dtype, device=device)
    g = torch.full((7,), 3.0, dtype=dtype, device=device)
    inf_grad = torch.ops.npu_loss.smooth_l1_loss_backward(g, x, t, 0, math.inf).cpu()
    assert torch.equal(inf_grad, torch.tensor([-3.0, 0, 0, 0, 0, 0, 3.0], dtype=dtype)), inf_grad
    zero_grad = torch.ops.npu_loss.smooth_l1_loss_backward(g, x, t, 0, 0.0).cpu()
    assert torch.equal(zero_grad, torch.tensor([-3.0, -3, -3, 0, 3, 3, 3], dtype=dtype)), zero_grad
    # exactly +-g at |d| == beta
    at_beta = torch.ops.npu_loss.smooth_l1_loss_backward(g, x, t, 0, 0.5).cpu()
    assert at_beta[2].item() == -3.0 and at_beta[4].item() == 3.0
    # beta == 0 forward is exactly L1
    assert torch.equal(torch.ops.npu_loss.smooth_l1_loss(x, t, 0, 0.0).cpu(), x.abs().cpu())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("beta", [1e-7, 1e-30, 5e-324])
def test_smooth_l1_tiny_beta_no_epsilon(beta, dtype, device):
    """Divides by beta itself (no epsilon): d/beta inside the tiny band, sign(d) outside (exactly in
    float64; in float32 to its rounding)."""
    _skip_float64_on_npu(dtype, device)
    x = torch.tensor([0.5e-7, -1.0, 0.0, 2.0, 1e-45], dtype=dtype)
    t = torch.zeros(5, dtype=dtype)
    g = torch.ones(5, dtype=dtype)
    out = torch.ops.npu_loss.smooth_l1_loss_backward(g.to(device), x.to(device), t.to(device), 0, beta).cpu()
    x64 = x.double()
    expected = torch.where(x64.abs() >= beta, torch.sign(x64), x64 / beta)
    if dtype == torch.float64:
        assert torch.equal(out, expected)
    else:
        assert_close(out, expected, msg=f"beta={beta}")


# ---------------------------------------------------------------------------------------------------
# Empty tensors


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_empty_forward(loss, dtype, device):
    _skip_float64_on_npu(dtype, device)
    x = torch.empty(0, 3, dtype=dtype, device=device)
    t = torch.empty(0, 3, dtype=dtype, device=device)
    op = getattr(torch.ops.npu_loss, loss)
    assert op(x, t, 0).shape == (0, 3)
    s = op(x, t, 2)
    assert s.shape == () and s.dtype == dtype and s.device.type == device and s.item() == 0
    m = op(x, t, 1)
    assert m.shape == () and m.dtype == dtype and math.isnan(m.item())


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_empty_backward(loss, reduction, device):
    x = torch.empty(0, 3, device=device)
    t = (torch.rand(3) + 0.5).to(device)
    g = torch.empty(0, 3, device=device) if reduction == 0 else torch.tensor(1.0, device=device)
    if loss == "smooth_l1_loss":
        out = torch.ops.npu_loss.smooth_l1_loss_backward(g, x, t, reduction, 1.0)
        assert out.shape == (0, 3) and out.device.type == device
    elif loss == "huber_loss":
        out = torch.ops.npu_loss.huber_loss_backward(g, x, t, reduction, 1.0)
        assert out.shape == (0, 3) and out.device.type == device
    elif loss in ("l1_loss", "mse_loss"):
        out = getattr(torch.ops.npu_loss, BACKWARD_OP[loss])(g, x, t, reduction)
        assert out.shape == (0, 3) and out.device.type == device
    else:
        for log_target in (False, True):
            out = torch.ops.npu_loss.kl_div_target_backward(g, x, t, reduction, log_target)
            assert out.shape == (3,) and out.device.type == device
            assert torch.equal(out.cpu(), torch.zeros(3)), out
            buf = torch.full((3,), math.nan, device=device)
            torch.ops.npu_loss.kl_div_target_backward.grad_target(g, x, t, reduction, log_target, grad_target=buf)
            assert torch.equal(buf.cpu(), torch.zeros(3)), buf


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
def test_out_matches_functional(s, device):
    ds = on_device(s, device)
    dtype, shape = _result_spec(s)
    expected = ds.run_backward()
    out = torch.full(shape, math.nan, dtype=dtype, device=device)
    res = _call_out(ds, out)
    assert res is out
    assert torch.equal(out.cpu(), expected.cpu())
    if device != "cpu":
        value, mag, _, _ = reference_backward(s)
        assert_close_on_device(out, value, mag, msg=f"{s.name} out=", device=device, cpu=s.run_backward())


def _non_contiguous_cases():
    for s in OUT_SAMPLES[::3]:
        shape = _result_spec(s)[1]
        if len(shape) >= 2 and shape[-1] > 1 and shape[-2] > 1:
            yield pytest.param(s, "transposed", id=f"{s.name}-transposed")
        if len(shape) >= 1 and shape[-1] > 1:
            yield pytest.param(s, "sliced", id=f"{s.name}-sliced")


@pytest.mark.parametrize("s,layout", list(_non_contiguous_cases()))
def test_out_non_contiguous(s, layout, device):
    ds = on_device(s, device)
    dtype, shape = _result_spec(s)
    expected = ds.run_backward()
    if layout == "transposed":
        out = torch.full(tuple(shape[:-2]) + (shape[-1], shape[-2]), math.nan, dtype=dtype, device=device).mT
    else:
        buf = torch.full(tuple(shape[:-1]) + (shape[-1] * 2,), math.nan, dtype=dtype, device=device)
        out = buf[..., 1::2]
    assert not out.is_contiguous()
    res = _call_out(ds, out)
    assert res is out
    # A strided output takes the TensorIterator loop, whose log/exp may differ from the dense fast path's
    # in the last bit: compare to rounding, and to the float64 reference.
    value, mag, _, _ = reference_backward(s)
    assert_close_on_device(out, value, mag, msg=f"{s.name} non-contiguous out=", device=device,
                           cpu=cpu_result(Sample.run_backward, s, device))
    assert_close(out.cpu(), expected.cpu(), mag, msg=f"{s.name} non-contiguous out= vs functional")
    if layout == "sliced":
        assert buf[..., ::2].cpu().isnan().all(), "wrote outside the out= view"


@pytest.mark.parametrize("s", OUT_SAMPLES[::2], ids=ids(OUT_SAMPLES[::2]))
def test_out_other_float_dtype(s, device):
    ds = on_device(s, device)
    dtype, shape = _result_spec(s)
    value, mag, _, _ = reference_backward(s)
    for out_dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        if s.loss == "kl_div" and out_dtype != dtype:
            continue  # grad_target must have target's dtype (an error case, see test_errors)
        if device == "npu" and out_dtype == torch.float64:
            continue  # float64 is rejected on the NPU (an error case, see test_errors)
        out = torch.full(shape, math.nan, dtype=out_dtype, device=device)
        assert _call_out(ds, out) is out
        cpu = None
        if device != "cpu":
            cpu = torch.full(shape, math.nan, dtype=out_dtype)
            _call_out(s, cpu)
        # The reference rounded to out's dtype too: a float16 out holds values below 6.1e-5 as subnormals,
        # whose fixed spacing (6e-8) no relative tolerance covers (Huber's small deltas reach them).
        expected = value.to(out_dtype).to(value.dtype) if out_dtype == torch.float16 else value
        # A float16 result cast into another out dtype was rounded twice (the NPU computes in the result's
        # dtype, the CPU writes out's directly): half a float16 subnormal step apart at most.
        atol = 2.0**-25 if dtype == torch.float16 and out_dtype != torch.float16 else 0.0
        assert_close_on_device(out, expected, mag, dtype=lowest_precision(dtype, out_dtype),
                               msg=f"{s.name} into {out_dtype}", device=device, cpu=cpu, atol=atol)


ALIAS_SAMPLES = [
    s for s in OUT_SAMPLES
    if s.self.shape == s.target.shape == s.grad_output.shape == s.backward_shape
    and s.self.dtype == s.target.dtype == s.grad_output.dtype
    and s.self.stride() == s.target.stride() == s.grad_output.stride()
    and all(st != 0 for st in s.self.stride())
]


@pytest.mark.parametrize("s", ALIAS_SAMPLES, ids=ids(ALIAS_SAMPLES))
@pytest.mark.parametrize("which", [0, 1, 2])
def test_out_exact_alias_of_an_input(s, which, device):
    """out=self (or grad_output, or target): allowed where the result has the broadcast shape."""
    ds = on_device(s, device)
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in ds.backward_args()[0]]
    expected = ds.backward_op()(*args)
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in ds.backward_args()[0]]
    # clone() of a non-dense view is contiguous: make all three the same layout again
    args[:3] = [a.contiguous() for a in args[:3]]
    out = args[which]
    res = _call_out(ds, out, args)
    assert res is out
    assert torch.equal(out.cpu(), expected.cpu()), f"out= aliasing argument {which}"
    if device != "cpu":
        value, mag, _, _ = reference_backward(s)
        assert_close_on_device(out, value, mag, msg=f"{s.name} out= aliasing argument {which}", device=device,
                               cpu=s.run_backward())


# ---------------------------------------------------------------------------------------------------
# Reduced precision: computed in float32, rounded once (docs/semantics.md, "Reduced precision")

COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutograd


@pytest.mark.parametrize("path", ["kernel", "composite"])
@pytest.mark.parametrize("target_shape", [(64, 80), (1, 80)], ids=["same-shape", "broadcast-target"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("loss,log_target", [("smooth_l1_loss", False), ("l1_loss", False), ("kl_div", False),
                                             ("kl_div", True), ("huber_loss", False), ("mse_loss", False)])
def test_reduced_precision_is_rounded_once(loss, log_target, dtype, reduction, layout, target_shape, path,
                                          device):
    """float16/bfloat16 results are the float64 reference correctly rounded (float32 math may flip a rare
    tie), never off by more than one unit in the last place: no intermediate rounding to the low dtype
    (a broadcast target: KL's target gradient is summed over the broadcast rows, in float32, then rounded).
    `kernel`: the device's own kernels (CPU / aclnn); `composite`: the ATen-op fallback on that device."""
    from samples import make_sample

    s = make_sample(loss, (64, 80), target_shape, dtype=dtype, reduction=reduction, beta=0.5,
                    log_target=log_target, layout=layout)
    ds = s.to(device)
    call = (lambda op, *a, **k: op._op_dk(COMPOSITE, *a, **k)) if path == "composite" else (
        lambda op, *a, **k: op(*a, **k))
    for kind in ("forward", "backward"):
        if kind == "forward":
            args, kwargs = ds.forward_args()
            out = call(ds.forward_op(), *args, **kwargs)
            value = reference_forward(s)[0]
        else:
            args, kwargs = ds.backward_args()
            out = call(ds.backward_op(), *args, **kwargs)
            # the TBE chips' smooth L1 kernel (Huber's too) divides by beta + 1e-6 (docs/npu_paths.md): the
            # value it rounds once
            divisor = smooth_l1_tbe_divisor(device, s.beta, out, *args[:3]) if (
                loss in ("smooth_l1_loss", "huber_loss") and path == "kernel") else None
            value = reference_backward(s, smooth_l1_divisor=divisor)[0]
        assert out.device.type == device
        out = out.cpu()
        rounded = value.to(dtype)
        exact = (out == rounded).double().mean().item()
        assert exact >= 0.99, f"{kind}: only {exact:.2%} correctly rounded"
        err = (out.double() - value).abs()
        assert (err <= torch.finfo(dtype).eps * value.abs() + torch.finfo(dtype).tiny).all(), f"{kind}: > 1 ulp"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_a_sum_beyond_the_dtype_range_is_inf_as_in_torch(dtype, device):
    """A 'sum' the result dtype cannot hold is inf, as torch.nn.functional gives it (torch 2.7's
    scalar_tensor refused such a value; csrc/cpu/loops.h, scalar_result)."""
    big = torch.finfo(dtype).max
    x, t = torch.tensor([big, big, -big], dtype=dtype), torch.zeros(3, dtype=dtype)
    for name, ours, theirs in (("l1", npu_loss_ops.l1_loss, F.l1_loss),
                               ("huber", npu_loss_ops.huber_loss, F.huber_loss),
                               ("mse", npu_loss_ops.mse_loss, F.mse_loss)):
        got = ours(x.to(device), t.to(device), reduction="sum").cpu()
        want = theirs(x, t, reduction="sum")
        assert want.isinf() and got.dtype == want.dtype and torch.equal(got, want), (name, got)
