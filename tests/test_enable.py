"""npu_loss_ops.enable(): torch's own entry points (F.*, the nn modules, torch.ops.aten.*, references taken
before the call) run the package's ops and autograd nodes while routing is on, with torch's values and
gradients (except the documented differences), and torch's own kernels again after disable().

Routing is seen two ways: the autograd graph's loss node is the package's (NpuLoss...), and a profiler
records the npu_loss ops a call ran (it sees calls a dispatch mode would not, e.g. under inference_mode,
where the routed kernel sits below the Python key)."""
import contextlib
import importlib
import math
import os
import subprocess
import sys
import tempfile
import textwrap
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import npu_loss_ops
import samples
from helpers import init_gloo, leave_gloo
from npu_loss_ops import _enable
from test_ddp import _batch, _model

RELEASE = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])

# torch.func and inductor call torch.jit.script themselves.
pytestmark = [  # torch 2.13: a DeprecationWarning, 2.14: a FutureWarning
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning"),
]

# Every loss, from the declarations (tests/samples.py reads them); enable() routes each by this name.
LOSSES = list(samples.LOSSES)
NODE = {
    "smooth_l1_loss": "NpuLossSmoothL1LossBackward0",
    "huber_loss": "NpuLossHuberLossBackward0",
    "l1_loss": "NpuLossL1LossBackward0",
    "kl_div": "NpuLossKlDivBackward0",
    "mse_loss": "NpuLossMseLossBackward0",
}
REDUCTIONS = {
    "smooth_l1_loss": ["none", "mean", "sum"],
    "huber_loss": ["none", "mean", "sum"],
    "l1_loss": ["none", "mean", "sum"],
    "kl_div": ["none", "mean", "sum", "batchmean"],
    "mse_loss": ["none", "mean", "sum"],
}


@pytest.fixture(autouse=True)
def _routing_off():
    """Every test starts and ends with routing off, whatever it did in between."""
    npu_loss_ops.disable()
    yield
    npu_loss_ops.disable()
    assert not npu_loss_ops.is_enabled()


def _data(loss, shape=(4, 5), dtype=torch.float32, device="cpu", log_target=False):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    if loss == "kl_div":
        x = x.log_softmax(-1)
        t = torch.rand(shape, generator=g, dtype=torch.float64) + 0.05  # no zeros: torch's gradient is finite
        if log_target:
            t = t.log()
    else:
        t = torch.randn(shape, generator=g, dtype=torch.float64)
    return x.to(device, dtype), t.to(device, dtype)


def _loss_node(loss):
    """The loss op's node: the graph's root, or one step down after 'batchmean''s division."""
    node = loss.grad_fn
    if node.name() == "DivBackward0":
        node = node.next_functions[0][0]
    return node.name()


def _run(fn, x, t):
    """fn's loss and the gradients w.r.t. both inputs."""
    x = x.detach().clone().requires_grad_(True)
    t = t.detach().clone().requires_grad_(True)
    loss = fn(x, t)
    loss.sum().backward()
    return loss, x.grad, t.grad


