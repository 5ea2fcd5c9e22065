// L1 loss on CPU: forward and gradient w.r.t. self.
#include <torch/library.h>

#include "../core/backend.h"
#include "../core/checks.h"
#include "loops.h"

namespace npu_loss::cpu {
namespace {

// The math is dense_kernels.h's L1 and L1Grad.
constexpr LossParams kL1{LossKind::L1};

at::Tensor l1_loss_cpu(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const auto spec = LossChecks<L1Loss>::forward(self, target, reduction);
  return loss_forward(self, target, reduction, spec, kL1);
}

void l1_loss_backward_into(
    at::Tensor& out, const ResultSpec& spec, const at::Tensor& grad_output, const at::Tensor& self,
    const at::Tensor& target, int64_t reduction) {
  loss_backward_into(out, grad_output, self, target, reduction_scale(reduction, spec.mean_count), kL1);
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, CPU, m) {
  impl_loss<L1Loss, &l1_loss_cpu, &l1_loss_backward_into>(m);
}

}  // namespace npu_loss::cpu
