"""The autograd graph nodes and batching rules behave as PyTorch's own ops do: no graph under no_grad or
inference_mode, saved-tensor hooks and checkpointing, in-place modification and double-backward errors,
mixed dtypes, every device through the Autograd key (meta tensors here); and vmap's edge cases (the dtype
a 0-dim operand gives, half types, batch dims anywhere, nested vmap, the 8-dim limit, errors)."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import npu_loss_ops
from samples import BACKWARD_OP, LOSSES

pytestmark = pytest.mark.filterwarnings("ignore:Using a target size")

NODE_NAMES = {
    "smooth_l1_loss": "NpuLossSmoothL1LossBackward0",
    "l1_loss": "NpuLossL1LossBackward0",
    "kl_div": "NpuLossKlDivBackward0",
    "huber_loss": "NpuLossHuberLossBackward0",
    "mse_loss": "NpuLossMseLossBackward0",
}
# The node of the backward op's own derivative (recorded by a create_graph=True backward).
DOUBLE_BACKWARD_NODE_NAMES = {
    "huber_loss": "NpuLossHuberLossBackwardBackward0",
    "mse_loss": "NpuLossMseLossBackwardBackward0",
}


def _pair(loss, shape=(3, 4), target_shape=None, dtype=torch.float64):
    x = torch.randn(shape, dtype=dtype)
    t = torch.randn(target_shape or shape, dtype=dtype)
    if loss == "kl_div":
        t = t.abs() + 0.1
    return x, t


def _fns(loss):
    return getattr(npu_loss_ops, loss), getattr(F, loss)


# ---------------------------------------------------------------------------------------------------
# graph recording


@pytest.mark.parametrize("loss", LOSSES)
def test_graph_nodes_and_edges(loss):
    ours, _ = _fns(loss)
    x, t = _pair(loss)
    x.requires_grad_()
    out = ours(x, t)
    assert out.grad_fn.name() == NODE_NAMES[loss]
    (x_edge, t_edge) = out.grad_fn.next_functions
    assert x_edge[0].name() == "torch::autograd::AccumulateGrad"
    assert t_edge[0] is None  # target does not require grad


@pytest.mark.parametrize("loss", sorted(DOUBLE_BACKWARD_NODE_NAMES))
def test_double_backward_node(loss):
    """A create_graph=True backward records the backward op's own node, with edges to grad_output's
    producer and to self and target."""
    ours, ref = _fns(loss)
    x, t = _pair(loss)
    x.requires_grad_()
    t.requires_grad_()
    (gx,) = torch.autograd.grad(ours(x, t), x, create_graph=True)
    assert gx.grad_fn.name() == DOUBLE_BACKWARD_NODE_NAMES[loss]
    second = torch.autograd.grad(gx.sum(), (x, t))
    x2, t2 = x.detach().requires_grad_(), t.detach().requires_grad_()
    (rgx,) = torch.autograd.grad(ref(x2, t2), x2, create_graph=True)
    for a, e in zip(second, torch.autograd.grad(rgx.sum(), (x2, t2))):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("loss", LOSSES)
def test_no_grad_and_inference_mode_record_nothing(loss):
    ours, ref = _fns(loss)
    x, t = _pair(loss)
    x.requires_grad_()
    with torch.no_grad():
        out = ours(x, t)
    assert out.grad_fn is None and not out.requires_grad
    with torch.inference_mode():
        inference_out = ours(x, t)
    assert inference_out.is_inference() and not inference_out.requires_grad
    torch.testing.assert_close(out, ref(x.detach(), t))
    torch.testing.assert_close(inference_out, out)


@pytest.mark.parametrize("loss", LOSSES)
def test_saved_tensors_hooks_see_only_the_inputs(loss):
    """The node saves self and target (never intermediates), through the saved-tensor hooks."""
    ours, ref = _fns(loss)
    x, t = _pair(loss)
    x.requires_grad_()
    packed, unpacked = [], []

    def pack(tensor):
        packed.append(tensor)
        return tensor.clone()

    def unpack(tensor):
        unpacked.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = ours(x, t, reduction="sum")
    assert len(packed) == 2
    assert packed[0] is x and torch.equal(packed[1], t)
    (grad,) = torch.autograd.grad(out, x)
    assert len(unpacked) == 2
    (expected,) = torch.autograd.grad(ref(x, t, reduction="sum"), x)
    torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("loss", LOSSES)
def test_checkpointing(loss, use_reentrant):
    ours, ref = _fns(loss)
    x, t = _pair(loss)
    w = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)

    def block(w, loss_fn):
        return loss_fn(torch.tanh(x @ w), t)

    checkpoint(block, w, ours, use_reentrant=use_reentrant).backward()
    grad, w.grad = w.grad, None
    block(w, ref).backward()
    torch.testing.assert_close(grad, w.grad)


@pytest.mark.parametrize("modified", ["self", "target"])
@pytest.mark.parametrize("loss", LOSSES)
def test_inplace_change_of_a_saved_input_is_an_error(loss, modified):
    """The nodes save self and target, and backward checks their version counters, as ATen's
    SmoothL1LossBackward0 does (F's composite L1 and KL save intermediates instead, so they cannot tell)."""
    ours, _ = _fns(loss)
    x, t = _pair(loss)
    leaf = torch.randn_like(x, requires_grad=True)
    x = x + leaf
    out = ours(x, t)
    (x if modified == "self" else t).add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()


@pytest.mark.parametrize("loss", LOSSES)
def test_backward_twice_needs_retain_graph(loss):
    ours, _ = _fns(loss)
    x, t = _pair(loss)
    x.requires_grad_()
    out = ours(x, t)
    out.backward(retain_graph=True)
    out.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.backward()


@pytest.mark.parametrize("loss", LOSSES)
def test_mixed_dtypes_give_each_input_its_own_dtype(loss):
    ours, ref = _fns(loss)
    x, t = _pair(loss, target_shape=(4,))
    x = x.float().requires_grad_()
    t = t.requires_grad_()
    grads = torch.autograd.grad(ours(x, t), (x, t))
    assert [g.dtype for g in grads] == [torch.float32, torch.float64]
    # F.huber_loss's own backward fails on float32 input with a float64 target ("Found dtype Double but
    # expected Float"), and F.mse_loss's does on torch 2.7: compare with F on float64 values there, each
    # gradient in its input's dtype.
    try:
        expected = torch.autograd.grad(ref(x, t), (x, t))
        assert loss != "huber_loss", "F.huber_loss's backward now takes mixed dtypes: drop this case"
    except RuntimeError as error:
        assert loss in ("huber_loss", "mse_loss") and "Found dtype Double but expected Float" in str(error)
        x64 = x.detach().double().requires_grad_()
        expected = [e.to(g.dtype) for e, g in zip(torch.autograd.grad(ref(x64, t), (x64, t)), grads)]
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("loss", LOSSES)
def test_autograd_on_meta_tensors(loss):
    """The Autograd alias key covers every backend (here Meta, whose kernels are the fake kernels)."""
    ours, _ = _fns(loss)
    x = torch.empty(3, 4, device="meta", requires_grad=True)
    t = torch.empty(4, device="meta", requires_grad=True)
    gx, gt = torch.autograd.grad(ours(x, t), (x, t), create_graph=True)
    assert gx.shape == x.shape and gt.shape == t.shape and gx.device.type == "meta"
    (ggt,) = torch.autograd.grad(gx.sum(), t)
    assert ggt.shape == t.shape and ggt.device.type == "meta"


# ---------------------------------------------------------------------------------------------------
# vmap edge cases


def _loop(fn, batched, in_dims):
    size = next(a.shape[d] for a, d in zip(batched, in_dims) if d is not None)
    return torch.stack([fn(*(a if d is None else a.select(d, i) for a, d in zip(batched, in_dims)))
                        for i in range(size)])


def _assert_same(actual, expected, **tol):
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, **tol)


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("loss", LOSSES)
def test_vmap_zero_dim_target_does_not_promote(loss, reduction):
    """float16 self with a float32 target that is 0-dim per sample: the result is float16 as in an
    unbatched call, although the batched target is a 1-dim tensor."""
    op = getattr(torch.ops.npu_loss, loss)
    x = torch.rand(5, 3).half()
    t = torch.rand(5) + 0.1
    fn = lambda a, b: op(a, b, reduction)  # noqa: E731
    _assert_same(torch.func.vmap(fn)(x, t), _loop(fn, (x, t), (0, 0)))


