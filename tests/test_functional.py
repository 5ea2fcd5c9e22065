"""The Python API against torch.nn.functional / torch.nn: signatures, defaults, module attributes, legacy
size_average/reduce, reduction strings ('batchmean' too), warnings, integer casting, results."""
import inspect
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import npu_loss_ops
from helpers import RecordOps
from reference import assert_close
from samples import BACKWARD_OP

FUNCS = {
    "smooth_l1_loss": ["input", "target", "size_average", "reduce", "reduction", "beta"],
    "l1_loss": ["input", "target", "size_average", "reduce", "reduction"],
    "kl_div": ["input", "target", "size_average", "reduce", "reduction", "log_target"],
    "huber_loss": ["input", "target", "reduction", "delta", "weight"],
    "mse_loss": ["input", "target", "size_average", "reduce", "reduction", "weight"],
}
MODULES = {
    "SmoothL1Loss": ["size_average", "reduce", "reduction", "beta"],
    "L1Loss": ["size_average", "reduce", "reduction"],
    "KLDivLoss": ["size_average", "reduce", "reduction", "log_target"],
    "HuberLoss": ["reduction", "delta"],
    "MSELoss": ["size_average", "reduce", "reduction"],
}


def test_exports():
    for name in list(FUNCS) + list(MODULES) + ["npu_kernels_available", "build_info"]:
        assert hasattr(npu_loss_ops, name), name
        assert name in npu_loss_ops.__all__, name
    assert isinstance(npu_loss_ops.npu_kernels_available(), bool)
    info = npu_loss_ops.build_info()
    # The full version built against ('2.13.0+cpu', the label included): the running torch's, or a build of
    # that release with the same C++ ABI (a wheel built against +cpu runs under the CUDA build too).
    assert info["torch_version"] == npu_loss_ops._BUILT_WITH_TORCH
    assert npu_loss_ops._same_torch_abi(info["torch_version"], torch.__version__), info["torch_version"]


def test_build_info_names_the_torch_npu_release_built_against():
    """torch_npu's release as its metadata gives it when _C_npu was built, None in a CPU-only build; and how
    far the NPU kernels were tested on it, only for a tested torch / torch_npu pair."""
    import importlib.metadata
    import importlib.util

    from helpers import build_config as load_build_config

    build_config = load_build_config()
    info = npu_loss_ops.build_info()
    if importlib.util.find_spec("npu_loss_ops._C_npu") is None:
        assert info["torch_npu_version"] is None and info["npu_tested"] is None, info
        return
    assert info["torch_npu_version"] == importlib.metadata.version("torch-npu")
    if info["torch_npu_version"] == build_config.torch_npu_release(torch.__version__):
        assert info["npu_tested"] == build_config.npu_tested(torch.__version__)
    else:
        assert info["npu_tested"] is None, info


@pytest.mark.parametrize("name", FUNCS)
def test_function_signature_matches_F(name):
    ours = inspect.signature(getattr(npu_loss_ops, name)).parameters
    theirs = inspect.signature(getattr(F, name)).parameters
    assert list(ours)[: len(FUNCS[name])] == FUNCS[name]
    for p in FUNCS[name]:
        assert ours[p].default == theirs[p].default, p
        assert ours[p].kind == theirs[p].kind, p


@pytest.mark.parametrize("name", MODULES)
def test_module_signature_and_attributes_match_nn(name):
    ours_cls, theirs_cls = getattr(npu_loss_ops, name), getattr(torch.nn, name)
    ours = inspect.signature(ours_cls).parameters
    theirs = inspect.signature(theirs_cls).parameters
    assert list(ours) == MODULES[name]
    for p in MODULES[name]:
        assert ours[p].default == theirs[p].default, p
    assert issubclass(ours_cls, torch.nn.Module)
    legacy = [{"size_average": False}, {"reduce": False}, {"size_average": True, "reduce": True}]
    for kwargs in [{}, {"reduction": "sum"}, {"reduction": "none"}] + (legacy if "reduce" in theirs else []):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a, b = ours_cls(**kwargs), theirs_cls(**kwargs)
        assert a.reduction == b.reduction, kwargs
    if name == "SmoothL1Loss":
        assert ours_cls(beta=0.25).beta == 0.25 and ours_cls().beta == 1.0
    if name == "HuberLoss":
        assert ours_cls(delta=0.25).delta == 0.25 and ours_cls().delta == 1.0
    if name == "KLDivLoss":
        assert ours_cls(log_target=True).log_target is True and ours_cls().log_target is False
        assert ours_cls(reduction="batchmean").reduction == "batchmean"


