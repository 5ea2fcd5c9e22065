"""Distil a teacher into a student whose lm_heads are split over the vocabulary, on torch.distributed: each rank
holds its rows of both heads, as tensor parallelism (Megatron-LM's and MindSpeed's ColumnParallelLinear, PyTorch's
ColwiseParallel) places them, and npu_loss_ops.fused_linear_jsd_loss computes the generalized JSD on the split
without ever gathering the heads or the logits (docs/usage.md, "Distributed distillation").

The models are small: an embedding (the body, replicated) and an lm_head of V rows (split). Every rank also keeps
a copy of the whole student and trains it on one process's terms (the same function on the whole heads), so each
step checks that the split gives one process's loss and gradients. Two ways of splitting run, one after the other:

  --mode group    plain tensors, `vocab_parallel_group=`: each rank passes its contiguous rows of both heads.
                  The hidden states' gradient is then each rank's partial sum, which Megatron's
                  ColumnParallelLinear all-reduces in its backward; here `copy_to_vocab_parallel` (identity
                  forward, all-reduce backward) stands in for it.
  --mode dtensor  DTensor heads placed Shard(0) on a 1-D mesh beside replicated hidden states: the function finds
                  the split itself and returns the hidden states' gradient whole.

    torchrun --nproc-per-node 2 examples/distributed_distill.py [--steps 10] [--vocab 4099] [--mode both]

gloo on CPUs (HCCL on Ascend is the same code with device="npu" and backend "hccl", not yet run on hardware). The
last line is the verdict; the exit status is 1 on a mismatch or if the loss did not fall.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys

import torch
import torch.distributed as dist

import npu_loss_ops

HIDDEN, TEACHER_HIDDEN, TOKENS, SEED, LR = 32, 48, 64, 0, 20.0
RTOL, ATOL = 1e-4, 1e-6


class CopyToVocabParallel(torch.autograd.Function):
    """Megatron's copy_to_tensor_model_parallel_region: the identity forward, an all-reduce of the gradient."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


def rows_of(vocab: int, rank: int, world: int) -> slice:
    """This rank's contiguous rows of the vocabulary: as DTensor's Shard(0) places them (torch.chunk's sizes)."""
    step = -(-vocab // world)
    return slice(min(rank * step, vocab), min((rank + 1) * step, vocab))


def build(vocab: int) -> tuple[torch.nn.ModuleDict, torch.nn.ModuleDict]:
    torch.manual_seed(SEED)
    student = torch.nn.ModuleDict({"body": torch.nn.Embedding(vocab, HIDDEN),
                                   "head": torch.nn.Linear(HIDDEN, vocab, bias=False)})
    teacher = torch.nn.ModuleDict({"body": torch.nn.Embedding(vocab, TEACHER_HIDDEN),
                                   "head": torch.nn.Linear(TEACHER_HIDDEN, vocab, bias=False)})
    for p in teacher.parameters():
        p.requires_grad_(False)
    return student, teacher


def batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch every step trains on (so that its loss falls as the student learns it)."""
    g = torch.Generator().manual_seed(1000)
    tokens = torch.randint(0, vocab, (TOKENS,), generator=g)
    labels = torch.randint(0, vocab, (TOKENS,), generator=g)
    labels[torch.rand(TOKENS, generator=g) < 0.25] = -100  # padding, left out
    return tokens, labels


def run(mode: str, steps: int, vocab: int) -> tuple[bool, float, float]:
    rank, world = dist.get_rank(), dist.get_world_size()
    student, teacher = build(vocab)
    whole = copy.deepcopy(student)  # one process's run, for the check
    rows = rows_of(vocab, rank, world)
    head = student["head"].weight.detach()[rows].clone().requires_grad_()
    teacher_head = teacher["head"].weight.detach()[rows].clone()
    body = student["body"]
    if mode == "dtensor":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (world,))
        head = distribute_tensor(student["head"].weight.detach(), mesh, [Shard(0)]).requires_grad_()
        teacher_head = distribute_tensor(teacher["head"].weight.detach(), mesh, [Shard(0)])
    params = [body.weight, head]
    worst, first, last = 0.0, None, None
    kwargs = dict(beta=0.5, temperature=2.0, weight_hard_loss=0.25, weight_soft_loss=1.0)
    for step in range(steps):
        tokens, labels = batch(vocab)
        hidden, teacher_hidden = body(tokens), teacher["body"](tokens)
        if mode == "group":
            loss = npu_loss_ops.fused_linear_jsd_loss(
                CopyToVocabParallel.apply(hidden), head, teacher_hidden, teacher_head, labels,
                vocab_parallel_group=dist.group.WORLD, **kwargs)
        else:
            from torch.distributed.tensor import DTensor, Replicate

            loss = npu_loss_ops.fused_linear_jsd_loss(
                DTensor.from_local(hidden, mesh, [Replicate()]), head,
                DTensor.from_local(teacher_hidden, mesh, [Replicate()]), teacher_head,
                DTensor.from_local(labels, mesh, [Replicate()]), **kwargs).full_tensor()
        loss.backward()
        # One process on the whole heads, the same step.
        reference = npu_loss_ops.fused_linear_jsd_loss(
            whole["body"](tokens), whole["head"].weight, teacher["body"](tokens), teacher["head"].weight, labels,
            **kwargs)
        reference.backward()
        head_grad = head.grad.full_tensor()[rows] if mode == "dtensor" else head.grad
        pairs = [(loss, reference), (body.weight.grad, whole["body"].weight.grad),
                 (head_grad, whole["head"].weight.grad[rows])]
        for got, want in pairs:
            torch.testing.assert_close(got.detach(), want.detach(), rtol=RTOL, atol=ATOL)
            worst = max(worst, (got.detach() - want.detach()).abs().max().item())
        with torch.no_grad():
            for p in params + list(whole.parameters()):
                p -= LR * p.grad
                p.grad = None
        first = loss.item() if first is None else first
        last = loss.item()
        if rank == 0:
            print(f"{mode:>7} step {step:2d}: loss {loss.item():.6f} (one process {reference.item():.6f})")
    return last < first, worst, last


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--vocab", type=int, default=4099, help="not divisible by the ranks: uneven slices")
    parser.add_argument("--mode", choices=("group", "dtensor", "both"), default="both")
    args = parser.parse_args()
    if "RANK" not in os.environ:
        sys.exit("run it with torchrun --nproc-per-node 2 examples/distributed_distill.py")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    ok = True
    for mode in ("group", "dtensor") if args.mode == "both" else (args.mode,):
        try:
            fell, worst, last = run(mode, args.steps, args.vocab)
        except AssertionError as exc:
            print(f"rank {dist.get_rank()}: {mode}: MISMATCH with one process: {exc}")
            ok = False
            continue
        if dist.get_rank() == 0:
            print(f"{mode}: the split matches one process (largest difference {worst:.3e}); the loss "
                  f"{'fell' if fell else 'DID NOT FALL'} to {last:.6f}")
        ok = ok and fell
    status = torch.tensor([0 if ok else 1])
    dist.all_reduce(status)
    if dist.get_rank() == 0:
        print("OK: the vocabulary split trains as one process" if status.item() == 0 else "FAILED")
    dist.barrier()
    dist.destroy_process_group()
    return int(status.item() != 0)


if __name__ == "__main__":
    sys.exit(main())
