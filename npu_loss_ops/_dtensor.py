"""DTensor sharding rules for every ``torch.ops.npu_loss`` op and out= overload.

With them each op takes DTensor arguments placed ``Shard(d)`` or ``Replicate`` (``Partial`` ones are reduced
first), and its result, and every gradient autograd computes through the ops, equals one process on the
whole tensors; docs/semantics.md, "DTensor", says what a caller sees. The rules are registered with
DTensor's op-strategy API when ``torch.distributed.tensor`` is imported: that import takes about half a
second, more than the rest of ``import npu_loss_ops``, so the package never makes it itself (:func:`install`).
(``torch.distributed.tensor.experimental.register_sharding`` would be the public way, but in torch 2.13 it
leaves an out= tensor out of DTensor's cache key, so a second call with the out tensor placed differently
reuses the first call's rule and fails.)

Every op is elementwise over the broadcast shape of its tensor arguments (the "space"), then reduced to its
result: forwards to 0-dim ("sum", "mean") or not at all ("none"), the gradients w.r.t. self (every
backward op whose declaration says ``grad_of`` is ``self``) not at all, KL's target gradient by a sum to
target's shape. A rule for one mesh dimension either replicates every
argument (always exact: each rank makes the whole call), or shards one dimension ``i`` of the space: each
argument that spans ``i`` (has it at full size) is sharded on its own matching dimension and each one
broadcast along it is replicated, so each rank makes the same call on its slice of the space. The result is
  - ``Shard`` where ``i`` is a dimension of the result: each rank computes its slice;
  - ``Partial("sum")`` where the op sums over ``i``: the sum of the ranks' sums;
  - where "mean" divides by a count that sharding ``i`` shrinks (the space's count, or, for smooth L1's
    backward, ``self.numel()`` when self spans ``i``), a rank divides by its own count, which is right for
    no slice of the result, so that rule is not offered. Where the op also reduces over ``i`` and every rank
    holds the same count (every argument evenly sharded), the mean of the ranks' means is the mean:
    ``Partial("avg")``.
DTensor picks among the rules the one whose input redistribution costs least (none when the arguments
already have its placements) and redistributes the arguments. It never redistributes an out= tensor, so the
rule must give the out tensor's own placement.
"""
from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Literal, cast

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._op_schema import OpSchema, OpStrategy
    from torch.distributed.tensor.placement_types import Placement

__all__ = ["LossRow", "LOSSES", "LinearFormOps", "RowLossOps", "ROW_LOSSES", "any_dtensor", "install", "register"]

_DTENSOR_MODULE = "torch.distributed.tensor"
_NONE, _MEAN = 0, 1  # the ops' reduction enum (at::Reduction)


@dataclass(frozen=True)
class LossRow:
    """What the sharding rules of one loss's ops (forward, backward, the backward's out= overload) need to
    know. The forwards share the rest: their result has the broadcast shape ("none") or is 0-dim, and
    "mean" divides by the broadcast count."""

    forward: str
    """The forward op, e.g. ``"smooth_l1_loss"``."""
    backward: str
    """The backward op, e.g. ``"smooth_l1_loss_backward"``."""
    backward_out: str
    """The overload name of the backward's out= form, e.g. ``"grad_input"``."""
    backward_mean_count: Literal["self", "broadcast"]
    """What the backward's "mean" divides by: ``self.numel()``, or the broadcast count of its arguments."""
    backward_result: Literal["broadcast", "target"]
    """The backward's result shape: the broadcast shape, or target's (summed over the broadcast dims)."""


def _rows() -> tuple[LossRow, ...]:
    """One row per elementwise loss, read from its declaration (csrc/losses.h, through ``_C._losses()``)."""
    from . import _C  # type: ignore[attr-defined]  # compiled: no Python source to check

    return tuple(
        LossRow(
            d["forward"],
            d["backward"],
            d["out_overload"],
            "self" if d["mean_count"] == "self" else "broadcast",
            "target" if d["grad_of"] == "target" else "broadcast",
        )
        for d in _C._losses()
        if d["kind"] == "elementwise"
    )


LOSSES: tuple[LossRow, ...] = _rows()


@dataclass(frozen=True)
class _OpShape:
    """One op's signature and result, as its rules see them."""

    tensors: int
    """How many leading arguments are tensors; the reduction follows them."""
    forward: bool
    """A forward loss: its result is 0-dim unless the reduction is "none"."""
    result_like: int | None
    """The argument whose shape the result has, or None for the broadcast shape."""
    mean_count: int | None
    """The argument whose numel "mean" divides by, or None for the broadcast count."""
    out: str | None
    """The out= argument's name, for an out= overload."""


