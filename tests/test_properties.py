"""Randomized shapes, broadcasts, dtypes, reductions and layouts (hypothesis), through the same Sample type
and float64 references as test_correctness.py: forward op, backward op and the autograd of the API."""
import math
import warnings

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npu_loss_ops
from reference import assert_close, grad_magnitudes, reference_backward, reference_forward, reference_grads
from samples import LOSSES, make_sample

SETTINGS = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def broadcast_shapes(draw):
    """(self shape, target shape, grad kind) that broadcast, with 0..4 dims and sizes 0..6."""
    ndim = draw(st.integers(0, 4))
    full = draw(st.lists(st.integers(0, 6), min_size=ndim, max_size=ndim))

    def part():
        keep = draw(st.integers(0, ndim))
        dims = full[ndim - keep:]
        return tuple(d if draw(st.booleans()) else 1 for d in dims)

    return part(), part()


@st.composite
def samples(draw):
    loss = draw(st.sampled_from(LOSSES))
    xs, ts = draw(broadcast_shapes())
    return make_sample(
        loss, xs, ts,
        dtype=draw(st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16])),
        reduction=draw(st.sampled_from(["none", "mean", "sum"])),
        beta=draw(st.sampled_from([0.0, 0.25, 1.0, 3.0, math.inf])),
        log_target=draw(st.booleans()),
        layout=draw(st.sampled_from(["contiguous", "transposed", "sliced", "expanded"])),
        grad_kind=draw(st.sampled_from(["auto", "scalar", "partial", "partial_last"])),
        name="hypothesis",
    )


@SETTINGS
@given(samples())
def test_random_forward_and_backward_ops(s):
    args, kwargs = s.forward_args()
    out = s.forward_op()(*args, **kwargs)
    value, mag, dtype, shape = reference_forward(s)
    assert out.dtype == dtype and out.shape == shape
    assert_close(out, value, mag, msg=f"forward {s.loss} {tuple(s.self.shape)}x{tuple(s.target.shape)}")
    args, kwargs = s.backward_args()
    grad = s.backward_op()(*args, **kwargs)
    value, mag, dtype, shape = reference_backward(s)
    assert grad.dtype == dtype and grad.shape == shape
    assert_close(grad, value, mag, msg=f"backward {s.loss} {tuple(s.self.shape)}x{tuple(s.target.shape)}")


@SETTINGS
@given(samples())
def test_random_autograd_matches_functional(s):
    x = s.self.detach().requires_grad_(True)
    t = s.target.detach().requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = getattr(npu_loss_ops, s.loss)(x, t, **s.functional_kwargs())
    g = s.grad_output.expand(out.shape).to(out.dtype) if s.reduction == "none" else s.grad_output.sum().to(out.dtype)
    gx, gt = torch.autograd.grad(out, (x, t), g)
    ex, et = reference_grads(s, g)
    mx, mt = grad_magnitudes(s, g)
    assert_close(gx, ex, mx, msg="grad self")
    assert_close(gt, et, mt, msg="grad target")
