"""torch.library.opcheck on every op and every out= overload, over a handful of samples each."""
import math

import pytest
import torch

from samples import LOSSES, all_samples, make_sample, params
from reference import reference_backward


def _features(s):
    return {
        ("reduction", s.reduction),
        ("dtype", s.dtype),
        ("0-dim", s.self.dim() == 0),
        ("empty", s.self.numel() == 0),
        ("broadcast", s.self.shape != s.target.shape),
        ("grad shape", s.grad_output.shape == s.backward_shape),
        ("non-contiguous", not (s.self.is_contiguous() and s.target.is_contiguous())),
        ("variant", (s.beta, s.log_target)),
        ("mixed dtypes", len({s.self.dtype, s.target.dtype, s.grad_output.dtype}) > 1),
    }


def _pick(loss):
    """A handful of samples per loss: a greedy cover of every feature value (reduction, dtype, 0-dim,
    empty, broadcast, grad shape, layout, beta/log_target, mixed dtypes)."""
    chosen, seen = [], set()
    for s in all_samples(loss):
        if s.backward_shape.numel() > 1000:
            continue
        new = _features(s) - seen
        if new:
            seen |= new
            chosen.append(s)
    return chosen


def _nan_output(s):
    # opcheck compares eager and traced outputs with NaN != NaN: an empty "mean" (NaN) cannot pass it.
    return s.reduction == "mean" and s.broadcast_shape.numel() == 0


PICKED = [s for loss in LOSSES for s in _pick(loss)]
PICKED_FORWARD = [s for s in PICKED if not _nan_output(s)]


def _requires_grad(s, on: bool):
    if not on:
        return s
    return s.map_tensors(lambda t: t.detach().requires_grad_(t.is_floating_point()))


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("s", params(PICKED_FORWARD))
def test_opcheck_forward(s, requires_grad):
    s = _requires_grad(s, requires_grad)
    args, kwargs = s.forward_args()
    torch.library.opcheck(s.forward_op(), args, kwargs)


@pytest.mark.parametrize("s", params(PICKED))
def test_opcheck_backward_op(s):
    args, kwargs = s.backward_args()
    torch.library.opcheck(s.backward_op(), args, kwargs)


@pytest.mark.parametrize("s", params(PICKED))
def test_opcheck_backward_op_requires_grad(s):
    s = _requires_grad(s, True)
    args, kwargs = s.backward_args()
    torch.library.opcheck(s.backward_op(), args, kwargs)


@pytest.mark.parametrize("s", params(PICKED))
def test_opcheck_out_overload(s):
    _, _, dtype, shape = reference_backward(s)
    args, _ = s.backward_args()
    out = torch.full(shape, math.nan, dtype=dtype)
    torch.library.opcheck(s.out_op(), args, {s.out_name: out})


@pytest.mark.parametrize("loss", LOSSES)
def test_opcheck_out_overload_non_contiguous_and_other_dtype(loss):
    s = make_sample(loss, (6, 5), (6, 5), dtype=torch.float32, reduction="none")
    args, _ = s.backward_args()
    out = torch.full((5, 6), math.nan).mT
    torch.library.opcheck(s.out_op(), args, {s.out_name: out})
    if loss != "kl_div":  # grad_target must have target's dtype
        out64 = torch.full((6, 5), math.nan, dtype=torch.float64)
        torch.library.opcheck(s.out_op(), args, {s.out_name: out64})


def test_opcheck_really_checks_something():
    """opcheck is not a no-op here: a fake kernel that lies about the shape is caught."""
    lib = torch.library.Library("npu_loss_opcheck_selftest", "DEF")
    lib.define("bad(Tensor x) -> Tensor")
    lib.impl("bad", lambda x: x.clone(), "CPU")
    torch.library.register_fake("npu_loss_opcheck_selftest::bad", lambda x: x.new_empty(x.shape[0] + 1), lib=lib)
    with pytest.raises(Exception):
        torch.library.opcheck(torch.ops.npu_loss_opcheck_selftest.bad.default, (torch.randn(3),))
    lib._destroy()
