"""torch.nn.functional-style losses backed by the ``torch.ops.npu_loss`` ops.

Each function takes the same arguments as its ``torch.nn.functional`` twin (reduction strings, the legacy
``size_average``/``reduce`` pair, KL's ``'batchmean'``), gives the same results and warnings, and calls
the matching ``torch.ops.npu_loss`` op, so its gradient runs on the package's kernels (the CANN ``aclnn``
kernels on an Ascend NPU, native kernels on the CPU). Every elementwise loss compiles with
``torch.jit.script``; :func:`generalized_jsd_loss` is TRL's function plus a keyword-only ``ignore_index``,
which TorchScript cannot compile (its op can be scripted).

What the elementwise losses share, as their twins in ``torch.nn.functional`` do (each function's docstring
says what is its own):

- ``input`` and ``target`` broadcast together, each with at most 8 dimensions (more is a ``RuntimeError``;
  PyTorch has no such limit), and a ``UserWarning`` is issued when their sizes differ; shapes that do not
  broadcast are a ``RuntimeError``. The result is 0-dim, or the broadcast shape for ``reduction='none'``.
- ``size_average`` and ``reduce``, where taken, are deprecated: if either is given, the pair overrides
  ``reduction``.
- ``reduction`` is ``'none'``, ``'mean'`` (the mean over the elements of the broadcast result) or ``'sum'``
  (and ``'batchmean'`` for KL); anything else is a ``ValueError``. Default: ``'mean'``.
- ``weight``, where taken, is a weight per element of ``input``'s size (another size is a ``ValueError``);
  gradients flow to it too.
- The result dtype is PyTorch's: ``torch.promote_types(input.dtype, target.dtype)`` (PyTorch broadcasts the
  two first, so a 0-dim operand promotes like any other), promoted with ``weight``'s. An integer or bool
  operand the twin accepts is cast to the floating result dtype first.
- A complex operand, or a float64 one on the NPU, is a ``TypeError``.
"""
import numbers
import warnings
from typing import Any, Callable, cast

import torch
from torch import Tensor

# torch.jit.is_scripting itself; torch.jit's __all__ leaves it out, so mypy --strict would not see it there.
from torch._jit_internal import is_scripting as _is_scripting
from torch.nn import _reduction as _Reduction
from torch.overrides import handle_torch_function, has_torch_function_variadic

from . import _C, _dtensor, _scalars, _vocab_parallel  # type: ignore[attr-defined]  # _C: compiled, no Python source
from ._reduction import get_enum as _reduction_enum

__all__ = ["smooth_l1_loss", "huber_loss", "l1_loss", "kl_div", "mse_loss", "generalized_jsd_loss",
           "fused_linear_jsd_loss", "sparse_jsd_loss", "fused_linear_sparse_jsd_loss"]


def _legacy_reduction(size_average: bool | None, reduce: bool | None) -> str:
    if torch.compiler.is_compiling():
        # torch.compile cannot trace legacy_get_string called from outside torch (a graph break, as is its
        # warning), so the same mapping is spelled out here, without the warning.
        if reduce is False:
            return "none"
        return "sum" if size_average is False else "mean"
    return _Reduction.legacy_get_string(size_average, reduce)


def _warn_if_sizes_differ(input: Tensor, target: Tensor) -> None:
    if target.size() != input.size() and not torch.compiler.is_compiling():
        warnings.warn(
            f"Using a target size ({target.size()}) that is different to the input size ({input.size()}). "
            "This will likely lead to incorrect results due to broadcasting. "
            "Please ensure they have the same size.",
            stacklevel=3,
        )


def _is_integral(t: Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex())


def _to_default_dtype(t: Tensor) -> Tensor:
    if _is_scripting():
        # TorchScript has no torch.get_default_dtype() (and its optimiser freezes a dtype read from a new
        # tensor), but an integer tensor times a Python float has the default dtype, read at each call.
        return t * 1.0
    else:
        return t.to(torch.get_default_dtype())


def _promote_like_functional(
    input: Tensor, target: Tensor, *, bool_ok: bool, integral_result_ok: bool
) -> tuple[Tensor, Tensor]:
    """Prepares input and target so that the op's result dtype is torch.nn.functional's.

    F broadcasts input and target before its kernel, so its result dtype is
    ``torch.promote_types(input.dtype, target.dtype)``: a 0-dim operand promotes like any other (float16
    with a 0-dim float32 gives float32), unlike under ``torch.result_type``'s 0-dim rule, which the op
    follows. Integer (and, if ``bool_ok``, bool) operands are cast to that dtype when it is floating, or to
    the default dtype if both are integral and ``integral_result_ok``. Then a 0-dim operand whose dtype
    still differs is expanded (a view) to the other's shape. Whatever F rejects (and complex, which casting
    would silently truncate) is passed on unchanged for the op to reject with a TypeError.

    The promoted dtype's kind follows from the operands' (complex if either is complex, else floating if
    either is floating, else integral), so it is read from the tensors: TorchScript has no dtype attributes.
    """
    input_integral = _is_integral(input)
    if input.dtype == target.dtype and not input_integral:
        return input, target
    target_integral = _is_integral(target)
    if (input_integral or target_integral) and not (input.is_complex() or target.is_complex()):
        if not bool_ok and (input.dtype == torch.bool or target.dtype == torch.bool):
            return input, target
        if input_integral and target_integral:
            if not integral_result_ok:
                return input, target
            # Both in the default dtype, so no expand is needed below.
            return _to_default_dtype(input), _to_default_dtype(target)
        result_dtype = torch.promote_types(input.dtype, target.dtype)
        # Cast before any expand below, so that a 0-dim operand is cast as one element.
        if input_integral:
            input = input.to(result_dtype)
        if target_integral:
            target = target.to(result_dtype)
    if input.dtype != target.dtype and (input.dim() == 0) != (target.dim() == 0):
        if input.dim() == 0:
            input = input.expand(target.shape)
        else:
            target = target.expand(input.shape)
    return input, target


def _prepare(
    input: Tensor,
    target: Tensor,
    size_average: bool | None,
    reduce: bool | None,
    reduction: str,
    weight: Tensor | None,
    bool_ok: bool = True,
    integral_result_unless_mean: bool = False,
) -> tuple[Tensor, Tensor, str, int]:
    """What every elementwise loss does before its op, as torch.nn.functional does it: the target-size warning,
    the legacy ``size_average``/``reduce`` pair resolved to a reduction, the operands promoted
    (_promote_like_functional; an all-integral pair computes in the default dtype where
    ``integral_result_unless_mean`` and the reduction is not 'mean'), and the op's reduction enum ('none' when
    a weight is applied afterwards, by _weighted). Returns the operands, the reduction and the op's enum."""
    _warn_if_sizes_differ(input, target)
    if size_average is not None or reduce is not None:
        reduction = _legacy_reduction(size_average, reduce)
    input, target = _promote_like_functional(
        input, target, bool_ok=bool_ok, integral_result_ok=integral_result_unless_mean and reduction != "mean"
    )
    return input, target, reduction, _reduction_enum(reduction if weight is None else "none")


def _overridden(public_api: Callable[..., object], relevant: tuple[Any, ...], *args: Any, **kwargs: Any) -> Tensor:
    """The result of a ``__torch_function__`` override of ``public_api`` (torch.overrides' protocol, as F's
    losses have it; TorchScript compiles the branch that calls this away)."""
    result = handle_torch_function(public_api, relevant, *args, **kwargs)  # Any in some releases
    return cast(Tensor, result)


