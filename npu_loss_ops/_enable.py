"""``npu_loss_ops.enable()``: torch's own loss entry points run this package's ops, routed at the dispatcher.

While a loss is enabled, its ATen ops of the same name and schema (``aten::smooth_l1_loss``,
``aten::smooth_l1_loss_backward`` and its ``grad_input`` overload, ...: each loss's declaration in
csrc/losses.h names them, ``_C._aten_routes()`` lists them) have C++ kernels (csrc/enable/aten_kernels.cpp)
at the Autograd keys, at the backend keys (so that ``inference_mode``, which skips Autograd, is routed too)
and at FuncTorchBatched (``vmap``), for the CPU, the NPU (PrivateUse1) and the other accelerators. Each kernel calls the matching ``torch.ops.npu_loss`` op with the same arguments (the schemas
are ATen's), so ``F.smooth_l1_loss``, ``nn.SmoothL1Loss``, ``torch.ops.aten.smooth_l1_loss`` and any
reference to them taken before the call all reach the package's kernels and autograd nodes. A call the
package's own checks (csrc/core/checks.cpp) reject -- more than 8 dims, a dtype it does not take, float64 on
the NPU, a negative beta, ... -- runs the kernel torch had at that key when the routing was switched on.
Nothing is rebound in Python. This module keeps the switch's state; the kernels live in one runtime
``torch::Library``, which a switch deletes.

docs/usage.md ("Use it in existing code: enable()") is the user's description.
"""
from __future__ import annotations

import sys
import threading
from types import TracebackType
from typing import Any, Callable, Iterable

import torch

from . import _C  # type: ignore[attr-defined]  # compiled: no Python source to check

__all__ = ["enable", "disable", "is_enabled"]


def _routing_table() -> dict[str, tuple[str, ...]]:
    """The torch.nn.functional name of each loss -> the ATen overloads it routes (csrc/enable/aten_kernels.cpp's rows)."""
    table: dict[str, tuple[str, ...]] = {}
    for loss, overload in _C._aten_routes():
        table[loss] = table.get(loss, ()) + (overload,)
    return table


_LOSSES = _routing_table()


def _overload(namespace: Any, name: str) -> torch._ops.OpOverload:
    packet, _, overload = name.partition(".")
    op: torch._ops.OpOverload = getattr(getattr(namespace, packet), overload or "default")
    return op


# ---- the process-wide state -------------------------------------------------------------------------------

_lock = threading.RLock()
_routed: frozenset[str] = frozenset()
_cache_tag_suffix = ""


def _forget_compiled_routing() -> None:
    """After a switch, nothing compiled or cached under the old routing may run again.

    - The Python dispatcher (used while torch.compile traces) caches which key's kernel serves an op; a
      kernel registered at another key than the cached one (ours at AutogradCPU, torch's at Autograd) would
      not be seen, so the routed ATen overloads' caches are cleared.
    - Compiled frames: every frame Dynamo compiles carries a guard on the routing it was compiled under
      (_install_routing_guard), so a switch makes the frames of the other state miss and those of this state
      (compiled before) run again: one compile per frame and routing state, never one per switch. Frames
      compiled before the guard existed are dropped once, by torch._dynamo.reset(), when it is installed;
      where it cannot be installed (a torch whose Dynamo lacks the hook), every switch resets.
    - The on-disk AOTAutograd and Inductor caches key a graph by Dynamo's graph, which is the same with
      routing on or off (it calls the ATen op), so the routing goes into torch.compiler.config.cache_key_tag,
      which both caches include in their keys.
    """
    global _cache_tag_suffix, _guard_state
    for overloads in _LOSSES.values():
        for overload in overloads:
            cache = getattr(_overload(torch.ops.aten, overload), "_dispatch_cache", None)
            if cache is not None:
                cache.clear()
    config = torch.compiler.config
    tag: str = config.cache_key_tag
    if _cache_tag_suffix and tag.endswith(_cache_tag_suffix):
        tag = tag[: -len(_cache_tag_suffix)]
    _cache_tag_suffix = f"[npu_loss_ops.enable:{','.join(sorted(_routed))}]" if _routed else ""
    config.cache_key_tag = tag + _cache_tag_suffix
    if "torch._dynamo" in sys.modules:  # otherwise nothing was ever compiled
        if not _guard_state:
            _guard_state = _install_routing_guard()
            torch._dynamo.reset()  # the frames compiled without the guard
        elif _guard_state == "unavailable":
            torch._dynamo.reset()


# ---- the guard on compiled frames -------------------------------------------------------------------------

# "" before the first switch after torch._dynamo was imported; then "installed", or "unavailable" (every
# switch resets).
_guard_state = ""


