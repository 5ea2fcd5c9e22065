"""Memory formats: results and gradients follow the inputs' layout (docs/semantics.md, "Memory format").

An elementwise result is laid out like the first operand, in the op's priority order, that has the result's
full shape (its suggested memory format: channels_last for 4-D NHWC tensors, channels_last_3d for 5-D
NDHWC ones): (self, target) for the forwards with reduction='none', (self, target, grad_output) for the
smooth L1 and L1 gradients, and target for the KL target gradient. Each autograd gradient is laid out like
the input it belongs to; an out= tensor keeps its own layout. Every case runs on the op's device kernel (the
CPU kernels, or aclnn on the NPU), on the composite fallback, and under FakeTensorMode, and its values
equal those of the same call on contiguous copies.
"""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import npu_loss_ops

OPS = torch.ops.npu_loss
COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutograd
NONE, MEAN, SUM = 0, 1, 2

SHAPES = {torch.channels_last: (2, 3, 4, 5), torch.channels_last_3d: (2, 3, 2, 4, 3)}
FORMATS = list(SHAPES)
# (self, target) layouts: "fmt" = the tested channels-last format at full shape, "contig" = contiguous at
# full shape, "bcast" = a contiguous (1, C, 1, 1[, 1]) tensor broadcast against the other operand.
PAIRS = [("fmt", "fmt"), ("fmt", "contig"), ("contig", "fmt"), ("fmt", "bcast"), ("bcast", "fmt")]
# The four losses, KL twice: "kl_div[log]" is kl_div with log_target=True.
LOSS_VARIANTS = ["smooth_l1_loss", "l1_loss", "kl_div", "kl_div[log]", "huber_loss", "mse_loss"]


def _make(kind, fmt, device, dtype, positive, seed):
    shape = SHAPES[fmt]
    if kind == "bcast":
        shape = (1, shape[1]) + (1,) * (len(shape) - 2)
    gen = torch.Generator().manual_seed(seed)
    t = torch.rand(shape, generator=gen) + 0.1 if positive else torch.randn(shape, generator=gen)
    t = t.to(dtype)
    if kind == "fmt":
        t = t.contiguous(memory_format=fmt)
    return t.to(device)


def _format_of(t):
    """The memory format a tensor is dense in: channels-last first (a tensor with size-1 dims can be
    both), None for none of them."""
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    if t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    return torch.contiguous_format if t.is_contiguous() else None


def _expected(fmt, *operands_by_priority):
    """The layout of the first full-shape operand: the tested format or contiguous."""
    for kind in operands_by_priority:
        if kind != "bcast":
            return fmt if kind == "fmt" else torch.contiguous_format
    return torch.contiguous_format


def _inputs(loss, pair, fmt, device, dtype=torch.float32):
    kl = loss.startswith("kl_div")
    x = _make(pair[0], fmt, device, dtype, positive=False, seed=1)
    # KL's target is a probability (positive) unless it is in log space.
    t = _make(pair[1], fmt, device, dtype, positive=loss == "kl_div", seed=2)
    return x, t, kl


def _forward(loss, path, x, t, reduction):
    if loss == "smooth_l1_loss":
        op, args, kwargs = OPS.smooth_l1_loss.default, (x, t, reduction, 0.5), {}
    elif loss == "l1_loss":
        op, args, kwargs = OPS.l1_loss.default, (x, t, reduction), {}
    elif loss == "huber_loss":
        op, args, kwargs = OPS.huber_loss.default, (x, t, reduction, 0.5), {}
    elif loss == "mse_loss":
        op, args, kwargs = OPS.mse_loss.default, (x, t, reduction), {}
    else:
        op, args, kwargs = OPS.kl_div.default, (x, t, reduction), {"log_target": loss == "kl_div[log]"}
    return op._op_dk(COMPOSITE, *args, **kwargs) if path == "composite" else op(*args, **kwargs)