def _npu_loss_ops_ran(fn):
    """The npu_loss ops that ran during fn(), from the profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events() if e.name.startswith("npu_loss::")}


def _assert_routed_like_torch(fn, x, t, loss, ops=None):
    """fn run with routing on has the package's loss node and torch's (routing off) loss and gradients."""
    want = _run(fn, x, t)
    assert not _loss_node(want[0]).startswith("NpuLoss")
    with npu_loss_ops.enable(ops):
        got = _run(fn, x, t)
    assert _loss_node(got[0]) == NODE[loss]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    return got


# ---- what routes ----------------------------------------------------------------------------------------


def _cases():
    for loss in LOSSES:
        for reduction in REDUCTIONS[loss]:
            for log_target in ([False, True] if loss == "kl_div" else [False]):
                yield loss, reduction, log_target


@pytest.mark.parametrize("loss,reduction,log_target", list(_cases()))
def test_functional(loss, reduction, log_target):
    x, t = _data(loss, log_target=log_target)
    kwargs = {"reduction": reduction}
    if loss == "kl_div":
        kwargs["log_target"] = log_target
    if loss == "smooth_l1_loss":
        kwargs["beta"] = 0.5
    if loss == "huber_loss":
        kwargs["delta"] = 0.5
    _assert_routed_like_torch(lambda a, b: getattr(F, loss)(a, b, **kwargs), x, t, loss)


@pytest.mark.parametrize("loss,module", [
    ("smooth_l1_loss", lambda: torch.nn.SmoothL1Loss(beta=0.7)),
    ("smooth_l1_loss", lambda: torch.nn.SmoothL1Loss(reduction="sum")),
    ("huber_loss", lambda: torch.nn.HuberLoss(delta=0.7)),
    ("huber_loss", lambda: torch.nn.HuberLoss(reduction="sum", delta=float("inf"))),
    ("l1_loss", lambda: torch.nn.L1Loss()),
    ("l1_loss", lambda: torch.nn.L1Loss(reduction="none")),
    ("kl_div", lambda: torch.nn.KLDivLoss(reduction="batchmean")),
    ("kl_div", lambda: torch.nn.KLDivLoss(reduction="sum", log_target=True)),
    ("mse_loss", lambda: torch.nn.MSELoss()),
    ("mse_loss", lambda: torch.nn.MSELoss(reduction="none")),
])
def test_nn_modules(loss, module):
    criterion = module()
    x, t = _data(loss, log_target=getattr(criterion, "log_target", False))
    _assert_routed_like_torch(criterion, x, t, loss)


@pytest.mark.parametrize("loss,call", [
    ("smooth_l1_loss", lambda a, b: torch.ops.aten.smooth_l1_loss(a, b, 2, 0.25)),
    ("smooth_l1_loss", lambda a, b: torch.ops.aten.smooth_l1_loss.default(a, b)),  # defaults left out
    ("huber_loss", lambda a, b: torch.ops.aten.huber_loss(a, b, 2, 0.25)),
    ("huber_loss", lambda a, b: torch.ops.aten.huber_loss.default(a, b)),
    ("l1_loss", lambda a, b: torch.ops.aten.l1_loss(a, b, 0)),
    ("l1_loss", lambda a, b: torch.ops.aten.l1_loss.default(a, b)),
    ("kl_div", lambda a, b: torch.ops.aten.kl_div(a, b, 2, log_target=False)),
    ("kl_div", lambda a, b: torch.kl_div(a, b.log(), 0, log_target=True)),
    ("kl_div", lambda a, b: torch.ops.aten.kl_div.default(a, b)),
    ("mse_loss", lambda a, b: torch.ops.aten.mse_loss(a, b, 2)),
    ("mse_loss", lambda a, b: torch.ops.aten.mse_loss.default(a, b)),
])
def test_aten_ops(loss, call):
    x, t = _data(loss)
    _assert_routed_like_torch(call, x, t, loss)


def test_aten_backward_op_and_its_out_overload():
    x, t = _data("smooth_l1_loss", shape=(3, 4))
    g = torch.randn(3, 4)
    backward = torch.ops.aten.smooth_l1_loss_backward
    want = backward(g, x, t, 0, 0.5)
    want_mean = backward(torch.tensor(2.0), x, t, 1, 0.5)
    # out= tensors ATen takes and the package's op does not: one to resize, two to cast into.
    outs = [torch.empty(0), torch.empty(3, 4, dtype=torch.float64), torch.empty(3, 4, dtype=torch.half)]
    want_outs = [backward.grad_input(g, x, t, 0, 0.5, grad_input=torch.empty_like(out)) for out in outs]
    with npu_loss_ops.enable():
        ran = _npu_loss_ops_ran(lambda: backward(g, x, t, 0, 0.5))
        assert ran == {"npu_loss::smooth_l1_loss_backward"}
        torch.testing.assert_close(backward(g, x, t, 0, 0.5), want)
        torch.testing.assert_close(backward.default(torch.tensor(2.0), x, t, 1, 0.5), want_mean)
        out = torch.full((3, 4), math.nan)
        ran = _npu_loss_ops_ran(lambda: backward.grad_input(g, x, t, 0, 0.5, grad_input=out))
        assert ran == {"npu_loss::smooth_l1_loss_backward"}  # the profiler names no overload
        torch.testing.assert_close(out, want)
        for out, want_out in zip(outs, want_outs):  # torch's kernel, as without enable()
            ran = _npu_loss_ops_ran(lambda: backward.grad_input(g, x, t, 0, 0.5, grad_input=out))
            assert ran == set()
            assert out.shape == (3, 4) and out.dtype == want_out.dtype
            torch.testing.assert_close(out, want_out, rtol=0, atol=0)


def test_reference_taken_before_enable(tmp_path):
    """Model code that imported the loss from torch.nn.functional (and nn) before enable() is routed too:
    nothing is rebound in Python."""
    (tmp_path / "old_model_code.py").write_text(textwrap.dedent("""
        from torch.nn import KLDivLoss
        from torch.nn.functional import l1_loss, smooth_l1_loss

        def box_loss(pred, target):
            return smooth_l1_loss(pred, target, beta=0.5) + l1_loss(pred, target)

        distill = KLDivLoss(reduction="batchmean")
    """))
    sys.path.insert(0, str(tmp_path))
    try:
        model_code = importlib.import_module("old_model_code")
    finally:
        sys.path.remove(str(tmp_path))
    x, t = _data("smooth_l1_loss")
    want = _run(model_code.box_loss, x, t)
    with npu_loss_ops.enable():
        got = _run(model_code.box_loss, x, t)
        ran = _npu_loss_ops_ran(lambda: model_code.box_loss(x, t))
    assert {n.name() for n, _ in got[0].grad_fn.next_functions} == {NODE["smooth_l1_loss"], NODE["l1_loss"]}
    assert ran == {"npu_loss::smooth_l1_loss", "npu_loss::l1_loss"}
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    x, t = _data("kl_div")
    _assert_routed_like_torch(model_code.distill, x, t, "kl_div")


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_no_grad_and_inference_mode(mode):
    context = torch.no_grad if mode == "no_grad" else torch.inference_mode
    calls = {
        "smooth_l1_loss": lambda x, t: F.smooth_l1_loss(x, t, beta=0.5),
        "l1_loss": lambda x, t: F.l1_loss(x, t, reduction="sum"),
        "kl_div": lambda x, t: F.kl_div(x, t, reduction="batchmean"),
    }
    for loss, call in calls.items():
        x, t = _data(loss)
        x.requires_grad_(mode == "no_grad")  # under no_grad, inputs that require grad get no graph either
        with context():
            want = call(x, t)
            with npu_loss_ops.enable():
                ran = _npu_loss_ops_ran(lambda: call(x, t))
                got = call(x, t)
        assert ran == {f"npu_loss::{loss}"}
        assert got.grad_fn is None
        torch.testing.assert_close(got, want)


# ---- the API --------------------------------------------------------------------------------------------


def _routed(loss):
    """Whether F's `loss` runs the package's op right now (from the graph)."""
    x, t = _data(loss)
    x.requires_grad_(True)
    return getattr(F, loss)(x, t, reduction="sum").grad_fn.name() == NODE[loss]


def _state():
    return {loss: _routed(loss) for loss in LOSSES}


ALL_ON = dict.fromkeys(LOSSES, True)
ALL_OFF = dict.fromkeys(LOSSES, False)


def test_off_at_import():
    code = ("import torch, npu_loss_ops\n"
            "x = torch.randn(3, requires_grad=True)\n"
            "assert not npu_loss_ops.is_enabled()\n"
            "print(torch.nn.functional.smooth_l1_loss(x, torch.zeros(3)).grad_fn.name())\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "SmoothL1LossBackward0"


def test_enable_disable_idempotent_and_is_enabled():
    assert not npu_loss_ops.is_enabled() and _state() == ALL_OFF
    npu_loss_ops.enable()
    assert npu_loss_ops.is_enabled() and _state() == ALL_ON
    assert all(npu_loss_ops.is_enabled(loss) for loss in LOSSES)
    npu_loss_ops.enable()  # again: nothing changes
    assert npu_loss_ops.is_enabled() and _state() == ALL_ON
    npu_loss_ops.disable()
    assert not npu_loss_ops.is_enabled() and _state() == ALL_OFF
    assert not any(npu_loss_ops.is_enabled(loss) for loss in LOSSES)
    npu_loss_ops.disable()  # again: nothing changes
    assert not npu_loss_ops.is_enabled() and _state() == ALL_OFF


def test_with_restores_the_previous_state_and_nests():
    with npu_loss_ops.enable():
        assert _state() == ALL_ON
        with npu_loss_ops.enable(ops=["l1_loss"]):
            assert _state() == {**ALL_OFF, "l1_loss": True}
            assert npu_loss_ops.is_enabled() and not npu_loss_ops.is_enabled("kl_div")
            with npu_loss_ops.enable():
                assert _state() == ALL_ON
            assert _state() == {**ALL_OFF, "l1_loss": True}
        assert _state() == ALL_ON
    assert not npu_loss_ops.is_enabled() and _state() == ALL_OFF

    # Entered while already on: the exit leaves it on.
    npu_loss_ops.enable(ops=("kl_div",))
    with npu_loss_ops.enable():
        assert _state() == ALL_ON
    assert _state() == {**ALL_OFF, "kl_div": True}
    npu_loss_ops.disable()

    # An exception leaves the block with the previous state restored; disable() inside a block is undone by
    # its exit too (the exit restores what was there before the block).
    with pytest.raises(KeyError), npu_loss_ops.enable():
        raise KeyError("boom")
    assert _state() == ALL_OFF
    npu_loss_ops.enable()
    with npu_loss_ops.enable(ops="smooth_l1_loss"):
        npu_loss_ops.disable()
        assert _state() == ALL_OFF
    assert _state() == ALL_ON


@pytest.mark.parametrize("ops", [["smooth_l1_loss"], ("l1_loss", "kl_div"), "kl_div", []])
def test_ops_selects_a_subset(ops):
    chosen = {ops} if isinstance(ops, str) else set(ops)
    npu_loss_ops.enable(ops=ops)
    assert _state() == {loss: loss in chosen for loss in LOSSES}
    assert npu_loss_ops.is_enabled() == bool(chosen)
    assert {loss for loss in LOSSES if npu_loss_ops.is_enabled(loss)} == chosen


def test_unknown_names_are_value_errors():
    unknown = ["mse", "MSELoss", "SmoothL1Loss", "HuberLoss", "smooth_l1", "cross_entropy", ""]
    npu_loss_ops.enable(ops=["l1_loss"])
    for name in unknown:
        with pytest.raises(ValueError, match=repr(name)):
            npu_loss_ops.enable(ops=["smooth_l1_loss", name])
        with pytest.raises(ValueError, match=repr(name)):
            npu_loss_ops.is_enabled(name)
    assert _state() == {**ALL_OFF, "l1_loss": True}  # unchanged


def test_every_routed_aten_op_has_an_npu_loss_op_of_the_same_schema():
    """The routed kernels pass ATen's arguments on unchanged, so each pair must have the same arguments
    (names, types, defaults, keyword-only) and returns; and each row is a torch.nn.functional name."""
    assert sorted(_enable._LOSSES) == sorted(LOSSES)
    for loss, overloads in _enable._LOSSES.items():
        assert hasattr(F, loss), loss
        for overload in overloads:
            aten = _enable._overload(torch.ops.aten, overload)._schema
            ours = _enable._overload(torch.ops.npu_loss, overload)._schema
            assert str(aten).removeprefix("aten::") == str(ours).removeprefix("npu_loss::"), overload


def test_switching_resets_dynamo_only_to_install_the_routing_guard(monkeypatch):
    """The first switch after torch._dynamo was imported drops the frames compiled without the routing guard;
    later switches leave the compiled frames alone (each carries the guard)."""
    import torch._dynamo

    from npu_loss_ops import _enable

    resets = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))
    monkeypatch.setattr(_enable, "_guard_state", "")
    npu_loss_ops.enable()
    npu_loss_ops.enable()  # no switch
    assert len(resets) == 1 and _enable._guard_state == "installed"
    npu_loss_ops.enable(ops=["l1_loss"])
    npu_loss_ops.disable()
    npu_loss_ops.disable()
    with npu_loss_ops.enable():
        pass
    assert len(resets) == 1
    assert torch.compiler.config.cache_key_tag == ""


def test_compiled_training_loop_with_enable_around_each_step_compiles_once_per_routing():
    """10 steps of a torch.compile'd model, each step inside `with enable():` and an evaluation pass outside
    it: two compiles in all (one per routing state), each step running the routing it is under."""
    import torch._dynamo

    torch._dynamo.reset()
    npu_loss_ops.disable()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    compiled = torch.compile(model)
    x, y = torch.randn(32, 8), torch.randn(32, 4)

    def step():
        loss = F.smooth_l1_loss(compiled(x), y) + F.mse_loss(compiled(x), y)
        loss.backward()
        return loss

    torch._dynamo.utils.counters.clear()
    for _ in range(10):
        with npu_loss_ops.enable():
            assert _npu_loss_ops_ran(step) >= {"npu_loss::smooth_l1_loss", "npu_loss::mse_loss"}
        assert _npu_loss_ops_ran(step) == set()
    assert torch._dynamo.utils.counters["frames"]["ok"] <= 2, dict(torch._dynamo.utils.counters["frames"])
    torch._dynamo.reset()


def test_a_compiled_loss_runs_only_under_the_routing_it_was_compiled_for():
    """The loss inside the compiled graph: with routing on the graph calls the package's ops, off it calls
    none, on both states' compiled graphs kept (no recompile after the first of each)."""
    import torch._dynamo

    torch._dynamo.reset()
    f, x, t = _compiled_case()
    compiled = torch.compile(f, backend="aot_eager")
    want = _run(f, x, t)
    torch._dynamo.utils.counters.clear()
    for _ in range(5):
        for routed in (True, False):
            with npu_loss_ops.enable() if routed else contextlib.nullcontext():
                ran = _npu_loss_ops_ran(lambda: _run(compiled, x, t))
                for g, w in zip(_run(compiled, x, t), want):
                    torch.testing.assert_close(g, w)
            assert bool(ran) == routed, (routed, ran)
    assert torch._dynamo.utils.counters["frames"]["ok"] <= 2, dict(torch._dynamo.utils.counters["frames"])
    torch._dynamo.reset()