def smooth_l1_loss(input: Tensor, target: Tensor, size_average: bool | None = None, reduce: bool | None = None,
                   reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """Compute the Smooth L1 loss: squared below ``beta``, L1 above it.

    A drop-in for :func:`torch.nn.functional.smooth_l1_loss` whose kernels (forward and gradient) are
    ``torch.ops.npu_loss.smooth_l1_loss`` / ``smooth_l1_loss_backward``. With ``d = input - target``
    (broadcast together), the unreduced loss is, elementwise::

        l = 0.5 * d**2 / beta    if |d| < beta
        l = |d| - 0.5 * beta     otherwise

    ``beta == 0`` gives exactly the L1 loss ``|d|``. The result is then reduced by ``reduction``. The
    arguments every elementwise loss shares (``input``, ``target``, ``size_average``, ``reduce``,
    ``reduction``), its shapes and its result dtype: the module's docstring.

    Args:
        beta (float, optional): Threshold between the squared and the L1 term. Must be non-negative
            (a negative or NaN beta raises ``ValueError``). Default: ``1.0``

    Raises:
        ValueError: ``beta`` is negative or NaN (PyTorch raises ``RuntimeError``).
        TypeError: both operands are integral or bool, or an operand is complex (PyTorch raises
            ``NotImplementedError``, a ``RuntimeError``, for both).

    Example::

        >>> import torch
        >>> from npu_loss_ops.functional import smooth_l1_loss
        >>> input = torch.tensor([0.5, 1.0, 3.0])
        >>> target = torch.tensor([0.0, 0.0, 0.0])
        >>> smooth_l1_loss(input, target, reduction="none")
        tensor([0.1250, 0.5000, 2.5000])
        >>> smooth_l1_loss(input, target)
        tensor(1.0417)
        >>> smooth_l1_loss(input, target, reduction="sum", beta=0.5)
        tensor(3.7500)
    """
    if has_torch_function_variadic(input, target):
        return _overridden(smooth_l1_loss, (input, target), input, target, size_average=size_average,
                           reduce=reduce, reduction=reduction, beta=beta)
    # F's kernel rejects an all-integral pair; bool with a floating operand it accepts.
    input, target, _, op_reduction = _prepare(input, target, size_average, reduce, reduction, None)
    loss: Tensor = torch.ops.npu_loss.smooth_l1_loss(input, target, op_reduction, beta)
    return loss


def _weighted(
    loss: Tensor, weight: Tensor | None, input: Tensor, reduction: str, divide_by_weight_sum: bool
) -> Tensor:
    """``loss`` itself without a weight; else ``weight * loss`` (``loss`` unreduced: _prepare) reduced
    as torch.nn.functional does it for ``weight=``: torch's own ops after the loss op, so the loss op's backward
    gets ``weight * grad`` as its grad_output."""
    if weight is None:
        return loss
    if weight.size() != input.size():
        raise ValueError("Weights and input must have the same size.")
    weighted = loss * weight
    if reduction == "none":
        return weighted
    if reduction == "sum":
        return torch.sum(weighted)
    if reduction == "mean":
        return torch.sum(weighted) / torch.sum(weight) if divide_by_weight_sum else weighted.mean()
    raise ValueError(f"Invalid reduction mode: {reduction}. Expected one of 'none', 'mean', 'sum'.")


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0,
               weight: Tensor | None = None) -> Tensor:
    """Compute the Huber loss: squared below ``delta``, delta-scaled L1 above it, optionally weighted.

    A drop-in for :func:`torch.nn.functional.huber_loss` whose kernels (forward and gradient) are
    ``torch.ops.npu_loss.huber_loss`` / ``huber_loss_backward``. With ``d = input - target`` (broadcast
    together), the unreduced loss is, elementwise::

        l = 0.5 * d**2                     if |d| < delta
        l = delta * (|d| - 0.5 * delta)    otherwise

    which is ``delta * smooth_l1_loss(input, target, beta=delta)``. The result is then reduced by
    ``reduction``. The shared arguments (``input``, ``target``, ``reduction``, ``weight``), shapes and result
    dtype: the module's docstring.

    Args:
        delta (float, optional): The threshold between the squared and the delta-scaled L1 term. Must be
            positive; ``inf`` gives ``0.5 * d**2`` everywhere. Zero, a negative value or NaN raises
            ``ValueError`` (PyTorch raises ``RuntimeError``). Default: ``1.0``
        weight (Tensor, optional): The weighted loss is ``weight * l``; ``'mean'`` is its mean over all
            elements. Default: ``None``

    Example::

        >>> import torch
        >>> from npu_loss_ops.functional import huber_loss, smooth_l1_loss
        >>> d = torch.tensor([0.5, 1.0, 3.0])
        >>> huber_loss(d, torch.zeros(3), reduction="sum", delta=2.0)
        tensor(4.6250)
        >>> 2.0 * smooth_l1_loss(d, torch.zeros(3), reduction="sum", beta=2.0)
        tensor(4.6250)
    """
    if has_torch_function_variadic(input, target, weight):
        return _overridden(huber_loss, (input, target, weight), input, target, reduction=reduction, delta=delta,
                           weight=weight)
    input, target, reduction, op_reduction = _prepare(input, target, None, None, reduction, weight)
    loss = torch.ops.npu_loss.huber_loss(input, target, op_reduction, delta)
    return _weighted(loss, weight, input, reduction, divide_by_weight_sum=False)


def l1_loss(input: Tensor, target: Tensor, size_average: bool | None = None, reduce: bool | None = None,
            reduction: str = "mean", weight: Tensor | None = None) -> Tensor:
    """Compute the L1 loss: the element-wise absolute difference, optionally reduced.

    A drop-in for :func:`torch.nn.functional.l1_loss` whose kernels
    (forward and gradient) are ``torch.ops.npu_loss.l1_loss`` / ``l1_loss_backward``. With
    ``d = input - target`` (broadcast together), the unreduced loss is, elementwise::

        l = |d|

    and it is then reduced by ``reduction``. The shared arguments (``input``, ``target``, ``size_average``,
    ``reduce``, ``reduction``, ``weight``), shapes and result dtype: the module's docstring. When both operands
    are integral, ``'none'`` and ``'sum'`` are computed in ``torch.get_default_dtype()`` (PyTorch computes them
    in the integer dtype).

    Args:
        weight (Tensor, optional): The weighted loss is ``weight * |d|``; ``'mean'`` divides its sum by
            ``weight.sum()``. Default: ``None``

    Raises:
        TypeError: an operand is bool, or ``reduction='mean'`` with two integer operands (PyTorch raises
            ``RuntimeError`` for both); an operand is complex (PyTorch returns the real L1 loss of complex
            tensors).

    Example::

        >>> import torch
        >>> from npu_loss_ops.functional import l1_loss
        >>> input = torch.tensor([[0.5, -1.0], [2.0, 4.0]])
        >>> target = torch.tensor([1.0, 1.0])
        >>> l1_loss(input, target.expand(2, 2), reduction="none")
        tensor([[0.5000, 2.0000],
                [1.0000, 3.0000]])
        >>> l1_loss(input, target.expand(2, 2))
        tensor(1.6250)
        >>> l1_loss(input, target.expand(2, 2), reduction="sum")
        tensor(6.5000)
    """
    if has_torch_function_variadic(input, target, weight):
        return _overridden(l1_loss, (input, target, weight), input, target, size_average=size_average,
                           reduce=reduce, reduction=reduction, weight=weight)
    # F computes an all-integral 'none'/'sum' in the integer dtype, rejects its 'mean' and rejects bool.
    input, target, reduction, op_reduction = _prepare(input, target, size_average, reduce, reduction, weight,
                                                      bool_ok=False, integral_result_unless_mean=True)
    return _weighted(torch.ops.npu_loss.l1_loss(input, target, op_reduction), weight, input, reduction, True)


