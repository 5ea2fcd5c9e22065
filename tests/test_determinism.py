"""docs/semantics.md ("Layouts and determinism"): the CPU kernels give bitwise-identical outputs on every run and for every thread count, reductions
included (forward sums, KL's sum to target's shape), contiguous and not."""
import pytest
import torch

import npu_loss_ops


def _inputs(dtype, layout):
    """1024 x 1024 (~1M elements: many reduction chunks and several threads' worth of work)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1024, 1024, generator=g).to(dtype)
    t = (torch.rand(1024, 1024, generator=g) + 0.05).to(dtype)
    if layout == "transposed":
        x, t = x.t(), t.t()
    elif layout == "sliced":
        x = torch.randn(1024, 2048, generator=g).to(dtype)[:, ::2]
    return x, t


def _results_under(threads, fn, repeats=2):
    torch.set_num_threads(threads)  # the autouse fixture in conftest restores the count
    # Without intra-op threads (a torch built without OpenMP) "2 threads" would silently be 1 and the
    # comparison across thread counts would compare nothing.
    assert torch.get_num_threads() == threads, f"asked for {threads} threads, torch runs {torch.get_num_threads()}"
    return [fn() for _ in range(repeats)]


def _assert_bitwise_same(results):
    first = results[0]
    for r in results[1:]:
        assert r.dtype == first.dtype and r.shape == first.shape
        # bit patterns, so that NaN payloads and -0.0 count too
        assert torch.equal(r.view(torch.uint8 if r.element_size() == 1 else _int_type(r)),
                           first.view(torch.uint8 if first.element_size() == 1 else _int_type(first)))


def _int_type(t):
    return {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]


FORWARDS = {
    "smooth_l1_loss": lambda x, t, r: torch.ops.npu_loss.smooth_l1_loss(x, t, r, 0.5),
    "l1_loss": lambda x, t, r: torch.ops.npu_loss.l1_loss(x, t, r),
    "kl_div": lambda x, t, r: torch.ops.npu_loss.kl_div(x, t, r, log_target=False),
    "huber_loss": lambda x, t, r: torch.ops.npu_loss.huber_loss(x, t, r, 0.5),
    "mse_loss": lambda x, t, r: torch.ops.npu_loss.mse_loss(x, t, r),
}


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", [1, 2])
@pytest.mark.parametrize("name", FORWARDS)
def test_forward_reduction_bitwise_across_runs_and_threads(name, reduction, dtype, layout):
    fn = FORWARDS[name]
    x, t = _inputs(dtype, layout)
    results = _results_under(1, lambda: fn(x, t, reduction)) + _results_under(2, lambda: fn(x, t, reduction))
    _assert_bitwise_same(results)


@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("target_shape,layout", [
    ((1, 1024), "contiguous"), ((1024, 1), "contiguous"), ((1024,), "contiguous"), ((1, 1024), "transposed"),
])
def test_kl_target_backward_broadcast_sum_bitwise(target_shape, layout, log_target):
    """The target gradient sums over the broadcast dims: same bits for 1 and 2 threads."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(1024, 1024, generator=g)
    if layout == "transposed":
        x = x.t()
    t = torch.rand(target_shape, generator=g) + 0.05
    go = torch.randn(1024, 1024, generator=g)

    def fn():
        return torch.ops.npu_loss.kl_div_target_backward(go, x, t, 1, log_target)

    results = _results_under(1, fn) + _results_under(2, fn)
    _assert_bitwise_same(results)


@pytest.mark.parametrize("name", ["smooth_l1_loss_backward", "l1_loss_backward", "huber_loss_backward",
                                  "mse_loss_backward"])
def test_elementwise_backward_bitwise(name):
    x, t = _inputs(torch.float32, "transposed")
    g = torch.tensor(0.5)
    op = getattr(torch.ops.npu_loss, name)
    args = (g, x, t, 1, 0.5) if name.startswith(("smooth", "huber")) else (g, x, t, 1)
    _assert_bitwise_same(_results_under(1, lambda: op(*args)) + _results_under(2, lambda: op(*args)))


def test_autograd_gradients_bitwise():
    """A full forward + backward through the functional API, twice per thread count."""
    def fn():
        x, t = _inputs(torch.float32, "contiguous")
        x = x[:256].requires_grad_(True)
        t = t[:1].requires_grad_(True)  # broadcast target: summed gradient
        loss = npu_loss_ops.kl_div(x, t, reduction="batchmean")
        gx, gt = torch.autograd.grad(loss, (x, t))
        return torch.cat([loss.detach().reshape(1), gx.flatten(), gt.flatten()])

    _assert_bitwise_same(_results_under(1, fn) + _results_under(2, fn))