def _pair(name, shape_x=(4, 5), shape_t=(4, 5), dtype=torch.float32):
    x = torch.randn(shape_x, dtype=dtype)
    if name == "kl_div":
        x = x.log_softmax(-1)
        t = torch.rand(shape_t, dtype=dtype) + 0.05
    else:
        t = torch.randn(shape_t, dtype=dtype)
    return x, t


CALLS = [
    ("smooth_l1_loss", {}), ("smooth_l1_loss", {"beta": 0.0}), ("smooth_l1_loss", {"beta": 2.5, "reduction": "sum"}),
    ("smooth_l1_loss", {"size_average": False}), ("smooth_l1_loss", {"reduce": False}),
    ("l1_loss", {}), ("l1_loss", {"reduction": "none"}), ("l1_loss", {"size_average": True, "reduce": True}),
    ("l1_loss", {"size_average": False, "reduce": True}),
    ("kl_div", {}), ("kl_div", {"reduction": "batchmean"}), ("kl_div", {"reduction": "sum", "log_target": True}),
    ("kl_div", {"reduction": "none"}), ("kl_div", {"size_average": False}), ("kl_div", {"reduce": False}),
    ("kl_div", {"reduction": "batchmean", "log_target": True}),
    ("huber_loss", {}), ("huber_loss", {"delta": 0.5}), ("huber_loss", {"delta": 2.5, "reduction": "sum"}),
    ("huber_loss", {"delta": 1e-3, "reduction": "none"}), ("huber_loss", {"delta": 1e4}),
    ("huber_loss", {"delta": math.inf, "reduction": "sum"}),
    ("mse_loss", {}), ("mse_loss", {"reduction": "none"}), ("mse_loss", {"reduction": "sum"}),
    ("mse_loss", {"size_average": False}), ("mse_loss", {"reduce": False}),
]


def _warnings_of(fn):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        result = fn()
    return result, sorted((x.category.__name__, str(x.message)) for x in w)


@pytest.mark.parametrize("shapes", [((4, 5), (4, 5)), ((4, 5), (5,)), ((3,), (2, 3)), ((), ()), ((6,), ())])
@pytest.mark.parametrize("name,kwargs", CALLS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CALLS)])
def test_results_and_warnings_match_F(name, kwargs, shapes):
    x, t = _pair(name, *shapes)
    ours, ours_w = _warnings_of(lambda: getattr(npu_loss_ops, name)(x, t, **kwargs))
    theirs, theirs_w = _warnings_of(lambda: getattr(F, name)(x.double(), t.double(), **kwargs))
    assert ours.dtype == x.dtype and ours.shape == theirs.shape
    assert_close(ours, theirs)
    # the same warnings (deprecation of the legacy arguments, KL's 'mean', the target-size mismatch), in
    # category and message; the message's sizes are printed the same way
    assert [c for c, _ in ours_w] == [c for c, _ in theirs_w], (ours_w, theirs_w)
    assert [m for _, m in ours_w] == [m for _, m in theirs_w]


@pytest.mark.parametrize("name,bad", [(n, b) for n in FUNCS for b in ["avg", "", "batchmean", None, 1]
                                      if not (n == "kl_div" and b == "batchmean")])
def test_invalid_reduction_string_is_value_error(name, bad):
    x, t = _pair(name)
    with pytest.raises(ValueError):
        getattr(npu_loss_ops, name)(x, t, reduction=bad)


def test_kl_batchmean_rules():
    x, t = _pair("kl_div", (6, 4), (6, 4))
    assert_close(npu_loss_ops.kl_div(x, t, reduction="batchmean"),
                 npu_loss_ops.kl_div(x, t, reduction="sum") / 6)
    x0, t0 = torch.tensor(-0.5), torch.tensor(0.3)
    assert_close(npu_loss_ops.kl_div(x0, t0, reduction="batchmean"), F.kl_div(x0, t0, reduction="batchmean"))
    # input.size(0), not the broadcast batch
    x1, t1 = _pair("kl_div", (1, 4), (5, 4))
    assert_close(npu_loss_ops.kl_div(x1, t1, reduction="batchmean"), F.kl_div(x1, t1, reduction="batchmean"))


