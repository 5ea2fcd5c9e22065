"""The Python mirror of csrc/checks.cpp (and of kMaxDims in csrc/checks.h), for the fake (meta) kernels in
_fake.py: the validation of every op, and its result's shape, dtype and memory format.

Same rules, in the same order, with the same exception classes and messages as the C++ checks
(docs/validation.md lists them): a change to one is a change to the other. tests/test_errors.py keeps the
two identical. It runs docs/validation.md's whole error matrix on real CPU tensors (the C++ checks) and on
fake and meta tensors (these) and requires the same class and message from each, and it compares three
rules one by one: the dimension limit (MAX_DIMS against kMaxDims), the accepted dtypes (every torch dtype)
and float64 on the NPU (float64_allowed). tests/test_opcheck.py and tests/test_memory_format.py compare the
results' shapes, dtypes and memory formats with the real kernels'.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

MAX_DIMS = 8

_ACCEPTED = (torch.float32, torch.float16, torch.bfloat16)


class ResultSpec(NamedTuple):
    shape: list
    dtype: torch.dtype
    broadcast_shape: list
    memory_format: torch.memory_format = torch.contiguous_format


def result_memory_format(shape: list, operands_by_priority: Sequence[torch.Tensor]) -> torch.memory_format:
    """The suggested memory format of the first operand that has the result's full shape (channels_last
    for a 4-D NHWC tensor, channels_last_3d for a 5-D NDHWC one), else contiguous."""
    if len(shape) not in (4, 5):
        return torch.contiguous_format
    from torch._prims_common import suggest_memory_format  # Tensor.suggest_memory_format() in Python

    for t in operands_by_priority:
        if list(t.shape) == list(shape):
            return suggest_memory_format(t)
    return torch.contiguous_format


def _npu_type() -> str:
    return torch._C._get_privateuse1_backend_name()


def float64_allowed(t: torch.Tensor) -> bool:
    return t.device.type != _npu_type()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _accepted_dtypes(allow_float64: bool) -> str:
    return "float32, float64, float16 or bfloat16" if allow_float64 else "float32, float16 or bfloat16"


def _is_accepted(dtype: torch.dtype, allow_float64: bool) -> bool:
    return dtype in _ACCEPTED or (allow_float64 and dtype == torch.float64)


def _format_float(value: float) -> str:
    # C++ ostream's default float format is printf's %g.
    return "%g" % value


def _shape(t_or_shape) -> str:
    shape = t_or_shape.shape if isinstance(t_or_shape, torch.Tensor) else t_or_shape
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _check_defined(op: str, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
    for name, t in tensors:
        if t is None:
            raise RuntimeError(f"{op}: {name} must be a defined tensor, got an undefined tensor (None)")


def _check_same_device(op: str, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
    first_name, first = tensors[0]
    for name, t in tensors:
        if t.device != first.device:
            raise RuntimeError(
                f"{op}: expected all tensors on the same device, but {name} is on {t.device} "
                f"and {first_name} is on {first.device}"
            )


def _check_dtypes(op: str, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
    for name, t in tensors:
        allow = float64_allowed(t)
        if not _is_accepted(t.dtype, allow):
            raise TypeError(
                f"{op}: {name} must have dtype {_accepted_dtypes(allow)} on {t.device.type}, "
                f"got {_dtype_name(t.dtype)}"
            )


def _check_reduction(op: str, reduction: int) -> None:
    if not 0 <= reduction <= 2:
        raise ValueError(f"{op}: reduction must be 0 (none), 1 (mean) or 2 (sum), got {reduction}")


def _check_beta(op: str, beta: float) -> None:
    if not beta >= 0:  # NaN fails too
        raise ValueError(f"{op}: beta must be >= 0, got {_format_float(beta)}")


def _check_dims(op: str, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
    for name, t in tensors:
        if t.dim() > MAX_DIMS:
            raise RuntimeError(
                f"{op}: {name} has {t.dim()} dimensions, but at most {MAX_DIMS} are supported"
            )


def _broadcast(op: str, tensors: Sequence[tuple[str, torch.Tensor]]) -> list:
    ndim = max(t.dim() for _, t in tensors)
    shape = [1] * ndim
    ok = True
    for _, t in tensors:
        offset = ndim - t.dim()
        for i, s in enumerate(t.shape):
            cur = shape[offset + i]
            if s == cur or s == 1:
                continue
            if cur == 1:
                shape[offset + i] = s
            else:
                ok = False
    if not ok:
        parts = []
        for i, (name, t) in enumerate(tensors):
            sep = "" if i == 0 else (" and " if i + 1 == len(tensors) else ", ")
            parts.append(f"{sep}{name} {_shape(t)}")
        raise RuntimeError(f"{op}: shapes cannot be broadcast together: {''.join(parts)}")
    return shape


def _result_type(tensors: Sequence[torch.Tensor]) -> torch.dtype:
    # at::result_type for floating tensors: 0-dim tensors promote only when no dimensioned tensor exists.
    dims = [t.dtype for t in tensors if t.dim() > 0]
    pool = dims or [t.dtype for t in tensors]
    dtype = pool[0]
    for d in pool[1:]:
        dtype = torch.promote_types(dtype, d)
    return dtype


def _check_common(op: str, tensors, reduction: int) -> None:
    _check_defined(op, tensors)
    _check_same_device(op, tensors)
    _check_dtypes(op, tensors)
    _check_reduction(op, reduction)


def check_smooth_l1_loss(self, target, reduction: int, beta: float) -> ResultSpec:
    op = "smooth_l1_loss"
    args = [("self", self), ("target", target)]
    _check_common(op, args, reduction)
    _check_beta(op, beta)
    _check_dims(op, args)
    b = _broadcast(op, args)
    shape = b if reduction == 0 else []
    return ResultSpec(shape, _result_type([self, target]), b, result_memory_format(shape, [self, target]))


def check_smooth_l1_loss_backward(grad_output, self, target, reduction: int, beta: float) -> ResultSpec:
    op = "smooth_l1_loss_backward"
    args = [("grad_output", grad_output), ("self", self), ("target", target)]
    _check_common(op, args, reduction)
    _check_beta(op, beta)
    _check_dims(op, args)
    b = _broadcast(op, args)
    return ResultSpec(b, self.dtype, b, result_memory_format(b, [self, target, grad_output]))


def check_l1_loss(self, target, reduction: int) -> ResultSpec:
    op = "l1_loss"
    args = [("self", self), ("target", target)]
    _check_common(op, args, reduction)
    _check_dims(op, args)
    b = _broadcast(op, args)
    shape = b if reduction == 0 else []
    return ResultSpec(shape, _result_type([self, target]), b, result_memory_format(shape, [self, target]))


def check_l1_loss_backward(grad_output, self, target, reduction: int) -> ResultSpec:
    op = "l1_loss_backward"
    args = [("grad_output", grad_output), ("self", self), ("target", target)]
    _check_common(op, args, reduction)
    _check_dims(op, args)
    b = _broadcast(op, args)
    dtype = _result_type([grad_output, self, target])
    return ResultSpec(b, dtype, b, result_memory_format(b, [self, target, grad_output]))


def check_kl_div(self, target, reduction: int) -> ResultSpec:
    op = "kl_div"
    args = [("self", self), ("target", target)]
    _check_common(op, args, reduction)
    _check_dims(op, args)
    b = _broadcast(op, args)
    shape = b if reduction == 0 else []
    return ResultSpec(shape, _result_type([self, target]), b, result_memory_format(shape, [self, target]))


def check_kl_div_target_backward(grad_output, self, target, reduction: int) -> ResultSpec:
    op = "kl_div_target_backward"
    args = [("grad_output", grad_output), ("self", self), ("target", target)]
    _check_common(op, args, reduction)
    _check_dims(op, args)
    b = _broadcast(op, [("self", self), ("target", target)])
    with_grad = _broadcast(op, args)
    if with_grad != b:
        raise RuntimeError(
            f"{op}: grad_output of shape {_shape(grad_output)} must broadcast to the shape of "
            f"broadcast(self, target) {_shape(b)} without enlarging it"
        )
    shape = list(target.shape)
    return ResultSpec(shape, target.dtype, b, result_memory_format(shape, [target]))


def _storage_key(t: torch.Tensor):
    return t.untyped_storage()._cdata


def _memory_span(t: torch.Tensor) -> tuple[int, int]:
    item = t.element_size()
    extent = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    begin = t.storage_offset() * item
    return begin, begin + extent * item


def _has_internal_overlap(t: torch.Tensor) -> bool:
    return any(s > 1 and st == 0 for s, st in zip(t.shape, t.stride()))


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0 or _storage_key(a) != _storage_key(b):
        return False
    a0, a1 = _memory_span(a)
    b0, b1 = _memory_span(b)
    return a0 < b1 and b0 < a1


def _is_exact_alias(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        _storage_key(a) == _storage_key(b)
        and a.storage_offset() * a.element_size() == b.storage_offset() * b.element_size()
        and a.element_size() == b.element_size()
        and a.shape == b.shape
        and a.stride() == b.stride()
    )


def check_out(op: str, name: str, out, spec: ResultSpec, dtype_equals_result: bool, inputs) -> None:
    if out is None:
        raise RuntimeError(f"{op}: {name} must be a defined tensor, got an undefined tensor (None)")
    first_name, first = inputs[0]
    if out.device != first.device:
        raise RuntimeError(
            f"{op}: expected all tensors on the same device, but {name} is on {out.device} "
            f"and {first_name} is on {first.device}"
        )
    if dtype_equals_result:
        if out.dtype != spec.dtype:
            raise TypeError(
                f"{op}: {name} must have dtype {_dtype_name(spec.dtype)} (the result's dtype), "
                f"got {_dtype_name(out.dtype)}"
            )
    else:
        allow = float64_allowed(out)
        if not _is_accepted(out.dtype, allow):
            raise TypeError(
                f"{op}: {name} must have dtype {_accepted_dtypes(allow)} on {out.device.type}, "
                f"got {_dtype_name(out.dtype)}"
            )
    if list(out.shape) != list(spec.shape):
        raise RuntimeError(
            f"{op}: {name} must have shape {_shape(spec.shape)} (the result's shape), got {_shape(out)}"
        )
    if _has_internal_overlap(out):
        raise RuntimeError(
            f"{op}: {name} must not overlap itself (expanded or stride-0 outputs are not supported)"
        )
    alias_allowed = list(spec.shape) == list(spec.broadcast_shape)
    for input_name, t in inputs:
        if not _shares_memory(out, t):
            continue
        if not (alias_allowed and _is_exact_alias(out, t)):
            tail = f" or exactly {input_name}" if alias_allowed else ""
            raise RuntimeError(f"{op}: {name} overlaps {input_name}; it must be a separate tensor{tail}")

