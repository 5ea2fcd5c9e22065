"""Distil a small language model into a smaller one with npu_loss_ops.JSDLoss, next to TRL's formula written
out in plain PyTorch, and check that the two runs agree.

The teacher is a fixed random bigram model over a vocabulary of V tokens; the student, smaller, learns to match
its next-token distributions on random sequences whose padding is labelled -100 (GKD's masking). Two copies of
the student, with the same initial weights, see the same batches: one is trained with `npu_loss_ops.JSDLoss`,
the other with the reference (TRL 1.16's GKDTrainer.generalized_jsd_loss, computed in float32 with autograd
through every N x V temporary). Every step prints both losses and the largest difference between the two
students' gradients; with --teacher-learns the teacher is trained too (both sides get a gradient, in one pass
for ours). The last line is the verdict; the exit status is 1 on a mismatch, or if the loss on a held-out
batch did not fall.

Runs on an Ascend NPU when torch_npu and the package's NPU kernels are available, else on the CPU.

    python examples/distill.py [--steps 30] [--vocab 8192] [--teacher-learns] [--device cpu|npu]
"""
from __future__ import annotations

import argparse
import copy
import sys

import torch
import torch.nn.functional as F

try:  # torch_npu registers the "npu" device; without it (or without CANN) the example runs on the CPU.
    import torch_npu  # noqa: F401
except Exception:
    torch_npu = None

import npu_loss_ops

BATCH, SEQ, SEED, LR = 4, 33, 0, 0.05
BETA, TEMPERATURE = 0.5, 2.0
# float32 on both sides: the gradients may differ by rounding (ours sums in float64, TRL's formula in float32).
RTOL, ATOL = 1e-4, 1e-7


class BigramLM(torch.nn.Module):
    """Logits of the next token from the current one: an embedding and a projection to the vocabulary. The
    embedding is frozen, as a pretrained input embedding often is: the projections learn."""

    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.embed.weight.requires_grad_(False)
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(ids)))


def trl_generalized_jsd_loss(student_logits, teacher_logits, labels, beta, temperature):
    """TRL 1.16's formula ('batchmean'), written out: the reference this example compares with."""
    s = F.log_softmax(student_logits / temperature, dim=-1)
    t = F.log_softmax(teacher_logits / temperature, dim=-1)
    beta_t = torch.tensor(beta, dtype=s.dtype, device=s.device)
    m = torch.logsumexp(torch.stack([s + torch.log1p(-beta_t), t + torch.log(beta_t)]), dim=0)
    jsd = beta * F.kl_div(m, t, reduction="none", log_target=True) + (1 - beta) * F.kl_div(
        m, s, reduction="none", log_target=True)
    mask = labels != -100
    return jsd[mask].sum() / mask.sum().clamp_min(1)


def pick_device(requested: str | None) -> torch.device:
    if requested:
        return torch.device(requested)
    npu_ready = getattr(npu_loss_ops, "npu_kernels_available", lambda: False)
    if torch_npu is not None and npu_ready():
        return torch.device("npu")
    return torch.device("cpu")


def batch(step: int, vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(SEED + 1 + step)
    ids = torch.randint(0, vocab, (BATCH, SEQ), generator=g)
    labels = ids.clone()
    for row, length in enumerate(torch.randint(SEQ // 2, SEQ + 1, (BATCH,), generator=g).tolist()):
        labels[row, length:] = -100  # padding: no loss there
    return ids.to(device), labels.to(device)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--teacher-learns", action="store_true", help="train the teacher too (co-distillation)")
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    device = pick_device(args.device)
    torch.manual_seed(SEED)
    teacher = BigramLM(args.vocab, 64).to(device)
    torch.nn.init.normal_(teacher.head.weight, std=0.5)
    student = BigramLM(args.vocab, 16).to(device)
    runs = {}
    for name in ("npu_loss_ops", "TRL formula"):
        s, t = copy.deepcopy(student), copy.deepcopy(teacher)
        params = [p for p in s.parameters() if p.requires_grad]
        params += [p for p in t.parameters() if p.requires_grad] if args.teacher_learns else []
        # Adagrad's per-tensor step: ops that CI's emulated NPU implements (Adam's lerp, the foreach kernels
        # and the embedding's backward it does not).
        runs[name] = (s, t, torch.optim.Adagrad(params, lr=LR, foreach=False))
    criterion = npu_loss_ops.JSDLoss(beta=BETA, temperature=TEMPERATURE)
    print(f"npu_loss_ops {npu_loss_ops.__version__} on {device}: V = {args.vocab}, {BATCH} x {SEQ - 1} tokens, "
          f"beta = {BETA}, temperature = {TEMPERATURE}{', the teacher learning too' if args.teacher_learns else ''}")
    def held_out() -> float:  # ours on a batch no step trains on
        s, t, _ = runs["npu_loss_ops"]
        ids, labels = batch(-1, args.vocab, device)
        with torch.no_grad():
            return criterion(s(ids)[:, :-1], t(ids)[:, :-1], labels[:, 1:]).item()

    first = held_out()
    worst = 0.0
    for step in range(args.steps):
        ids, labels = batch(step, args.vocab, device)
        losses, grads = {}, {}
        for name, (s, t, opt) in runs.items():
            opt.zero_grad()
            with torch.set_grad_enabled(args.teacher_learns):
                teacher_logits = t(ids)[:, :-1]  # GKD's shifted view: read in place by ours
            student_logits = s(ids)[:, :-1]
            shifted = labels[:, 1:]
            if name == "npu_loss_ops":
                loss = criterion(student_logits, teacher_logits, shifted)
            else:
                loss = trl_generalized_jsd_loss(student_logits, teacher_logits, shifted, BETA, TEMPERATURE)
            loss.backward()
            losses[name] = loss.item()
            grads[name] = [p.grad.detach().clone() for p in opt.param_groups[0]["params"]]
            opt.step()
        diff = max(float((a - b).abs().max()) for a, b in zip(*grads.values()))
        for a, b in zip(*grads.values()):
            if not torch.allclose(a, b, rtol=RTOL, atol=ATOL):
                print(f"step {step}: MISMATCH: gradients differ by up to {diff:.3g}")
                return 1
        worst = max(worst, diff)
        ours, theirs = losses.values()
        if step % 5 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {ours:.6f} (TRL formula {theirs:.6f})  max |grad difference| {diff:.2e}")
    last = held_out()
    if not last < first:
        print(f"FAIL: the held-out loss did not fall ({first:.6f} -> {last:.6f})")
        return 1
    print(f"OK: npu_loss_ops.JSDLoss matches TRL's formula over {args.steps} steps (gradients within "
          f"{worst:.2e}); the held-out loss fell from {first:.6f} to {last:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
