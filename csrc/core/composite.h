// The composite (ATen-op) implementations of the functional ops, after the shared checks. Registered as the
// CompositeExplicitAutograd fallback in _C, and called by the NPU kernels for calls a chip's aclnn kernel
// cannot serve (compiled into _C_npu too).
#pragma once

#include <ATen/core/Tensor.h>

namespace npu_loss::composite {

at::Tensor smooth_l1_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta);
at::Tensor smooth_l1_loss_backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta);
at::Tensor huber_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double delta);
at::Tensor huber_loss_backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double delta);
at::Tensor l1_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction);
at::Tensor l1_loss_backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction);
at::Tensor kl_div(const at::Tensor& self, const at::Tensor& target, int64_t reduction, bool log_target);
at::Tensor kl_div_target_backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    bool log_target);

}  // namespace npu_loss::composite