def _backward(loss, path, g, x, t, reduction, out=None):
    """The loss's backward op: smooth L1 / L1 gradient w.r.t. self, KL gradient w.r.t. target."""
    log = loss == "kl_div[log]"
    if loss == "smooth_l1_loss":
        op, args, name = OPS.smooth_l1_loss_backward, (g, x, t, reduction, 0.5), "grad_input"
    elif loss == "l1_loss":
        op, args, name = OPS.l1_loss_backward, (g, x, t, reduction), "grad_input"
    elif loss == "huber_loss":
        op, args, name = OPS.huber_loss_backward, (g, x, t, reduction, 0.5), "grad_input"
    elif loss == "mse_loss":
        op, args, name = OPS.mse_loss_backward, (g, x, t, reduction), "grad_input"
    else:
        op, args, name = OPS.kl_div_target_backward, (g, x, t, reduction, log), "grad_target"
    if out is not None:
        overload = op.out if loss == "huber_loss" else getattr(op, name)  # ATen names Huber's overload "out"
        kwargs = {name: out}
        return overload._op_dk(COMPOSITE, *args, **kwargs) if path == "composite" else overload(*args, **kwargs)
    return op.default._op_dk(COMPOSITE, *args) if path == "composite" else op.default(*args)


def _contiguous(*tensors):
    return [t.contiguous() for t in tensors]


def _fake_result(fn, *tensors):
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fakes = [mode.from_tensor(t) for t in tensors]
        return fn(*fakes)


def _assert_same_layout(result, fake):
    assert fake.shape == result.shape and fake.stride() == result.stride(), (fake.stride(), result.stride())


