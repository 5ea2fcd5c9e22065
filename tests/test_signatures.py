"""The public API's signatures are those of the installed torch (2.13's, and the same on 2.9 and 2.14) (inspect.signature: names, order, kinds, defaults and
annotations): every function against torch.nn.functional's, every module's __init__ against torch.nn's, so
code written for torch.nn runs unchanged, `weight=` included.

The one liberty: where torch leaves a parameter unannotated (the legacy size_average/reduce of the loss
modules' __init__), the package annotates it (`bool | None`), because its py.typed API is checked with
mypy --strict (test_typing.py). Every annotation torch does have must be the package's too."""
import inspect
import warnings
import re

import pytest
import torch
import torch.nn.functional as F

import npu_loss_ops
from helpers import build_config

FUNCTIONS = ["smooth_l1_loss", "l1_loss", "kl_div", "huber_loss", "mse_loss"]
MODULES = ["SmoothL1Loss", "L1Loss", "KLDivLoss", "HuberLoss", "MSELoss"]


def test_torch_is_a_tested_release():
    """The signatures compared below are those of the torch installed: one of the tested releases."""
    assert build_config().release_of(torch.__version__) in build_config().TESTED_RELEASES, torch.__version__


def _text(a):
    """An annotation as a string (the package may write them with `from __future__ import annotations`),
    with `Optional[X]` spelled `X | None`, as torch writes it from 2.13 on (2.9 writes `Optional[...]`)."""
    if a is inspect.Parameter.empty:
        return a
    text = a if isinstance(a, str) else inspect.formatannotation(a)
    return re.sub(r"^Optional\[(.*)\]$", r"\1 | None", text)


def _normalised(sig: inspect.Signature, like: inspect.Signature | None = None) -> inspect.Signature:
    """Annotations as strings; with `like`, a parameter `like` leaves unannotated is unannotated here too."""
    def annotation(p):
        if like is not None and p.name in like.parameters and like.parameters[p.name].annotation is p.empty:
            return p.empty
        return _text(p.annotation)

    return sig.replace(
        parameters=[p.replace(annotation=annotation(p)) for p in sig.parameters.values()],
        return_annotation=_text(sig.return_annotation),
    )


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_signature_is_torchs(name):
    ours = inspect.signature(getattr(npu_loss_ops, name))
    theirs = inspect.signature(getattr(F, name))
    assert _normalised(ours) == _normalised(theirs), f"\nours:   {ours}\ntorch's: {theirs}"


@pytest.mark.parametrize("name", MODULES)
def test_module_init_signature_is_torchs(name):
    ours = inspect.signature(getattr(npu_loss_ops, name).__init__)
    theirs = inspect.signature(getattr(torch.nn, name).__init__)
    assert _normalised(ours, theirs) == _normalised(theirs), f"\nours:   {ours}\ntorch's: {theirs}"
    # the liberty taken is only on the legacy arguments, and only as `bool | None`
    for p in ours.parameters.values():
        if theirs.parameters[p.name].annotation is p.empty and p.name != "self":
            assert p.name in ("size_average", "reduce") and _text(p.annotation) == "bool | None", p


# Constructor arguments torch.nn's loss modules accept, and those they reject at construction (torch 2.13:
# HuberLoss's delta must be a float or int; any module: an unknown keyword or one positional too many). The
# values torch checks only when the loss is called (reduction, beta, log_target) must construct here too.
_CONSTRUCTIONS = [
    ((), {}),
    ((), {"reduction": "none"}),
    ((), {"reduction": "bogus"}),
    ((), {"reduction": 3}),
    ((), {"bogus": 1}),
    ((None, None, "sum", 1.0, 2.0, 3.0), {}),
    ((False, True), {}),
    ((), {"size_average": False}),
    ((), {"reduce": False}),
    ((), {"beta": -1.0}),
    ((), {"beta": "x"}),
    ((), {"log_target": "yes"}),
    ((), {"delta": 0.5}),
    ((), {"delta": 2}),
    ((), {"delta": True}),
    ((), {"delta": -1.0}),
    ((), {"delta": 1 + 1j}),
    ((), {"delta": "0.5"}),
    ((), {"delta": None}),
    ((), {"delta": torch.tensor(1.0)}),
    (("sum", 0.5), {}),
]


def _construct(cls, args, kwargs):
    """What constructing cls(*args, **kwargs) gives: the exception's class, or the module's attributes."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the legacy arguments' deprecation warning
            module = cls(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 -- the class is what is compared
        return type(e)
    return {k: v for k, v in vars(module).items() if not k.startswith("_") and k != "training"}


@pytest.mark.parametrize("name", MODULES)
@pytest.mark.parametrize("args,kwargs", _CONSTRUCTIONS, ids=lambda v: repr(v))
def test_module_construction_checks_are_torchs(name, args, kwargs):
    """Each module's constructor accepts what torch.nn's accepts (with the same attributes) and rejects what
    it rejects, with the same exception class."""
    if name == "HuberLoss" and "delta" in kwargs and not isinstance(kwargs["delta"], (float, int)) \
            and tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13):
        pytest.skip("torch before 2.13 checks delta only when called; the package checks it as 2.13 does")
    ours = _construct(getattr(npu_loss_ops, name), args, kwargs)
    theirs = _construct(getattr(torch.nn, name), args, kwargs)
    assert ours == theirs