def test_vmap_l1_backward_zero_dim_grad_does_not_promote():
    op = torch.ops.npu_loss.l1_loss_backward
    g = torch.randn(5)
    x, t = torch.randn(5, 3).half(), torch.randn(3).half()
    fn = lambda a, b, c: op(a, b, c, 1)  # noqa: E731
    _assert_same(torch.func.vmap(fn, in_dims=(0, 0, None))(g, x, t), _loop(fn, (g, x, t), (0, 0, None)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduction", [1, 2])
@pytest.mark.parametrize("loss", LOSSES)
def test_vmap_half_types_reduce_in_float32(loss, reduction, dtype):
    op = getattr(torch.ops.npu_loss, loss)
    x = torch.randn(4, 300).to(dtype)
    t = (torch.rand(4, 300) + 0.1).to(dtype)
    fn = lambda a, b: op(a, b, reduction)  # noqa: E731
    expected = torch.stack([op(a.float(), b.float(), reduction) for a, b in zip(x, t)]).to(dtype)
    _assert_same(torch.func.vmap(fn)(x, t), expected, rtol=0, atol=0)


@pytest.mark.parametrize("loss", LOSSES)
def test_vmap_batch_dims_anywhere_and_broadcast(loss):
    """Batch dims in different places, and per-sample shapes that broadcast ([3, 1] with [4])."""
    ours, _ = _fns(loss)
    x = torch.randn(3, 6, 1, dtype=torch.float64)   # samples along dim 1: each [3, 1]
    t = torch.rand(4, 6, dtype=torch.float64) + 0.1  # samples along dim 1: each [4]
    for reduction in ("none", "mean", "sum"):
        fn = lambda a, b: ours(a, b, reduction=reduction)  # noqa: E731
        _assert_same(torch.func.vmap(fn, in_dims=(1, 1))(x, t), _loop(fn, (x, t), (1, 1)))
        _assert_same(torch.func.vmap(fn, in_dims=(1, None))(x, t[:, 0]), _loop(fn, (x, t[:, 0]), (1, None)))
        _assert_same(torch.func.vmap(fn, in_dims=(None, 1))(x[:, 0], t), _loop(fn, (x[:, 0], t), (None, 1)))


@pytest.mark.parametrize("loss", LOSSES)
def test_vmap_backward_ops_with_batch_dims_anywhere(loss):
    op = getattr(torch.ops.npu_loss, BACKWARD_OP[loss])
    extra = {"smooth_l1_loss": (0.5,), "l1_loss": (), "kl_div": (False,), "huber_loss": (0.5,),
             "mse_loss": ()}[loss]
    g = torch.randn(6, dtype=torch.float64)
    x = torch.randn(3, 4, 6, dtype=torch.float64)
    t = torch.rand(6, 4, dtype=torch.float64) + 0.1
    for reduction in (1, 2):
        fn = lambda a, b, c: op(a, b, c, reduction, *extra)  # noqa: E731
        for in_dims in [(0, 2, 0), (None, 2, 0), (0, None, None), (0, 2, None), (None, None, 0)]:
            args = (g if in_dims[0] is not None else g[0], x if in_dims[1] is not None else x[..., 0],
                    t if in_dims[2] is not None else t[0])
            _assert_same(torch.func.vmap(fn, in_dims=in_dims)(*args), _loop(fn, args, in_dims))


@pytest.mark.parametrize("loss", LOSSES)
def test_nested_vmap(loss):
    ours, _ = _fns(loss)
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    t = torch.rand(3, 5, dtype=torch.float64) + 0.1
    fn = lambda a, b: ours(a, b, reduction="sum")  # noqa: E731
    inner = torch.func.vmap(fn)
    expected = torch.stack([_loop(fn, (a, t), (0, 0)) for a in x])
    _assert_same(torch.func.vmap(inner, in_dims=(0, None))(x, t), expected)


@pytest.mark.parametrize("loss", LOSSES)
def test_vmap_at_the_dimension_limit_runs_per_sample(loss):
    """8-dim samples (the ops' limit) cannot take a batch dim in one call; each sample runs on its own."""
    ours, _ = _fns(loss)
    x = torch.randn(3, 1, 2, 1, 2, 1, 2, 1, 2, dtype=torch.float64)
    t = torch.rand(3, 2, 1, 2, 1, 2, 1, 2, 1, dtype=torch.float64) + 0.1
    for reduction in ("none", "mean"):
        fn = lambda a, b: ours(a, b, reduction=reduction)  # noqa: E731
        _assert_same(torch.func.vmap(fn)(x, t), _loop(fn, (x, t), (0, 0)))
    grads = torch.func.vmap(torch.func.grad(lambda a, b: ours(a, b), argnums=(0, 1)))(x, t)
    expected = [torch.func.grad(lambda a, b: ours(a, b), argnums=(0, 1))(a, b) for a, b in zip(x, t)]
    for i in range(2):
        _assert_same(grads[i], torch.stack([e[i] for e in expected]))


def test_vmap_errors_are_the_ops_errors():
    x, t = torch.randn(4, 3), torch.randn(4, 3)
    with pytest.raises(ValueError, match="reduction must be 0"):
        torch.func.vmap(lambda a, b: torch.ops.npu_loss.l1_loss(a, b, 5))(x, t)
    with pytest.raises(ValueError, match="beta must be >= 0"):
        torch.func.vmap(lambda a, b: torch.ops.npu_loss.smooth_l1_loss(a, b, 1, -1.0))(x, t)
    with pytest.raises(ValueError, match="delta must be > 0"):
        torch.func.vmap(lambda a, b: torch.ops.npu_loss.huber_loss(a, b, 1, 0.0))(x, t)
    with pytest.raises(RuntimeError, match="without enlarging it"):
        torch.func.vmap(lambda g, a, b: torch.ops.npu_loss.kl_div_target_backward(g, a, b, 0, False))(
            torch.randn(4, 2, 3), x, t)
    with pytest.raises(TypeError, match="must have dtype"):
        torch.func.vmap(lambda a, b: torch.ops.npu_loss.l1_loss(a, b, 1))(x.long(), t.long())
