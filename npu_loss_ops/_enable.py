"""``npu_loss_ops.enable()``: torch's own loss entry points run this package's ops, routed at the dispatcher.

While a loss is enabled, its ATen ops (``aten::smooth_l1_loss``, ``aten::smooth_l1_loss_backward`` and its
``grad_input`` overload, ``aten::l1_loss``, ``aten::kl_div``) have ``torch.library`` kernels of this module at
the Autograd keys, at the backend keys (so that ``inference_mode``, which skips Autograd, is routed too) and
at FuncTorchBatched (``vmap``), for the CPU, the NPU (PrivateUse1) and the other accelerators. Each kernel
calls the matching ``torch.ops.npu_loss`` op with the same arguments (the schemas are ATen's), so
``F.smooth_l1_loss``, ``nn.SmoothL1Loss``, ``torch.ops.aten.smooth_l1_loss`` and any reference to them taken
before the call all reach the package's kernels and autograd nodes. A call the package's checks would reject
(more than 8 dims, a dtype it does not take, float64 on the NPU, a negative beta, ...) runs the kernel torch
had at that key before, read with ``torch.library.get_kernel`` when the routing was switched on. Nothing is
rebound in Python. The kernels live in one ``torch.library.Library``; ``disable()`` destroys it.

docs/usage.md ("Use it in existing code: enable()") is the user's description.
"""
from __future__ import annotations

import sys
import threading
import warnings
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Callable, Iterable, cast

import torch

__all__ = ["enable", "disable", "is_enabled"]

# The package's rules (docs/validation.md, csrc/core/checks.cpp) that torch does not have: at most 8 dims
# (aclnn's limit, kMaxDims in csrc/core/checks.h) and these dtypes, plus float64 off the NPU.
_MAX_DIMS = 8
_ACCEPTED = (torch.float32, torch.float16, torch.bfloat16)
_STRIDED = torch.strided

# The devices whose backend and Autograd keys are routed: the CPU, the NPU (PrivateUse1) and the
# accelerators where the package's ops run their CompositeExplicitAutograd fallback. Other keys (Meta, XLA,
# nested or sparse tensors' ...) keep torch's kernels.
_BACKENDS = ("CPU", "PrivateUse1", "CUDA", "XPU", "MPS", "HPU")


# ---- the package's checks, cheaply, without calling the op ------------------------------------------------
# Each predicate takes an ATen op's arguments (trailing defaults may be missing: the dispatcher leaves out
# arguments equal to their default) and says whether the npu_loss op would accept them. They follow
# docs/validation.md (csrc/core/checks.cpp) for everything torch itself accepts; where both reject, the call
# goes to torch, which raises its own error, as it did before enable().


def _tensors_ok(npu: str, *tensors: torch.Tensor) -> bool:
    """Same device, strided, at most 8 dims, an accepted dtype (float64 off the NPU), broadcastable.

    Written for speed (it runs on every routed call): the device type, slow to read, only for float64."""
    first = tensors[0]
    device = first.device
    shape = first.shape
    same_shape = True
    for t in tensors:
        dtype = t.dtype
        if dtype not in _ACCEPTED and (dtype != torch.float64 or device.type == npu):
            return False
        if t.layout != _STRIDED or t.dim() > _MAX_DIMS:
            return False
        if t is not first:
            if t.device != device:
                return False
            if same_shape and t.shape != shape:
                same_shape = False
    if same_shape:  # F's calls: it broadcasts input and target itself
        return True
    try:
        _untyped(torch.broadcast_shapes)(*(t.shape for t in tensors))
    except RuntimeError:
        return False
    return True


def _reduction_ok(reduction: int) -> bool:
    return 0 <= reduction <= 2  # ATen takes any int (an unknown one means "none"); the ops take these


def _beta_ok(beta: float) -> bool:
    return beta >= 0  # NaN fails too


def _delta_ok(delta: float) -> bool:
    return delta > 0  # NaN fails too; +inf passes


_ScalarOk = Callable[[float], bool]


def _forward_ok(npu: str, scalar_ok: _ScalarOk | None) -> Callable[..., bool]:
    """The check of a forward (self, target, reduction=1[, scalar=default]), kl_div's log_target as a
    keyword. A missing scalar is its default (beta=1), which passes."""

    def ok(self: torch.Tensor, target: torch.Tensor, reduction: int = 1, *scalar: float, **kwargs: bool) -> bool:
        return (_reduction_ok(reduction) and (scalar_ok is None or not scalar or scalar_ok(scalar[0]))
                and _tensors_ok(npu, self, target))

    return ok