@pytest.mark.parametrize("name", ["smooth_l1_loss", "l1_loss", "mse_loss"])
@pytest.mark.parametrize("int_arg", ["input", "target"])
def test_integer_operand_is_cast_like_F(name, int_arg):
    x = torch.randint(-5, 5, (4, 5))
    t = torch.randn(4, 5)
    if int_arg == "target":
        x, t = t, x
    ours = getattr(npu_loss_ops, name)(x, t, reduction="none")
    theirs = getattr(F, name)(x, t, reduction="none")
    assert ours.dtype == theirs.dtype
    torch.testing.assert_close(ours, theirs)
    # and differentiable w.r.t. the floating operand
    f = (t if int_arg == "input" else x).clone().requires_grad_(True)
    args = (x, f) if int_arg == "input" else (f, t)
    getattr(npu_loss_ops, name)(*args).backward()
    assert f.grad is not None and torch.isfinite(f.grad).all()


def test_huber_integer_operand():
    """An integer target with a floating input: F's result. An integer input with a floating target: F
    raises (its result takes input's dtype: "result type Float can't be cast to ... Long"); the package
    casts it as it does for smooth L1, the loss of input.float()."""
    x = torch.randint(-5, 5, (4, 5))
    t = torch.randn(4, 5)
    ours = npu_loss_ops.huber_loss(t, x, reduction="none", delta=0.5)
    theirs = F.huber_loss(t, x, reduction="none", delta=0.5)
    assert ours.dtype == theirs.dtype
    torch.testing.assert_close(ours, theirs)
    with pytest.raises(RuntimeError, match="can't be cast"):
        F.huber_loss(x, t, reduction="none")
    ours = npu_loss_ops.huber_loss(x, t, reduction="none", delta=0.5)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, F.huber_loss(x.float(), t, reduction="none", delta=0.5))


def test_both_integer_operands():
    """Where F accepts two integer tensors (l1 'none'/'sum') the API computes in the default dtype; where F
    rejects them (smooth L1, l1 'mean'), the API raises TypeError."""
    x = torch.randint(-5, 5, (4, 5))
    t = torch.randint(-5, 5, (4, 5))
    for reduction in ("none", "sum"):
        out = npu_loss_ops.l1_loss(x, t, reduction=reduction)
        assert out.dtype == torch.get_default_dtype()
        assert torch.equal(out, F.l1_loss(x, t, reduction=reduction).to(out.dtype))
    with pytest.raises(TypeError):
        npu_loss_ops.l1_loss(x, t, reduction="mean")
    with pytest.raises(TypeError):
        npu_loss_ops.smooth_l1_loss(x, t, reduction="sum")
    with pytest.raises(TypeError, match="mse_loss"):
        npu_loss_ops.mse_loss(x, t, reduction="sum")


def test_bool_operand_like_F():
    x = torch.randn(4, 5)
    b = torch.rand(4, 5) > 0.5
    # F.smooth_l1_loss accepts a bool target with a floating input
    torch.testing.assert_close(npu_loss_ops.smooth_l1_loss(x, b), F.smooth_l1_loss(x, b))
    # and so does F.mse_loss
    torch.testing.assert_close(npu_loss_ops.mse_loss(x, b), F.mse_loss(x, b))
    with pytest.raises(TypeError):
        npu_loss_ops.l1_loss(x, b)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_kl_integer_is_rejected(dtype):
    x, t = _pair("kl_div")
    with pytest.raises(TypeError, match="kl_div"):
        npu_loss_ops.kl_div(x.to(dtype), t)
    with pytest.raises(TypeError, match="kl_div"):
        npu_loss_ops.kl_div(x, t.to(dtype))


@pytest.mark.parametrize("name", FUNCS)
def test_complex_is_rejected(name):
    x, t = _pair(name)
    with pytest.raises(TypeError):
        getattr(npu_loss_ops, name)(x.to(torch.complex64), t)