def kl_div(input: Tensor, target: Tensor, size_average: bool | None = None, reduce: bool | None = None,
           reduction: str = "mean", log_target: bool = False) -> Tensor:
    """Compute the Kullback-Leibler divergence loss of ``input`` (log-probabilities) from ``target``.

    A drop-in for :func:`torch.nn.functional.kl_div` whose kernels are ``torch.ops.npu_loss.kl_div`` and,
    for the gradient w.r.t. ``target``, ``kl_div_target_backward``. With ``input`` and ``target`` broadcast
    together, the unreduced loss is, elementwise::

        l = target * (log(target) - input)       if not log_target (0 where target == 0)
        l = exp(target) * (target - input)       if log_target

    and it is then reduced by ``reduction``.

    One deliberate difference from PyTorch: with ``log_target=False`` the gradient w.r.t. ``target`` is
    exactly 0 where ``target == 0`` (a zero probability contributes nothing), where PyTorch's autograd gives
    NaN. Forward values and all other gradients equal PyTorch's.

    The shared arguments (``size_average``, ``reduce``), shapes and result dtype: the module's docstring.

    Args:
        input (Tensor): Log-probabilities.
        target (Tensor): Probabilities, or log-probabilities if ``log_target`` is ``True``; broadcast with
            ``input``.
        reduction (str, optional): ``'none'`` | ``'batchmean'`` | ``'sum'`` | ``'mean'``. ``'batchmean'``: the
            sum divided by ``input.size(0)`` (the sum itself for a 0-dim input); ``'mean'``: the sum divided
            by the number of elements of the broadcast result. Anything else raises ``ValueError``.
            Default: ``'mean'``
        log_target (bool, optional): Whether ``target`` is given in log space. Default: ``False``

    .. warning::
        ``reduction='mean'`` does not return the true KL divergence; use ``reduction='batchmean'``, which
        matches the mathematical definition. As in PyTorch, ``'mean'`` issues a ``UserWarning`` saying so
        (not inside ``torch.compile``).

    Raises:
        TypeError: an operand is integral or bool (PyTorch raises ``RuntimeError``).

    Example::

        >>> import torch
        >>> from npu_loss_ops.functional import kl_div
        >>> input = torch.tensor([[0.25, 0.75], [0.5, 0.5]]).log()
        >>> target = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
        >>> kl_div(input, target, reduction="batchmean")
        tensor(0.0719)
        >>> kl_div(input, target.log(), reduction="sum", log_target=True)
        tensor(0.1438)
        >>> kl_div(input, torch.tensor([[1.0, 0.0], [0.0, 1.0]]), reduction="none")
        tensor([[1.3863, 0.0000],
                [0.0000, 0.6931]])
    """
    if has_torch_function_variadic(input, target):
        return _overridden(kl_div, (input, target), input, target, size_average=size_average, reduce=reduce,
                           reduction=reduction, log_target=log_target)
    if size_average is not None or reduce is not None:
        reduction_enum = _reduction_enum(_legacy_reduction(size_average, reduce))
    else:
        if reduction == "mean" and not torch.compiler.is_compiling():
            # PyTorch's message, word for word (so filters written for it keep working).
            warnings.warn(
                "reduction: 'mean' divides the total loss by both the batch size and the support size."
                "'batchmean' divides only by the batch size, and aligns with the KL div math definition."
                "'mean' will be changed to behave the same as 'batchmean' in the next major release.",
                stacklevel=2,
            )
        reduction_enum = _reduction_enum("sum" if reduction == "batchmean" else reduction)

    reduced: Tensor = torch.ops.npu_loss.kl_div(input, target, reduction_enum, log_target=log_target)

    # PyTorch's rule, legacy arguments included: 'batchmean' divides by the batch size unless input is 0-dim.
    if reduction == "batchmean" and input.dim() != 0:
        reduced = reduced / input.size(0)
    return reduced


def mse_loss(input: Tensor, target: Tensor, size_average: bool | None = None, reduce: bool | None = None,
             reduction: str = "mean", weight: Tensor | None = None) -> Tensor:
    """Compute the mean squared error: the element-wise squared difference, optionally weighted and reduced.

    A drop-in for :func:`torch.nn.functional.mse_loss` whose kernels (forward and gradient) are
    ``torch.ops.npu_loss.mse_loss`` / ``mse_loss_backward``. With ``d = input - target`` (broadcast
    together), the unreduced loss is, elementwise, ``l = d * d``, and its gradient w.r.t. ``input`` is
    ``2 * d`` times the incoming gradient; ``'mean'`` divides by the number of elements.

    The shared arguments (``input``, ``target``, ``size_average``, ``reduce``, ``reduction``, ``weight``),
    shapes and result dtype: the module's docstring.

    Args:
        weight (Tensor, optional): The weighted loss is ``weight * d * d``; ``'mean'`` divides its sum by
            ``weight.sum()``. Default: ``None``

    Raises:
        TypeError: both operands are integral or bool (PyTorch raises ``NotImplementedError``).
    """
    if has_torch_function_variadic(input, target, weight):
        return _overridden(mse_loss, (input, target, weight), input, target, size_average=size_average,
                           reduce=reduce, reduction=reduction, weight=weight)
    input, target, reduction, op_reduction = _prepare(input, target, size_average, reduce, reduction, weight)
    return _weighted(torch.ops.npu_loss.mse_loss(input, target, op_reduction), weight, input, reduction, True)


# ---- distillation over logits --------------------------------------------------------------------------------


# The row family's reduction names, from its one rule (csrc/core/checks.h, family_reduction).
_FAMILY_REDUCTIONS = frozenset(_C._family_reductions())


def _family_reduction(op: str, reduction: str) -> None:
    """A name the family does not have raises the rule's own ValueError, with its message. The names are read
    once, at import, so that under torch.compile a good name costs nothing in the graph (a call into _C would
    break it); a bad one breaks it only to raise."""
    if reduction not in _FAMILY_REDUCTIONS:
        _C._family_reduction(op, reduction)


def _check_num_items(num_items_in_batch: int | float | Tensor, logits: Tensor,
                     op: str = "generalized_jsd_loss") -> None:
    """TRL divides by num_items_in_batch unchecked. Here it is a real number, or a one-element floating or integer
    tensor on the logits' device or the CPU (a TypeError for another type, a ValueError for another shape or
    device); a number or a CPU tensor of at most 0 is a ValueError. A tensor on the logits' device (the Trainer's
    count across devices) is not read: that would wait for the device every step. Not inside torch.compile."""
    if isinstance(num_items_in_batch, Tensor):
        if torch.compiler.is_compiling():
            return
        if num_items_in_batch.dtype == torch.bool or num_items_in_batch.is_complex():
            raise TypeError(
                f"{op}: num_items_in_batch must be a real number or a one-element floating or "
                f"integer tensor, got a tensor of dtype {num_items_in_batch.dtype}")
        if num_items_in_batch.numel() != 1:
            raise ValueError(
                f"{op}: num_items_in_batch must be a number or a one-element real tensor, got a "
                f"tensor of shape {tuple(num_items_in_batch.shape)}")
        device = num_items_in_batch.device
        if device.type != "cpu" and device != logits.device:
            where = "the CPU" if logits.device.type == "cpu" else f"the logits' device ({logits.device}) or the CPU"
            raise ValueError(f"{op}: num_items_in_batch must be on {where}, got a tensor on {device}")
        if device.type != "cpu":
            return
        value = num_items_in_batch.item()
    elif isinstance(num_items_in_batch, bool) or not isinstance(num_items_in_batch, numbers.Real):
        raise TypeError(f"{op}: num_items_in_batch must be a real number or a tensor, got "
                        f"{num_items_in_batch!r} ({type(num_items_in_batch).__name__})")
    else:
        value = num_items_in_batch
    if not value > 0:
        raise ValueError(f"{op}: num_items_in_batch must be > 0, got {value}")