def _backward_ok(npu: str, scalar_ok: _ScalarOk | None) -> Callable[..., bool]:
    """The check of a backward (grad_output, self, target, reduction, scalar[, *, out])."""

    def ok(grad_output: torch.Tensor, self: torch.Tensor, target: torch.Tensor, reduction: int, scalar: float,
           **out: torch.Tensor) -> bool:
        if not (_reduction_ok(reduction) and (scalar_ok is None or scalar_ok(scalar))
                and _tensors_ok(npu, grad_output, self, target)):
            return False
        if not out:
            return True
        # An out= overload: ATen resizes the out tensor and casts into it only where the cast is safe; the
        # package's op does neither. So only an out tensor with the result's shape and dtype (self's) on the
        # same device, strided and not overlapping itself, is routed; anything else gets torch's handling.
        (result,) = out.values()
        return (result.layout == _STRIDED and result.dtype == self.dtype and result.device == self.device
                and list(result.shape) == list(_untyped(torch.broadcast_shapes)(
                    grad_output.shape, self.shape, target.shape))
                and not any(size > 1 and stride == 0 for size, stride in zip(result.shape, result.stride())))

    return ok


def _untyped(f: object) -> Callable[..., Any]:
    """A function torch does not annotate for --strict, callable from annotated code."""
    return cast(Callable[..., Any], f)


# ---- the routing table: one row per loss ------------------------------------------------------------------


@dataclass(frozen=True)
class _Route:
    """One ATen overload, routed to the npu_loss overload of the same name and schema."""

    op: str  # "smooth_l1_loss", "smooth_l1_loss_backward.grad_input", ...
    scalar_ok: _ScalarOk | None = None  # the check of the op's float (beta), if it has one

    def accepts(self, npu: str) -> Callable[..., bool]:
        """The argument check: whether the npu_loss op takes these arguments (`npu`: PrivateUse1's name)."""
        if "_backward" in self.op:
            return _backward_ok(npu, self.scalar_ok)
        return _forward_ok(npu, self.scalar_ok)


# The torch.nn.functional name of each loss -> the ATen overloads it routes. torch 2.13 has no l1_loss or
# kl_div backward op (their autograd formulas are made of other ops), so those rows have the forward only.
_LOSSES: dict[str, tuple[_Route, ...]] = {
    "smooth_l1_loss": (
        _Route("smooth_l1_loss", _beta_ok),
        _Route("smooth_l1_loss_backward", _beta_ok),
        _Route("smooth_l1_loss_backward.grad_input", _beta_ok),
    ),
    "huber_loss": (
        _Route("huber_loss", _delta_ok),
        _Route("huber_loss_backward", _delta_ok),
        _Route("huber_loss_backward.out", _delta_ok),
    ),
    "l1_loss": (_Route("l1_loss"),),
    "kl_div": (_Route("kl_div"),),
}


def _overload(namespace: Any, name: str) -> torch._ops.OpOverload:
    packet, _, overload = name.partition(".")
    op: torch._ops.OpOverload = getattr(getattr(namespace, packet), overload or "default")
    return op


# ---- registration -----------------------------------------------------------------------------------------


def _dispatch_keys() -> list[str]:
    keys = ["FuncTorchBatched"]
    for backend in _BACKENDS:
        keys += [backend, "Autograd" + backend]
    return [key for key in keys if torch._C._parse_dispatch_key(key) is not None]


def _autocast_key(key: str) -> str | None:
    backend = key.removeprefix("Autograd")
    return None if backend == "FuncTorchBatched" else "Autocast" + backend


def _make_kernel(original: Any, ours: torch._ops.OpOverload, accepts: Callable[..., bool],
                 exclude: Any) -> Callable[..., Any]:
    """The kernel at one dispatch key: the package's op when its checks pass, else torch's original kernel.

    ``exclude`` (a DispatchKeySet, or None) is the device's Autocast key when the package's op has an
    Autocast kernel there and ATen's op has none: torch would compute in the inputs' dtype, so the package's
    op must not cast to float32 either."""
    if exclude is None:

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            if accepts(*args, **kwargs):
                return ours(*args, **kwargs)
            return original.call_boxed(keyset, *args, **kwargs)

    else:

        def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
            if accepts(*args, **kwargs):
                with torch._C._ExcludeDispatchKeyGuard(exclude):
                    return ours(*args, **kwargs)
            return original.call_boxed(keyset, *args, **kwargs)

    return kernel


