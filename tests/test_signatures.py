"""The public API's signatures are those of the installed torch (2.13's, and the same on 2.9 and 2.14) (inspect.signature: names, order, kinds, defaults and
annotations): every function against torch.nn.functional's, every module's __init__ against torch.nn's, so
code written for torch.nn runs unchanged, `weight=` included.

The one liberty: where torch leaves a parameter unannotated (the legacy size_average/reduce of the loss
modules' __init__), the package annotates it (`bool | None`), because its py.typed API is checked with
mypy --strict (test_typing.py). Every annotation torch does have must be the package's too."""
import inspect
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
