// Smooth L1 loss on CPU: forward and gradient w.r.t. self.
#include <torch/library.h>

#include "../core/backend.h"
#include "../core/checks.h"
#include "loops.h"

namespace npu_loss::cpu {
namespace {

// The math is dense_kernels.h's SmoothL1 and SmoothL1Grad.
LossParams smooth_l1(double beta) {
  return {LossKind::SmoothL1, beta};
}

at::Tensor smooth_l1_loss_cpu(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
  const auto spec = LossChecks<SmoothL1Loss>::forward(self, target, reduction, beta);
  return loss_forward(self, target, reduction, spec, smooth_l1(beta));
}

void smooth_l1_loss_backward_into(
    at::Tensor& out, const ResultSpec& spec, const at::Tensor& grad_output, const at::Tensor& self,
    const at::Tensor& target, int64_t reduction, double beta) {
  loss_backward_into(
      out, grad_output, self, target, reduction_scale(reduction, spec.mean_count), smooth_l1(beta));
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, CPU, m) {
  impl_loss<SmoothL1Loss, &smooth_l1_loss_cpu, &smooth_l1_loss_backward_into>(m);
}

}  // namespace npu_loss::cpu