def _register(losses: frozenset[str]) -> torch.library.Library:
    """A new Library holding the kernels of every ATen overload of `losses`, at every routed key."""
    npu = torch._C._get_privateuse1_backend_name()
    library: torch.library.Library = _untyped(torch.library.Library)("aten", "IMPL")
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    try:
        with warnings.catch_warnings():
            # torch warns (once per process) that an ATen kernel is overridden: that is the point here.
            warnings.filterwarnings("ignore", message=r"(?s).*Overriding a previously registered kernel")
            for loss in sorted(losses):
                for route in _LOSSES[loss]:
                    aten = _overload(torch.ops.aten, route.op)
                    ours = _overload(torch.ops.npu_loss, route.op)
                    accepts = route.accepts(npu)
                    # torch's kernels, all read before the first registration: one at a backend key
                    # changes what a CompositeImplicitAutograd op (l1_loss, kl_div) computes at Autograd.
                    originals = {}
                    for key in _dispatch_keys():
                        try:
                            originals[key] = torch.library.get_kernel(aten, key)
                        except RuntimeError:  # torch has no kernel there (an out= overload on CUDA in a
                            pass  # CPU-only build, PrivateUse1 without torch_npu): leave its error alone
                    for key, original in originals.items():
                        autocast = _autocast_key(key)
                        exclude = None
                        if (autocast is not None and hasattr(torch._C.DispatchKey, autocast)
                                and has_kernel(ours._name, autocast) and not has_kernel(aten._name, autocast)):
                            exclude = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, autocast))
                        kernel = _make_kernel(original, ours, accepts, exclude)
                        _untyped(library.impl)(route.op, kernel, key, with_keyset=True)
    except BaseException:
        _untyped(library._destroy)()
        raise
    return library


# ---- the process-wide state -------------------------------------------------------------------------------

_lock = threading.RLock()
_routed: frozenset[str] = frozenset()
_library: torch.library.Library | None = None
_cache_tag_suffix = ""


def _forget_compiled_routing() -> None:
    """After a switch, nothing compiled or cached under the old routing may run again.

    - The Python dispatcher (used while torch.compile traces) caches which key's kernel serves an op; a
      kernel registered at another key than the cached one (ours at AutogradCPU, torch's at Autograd) would
      not be seen, so the routed ATen overloads' caches are cleared.
    - torch._dynamo.reset() drops the compiled frames.
    - The on-disk AOTAutograd and Inductor caches key a graph by Dynamo's graph, which is the same with
      routing on or off (it calls the ATen op), so the routing goes into torch.compiler.config.cache_key_tag,
      which both caches include in their keys.
    """
    global _cache_tag_suffix
    for routes in _LOSSES.values():
        for route in routes:
            cache = getattr(_overload(torch.ops.aten, route.op), "_dispatch_cache", None)
            if cache is not None:
                cache.clear()
    config = torch.compiler.config
    tag: str = config.cache_key_tag
    if _cache_tag_suffix and tag.endswith(_cache_tag_suffix):
        tag = tag[: -len(_cache_tag_suffix)]
    _cache_tag_suffix = f"[npu_loss_ops.enable:{','.join(sorted(_routed))}]" if _routed else ""
    config.cache_key_tag = tag + _cache_tag_suffix
    if "torch._dynamo" in sys.modules:  # otherwise nothing was ever compiled
        torch._dynamo.reset()


def _route(losses: frozenset[str]) -> None:
    """Make `losses` exactly the routed set."""
    global _routed, _library
    with _lock:
        if losses == _routed:
            return
        if _library is not None:
            _untyped(_library._destroy)()
            _library = None
            _routed = frozenset()
        try:
            if losses:
                _library = _register(losses)
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

    After the call, ``torch.nn.functional.smooth_l1_loss``/``l1_loss``/``kl_div``, the ``torch.nn`` loss
    modules, ``torch.ops.aten.*`` for these losses and references to any of them taken before the call run
    the ``torch.ops.npu_loss`` ops and their autograd nodes (``NpuLoss*``), on the CPU, the NPU and other
    devices, under ``no_grad`` and ``inference_mode`` too. Calls the package's checks would reject (more
    than 8 dims, float64 on the NPU, ...) run torch's own kernel. The package's documented differences
    apply (docs/semantics.md), e.g. the KL target gradient is 0 where target == 0.

    Args:
        ops: the losses to route, by their ``torch.nn.functional`` names (``"smooth_l1_loss"``,
            ``"l1_loss"``, ``"kl_div"``); ``None`` routes all of them. The routed set becomes exactly
            these. Any other name raises ``ValueError``.

    Returns:
        A context manager: ``with npu_loss_ops.enable():`` restores, on exit, the routing there was before
        the call (nesting works). Called on its own, the routing stays on.

    Calling it again with the same losses changes nothing. A switch resets ``torch._dynamo``, so functions
    compiled before it are compiled again under the new routing.
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
