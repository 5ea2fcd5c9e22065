"""The served teacher's sparse divergence, the package's op (npu_loss_ops.sparse_jsd_loss, its CPU kernel in
float64) and its float64 reference (reference.sparse_jsd_reference, which tests/test_sparse_jsd.py holds the op
to in every dtype), each against TRL 1.16's own functions, imported from
trl/experimental/server_distillation: `_add_tail_bucket`, `_jsd_divergence` and `_reduce_divergence_loss` over
any support, and the trainer's two loss paths over the supports it builds (the teacher's top-k at beta 0; its
top-1 and the sampled token, the second masked where they agree, at 0 < beta < 1; the sampled token alone at 1).
Values and the gradients of the student's logits and of the teacher's log-probabilities, in float64."""
from __future__ import annotations

import functools
import types

import pytest
import torch
import torch.nn.functional as F

import npu_loss_ops
from reference import sparse_jsd_reference
from trl.experimental.server_distillation import server_distillation_trainer as server

TRAINER = server.ServerDistillationTrainer
# TRL's own, taken before any test may swap them.
TRL_ADD_TAIL = server._add_tail_bucket
TRL_JSD = server._jsd_divergence
TRL_REDUCE = TRAINER.__dict__["_reduce_divergence_loss"].__func__
TRL_FORWARD_KL = TRAINER._compute_server_forward_kl_loss
TRL_TOP_1 = TRAINER._compute_server_sparse_top_1_divergence_loss
TRL_TOP_1_SUPPORT = TRAINER._compute_sparse_top_1_divergence_loss

VOCAB = 40


def _op(student, teacher, ids, labels=None, support_mask=None, **kw):
    return npu_loss_ops.sparse_jsd_loss(student, teacher, ids, labels, support_mask=support_mask, **kw)


# Each function compared with TRL's, and its tolerance (rtol, atol): the reference runs TRL's ops in TRL's order;
# the op sums in its own order (the log-sum-exp a block at a time), so its float64 rounding differs by a few ulps.
FUNCTIONS = {"reference": (sparse_jsd_reference, (1e-12, 1e-14)), "op": (_op, (1e-10, 1e-13))}


def _student(seed: int, rows=(3, 5)):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*rows, VOCAB, generator=gen, dtype=torch.float64) * 2).requires_grad_()


def _labels(seed: int, rows=(3, 5)):
    gen = torch.Generator().manual_seed(seed + 1)
    labels = torch.randint(0, VOCAB, rows, generator=gen)
    labels[0, :2] = -100
    labels[2, 4] = -100
    return labels


def _support(seed: int, k: int, rows=(3, 5)):
    """Ids with repeats (each repeat after the first masked), a row with every entry masked, and the teacher's
    log-probabilities of a random distribution at those ids (requiring grad)."""
    gen = torch.Generator().manual_seed(seed + 2)
    ids = torch.randint(0, VOCAB, (*rows, k), generator=gen)
    if k > 1:
        ids[1, 1, 1] = ids[1, 1, 0]
    mask = torch.ones_like(ids, dtype=torch.bool)
    for r in range(ids[..., 0].numel()):
        seen = set()
        row, flat = ids.view(-1, k)[r], mask.view(-1, k)[r]
        for j in range(k):
            flat[j] = int(row[j]) not in seen
            seen.add(int(row[j]))
    mask[2, 1] = False
    teacher = F.log_softmax(torch.randn(*rows, VOCAB, generator=gen, dtype=torch.float64), -1).gather(-1, ids)
    return ids, mask, teacher.detach().requires_grad_()


def _trl_any_support(student, teacher, ids, mask, labels, beta, temperature, add_tail, reduction, num_items):
    """TRL's own pieces composed as its two loss paths compose them, over any support: the gather, -inf where
    masked, the tail (its _add_tail_bucket) or the renormalization, its _jsd_divergence and its reduction."""
    log_p = F.log_softmax(student / temperature, dim=-1)
    neg_inf = torch.full((), float("-inf"), dtype=log_p.dtype)
    s = torch.where(mask, log_p.gather(-1, torch.where(mask, ids, 0)), neg_inf)
    t = torch.where(mask, teacher, neg_inf)
    if add_tail:
        (s, support), (t, _) = TRL_ADD_TAIL(s, mask), TRL_ADD_TAIL(t, mask)
    else:
        support = mask
        s, t = s - torch.logsumexp(s, -1, keepdim=True), t - torch.logsumexp(t, -1, keepdim=True)
    jsd = TRL_JSD(s, t, beta, support)
    return TRL_REDUCE(jsd, labels != -100, reduction, num_items)


def _grads(loss, *leaves):
    return torch.autograd.grad(loss.sum(), leaves, allow_unused=True)