def _reduced(op_name: str, call: Callable[[int], Tensor], reduction: str, labels: Tensor | None,
             num_items_in_batch: int | float | Tensor | None, ignore_index: int, student_logits: Tensor,
             tensors: tuple[Any, ...], entries: Callable[[], int], values: str) -> Tensor:
    """The family's reductions around a row op (`call(reduction)` calls it with ATen's integer): the sum divided by
    num_items_in_batch when given; 'none' and 'sum' as the op makes them; 'batchmean' and 'mean' as the sum
    divided by a count of the kept rows (a tensor op, so that sharded logits divide by the whole count,
    docs/usage.md, "Distributed training"), 'mean''s over their `entries()` values each (V, or a support's K or
    K + 1; asked for after the op's checks). `values`: the shape of 'none''s result, for the DTensor message."""
    if num_items_in_batch is not None:
        _check_num_items(num_items_in_batch, student_logits, op_name)
        total = call(2)
        if isinstance(num_items_in_batch, Tensor):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch
    if reduction == "none" and labels is not None and _dtensor.any_dtensor(*tensors):
        # DTensor makes every result's shape before the call, and this one's row count only the data tells.
        raise ValueError(
            f"{op_name}: reduction='none' with labels is not supported for DTensor logits (the number "
            f"of rows kept depends on the labels' values); pass labels=None and multiply the {values} result by "
            "(labels != ignore_index).unsqueeze(-1)")
    if reduction == "sum" or reduction == "none":
        return call(_reduction_enum(reduction))
    total = call(2)
    if reduction == "batchmean":
        if labels is None:
            return total / max(student_logits.size(0), 1)
        # At least 1, as TRL's clamp_min(1): no row kept gives 0, not 0 / 0. (clamp(min=): DTensor has a rule
        # for aten.clamp on every supported torch, and none for aten.clamp_min on 2.7.)
        return total / (labels != ignore_index).sum().clamp(min=1)
    # 'mean': over the values of the kept rows. None kept is NaN, as TRL's mean of nothing, with zero gradients,
    # as TRL's: the division by 0 is not differentiated (its branch of `where` is not taken).
    if labels is None:
        return total / (student_logits.numel() // max(student_logits.size(-1), 1) * entries())
    count = (labels != ignore_index).sum() * entries()
    return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, float("nan")))


def _on_vocabulary_split(op: str, group: Any, student_logits: Tensor, reduction: str,
                         num_items_in_batch: int | float | Tensor | None, scalars: dict[str, Any],
                         call: Callable[[], Any]) -> Any:
    """A family function's call on logits split over the vocabulary (a `group`, or DTensor placements), after the
    checks its ops make of the same arguments."""
    if not isinstance(reduction, str):
        raise TypeError(f"{op}: reduction must be a str, got {reduction!r} ({type(reduction).__name__})")
    _scalars.check(op, **scalars)
    _family_reduction(op, reduction)
    if group is not None:
        _vocab_parallel.check_group(op, group)
        if _dtensor.any_dtensor(student_logits):
            raise ValueError(f"{op}: vocab_parallel_group is for plain tensors (each rank's slice); DTensor logits "
                             "placed Shard(-1) are split without it")
    if num_items_in_batch is not None:
        _check_num_items(num_items_in_batch, student_logits, op)
    return call()


# The rows of float32 (float64) logits a pass of _student_entropy takes at once: about 2**24 elements.
_ENTROPY_CHUNK_ELEMENTS = 1 << 24