# ---- where it must work ---------------------------------------------------------------------------------


def _compiled_case():
    def f(a, b):
        return (F.smooth_l1_loss(a, b, beta=0.5) + F.l1_loss(a, b, reduction="sum")
                + F.kl_div(a.log_softmax(-1), b.softmax(-1), reduction="batchmean"))

    x, t = _data("smooth_l1_loss", shape=(8, 5))
    return f, x, t


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_before_and_after_a_switch(backend):
    """One compiled function, called with routing off, on, off: each call runs what eager runs at that
    moment (no compiled graph and no on-disk AOTAutograd/Inductor cache entry keeps the old routing), with
    eager torch's values and gradients."""
    import torch._dynamo

    torch._dynamo.reset()
    f, x, t = _compiled_case()
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    want = _run(f, x, t)
    for routed in (False, True, False, True):
        if routed:
            npu_loss_ops.enable()
        else:
            npu_loss_ops.disable()
        got = _run(compiled, x, t)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        ran = _npu_loss_ops_ran(lambda: _run(compiled, x, t))
        expected = {"npu_loss::smooth_l1_loss", "npu_loss::l1_loss", "npu_loss::kl_div",
                    "npu_loss::smooth_l1_loss_backward", "npu_loss::l1_loss_backward",
                    "npu_loss::kl_div_target_backward"}
        assert ran == (expected if routed else set()), (routed, ran)
    torch._dynamo.reset()


