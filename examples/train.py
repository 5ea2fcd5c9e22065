"""Train a small MLP with npu_loss_ops' losses next to torch.nn's, and check that the two runs agree.

For each loss (SmoothL1Loss, L1Loss, KLDivLoss, HuberLoss, MSELoss) two copies of the same model, with the same initial weights,
see the same synthetic batches: one is trained with `npu_loss_ops.<Loss>`, the other with `torch.nn.<Loss>`.
Every step prints both losses and the largest absolute difference between the two models' gradients; the
last line is the verdict, and the exit status is 1 on a mismatch.

Runs on an Ascend NPU when torch_npu and the package's NPU kernels are available, else on the CPU.

    python examples/train.py [--steps 20] [--device cpu|npu]
"""
from __future__ import annotations

import argparse
import copy
import sys
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

try:  # torch_npu registers the "npu" device; without it (or without CANN) the example runs on the CPU.
    import torch_npu  # noqa: F401
except Exception:
    torch_npu = None

import npu_loss_ops
from npu_loss_ops.version import __version__ as npu_loss_ops_version

IN_FEATURES, HIDDEN, OUT_FEATURES = 16, 64, 8
BATCH, SEED, LR = 128, 0, 0.1
# float32 gradients of the two runs may differ only by summation order: relative 1e-5 of the gradient scale.
RTOL, ATOL = 1e-5, 1e-7


def pick_device(requested: str | None) -> torch.device:
    if requested:
        return torch.device(requested)
    npu_ready = getattr(npu_loss_ops, "npu_kernels_available", lambda: False)
    if torch_npu is not None and npu_ready():
        return torch.device("npu")
    return torch.device("cpu")


@dataclass
class Case:
    name: str
    ours: torch.nn.Module
    reference: torch.nn.Module
    # Maps (model output, batch target) to the loss module's (input, target).
    prepare: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def cases() -> list[Case]:
    regression = lambda out, target: (out, target)  # noqa: E731
    distributions = lambda out, target: (F.log_softmax(out, dim=1), F.softmax(target, dim=1))  # noqa: E731
    return [
        Case("SmoothL1Loss", npu_loss_ops.SmoothL1Loss(reduction="mean", beta=0.5),
             torch.nn.SmoothL1Loss(reduction="mean", beta=0.5), regression),
        Case("L1Loss", npu_loss_ops.L1Loss(reduction="mean"), torch.nn.L1Loss(reduction="mean"), regression),
        Case("KLDivLoss", npu_loss_ops.KLDivLoss(reduction="batchmean"),
             torch.nn.KLDivLoss(reduction="batchmean"), distributions),
        Case("HuberLoss", npu_loss_ops.HuberLoss(delta=0.5), torch.nn.HuberLoss(delta=0.5), regression),
        Case("MSELoss", npu_loss_ops.MSELoss(), torch.nn.MSELoss(), regression),
    ]


def synthetic_data(steps: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed-seed batches: inputs and noisy targets from a random 'teacher' network."""
    gen = torch.Generator().manual_seed(SEED)
    teacher_w = torch.randn(IN_FEATURES, OUT_FEATURES, generator=gen)
    batches = []
    for _ in range(steps):
        x = torch.randn(BATCH, IN_FEATURES, generator=gen)
        y = torch.tanh(x @ teacher_w) * 2 + 0.1 * torch.randn(BATCH, OUT_FEATURES, generator=gen)
        batches.append((x.to(device), y.to(device)))
    return batches


def make_model(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(
        torch.nn.Linear(IN_FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT_FEATURES)
    )
    return model.to(device)


def train_side_by_side(case: Case, batches, device: torch.device) -> tuple[float, bool]:
    """Returns the largest gradient difference seen and whether every step was within tolerance."""
    ours_model = make_model(device)
    ref_model = copy.deepcopy(ours_model)
    ours_opt = torch.optim.SGD(ours_model.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=LR)
    worst, ok = 0.0, True
    print(f"\n{case.name}: npu_loss_ops.{case.name} vs torch.nn.{case.name}")
    print(f"{'step':>4}  {'loss (ours)':>12}  {'loss (torch)':>12}  {'max |grad diff|':>15}")
    for step, (x, y) in enumerate(batches):
        losses = []
        for model, opt, loss_fn in ((ours_model, ours_opt, case.ours), (ref_model, ref_opt, case.reference)):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(*case.prepare(model(x), y))
            loss.backward()
            losses.append(loss.detach())
        grad_diff, grad_scale = 0.0, 0.0
        for p_ours, p_ref in zip(ours_model.parameters(), ref_model.parameters()):
            grad_diff = max(grad_diff, (p_ours.grad - p_ref.grad).abs().max().item())
            grad_scale = max(grad_scale, p_ref.grad.abs().max().item())
        loss_ours, loss_ref = (v.item() for v in losses)
        step_ok = (
            grad_diff <= ATOL + RTOL * grad_scale
            and abs(loss_ours - loss_ref) <= ATOL + RTOL * abs(loss_ref)
        )
        ok = ok and step_ok
        worst = max(worst, grad_diff)
        print(f"{step:>4}  {loss_ours:>12.6f}  {loss_ref:>12.6f}  {grad_diff:>15.3e}{'' if step_ok else '  <-- mismatch'}")
        ours_opt.step()
        ref_opt.step()
    return worst, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps per loss (default 20)")
    parser.add_argument("--device", default=None, help="cpu or npu (default: npu when available, else cpu)")
    args = parser.parse_args()

    device = pick_device(args.device)
    if device.type == "npu" and not npu_loss_ops.npu_kernels_available():
        print(f"the NPU was asked for, but npu_loss_ops' aclnn kernels are off: {npu_loss_ops.build_info()['npu_reason']}")
        return 1
    print(f"torch {torch.__version__}, npu_loss_ops {npu_loss_ops_version}, device {device}, "
          f"{torch.get_num_threads()} threads, {args.steps} steps per loss")
    if device.type == "npu":
        info = npu_loss_ops.build_info()
        print(f"NPU {info['npu_soc']}: {info['npu_chip']}")
    batches = synthetic_data(args.steps, device)
    results = {case.name: train_side_by_side(case, batches, device) for case in cases()}

    worst = max(diff for diff, _ in results.values())
    failed = [name for name, (_, ok) in results.items() if not ok]
    print()
    if failed:
        print(f"MISMATCH: npu_loss_ops differs from torch.nn on {', '.join(failed)} "
              f"(max grad diff {worst:.3e}, tolerance rtol {RTOL:g} atol {ATOL:g})")
        return 1
    print(f"OK: npu_loss_ops matches torch.nn on all {len(results)} losses (max grad diff {worst:.3e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
