"""TRL's distillation losses on this package's kernels, and the switch that puts them into TRL's trainers
(docs/usage.md, "Distillation with TRL's trainers").

This module imports without ``trl``; only :func:`patch` and the DeepSpeed gather need it.

- :func:`chunked_divergence_loss` has the signature and the return of TRL 1.16's
  ``trl.trainer.distillation_trainer._chunked_divergence_loss`` (``DistillationTrainer``'s loss), computed by
  :func:`npu_loss_ops.fused_linear_jsd_loss` with ``return_entropy=True``: the logits are never made.
- :func:`generalized_jsd_loss` is :func:`npu_loss_ops.generalized_jsd_loss` (``GKDTrainer``'s loss).
- :func:`server_compute_loss` is ``ServerDistillationTrainer.compute_loss`` (the served teacher's trainer, in
  ``trl.experimental.server_distillation``) from the student's output to the loss on
  :func:`npu_loss_ops.sparse_jsd_loss`: the student's full ``log_softmax`` is never made.
- :func:`patch` swaps the three into TRL, as a call or as a context manager, and its handle restores TRL's own.

``call_counts`` counts the calls TRL made through the swapped-in functions, by name.
"""
from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from collections import Counter
from types import TracebackType
from typing import Any, Callable, cast

import torch
from torch import Tensor

from . import functional

__all__ = ["chunked_divergence_loss", "generalized_jsd_loss", "server_compute_loss", "patch", "Patch", "call_counts"]

# How many times TRL called each function through the swap (chunked_divergence_loss, generalized_jsd_loss).
call_counts: Counter[str] = Counter()

generalized_jsd_loss = functional.generalized_jsd_loss


def _compute_dtype(hidden: Tensor) -> torch.dtype:
    """The dtype TRL projects in (``trl/kernels/chunked_divergence.py``): autocast's where it is enabled on the
    hidden states' device, else theirs."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return hidden.dtype


def _gather_lm_head(*params: Tensor | None) -> contextlib.AbstractContextManager[Any]:
    """TRL's ``maybe_gather_lm_head_ctx`` (DeepSpeed ZeRO-3 gathers the partitioned heads for the call) where
    ``trl`` has it imported (its trainers import it; a process without them has no ZeRO-3 heads of TRL's to
    gather, and importing trl here would cost seconds), else nothing to do."""
    utils = sys.modules.get("trl.trainer.utils")
    gather = getattr(utils, "maybe_gather_lm_head_ctx", None)
    if gather is None:
        return contextlib.nullcontext()
    return cast(contextlib.AbstractContextManager[Any], gather(*params))


def _whole_head(weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    """An FSDP2 ``DTensor`` head made whole once, as TRL does (one all-gather, in ``full_tensor()``'s backward
    the one reduce-scatter), cast to the hidden states' dtype."""
    module = sys.modules.get("torch.distributed.tensor")  # not imported: no DTensor exists
    if module is not None and isinstance(weight, module.DTensor):
        weight = cast(Any, weight).full_tensor().to(dtype)
        if bias is not None and isinstance(bias, module.DTensor):
            bias = cast(Any, bias).full_tensor()
    return weight, bias


def _vocabulary_mesh_dim(weights: tuple[Tensor, Tensor], biases: tuple[Tensor | None, Tensor | None],
                         hidden: tuple[Tensor, Tensor]) -> int | None:
    """The mesh dimension over which both heads' rows are split by tensor parallelism (ColwiseParallel's
    ``Shard(0)``), or None. TRL's hidden states are plain tensors: where they are the same on every rank of that
    dimension (two floats per rank and side compared, one all-gather), the rows split the vocabulary and the loss is
    computed on the split; where they differ, the ranks hold different tokens and the rows are FSDP's, gathered once
    as TRL gathers them (docs/usage.md, "Distributed distillation"). Heads whose biases are not split alike, or a
    mesh dimension of one rank, are gathered as TRL gathers them too."""
    module = sys.modules.get("torch.distributed.tensor")
    if module is None or not all(isinstance(w, module.DTensor) for w in weights):
        return None
    w_s, w_t = cast(Any, weights[0]), cast(Any, weights[1])
    dims = [i for i, p in enumerate(w_s.placements) if p.is_shard() and p.dim % 2 == 0]
    if len(dims) != 1 or w_t.device_mesh != w_s.device_mesh or tuple(w_t.placements) != tuple(w_s.placements):
        return None
    if any(b is not None and not (isinstance(b, module.DTensor) and cast(Any, b).placements[dims[0]].is_shard())
           for b in biases):
        return None
    import torch.distributed as dist

    group = w_s.device_mesh.get_group(dims[0])
    if dist.get_world_size(group) == 1:
        return None
    mine = torch.stack([torch.stack([h.detach().double().sum(), h.detach().double().square().sum()])
                        for h in hidden]).reshape(-1).cpu()
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    return dims[0] if all(bool(torch.equal(e, mine)) for e in every) else None