def test_compile_under_no_grad_and_inference_mode():
    import torch._dynamo

    torch._dynamo.reset()
    f, x, t = _compiled_case()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    want = f(x, t)
    routed = {"npu_loss::smooth_l1_loss", "npu_loss::l1_loss", "npu_loss::kl_div"}
    with npu_loss_ops.enable():
        for context in (torch.no_grad, torch.inference_mode):
            with context():
                ran = _npu_loss_ops_ran(lambda: compiled(x, t))
                torch.testing.assert_close(compiled(x, t), want)
            if context is torch.inference_mode and RELEASE < (2, 8):
                # torch 2.7 traces l1_loss and kl_div (CompositeImplicitAutograd ops) under
                # inference_mode by their decomposition before the routing kernel at the backend key is reached
                # (the Autograd keys, where it would see them first, are excluded there): torch computes
                # them, as it does without enable() (docs/usage.md, "Use it in existing code").
                assert "npu_loss::smooth_l1_loss" in ran and ran <= routed, ran
            else:
                assert ran == routed, context
    torch._dynamo.reset()


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # torch's own kl_div under vmap
@pytest.mark.parametrize("loss", LOSSES)
def test_torch_func_grad_vmap_jvp(loss):
    x, t = _data(loss, shape=(3, 4, 5))
    kwargs = {"reduction": "batchmean"} if loss == "kl_div" else {"reduction": "mean"}

    def f(a, b):
        return getattr(F, loss)(a, b, **kwargs)

    def results():
        return [
            torch.func.grad(f, argnums=(0, 1))(x, t),
            torch.func.vmap(f)(x, t),
            torch.func.vmap(torch.func.grad(f))(x, t),  # per-sample gradients
            torch.func.jvp(f, (x, t), (torch.ones_like(x), torch.ones_like(t))),
        ]

    want = results()
    with npu_loss_ops.enable():
        got = results()
        ran = _npu_loss_ops_ran(results)
    assert f"npu_loss::{loss}" in ran
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("loss", LOSSES)
def test_autocast_cpu(loss):
    """torch's autocast runs these losses in float32 on CPU; routed, they still do, with the same values."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 5)
    x = torch.randn(7, 6)
    t = torch.rand(7, 5) + 0.05 if loss == "kl_div" else torch.randn(7, 5)

    def step():
        lin.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = lin(x)
            assert y.dtype == torch.bfloat16
            if loss == "kl_div":
                y = y.log_softmax(-1)
            out = getattr(F, loss)(y, t, reduction="sum")
        out.backward()
        return out, lin.weight.grad.clone()

    want = step()
    with npu_loss_ops.enable():
        got = step()
    assert got[0].dtype == want[0].dtype == torch.float32
    assert _loss_node(got[0]) == NODE[loss]
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)


def test_autocast_left_to_torch_where_aten_has_no_autocast_kernel():
    """Where the package's op has an Autocast kernel and ATen's op has none (or a fallthrough) for the device,
    torch computes in the inputs' dtype, so the routed kernel calls the package's op with that Autocast key
    excluded (else it would cast to float32). CPU and torch_npu have Autocast kernels for the routed
    forwards, so ATen's AutocastCPU kernel for smooth_l1_loss is made a fallthrough here, for the test."""
    x, t = (v.bfloat16() for v in _data("smooth_l1_loss"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert F.smooth_l1_loss(x, t).dtype == torch.float32  # ATen's AutocastCPU kernel: float32
        with npu_loss_ops.enable():
            assert F.smooth_l1_loss(x, t).dtype == torch.float32  # torch's dtype, by the package's op
    no_autocast = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"(?s).*Overriding a previously registered kernel")
            no_autocast.impl("smooth_l1_loss", torch.library.fallthrough_kernel, "AutocastCPU")
        want = F.smooth_l1_loss(x, t)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert F.smooth_l1_loss(x, t).dtype == torch.bfloat16  # torch now computes in the inputs' dtype
            with npu_loss_ops.enable():
                assert _npu_loss_ops_ran(lambda: F.smooth_l1_loss(x, t)) == {"npu_loss::smooth_l1_loss"}
                got = F.smooth_l1_loss(x, t)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got, want)
    finally:
        no_autocast._destroy()


