// L1 loss on CPU: forward and gradient w.r.t. self.
#include <torch/library.h>

#include "../core/checks.h"
#include "loops.h"

namespace npu_loss::cpu {
namespace {

// The math is dense_kernels.h's L1 and L1Grad.
constexpr LossParams kL1{LossKind::L1};

at::Tensor l1_loss_cpu(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const auto spec = check_l1_loss(self, target, reduction);
  return loss_forward(self, target, reduction, spec, kL1);
}

// "mean" divides by the element count of the broadcast result.
void l1_loss_backward_into(
    const at::Tensor& out, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
    int64_t reduction) {
  loss_backward_into(out, grad_output, self, target, reduction_scale(reduction, out.numel()), kL1);
}

at::Tensor l1_loss_backward_cpu(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const auto spec = check_l1_loss_backward(grad_output, self, target, reduction);
  at::Tensor grad_input = empty_result(spec, self.options());
  l1_loss_backward_into(grad_input, grad_output, self, target, reduction);
  return grad_input;
}

at::Tensor& l1_loss_backward_out_cpu(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    at::Tensor& grad_input) {
  check_l1_loss_backward_out(grad_output, self, target, reduction, grad_input);
  l1_loss_backward_into(grad_input, grad_output, self, target, reduction);
  return grad_input;
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, CPU, m) {
  m.impl("l1_loss", &l1_loss_cpu);
  m.impl("l1_loss_backward", &l1_loss_backward_cpu);
  m.impl("l1_loss_backward.grad_input", &l1_loss_backward_out_cpu);
}

}  // namespace npu_loss::cpu
