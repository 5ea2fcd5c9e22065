// Huber loss on CPU: forward and gradient w.r.t. self.
#include <torch/library.h>

#include "../core/backend.h"
#include "../core/checks.h"
#include "loops.h"

namespace npu_loss::cpu {
namespace {

// The math is dense_kernels.h's Huber and HuberGrad (computed directly, not as delta * smooth L1).
LossParams huber(double delta) {
  return {LossKind::Huber, delta};
}

at::Tensor huber_loss_cpu(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double delta) {
  const auto spec = check_huber_loss(self, target, reduction, delta);
  return loss_forward(self, target, reduction, spec, huber(delta));
}

// "mean" divides by self.numel(), as ATen does.
void huber_loss_backward_into(
    at::Tensor& out, const ResultSpec&, const at::Tensor& grad_output, const at::Tensor& self,
    const at::Tensor& target, int64_t reduction, double delta) {
  loss_backward_into(out, grad_output, self, target, reduction_scale(reduction, self.numel()), huber(delta));
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, CPU, m) {
  impl_loss<kHuberLoss, &huber_loss_cpu, &huber_loss_backward_into>(m);
}

}  // namespace npu_loss::cpu
