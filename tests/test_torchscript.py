"""TorchScript: every module and functional of the Python API compiles with torch.jit.script and gives
torch.nn.functional's / torch.nn's values and gradients; scripted modules save and load; a model holding one
of the losses scripts as a whole; bad arguments still raise."""
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import npu_loss_ops
import npu_loss_ops.functional as nf
from npu_loss_ops._reduction import REDUCTION_ENUMS, get_enum
from helpers import package_parent
from samples import LOSSES

# torch 2.13 marks TorchScript deprecated (a DeprecationWarning; 2.14 a FutureWarning); it is still what these
# tests exercise.
pytestmark = [
    pytest.mark.filterwarnings(f"ignore:`torch.jit.{name}` is deprecated:{category}")
    for name in ("script", "save", "load")
    for category in ("DeprecationWarning", "FutureWarning")
]

SHAPE = (4, 5)
DTYPES = (torch.float32, torch.float64, torch.bfloat16)
FUNCTIONAL_CASES = (
    [("smooth_l1_loss", dict(reduction=r, beta=b)) for r in ("none", "mean", "sum") for b in (0.0, 0.5, 1.0, 2.0)]
    + [("l1_loss", dict(reduction=r)) for r in ("none", "mean", "sum")]
    + [
        ("kl_div", dict(reduction=r, log_target=lt))
        for r in ("none", "batchmean", "sum", "mean")
        for lt in (False, True)
    ]
    + [("huber_loss", dict(reduction=r, delta=d)) for r in ("none", "mean", "sum") for d in (0.25, 1.0, 3.0, 1e4)]
    + [("mse_loss", dict(reduction=r)) for r in ("none", "mean", "sum")]
)
MODULE_CASES = [
    ("SmoothL1Loss", {}),
    ("SmoothL1Loss", dict(beta=0.0)),
    ("SmoothL1Loss", dict(beta=0.2, reduction="sum")),
    ("SmoothL1Loss", dict(beta=2.0, reduction="none")),
    ("L1Loss", {}),
    ("L1Loss", dict(reduction="sum")),
    ("L1Loss", dict(reduction="none")),
    ("KLDivLoss", {}),
    ("KLDivLoss", dict(reduction="batchmean")),
    ("KLDivLoss", dict(reduction="batchmean", log_target=True)),
    ("KLDivLoss", dict(reduction="sum", log_target=True)),
    ("KLDivLoss", dict(reduction="none")),
    ("HuberLoss", {}),
    ("HuberLoss", dict(delta=0.5, reduction="sum")),
    ("HuberLoss", dict(delta=2.0, reduction="none")),
    ("MSELoss", {}),
    ("MSELoss", dict(reduction="sum")),
    ("MSELoss", dict(reduction="none")),
]
# The legacy constructor arguments resolve to a reduction before scripting, as in torch.nn.
LEGACY_MODULE_CASES = [
    ("SmoothL1Loss", dict(size_average=False, beta=0.5)),
    ("L1Loss", dict(reduce=False)),
    ("KLDivLoss", dict(size_average=False, log_target=True)),
    ("MSELoss", dict(reduce=False)),
]


def _case_id(case):
    name, kwargs = case
    return "-".join([name] + [f"{k}={v}" for k, v in kwargs.items()])


def _scripted(name):
    return torch.jit.script(getattr(nf, name))


def _inputs(loss, dtype, shape=SHAPE, seed=0):
    """Leaf input and target away from the kinks: |d| is never 0 or beta for the L1-type losses, and a
    probability target is positive (see test_kl_zero_target_gradient for target == 0)."""
    g = torch.Generator().manual_seed(seed)
    if loss in ("kl_div", "KLDivLoss"):
        x = torch.rand(shape, generator=g, dtype=torch.float64).add(0.05).log()
        t = torch.rand(shape, generator=g, dtype=torch.float64).add(0.05)
    else:
        x = torch.randn(shape, generator=g, dtype=torch.float64) * 2
        t = torch.randn(shape, generator=g, dtype=torch.float64)
    return x.to(dtype).requires_grad_(), t.to(dtype).requires_grad_()


def _log_target(t, kwargs):
    """KL with log_target=True takes the target in log space."""
    return t.detach().log().requires_grad_() if kwargs.get("log_target") else t


