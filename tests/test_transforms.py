"""Every PyTorch transform on the five losses and on their backward ops, each compared with the same call
on torch.nn.functional.

Transforms: torch.func grad, vjp, jacrev, jacfwd, jvp, hessian; vmap(grad) per-sample gradients (vmap runs
on batching rules: the per-sample fallback's performance warning is an error in this module); forward-mode
AD with torch.autograd.forward_ad dual tensors; gradcheck with forward AD, backward AD and batched
gradients; gradgradcheck (reverse over reverse and forward over reverse); compiled autograd.

The losses are compared with torch.nn.functional's; the backward ops with the same transform applied to
torch.func.vjp of F's loss (w.r.t. self for the L1 losses, w.r.t. target for KL). Every reduction, both
log_target modes, beta 0 / 0.5 / 1, Huber's delta 0.5 / 3 / inf, MSE, same-shape and broadcast targets, float64,
small shapes; inputs stay away from the kinks (d == 0, |d| == beta or delta) and KL's probability targets are positive (the package's one
deliberate difference is at target == 0).
"""
import dataclasses
import math

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch.autograd import gradcheck, gradgradcheck
from torch.utils import _pytree as pytree

import npu_loss_ops
from samples import BACKWARD_OP, LOSSES, REDUCTIONS, functional_kwargs