def _ops_of(row: LossRow) -> list[tuple[torch._ops.OpOverload, _OpShape]]:
    ops = torch.ops.npu_loss
    forward = getattr(ops, row.forward).default
    backward = getattr(ops, row.backward)
    backward_out = getattr(backward, row.backward_out)
    out_name = next(a.name for a in backward_out._schema.arguments if a.is_out)
    result_like = None if row.backward_result == "broadcast" else 2
    mean_count = 1 if row.backward_mean_count == "self" else None
    return [
        (forward, _OpShape(2, True, None, None, None)),
        (backward.default, _OpShape(3, False, result_like, mean_count, None)),
        (backward_out, _OpShape(3, False, result_like, mean_count, out_name)),
    ]


def _spans(shape: Sequence[int], space: Sequence[int], i: int) -> int | None:
    """The dimension of a tensor of `shape` that is dimension `i` of the broadcast `space` at full size, or
    None when the tensor is broadcast along it (absent there, or of size 1)."""
    j = i - (len(space) - len(shape))
    return j if j >= 0 and shape[j] == space[i] else None


def _broadcast(shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The broadcast shape of `shapes` (which broadcast: DTensor has run the op's fake kernel on them)."""
    ndim = max(len(s) for s in shapes)
    space = [1] * ndim
    for shape in shapes:
        for j, extent in enumerate(shape):
            if extent != 1:
                space[ndim - len(shape) + j] = extent
    return tuple(space)


def _rules(op: _OpShape, shapes: Sequence[Sequence[int]], reduction: int) -> list[list[Placement | None]]:
    """The rules for one mesh dimension: per rule the result's placement, then each tensor argument's (an
    out= tensor last, with the result's)."""
    from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

    space = _broadcast(shapes)
    reduced = op.forward and reduction != _NONE
    # Replicating everything first: of equally cheap rules DTensor keeps the first.
    rules: list[list[Placement | None]] = [[Replicate()] * (1 + len(shapes) + (op.out is not None))]
    for i, extent in enumerate(space):
        if extent <= 1:
            continue
        inputs: list[Placement | None] = []
        for shape in shapes:
            j = _spans(shape, space, i)
            inputs.append(Replicate() if j is None else Shard(j))
        count_shrinks = reduction == _MEAN and (
            op.mean_count is None or isinstance(inputs[op.mean_count], Shard)
        )
        if reduced:
            r = None
        elif op.result_like is None:
            r = i
        else:
            r = _spans(shapes[op.result_like], space, i)
        result: Placement
        if r is not None:
            if count_shrinks:
                continue
            result = Shard(r)
        elif count_shrinks:
            result = Partial("avg")  # kept by _equal_counts only where every rank's count is the same
        else:
            result = Partial("sum")
        rules.append([result, *inputs, *([result] if op.out is not None else [])])
    return rules


def _equal_counts(
    shapes: Sequence[torch.Size],
    inputs: list[DTensorSpec],
    output: DTensorSpec | tuple[DTensorSpec | None, ...] | None,
) -> bool:
    """A Partial("avg") result is the mean only when every rank divided by the same count: when every
    argument (of these `shapes`, in the order of `inputs`) is evenly sharded, so that each rank holds slices
    of the same shapes. (The shapes come from the op schema: torch 2.9 gives the specs no tensor_meta.)"""
    from torch.distributed.tensor._ops.utils import is_tensor_evenly_shardable
    from torch.distributed.tensor.placement_types import Partial

    assert output is not None and not isinstance(output, tuple)  # each op has one result
    if not any(isinstance(p, Partial) and p.reduce_op == "avg" for p in output.placements):
        return True
    return all(is_tensor_evenly_shardable(shape, spec) for shape, spec in zip(shapes, inputs))


def _keeps_placements(
    placements: tuple[Placement, ...],
    shapes: Sequence[torch.Size],
    inputs: list[DTensorSpec],
    output: DTensorSpec | tuple[DTensorSpec | None, ...] | None,
) -> bool:
    """_equal_counts, for a rule whose result must have `placements` (an out= tensor's)."""
    assert output is not None and not isinstance(output, tuple)  # each op has one result
    return tuple(output.placements) == placements and _equal_counts(shapes, inputs, output)


def _placements(spec: object) -> tuple[Placement, ...]:
    """The placements of a DTensor argument as an op schema holds it: a DTensorSpec, or an OpStrategy of one."""
    from torch.distributed.tensor._op_schema import OpStrategy

    if isinstance(spec, OpStrategy):
        spec = spec.strategies[0].output_spec
    return tuple(getattr(spec, "placements"))


def _strategy(op: _OpShape) -> Callable[[OpSchema], OpStrategy]:
    def strategy(op_schema: OpSchema) -> OpStrategy:
        from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

        shapes = [s.shape for s in op_schema.args_strategy[: op.tensors]]
        # A forward called with its default reduction reaches DTensor without it.
        args = op_schema.args_schema
        reduction = args[op.tensors] if len(args) > op.tensors else _MEAN
        assert isinstance(reduction, int)
        rules = _rules(op, shapes, reduction)
        # The arguments the rules place: the tensors, then an out= tensor (a keyword argument). torch 2.9's
        # OpSchema has no kwargs_strategy and leaves the out= tensor out of them.
        placed = tuple(op_schema.args_strategy) + tuple(getattr(op_schema, "kwargs_strategy", ()))
        arg_shapes = [s.shape for s in placed]
        valid: Callable[[list[DTensorSpec], DTensorSpec | tuple[DTensorSpec | None, ...] | None], bool] = (
            functools.partial(_equal_counts, arg_shapes)
        )
        if op.out is not None:
            # Only the rules whose result has the out= tensor's placements are valid: torch 2.9 and 2.10 give
            # the out= tensor the chosen rule's result placement without redistributing or checking it.
            if len(placed) == op.tensors:
                rules = [rule[:-1] for rule in rules]  # torch 2.9: the rules go without their out= entry
            valid = functools.partial(_keeps_placements, _placements(op_schema.kwargs_schema[op.out]), arg_shapes)

        try:
            result = expand_to_full_mesh_op_strategy(
                op_schema.get_mesh_from_args(), op_schema, rules, input_index=1
            )
            # Filtered here rather than by the function's own filter argument, which torch 2.14 renamed
            # (is_valid_strategy_cb -> full_mesh_strategy_filter).
            result.strategies = [s for s in result.strategies if valid(list(s.input_specs or ()), s.output_specs)]
        except RuntimeError as exc:
            # torch 2.14 itself drops the rules that would move an out= tensor, and raises when none is left.
            if op.out is None or "no valid sharding strategy" not in str(exc):
                raise
            result = None
        if result is None or not result.strategies:
            # Only an out= tensor, which DTensor never redistributes, can rule out every rule.
            raise RuntimeError(
                f"{op_schema.op}: no sharding gives {op.out} its placements exactly for these arguments "
                f"(reduction {reduction}); a Replicate {op.out} always works"
            )
        return result

    return strategy


_Register = Callable[..., Callable[[Callable[["OpSchema"], "OpStrategy"]], object]]


def _register_op_strategy() -> _Register:
    """DTensor's op-strategy registration decorator: in ``_ops/utils.py``, or ``_ops/registration.py`` in torch
    2.10 (found by name, so that the type checker accepts either release)."""
    for name in ("torch.distributed.tensor._ops.utils", "torch.distributed.tensor._ops.registration"):
        try:
            found = getattr(importlib.import_module(name), "register_op_strategy", None)
        except ImportError:
            continue
        if found is not None:
            return cast(_Register, found)
    raise ImportError("torch.distributed.tensor has no register_op_strategy")


# ---- the row losses (csrc/losses.h's LossKind::Rows: the distillation family) ----------------------------------
#
# Their ops read rows of logits (..., V). A rule shards one leading (token) dimension of both logits and of
# the labels alike, or replicates all: each rank then computes its own rows. The result is Partial("sum") for
# "sum", and Shard for 'none' without labels, for the gradients and for the row scales. Where a count that depends on every
# rank's rows divides ("mean", whose count of kept rows differs from rank to rank; 'none' with labels, whose
# row count does), only replication is offered, which DTensor reaches by gathering the logits: the Python
# function divides the sum itself ('batchmean' and 'mean' as sum / count, a DTensor division), so that its
# rows stay sharded. Logits sharded on the vocabulary dimension are refused by the ops with a clear error (each rank
# would need the whole row's softmax); the Python functions compute that split themselves (_vocab_parallel.py).


@dataclass(frozen=True)
class LinearFormOps:
    """The two ops of a row loss's linear form (hidden states and lm_head weights in, the logits never made)."""

    forward: str
    with_grads: str
    weights: tuple[tuple[str, int], ...]
    """Each lm_head weight's name and position (a served teacher's side has none: its places hold its values,
    ids and mask, csrc/losses.h's LinearForm)."""


@dataclass(frozen=True)
class RowLossOps:
    """The ops of one row loss, from its declaration."""

    forward: str
    with_grads: str
    backward: str
    logits: tuple[str, str]
    inputs: int = 0  # the declared inputs without a gradient, after the logits (each of the teacher's shape)
    linear: LinearFormOps | None = None


def _row_losses() -> tuple[RowLossOps, ...]:
    from . import _C  # type: ignore[attr-defined]  # compiled: no Python source to check

    return tuple(
        RowLossOps(d["forward"], d["with_grads"], d["backward"], (d["logits"][0], d["logits"][1]), len(d["inputs"]),
                   None if d["linear"] is None else LinearFormOps(
                       d["linear"]["forward"], d["linear"]["with_grads"],
                       tuple(zip(d["linear"]["weights"], (1, 3)))[:1 if d["teacher"] == "support" else 2]))
        for d in _C._losses()
        if d["kind"] == "rows"
    )


ROW_LOSSES: tuple[RowLossOps, ...] = _row_losses()


def _row_strategy(row: RowLossOps, which: str) -> Callable[[OpSchema], OpStrategy]:
    """The rules of a row loss's op: which is "forward", "with_grads" or "backward"."""

    def strategy(op_schema: OpSchema) -> OpStrategy:
        from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
        from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

        args = op_schema.args_schema
        first = 1 if which == "backward" else 0  # grad_output comes before the logits
        logits_shape = op_schema.args_strategy[first].shape
        # The inputs without a gradient given (an optional one may be None), then the labels and the reduction.
        given = sum(a is not None for a in args[first + 2:first + 2 + row.inputs])
        after = first + 2 + row.inputs
        labels = args[after] is not None
        reduction = args[after + 1] if len(args) > after + 1 else _MEAN
        mask: Sequence[bool] = cast("Sequence[bool]", args[-1]) if which != "forward" else ()
        vocab_dim = len(logits_shape) - 1
        for name, k in zip(row.logits, (first, first + 1)):
            refuse_vocabulary_split(row.forward, name, _placements(args[k]), len(logits_shape), False)
        tensors = 2 + given + labels + (which == "backward")
        outputs = {"forward": 1, "with_grads": 4, "backward": 2}[which]
        rules: list[list[Placement | None]] = [[Replicate()] * (outputs + tensors)]
        per_rank_count = reduction == _MEAN or (reduction == _NONE and labels)
        for i in range(vocab_dim):
            if per_rank_count or logits_shape[i] <= 1:
                continue
            inputs: list[Placement | None] = [Shard(i)] * (2 + given)
            if labels:
                inputs.append(Shard(i))
            if which == "backward":
                inputs.insert(0, Shard(i) if reduction == _NONE else Replicate())
            loss: Placement = Shard(i) if reduction == _NONE else Partial("sum")
            grads: list[Placement | None] = [Shard(i) if wanted else Replicate() for wanted in mask]
            result: list[Placement | None] = [loss] if which != "backward" else []
            if which != "forward":
                result += grads
            if which == "with_grads":
                result.append(Shard(i))  # the row scales: one per row, of the leading shape
            rules.append(result + inputs)
        return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema, rules, input_index=outputs)

    return strategy


# A linear form's ops: every tensor replicated (DTensor gathers sharded hidden states first), the results
# replicated. A weight sharded on its vocabulary dimension (dim 0) is refused with a clear error: each rank would
# need the whole row's softmax.


def refuse_vocabulary_split(op: str, name: str, placements: Sequence[Placement], ndim: int, weight: bool) -> None:
    """A ValueError when `placements` shard the vocabulary dimension of `name`: the last of logits of `ndim`
    dimensions, the first of an lm_head weight (`weight`): the ops themselves (torch.ops.npu_loss.*) make each
    row's statistics from a whole row. The Python functions compute such a split before any op is reached
    (npu_loss_ops/_vocab_parallel.py)."""
    from torch.distributed.tensor.placement_types import Shard

    vocab_dim = 0 if weight else ndim - 1
    for placement in placements:
        if isinstance(placement, Shard) and placement.dim % ndim == vocab_dim:
            advice = ("replicate it (the hidden states may be sharded: they are gathered)" if weight else
                      "shard a token dimension of the logits (and of labels) instead, or replicate them")
            raise ValueError(f"{op}: {name} is sharded on the vocabulary dimension ({placement}); {advice}")


def _linear_strategy(linear: LinearFormOps, outputs: int) -> Callable[[OpSchema], OpStrategy]:
    def strategy(op_schema: OpSchema) -> OpStrategy:
        from torch.distributed.tensor._op_schema import OpStrategy
        from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
        from torch.distributed.tensor.placement_types import Replicate, Shard

        args = op_schema.args_schema
        for name, k in linear.weights:
            refuse_vocabulary_split(linear.forward, name, _placements(args[k]), 2, True)
        tensors = sum(isinstance(a, OpStrategy) for a in args)
        rules: list[list[Placement | None]] = [[Replicate()] * (outputs + tensors)]
        return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema, rules, input_index=outputs)

    return strategy


