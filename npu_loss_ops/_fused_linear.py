"""The fused linear form of the distillation family (docs/semantics.md, "The fused linear JSD").

``npu_loss::_fused_linear_jsd`` takes the student's and the teacher's hidden states and ``lm_head`` weights and
never makes their N x V logits: it walks the rows in chunks, and for each chunk makes that chunk's logits with
``at::matmul`` (the input's dtype, accumulating as matmul does), hands them to the family's op with gradients
(``npu_loss::_generalized_jsd_loss_and_grads``, the CPU kernels or the NPU's aclnn path), adds the hard loss's
gradient (cross entropy on the student's untempered logits) and turns the logits' gradients into the inputs',
the weights' and the biases' before the next chunk. The op returns the loss, its two parts and those gradients;
its autograd formula only scales them by grad_output, in place.

The chunk's rows are ``chunk_rows`` when given, else as many as keep the chunk's temporaries within
``DEFAULT_CHUNK_BYTES`` and within an eighth of one N x V tensor of the logits' dtype (``default_chunk_rows``).
"""
from __future__ import annotations

import torch
from torch import Tensor

# The byte budget of one chunk's temporaries when the caller gives no chunk_size (docs/semantics.md).
DEFAULT_CHUNK_BYTES = 256 * 2**20
# Of one N x V tensor of the logits' dtype, the share a chunk's temporaries may take by default: half the
# bound the contract states (0.25x), the other half left to the allocator's rounding and matmul's workspace.
DEFAULT_CHUNK_SHARE = 8

_REDUCTION_ENUM = {"sum": 2, "batchmean": 2, "mean": 2}


def chunk_row_bytes(vocab: int, student_dtype: torch.dtype, teacher_dtype: torch.dtype, teacher_grad: bool,
                    hard: bool) -> int:
    """The bytes one row of a chunk holds at once: both logits, the student's gradient (the teacher's when it is
    needed) and, with the hard loss, its float32 log-probabilities."""
    s, t = torch.empty((), dtype=student_dtype).element_size(), torch.empty((), dtype=teacher_dtype).element_size()
    return vocab * (2 * s + t + (t if teacher_grad else 0) + (4 if hard else 0))


