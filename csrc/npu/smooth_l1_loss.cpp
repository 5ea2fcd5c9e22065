// Smooth L1 loss on the NPU: aclnnSmoothL1Loss and aclnnSmoothL1LossBackward (and aclnnL1LossBackward at
// beta == 0 where the routing table says so).
#include <torch/library.h>

#include "aclnn_api.h"
#include "npu_common.h"

namespace npu_loss::npu {
namespace {

at::Tensor smooth_l1_loss_npu(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
  const c10::OptionalDeviceGuard guard(at::device_of(self));
  const auto spec = LossChecks<SmoothL1Loss>::forward(self, target, reduction, beta);
  if (numel_of(spec.broadcast_shape) == 0) return empty_forward(spec, reduction, self.options());
  const auto path = path_here<SmoothL1Loss, false>(
      dtype_class({&self, &target}), beta_class(beta, routing_dtype(spec.dtype)), false);
  if (!path.aclnn) return Composite<SmoothL1Loss>::forward(self, target, reduction, beta);
  at::Tensor out = empty_result(spec, self.options());
  const float beta_f = static_cast<float>(beta);  // aclnn takes beta as float
  at::Tensor self_nd = base_format(self), target_nd = base_format(target);
  NPU_LOSS_EXEC_ACLNN(aclnnSmoothL1Loss, self_nd, target_nd, reduction, beta_f, out);
  return out;
}

void smooth_l1_loss_backward_into(
    at::Tensor& out, const ResultSpec& spec, const at::Tensor& grad_output_in, const at::Tensor& self_in,
    const at::Tensor& target_in, int64_t reduction, double beta) {
  if (out.numel() == 0) return;  // aclnn launches nothing for empty inputs
  const auto path = path_here<SmoothL1Loss, true>(
      dtype_class({&out, &grad_output_in, &self_in, &target_in}),
      beta_class(beta, routing_dtype(out.scalar_type())), false);
  if (!path.aclnn) {
    out.copy_(Composite<SmoothL1Loss>::backward(grad_output_in, self_in, target_in, reduction, beta));
    return;
  }
  at::Tensor grad_output = base_format(grad_output_in), self = base_format(self_in), target = base_format(target_in),
             result = base_format_out(out);
  if (std::string_view(path.aclnn) == L1Loss::decl.aclnn_backward) {
    // aclnnL1LossBackward's "mean" divides by the broadcast count, the op's by its declared count (self's).
    auto scaled = path.has(Fix::PrescaledMean) && spec.mean_count != out.numel()
        ? mean_as_scaled_sum(grad_output, reduction, spec.mean_count)
        : ScaledGrad{grad_output, reduction};
    NPU_LOSS_EXEC_ACLNN(aclnnL1LossBackward, scaled.grad_output, self, target, scaled.reduction, result);
  } else {
    // "mean" divides by numel(self) in both kernel families, as the op does.
    const float beta_f = static_cast<float>(beta);
    NPU_LOSS_EXEC_ACLNN(aclnnSmoothL1LossBackward, grad_output, self, target, reduction, beta_f, result);
  }
  copy_back(out, result);
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, PrivateUse1, m) {
  impl_loss<SmoothL1Loss, &smooth_l1_loss_npu, &smooth_l1_loss_backward_into, SelfDeviceGuard>(m);
}

}  // namespace npu_loss::npu