def register() -> None:
    """Registers the rules of every op in `LOSSES` and `ROW_LOSSES` with DTensor (imports
    torch.distributed.tensor)."""
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

    register_op_strategy = _register_op_strategy()
    for row in LOSSES:
        for overload, op in _ops_of(row):
            # DTensor caches a rule per argument placements and shapes, plus what schema_info names: the
            # reduction and the scalars after it, and the out= tensor's placement.
            schema_info = RuntimeSchemaInfo(op.tensors, [op.out] if op.out is not None else None)
            register_op_strategy(overload, schema_info)(_strategy(op))
    for row_loss in ROW_LOSSES:
        for which, name, first_scalar in (("forward", row_loss.forward, 2), ("with_grads", row_loss.with_grads, 2),
                                          ("backward", row_loss.backward, 3)):
            # The labels (possibly None) and every argument after them are part of the cache key.
            register_op_strategy(getattr(torch.ops.npu_loss, name).default,
                                 RuntimeSchemaInfo(first_scalar))(_row_strategy(row_loss, which))
        if row_loss.linear is not None:
            # The labels, the biases and every argument after them are part of the cache key; each op's results
            # are counted from its schema (csrc/core/schema.h).
            for name in (row_loss.linear.forward, row_loss.linear.with_grads):
                overload = getattr(torch.ops.npu_loss, name).default
                outputs = len(overload._schema.returns)
                register_op_strategy(overload, RuntimeSchemaInfo(4))(_linear_strategy(row_loss.linear, outputs))


