"""Fake (meta) kernels for every npu_loss op: the shape, dtype and validation of csrc/checks.cpp.

Registered with torch.library.register_fake, which also serves tensors on the meta device. The checks come
from _checks.py, which mirrors the C++ rules with the same exception classes and messages.
"""
import torch

from . import _checks

_register = torch.library.register_fake


def _new_result(like: torch.Tensor, spec: _checks.ResultSpec) -> torch.Tensor:
    return torch.empty(spec.shape, dtype=spec.dtype, device=like.device, memory_format=spec.memory_format)


@_register("npu_loss::smooth_l1_loss")
def _smooth_l1_loss(self, target, reduction=1, beta=1.0):
    return _new_result(self, _checks.check_smooth_l1_loss(self, target, reduction, beta))


@_register("npu_loss::smooth_l1_loss_backward")
def _smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    return _new_result(
        self, _checks.check_smooth_l1_loss_backward(grad_output, self, target, reduction, beta)
    )


@_register("npu_loss::smooth_l1_loss_backward.grad_input")
def _smooth_l1_loss_backward_out(grad_output, self, target, reduction, beta, *, grad_input):
    spec = _checks.check_smooth_l1_loss_backward(grad_output, self, target, reduction, beta)
    _checks.check_out(
        "smooth_l1_loss_backward", "grad_input", grad_input, spec, False,
        [("grad_output", grad_output), ("self", self), ("target", target)],
    )
    return grad_input


@_register("npu_loss::l1_loss")
def _l1_loss(self, target, reduction=1):
    return _new_result(self, _checks.check_l1_loss(self, target, reduction))


@_register("npu_loss::l1_loss_backward")
def _l1_loss_backward(grad_output, self, target, reduction):
    return _new_result(self, _checks.check_l1_loss_backward(grad_output, self, target, reduction))


@_register("npu_loss::l1_loss_backward.grad_input")
def _l1_loss_backward_out(grad_output, self, target, reduction, *, grad_input):
    spec = _checks.check_l1_loss_backward(grad_output, self, target, reduction)
    _checks.check_out(
        "l1_loss_backward", "grad_input", grad_input, spec, False,
        [("grad_output", grad_output), ("self", self), ("target", target)],
    )
    return grad_input


@_register("npu_loss::kl_div")
def _kl_div(self, target, reduction=1, *, log_target=False):
    return _new_result(self, _checks.check_kl_div(self, target, reduction))


@_register("npu_loss::kl_div_target_backward")
def _kl_div_target_backward(grad_output, self, target, reduction, log_target):
    return _new_result(
        target, _checks.check_kl_div_target_backward(grad_output, self, target, reduction)
    )


@_register("npu_loss::kl_div_target_backward.grad_target")
def _kl_div_target_backward_out(grad_output, self, target, reduction, log_target, *, grad_target):
    spec = _checks.check_kl_div_target_backward(grad_output, self, target, reduction)
    _checks.check_out(
        "kl_div_target_backward", "grad_target", grad_target, spec, True,
        [("grad_output", grad_output), ("self", self), ("target", target)],
    )
    return grad_target