def _assert_same(ours, theirs, leaves, what, tolerance=(1e-12, 1e-14)):
    rtol, atol = tolerance
    torch.testing.assert_close(ours, theirs, rtol=rtol, atol=atol, msg=f"value, {what}")
    for name, a, b in zip(("student", "teacher"), _grads(ours, *leaves), _grads(theirs, *leaves)):
        # TRL's gradient is NaN where a row's support is all masked and there is no tail (0 * the NaN of
        # logsumexp's backward over -inf alone); the reference is compared where TRL's is finite.
        finite = torch.isfinite(b)
        torch.testing.assert_close(a[finite], b[finite], rtol=rtol, atol=atol, msg=f"{name} gradient, {what}")
        # Where TRL's is NaN, the package's is finite (0 for the student's rows whose support is all masked).
        assert torch.isfinite(a).all(), f"{name} gradient, {what}: not finite"


@pytest.mark.parametrize("which", FUNCTIONS)
@pytest.mark.parametrize("add_tail", [True, False])
@pytest.mark.parametrize("k", [1, 2, 8])
@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
def test_matches_trls_pieces_on_any_support(beta, k, add_tail, which):
    """Any K, any beta, masked repeats and a masked row: every reduction and num_items_in_batch."""
    student, labels = _student(k), _labels(k)
    ids, mask, teacher = _support(k, k)
    for reduction in ("batchmean", "sum", "mean", "none"):
        for num_items in (None, 7) if reduction == "batchmean" else (None,):
            for temperature in (1.0, 2.0):
                what = f"beta={beta} k={k} tail={add_tail} {reduction} num_items={num_items} T={temperature}"
                fn, tolerance = FUNCTIONS[which]
                ours = fn(student, teacher, ids, labels, mask, beta=beta, temperature=temperature,
                          add_tail=add_tail, reduction=reduction, num_items_in_batch=num_items)
                theirs = _trl_any_support(student, teacher, ids, mask, labels, beta, temperature, add_tail,
                                          reduction, num_items)
                _assert_same(ours, theirs, (student, teacher), what, tolerance)


def _trainer(beta: float, add_tail: bool):
    """What TRL's two loss methods read of their trainer: beta, the tail, the reverse token's rule (the server
    path's only one, "sampled": the completion's token), and its own methods."""
    me = types.SimpleNamespace(beta=beta, loss_add_tail=add_tail, reverse_kl_top_1_mode="sampled",
                               _reduce_divergence_loss=TRL_REDUCE)
    me._get_reverse_kl_top_1_tokens = functools.partial(TRAINER._get_reverse_kl_top_1_tokens, me)
    me._compute_sparse_top_1_divergence_loss = functools.partial(TRL_TOP_1_SUPPORT, me)
    return me


