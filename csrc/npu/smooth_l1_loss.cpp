// Smooth L1 loss on the NPU: aclnnSmoothL1Loss and aclnnSmoothL1LossBackward.
#include <torch/library.h>

#include "../checks.h"
#include "../composite.h"
#include "aclnn_api.h"
#include "npu_common.h"

namespace npu_loss::npu {
namespace {

// The TBE kernels of 910/910B/910_93 divide by beta + 1e-6: a relative bias of 1e-6 / beta, acceptable
// only while it stays inside the result dtype's tolerance.
bool tbe_beta_bias_acceptable(double beta, c10::ScalarType dtype) {
  const double tolerance = dtype == at::kFloat ? 1e-5 : (dtype == at::kHalf ? 1e-3 : 1.6e-2);
  return 1e-6 / beta <= tolerance;
}

// Whether this call runs on the aclnn kernel (else: the composite fallback on the NPU).
bool aclnn_backward_serves(
    Chip chip, const at::Tensor& out, const at::Tensor& grad_output, const at::Tensor& self,
    const at::Tensor& target, double beta) {
  const bool bf16 = any_bfloat16({&out, &grad_output, &self, &target});
  if (beta == 0) {
    // Runs on aclnnL1LossBackward, whose bf16 list covers only 910B/910_93.
    return !(bf16 && chip != Chip::A2A3);
  }
  switch (chip) {
    case Chip::Legacy:
      // No bf16 on Ascend 910/310P.
      return !bf16 && tbe_beta_bias_acceptable(beta, out.scalar_type());
    case Chip::A2A3:
      return tbe_beta_bias_acceptable(beta, out.scalar_type());
    case Chip::Ascend950:
      // The regbase kernel sets 1/beta to NaN for beta < 1e-6.
      return beta >= 1e-6;
  }
  return false;
}

void smooth_l1_loss_backward_into(
    at::Tensor& out, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
    int64_t reduction, double beta) {
  if (out.numel() == 0) return;  // aclnn launches nothing for empty inputs
  if (!aclnn_backward_serves(current_chip(), out, grad_output, self, target, beta)) {
    out.copy_(composite::smooth_l1_loss_backward(grad_output, self, target, reduction, beta));
    return;
  }
  if (beta == 0) {
    // beta == 0 is the L1 gradient sign(d) with sign(0) = 0; the smooth-L1 kernels disagree at d == 0 per
    // chip (NaN on Ascend 950), aclnnL1LossBackward does not. Its "mean" divides by the broadcast count,
    // smooth L1's by self.numel(): pre-scale when they differ.
    const auto scaled = self.numel() == out.numel() ? ScaledGrad{grad_output, reduction}
                                                    : mean_as_scaled_sum(grad_output, reduction, self.numel());
    NPU_LOSS_EXEC_ACLNN(aclnnL1LossBackward, scaled.grad_output, self, target, scaled.reduction, out);
    return;
  }
  // aclnn takes beta as float and reduction as int64_t; "mean" divides by numel(self), as SPEC says.
  const float beta_f = static_cast<float>(beta);
  NPU_LOSS_EXEC_ACLNN(aclnnSmoothL1LossBackward, grad_output, self, target, reduction, beta_f, out);
}

at::Tensor smooth_l1_loss_npu(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
  const c10::OptionalDeviceGuard guard(at::device_of(self));
  const auto spec = check_smooth_l1_loss(self, target, reduction, beta);
  if (shape_numel(spec.broadcast_shape) == 0) return empty_forward(spec, reduction, self.options());
  if (current_chip() == Chip::Legacy && any_bfloat16({&self, &target})) {
    return composite::smooth_l1_loss(self, target, reduction, beta);
  }
  at::Tensor out = at::empty(spec.shape, self.options().dtype(spec.dtype));
  const float beta_f = static_cast<float>(beta);
  NPU_LOSS_EXEC_ACLNN(aclnnSmoothL1Loss, self, target, reduction, beta_f, out);
  return out;
}

at::Tensor smooth_l1_loss_backward_npu(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta) {
  const c10::OptionalDeviceGuard guard(at::device_of(self));
  const auto spec = check_smooth_l1_loss_backward(grad_output, self, target, reduction, beta);
  at::Tensor grad_input = at::empty(spec.shape, self.options().dtype(spec.dtype));
  smooth_l1_loss_backward_into(grad_input, grad_output, self, target, reduction, beta);
  return grad_input;
}

at::Tensor& smooth_l1_loss_backward_out_npu(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta, at::Tensor& grad_input) {
  const c10::OptionalDeviceGuard guard(at::device_of(self));
  const auto spec = check_smooth_l1_loss_backward(grad_output, self, target, reduction, beta);
  check_out(
      "smooth_l1_loss_backward", "grad_input", grad_input, spec, OutDtype::AnyFloating,
      {{"grad_output", &grad_output}, {"self", &self}, {"target", &target}});
  smooth_l1_loss_backward_into(grad_input, grad_output, self, target, reduction, beta);
  return grad_input;
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, PrivateUse1, m) {
  m.impl("smooth_l1_loss", &smooth_l1_loss_npu);
  m.impl("smooth_l1_loss_backward", &smooth_l1_loss_backward_npu);
  m.impl("smooth_l1_loss_backward.grad_input", &smooth_l1_loss_backward_out_npu);
}

}  // namespace npu_loss::npu
