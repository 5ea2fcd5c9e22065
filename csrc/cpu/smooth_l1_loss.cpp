// Smooth L1 loss on CPU: forward and gradient w.r.t. self.
#include <torch/library.h>

#include "../core/checks.h"
#include "loops.h"

namespace npu_loss::cpu {
namespace {

// The math is dense_kernels.h's SmoothL1 and SmoothL1Grad.
LossParams smooth_l1(double beta) {
  return {LossKind::SmoothL1, beta};
}

at::Tensor smooth_l1_loss_cpu(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
  const auto spec = check_smooth_l1_loss(self, target, reduction, beta);
  return loss_forward(self, target, reduction, spec, smooth_l1(beta));
}

// "mean" divides by self.numel(), as ATen and both Ascend kernels do.
void smooth_l1_loss_backward_into(
    const at::Tensor& out, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
    int64_t reduction, double beta) {
  loss_backward_into(
      out, grad_output, self, target, reduction_scale(reduction, self.numel()), smooth_l1(beta));
}

at::Tensor smooth_l1_loss_backward_cpu(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta) {
  const auto spec = check_smooth_l1_loss_backward(grad_output, self, target, reduction, beta);
  at::Tensor grad_input = empty_result(spec, self.options());
  smooth_l1_loss_backward_into(grad_input, grad_output, self, target, reduction, beta);
  return grad_input;
}

at::Tensor& smooth_l1_loss_backward_out_cpu(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta, at::Tensor& grad_input) {
  check_smooth_l1_loss_backward_out(grad_output, self, target, reduction, beta, grad_input);
  smooth_l1_loss_backward_into(grad_input, grad_output, self, target, reduction, beta);
  return grad_input;
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, CPU, m) {
  m.impl("smooth_l1_loss", &smooth_l1_loss_cpu);
  m.impl("smooth_l1_loss_backward", &smooth_l1_loss_backward_cpu);
  m.impl("smooth_l1_loss_backward.grad_input", &smooth_l1_loss_backward_out_cpu);
}

}  // namespace npu_loss::cpu
