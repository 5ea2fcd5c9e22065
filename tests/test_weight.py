"""weight= for l1_loss, huber_loss and mse_loss, against torch.nn.functional's (torch 2.13): values, the result dtype
(F's promotion: a float64 weight gives a float64 loss), gradients with respect to input, target AND weight,
the errors (a weight of another size: ValueError; on another device: RuntimeError), and the autograd graph:
the loss op's node is the package's, right below the Mul node of `weight * loss` (and the Sum/Div/Mean
nodes of the reduction above it), as F composes it."""
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch._dynamo.testing

import npu_loss_ops
from helpers import RecordOps
from reference import RTOL, assert_close

NODE = {"l1_loss": "NpuLossL1LossBackward0", "huber_loss": "NpuLossHuberLossBackward0",
        "mse_loss": "NpuLossMseLossBackward0"}
WEIGHTED = list(NODE)
# The losses whose weighted 'mean' divides by weight.sum() (F's; Huber's divides by the count).
BY_WEIGHT_SUM = ("l1_loss", "mse_loss")
LOSSES = [("l1_loss", {}), ("huber_loss", {}), ("huber_loss", {"delta": 0.5}), ("huber_loss", {"delta": 1e-3}),
          ("huber_loss", {"delta": 3.0}), ("huber_loss", {"delta": math.inf}), ("mse_loss", {})]
IDS = [f"{name}{''.join(f'-{k}{v:g}' for k, v in kw.items())}" for name, kw in LOSSES]
REDUCTIONS = ("none", "mean", "sum")


def _inputs(shape=(5, 7), target_shape=None, dtype=torch.float32, weight_dtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2
    t = torch.randn(target_shape or shape, generator=g, dtype=torch.float64)
    w = torch.rand(shape, generator=g, dtype=torch.float64) + 0.1
    return x.to(dtype), t.to(dtype), w.to(weight_dtype or dtype)


def _value_and_grads(fn, x, t, w, reduction, kwargs, g=None):
    x, t, w = (v.detach().requires_grad_(True) for v in (x, t, w))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the target-size warning of the broadcast cases
        out = fn(x, t, reduction=reduction, weight=w, **kwargs)
    if g is None:
        g = torch.linspace(-1.5, 2.0, out.numel(), dtype=torch.float64).reshape(out.shape)
    grads = torch.autograd.grad(out, (x, t, w), g.to(out.dtype))
    return out, grads, g


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype,weight_dtype", [(torch.float32, torch.float32), (torch.float64, torch.float64),
                                                (torch.float32, torch.float64), (torch.float64, torch.float32),
                                                (torch.bfloat16, torch.float32), (torch.float16, torch.float16)],
                         ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("name,kwargs", LOSSES, ids=IDS)