@pytest.mark.parametrize("beta", [-1.0, math.nan])
def test_bad_beta_is_value_error_from_the_api(beta):
    x, t = _pair("smooth_l1_loss")
    with pytest.raises(ValueError, match="beta"):
        npu_loss_ops.smooth_l1_loss(x, t, beta=beta)
    with pytest.raises(ValueError, match="beta"):
        npu_loss_ops.SmoothL1Loss(beta=beta)(x, t)


@pytest.mark.parametrize("delta", [0.0, -1.0, -math.inf, math.nan])
def test_bad_delta_is_value_error_from_the_api(delta):
    """delta must be > 0 and not NaN: ValueError naming delta (F raises RuntimeError, docs/semantics.md)."""
    x, t = _pair("huber_loss")
    match = f"huber_loss: delta must be > 0, got {delta:g}" if delta == 0 else "delta must be > 0"
    with pytest.raises(ValueError, match=match):
        npu_loss_ops.huber_loss(x, t, delta=delta)
    with pytest.raises(ValueError, match=match):
        npu_loss_ops.HuberLoss(delta=delta)(x, t)
    with pytest.raises(ValueError, match="delta must be > 0"):
        npu_loss_ops.huber_loss(x, t, delta=delta, weight=torch.ones_like(x))
    with pytest.raises(RuntimeError):  # the documented difference: F's error is a RuntimeError
        F.huber_loss(x, t, delta=delta)


@pytest.mark.parametrize("delta", [1 + 1j, "0.5", None])
def test_huber_module_rejects_a_delta_that_is_not_a_real_number(delta):
    """As torch 2.13's nn.HuberLoss: a TypeError at construction, with torch's message."""
    with pytest.raises(TypeError, match="delta must be a float or int") as ours:
        npu_loss_ops.HuberLoss(delta=delta)
    if tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13):
        with pytest.raises(TypeError) as theirs:
            torch.nn.HuberLoss(delta=delta)
        assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("name,cls,kwargs", [
    ("smooth_l1_loss", "SmoothL1Loss", {"beta": 0.5, "reduction": "sum"}),
    ("l1_loss", "L1Loss", {"reduction": "none"}),
    ("kl_div", "KLDivLoss", {"reduction": "batchmean", "log_target": True}),
    ("huber_loss", "HuberLoss", {"delta": 0.5, "reduction": "sum"}),
    ("mse_loss", "MSELoss", {"reduction": "none"}),
])
def test_module_equals_functional(name, cls, kwargs):
    x, t = _pair(name)
    if kwargs.get("log_target"):
        t = t.log()
    torch.testing.assert_close(getattr(npu_loss_ops, cls)(**kwargs)(x, t),
                               getattr(npu_loss_ops, name)(x, t, **kwargs), rtol=0, atol=0)


def test_api_calls_the_npu_loss_ops():
    """The API really runs torch.ops.npu_loss (forward and gradient), not ATen's losses."""
    for name, backward in BACKWARD_OP.items():
        x, t = _pair(name)
        x.requires_grad_(True)
        t.requires_grad_(True)
        with RecordOps() as rec:
            getattr(npu_loss_ops, name)(x, t).backward()
        assert f"npu_loss.{name}.default" in rec.ops, rec.ops
        assert f"npu_loss.{backward}.default" in rec.ops, rec.ops
        assert not any(op.startswith(f"aten.{name}") for op in rec.ops), rec.ops


def test_torch_function_override_is_honoured():
    class Marked(torch.Tensor):
        seen = []

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            cls.seen.append(getattr(func, "__name__", str(func)))
            return super().__torch_function__(func, types, args, kwargs or {})

    x = torch.randn(3).as_subclass(Marked)
    npu_loss_ops.l1_loss(x, torch.randn(3))
    assert "l1_loss" in Marked.seen


# ---------------------------------------------------------------------------------------------------
# torch.func (tests/test_transforms.py covers every transform; this is the plain-vmap smoke test)


@pytest.mark.parametrize("name", FUNCS)
def test_torch_func_vmap(name):
    x, t = _pair(name, (3, 4, 5), (3, 4, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batched = torch.func.vmap(lambda a, b: getattr(npu_loss_ops, name)(a, b, reduction="sum"))(x, t)
    looped = torch.stack([getattr(npu_loss_ops, name)(a, b, reduction="sum") for a, b in zip(x, t)])
    torch.testing.assert_close(batched, looped)
