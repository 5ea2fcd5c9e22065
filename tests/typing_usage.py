"""Typed use of npu_loss_ops' public API, as a user's code would call it.

tests/test_typing.py checks this file with ``mypy --strict`` (so every annotation here must agree with the
package's) and runs ``main()``. The name keeps pytest from collecting it as a test module.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import npu_loss_ops
from npu_loss_ops import (HuberLoss, KLDivLoss, L1Loss, MSELoss, SmoothL1Loss, huber_loss, kl_div, l1_loss, mse_loss,
                          smooth_l1_loss)
from npu_loss_ops import functional as NF
from npu_loss_ops.modules import SmoothL1Loss as SmoothL1LossFromModules


def functional_losses(pred: Tensor, target: Tensor) -> list[Tensor]:
    log_probs = pred.log_softmax(dim=-1)
    probs = target.softmax(dim=-1)
    losses: list[Tensor] = [
        smooth_l1_loss(pred, target),
        smooth_l1_loss(pred, target, reduction="sum", beta=0.5),
        smooth_l1_loss(pred, target, None, None, "none", 0.0),
        smooth_l1_loss(pred, target, beta=2),  # an int is a float to the type checker too
        l1_loss(pred, target, reduction="none"),
        kl_div(log_probs, probs, reduction="batchmean"),
        kl_div(log_probs, probs.log(), reduction="sum", log_target=True),
        NF.l1_loss(pred, target, reduction="mean"),
        huber_loss(pred, target),
        huber_loss(pred, target, "sum", 0.5),
        huber_loss(pred, target, reduction="none", delta=2),  # an int is a float here too
        NF.huber_loss(pred, target, delta=float("inf")),
        mse_loss(pred, target),
        mse_loss(pred, target, reduction="sum"),
        NF.mse_loss(pred, target, None, None, "none"),
    ]
    return losses


def weighted(pred: Tensor, target: Tensor) -> list[Tensor]:
    weight: Tensor | None = torch.rand_like(pred)
    return [
        l1_loss(pred, target, weight=weight),
        l1_loss(pred, target, None, None, "sum", weight),
        huber_loss(pred, target, weight=weight),
        huber_loss(pred, target, "none", 0.5, weight),
        huber_loss(pred, target, weight=None),
        mse_loss(pred, target, weight=weight),
        mse_loss(pred, target, None, None, "mean", weight),
    ]


def legacy_arguments(pred: Tensor, target: Tensor) -> list[Tensor]:
    size_average: bool | None = False
    reduce: bool | None = None
    return [
        l1_loss(pred, target, size_average=size_average, reduce=reduce),
        NF.smooth_l1_loss(pred, target, size_average, reduce),
        L1Loss(size_average=False)(pred, target),
        SmoothL1Loss(reduce=False, beta=0.5)(pred, target),
        KLDivLoss(size_average=None, reduce=None, reduction="sum")(pred.log_softmax(-1), target.softmax(-1)),
        MSELoss(size_average=size_average)(pred, target),
    ]


def modules(pred: Tensor, target: Tensor) -> Tensor:
    smooth: SmoothL1Loss = SmoothL1LossFromModules(beta=0.2)
    beta: float = smooth.beta
    reduction: str = smooth.reduction
    kl = KLDivLoss(reduction="batchmean", log_target=True)
    log_target: bool = kl.log_target
    huber = HuberLoss(reduction="sum", delta=0.5)
    delta: float = huber.delta
    criteria: list[torch.nn.Module] = [smooth, L1Loss(reduction="sum"), kl, huber, MSELoss(reduction="sum")]
    assert beta == 0.2 and reduction == "mean" and log_target and delta == 0.5
    # torch.nn.Module.__call__ is typed as returning Any: annotate what a loss module returns.
    total: Tensor = smooth(pred, target) + criteria[1](pred, target) + criteria[4](pred, target)
    divergence: Tensor = kl(pred.log_softmax(-1), target.log_softmax(-1))
    robust: Tensor = huber(pred, target)
    return total + divergence + robust


def training_step() -> float:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randn(8, 3)
    loss: Tensor = SmoothL1Loss(beta=0.5)(model(x), y)
    optimizer.zero_grad()
    torch.autograd.backward(loss)  # Tensor.backward is not annotated in torch
    optimizer.step()
    return loss.item()


def installation() -> tuple[str, bool, dict[str, Any]]:
    version: str = npu_loss_ops.__version__
    available: bool = npu_loss_ops.npu_kernels_available()
    info: dict[str, Any] = npu_loss_ops.build_info()
    return version, available, info


def routing(pred: Tensor, target: Tensor) -> tuple[bool, bool, str]:
    """enable() on its own, as a context manager, with one name or several; is_enabled with and without a name."""
    import torch.nn.functional as F

    npu_loss_ops.enable()
    with npu_loss_ops.enable(ops="l1_loss"), npu_loss_ops.enable(ops=["l1_loss", "kl_div"]):
        in_block: bool = npu_loss_ops.is_enabled("kl_div")
        node: str = F.l1_loss(pred, target).grad_fn.name()  # type: ignore[union-attr]  # grad_fn is Optional
    npu_loss_ops.disable()
    off: bool = npu_loss_ops.is_enabled()
    return in_block, off, node


def main() -> None:
    pred, target = torch.randn(4, 5, requires_grad=True), torch.randn(4, 5)
    for loss in functional_losses(pred, target) + weighted(pred, target) + legacy_arguments(pred, target):
        assert loss.requires_grad
    torch.autograd.backward(modules(pred, target))
    assert pred.grad is not None
    assert training_step() > 0
    version, _, info = installation()
    assert info["version"] == version
    assert routing(pred, target) == (True, False, "NpuLossL1LossBackward0")


if __name__ == "__main__":
    main()
