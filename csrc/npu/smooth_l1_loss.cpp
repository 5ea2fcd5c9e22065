// Smooth L1 loss on the NPU: aclnnSmoothL1Loss and aclnnSmoothL1LossBackward.
#include <torch/library.h>

#include <cmath>

#include "../core/backend.h"
#include "../core/checks.h"
#include "../core/composite.h"
#include "aclnn_api.h"
#include "npu_common.h"

namespace npu_loss::npu {
namespace {

// The TBE kernels (Ascend 910, 910B, 910_93, 310P) divide by beta + 1e-6: a relative bias of 1e-6 / beta,
// acceptable only while it stays inside the result dtype's tolerance (about one unit in the last place of a
// typical gradient: float32 1e-5, float16 1e-3, bfloat16 1.6e-2).
constexpr double kTbeBetaBias = 1e-6;
// The Ascend 950 kernel sets 1 / beta to NaN below this beta.
constexpr double kRegbaseMinBeta = 1e-6;

double tbe_tolerance(c10::ScalarType dtype) {
  constexpr double kFloat32 = 1e-5, kFloat16 = 1e-3, kBFloat16 = 1.6e-2;
  return dtype == at::kFloat ? kFloat32 : (dtype == at::kHalf ? kFloat16 : kBFloat16);
}

bool tbe_beta_bias_acceptable(double beta, c10::ScalarType dtype) {
  // At beta == 0 the quadratic branch (|d| < beta) is never taken, so the bias never applies.
  return beta == 0 || kTbeBetaBias / beta <= tbe_tolerance(dtype);
}

// Which kernel serves a smooth L1 backward call (docs/npu_routing.md, "Which chips run which path").
enum class BackwardPath { SmoothL1, L1, Composite };

BackwardPath backward_path(
    Chip chip, const at::Tensor& out, const at::Tensor& grad_output, const at::Tensor& self,
    const at::Tensor& target, double beta) {
  const bool bf16 = any_bfloat16({&out, &grad_output, &self, &target});
  switch (chip) {
    case Chip::CompositeOnly:
      return BackwardPath::Composite;
    case Chip::Tbe910:
      // No bf16 on Ascend 910/310P.
      if (bf16) return BackwardPath::Composite;
      [[fallthrough]];
    case Chip::Tbe910B:
      // The TBE kernel at beta == 0 is already sign(d) with sign(0) = 0 and 0 at a NaN, the package's
      // result; aclnnL1LossBackward would give -grad at a NaN on these chips.
      if (!tbe_beta_bias_acceptable(beta, out.scalar_type()) || !NPU_LOSS_HAS_ACLNN(aclnnSmoothL1LossBackward)) {
        return BackwardPath::Composite;
      }
      return BackwardPath::SmoothL1;
    case Chip::Regbase950:
      // The regbase kernel gives NaN where |d| < beta for beta < 1e-6, and at d == 0 for beta == 0 with a
      // tensor grad_output; its L1 kernel gives sign(d) with sign(0) = 0 and 0 at a NaN.
      if (beta == 0) {
        return NPU_LOSS_HAS_ACLNN(aclnnL1LossBackward) ? BackwardPath::L1 : BackwardPath::Composite;
      }
      // At beta == +inf it multiplies d by 1/beta = 0, which is NaN at d = +-inf (the result there is +-grad).
      if (beta < kRegbaseMinBeta || std::isinf(beta) || !NPU_LOSS_HAS_ACLNN(aclnnSmoothL1LossBackward)) {
        return BackwardPath::Composite;
      }
      return BackwardPath::SmoothL1;
  }
  return BackwardPath::Composite;
}

void smooth_l1_loss_backward_into(
    at::Tensor& out, const ResultSpec&, const at::Tensor& grad_output_in, const at::Tensor& self_in,
    const at::Tensor& target_in, int64_t reduction, double beta) {
  if (out.numel() == 0) return;  // aclnn launches nothing for empty inputs
  switch (backward_path(current_chip(), out, grad_output_in, self_in, target_in, beta)) {
    case BackwardPath::Composite:
      out.copy_(composite::smooth_l1_loss_backward(grad_output_in, self_in, target_in, reduction, beta));
      return;
    case BackwardPath::L1: {
      at::Tensor grad_output = base_format(grad_output_in), self = base_format(self_in),
                 target = base_format(target_in), result = base_format_out(out);
      // aclnnL1LossBackward's "mean" divides by the broadcast count, smooth L1's by self.numel():
      // pre-scale when they differ.
      auto scaled = self.numel() == out.numel() ? ScaledGrad{grad_output, reduction}
                                                : mean_as_scaled_sum(grad_output, reduction, self.numel());
      NPU_LOSS_EXEC_ACLNN(aclnnL1LossBackward, scaled.grad_output, self, target, scaled.reduction, result);
      copy_back(out, result);
      return;
    }
    case BackwardPath::SmoothL1: {
      at::Tensor grad_output = base_format(grad_output_in), self = base_format(self_in),
                 target = base_format(target_in), result = base_format_out(out);
      // aclnn takes beta as float and reduction as int64_t; "mean" divides by numel(self), as documented.
      const float beta_f = static_cast<float>(beta);
      NPU_LOSS_EXEC_ACLNN(aclnnSmoothL1LossBackward, grad_output, self, target, reduction, beta_f, result);
      copy_back(out, result);
      return;
    }
  }
}

// aclnnSmoothL1Loss lists bf16 only from Ascend 910B on.
bool forward_on_aclnn(Chip chip, const at::Tensor& self, const at::Tensor& target) {
  if (chip == Chip::CompositeOnly || !NPU_LOSS_HAS_ACLNN(aclnnSmoothL1Loss)) return false;
  return !(chip == Chip::Tbe910 && any_bfloat16({&self, &target}));
}

at::Tensor smooth_l1_loss_npu(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
  const c10::OptionalDeviceGuard guard(at::device_of(self));
  const auto spec = check_smooth_l1_loss(self, target, reduction, beta);
  if (numel_of(spec.broadcast_shape) == 0) return empty_forward(spec, reduction, self.options());
  if (!forward_on_aclnn(current_chip(), self, target)) return composite::smooth_l1_loss(self, target, reduction, beta);
  at::Tensor out = empty_result(spec, self.options());
  const float beta_f = static_cast<float>(beta);
  at::Tensor self_nd = base_format(self), target_nd = base_format(target);
  NPU_LOSS_EXEC_ACLNN(aclnnSmoothL1Loss, self_nd, target_nd, reduction, beta_f, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, PrivateUse1, m) {
  impl_loss<kSmoothL1Loss, &smooth_l1_loss_npu, &smooth_l1_loss_backward_into, SelfDeviceGuard>(m);
}

}  // namespace npu_loss::npu