pytestmark = [
    pytest.mark.filterwarnings("error:There is a performance drop"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated"),
    pytest.mark.filterwarnings("ignore:Using a target size"),
]

SHAPE = (3, 4)
BROADCAST_TARGET_SHAPE = (4,)
BATCH = 3


FALLBACK_WARNING = "There is a performance drop"


@pytest.fixture(autouse=True, scope="module")
def _vmap_fallback_warns():
    """Make PyTorch's per-sample vmap fallback announce itself (it is silent by default)."""
    torch._C._functorch._set_vmap_fallback_warning_enabled(True)
    yield
    torch._C._functorch._set_vmap_fallback_warning_enabled(False)


@pytest.fixture(autouse=True)
def _no_vmap_fallback(capfd):
    """The fallback warns as a Python warning (an error here) or, outside a Python call, on stderr."""
    yield
    assert FALLBACK_WARNING not in capfd.readouterr().err


@dataclasses.dataclass(frozen=True)
class Case:
    loss: str
    reduction: str
    beta: float = 1.0
    log_target: bool = False
    broadcast: bool = False

    def kwargs(self) -> dict:
        return functional_kwargs(self.loss, self.reduction, self.beta, self.log_target)

    @property
    def target_shape(self):
        return BROADCAST_TARGET_SHAPE if self.broadcast else SHAPE

    def __str__(self):
        extra = {"smooth_l1_loss": f"-beta{self.beta}", "kl_div": f"-log{int(self.log_target)}",
                 "huber_loss": f"-delta{self.beta}"}.get(self.loss, "")
        return f"{self.loss}{extra}-{self.reduction}{'-bcast' if self.broadcast else ''}"


VARIANTS = [
    ("smooth_l1_loss", {"beta": 0.0}),
    ("smooth_l1_loss", {"beta": 0.5}),
    ("smooth_l1_loss", {"beta": 1.0}),
    ("l1_loss", {}),
    ("kl_div", {"log_target": False}),
    ("kl_div", {"log_target": True}),
    # Huber's delta is kept in Case.beta (functional_kwargs passes it as delta=).
    ("huber_loss", {"beta": 0.5}),
    ("huber_loss", {"beta": 3.0}),
    ("huber_loss", {"beta": math.inf}),
    ("mse_loss", {}),
]
CASES = [
    Case(loss, reduction, broadcast=broadcast, **kw)
    for loss, kw in VARIANTS
    for reduction in REDUCTIONS
    for broadcast in (False, True)
]


def _inputs(case: Case, seed: int = 0):
    """(self, target) in float64, away from the kinks; KL: log-probabilities and a positive target."""
    gen = torch.Generator().manual_seed(1000 * seed + CASES.index(case))
    opts = {"dtype": torch.float64, "generator": gen}
    if case.loss == "kl_div":
        x = torch.randn(SHAPE, **opts)
        t = torch.randn(case.target_shape, **opts) if case.log_target else torch.rand(case.target_shape, **opts) + 0.1
        return x, t
    t = torch.randn(case.target_shape, **opts)
    # |d| in (0.1, 0.4), (0.6, 0.9) or (1.1, 2.0): clear of 0 and of beta = 0.5 and 1.
    bands = torch.tensor([[0.1, 0.4], [0.6, 0.9], [1.1, 2.0]], dtype=torch.float64)
    band = bands[torch.randint(0, 3, SHAPE, generator=gen)]
    magnitude = band[..., 0] + torch.rand(SHAPE, **opts) * (band[..., 1] - band[..., 0])
    sign = torch.randint(0, 2, SHAPE, generator=gen).to(torch.float64) * 2 - 1
    return t + sign * magnitude, t


def _grad_output(case: Case, seed: int = 0):
    gen = torch.Generator().manual_seed(7 + 1000 * seed + CASES.index(case))
    shape = SHAPE if case.reduction == "none" else ()
    return torch.randn(shape, dtype=torch.float64, generator=gen)


def _loss_fns(case: Case):
    ours = getattr(npu_loss_ops, case.loss)
    ref = getattr(F, case.loss)
    kw = case.kwargs()
    return (lambda x, t: ours(x, t, **kw)), (lambda x, t: ref(x, t, **kw))


def _backward_fns(case: Case):
    op = getattr(torch.ops.npu_loss, BACKWARD_OP[case.loss])
    r = REDUCTIONS[case.reduction]
    _, ref_loss = _loss_fns(case)
    if case.loss == "huber_loss":
        # ATen's huber_loss_backward has no forward AD (jvp, jacfwd, hessian of F's vjp raise
        # NotImplementedError): the same function written with ops that have it, delta * smooth_l1(beta=delta)
        # (0.5 * d**2 at delta == inf).
        def ref_loss(x, t):
            if math.isinf(case.beta):
                v = 0.5 * (x - t) ** 2
                return {"none": v, "mean": v.mean(), "sum": v.sum()}[case.reduction]
            return case.beta * F.smooth_l1_loss(x, t, reduction=case.reduction, beta=case.beta)
    if case.loss == "mse_loss":
        # torch 2.13's jvp of F.mse_loss's vjp with one input's tangent fails inside ATen's forward AD
        # ("ZeroTensors are immutable"): the same function written with elementary ops.
        def ref_loss(x, t):
            v = (x - t) ** 2
            return {"none": v, "mean": v.mean(), "sum": v.sum()}[case.reduction]
    if case.loss in ("smooth_l1_loss", "huber_loss"):
        ours = lambda g, x, t: op(g, x, t, r, case.beta)  # noqa: E731
    elif case.loss in ("l1_loss", "mse_loss"):
        ours = lambda g, x, t: op(g, x, t, r)  # noqa: E731
    else:
        ours = lambda g, x, t: op(g, x, t, r, case.log_target)  # noqa: E731

    def ref(g, x, t):
        if case.loss == "kl_div":
            return torch.func.vjp(lambda t_: ref_loss(x, t_), t)[1](g)[0]
        return torch.func.vjp(lambda x_: ref_loss(x_, t), x)[1](g)[0]

    return ours, ref


def _problem(kind: str, case: Case, seed: int = 0):
    """(ours, reference, primals): a loss of (self, target) or a backward op of (grad_output, self, target)."""
    x, t = _inputs(case, seed)
    if kind == "loss":
        ours, ref = _loss_fns(case)
        return ours, ref, (x, t)
    ours, ref = _backward_fns(case)
    return ours, ref, (_grad_output(case, seed), x, t)


def _weights(shape):
    n = max(1, torch.Size(shape).numel())
    return torch.linspace(0.5, 1.5, n, dtype=torch.float64).reshape(shape)


def _scalar(fn):
    """fn's output as one number (a fixed weighting of a non-scalar output), for grad and hessian."""

    def scalar_fn(*args):
        out = fn(*args)
        return (out * _weights(out.shape)).sum() if out.dim() else out

    return scalar_fn


def _assert_close(actual, expected):
    flat_a, spec_a = pytree.tree_flatten(actual)
    flat_e, spec_e = pytree.tree_flatten(expected)
    assert spec_a == spec_e, (spec_a, spec_e)
    for a, e in zip(flat_a, flat_e):
        assert a is not None and e is not None
        torch.testing.assert_close(a, e, rtol=1e-9, atol=1e-12)


KINDS = ("loss", "backward")
PROBLEMS = [pytest.param(kind, case, id=f"{kind}-{case}") for kind in KINDS for case in CASES]


def _argnums(primals):
    return tuple(range(len(primals)))


# ---------------------------------------------------------------------------------------------------
# torch.func


@pytest.mark.parametrize("kind,case", PROBLEMS)
def test_grad(kind, case):
    ours, ref, primals = _problem(kind, case)
    argnums = _argnums(primals)
    _assert_close(
        torch.func.grad(_scalar(ours), argnums=argnums)(*primals),
        torch.func.grad(_scalar(ref), argnums=argnums)(*primals),
    )


@pytest.mark.parametrize("kind,case", PROBLEMS)
def test_vjp(kind, case):
    ours, ref, primals = _problem(kind, case)
    out, vjp_fn = torch.func.vjp(ours, *primals)
    expected_out, expected_vjp_fn = torch.func.vjp(ref, *primals)
    cotangent = torch.randn_like(expected_out)
    _assert_close(out, expected_out)
    _assert_close(vjp_fn(cotangent), expected_vjp_fn(cotangent))


@pytest.mark.parametrize("kind,case", PROBLEMS)
def test_jacrev(kind, case):
    ours, ref, primals = _problem(kind, case)
    argnums = _argnums(primals)
    _assert_close(
        torch.func.jacrev(ours, argnums=argnums)(*primals), torch.func.jacrev(ref, argnums=argnums)(*primals)
    )


@pytest.mark.parametrize("kind,case", PROBLEMS)
def test_jacfwd(kind, case):
    ours, ref, primals = _problem(kind, case)
    argnums = _argnums(primals)
    _assert_close(
        torch.func.jacfwd(ours, argnums=argnums)(*primals), torch.func.jacfwd(ref, argnums=argnums)(*primals)
    )


@pytest.mark.parametrize("kind,case", PROBLEMS)
def test_jvp(kind, case):
    ours, ref, primals = _problem(kind, case)
    tangents = tuple(torch.randn_like(p) for p in primals)
    _assert_close(torch.func.jvp(ours, primals, tangents), torch.func.jvp(ref, primals, tangents))


@pytest.mark.parametrize("kind,case", PROBLEMS)
def test_jvp_one_tangent(kind, case):
    """Tangents on one input only (the other inputs' tangents are zeros)."""
    ours, ref, primals = _problem(kind, case)
    for i in range(len(primals)):

        def only_i(fn):
            return lambda p: fn(*primals[:i], p, *primals[i + 1 :])

        tangent = torch.randn_like(primals[i])
        _assert_close(
            torch.func.jvp(only_i(ours), (primals[i],), (tangent,)),
            torch.func.jvp(only_i(ref), (primals[i],), (tangent,)),
        )


@pytest.mark.parametrize("kind,case", PROBLEMS)
def test_hessian(kind, case):
    ours, ref, primals = _problem(kind, case)
    argnums = _argnums(primals)
    _assert_close(
        torch.func.hessian(_scalar(ours), argnums=argnums)(*primals),
        torch.func.hessian(_scalar(ref), argnums=argnums)(*primals),
    )


@pytest.mark.parametrize("shared_target", [False, True], ids=["batched_target", "shared_target"])
@pytest.mark.parametrize("kind,case", PROBLEMS)
def test_vmap_grad_per_sample(kind, case, shared_target):
    """Per-sample gradients w.r.t. every input, against a loop of F's gradients; no vmap fallback."""
    ours, ref, _ = _problem(kind, case)
    samples = [_problem(kind, case, seed)[2] for seed in range(BATCH)]
    if shared_target:
        samples = [(*s[:-1], samples[0][-1]) for s in samples]
    batched = tuple(torch.stack(column) for column in zip(*samples))
    in_dims = tuple(0 for _ in batched)
    if shared_target:
        batched = (*batched[:-1], samples[0][-1])
        in_dims = (*in_dims[:-1], None)
    argnums = _argnums(batched)
    per_sample = torch.func.vmap(torch.func.grad(_scalar(ours), argnums=argnums), in_dims=in_dims)(*batched)
    looped = [torch.func.grad(_scalar(ref), argnums=argnums)(*s) for s in samples]
    expected = tuple(torch.stack([g[i] for g in looped]) for i in argnums)
    _assert_close(per_sample, expected)


@pytest.mark.parametrize("kind,case", PROBLEMS)
def test_vmap(kind, case):
    """Plain vmap of the op (every input batched) against a loop, with the batching rule."""
    ours, ref, _ = _problem(kind, case)
    samples = [_problem(kind, case, seed)[2] for seed in range(BATCH)]
    batched = tuple(torch.stack(column) for column in zip(*samples))
    _assert_close(torch.func.vmap(ours)(*batched), torch.stack([ref(*s) for s in samples]))


# ---------------------------------------------------------------------------------------------------
# torch.autograd: forward-mode dual tensors, gradcheck, gradgradcheck


@pytest.mark.parametrize("kind,case", PROBLEMS)
def test_forward_ad_dual_tensors(kind, case):
    ours, ref, primals = _problem(kind, case)
    tangents = [torch.randn_like(p) for p in primals]

    def run(fn):
        with fwAD.dual_level():
            out = fn(*(fwAD.make_dual(p, t) for p, t in zip(primals, tangents)))
            primal, tangent = fwAD.unpack_dual(out)
            assert tangent is not None
            return primal, tangent

    _assert_close(run(ours), run(ref))


def _leaves(primals):
    return tuple(p.detach().clone().requires_grad_(True) for p in primals)


@pytest.mark.parametrize("kind,case", PROBLEMS)
def test_gradcheck(kind, case):
    ours, _, primals = _problem(kind, case)
    assert gradcheck(
        ours,
        _leaves(primals),
        check_forward_ad=True,
        check_backward_ad=True,
        check_batched_grad=True,
        check_batched_forward_grad=True,
    )


@pytest.mark.parametrize("kind,case", PROBLEMS)
def test_gradgradcheck(kind, case):
    ours, _, primals = _problem(kind, case)
    assert gradgradcheck(ours, _leaves(primals), check_batched_grad=True, check_fwd_over_rev=True)


# ---------------------------------------------------------------------------------------------------
# compiled autograd


COMPILED_CASES = [
    pytest.param(kind, case, id=f"{kind}-{case}")
    for kind in KINDS
    for case in CASES
    if (case.reduction == "mean") == (not case.broadcast)
    and (case.loss != "smooth_l1_loss" or case.beta != 0.5 or kind == "loss")
    and (case.loss != "huber_loss" or case.beta != math.inf or kind == "loss")
]


@pytest.mark.parametrize("kind,case", COMPILED_CASES)
def test_compiled_autograd(kind, case):
    """loss.backward() under compiled autograd captures the package's nodes in its graph and gives F's grads."""
    ours, ref, primals = _problem(kind, case)
    captured = []

    def compiler_fn(gm):
        captured.append(gm.code)
        return torch.compile(gm, backend="eager", fullgraph=True)

    torch._dynamo.reset()
    leaves = _leaves(primals)
    out = _scalar(ours)(*leaves)
    try:
        with torch._dynamo.compiled_autograd._enable(compiler_fn):
            out.backward()
    finally:
        torch._dynamo.reset()
    ref_leaves = _leaves(primals)
    expected = torch.autograd.grad(_scalar(ref)(*ref_leaves), ref_leaves)
    _assert_close(tuple(leaf.grad for leaf in leaves), expected)
    assert len(captured) == 1 and "NpuLoss" in captured[0], captured


# ---------------------------------------------------------------------------------------------------
# zero derivatives are zero tensors


ZERO_SECOND_DERIVATIVE = [("l1_loss", {}), ("smooth_l1_loss", {"beta": 0.0})]


@pytest.mark.parametrize("broadcast", [False, True], ids=["same_shape", "broadcast"])
@pytest.mark.parametrize("reduction", list(REDUCTIONS))
@pytest.mark.parametrize("name,kwargs", ZERO_SECOND_DERIVATIVE, ids=["l1_loss", "smooth_l1_loss-beta0"])
def test_double_backward_of_sign_is_zeros(name, kwargs, reduction, broadcast):
    """Differentiating L1's gradient (and beta == 0 smooth L1's) again gives zeros of each input's shape, as
    PyTorch does, not an 'unused tensor' error or None."""
    case = Case(name, reduction, broadcast=broadcast, **kwargs)
    for fn in _loss_fns(case):
        x, t = _leaves(_inputs(case))
        grads = torch.autograd.grad(_scalar(fn)(x, t), (x, t), create_graph=True)
        for g in grads:
            second = torch.autograd.grad(g.sum(), (x, t), allow_unused=True, retain_graph=True)
            for s, like in zip(second, (x, t)):
                assert s is not None
                assert s.shape == like.shape
                assert torch.equal(s, torch.zeros_like(like))


@pytest.mark.parametrize("reduction", list(REDUCTIONS))
@pytest.mark.parametrize("name,kwargs", ZERO_SECOND_DERIVATIVE, ids=["l1_loss", "smooth_l1_loss-beta0"])
def test_backward_op_zero_derivatives_are_zeros(name, kwargs, reduction):
    """The backward ops' derivatives w.r.t. self and target are zero tensors (w.r.t. grad_output the op
    itself), equal to the derivatives of F's vjp."""
    case = Case(name, reduction, **kwargs)
    ours, ref = _backward_fns(case)
    primals = (_grad_output(case), *_inputs(case))
    results = []
    for fn in (ours, ref):
        leaves = _leaves(primals)
        results.append(torch.autograd.grad(_scalar(fn)(*leaves), leaves, allow_unused=True))
    _assert_close(results[0], results[1])
    for d, like in zip(results[0][1:], primals[1:]):
        assert torch.equal(d, torch.zeros_like(like))


def test_example_from_the_issue():
    x = torch.randn(5, requires_grad=True)
    y = torch.randn(5)
    (g,) = torch.autograd.grad(npu_loss_ops.l1_loss(x, y), x, create_graph=True)
    assert torch.equal(torch.autograd.grad(g.sum(), x)[0], torch.zeros(5))


# ---------------------------------------------------------------------------------------------------
# per-sample gradients of a model's parameters (the torch.func tutorial's pattern)


@pytest.mark.parametrize("name,kwargs", VARIANTS, ids=[str(Case(n, "mean", **k)) for n, k in VARIANTS])
def test_per_sample_gradients_functional_call(name, kwargs):
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 4).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(6, 5, dtype=torch.float64)
    y = torch.randn(6, 4, dtype=torch.float64)
    if name == "kl_div" and not kwargs["log_target"]:
        y = y.softmax(-1)

    def loss_of(loss_fn):
        def compute(params, xi, yi):
            out = torch.func.functional_call(model, params, (xi.unsqueeze(0),))
            if name == "kl_div":
                out = out.log_softmax(-1)
            return loss_fn(out, yi.unsqueeze(0), **Case(name, "mean", **kwargs).kwargs())

        return compute

    ours = torch.func.vmap(torch.func.grad(loss_of(getattr(npu_loss_ops, name))), in_dims=(None, 0, 0))(params, x, y)
    ref = loss_of(getattr(F, name))
    for i in range(x.shape[0]):
        expected = torch.func.grad(ref)(params, x[i], y[i])
        _assert_close({k: v[i] for k, v in ours.items()}, expected)


@pytest.mark.filterwarnings("ignore:There is a performance drop")
def test_vmap_fallback_warning_is_detected(capfd, recwarn):
    """The fallback checks above can fail: an op without a batching rule triggers them."""
    lib = torch.library.Library("npu_loss_test_vmap", "FRAGMENT")
    lib.define("plain(Tensor x) -> Tensor")
    lib.impl("plain", lambda x: x * 2, "CompositeExplicitAutograd")
    torch.func.vmap(torch.ops.npu_loss_test_vmap.plain)(torch.randn(3, 2))
    seen = capfd.readouterr().err + "".join(str(w.message) for w in recwarn)
    assert FALLBACK_WARNING in seen


def test_every_op_has_a_batching_rule():
    for op in (*LOSSES, *BACKWARD_OP.values()):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"npu_loss::{op}", "FuncTorchBatched"), op