def _register_or_warn() -> None:
    try:
        register()
    except Exception as exc:  # a DTensor API that changed must not break the user's import of it
        warnings.warn(
            f"npu_loss_ops: registering the DTensor sharding rules failed ({type(exc).__name__}: {exc}); "
            "npu_loss ops on DTensors will raise",
            RuntimeWarning,
            stacklevel=2,
        )


class _ThenRegister(importlib.abc.Loader):
    """torch.distributed.tensor's own loader, registering the rules once the module has run."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The module keeps its own loader, as if this one had never been there.
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _register_or_warn()


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Finds torch.distributed.tensor with the other finders and has its loader register the rules; removes
    itself on that first import."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _DTENSOR_MODULE:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            spec: importlib.machinery.ModuleSpec | None = (
                find_spec(fullname, path, target) if find_spec is not None else None
            )
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _ThenRegister(spec.loader)
                return spec
        return None


def any_dtensor(*tensors: object) -> bool:
    """Whether any argument is a DTensor (never imports torch.distributed.tensor: without it, none can be)."""
    module = sys.modules.get(_DTENSOR_MODULE)
    return module is not None and any(isinstance(t, module.DTensor) for t in tensors)


def vocabulary_split(*logits: object) -> bool:
    """Whether any argument is a DTensor whose last (vocabulary) dimension is sharded: the family's functions then
    compute on the split (npu_loss_ops/_vocab_parallel.py)."""
    module = sys.modules.get(_DTENSOR_MODULE)
    return module is not None and any(
        isinstance(t, module.DTensor) and any(p.is_shard() and p.dim % t.dim() == t.dim() - 1 for p in t.placements)
        for t in logits)


def install() -> None:
    """Registers the rules now if torch.distributed.tensor is imported, else as soon as it is."""
    if not torch.distributed.is_available():
        return
    if _DTENSOR_MODULE in sys.modules:
        _register_or_warn()
    elif not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport())