@pytest.mark.parametrize("which", FUNCTIONS)
@pytest.mark.parametrize("add_tail", [True, False])
@pytest.mark.parametrize("k", [1, 2, 8, 64])
def test_matches_trls_forward_kl_over_the_teachers_top_k(k, add_tail, which):
    """beta 0: the server's top-k of the teacher, its padded entries -inf (TRL masks those, ids 0)."""
    student, labels = _student(10 + k), _labels(10 + k)
    gen = torch.Generator().manual_seed(k)
    teacher_all = F.log_softmax(torch.randn(3, 5, VOCAB, generator=gen, dtype=torch.float64) * 3, -1)
    top, ids = teacher_all.topk(min(k, VOCAB), -1)
    top = top.clone()
    if k > 1:
        top[0, 3, k // 2:] = float("-inf")  # a server that returned fewer than k there
        ids[0, 3, k // 2:] = 0
    top.requires_grad_()
    valid = top > float("-inf")
    for temperature in (1.0, 2.0):
        what = f"k={k} tail={add_tail} T={temperature}"
        fn, tolerance = FUNCTIONS[which]
        ours = fn(student, top, ids, labels, valid, beta=0.0, temperature=temperature, add_tail=add_tail)
        log_p = F.log_softmax(student / temperature, -1)
        theirs = TRL_FORWARD_KL(_trainer(0.0, add_tail), {"topk_logprobs": top, "topk_token_ids": ids}, log_p,
                                labels)
        _assert_same(ours, theirs, (student, top), what, tolerance)


@pytest.mark.parametrize("which", FUNCTIONS)
@pytest.mark.parametrize("add_tail", [True, False])
@pytest.mark.parametrize("beta", [0.3, 0.5, 1.0])
def test_matches_trls_top_1_and_sampled_token(beta, add_tail, which):
    """0 < beta < 1: [the teacher's top-1, the sampled token], the second masked where the two are the same id;
    beta 1: the sampled token alone. TRL zeroes the teacher's log-probabilities on the dropped rows (which the
    labels drop here too)."""
    student, labels = _student(20), _labels(20)
    gen = torch.Generator().manual_seed(21)
    teacher_all = F.log_softmax(torch.randn(3, 5, VOCAB, generator=gen, dtype=torch.float64) * 3, -1)
    top1, top1_ids = teacher_all.max(-1)
    sampled = torch.randint(0, VOCAB, (3, 5), generator=gen)
    sampled[1, :3] = top1_ids[1, :3]  # the sampled token is the teacher's top-1 there
    actual = teacher_all.gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
    top1, actual = top1.detach().requires_grad_(), actual.detach().requires_grad_()
    for temperature in (1.0, 2.0):
        what = f"beta={beta} tail={add_tail} T={temperature}"
        log_p = F.log_softmax(student / temperature, -1)
        result = {"topk_logprobs": top1.unsqueeze(-1), "topk_token_ids": top1_ids.unsqueeze(-1),
                  "actual_logprobs": actual}
        theirs = TRL_TOP_1(_trainer(beta, add_tail), result, log_p, sampled, labels)
        fn, (rtol, atol) = FUNCTIONS[which]
        if beta == 1:
            ours = fn(student, actual.unsqueeze(-1), sampled.unsqueeze(-1), labels, beta=beta,
                      temperature=temperature, add_tail=add_tail)
        else:
            ids = torch.stack([top1_ids, sampled], -1)
            mask = torch.stack([torch.ones_like(sampled, dtype=torch.bool), sampled != top1_ids], -1)
            ours = fn(student, torch.stack([top1, actual], -1), ids, labels, mask, beta=beta,
                      temperature=temperature, add_tail=add_tail)
        torch.testing.assert_close(ours, theirs, rtol=rtol, atol=atol, msg=f"value, {what}")
        leaves = (student, top1, actual) if beta < 1 else (student, actual)
        for name, a, b in zip(("student", "top-1", "actual"), _grads(ours, *leaves), _grads(theirs, *leaves)):
            a = torch.zeros_like(b) if a is None else a
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=f"{name} gradient, {what}")


# ---- the op from hidden states, against TRL's own functions on the logits made ----

@pytest.mark.parametrize("add_tail", [True, False])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_fused_form_matches_trl_on_the_supports_it_builds(beta, add_tail):
    """fused_linear_sparse_jsd_loss (the logits made a chunk of rows at a time) against TRL's loss methods on the
    logits x @ w.T: beta 0 over the teacher's top-8 (TRL's _compute_server_forward_kl_loss), 0 < beta <= 1 over
    [the teacher's top-1, the sampled token] (its _compute_server_sparse_top_1_divergence_loss). The value and the
    gradients of the hidden states, the weight and the teacher's log-probabilities, float64."""
    gen = torch.Generator().manual_seed(30)
    x = torch.randn(3, 5, 12, generator=gen, dtype=torch.float64).requires_grad_()
    w = (torch.randn(VOCAB, 12, generator=gen, dtype=torch.float64) * 0.6).requires_grad_()
    labels = _labels(30)
    teacher_all = F.log_softmax(torch.randn(3, 5, VOCAB, generator=gen, dtype=torch.float64) * 3, -1)
    for temperature in (1.0, 2.0):
        what = f"beta={beta} tail={add_tail} T={temperature}"
        log_p = F.log_softmax(x @ w.T / temperature, -1)
        if beta == 0:
            top, ids = teacher_all.topk(8, -1)
            top = top.detach().requires_grad_()
            theirs = TRL_FORWARD_KL(_trainer(0.0, add_tail), {"topk_logprobs": top, "topk_token_ids": ids}, log_p,
                                    labels)
            teacher, mask, leaves = top, None, (x, w, top)
        else:
            top1, top1_ids = teacher_all.max(-1)
            sampled = torch.randint(0, VOCAB, (3, 5), generator=gen)
            sampled[1, :3] = top1_ids[1, :3]
            actual = teacher_all.gather(-1, sampled.unsqueeze(-1)).squeeze(-1).detach().requires_grad_()
            top1 = top1.detach().requires_grad_()
            result = {"topk_logprobs": top1.unsqueeze(-1), "topk_token_ids": top1_ids.unsqueeze(-1),
                      "actual_logprobs": actual}
            theirs = TRL_TOP_1(_trainer(beta, add_tail), result, log_p, sampled, labels)
            if beta == 1:
                teacher, ids, mask, leaves = actual.unsqueeze(-1), sampled.unsqueeze(-1), None, (x, w, actual)
            else:
                teacher = torch.stack([top1, actual], -1)
                ids = torch.stack([top1_ids, sampled], -1)
                mask = torch.stack([torch.ones_like(sampled, dtype=torch.bool), sampled != top1_ids], -1)
                leaves = (x, w, top1, actual)
        ours = npu_loss_ops.fused_linear_sparse_jsd_loss(x, w, teacher, ids, labels, support_mask=mask, beta=beta,
                                                         temperature=temperature, add_tail=add_tail, chunk_size=4)
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-13, msg=f"value, {what}")
        for a, b in zip(_grads(ours, *leaves), _grads(theirs, *leaves)):
            a = torch.zeros_like(b) if a is None else a
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13, msg=f"gradient, {what}")
