"""torch.compile(fullgraph=True) of training steps that use the losses: same loss and gradients as eager,
our ops in the forward and backward graphs, out= overloads functionalized. aot_eager for most (fast);
inductor for one loss."""
import copy

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

import npu_loss_ops
from reference import assert_close
from samples import BACKWARD_OP, LOSSES


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class RecordingBackend:
    """aot_autograd that keeps the forward and backward graphs' code."""

    def __init__(self):
        self.forward, self.backward = [], []

        def fw(gm, example_inputs):
            self.forward.append(gm.code)
            return make_boxed_func(gm.forward)

        def bw(gm, example_inputs):
            self.backward.append(gm.code)
            return make_boxed_func(gm.forward)

        self.backend = aot_autograd(fw_compiler=fw, bw_compiler=bw)


LOSS_CONFIGS = {
    "smooth_l1_loss": [dict(reduction="mean", beta=0.5), dict(reduction="sum", beta=0.0)],
    "l1_loss": [dict(reduction="mean"), dict(reduction="none")],
    "kl_div": [dict(reduction="batchmean"), dict(reduction="sum", log_target=True)],
    "huber_loss": [dict(reduction="mean", delta=0.5), dict(reduction="none", delta=1e4),
                   dict(reduction="sum", delta=float("inf"))],
    "mse_loss": [dict(reduction="mean"), dict(reduction="none"), dict(reduction="sum")],
}


def _data(loss, dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 8, generator=g, dtype=dtype)
    if loss == "kl_div":
        target = torch.softmax(torch.randn(16, 4, generator=g, dtype=dtype), -1)
    else:
        target = torch.randn(16, 4, generator=g, dtype=dtype)
    return x, target


def _model(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(dtype)


def _step_fn(loss, kwargs):
    fn = getattr(npu_loss_ops, loss)

    def step(model, x, target):
        out = model(x)
        if loss == "kl_div":
            out = torch.log_softmax(out, -1)
            if kwargs.get("log_target"):
                target = target.log()
        return fn(out, target, **kwargs)

    return step


def _run(step, model, x, target):
    target = target.detach().clone().requires_grad_(True)
    loss = step(model, x, target)
    loss.sum().backward()
    grads = [p.grad.detach().clone() for p in model.parameters()] + [target.grad.detach().clone()]
    return loss.detach(), grads


@pytest.mark.parametrize("loss,kwargs", [(loss, kw) for loss in LOSSES for kw in LOSS_CONFIGS[loss]],
                         ids=[f"{loss}-{i}" for loss in LOSSES for i in range(len(LOSS_CONFIGS[loss]))])
def test_compiled_training_step_matches_eager(loss, kwargs):
    x, target = _data(loss)
    model = _model()
    step = _step_fn(loss, kwargs)
    eager_loss, eager_grads = _run(step, copy.deepcopy(model), x, target)

    rec = RecordingBackend()
    compiled = torch.compile(step, backend=rec.backend, fullgraph=True)
    c_loss, c_grads = _run(compiled, copy.deepcopy(model), x, target)

    assert_close(c_loss, eager_loss)
    for a, e in zip(c_grads, eager_grads):
        assert_close(a, e, magnitude=e.abs().max().expand(e.shape))
    assert len(rec.forward) == 1 and len(rec.backward) == 1, "expected one graph each way (no graph break)"
    assert f"npu_loss.{loss}.default" in rec.forward[0]
    assert f"npu_loss.{BACKWARD_OP[loss]}.default" in rec.backward[0]


def test_compiled_training_loop_inductor():
    """The real compiler on one loss: a few SGD steps, same parameters as eager."""
    x, target = _data("smooth_l1_loss")
    loss_mod = npu_loss_ops.SmoothL1Loss(beta=0.5)

    def train(model, steps, compile_step):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def fwd(x, target):
            return loss_mod(model(x), target)

        f = torch.compile(fwd, backend="inductor", fullgraph=True) if compile_step else fwd
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            loss = f(x, target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, [p.detach() for p in model.parameters()]

    model = _model()
    eager_losses, eager_params = train(copy.deepcopy(model), 3, False)
    c_losses, c_params = train(copy.deepcopy(model), 3, True)
    torch.testing.assert_close(torch.tensor(c_losses), torch.tensor(eager_losses), rtol=1e-5, atol=1e-6)
    for a, e in zip(c_params, eager_params):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loss", LOSSES)
def test_compiled_out_overload_is_functionalized(loss):
    """An out= overload inside a compiled function: buffer mutated as in eager, one graph."""
    x = torch.randn(4, 5)
    t = torch.rand(4, 5) + 0.1
    g = torch.randn(4, 5)
    op = getattr(torch.ops.npu_loss, BACKWARD_OP[loss])
    if loss == "smooth_l1_loss":
        def f(g, x, t, buf):
            op.grad_input(g, x, t, 0, 0.5, grad_input=buf)
            return buf * 2
    elif loss in ("l1_loss", "mse_loss"):
        def f(g, x, t, buf):
            op.grad_input(g, x, t, 0, grad_input=buf)
            return buf * 2
    elif loss == "huber_loss":
        def f(g, x, t, buf):
            op.out(g, x, t, 0, 0.5, grad_input=buf)
            return buf * 2
    else:
        def f(g, x, t, buf):
            op.grad_target(g, x, t, 0, False, grad_target=buf)
            return buf * 2

    eager_buf = torch.zeros(4, 5)
    eager = f(g, x, t, eager_buf)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    c_buf = torch.zeros(4, 5)
    compiled = torch.compile(f, backend=counter, fullgraph=True)(g, x, t, c_buf)
    assert torch.equal(compiled, eager)
    assert torch.equal(c_buf, eager_buf) and not torch.equal(c_buf, torch.zeros(4, 5))
    assert counter.frame_count == 1


def test_compiled_with_broadcast_target_has_no_warning_graph_break(recwarn):
    """F's target-size warning is issued in eager only; compiled, the broadcast call is one graph."""
    x = torch.randn(4, 5, requires_grad=True)
    t = torch.randn(5)
    eager = npu_loss_ops.l1_loss(x, t)
    assert any("target size" in str(w.message) for w in recwarn.list)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(lambda a, b: npu_loss_ops.l1_loss(a, b), backend=counter, fullgraph=True)(x, t)
    assert counter.frame_count == 1
    torch.testing.assert_close(compiled, eager)


def test_compiled_dynamic_shapes():
    """dynamic=True: one graph serves several batch sizes, values match eager."""
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    f = torch.compile(lambda a, b: npu_loss_ops.smooth_l1_loss(a, b, beta=0.5), backend=counter,
                      fullgraph=True, dynamic=True)
    for n in (3, 5, 9):
        a, b = torch.randn(n, 4, requires_grad=True), torch.randn(n, 4)
        out = f(a, b)
        torch.testing.assert_close(out, npu_loss_ops.smooth_l1_loss(a, b, beta=0.5))
        (ga,) = torch.autograd.grad(out, a)
        (ea,) = torch.autograd.grad(npu_loss_ops.smooth_l1_loss(a, b, beta=0.5), a)
        torch.testing.assert_close(ga, ea)
    assert counter.frame_count == 1
