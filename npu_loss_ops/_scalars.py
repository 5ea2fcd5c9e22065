"""The type of every scalar argument of the distillation family, checked as its op's schema declares it.

The schemas are made from the losses' declarations (csrc/losses.h, csrc/core/schema.h), and the ops check each
scalar's range there (core/checks.cpp). What the ops cannot see is the Python type a number came in: the
dispatcher turns ``True`` into 1 and a one-element tensor into its value. So the functions check the types here,
once, before the call, with no ``int()`` or ``float()`` on the way (docs/validation.md, "Scalars"):

- ``float``: a real number (a Python or NumPy int or float), a ``torch.SymFloat`` or ``torch.SymInt`` under
  tracing, or a one-element tensor of a floating or integer dtype;
- ``int``: an integer (Python or NumPy), a ``torch.SymInt``, or a one-element integer tensor;
- ``bool``: a bool; ``str``: a str;
- ``Optional[...]``: ``None`` or the above.

A bool (or a bool tensor) where a number is declared, a str or None where a number is, anything else: a
``TypeError`` naming the op and the argument.
"""
import functools
import numbers

import torch
from torch import Tensor

__all__ = ["check"]


@functools.cache
def _declared(op: str) -> dict[str, tuple[str, bool]]:
    """The scalar arguments of ``torch.ops.npu_loss.<op>``: name -> (type, optional)."""
    declared = {}
    for arg in getattr(torch.ops.npu_loss, op).default._schema.arguments:
        kind = arg.type
        optional = isinstance(kind, torch._C.OptionalType)
        if optional:
            kind = kind.getElementType()
        name = str(kind)
        if name in ("float", "int", "bool", "str"):
            declared[arg.name] = (name, optional)
    return declared


def _is_number(value: object, kind: str) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, Tensor):
        if value.numel() != 1 or value.dtype == torch.bool or value.is_complex():
            return False
        return kind == "float" or not value.is_floating_point()
    if kind == "int":
        return isinstance(value, (numbers.Integral, torch.SymInt))
    return isinstance(value, (numbers.Real, torch.SymFloat, torch.SymInt))


def _accepts(value: object, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    return _is_number(value, kind)


_NAMES = {"float": "a real number", "int": "an integer", "bool": "a bool", "str": "a str"}


def _described(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return f"{value!r} ({type(value).__name__})"


def check(op: str, **values: object) -> None:
    """Each keyword's value against the type ``op``'s schema declares for that argument; a TypeError naming the
    argument (prefixed with ``op``) on the first that does not fit."""
    declared = _declared(op)
    for name, value in values.items():
        kind, optional = declared[name]
        if value is None and optional:
            continue
        if not _accepts(value, kind):
            expected = _NAMES[kind] + (" or None" if optional else "")
            raise TypeError(f"{op}: {name} must be {expected}, got {_described(value)}")
