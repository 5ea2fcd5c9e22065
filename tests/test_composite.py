"""The CompositeExplicitAutograd fallback (what CUDA, XPU, MPS, ... and the NPU's corrections run), called
directly through its dispatch key on CPU tensors: same shapes, dtypes and values as the CPU kernels and
the float64 references. (Its errors are compared with every other path in test_errors.py.)"""
import math

import pytest
import torch

from helpers import RecordOps
from reference import assert_close, assert_matches, reference_backward, reference_forward
from samples import LOSSES, all_samples, lowest_precision, params

COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutograd

SAMPLES = [s for loss in LOSSES for s in all_samples(loss)
           if s.backward_shape.numel() <= 5000 and s.op_compatible][::2]


def test_op_dk_really_reaches_the_composite_kernel():
    """The composite kernel is made of ATen ops; the CPU kernel is not: a dispatch mode tells them apart."""
    x, t = torch.randn(5), torch.randn(5)
    with RecordOps() as composite:
        torch.ops.npu_loss.l1_loss.default._op_dk(COMPOSITE, x, t, 1)
    with RecordOps() as cpu:
        torch.ops.npu_loss.l1_loss.default(x, t, 1)
    assert any("abs" in c for c in composite.ops), composite.ops
    assert not any("abs" in c for c in cpu.ops), cpu.ops


def _check_composite(op, args, kwargs, cpu, reference, msg):
    """op's composite kernel gives the reference's dtype, shape and values, and the CPU kernel's dtype and
    shape."""
    ours = op._op_dk(COMPOSITE, *args, **kwargs)
    assert (ours.dtype, ours.shape) == (cpu.dtype, cpu.shape), f"{msg}: composite vs the CPU kernel"
    assert_matches(ours, reference, msg)


@pytest.mark.parametrize("s", params(SAMPLES))
def test_composite_forward(s):
    args, kwargs = s.forward_args()
    _check_composite(s.forward_op(), args, kwargs, s.run_forward(), reference_forward(s), s.name)


@pytest.mark.parametrize("s", params(SAMPLES))
def test_composite_backward(s):
    args, kwargs = s.backward_args()
    _check_composite(s.backward_op(), args, kwargs, s.run_backward(), reference_backward(s), s.name)


@pytest.mark.parametrize("s", params(SAMPLES[::3]))
def test_composite_out(s):
    args, _ = s.backward_args()
    value, mag, dtype, shape = reference_backward(s)
    out_dtypes = [dtype] if s.loss == "kl_div" else [dtype, torch.float64]
    for out_dtype in out_dtypes:
        out = torch.full(shape, math.nan, dtype=out_dtype)
        res = s.out_op()._op_dk(COMPOSITE, *args, **{s.out_name: out})
        assert res.data_ptr() == out.data_ptr() if out.numel() else res.shape == out.shape
        assert_close(out, value, mag, dtype=lowest_precision(dtype, out_dtype), msg=s.name)


@pytest.mark.parametrize("loss", LOSSES)
def test_composite_empty(loss):
    x = torch.empty(0, 3)
    t = torch.rand(3) + 0.5
    op = getattr(torch.ops.npu_loss, loss).default
    kwargs = {"log_target": False} if loss == "kl_div" else {}
    assert op._op_dk(COMPOSITE, x, t, 2, **kwargs).item() == 0
    assert math.isnan(op._op_dk(COMPOSITE, x, t, 1, **kwargs).item())
    if loss == "kl_div":
        grad = torch.ops.npu_loss.kl_div_target_backward.default._op_dk(COMPOSITE, torch.tensor(1.0), x, t, 1, False)
        assert torch.equal(grad, torch.zeros(3))


@pytest.mark.parametrize("overload", ["default", "out"])
def test_composite_huber_backward_delta_beyond_float32_range(overload):
    """delta = 1e300 is accepted (delta > 0) and the CPU kernel gives g * d (|d| < delta); the composite
    fallback must too."""
    g, x, t = torch.randn(4, 5), torch.randn(4, 5), torch.randn(4, 5)
    op = torch.ops.npu_loss.huber_loss_backward
    cpu = op.default(g, x, t, 0, 1e300)
    torch.testing.assert_close(cpu, g * (x - t))
    if overload == "default":
        res = op.default._op_dk(COMPOSITE, g, x, t, 0, 1e300)
    else:
        res = op.out._op_dk(COMPOSITE, g, x, t, 0, 1e300, grad_input=torch.empty(4, 5))
    torch.testing.assert_close(res, cpu)