def _grad_output(shape, dtype):
    return torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)


def _value_and_grads(fn, x, t):
    out = fn(x, t)
    gx, gt = torch.autograd.grad(out, (x, t), _grad_output(out.shape, out.dtype))
    return out.detach(), gx, gt


def _expected(fn, x, t):
    """PyTorch's value and gradients (fn is torch.nn.functional's or torch.nn's). The package computes half
    types in float32 and rounds once, where PyTorch rounds some steps to the half type, so for those the
    expectation is the float64 result on the same values, rounded to the half type once."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        return _value_and_grads(fn, x, t)
    x64, t64 = (v.detach().double().requires_grad_() for v in (x, t))
    out = fn(x64, t64)
    gx, gt = torch.autograd.grad(out, (x64, t64), _grad_output(out.shape, x.dtype).double())
    return out.detach().to(x.dtype), gx.to(x.dtype), gt.to(t.dtype)


def _assert_same(actual, expected):
    for a, e, what in zip(actual, expected, ("value", "grad input", "grad target")):
        assert a.dtype == e.dtype and a.shape == e.shape, what
        torch.testing.assert_close(a, e, msg=lambda m: f"{what}: {m}")


# ---------------------------------------------------------------------------------------------------
# Functionals


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", FUNCTIONAL_CASES, ids=_case_id)
def test_scripted_functional_matches_F(case, dtype):
    name, kwargs = case
    scripted = _scripted(name)
    assert "npu_loss::" + name in str(scripted.graph)  # the package's op, not ATen's
    x, t = _inputs(name, dtype)
    t = _log_target(t, kwargs)
    # Three calls: TorchScript's profiling executor runs its optimised graph from the third on.
    for _ in range(3):
        ours = _value_and_grads(lambda a, b: scripted(a, b, **kwargs), x, t)
    _assert_same(ours, _expected(lambda a, b: getattr(F, name)(a, b, **kwargs), x, t))
    _assert_same(ours, _value_and_grads(lambda a, b: getattr(nf, name)(a, b, **kwargs), x, t))


@pytest.mark.parametrize("name", LOSSES)
def test_scripted_functional_broadcasts_and_promotes_like_F(name):
    scripted = _scripted(name)
    x, t = _inputs(name, torch.float16, shape=(3, 4))
    t = t.detach()[0].to(torch.float32).requires_grad_()  # broadcast target of another dtype
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the size warning: test_scripted_functionals_warn_like_F
        ours = _value_and_grads(lambda a, b: scripted(a, b, reduction="sum"), x, t)
        # F.huber_loss's own backward fails on mixed dtypes ("Found dtype Float but expected Half"), and
        # F.mse_loss's does on torch 2.7: there, its value, and the gradients of F on float32 values, each in
        # its input's dtype.
        f = lambda a, b: getattr(F, name)(a, b, reduction="sum")  # noqa: E731
        try:
            expected = _value_and_grads(f, x, t)
            assert name != "huber_loss", "F.huber_loss's backward now takes mixed dtypes: drop this case"
        except RuntimeError as error:
            assert name in ("huber_loss", "mse_loss") and "Found dtype" in str(error)
            value, gx, gt = _value_and_grads(f, x.detach().float().requires_grad_(), t)
            expected = (value.to(ours[0].dtype), gx.to(x.dtype), gt)
    _assert_same(ours, expected)


@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_scripted_l1_of_integer_tensors_follows_the_default_dtype(reduction):
    scripted = _scripted("l1_loss")
    a, b = torch.tensor([[1, -2, 3]]), torch.tensor([[0, 5, 1]])
    expected = nf.l1_loss(a, b, reduction=reduction)
    for _ in range(3):
        assert torch.equal(scripted(a, b, reduction=reduction), expected)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        ours = scripted(a, b, reduction=reduction)
        assert ours.dtype == torch.float64
        assert torch.equal(ours, nf.l1_loss(a, b, reduction=reduction))
    finally:
        torch.set_default_dtype(previous)


def test_kl_zero_target_gradient():
    """The one documented gradient difference: with log_target=False the target gradient is 0 where
    target == 0 (PyTorch's autograd gives NaN there); values and input gradients equal PyTorch's."""
    scripted = _scripted("kl_div")
    x, _ = _inputs("kl_div", torch.float64)
    t = torch.tensor([[0.0, 0.3, 0.2, 0.0, 0.5]]).expand(SHAPE).contiguous().requires_grad_()
    ours = _value_and_grads(lambda a, b: scripted(a, b, reduction="batchmean"), x, t)
    theirs = _value_and_grads(lambda a, b: F.kl_div(a, b, reduction="batchmean"), x, t)
    zero = t.detach() == 0
    _assert_same(ours[:2], theirs[:2])
    assert torch.equal(ours[2][zero], torch.zeros(int(zero.sum()), dtype=torch.float64))
    assert theirs[2][zero].isnan().all()
    torch.testing.assert_close(ours[2][~zero], theirs[2][~zero])


def test_scripted_functionals_warn_like_F():
    x, t = _inputs("l1_loss", torch.float32)
    with pytest.warns(UserWarning, match="Using a target size"):
        _scripted("smooth_l1_loss")(x, t[0])
    with pytest.warns(UserWarning, match="reduction: 'mean' divides the total loss"):
        _scripted("kl_div")(x, t)
    with pytest.warns(UserWarning, match="size_average and reduce args will be deprecated"):
        legacy = _scripted("l1_loss")(x, t, size_average=False)
    torch.testing.assert_close(legacy, F.l1_loss(x, t, reduction="sum"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        legacy_kl = _scripted("kl_div")(x, t.detach().abs(), reduce=False)
        torch.testing.assert_close(legacy_kl, F.kl_div(x, t.detach().abs(), reduce=False))


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("smooth_l1_loss", dict(reduction="bad")),
        ("smooth_l1_loss", dict(reduction="batchmean")),  # only KL knows 'batchmean'
        ("l1_loss", dict(reduction="bad")),
        ("kl_div", dict(reduction="elementwise_mean")),
        ("huber_loss", dict(reduction="bad")),
        ("mse_loss", dict(reduction="bad")),
    ],
)
def test_scripted_functional_rejects_a_bad_reduction(name, kwargs):
    x, t = _inputs(name, torch.float32)
    with pytest.raises(torch.jit.Error, match=f"ValueError: {kwargs['reduction']} is not a valid value for reduction"):
        _scripted(name)(x, t, **kwargs)
    with pytest.raises(ValueError, match=f"{kwargs['reduction']} is not a valid value for reduction"):
        getattr(nf, name)(x, t, **kwargs)


def test_reduction_table_is_get_enum_and_atens():
    assert REDUCTION_ENUMS == {"none": 0, "mean": 1, "sum": 2}
    for name, enum in REDUCTION_ENUMS.items():
        assert get_enum(name) == enum == torch.nn._reduction.get_enum(name)
    scripted = torch.jit.script(get_enum)
    assert [scripted(name) for name in REDUCTION_ENUMS] == list(REDUCTION_ENUMS.values())
    with pytest.raises(torch.jit.Error, match="mean2 is not a valid value for reduction"):
        scripted("mean2")


# ---------------------------------------------------------------------------------------------------
# Modules


def _modules(name, kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy arguments' deprecation warning
        return getattr(npu_loss_ops, name)(**kwargs), getattr(torch.nn, name)(**kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", MODULE_CASES + LEGACY_MODULE_CASES, ids=_case_id)
def test_scripted_module_matches_nn(case, dtype):
    name, kwargs = case
    ours, theirs = _modules(name, kwargs)
    scripted = torch.jit.script(ours)
    assert scripted.reduction == theirs.reduction
    x, t = _inputs(name, dtype)
    t = _log_target(t, {"log_target": getattr(theirs, "log_target", False)})
    for _ in range(3):
        got = _value_and_grads(scripted, x, t)
    _assert_same(got, _value_and_grads(theirs, x, t))
    _assert_same(got, _value_and_grads(ours, x, t))


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("SmoothL1Loss", dict(beta=0.2, reduction="sum")),
        ("L1Loss", dict(reduction="none")),
        ("KLDivLoss", dict(reduction="batchmean", log_target=True)),
        ("HuberLoss", dict(delta=0.5, reduction="mean")),
        ("MSELoss", dict(reduction="sum")),
    ],
)
def test_scripted_module_save_load_round_trip(name, kwargs, tmp_path):
    ours, theirs = _modules(name, kwargs)
    scripted = torch.jit.script(ours)
    path = tmp_path / f"{name}.pt"
    torch.jit.save(scripted, str(path))
    loaded = torch.jit.load(str(path))
    assert "npu_loss::" in str(loaded.inlined_graph)
    if name == "SmoothL1Loss":
        assert loaded.beta == 0.2
    if name == "HuberLoss":
        assert loaded.delta == 0.5
    x, t = _inputs(name, torch.float32)
    t = _log_target(t, kwargs)
    got = _value_and_grads(loaded, x, t)
    want = _value_and_grads(scripted, x, t)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    _assert_same(got, _value_and_grads(theirs, x, t))


def test_scripted_module_rejects_a_bad_reduction():
    x, t = _inputs("SmoothL1Loss", torch.float32)
    scripted = torch.jit.script(npu_loss_ops.SmoothL1Loss(reduction="bad"))
    with pytest.raises(torch.jit.Error, match="bad is not a valid value for reduction"):
        scripted(x, t)


# ---------------------------------------------------------------------------------------------------
# A model holding the losses


class DistillationHead(torch.nn.Module):
    """A student head trained against a teacher's soft labels (KL at a temperature) and a regression target
    (smooth L1), with the loss modules given by the caller."""

    def __init__(self, kl: torch.nn.Module, regression: torch.nn.Module, temperature: float = 2.0) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh())
        self.classes = torch.nn.Linear(16, 5)
        self.box = torch.nn.Linear(16, 4)
        self.kl = kl
        self.regression = regression
        self.temperature = temperature

    def forward(self, x: torch.Tensor, teacher_logits: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        student = F.log_softmax(self.classes(h) / self.temperature, dim=-1)
        teacher = F.log_softmax(teacher_logits / self.temperature, dim=-1)
        soft = self.kl(student, teacher) * (self.temperature**2)
        return soft + self.regression(self.box(h), boxes)


def _distillation_pair():
    torch.manual_seed(0)
    ours = DistillationHead(
        npu_loss_ops.KLDivLoss(reduction="batchmean", log_target=True), npu_loss_ops.SmoothL1Loss(beta=0.5)
    )
    theirs = DistillationHead(
        torch.nn.KLDivLoss(reduction="batchmean", log_target=True), torch.nn.SmoothL1Loss(beta=0.5)
    )
    theirs.load_state_dict(ours.state_dict())
    g = torch.Generator().manual_seed(1)
    batch = (torch.randn(8, 6, generator=g), torch.randn(8, 5, generator=g), torch.randn(8, 4, generator=g))
    return ours, theirs, batch


def _loss_and_param_grads(model, batch):
    model.zero_grad()
    loss = model(*batch)
    loss.backward()
    return [loss.detach()] + [p.grad.clone() for p in model.parameters()]


def test_scripted_model_with_the_losses_matches_torch_nn(tmp_path):
    ours, theirs, batch = _distillation_pair()
    scripted = torch.jit.script(ours)
    graph = str(scripted.inlined_graph)
    assert "npu_loss::kl_div" in graph and "npu_loss::smooth_l1_loss" in graph
    for _ in range(3):
        got = _loss_and_param_grads(scripted, batch)
    want = _loss_and_param_grads(theirs, batch)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)

    path = tmp_path / "distill.pt"
    torch.jit.save(scripted, str(path))
    loaded = torch.jit.load(str(path))
    for a, b in zip(_loss_and_param_grads(loaded, batch), got):
        torch.testing.assert_close(a, b)


def test_saved_model_loads_in_a_fresh_process(tmp_path):
    """A deployment loads the archive in a process of its own: importing npu_loss_ops registers the ops
    the archive calls."""
    ours, _, batch = _distillation_pair()
    scripted = torch.jit.script(ours)
    torch.jit.save(scripted, str(tmp_path / "distill.pt"))
    torch.save({"batch": batch, "loss": scripted(*batch).detach()}, str(tmp_path / "io.pt"))
    code = (
        "import sys, torch, npu_loss_ops\n"
        "m = torch.jit.load(sys.argv[1])\n"
        "io = torch.load(sys.argv[2])\n"
        "assert torch.equal(m(*io['batch']), io['loss']), 'loaded model gives another loss'\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "distill.pt"), str(tmp_path / "io.pt")],
        cwd=package_parent(), capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
