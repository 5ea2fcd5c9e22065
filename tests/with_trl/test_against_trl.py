"""The package's functions against TRL 1.16's own, imported (not restated), in float32: DistillationTrainer's
_chunked_divergence_loss against npu_loss_ops.trl.chunked_divergence_loss, and GKDTrainer.generalized_jsd_loss
against npu_loss_ops.generalized_jsd_loss. Values, the entropy, n_valid and the gradients of the student's hidden
states, weight and bias. (The same matrix in float64 runs against the project's reference in
tests/test_trl_module.py: TRL's tiles are float32.)"""
from __future__ import annotations

import inspect
import itertools

import pytest
import torch

import npu_loss_ops
import npu_loss_ops.trl as ntrl
from trl.experimental.gkd.gkd_trainer import GKDTrainer
from test_trl_module import _inputs as _trl_module_inputs
from trl.trainer import distillation_trainer

# TRL's own, taken before any test may swap them (patch() restores them; this keeps the comparison honest even
# if one did not).
TRL_CHUNKED = distillation_trainer._chunked_divergence_loss
TRL_GKD = GKDTrainer.__dict__["generalized_jsd_loss"].__func__

TRANSFORMS = list(itertools.product([1.0, 0.5], [None, 5.0], [1.0, 2.0], [None, 4.0]))  # s scale/cap, t scale/cap


def _inputs(bias: bool, seed: int):
    """tests/test_trl_module.py's inputs, in float32, at a vocabulary of 97."""
    return _trl_module_inputs(torch.float32, k=6, hs=16, ht=24, vocab=97, bias=bias, seed=seed)


def test_signature_is_trls():
    """The package's function has TRL's own parameters: names, kinds and defaults, in order."""
    ours = inspect.signature(ntrl.chunked_divergence_loss).parameters.values()
    theirs = inspect.signature(TRL_CHUNKED).parameters.values()
    assert [(p.name, p.kind, p.default) for p in ours] == [(p.name, p.kind, p.default) for p in theirs]


def _run(fn, x, mask, beta, num_items, transform, temperature):
    leaves = {n: None if v is None else v.clone().requires_grad_() for n, v in x.items()}
    s_scale, s_cap, t_scale, t_cap = transform
    loss, entropy, n_valid = fn(leaves["hs"], leaves["ht"], leaves["ws"], leaves["wt"], mask, beta,
                                num_items_in_batch=num_items, student_lm_head_bias=leaves["bs"],
                                teacher_lm_head_bias=leaves["bt"], student_logit_scale=s_scale,
                                teacher_logit_scale=t_scale, student_final_logit_softcapping=s_cap,
                                teacher_final_logit_softcapping=t_cap, temperature=temperature)
    wanted = [leaves[n] for n in ("hs", "ws", "bs") if leaves[n] is not None]
    grads = torch.autograd.grad(loss, wanted) if int(mask.sum()) else [torch.zeros_like(w) for w in wanted]
    return loss, entropy, n_valid, grads


def _compare(x, mask, beta, num_items, transform, temperature):
    ours = _run(ntrl.chunked_divergence_loss, x, mask, beta, num_items, transform, temperature)
    theirs = _run(TRL_CHUNKED, x, mask, beta, num_items, transform, temperature)
    what = f"beta={beta} T={temperature} transform={transform} num_items={num_items}"
    assert ours[0].dtype == theirs[0].dtype == torch.float32, what
    torch.testing.assert_close(ours[0], theirs[0], rtol=2e-5, atol=1e-6, msg=f"loss, {what}")
    torch.testing.assert_close(ours[1], theirs[1], rtol=2e-5, atol=1e-5, msg=f"entropy, {what}")
    assert torch.equal(ours[2], theirs[2]), what
    for name, a, b in zip(("hidden", "weight", "bias"), ours[3], theirs[3]):
        scale = max(float(b.abs().max()), 1e-12)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5 * scale, msg=f"{name} gradient, {what}")


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize("transform", TRANSFORMS, ids=str)
def test_chunked_divergence_loss_matches_trls(beta, temperature, transform):
    x, mask = _inputs(bias=True, seed=0)
    _compare(x, mask, beta, None, transform, temperature)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("num_items", [None, 5, torch.tensor(9.0)], ids=["none", "int", "tensor"])
@pytest.mark.parametrize("mask_kind", ["random", "all kept", "all masked"])
def test_chunked_divergence_loss_masks_biases_num_items(bias, num_items, mask_kind):
    x, mask = _inputs(bias=bias, seed=1)
    if mask_kind == "all kept":
        mask = torch.ones_like(mask)
    elif mask_kind == "all masked":
        mask = torch.zeros_like(mask)
    _compare(x, mask, 0.5, num_items, (0.5, 5.0, 1.0, None), 1.0)


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean", "none"])
@pytest.mark.parametrize("with_labels", [True, False])
def test_generalized_jsd_loss_matches_gkd_trainers(beta, temperature, reduction, with_labels):
    gen = torch.Generator().manual_seed(2)
    student, teacher = torch.randn(2, 5, 61, generator=gen) * 3, torch.randn(2, 5, 61, generator=gen) * 3
    labels = torch.randint(0, 61, (2, 5), generator=gen) if with_labels else None
    if labels is not None:
        labels[0, 2] = labels[1, 0] = -100
    results = []
    for fn in (npu_loss_ops.generalized_jsd_loss, TRL_GKD):
        s, t = student.clone().requires_grad_(), teacher.clone().requires_grad_()
        value = fn(s, t, labels, beta, temperature, reduction)
        value.backward(torch.ones_like(value))
        results.append((value.detach(), s.grad, t.grad))
    for name, a, b in zip(("value", "student's gradient", "teacher's gradient"), *results):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-6 * max(float(b.abs().max()), 1.0), msg=name)
    for num_items in (7, torch.tensor(4.0)):
        ours = npu_loss_ops.generalized_jsd_loss(student, teacher, labels, beta, temperature,
                                                 num_items_in_batch=num_items)
        theirs = TRL_GKD(student, teacher, labels, beta, temperature, num_items_in_batch=num_items)
        torch.testing.assert_close(ours, theirs, rtol=2e-5, atol=1e-6)
