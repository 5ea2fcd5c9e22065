"""The fake kernels of the row losses' ops (csrc/losses.h's LossKind::Rows: the distillation family).

The elementwise losses' ops have C++ Meta kernels (csrc/registration/meta.cpp). A row loss's 'none' with
labels keeps the rows whose label is not ignore_index: its result's first dimension is known only from the
data, an unbacked size, which only a Python fake kernel can make (``ctx.new_dynamic_size()``; torch.compile
takes it with ``fullgraph=True`` as it is, docs/usage.md, "Distillation").
So the row losses' fake kernels are Python, registered here for every row loss's declaration; each first
runs the ops' own C++ checks on the fake tensors (``_C._row_result_dtype``), so that fake and real tensors
are checked by the same rules with the same messages.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from . import _C  # type: ignore[attr-defined]  # compiled: no Python source to check

__all__ = ["register"]


def _empty_gradient(like: torch.Tensor, wanted: bool) -> torch.Tensor:
    """A gradient the output mask asks for (the logits' shape and dtype), or the empty tensor the op returns
    in its place."""
    return like.new_empty(like.shape) if wanted else like.new_empty((0,))


def _positional(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The arguments of a call of npu_loss::op in its schema's order (a fake kernel is called with the schema's
    argument names, whatever the declaration names them), defaults filled in."""
    schema = getattr(torch.ops.npu_loss, op).default._schema
    values = list(args)
    for argument in schema.arguments[len(args):]:
        values.append(kwargs[argument.name] if argument.name in kwargs else argument.default_value)
    return values


def _register_row_loss(row: dict[str, Any]) -> None:
    forward, with_grads, backward = row["forward"], row["with_grads"], row["backward"]

    def forward_fake(*args: Any, **kwargs: Any) -> torch.Tensor:
        return forward_shape(*_positional(forward, args, kwargs))

    def with_grads_fake(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return with_grads_shape(*_positional(with_grads, args, kwargs))

    def backward_fake(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return backward_shape(*_positional(backward, args, kwargs))

    # Each op's arguments: (grad_output,) student, teacher, the declared inputs without a gradient, labels,
    # reduction, the declared scalars, the index, (output_mask): the inputs and scalars are passed on to the C++
    # checks as the declaration lists them.
    inputs, scalars = len(row["inputs"]), len(row["scalars"])
    # A teacher over a support: 'none' has K entries per row, K + 1 where its tail scalar is true.
    tail = row["scalars"].index(row["tail"]) if row["tail"] is not None else None

    def entries(student: torch.Tensor, teacher: torch.Tensor, rest: tuple[Any, ...]) -> Any:
        if row["teacher"] == "logits":
            return student.shape[-1]
        return teacher.shape[-1] + (1 if tail is not None and rest[inputs + 2 + tail] else 0)

    def checked(op: str, grad_output: torch.Tensor | None, student: torch.Tensor, teacher: torch.Tensor,
                rest: tuple[Any, ...]) -> tuple[torch.dtype, torch.Tensor | None, int]:
        """The C++ checks of a call; its result's dtype, labels and reduction."""
        labels, reduction = rest[inputs], rest[inputs + 1]
        dtype = _C._row_result_dtype(op, grad_output, student, teacher, list(rest[:inputs]), labels, reduction,
                                     rest[inputs + 2:inputs + 2 + scalars])
        return getattr(torch, dtype), labels, reduction

    def forward_shape(student: torch.Tensor, teacher: torch.Tensor, *rest: Any) -> torch.Tensor:
        dtype, labels, reduction = checked(forward, None, student, teacher, rest)
        if reduction != 0:
            return student.new_empty((), dtype=dtype)
        if labels is None:
            return student.new_empty((*student.shape[:-1], entries(student, teacher, rest)), dtype=dtype)
        rows = math.prod(student.shape[:-1])
        # At most every row (a bound Dynamo's later guards can use, where the row count is known).
        ctx = torch.library.get_ctx()
        kept = ctx.new_dynamic_size(max=rows) if isinstance(rows, int) else ctx.new_dynamic_size()
        return student.new_empty((kept, entries(student, teacher, rest)), dtype=dtype)

    def with_grads_shape(student: torch.Tensor, teacher: torch.Tensor,
                         *rest: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        dtype, _, _ = checked(with_grads, None, student, teacher, rest)
        output_mask = rest[-1]
        # The value, the gradients the mask asks for, and the row scales (float32, of the leading shape).
        return (student.new_empty((), dtype=dtype), _empty_gradient(student, output_mask[0]),
                _empty_gradient(teacher, output_mask[1]), student.new_empty(student.shape[:-1], dtype=torch.float32))

    def backward_shape(grad_output: torch.Tensor, student: torch.Tensor, teacher: torch.Tensor,
                       *rest: Any) -> tuple[torch.Tensor, torch.Tensor]:
        checked(backward, grad_output, student, teacher, rest)
        output_mask = rest[-1]
        return _empty_gradient(student, output_mask[0]), _empty_gradient(teacher, output_mask[1])

    torch.library.register_fake(f"npu_loss::{forward}", forward_fake)
    torch.library.register_fake(f"npu_loss::{with_grads}", with_grads_fake)
    torch.library.register_fake(f"npu_loss::{backward}", backward_fake)


def register() -> None:
    """Registers the fake kernels of every row loss's ops (once, at import)."""
    for row in _C._losses():
        if row["kind"] == "rows":
            _register_row_loss(row)