def _student_entropy(student_logits: Tensor, labels: Tensor | None, temperature: float, ignore_index: int,
                     scale: float, softcap: float | None) -> Tensor:
    """The student's entropy per row of (..., V) logits, -sum(p * log p) of p = softmax(transformed / T), float32
    of the leading shape, 0 where labels drop the row: torch ops, without gradient, in chunks of rows (sharded
    DTensor logits whole: their shards are the chunks)."""
    x = student_logits.detach()
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32

    def rows_entropy(z: Tensor) -> Tensor:
        z = z.to(acc) * scale
        if softcap is not None:
            z = torch.tanh(z / softcap) * softcap
        log_p = torch.log_softmax(z / temperature, dim=-1)
        p = log_p.exp()
        # p * log p is 0 where p is (a logit of -inf: 0 * -inf would be NaN); a NaN stays NaN.
        return -torch.where(p == 0, 0.0, p * log_p).sum(-1)

    with torch.no_grad():
        if _dtensor.any_dtensor(x) or x.dim() < 2 or x.numel() <= _ENTROPY_CHUNK_ELEMENTS:
            entropy = rows_entropy(x)
        else:
            flat = x.reshape(-1, x.size(-1))
            step = max(1, _ENTROPY_CHUNK_ELEMENTS // max(x.size(-1), 1))
            entropy = torch.cat([rows_entropy(part) for part in torch.split(flat, step)]).view(x.shape[:-1])
        entropy = entropy.float()
        if labels is not None:
            entropy = entropy.masked_fill(labels == ignore_index, 0.0)
    return entropy


def generalized_jsd_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    labels: Tensor | None = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    reduction: str = "batchmean",
    num_items_in_batch: int | float | Tensor | None = None,
    *,
    ignore_index: int = -100,
    student_logit_scale: float = 1.0,
    teacher_logit_scale: float = 1.0,
    student_softcap: float | None = None,
    teacher_softcap: float | None = None,
    return_entropy: bool = False,
    vocab_parallel_group: Any = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """The generalized Jensen-Shannon divergence of the GKD paper between the student's and the teacher's
    distributions over a vocabulary, row by row: TRL's ``GKDTrainer.generalized_jsd_loss`` (trl 1.16), to the
    letter, with its signature plus the keyword ``ignore_index``. ``GKDTrainer.generalized_jsd_loss =
    staticmethod(npu_loss_ops.generalized_jsd_loss)`` switches a trainer to it.

    With ``s = log_softmax(x_s / temperature)`` and ``t = log_softmax(x_t / temperature)`` over the last
    dimension, where each side's ``x`` is its logits transformed in TRL's order (``DistillationTrainer``): times
    its ``*_logit_scale``, then ``softcap * tanh(x / softcap)`` where a ``*_softcap`` is given (both at their
    defaults: the logits themselves), elementwise::

        beta == 0:  KL(teacher || student) = exp(t) * (t - s)
        beta == 1:  KL(student || teacher) = exp(s) * (s - t)
        otherwise:  m = logsumexp(s + log(1 - beta), t + log(beta))
                    beta * exp(t) * (t - m) + (1 - beta) * exp(s) * (s - m)

    Rows whose label equals ``ignore_index`` are left out (the loss reads nothing else of ``labels``: a label
    outside ``[0, V)`` only keeps its row). The op computes the gradients in the forward, chunk by chunk, when
    autograd will need them: the student's, and the teacher's whenever ``teacher_logits`` requires grad
    (docs/semantics.md, "Distillation", has the memory this costs).

    Args:
        student_logits (Tensor): ``(..., V)``, float32, bfloat16, float16 (and float64 off the NPU); views
            such as ``logits[:, :-1]`` are read as they are.
        teacher_logits (Tensor): the same shape; its dtype may differ (the result takes the promoted dtype).
        labels (Tensor, optional): integer, of the leading shape ``(...)``. Default: ``None`` (every row kept)
        beta (float): in ``[0, 1]``; anything else is a ``ValueError`` (TRL does not check). Default: ``0.5``
        temperature (float): ``> 0``; anything else is a ``ValueError`` (TRL does not check). Default: ``1.0``
        reduction (str): ``'batchmean'`` (the sum over the kept rows divided by their number, at least 1, or
            without labels by ``max(student_logits.size(0), 1)``, as TRL does: the first dimension, not B*T),
            ``'sum'``, ``'mean'`` (over the elements of the kept rows: NaN when none is kept) or ``'none'``
            (the elementwise ``(K, V)`` values of the K kept rows; without labels the logits' shape).
            Anything else is a ``ValueError``. Default: ``'batchmean'``
        num_items_in_batch (int, float or Tensor, optional): when given, the result is the sum divided by it,
            whatever ``reduction`` says (a number or CPU tensor of at most 0 is a ``ValueError``; a tensor on
            another device is not read, which would wait for it). Default: ``None``
        ignore_index (int): the label of the rows left out. Default: ``-100``
        student_logit_scale, teacher_logit_scale (float): ``> 0``; each side's logits are multiplied by it first
            (a model's ``logit_scale``, ``1 / logits_scaling``, ``lm_head_multiplier``). Default: ``1.0``
        student_softcap, teacher_softcap (float, optional): ``> 0``; the scaled logits become
            ``softcap * tanh(x / softcap)`` (Gemma's ``final_logit_softcapping``), the gradients through the
            tanh. Default: ``None`` (no softcap)
        return_entropy (bool): also return the student's entropy per row, ``-sum(p * log p)`` of
            ``p = softmax(x_s / temperature)`` (TRL's ``log Z - sum(p * z)``): float32, of the leading shape
            ``(...)``, 0 on the rows ``labels`` drops, with no gradient. Made in a pass of its own over the
            student's logits, in row chunks. Default: ``False``
        vocab_parallel_group (ProcessGroup, optional): the vocabulary is split over this group's ranks (Megatron-LM's
            and MindSpeed's ``ColumnParallelLinear``): each rank passes its contiguous slice ``(..., V_r)`` of both
            logits, the ranks in group order, and the same rows and labels. Only per-row floats cross the group;
            the result is the whole call's on every rank ('none': the rank's slice of it), the gradients each
            rank's slice (docs/usage.md, "Distributed distillation"). DTensor logits placed ``Shard(-1)`` take
            the same path without it. Default: ``None``

    Returns:
        The loss, or ``(loss, entropy)`` with ``return_entropy``.

    Raises:
        ValueError: ``beta``, ``temperature``, a scale, a softcap, ``reduction`` or ``num_items_in_batch`` as
            above.
        TypeError: a logits dtype outside the list, or ``labels`` not of an integer dtype.
        RuntimeError: the logits' shapes differ (vocabularies of different sizes included), ``labels``' shape
            is not their leading shape, or the tensors are on different devices.
    """
    if has_torch_function_variadic(student_logits, teacher_logits, labels):
        return _overridden(generalized_jsd_loss, (student_logits, teacher_logits, labels), student_logits,
                           teacher_logits, labels, beta=beta, temperature=temperature, reduction=reduction,
                           num_items_in_batch=num_items_in_batch, ignore_index=ignore_index,
                           student_logit_scale=student_logit_scale, teacher_logit_scale=teacher_logit_scale,
                           student_softcap=student_softcap, teacher_softcap=teacher_softcap,
                           return_entropy=return_entropy, vocab_parallel_group=vocab_parallel_group)
    if return_entropy is not False and not isinstance(return_entropy, bool):
        raise TypeError(f"generalized_jsd_loss: return_entropy must be a bool, got {return_entropy!r} "
                        f"({type(return_entropy).__name__})")
    if vocab_parallel_group is not None or _dtensor.vocabulary_split(student_logits, teacher_logits):
        return cast("Tensor | tuple[Tensor, Tensor]", _on_vocabulary_split(
            "generalized_jsd_loss", vocab_parallel_group, student_logits, reduction, num_items_in_batch,
            dict(beta=beta, temperature=temperature, ignore_index=ignore_index, student_logit_scale=student_logit_scale,
                 teacher_logit_scale=teacher_logit_scale, student_softcap=student_softcap,
                 teacher_softcap=teacher_softcap),
            lambda: _vocab_parallel.generalized_jsd_loss(
                student_logits, teacher_logits, labels, group=vocab_parallel_group, beta=beta,
                temperature=temperature, reduction=reduction, num_items_in_batch=num_items_in_batch,
                ignore_index=ignore_index, student_logit_scale=student_logit_scale,
                teacher_logit_scale=teacher_logit_scale, student_softcap=student_softcap,
                teacher_softcap=teacher_softcap, return_entropy=return_entropy)))
    if return_entropy:
        value = generalized_jsd_loss(student_logits, teacher_logits, labels, beta, temperature, reduction,
                                     num_items_in_batch, ignore_index=ignore_index,
                                     student_logit_scale=student_logit_scale, teacher_logit_scale=teacher_logit_scale,
                                     student_softcap=student_softcap, teacher_softcap=teacher_softcap)
        assert isinstance(value, Tensor)
        return value, _student_entropy(student_logits, labels, temperature, ignore_index, student_logit_scale,
                                      student_softcap)
    if not torch.compiler.is_compiling():
        if not isinstance(reduction, str):
            raise TypeError(f"generalized_jsd_loss: reduction must be a str, got {reduction!r} "
                            f"({type(reduction).__name__})")
        _scalars.check("generalized_jsd_loss", beta=beta, temperature=temperature, ignore_index=ignore_index,
                       student_logit_scale=student_logit_scale, teacher_logit_scale=teacher_logit_scale,
                       student_softcap=student_softcap, teacher_softcap=teacher_softcap)
    _family_reduction("generalized_jsd_loss", reduction)
    op = torch.ops.npu_loss.generalized_jsd_loss
    # The op's scalars after the reduction, in its schema's order (csrc/losses.h).
    scalars = (beta, temperature, student_logit_scale, teacher_logit_scale, student_softcap, teacher_softcap,
               ignore_index)
    return _reduced("generalized_jsd_loss", lambda how: op(student_logits, teacher_logits, labels, how, *scalars),
                    reduction, labels, num_items_in_batch, ignore_index, student_logits,
                    (student_logits, teacher_logits, labels), lambda: student_logits.size(-1), "(..., V)")


def fused_linear_jsd_loss(
    student_input: Tensor,
    student_weight: Tensor,
    teacher_input: Tensor,
    teacher_weight: Tensor,
    labels: Tensor | None = None,
    *,
    student_bias: Tensor | None = None,
    teacher_bias: Tensor | None = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    ignore_index: int = -100,
    reduction: str = "batchmean",
    weight_hard_loss: float = 0.0,
    weight_soft_loss: float = 1.0,
    chunk_size: int | None = None,
    return_soft_hard_loss: bool = False,
    student_logit_scale: float = 1.0,
    teacher_logit_scale: float = 1.0,
    student_softcap: float | None = None,
    teacher_softcap: float | None = None,
    return_entropy: bool = False,
    vocab_parallel_group: Any = None,
) -> Tensor | tuple[Tensor, ...]:
    """The generalized JSD between a student's and a teacher's distributions, from their hidden states and
    ``lm_head`` weights, without making the N x V logits (docs/semantics.md, "The fused linear JSD")::

        weight_soft_loss * generalized_jsd_loss(student_input @ student_weight.T + student_bias,
                                                teacher_input @ teacher_weight.T + teacher_bias,
                                                labels, beta, temperature, reduction, ignore_index=ignore_index)
        + weight_hard_loss * cross_entropy(student_input @ student_weight.T + student_bias, labels)

    Each side's logits are transformed first, as ``generalized_jsd_loss`` does (``*_logit_scale``, then
    ``*_softcap``; the hard loss sees the student's transformed logits, untempered). The rows are taken in
    chunks; each chunk's logits are made, used for the loss and every gradient, and overwritten by the next
    chunk's. The cross entropy (the hard loss) is on the untempered student logits,
    summed for ``'sum'`` and otherwise divided by the kept tokens clamped to at least 1, as Liger-Kernel's
    ``LigerFusedLinearJSDLoss`` does: under ``'mean'`` the JSD is divided by K * V (the kept elements) but the
    cross entropy by K.

    Args:
        student_input (Tensor): the student's hidden states, ``(..., H_s)``.
        student_weight (Tensor): its ``lm_head`` weight, ``(V, H_s)``, of the input's dtype.
        teacher_input (Tensor): the teacher's hidden states, ``(..., H_t)``, the same leading shape; ``H_t`` may
            differ from ``H_s``, and the teacher's dtype from the student's.
        teacher_weight (Tensor): ``(V, H_t)``: the same ``V``, of the teacher input's dtype.
        labels (Tensor, optional): integer, of the leading shape; rows whose label is ``ignore_index`` are left
            out. Required when ``weight_hard_loss != 0``. Where the cross entropy is computed (its weight is not 0,
            or ``return_soft_hard_loss``), every kept label must be in ``[0, V)``.
        student_bias, teacher_bias (Tensor, optional): ``(V,)``, of their input's dtype.
        beta (float): in ``[0, 1]``. Default: ``0.5``
        temperature (float): ``> 0``; divides the logits of the JSD, not those of the cross entropy.
            Default: ``1.0``
        ignore_index (int): Default: ``-100``
        reduction (str): ``'batchmean'``, ``'sum'`` or ``'mean'`` (``'none'`` is a ``ValueError``: the gradients
            are made for a scalar loss). Default: ``'batchmean'``
        weight_hard_loss (float): ``>= 0``. Default: ``0.0`` (TRL's use of Liger; Liger's own default is 0.5)
        weight_soft_loss (float): ``>= 0``. Default: ``1.0`` (Liger's own: 0.5)
        chunk_size (int, optional): rows per chunk; by default as many as keep a chunk's buffers within an eighth
            of one N x V tensor of the result's dtype (and 1 GiB); 3/16 on the CPU where the teacher gets no
            gradient and torch makes the products, the teacher's logits then made in halves of the chunk
            (docs/semantics.md).
        return_soft_hard_loss (bool): also return the two parts, unweighted (as Liger does), not differentiable.
        student_logit_scale, teacher_logit_scale, student_softcap, teacher_softcap: the logit transform, as
            ``generalized_jsd_loss`` takes it. A softcap on a side whose gradient is made keeps one chunk of its
            slope, so its chunks take fewer rows.
            Without labels the hard part is 0.
        return_entropy (bool): also return the student's entropy per row, as ``generalized_jsd_loss`` makes it
            (float32, of the leading shape, 0 on dropped rows, no gradient), made from each chunk's logits (on
            the CPU in the kernel's own passes). Default: ``False``
        vocab_parallel_group (ProcessGroup, optional): the vocabulary is split over this group's ranks (Megatron's
            ``ColumnParallelLinear``): each rank passes its contiguous rows ``(V_r, H)`` of both weights (and
            biases), the ranks in group order, and the hidden states whole. Only per-row floats cross the group.
            The hidden states' gradient is then each rank's partial sum: Megatron's ``ColumnParallelLinear``
            all-reduces it in its own backward, so it is not summed here (DTensor weights placed ``Shard(0)``,
            which take this path without the keyword, get it whole: one N x H all-reduce per input).
            Default: ``None``

    Returns:
        The 0-dim loss in the promoted dtype of the two inputs; ``(loss, soft_loss, hard_loss)`` with
        ``return_soft_hard_loss``; the entropy after them with ``return_entropy``: ``(loss, entropy)`` or
        ``(loss, soft_loss, hard_loss, entropy)``.

    Gradients reach both inputs, weights and biases (the teacher's whenever they require grad); they are made
    in the forward, so double backward is not supported.

    Raises:
        ValueError: ``beta``, ``temperature``, the weights, ``reduction`` or ``chunk_size`` out of range; the
            hard loss without labels; a kept label outside ``[0, V)`` where the cross entropy reads it.
        TypeError: a dtype other than float32, bfloat16, float16 (float64 off the NPU), a weight or bias whose
            dtype is not its input's, labels not of an integer dtype.
        RuntimeError: shapes that do not agree (each names the argument), tensors on different devices.
    """
    if not torch.compiler.is_compiling():
        _scalars.check("fused_linear_jsd_loss", reduction=reduction, beta=beta, temperature=temperature,
                       ignore_index=ignore_index, weight_hard_loss=weight_hard_loss,
                       weight_soft_loss=weight_soft_loss, chunk_size=chunk_size,
                       return_soft_hard_loss=return_soft_hard_loss, student_logit_scale=student_logit_scale,
                       teacher_logit_scale=teacher_logit_scale, student_softcap=student_softcap,
                       teacher_softcap=teacher_softcap, return_entropy=return_entropy)
    split = vocab_parallel_group is not None
    if _dtensor.any_dtensor(student_weight, teacher_weight):
        pairs = ((student_weight, student_input), (teacher_weight, teacher_input))
        split = split or _vocab_parallel.vocabulary_split_weights(*pairs)
        if not split:  # FSDP's Shard(0) of the rows, the hidden states sharded alike: gathered once, as TRL does
            student_weight, teacher_weight = (_vocab_parallel.fsdp_gathered(w, h) for w, h in pairs)
            student_bias, teacher_bias = (None if b is None else _vocab_parallel.fsdp_gathered(b, h)
                                          for b, h in ((student_bias, student_input), (teacher_bias, teacher_input)))
    results: tuple[Tensor, Tensor, Tensor, Tensor]
    if split:
        results = _on_vocabulary_split(
            "fused_linear_jsd_loss", vocab_parallel_group, student_input, reduction, None, {},
            lambda: _vocab_parallel.fused_linear_jsd_loss(
                student_input, student_weight, teacher_input, teacher_weight, labels, group=vocab_parallel_group,
                student_bias=student_bias, teacher_bias=teacher_bias, beta=beta, temperature=temperature,
                ignore_index=ignore_index, reduction=reduction, weight_hard_loss=weight_hard_loss,
                weight_soft_loss=weight_soft_loss, chunk_size=chunk_size, student_logit_scale=student_logit_scale,
                teacher_logit_scale=teacher_logit_scale, student_softcap=student_softcap,
                teacher_softcap=teacher_softcap, return_soft_hard_loss=return_soft_hard_loss,
                return_entropy=return_entropy))
    else:
        results = torch.ops.npu_loss.fused_linear_jsd_loss(
            student_input, student_weight, teacher_input, teacher_weight, labels, student_bias, teacher_bias,
            reduction, beta, temperature, student_logit_scale, teacher_logit_scale, student_softcap,
            teacher_softcap, ignore_index, weight_hard_loss, weight_soft_loss, chunk_size, return_soft_hard_loss,
            return_entropy)
    return _returned(results, return_soft_hard_loss, return_entropy)


def sparse_jsd_loss(
    student_logits: Tensor,
    teacher_logprobs: Tensor,
    teacher_token_ids: Tensor,
    labels: Tensor | None = None,
    *,
    support_mask: Tensor | None = None,
    beta: float = 0.0,
    temperature: float = 1.0,
    add_tail: bool = True,
    reduction: str = "batchmean",
    num_items_in_batch: int | float | Tensor | None = None,
    ignore_index: int = -100,
    student_logit_scale: float = 1.0,
    student_softcap: float | None = None,
    vocab_parallel_group: Any = None,
) -> Tensor:
    """The generalized JSD between a student's distribution and a served teacher's sparse one, row by row: the
    teacher gives, for each row, only its top-k log-probabilities and their token ids (a vLLM server's
    ``logprobs``), as TRL 1.16's ``ServerDistillationTrainer`` computes it (docs/semantics.md, "Distillation from
    a served teacher")::

        s = log_softmax(x / temperature)[..., teacher_token_ids]     (x: the student's logits, transformed)
        t = teacher_logprobs
        masked entries: -inf on both sides (they contribute 0)
        add_tail:  s, t get one more entry each, log(1 - sum(exp(.))) (the log of the sum clamped to <= -1e-7)
        otherwise: s, t renormalized over the unmasked entries
        beta == 0: q * (t - s); beta == 1: p * (s - t);
        otherwise: m = log(max((1 - beta) p + beta q, tiny)), beta q (t - m) + (1 - beta) p (s - m)
        (p = exp(s), q = exp(t); each term's NaN made 0, as TRL's nan_to_num), then TRL's reduction

    The student's log-softmax is never made whole: its two statistics per row are, and the gradient w.r.t. the
    student's logits (dense, through the normalizer) is made in the forward, when autograd will need it.

    Args:
        student_logits (Tensor): ``(..., V)``, float32, bfloat16, float16 (float64 off the NPU).
        teacher_logprobs (Tensor): ``(..., K)``, K >= 1, floating: the teacher's log-probabilities at the ids, as
            given (not transformed, not divided by T). Gets a gradient where it requires grad.
        teacher_token_ids (Tensor): ``(..., K)``, integer, in ``[0, V)`` where ``support_mask`` is true (an
            IndexError otherwise, naming the row); the same id twice in a row where the mask is true is a
            ValueError (mask the repeats).
        labels (Tensor, optional): integer, of the leading shape: rows whose label is ``ignore_index`` are left
            out. Default: ``None``
        support_mask (Tensor, optional): bool, ``(..., K)``: the entries that count. Default: ``None`` (all)
        beta (float): in ``[0, 1]``. Default: ``0.0`` (forward KL, TRL's top-k support)
        temperature (float): ``> 0``; divides the student's logits. Default: ``1.0``
        add_tail (bool): the tail bucket (TRL's ``loss_add_tail``), or renormalization. Default: ``True``
        reduction (str): ``'batchmean'`` (the sum over the kept rows' entries divided by their number, at least
            1, or without labels by ``student_logits.size(0)``), ``'sum'``, ``'mean'`` (over the kept rows'
            K + 1 entries, K without the tail, masked ones counted) or ``'none'`` (``(kept, K + 1)`` with
            labels, else ``(..., K + 1)``; K without the tail). Default: ``'batchmean'``
        num_items_in_batch (int, float or Tensor, optional): when given, the sum divided by it, whatever
            ``reduction`` says. Default: ``None``
        ignore_index (int): Default: ``-100``
        student_logit_scale (float), student_softcap (float, optional): the student's logit transform, as
            ``generalized_jsd_loss`` takes it.
        vocab_parallel_group (ProcessGroup, optional): the student's vocabulary is split over this group's ranks,
            as :func:`generalized_jsd_loss` takes it: each rank passes its slice of ``student_logits`` and the
            served teacher's ``(..., K)`` whole, its ids global (each rank reads those in its slice). DTensor logits
            placed ``Shard(-1)`` take the same path without it. Default: ``None``

    Returns:
        The loss, in the promoted dtype of ``student_logits`` and ``teacher_logprobs``.

    Raises:
        ValueError: ``beta``, ``temperature``, the transform, ``reduction`` or ``num_items_in_batch`` out of
            range; an id twice in a row.
        IndexError: an id outside ``[0, V)`` where the mask is true.
        TypeError: a dtype outside the lists above.
        RuntimeError: shapes that do not agree (each names the argument), tensors on different devices.
    """
    if has_torch_function_variadic(student_logits, teacher_logprobs, teacher_token_ids, labels, support_mask):
        return _overridden(sparse_jsd_loss, (student_logits, teacher_logprobs, teacher_token_ids, labels, support_mask),
                           student_logits, teacher_logprobs, teacher_token_ids, labels, support_mask=support_mask,
                           beta=beta, temperature=temperature, add_tail=add_tail, reduction=reduction,
                           num_items_in_batch=num_items_in_batch, ignore_index=ignore_index,
                           student_logit_scale=student_logit_scale, student_softcap=student_softcap,
                           vocab_parallel_group=vocab_parallel_group)
    if vocab_parallel_group is not None or _dtensor.vocabulary_split(student_logits):
        return cast(Tensor, _on_vocabulary_split(
            "sparse_jsd_loss", vocab_parallel_group, student_logits, reduction, num_items_in_batch,
            dict(beta=beta, temperature=temperature, add_tail=add_tail, ignore_index=ignore_index,
                 student_logit_scale=student_logit_scale, student_softcap=student_softcap),
            lambda: _vocab_parallel.sparse_jsd_loss(
                student_logits, teacher_logprobs, teacher_token_ids, labels, group=vocab_parallel_group,
                support_mask=support_mask, beta=beta, temperature=temperature, add_tail=add_tail,
                reduction=reduction, num_items_in_batch=num_items_in_batch, ignore_index=ignore_index,
                student_logit_scale=student_logit_scale, student_softcap=student_softcap)))
    if not torch.compiler.is_compiling():
        if not isinstance(reduction, str):
            raise TypeError(f"sparse_jsd_loss: reduction must be a str, got {reduction!r} ({type(reduction).__name__})")
        _scalars.check("sparse_jsd_loss", beta=beta, temperature=temperature, add_tail=add_tail,
                       ignore_index=ignore_index, student_logit_scale=student_logit_scale,
                       student_softcap=student_softcap)
    _family_reduction("sparse_jsd_loss", reduction)
    op = torch.ops.npu_loss.sparse_jsd_loss
    # The op's scalars after the reduction, in its schema's order (csrc/losses.h).
    scalars = (beta, temperature, add_tail, student_logit_scale, student_softcap, ignore_index)
    tensors = (student_logits, teacher_logprobs, teacher_token_ids, support_mask, labels)
    return _reduced("sparse_jsd_loss", lambda how: op(*tensors, how, *scalars), reduction, labels,
                    num_items_in_batch, ignore_index, student_logits, (student_logits, teacher_logprobs, labels),
                    lambda: teacher_logprobs.size(-1) + (1 if add_tail else 0), "(..., K + 1)")  # K + 1 with the tail


def fused_linear_sparse_jsd_loss(
    student_input: Tensor,
    student_weight: Tensor,
    teacher_logprobs: Tensor,
    teacher_token_ids: Tensor,
    labels: Tensor | None = None,
    *,
    student_bias: Tensor | None = None,
    support_mask: Tensor | None = None,
    beta: float = 0.0,
    temperature: float = 1.0,
    add_tail: bool = True,
    reduction: str = "batchmean",
    num_items_in_batch: int | float | Tensor | None = None,
    ignore_index: int = -100,
    student_logit_scale: float = 1.0,
    student_softcap: float | None = None,
    weight_hard_loss: float = 0.0,
    weight_soft_loss: float = 1.0,
    chunk_size: int | None = None,
    return_soft_hard_loss: bool = False,
    return_entropy: bool = False,
    vocab_parallel_group: Any = None,
) -> Tensor | tuple[Tensor, ...]:
    """:func:`sparse_jsd_loss` from the student's hidden states and ``lm_head`` weight, without making its N x V
    logits (docs/semantics.md, "Distillation from a served teacher")::

        weight_soft_loss * sparse_jsd_loss(student_input @ student_weight.T + student_bias, teacher_logprobs,
                                           teacher_token_ids, labels, support_mask=..., beta=..., ...)
        + weight_hard_loss * cross_entropy(student_input @ student_weight.T + student_bias, labels)

    The rows are taken in chunks, as :func:`fused_linear_jsd_loss` takes them: each chunk's logits are made once
    over the whole vocabulary, and its normalizer, its support's log-probabilities, its gradient and its hard loss
    all come from them before the next chunk overwrites them. The hard loss (cross entropy on the student's
    transformed, untempered logits) is divided as :func:`fused_linear_jsd_loss` divides it.

    Args:
        student_input (Tensor): the student's hidden states, ``(..., H)``.
        student_weight (Tensor): its ``lm_head`` weight, ``(V, H)``, of the input's dtype.
        teacher_logprobs, teacher_token_ids, support_mask: the served teacher, ``(..., K)``, of the input's leading
            shape, as :func:`sparse_jsd_loss` takes them (the ids in ``[0, V)`` where the mask is true, none twice
            in a row).
        labels (Tensor, optional): integer, of the leading shape; rows whose label is ``ignore_index`` are left
            out. Required when ``weight_hard_loss != 0``; where the cross entropy is computed, every kept label
            must be in ``[0, V)``.
        student_bias (Tensor, optional): ``(V,)``, of the input's dtype.
        beta, temperature, add_tail, ignore_index, student_logit_scale, student_softcap: as
            :func:`sparse_jsd_loss` takes them.
        reduction (str): ``'batchmean'``, ``'sum'`` or ``'mean'`` (over the kept rows' K + 1 entries, K without the
            tail); ``'none'`` is a ``ValueError``: the gradients are made for a scalar loss. Default:
            ``'batchmean'``
        num_items_in_batch (int, float or Tensor, optional): when given, both sums (the divergence's and the
            cross entropy's) divided by it, whatever ``reduction`` says. Default: ``None``
        weight_hard_loss (float): ``>= 0``. Default: ``0.0``
        weight_soft_loss (float): ``>= 0``. Default: ``1.0``
        chunk_size (int, optional): rows per chunk; by default as many as keep a chunk's logits within an eighth of
            one N x V tensor of the result's dtype (and 1 GiB).
        return_soft_hard_loss (bool): also return the two parts, unweighted, not differentiable.
        return_entropy (bool): also return the student's entropy per row (float32, of the leading shape, 0 on
            dropped rows, no gradient).
        vocab_parallel_group (ProcessGroup, optional): the student's weight (and bias) split by rows over this
            group, each rank its contiguous rows; the hidden states and the served teacher's ``(..., K)`` whole, its
            ids global. The hidden states' gradient is each rank's partial sum, as :func:`fused_linear_jsd_loss`'s
            (DTensor weights placed ``Shard(0)`` take this path without it and get it whole). Default: ``None``

    Returns:
        The 0-dim loss in the promoted dtype of ``student_input`` and ``teacher_logprobs``; ``(loss, soft_loss,
        hard_loss)`` with ``return_soft_hard_loss``; the entropy after them with ``return_entropy``.

    Gradients reach the input, the weight and the bias, and the teacher's log-probabilities where they require
    grad; they are made in the forward, so double backward is not supported.

    Raises:
        ValueError: a scalar, ``reduction``, ``chunk_size`` or ``num_items_in_batch`` out of range; the hard loss
            without labels; a kept label outside ``[0, V)`` where the cross entropy reads it; an id twice in a row.
        IndexError: an id outside ``[0, V)`` where the mask is true.
        TypeError: a dtype outside the lists of :func:`sparse_jsd_loss`, a weight or bias whose dtype is not the
            input's.
        RuntimeError: shapes that do not agree (each names the argument), tensors on different devices.
    """
    op_name = "fused_linear_sparse_jsd_loss"
    if not torch.compiler.is_compiling():
        _scalars.check(op_name, reduction=reduction, beta=beta, temperature=temperature, add_tail=add_tail,
                       ignore_index=ignore_index, weight_hard_loss=weight_hard_loss,
                       weight_soft_loss=weight_soft_loss, chunk_size=chunk_size,
                       return_soft_hard_loss=return_soft_hard_loss, student_logit_scale=student_logit_scale,
                       student_softcap=student_softcap, return_entropy=return_entropy)
    split = vocab_parallel_group is not None
    if _dtensor.any_dtensor(student_weight):
        split = split or _vocab_parallel.vocabulary_split_weights((student_weight, student_input))
        if not split:  # FSDP's Shard(0), the hidden states sharded alike: gathered once, as TRL does
            student_weight = _vocab_parallel.fsdp_gathered(student_weight, student_input)
            student_bias = None if student_bias is None else _vocab_parallel.fsdp_gathered(student_bias, student_input)
    if split:
        return _returned(_on_vocabulary_split(
            op_name, vocab_parallel_group, student_input, reduction, num_items_in_batch, {},
            lambda: _vocab_parallel.fused_linear_sparse_jsd_loss(
                student_input, student_weight, teacher_logprobs, teacher_token_ids, labels,
                group=vocab_parallel_group, student_bias=student_bias, support_mask=support_mask, beta=beta,
                temperature=temperature, add_tail=add_tail, reduction=reduction,
                num_items_in_batch=num_items_in_batch, ignore_index=ignore_index,
                student_logit_scale=student_logit_scale, student_softcap=student_softcap,
                weight_hard_loss=weight_hard_loss, weight_soft_loss=weight_soft_loss, chunk_size=chunk_size,
                return_soft_hard_loss=return_soft_hard_loss, return_entropy=return_entropy)),
            return_soft_hard_loss, return_entropy)
    if num_items_in_batch is not None:
        _check_num_items(num_items_in_batch, student_input, op_name)
    results: tuple[Tensor, Tensor, Tensor, Tensor] = torch.ops.npu_loss.fused_linear_sparse_jsd_loss(
        student_input, student_weight, teacher_logprobs, teacher_token_ids, labels, student_bias, support_mask,
        "sum" if num_items_in_batch is not None else reduction, beta, temperature, add_tail, student_logit_scale,
        student_softcap, ignore_index, weight_hard_loss, weight_soft_loss, chunk_size, return_soft_hard_loss,
        return_entropy)
    loss, soft, hard, entropy = results
    if num_items_in_batch is not None:
        if isinstance(num_items_in_batch, Tensor):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss, soft, hard = loss / num_items_in_batch, soft / num_items_in_batch, hard / num_items_in_batch
    return _returned((loss, soft, hard, entropy), return_soft_hard_loss, return_entropy)


def _returned(results: tuple[Tensor, Tensor, Tensor, Tensor], return_soft_hard_loss: bool,
              return_entropy: bool) -> Tensor | tuple[Tensor, ...]:
    """A linear form's results as its function returns them: the loss, the two parts, the entropy, as asked."""
    loss, soft, hard, entropy = results
    parts = (soft, hard) if return_soft_hard_loss else ()
    if return_entropy:
        return (loss, *parts, entropy)
    return (loss, *parts) if parts else loss
