"""Randomized shapes (0-8 dims), broadcasts, dtypes, reductions, betas, layouts and special values
(hypothesis), through the same Sample type and float64 references as test_correctness.py: forward op,
backward op, its out= overload and the autograd of the API. Over 2,000 examples per run."""
import dataclasses
import math
import warnings

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npu_loss_ops
from reference import (
    assert_close,
    assert_matches,
    grad_magnitudes,
    reference_backward,
    reference_forward,
    reference_grads,
)
from samples import DELTAS, LOSSES, make_sample

SETTINGS = settings(max_examples=600, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def broadcast_shapes(draw):
    """(self shape, target shape) that broadcast, with 0..8 dims (sizes 0..6 up to 3 dims, 0..2 beyond)."""
    ndim = draw(st.integers(0, 8))
    full = draw(st.lists(st.integers(0, 6 if ndim <= 3 else 2), min_size=ndim, max_size=ndim))

    def part():
        keep = draw(st.integers(0, ndim))
        dims = full[ndim - keep:]
        return tuple(d if draw(st.booleans()) else 1 for d in dims)

    return part(), part()


@st.composite
def samples(draw):
    loss = draw(st.sampled_from(LOSSES))
    xs, ts = draw(broadcast_shapes())
    # smooth L1's beta, or Huber's delta (> 0: the rejected ones are test_errors')
    width = st.sampled_from(DELTAS) if loss == "huber_loss" else st.sampled_from([0.0, 1e-7, 0.25, 1.0, 3.0, 1e4,
                                                                                    math.inf])
    return make_sample(
        loss, xs, ts,
        dtype=draw(st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16])),
        reduction=draw(st.sampled_from(["none", "mean", "sum"])),
        beta=draw(width),
        log_target=draw(st.booleans()),
        layout=draw(st.sampled_from(["contiguous", "transposed", "sliced", "expanded"])),
        grad_kind=draw(st.sampled_from(["auto", "scalar", "partial", "partial_last"])),
        name="hypothesis",
    )


@SETTINGS
@given(samples())
def test_random_forward_and_backward_ops(s):
    _check_both_ops(s)


def _check_both_ops(s):
    """The forward and the backward op of the sample against the float64 references."""
    shapes = f"{s.loss} {tuple(s.self.shape)}x{tuple(s.target.shape)}"
    assert_matches(s.run_forward(), reference_forward(s), msg=f"forward {shapes}")
    assert_matches(s.run_backward(), reference_backward(s), msg=f"backward {shapes}")


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


SPECIALS = [0.0, -0.0, math.nan, math.inf, -math.inf]


@st.composite
def special_samples(draw):
    """Contiguous samples whose self/target carry ±0, NaN, ±inf, ties (d == 0) and |d| == beta (or delta)."""
    s = draw(samples())
    x = s.self.contiguous().clone()
    t = s.target.contiguous().clone()
    if x.numel() == 0 or t.numel() == 0:
        return s
    xf, tf = x.view(-1), t.view(-1)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["x", "t", "tie", "beta"]))
        i = draw(st.integers(0, xf.numel() - 1))
        j = draw(st.integers(0, tf.numel() - 1))
        if kind == "x":
            xf[i] = draw(st.sampled_from(SPECIALS))
        elif kind == "t":
            tf[j] = draw(st.sampled_from(SPECIALS))
        elif kind == "tie" and x.shape == t.shape:
            xf[i] = tf[i]
        elif kind == "beta" and x.shape == t.shape and math.isfinite(s.beta):
            xf[i] = tf[i] + s.beta
    return dataclasses.replace(s, self=x, target=t, name="hypothesis-specials")


@SETTINGS
@given(special_samples())
def test_random_special_values(s):
    _check_both_ops(s)


@SETTINGS
@given(samples(), st.sampled_from(["contiguous", "transposed", "other-dtype"]))
def test_random_out_overload_matches_functional(s, out_layout):
    args, kwargs = s.backward_args()
    expected = s.backward_op()(*args, **kwargs)
    dtype = expected.dtype
    if out_layout == "other-dtype" and s.loss != "kl_div":  # grad_target must have target's dtype
        dtype = torch.float64 if expected.dtype != torch.float64 else torch.float32
    if out_layout == "transposed" and expected.dim() >= 2:
        out = torch.empty(expected.shape[::-1], dtype=dtype).t() if expected.dim() == 2 else \
            torch.empty(expected.shape, dtype=dtype).transpose(0, -1).contiguous().transpose(0, -1)
    else:
        out = torch.empty(expected.shape, dtype=dtype)
    result = s.out_op()(*args, **kwargs, **{s.out_name: out})
    assert result is out
    if dtype == expected.dtype:
        assert torch.equal(out.nan_to_num(), expected.nan_to_num()) and torch.equal(out.isnan(), expected.isnan())
    else:  # out holds the float32 result rounded to its own dtype, expected rounded to the sample's
        rtol = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 2e-6, torch.float64: 2e-6}[expected.dtype]
        torch.testing.assert_close(out, expected.to(dtype), equal_nan=True, rtol=rtol, atol=1e-6)