def chunked_divergence_loss(
    student_hidden_states: Tensor,
    teacher_hidden_states: Tensor,
    student_lm_head_weight: Tensor,
    teacher_lm_head_weight: Tensor,
    completion_mask: Tensor,
    beta: float,
    num_items_in_batch: Tensor | int | None = None,
    student_lm_head_bias: Tensor | None = None,
    teacher_lm_head_bias: Tensor | None = None,
    student_logit_scale: float = 1.0,
    teacher_logit_scale: float = 1.0,
    student_final_logit_softcapping: float | None = None,
    teacher_final_logit_softcapping: float | None = None,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor, Tensor]:
    """TRL 1.16's ``_chunked_divergence_loss``, argument for argument and result for result, on
    :func:`npu_loss_ops.fused_linear_jsd_loss`.

    The student's and the teacher's hidden states ``(B, K, H_s)`` and ``(B, K, H_t)`` are projected by their
    ``lm_head`` weights ``(V, H)`` (and biases) chunk by chunk; each side's logits are multiplied by its logit
    scale, softcapped where a softcap is given, and divided by ``temperature``; the generalized JSD of each
    position whose ``completion_mask`` is not 0 is summed.

    Returns:
        ``(loss, entropy_sum, n_valid)``: the sum divided by ``n_valid`` clamped to at least 1, or by
        ``num_items_in_batch`` when given (float32, as TRL's; float64 for float64 inputs); the sum of the
        student's entropy over the kept positions (float32, no gradient); and the number of kept positions
        (int64).

    Only the student's side gets gradients (the teacher's is detached). Under autocast the projections run in
    autocast's dtype, as TRL's do. FSDP2 ``DTensor`` heads are gathered with one ``full_tensor()``; DeepSpeed
    ZeRO-3 heads inside TRL's ``maybe_gather_lm_head_ctx``. Where TRL projects in float32 tiles of bfloat16
    inputs, the package computes the logits in the inputs' dtype and the rest in float32: the loss agrees within
    bfloat16's tolerance there, and within float32's rounding in float32.
    """
    split = _vocabulary_mesh_dim((student_lm_head_weight, teacher_lm_head_weight),
                                 (student_lm_head_bias, teacher_lm_head_bias),
                                 (student_hidden_states, teacher_hidden_states))
    if split is None:
        student_lm_head_weight, student_lm_head_bias = _whole_head(
            student_lm_head_weight, student_lm_head_bias, student_hidden_states.dtype)
        teacher_lm_head_weight, teacher_lm_head_bias = _whole_head(
            teacher_lm_head_weight, teacher_lm_head_bias, teacher_hidden_states.dtype)
    valid = completion_mask.reshape(-1) != 0
    n_valid = valid.sum()
    # The package's rows: the kept positions' label 0, the others' ignore_index (only which rows count is read).
    labels = torch.where(valid, 0, -100)
    s_dtype, t_dtype = _compute_dtype(student_hidden_states), _compute_dtype(teacher_hidden_states)
    h_s = student_hidden_states.reshape(-1, student_hidden_states.size(-1))
    h_t = teacher_hidden_states.detach().reshape(-1, teacher_hidden_states.size(-1))
    if split is not None:  # tensor parallel: the same tokens on every rank, replicated DTensors beside the heads
        from torch.distributed.tensor import DTensor, Replicate

        mesh = cast(Any, student_lm_head_weight).device_mesh
        replicated = [Replicate()] * mesh.ndim
        h_s, h_t, labels = (DTensor.from_local(x, mesh, replicated, run_check=False) for x in (h_s, h_t, labels))
    with _gather_lm_head(student_lm_head_weight, student_lm_head_bias), \
            _gather_lm_head(teacher_lm_head_weight, teacher_lm_head_bias), \
            torch.autocast(h_s.device.type, enabled=False):
        w_s = student_lm_head_weight.to(s_dtype)
        b_s = None if student_lm_head_bias is None else student_lm_head_bias.to(s_dtype)
        w_t = teacher_lm_head_weight.detach().to(t_dtype)
        b_t = None if teacher_lm_head_bias is None else teacher_lm_head_bias.detach().to(t_dtype)
        total, entropy = functional.fused_linear_jsd_loss(
            h_s.to(s_dtype), w_s, h_t.to(t_dtype), w_t, labels, student_bias=b_s, teacher_bias=b_t, beta=beta,
            temperature=temperature, reduction="sum", student_logit_scale=student_logit_scale,
            teacher_logit_scale=teacher_logit_scale, student_softcap=student_final_logit_softcapping,
            teacher_softcap=teacher_final_logit_softcapping, return_entropy=True)
    if split is not None:
        total, entropy = cast(Any, total).to_local(), cast(Any, entropy).to_local()
    loss = total if total.dtype == torch.float64 else total.float()
    if num_items_in_batch is None:
        # Clamped so that a rank whose positions are all masked gives 0, not 0 / 0 (as TRL).
        loss = loss / n_valid.clamp(min=1)
    else:
        if isinstance(num_items_in_batch, Tensor):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss, entropy.sum(), n_valid