def _ddp_worker(rank, world, result_dir):
    init_gloo(rank, world, result_dir)
    finished = False
    try:
        npu_loss_ops.enable()  # process-wide, per process: each rank enables its own
        x, y = _batch()
        half = x.shape[0] // world
        rows = slice(rank * half, (rank + 1) * half)
        results = {}
        for name, criterion in _DDP_CRITERIA.items():
            model = torch.nn.parallel.DistributedDataParallel(_model())
            loss = _ddp_loss(name, criterion, model(x[rows]), y[rows])
            node = _loss_node(loss)
            loss.backward()
            results[name] = (node, [p.grad.clone() for p in model.module.parameters()])
        if rank == 0:
            torch.save(results, os.path.join(result_dir, "enable_ddp.pt"))
        finished = True
    finally:
        leave_gloo(finished)


_DDP_CRITERIA = {
    "smooth_l1_loss": torch.nn.SmoothL1Loss(beta=0.5),
    "l1_loss": torch.nn.L1Loss(),
    "kl_div": torch.nn.KLDivLoss(reduction="batchmean"),
}


def _ddp_loss(name, criterion, out, y):
    if name == "kl_div":
        return criterion(torch.log_softmax(out, -1), torch.softmax(y, -1))
    return criterion(out, y)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed gloo")