def _routing_guard(builder: Any, guard: Any) -> None:
    """A Dynamo guard: the frame runs only while the routing is the one it was compiled under."""
    compiled_under = _routed
    code = [f"npu_loss_ops.enable() routing == {sorted(compiled_under)}"]

    def same_routing(_: Any) -> bool:
        return _routed == compiled_under

    root = builder.guard_manager.root
    try:
        root.add_lambda_guard(same_routing, code, getattr(guard, "user_stack", None))
    except TypeError:  # older torch: no user_stack argument
        root.add_lambda_guard(same_routing, code)


def _install_routing_guard() -> str:
    """Add _routing_guard to the guards Dynamo gives every frame it compiles (its "ambient" guards, those on
    the grad mode and the other global state). Returns the new _guard_state."""
    try:
        from torch._dynamo import output_graph
        from torch._dynamo.source import GlobalStateSource
        from torch._guards import Guard

        # Typed here: some releases leave the method unannotated (mypy --strict's no-untyped-call).
        ambient: Callable[[Any], None] = output_graph.OutputGraph.init_ambient_guards
    except (ImportError, AttributeError):
        return "unavailable"

    def init_ambient_guards(self: Any) -> None:
        ambient(self)
        self.guards.add(Guard(GlobalStateSource(), _routing_guard))

    setattr(output_graph.OutputGraph, "init_ambient_guards", init_ambient_guards)  # noqa: B010 (a method)
    return "installed"


def _route(losses: frozenset[str]) -> None:
    """Make `losses` exactly the routed set."""
    global _routed
    with _lock:
        if losses == _routed:
            return
        try:
            _routed = frozenset()
            _C._set_aten_routes([overload for loss in sorted(losses) for overload in _LOSSES[loss]])
            _routed = losses
        finally:
            _forget_compiled_routing()


def _parse(ops: str | Iterable[str] | None) -> frozenset[str]:
    if ops is None:
        return frozenset(_LOSSES)
    names = (ops,) if isinstance(ops, str) else tuple(ops)
    for name in names:
        if name not in _LOSSES:
            raise ValueError(
                f"npu_loss_ops.enable: unknown loss {name!r}; ops= takes the torch.nn.functional names "
                f"{', '.join(repr(n) for n in _LOSSES)}"
            )
    return frozenset(names)


class _Enabled:
    """What enable() returns: the routing is already on; as a context manager, its exit restores the state
    from before the enable() call."""

    def __init__(self, previous: frozenset[str]) -> None:
        self._previous = previous

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        _route(self._previous)


def enable(ops: str | Iterable[str] | None = None) -> _Enabled:
    """Route torch's own losses to this package's ops, process-wide, until :func:`disable`.

    After the call, ``torch.nn.functional.smooth_l1_loss``/``l1_loss``/``kl_div``/``huber_loss``/``mse_loss``,
    the ``torch.nn`` loss modules, ``torch.ops.aten.*`` for these losses and references to any of them taken
    before the call run
    the ``torch.ops.npu_loss`` ops and their autograd nodes (``NpuLoss*``), on the CPU, the NPU and other
    devices, under ``no_grad`` and ``inference_mode`` too. Calls the package's checks would reject (more
    than 8 dims, float64 on the NPU, ...) run torch's own kernel. The package's documented differences
    apply (docs/semantics.md), e.g. the KL target gradient is 0 where target == 0.

    Args:
        ops: the losses to route, by their ``torch.nn.functional`` names (``"smooth_l1_loss"``,
            ``"l1_loss"``, ``"kl_div"``, ``"huber_loss"``, ``"mse_loss"``); ``None`` routes all of them. The routed set becomes exactly
            these. Any other name raises ``ValueError``.

    Returns:
        A context manager: ``with npu_loss_ops.enable():`` restores, on exit, the routing there was before
        the call (nesting works). Called on its own, the routing stays on.

    Calling it again with the same losses changes nothing. Functions compiled with ``torch.compile`` run
    only under the routing they were compiled under: after a switch they are compiled once more for the
    new routing, and both compilations are kept, so switching back and forth compiles nothing new
    (docs/usage.md, "Compiled code").
    """
    losses = _parse(ops)
    with _lock:
        previous = _routed
        _route(losses)
    return _Enabled(previous)


def disable() -> None:
    """Stop routing: torch's own kernels run again for every loss. Nothing happens if none is routed."""
    _route(frozenset())


def is_enabled(op: str | None = None) -> bool:
    """Whether any loss is routed to this package (``op=None``), or the loss named ``op``."""
    if op is None:
        return bool(_routed)
    if op not in _LOSSES:
        raise ValueError(f"npu_loss_ops.is_enabled: unknown loss {op!r}")
    return op in _routed
