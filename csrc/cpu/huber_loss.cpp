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
  const auto spec = LossChecks<HuberLoss>::forward(self, target, reduction, delta);
  return loss_forward(self, target, reduction, spec, huber(delta));
}

void huber_loss_backward_into(
    at::Tensor& out, const ResultSpec& spec, const at::Tensor& grad_output, const at::Tensor& self,
    const at::Tensor& target, int64_t reduction, double delta) {
  loss_backward_into(out, grad_output, self, target, reduction_scale(reduction, spec.mean_count), huber(delta));
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, CPU, m) {
  impl_loss<HuberLoss, &huber_loss_cpu, &huber_loss_backward_into>(m);
}

}  // namespace npu_loss::cpu