def default_chunk_rows(rows: int, vocab: int, student_dtype: torch.dtype, teacher_dtype: torch.dtype,
                       teacher_grad: bool, hard: bool) -> int:
    """The default chunk: the most rows whose temporaries fit both DEFAULT_CHUNK_BYTES and 1/DEFAULT_CHUNK_SHARE
    of one rows x vocab tensor of the result's dtype; at least 1, at most ``rows``."""
    if rows == 0 or vocab == 0:
        return max(rows, 1)
    result = torch.promote_types(student_dtype, teacher_dtype)
    share = rows * vocab * torch.empty((), dtype=result).element_size() // DEFAULT_CHUNK_SHARE
    per_row = chunk_row_bytes(vocab, student_dtype, teacher_dtype, teacher_grad, hard)
    return max(1, min(rows, min(DEFAULT_CHUNK_BYTES, share) // per_row))


def _logits(x: Tensor, w: Tensor, b: Tensor | None, out: Tensor) -> Tensor:
    """x @ w.T + b into ``out``: one buffer per call, reused by every chunk (a new buffer per chunk leaves the
    C library's heap holding the freed ones: measured, up to 0.3x N x V more resident memory)."""
    return torch.mm(x, w.t(), out=out) if b is None else torch.addmm(b, x, w.t(), out=out)


def _empty(like: Tensor) -> Tensor:
    return like.new_empty((0,))


@torch.library.custom_op("npu_loss::_fused_linear_jsd", mutates_args=())
def _fused_linear_jsd(
    student_input: Tensor, student_weight: Tensor, student_bias: Tensor | None,
    teacher_input: Tensor, teacher_weight: Tensor, teacher_bias: Tensor | None,
    labels: Tensor | None, reduction: str, divisor_rows: int, beta: float, temperature: float, ignore_index: int,
    weight_hard_loss: float, weight_soft_loss: float, compute_hard: bool, chunk_rows: int, output_mask: list[bool],
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(loss, soft, hard, grad student_input, student_weight, student_bias, teacher_input, teacher_weight,
    teacher_bias) for 2-D inputs (N, H). A gradient not asked for by output_mask (6 flags in that order) is an
    empty tensor. ``divisor_rows`` is what 'batchmean' divides by without labels (the first dimension of the
    logits the caller's shapes would make). ``compute_hard``: the cross entropy is computed (its weight is not 0,
    or the caller returns it); it needs labels. The checks are the public function's (functional.py)."""
    n, vocab = student_input.size(0), student_weight.size(0)
    result_dtype = torch.promote_types(student_input.dtype, teacher_input.dtype)
    device = student_input.device
    hard = compute_hard and labels is not None
    hard_grad = hard and weight_hard_loss != 0.0
    need_s = any(output_mask[:3])
    need_t = any(output_mask[3:])
    # float32 for the scales, the bias gradients' sums and the hard loss's log-probabilities; float64 inputs
    # keep float64.
    acc = torch.float64 if result_dtype == torch.float64 else torch.float32

    # What the sum is divided by (kept rows as a tensor: no wait for a device).
    if labels is not None:
        keep = labels != ignore_index
        if hard and bool((keep & ((labels < 0) | (labels >= vocab))).any()):
            raise ValueError(f"fused_linear_jsd_loss: with the hard loss, every kept label must be in "
                             f"[0, {vocab}) (the vocabulary), got one outside it")
        kept = keep.sum()
        kept_clamped = kept.clamp(min=1).to(torch.float64)
    else:
        keep = None
        kept = torch.tensor(n, device=device)
        kept_clamped = torch.tensor(float(max(n, 1)), dtype=torch.float64, device=device)
    if reduction == "sum":
        soft_div = torch.ones((), dtype=torch.float64, device=device)
        hard_div = soft_div
    elif reduction == "batchmean":
        soft_div = kept_clamped if labels is not None else torch.tensor(
            float(max(divisor_rows, 1)), dtype=torch.float64, device=device)
        hard_div = kept_clamped
    else:  # mean: over the kept elements for the JSD, over the kept rows for the cross entropy
        soft_div = kept.to(torch.float64) * vocab
        hard_div = kept_clamped
    soft_scale = (weight_soft_loss / soft_div.clamp(min=1)).to(acc)
    hard_scale = (weight_hard_loss / hard_div).to(acc)

    grad_xs = torch.empty_like(student_input) if output_mask[0] else _empty(student_input)
    grad_ws = torch.zeros_like(student_weight) if output_mask[1] else _empty(student_weight)
    grad_bs = (torch.zeros(vocab, dtype=acc, device=device) if output_mask[2] and student_bias is not None
               else None)
    grad_xt = torch.empty_like(teacher_input) if output_mask[3] else _empty(teacher_input)
    grad_wt = torch.zeros_like(teacher_weight) if output_mask[4] else _empty(teacher_weight)
    grad_bt = (torch.zeros(vocab, dtype=acc, device=device) if output_mask[5] and teacher_bias is not None
               else None)
    soft_sum = torch.zeros((), dtype=torch.float64, device=device)
    hard_sum = torch.zeros((), dtype=torch.float64, device=device)
    with_grads = torch.ops.npu_loss._generalized_jsd_loss_and_grads

    rows = min(chunk_rows, n)
    zs_buffer = student_input.new_empty((rows, vocab))
    zt_buffer = teacher_input.new_empty((rows, vocab))
    for start in range(0, n, chunk_rows):
        stop = min(start + chunk_rows, n)
        xs, xt = student_input[start:stop], teacher_input[start:stop]
        lab = labels[start:stop] if labels is not None else None
        zs = _logits(xs, student_weight, student_bias, zs_buffer[: stop - start])
        zt = _logits(xt, teacher_weight, teacher_bias, zt_buffer[: stop - start])
        value, gs, gt, row_scale = with_grads(zs, zt, lab, 2, beta, temperature, ignore_index,
                                              [need_s, need_t])
        soft_sum += value.to(torch.float64)
        if hard:
            logp = torch.log_softmax(zs, dim=-1, dtype=acc)
            del zs
            chunk_keep = keep[start:stop]
            target = torch.where(chunk_keep, lab, torch.zeros_like(lab)).unsqueeze(-1)
            picked = logp.gather(-1, target).squeeze(-1)
            hard_sum -= torch.where(chunk_keep, picked, torch.zeros_like(picked)).sum(dtype=torch.float64)
        else:
            del zs
        del zt
        if need_s:
            # The logits' gradient: the JSD's (times its row scales for float16), then the hard loss's
            # softmax - one_hot on the kept rows, both scaled by their weight over their divisor.
            factor = soft_scale * row_scale.to(acc).unsqueeze(-1)
            gs.mul_(factor)
            if hard_grad:
                p = logp.exp_()
                p.scatter_add_(-1, target, torch.full_like(picked, -1.0).unsqueeze(-1))
                p.mul_((chunk_keep.to(acc) * hard_scale).unsqueeze(-1))
                gs.add_(p)
                del p
            if output_mask[0]:
                torch.mm(gs, student_weight, out=grad_xs[start:stop])
            if output_mask[1]:
                grad_ws.addmm_(gs.t(), xs)
            if grad_bs is not None:
                grad_bs += gs.sum(0, dtype=acc)
        if hard:
            logp = None
        if need_t:
            gt.mul_(soft_scale * row_scale.to(acc).unsqueeze(-1))
            if output_mask[3]:
                torch.mm(gt, teacher_weight, out=grad_xt[start:stop])
            if output_mask[4]:
                grad_wt.addmm_(gt.t(), xt)
            if grad_bt is not None:
                grad_bt += gt.sum(0, dtype=acc)
        del gs, gt

    if reduction == "mean":
        soft = torch.where(kept > 0, soft_sum / soft_div.clamp(min=1), torch.full_like(soft_sum, float("nan")))
    else:
        soft = soft_sum / soft_div
    hard_value = hard_sum / hard_div
    loss = weight_soft_loss * soft + weight_hard_loss * hard_value
    grad_bs = grad_bs.to(student_bias.dtype) if grad_bs is not None else _empty(student_input)
    grad_bt = grad_bt.to(teacher_bias.dtype) if grad_bt is not None else _empty(teacher_input)
    return (loss.to(result_dtype), soft.to(result_dtype), hard_value.to(result_dtype),
            grad_xs, grad_ws, grad_bs, grad_xt, grad_wt, grad_bt)


@_fused_linear_jsd.register_fake
def _(student_input, student_weight, student_bias, teacher_input, teacher_weight, teacher_bias, labels, reduction,
      divisor_rows, beta, temperature, ignore_index, weight_hard_loss, weight_soft_loss, compute_hard, chunk_rows,
      output_mask):
    dtype = torch.promote_types(student_input.dtype, teacher_input.dtype)
    scalar = student_input.new_empty((), dtype=dtype)
    like = [student_input, student_weight, student_bias, teacher_input, teacher_weight, teacher_bias]
    empty_of = [student_input, student_weight, student_input, teacher_input, teacher_weight, teacher_input]
    grads = [torch.empty_like(t) if want and t is not None else e.new_empty((0,))
             for want, t, e in zip(output_mask, like, empty_of)]
    return (scalar, scalar.clone(), scalar.clone(), *grads)


# torch's own test of retain_graph for the running backward (the family's C++ node asks the same); a torch
# without it scales copies.
_keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", lambda: True)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*output[3:])
    ctx.mark_non_differentiable(*output[1:])
    # Only the loss has a gradient: no zeros for the other eight outputs (the weights' gradients' sizes).
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_loss, *unused):
    if grad_loss is None:
        return (None,) * 17
    """The gradients made in the forward, times grad_output. They are scaled in place and handed over (one
    more copy of each would be a second set of weight gradients at its peak) unless the graph is kept for
    another backward (retain_graph=True) or the backward is traced (torch.compile, torch.func, a tensor
    subclass): then into new tensors."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            "fused_linear_jsd_loss: double backward (create_graph=True) is not supported: its gradients are made in "
            "the forward, not as functions autograd can differentiate again")
    copy = (type(grad_loss) is not Tensor or torch._C._functorch.is_functorch_wrapped_tensor(grad_loss)
            or _keep_graph())
    grads = []
    for needed, g in zip(ctx.needs_input_grad[:6], ctx.saved_tensors):
        if not needed:
            grads.append(None)
            continue
        factor = grad_loss.to(g.dtype)
        grads.append(g * factor if copy else g.mul_(factor))
    return (*grads, *([None] * 11))


_fused_linear_jsd.register_autograd(_backward, setup_context=_setup_context)