def test_weighted_values_and_gradients_match_F(name, kwargs, dtype, weight_dtype, reduction):
    """Value, result dtype and the gradients with respect to input, target and weight are F's (computed in
    float64 on the same values; its result dtype taken from F on the sample's dtypes)."""
    x, t, w = _inputs(dtype=dtype, weight_dtype=weight_dtype)
    ours, (gx, gt, gw), g = _value_and_grads(getattr(npu_loss_ops, name), x, t, w, reduction, kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f_dtype = getattr(F, name)(x, t, reduction=reduction, weight=w, **kwargs).dtype
    assert ours.dtype == f_dtype, f"result dtype {ours.dtype}, F gives {f_dtype}"
    ref, (rx, rt, rw), _ = _value_and_grads(getattr(F, name), x.double(), t.double(), w.double(), reduction,
                                             kwargs, g)
    assert ours.shape == ref.shape
    low = min((dtype, weight_dtype), key=[torch.bfloat16, torch.float16, torch.float32, torch.float64].index)
    # The sums of the reductions (and F's in float32) round per element: bound by the sum of |terms|.
    mag = (ref.detach().abs() if reduction == "none" else
           (w.double() * (x.double() - t.double()).abs() * max(1.0, min(kwargs.get("delta", 1.0), 1e3))).sum())
    assert_close(ours, ref, mag.expand(ref.shape), dtype=low, msg="value")
    for a, e, like, what in ((gx, rx, x, "input"), (gt, rt, t, "target"), (gw, rw, w, "weight")):
        assert a.dtype == like.dtype and a.shape == like.shape, what
        # weight's gradient is g * loss, both rounded to the low dtype before the product: two roundings
        rtol = 2 * RTOL[low] if what == "weight" else None
        assert_close(a, e, e.abs().max().expand(e.shape) + 1e-30, dtype=low, msg=f"grad w.r.t. {what}",
                     rtol=rtol)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name,kwargs", LOSSES[:3], ids=IDS[:3])
def test_weighted_broadcast_target_and_gradcheck(name, kwargs, reduction):
    """A target that broadcasts against input (weight has input's size, as F requires); gradcheck and
    gradgradcheck in float64 with respect to all three (away from the kinks |d| == 0 and |d| == delta)."""
    x, t, w = _inputs((4, 6), (6,), dtype=torch.float64, seed=3)
    d = (x - t).abs()
    x = torch.where((d < 0.05) | ((d - kwargs.get("delta", 1.0)).abs() < 0.05), x + 0.2, x)
    fn = getattr(npu_loss_ops, name)
    ours, grads, g = _value_and_grads(fn, x, t, w, reduction, kwargs)
    ref, rgrads, _ = _value_and_grads(getattr(F, name), x, t, w, reduction, kwargs, g)
    torch.testing.assert_close(ours, ref)
    for a, e in zip(grads, rgrads):
        torch.testing.assert_close(a, e)
    inputs = tuple(v.detach().requires_grad_(True) for v in (x, t, w))
    f = lambda a, b, c: fn(a, b, reduction=reduction, weight=c, **kwargs)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.autograd.gradcheck(f, inputs)
        assert torch.autograd.gradgradcheck(f, inputs)


@pytest.mark.parametrize("name", WEIGHTED)
def test_l1_and_mse_mean_divide_by_the_weight_sum_huber_by_the_count(name):
    """docs/semantics.md: l1's 'mean' is sum(w * |d|) / sum(w), mse's sum(w * d**2) / sum(w); huber's is
    mean(w * h)."""
    x, t, w = _inputs(dtype=torch.float64)
    weighted = getattr(npu_loss_ops, name)(x, t, reduction="none", weight=w)
    mean = getattr(npu_loss_ops, name)(x, t, reduction="mean", weight=w)
    expected = weighted.sum() / w.sum() if name in BY_WEIGHT_SUM else weighted.sum() / x.numel()
    torch.testing.assert_close(mean, expected, rtol=1e-14, atol=0)


@pytest.mark.parametrize("name", WEIGHTED)
def test_weight_none_is_the_unweighted_loss(name):
    x, t, _ = _inputs()
    for reduction in REDUCTIONS:
        fn = getattr(npu_loss_ops, name)
        assert torch.equal(fn(x, t, reduction=reduction, weight=None), fn(x, t, reduction=reduction))


@pytest.mark.parametrize("name", WEIGHTED)
@pytest.mark.parametrize("shape", [(5, 1), (7,), (1, 5, 7), (35,), ()])
def test_weight_of_another_size_is_value_error(name, shape):
    """As F: a weight whose size differs from input's (even one that would broadcast) is a ValueError."""
    x, t, _ = _inputs()
    w = torch.ones(shape)
    with pytest.raises(ValueError, match="Weights and input must have the same size"):
        getattr(npu_loss_ops, name)(x, t, weight=w)
    with pytest.raises(ValueError):
        getattr(F, name)(x, t, weight=w)


@pytest.mark.parametrize("name", WEIGHTED)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_weight_on_another_device_is_runtime_error(name, reduction):
    x, t, w = _inputs()
    with pytest.raises(RuntimeError):
        getattr(npu_loss_ops, name)(x, t, reduction=reduction, weight=w.to("meta"))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", WEIGHTED)
def test_the_loss_node_is_the_packages_below_the_weighting(name, reduction):
    """The graph is F's composition over the package's op: the root is the reduction's node (Div for l1's
    and mse's 'mean', Mean for huber's, Sum for 'sum', Mul for 'none'), and the package's loss node is the first
    input of the Mul node of `loss * weight`, whose other input is the weight's leaf."""
    x, t, w = (v.requires_grad_(True) for v in _inputs())
    out = getattr(npu_loss_ops, name)(x, t, reduction=reduction, weight=w)
    root = {"none": "MulBackward0", "sum": "SumBackward0",
            "mean": "DivBackward0" if name in BY_WEIGHT_SUM else "MeanBackward0"}[reduction]
    assert out.grad_fn.name() == root
    node = out.grad_fn
    while node.name() != "MulBackward0":
        node = node.next_functions[0][0]
    (loss_edge, weight_edge) = node.next_functions
    assert loss_edge[0].name() == NODE[name]
    assert weight_edge[0].name() == "torch::autograd::AccumulateGrad" and weight_edge[0].variable is w
    # and the loss node's own inputs are input and target
    assert [e[0].variable for e in loss_edge[0].next_functions] == [x, t]


@pytest.mark.parametrize("target_grad", [False, True])
@pytest.mark.parametrize("name", WEIGHTED)
def test_the_backward_op_gets_weight_times_grad(name, target_grad):
    """The weighting adds no pass of the package's backward op: it runs as often as for the unweighted loss
    (on `weight * grad` as its grad_output), and ATen's loss ops never run."""
    backward = f"npu_loss.{name}_backward.default"
    counts = []
    for weighted in (False, True):
        x, t, w = _inputs()
        x.requires_grad_(True)
        t.requires_grad_(target_grad)
        with RecordOps() as rec:
            getattr(npu_loss_ops, name)(x, t, reduction="mean", weight=w if weighted else None).backward()
        counts.append(rec.ops.count(backward))
        assert not any(op.startswith(f"aten.{name}") for op in rec.ops), rec.ops
    assert counts[0] == counts[1] >= 1, counts


@pytest.mark.parametrize("name", WEIGHTED)
def test_weighted_loss_compiles_to_one_graph(name):
    x, t, w = _inputs()
    fn = getattr(npu_loss_ops, name)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda a, b, c: fn(a, b, weight=c), backend=counter, fullgraph=True)
    torch.testing.assert_close(compiled(x, t, w), fn(x, t, weight=w))
    assert counter.frame_count == 1
