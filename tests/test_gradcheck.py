"""gradcheck / gradgradcheck in float64 for all six ops (w.r.t. self AND target, and for the backward ops
w.r.t. grad_output too), on the samples that stay away from the kinks, broadcast ones included."""
import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import npu_loss_ops
from samples import DELTAS, LOSSES, differentiable_samples, opinfo_samples, params

DIFF = [s for loss in LOSSES for s in differentiable_samples(loss)]
# Keep gradgradcheck (the slow one) to the small samples; every shape kind still appears.
SMALL = [s for s in DIFF if s.backward_shape.numel() <= 64]


def _leaf(t: torch.Tensor) -> torch.Tensor:
    # gradcheck perturbs inputs in place: stride-0 (expanded) inputs must be materialized.
    if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)):
        t = t.contiguous()
    return t.detach().requires_grad_(True)


def _forward_fn(s):
    op = s.forward_op()

    def fn(x, t):
        args, kwargs = s.forward_args(x, t)
        return op(*args, **kwargs)

    return fn, (_leaf(s.self), _leaf(s.target))


def _backward_fn(s):
    op = s.backward_op()

    def fn(g, x, t):
        args, kwargs = s.backward_args(g, x, t)
        return op(*args, **kwargs)

    return fn, (_leaf(s.grad_output), _leaf(s.self), _leaf(s.target))


def _fast(s) -> bool:
    return s.backward_shape.numel() > 64


@pytest.mark.parametrize("s", params(DIFF))
def test_gradcheck_forward(s):
    fn, inputs = _forward_fn(s)
    assert gradcheck(fn, inputs, fast_mode=_fast(s))


@pytest.mark.parametrize("s", params(SMALL))
def test_gradgradcheck_forward(s):
    fn, inputs = _forward_fn(s)
    assert gradgradcheck(fn, inputs)


@pytest.mark.parametrize("s", params(DIFF))
def test_gradcheck_backward_op(s):
    fn, inputs = _backward_fn(s)
    assert gradcheck(fn, inputs, fast_mode=_fast(s))


@pytest.mark.parametrize("s", params(SMALL[::2]))
def test_gradgradcheck_backward_op(s):
    fn, inputs = _backward_fn(s)
    assert gradgradcheck(fn, inputs)


@pytest.mark.parametrize("requires", ["self", "target"])
@pytest.mark.parametrize("s", params(SMALL[::3]))
def test_gradcheck_one_input_requires_grad(s, requires):
    """Only one of self/target requiring grad (the other a constant) works too."""
    op = s.forward_op()
    x, t = _leaf(s.self), _leaf(s.target)
    if requires == "self":
        t = t.detach()

        def fn(x):
            args, kwargs = s.forward_args(x, t)
            return op(*args, **kwargs)

        assert gradcheck(fn, (x,)) and gradgradcheck(fn, (x,))
    else:
        x = x.detach()

        def fn(t):
            args, kwargs = s.forward_args(x, t)
            return op(*args, **kwargs)

        assert gradcheck(fn, (t,)) and gradgradcheck(fn, (t,))


OPINFO_DIFF = [s for loss in LOSSES for s in opinfo_samples(loss, requires_grad=True) if s.differentiable]


@pytest.mark.parametrize("s", params(OPINFO_DIFF))
def test_gradgradcheck_functional_opinfo(s):
    """Through the torch.nn.functional-style API (KL's 'batchmean' included)."""
    fn = getattr(npu_loss_ops, s.loss)
    kwargs = s.functional_kwargs()
    inputs = (_leaf(s.self), _leaf(s.target))
    assert gradcheck(lambda x, t: fn(x, t, **kwargs), inputs)
    assert gradgradcheck(lambda x, t: fn(x, t, **kwargs), inputs)


def test_differentiable_samples_cover_what_they_should():
    """The generator really yields broadcast, 0-dim, non-contiguous and grad-shape variants for gradcheck."""
    for loss in LOSSES:
        ds = [s for s in DIFF if s.loss == loss]
        assert any(s.self.shape != s.target.shape for s in ds), loss
        assert any(s.self.dim() == 0 for s in ds), loss
        assert any(not s.self.is_contiguous() for s in ds), loss
        assert any(s.grad_output.shape != s.backward_shape for s in ds if s.reduction == "none"), loss
        assert {s.reduction for s in ds} == {"none", "mean", "sum"}, loss
    assert {s.beta for s in DIFF if s.loss == "smooth_l1_loss"} >= {0.0, 0.5, 1.0, 2.0}
    assert {s.log_target for s in DIFF if s.loss == "kl_div"} == {False, True}
    assert {s.delta for s in DIFF if s.loss == "huber_loss"} >= set(DELTAS)