def test_ddp_two_processes():
    """Two gloo ranks, each enable()d: the loss nodes are the package's and DDP's averaged gradients equal one
    process's gradients on the whole batch with torch's own losses."""
    with tempfile.TemporaryDirectory() as result_dir:
        mp.start_processes(_ddp_worker, args=(2, result_dir), nprocs=2, join=True,
                           start_method="spawn")
        ddp = torch.load(os.path.join(result_dir, "enable_ddp.pt"))
    x, y = _batch()
    for name, criterion in _DDP_CRITERIA.items():
        node, grads = ddp[name]
        assert node == NODE[name]
        model = _model()
        _ddp_loss(name, criterion, model(x), y).backward()
        for got, want in zip(grads, (p.grad for p in model.parameters())):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


# ---- what the package rejects runs torch's kernel; the documented differences apply ------------------------


def _nine_dims(loss):
    return _data(loss, shape=(2, 1, 3, 1, 1, 2, 1, 1, 3))


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # torch's own kl_div under vmap
@pytest.mark.parametrize("loss", LOSSES)
def test_nine_dims_run_torchs_kernel(loss):
    x, t = _nine_dims(loss)
    fn = getattr(F, loss)
    want = _run(fn, x, t)
    with npu_loss_ops.enable():
        got = _run(fn, x, t)
        ran = _npu_loss_ops_ran(lambda: fn(x, t))
        with torch.inference_mode():
            assert _npu_loss_ops_ran(lambda: fn(x, t)) == set()
            torch.testing.assert_close(fn(x, t), want[0])
        vmapped = torch.func.vmap(lambda a, b: fn(a, b))(x.unsqueeze(0), t.unsqueeze(0))  # 9 logical dims
    assert ran == set()
    assert not _loss_node(got[0]).startswith("NpuLoss")
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    torch.testing.assert_close(vmapped[0], want[0])