PATHS = ["kernel", "composite"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("pair", PAIRS, ids="-".join)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@pytest.mark.parametrize("loss", LOSS_VARIANTS)
def test_forward_none_follows_inputs(device, loss, fmt, pair, path):
    x, t, _ = _inputs(loss, pair, fmt, device)
    result = _forward(loss, path, x, t, NONE)
    assert _format_of(result) == _expected(fmt, *pair)
    torch.testing.assert_close(result, _forward(loss, path, *_contiguous(x, t), NONE))
    if path == "kernel":
        _assert_same_layout(result, _fake_result(lambda a, b: _forward(loss, path, a, b, NONE), x, t))


@pytest.mark.parametrize("reduction", [NONE, MEAN, SUM])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("pair", PAIRS, ids="-".join)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@pytest.mark.parametrize("loss", LOSS_VARIANTS)
def test_backward_op_follows_inputs(device, loss, fmt, pair, path, reduction):
    x, t, kl = _inputs(loss, pair, fmt, device)
    # 'none' takes a full-size contiguous gradient (it is not the priority operand here), the others a
    # 0-dim one, as autograd passes them.
    shape = torch.broadcast_shapes(x.shape, t.shape)
    g = torch.randn(shape if reduction == NONE else ()).to(device)
    result = _backward(loss, path, g, x, t, reduction)
    expected = _expected(fmt, pair[1]) if kl else _expected(fmt, pair[0], pair[1], "contig")
    if kl and pair[1] == "bcast":
        expected = _format_of(t)  # the result has target's (1, C, 1, 1) shape and layout
    assert _format_of(result) == expected, result.stride()
    torch.testing.assert_close(result, _backward(loss, path, *_contiguous(g, x, t), reduction))
    if path == "kernel":
        fake = _fake_result(lambda a, b, c: _backward(loss, path, a, b, c, reduction), g, x, t)
        _assert_same_layout(result, fake)


@pytest.mark.parametrize("out_format", ["same", "contiguous"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@pytest.mark.parametrize("loss", LOSS_VARIANTS)
def test_backward_out_keeps_its_layout(device, loss, fmt, path, out_format):
    """out= is written in its own layout, whatever the inputs' layout, with the same values."""
    pair = ("fmt", "fmt") if out_format == "contiguous" else ("contig", "contig")
    x, t, _ = _inputs(loss, pair, fmt, device)
    g = torch.randn(()).to(device)
    out = torch.empty(SHAPES[fmt])
    if out_format == "same":
        out = out.contiguous(memory_format=fmt)  # a channels-last out for contiguous inputs
    # .to keeps the strides (torch_npu cannot create a channels-last tensor directly).
    out = out.to(device)
    strides = out.stride()
    returned = _backward(loss, path, g, x, t, MEAN, out=out)
    assert returned is out and out.stride() == strides
    torch.testing.assert_close(out, _backward(loss, path, *_contiguous(g, x, t), MEAN))


@pytest.mark.filterwarnings("ignore:Using a target size", "ignore:reduction. 'mean'")
@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("pair", PAIRS, ids="-".join)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@pytest.mark.parametrize("loss", LOSS_VARIANTS)
def test_autograd_gradients_follow_their_inputs(device, loss, fmt, pair, reduction):
    """Through the public API: each gradient has its input's layout (no layout copy when accumulated into
    .grad) and torch.nn.functional's values (computed on the CPU); with reduction='none' the loss follows
    self's layout."""
    x, t, _ = _inputs(loss, pair, fmt, device)
    if loss == "smooth_l1_loss":
        ours, theirs, kwargs = npu_loss_ops.smooth_l1_loss, F.smooth_l1_loss, {"beta": 0.5}
    elif loss == "l1_loss":
        ours, theirs, kwargs = npu_loss_ops.l1_loss, F.l1_loss, {}
    elif loss == "huber_loss":
        ours, theirs, kwargs = npu_loss_ops.huber_loss, F.huber_loss, {"delta": 0.5}
    elif loss == "mse_loss":
        ours, theirs, kwargs = npu_loss_ops.mse_loss, F.mse_loss, {}
    else:
        ours, theirs, kwargs = npu_loss_ops.kl_div, F.kl_div, {"log_target": loss == "kl_div[log]"}
    results = []
    for fn, a, b in ((ours, x, t), (theirs, x.cpu(), t.cpu())):
        a, b = a.detach().requires_grad_(), b.detach().requires_grad_()
        value = fn(a, b, reduction=reduction, **kwargs)
        results.append((value, *torch.autograd.grad(value, (a, b), torch.ones_like(value))))
    (value, gx, gt), expected = results
    for got, want in zip(results[0], expected):
        torch.testing.assert_close(got.cpu(), want)
    if reduction == "none":
        assert _format_of(value) == _expected(fmt, *pair)
    for grad, inp, kind in ((gx, x, pair[0]), (gt, t, pair[1])):
        assert _format_of(grad) == _format_of(inp), (kind, grad.stride(), inp.stride())


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_dense_channels_last_matches_contiguous_bitwise(fmt):
    """The raw-pointer loops walk channels-last memory in order: elementwise results are bit for bit those
    of contiguous inputs, in float32 and bfloat16."""
    for dtype in (torch.float32, torch.bfloat16):
        x = _make("fmt", fmt, "cpu", dtype, positive=False, seed=3)
        t = _make("fmt", fmt, "cpu", dtype, positive=True, seed=4)
        g = torch.randn(x.shape).to(dtype).contiguous(memory_format=fmt)
        xc, tc, gc = _contiguous(x, t, g)
        for loss in LOSS_VARIANTS:
            assert torch.equal(_forward(loss, "kernel", x, t, NONE), _forward(loss, "kernel", xc, tc, NONE))
            assert torch.equal(_backward(loss, "kernel", g, x, t, NONE), _backward(loss, "kernel", gc, xc, tc, NONE))


def test_compiled_result_has_the_eager_layout():
    """torch.compile's graph (built from the fake kernels) returns the eager layout."""
    fmt = torch.channels_last
    x = _make("fmt", fmt, "cpu", torch.float32, positive=False, seed=5).requires_grad_()
    t = _make("contig", fmt, "cpu", torch.float32, positive=False, seed=6)

    def step(a, b):
        return npu_loss_ops.smooth_l1_loss(a, b, reduction="none", beta=0.5)

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    eager, got = step(x, t), compiled(x, t)
    assert got.stride() == eager.stride() and _format_of(got) == fmt
    torch.testing.assert_close(got, eager)
    (gx,) = torch.autograd.grad(got.sum(), x)
    assert _format_of(gx) == fmt