def _server_support(trainer: Any, teacher_result: dict[str, Tensor], completion_tokens: Tensor,
                    labels: Tensor, student_logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The support TRL 1.16's served-teacher trainer builds, as (log-probabilities, ids, mask), each (B, T, K):
    at beta 0 the teacher's top-k (an entry the server left at -inf masked); at 0 < beta < 1 the teacher's top-1
    and the sampled token, the second masked where the two agree; at beta 1 the sampled token alone. With TRL's
    checks of what the server must have sent for the rows the labels keep, and their messages."""
    top_logprobs, top_ids = teacher_result["topk_logprobs"], teacher_result["topk_token_ids"]
    if trainer.beta == 0:
        return top_logprobs, top_ids, top_logprobs > float("-inf")
    actual = teacher_result["actual_logprobs"]
    required = labels != -100
    missing = required & ~torch.isfinite(actual)
    if missing.any():
        raise ValueError("Teacher server is missing actual-token logprobs for required reverse-KL positions: "
                         f"{int(missing.sum().item())}/{int(required.sum().item())}.")
    sampled = trainer._get_reverse_kl_top_1_tokens(student_logits, completion_tokens)
    if trainer.beta == 1:
        return actual.unsqueeze(-1), sampled.unsqueeze(-1), torch.ones_like(sampled, dtype=torch.bool).unsqueeze(-1)
    top1 = top_logprobs.squeeze(-1)
    missing = required & ~torch.isfinite(top1)
    if missing.any():
        raise ValueError("Teacher server is missing top-1 logprobs for required forward-KL positions: "
                         f"{int(missing.sum().item())}/{int(required.sum().item())}.")
    top1_ids = top_ids.squeeze(-1)
    ids = torch.stack([top1_ids, sampled], -1)
    mask = torch.stack([torch.ones_like(sampled, dtype=torch.bool), sampled != top1_ids], -1)
    return torch.stack([top1, actual], -1), ids, mask


def server_compute_loss(self: Any, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                        num_items_in_batch: Any = None) -> Any:
    """TRL 1.16's ``ServerDistillationTrainer.compute_loss``, step for step up to the student's logits, then
    :func:`npu_loss_ops.sparse_jsd_loss` on the support TRL builds (:func:`_server_support`) instead of the full
    ``log_softmax`` and TRL's gather: the same loss with the trainer's ``beta``, ``temperature`` and
    ``loss_add_tail``, reduced as TRL reduces it ('batchmean' over the completion tokens the labels keep, not by
    ``num_items_in_batch``), then divided by the gradient-accumulation steps in training, as TRL does."""
    prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
    completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    completion_labels = torch.where(completion_mask.bool(), completion_ids, torch.full_like(completion_ids, -100))
    labels = torch.cat([torch.full_like(prompt_ids, -100), completion_labels], dim=1)
    inputs = {**inputs, "input_ids": input_ids, "attention_mask": attention_mask, "labels": labels,
              "prompt_attention_mask": prompt_mask}
    student_outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    prompt_length = self._compute_prompt_length(inputs)
    labels = inputs["labels"][:, prompt_length:]
    completion_tokens = inputs["input_ids"][:, prompt_length:]
    teacher_result = self._get_teacher_token_logprobs_from_server(inputs, prompt_length)
    comp_len = teacher_result["actual_logprobs"].shape[1]
    # A view of the model's logits: the op reads it as it is (no copy, no log_softmax of it).
    student_logits = student_outputs.logits[:, prompt_length - 1:-1, :][:, :comp_len]
    completion_tokens = completion_tokens[:, :comp_len]
    trimmed_labels = labels[:, :comp_len]
    teacher_logprobs, ids, mask = _server_support(self, teacher_result, completion_tokens, trimmed_labels,
                                                  student_logits)
    call_counts["server_compute_loss"] += 1
    loss = functional.sparse_jsd_loss(student_logits, teacher_logprobs, ids, trimmed_labels, support_mask=mask,
                                      beta=self.beta, temperature=self.temperature, add_tail=self.loss_add_tail,
                                      reduction="batchmean")
    if self.model.training:
        loss = loss / self.current_gradient_accumulation_steps
    return (loss, student_outputs) if return_outputs else loss


# What patch() swaps: (module, attribute path, the package's function, its name in call_counts or None where it
# counts its own calls, and how the class holds it: "function" a module's, "static" a staticmethod, "method" a
# plain method).
_TARGETS: tuple[tuple[str, str, Callable[..., Any], str | None, str], ...] = (
    ("trl.trainer.distillation_trainer", "_chunked_divergence_loss", chunked_divergence_loss,
     "chunked_divergence_loss", "function"),
    ("trl.experimental.gkd.gkd_trainer", "GKDTrainer.generalized_jsd_loss", generalized_jsd_loss,
     "generalized_jsd_loss", "static"),
    ("trl.experimental.server_distillation.server_distillation_trainer", "ServerDistillationTrainer.compute_loss",
     server_compute_loss, None, "method"),
)

_lock = threading.Lock()
_installed: list[tuple[Any, str, Any]] = []  # (owner, attribute, TRL's own value as found), while installed
_holders = 0  # the handles not yet restored


def _counted(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        call_counts[name] += 1
        return fn(*args, **kwargs)

    counted.__name__ = fn.__name__
    counted.__qualname__ = fn.__qualname__
    counted.__doc__ = fn.__doc__
    counted.__wrapped__ = fn  # type: ignore[attr-defined]
    return counted


def _resolve() -> list[tuple[Any, str, Any, Any]]:
    """Each target's owner, attribute, TRL's value and the replacement; a clear error where trl or a name is
    missing."""
    found = []
    for module_name, path, fn, count_name, kind in _TARGETS:
        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError as exc:
            raise ImportError(f"npu_loss_ops.trl.patch: cannot import {module_name} ({exc}); it needs trl 1.16 "
                              "(pip install trl==1.16.0)") from exc
        *parents, attribute = path.split(".")
        where = module_name
        for parent in parents:
            if not hasattr(owner, parent):
                raise AttributeError(f"npu_loss_ops.trl.patch: {where}.{parent} is missing in this trl "
                                     f"({_trl_version()}); patch() knows trl 1.16's names")
            owner = getattr(owner, parent)
            where += "." + parent
        if attribute not in vars(owner):
            raise AttributeError(f"npu_loss_ops.trl.patch: {where}.{attribute} is missing in this trl "
                                 f"({_trl_version()}); patch() knows trl 1.16's names")
        replacement: Any = fn if count_name is None else _counted(fn, count_name)
        if kind == "static":
            replacement = staticmethod(replacement)
        found.append((owner, attribute, vars(owner)[attribute], replacement))
    return found


def _trl_version() -> str:
    try:
        return "trl " + str(importlib.import_module("trl").__version__)
    except Exception:  # noqa: BLE001 (only for the message)
        return "trl of unknown version"


class Patch:
    """The handle :func:`patch` returns: ``restore()`` (or leaving the ``with`` block) gives TRL its own
    functions back once no other handle holds the swap. Restoring twice does nothing."""

    def __init__(self) -> None:
        self._held = True

    @property
    def active(self) -> bool:
        """Whether this handle still holds the swap."""
        return self._held

    def restore(self) -> None:
        global _holders
        with _lock:
            if not self._held:
                return
            self._held = False
            _holders -= 1
            if _holders == 0:
                for owner, attribute, original in reversed(_installed):
                    setattr(owner, attribute, original)
                _installed.clear()

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.restore()


def patch() -> Patch:
    """Replaces TRL 1.16's ``trl.trainer.distillation_trainer._chunked_divergence_loss`` (``DistillationTrainer``),
    ``GKDTrainer.generalized_jsd_loss`` and ``ServerDistillationTrainer.compute_loss`` with this package's, until
    the returned handle is restored::

        npu_loss_ops.trl.patch()              # for the rest of the process
        with npu_loss_ops.trl.patch():        # for a block
            trainer.train()

    Idempotent: while one handle holds the swap, another call swaps nothing again and returns a handle of its
    own; TRL's functions come back when the last handle is restored. Raises an ImportError without trl, and an
    AttributeError naming the attribute on a trl that lacks one of the three (all are checked before anything is
    replaced).
    """
    global _holders
    with _lock:
        if _holders == 0:
            for owner, attribute, original, replacement in _resolve():
                setattr(owner, attribute, replacement)
                _installed.append((owner, attribute, original))
        _holders += 1
        return Patch()