def test_the_dimension_limit_is_the_ops():
    """Routing's limit is the op's own: 8 dims route, and the op itself rejects 9."""
    x, t = _data("l1_loss", shape=(2, 1, 3, 1, 1, 2, 1, 3))
    _assert_routed_like_torch(F.l1_loss, x, t, "l1_loss")
    x9, t9 = _nine_dims("l1_loss")
    with pytest.raises(RuntimeError, match="at most 8"):
        torch.ops.npu_loss.l1_loss(x9, t9)


def test_other_rejected_inputs_run_torchs_kernel():
    x, t = _data("l1_loss")
    c1, c2 = torch.randn(4, dtype=torch.cfloat), torch.randn(4, dtype=torch.cfloat)
    cases = {
        # F.l1_loss computes integer 'sum' in the integer dtype, complex inputs as real L1; the package's
        # op takes neither (its own Python API casts integers; complex it rejects).
        "int": lambda: F.l1_loss(torch.arange(6), torch.arange(6).flip(0), reduction="sum"),
        "complex": lambda: F.l1_loss(c1, c2),
        # ATen takes any integer reduction (an unknown one means none); the op takes 0, 1 and 2.
        "reduction": lambda: torch.ops.aten.l1_loss(x, t, 7),
        "bool": lambda: F.smooth_l1_loss(x > 0, t),
    }
    want = {name: call() for name, call in cases.items()}
    with npu_loss_ops.enable():
        for name, call in cases.items():
            assert _npu_loss_ops_ran(call) == set(), name
            got = call()
            assert got.dtype == want[name].dtype, name
            torch.testing.assert_close(got, want[name], msg=name)
        # Rejected by both: torch's error, as before enable() (the op would raise ValueError).
        with pytest.raises(RuntimeError, match="negative values for beta"):
            F.smooth_l1_loss(x, t, beta=-1.0)


def test_float64_runs_the_packages_op_on_the_cpu():
    x, t = _data("smooth_l1_loss", dtype=torch.float64)
    _assert_routed_like_torch(lambda a, b: F.smooth_l1_loss(a, b), x, t, "smooth_l1_loss")


def test_kl_target_gradient_at_target_zero_is_zero():
    """The documented difference: torch's autograd gives NaN there, the package 0."""
    x = torch.randn(2, 3).log_softmax(-1)
    t = torch.tensor([[0.5, 0.0, 0.5], [0.0, 1.0, 0.0]])
    _, _, want = _run(lambda a, b: F.kl_div(a, b, reduction="batchmean"), x, t)
    with npu_loss_ops.enable():
        _, _, got = _run(lambda a, b: F.kl_div(a, b, reduction="batchmean"), x, t)
    zero = t == 0
    assert torch.isnan(want[zero]).all()
    assert (got[zero] == 0).all()
    torch.testing.assert_close(got[~zero], want[~zero])


def test_smooth_l1_with_beta_zero_follows_l1_routing():
    """F.smooth_l1_loss with beta=0 is torch's L1 loss: F calls aten::l1_loss, so l1_loss's row routes it."""
    x, t = _data("smooth_l1_loss")
    x.requires_grad_(True)
    with npu_loss_ops.enable(ops=["smooth_l1_loss"]):
        assert F.smooth_l1_loss(x, t, beta=0.0).grad_fn.name() == "MeanBackward0"
    with npu_loss_ops.enable(ops=["l1_loss"]):
        assert F.smooth_l1_loss(x, t, beta=0.0).grad_fn.name() == NODE["l1_loss"]


def test_l1_weight_is_torchs_composition():
    """F.l1_loss(weight=) never calls aten::l1_loss (F composes abs and mul itself): not routed, torch's."""
    x, t = _data("l1_loss")
    w = torch.rand(4, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = F.l1_loss(x, t, weight=w)
        with npu_loss_ops.enable():
            assert _npu_loss_ops_ran(lambda: F.l1_loss(x, t, weight=w)) == set()
            torch.testing.assert_close(F.l1_loss(x, t, weight=w), want)


# ---- on the test device (the NPU in the emulated suite) ----------------------------------------------------


@pytest.mark.parametrize("loss", LOSSES)
def test_on_device(device, loss):
    """On the device (the NPU: this replaces torch_npu's kernels), the routed call has the package's node
    and the CPU torch values and gradients."""
    x, t = _data(loss)
    fn = getattr(F, loss)
    want = _run(fn, x, t)
    with npu_loss_ops.enable():
        got = _run(fn, x.to(device), t.to(device))
    assert _loss_node(got[0]) == NODE[loss]
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5)


def test_float64_routing_decision_on_device(device):
    """float64 is routed off the NPU and left to torch on it. The check is asserted directly: on the NPU,
    torch_npu's kernels reject float64 as well (the aclnn APIs take no DOUBLE; so do they any reduction but
    0-2 and more than 8 dims), so running such a call there would only trade one rejected aclnn call for
    another. On the CPU, test_nine_dims_run_torchs_kernel and test_other_rejected_inputs_run_torchs_kernel
    run torch's kernel for real."""
    npu = torch._C._get_privateuse1_backend_name()
    for overload in (o for overloads in _enable._LOSSES.values() for o in overloads):
        for dtype in (torch.float32, torch.float64):
            x, t = (v.to(device, dtype) for v in _data("l1_loss", shape=(3,)))
            # The overload's own arguments: its tensors, then reduction 0 and a valid scalar (beta, delta: 1.0;
            # log_target: False).
            schema = _enable._overload(torch.ops.aten, overload)._schema
            tensors = iter([torch.ones(3, device=device, dtype=dtype), x, t] if "backward" in overload else [x, t])
            args, kwargs = [], {}
            for arg in schema.arguments:
                if arg.kwarg_only:
                    if arg.is_out:
                        kwargs[arg.name] = torch.empty_like(x)
                    continue
                kind = str(arg.type)
                args.append({"Tensor": lambda: next(tensors), "int": lambda: 0, "bool": lambda: False}.get(
                    kind, lambda: 1.0)())
            accepted = npu_loss_ops._C._aten_route_accepts(overload, *args, **kwargs)
            assert accepted == (dtype == torch.float32 or device != npu), (overload, dtype)


@pytest.mark.parametrize("loss, scalar", [("smooth_l1_loss", {"beta": 0.5}), ("huber_loss", {"delta": 2.0}),
                                          ("mse_loss", {})])
def test_npu_backward_runs_aclnn_under_enable(device, loss, scalar):
    """Under enable(), F.smooth_l1_loss(...).backward(), F.huber_loss(...).backward() and
    F.mse_loss(...).backward() on the NPU run the aclnn API the chip paths give for the chip
    (aclnnSmoothL1LossBackward on 910B, for Huber with beta = delta; aclnnMseLossBackward for MSE), read
    from the emulated CANN's trace."""
    if device != "npu":
        pytest.skip("the aclnn paths exist only on the NPU")
    import test_npu_paths as paths

    if not paths.emulator.active():
        pytest.skip("needs the emulated CANN's trace (scripts/run_npu_emulated.sh)")
    x, t = _data(loss)
    x = x.to(device).requires_grad_(True)
    with npu_loss_ops.enable():
        out = getattr(F, loss)(x, t.to(device), **scalar)
        paths.emulator.trace_reset()
        out.backward()
        torch.npu.synchronize()
        trace = paths.emulator.trace()
    ran = {name for name in trace if name in paths.LOSS_APIS}
    api = paths.expected_api(f"{loss}_backward", torch.float32, *scalar.values())
    assert out.grad_fn.name() == NODE[loss]
    assert ran == ({api} if api else set()), trace
    if paths.family() == "910B":
        assert api == ("aclnnMseLossBackward" if loss == "mse_loss" else "aclnnSmoothL1LossBackward")
