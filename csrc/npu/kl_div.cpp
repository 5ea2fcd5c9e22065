// KL divergence on the NPU: aclnnKlDiv and aclnnKlDivTargetBackward.
#include <torch/library.h>

#include "aclnn_api.h"
#include "npu_common.h"

namespace npu_loss::npu {
namespace {

// The forward: the generic frame around aclnnKlDiv (PlainKernels); the target gradient needs fixes.
struct KlDivApi {
  static void forward(at::Tensor self, at::Tensor target, int64_t reduction, bool log_target, at::Tensor& out) {
    NPU_LOSS_EXEC_ACLNN(aclnnKlDiv, self, target, reduction, log_target, out);
  }
};

void kl_div_target_backward_into(
    at::Tensor& out, const ResultSpec& spec, const at::Tensor& grad_output, const at::Tensor& self,
    const at::Tensor& target, int64_t reduction, bool log_target) {
  if (empty_sum_into(out, spec)) return;  // aclnn would leave grad_target unwritten for an empty self
  const auto dtypes = dtype_class({&out, &grad_output, &self, &target});
  const auto path = path_here<KlDiv, true>(dtypes, BetaClass::None, log_target);
  if (!path.aclnn) {
    out.copy_(Composite<KlDiv>::backward(grad_output, self, target, reduction, log_target));
    return;
  }
  // The op's "mean" divides by the declaration's count (the broadcast count), the kernel's may not.
  auto scaled = path.has(Fix::PrescaledMean)
      ? mean_as_scaled_sum(base_format(grad_output), reduction, spec.mean_count)
      : ScaledGrad{base_format(grad_output), reduction};
  at::Tensor self_nd = base_format(self), target_nd = base_format(target), result = base_format_out(out);
  // Taken before the call: out may be target itself.
  const at::Tensor zero_target = path.has(Fix::ZeroWhereTargetZero) ? target_nd == 0 : at::Tensor();
  // Half inputs and a result summed over broadcast dims: float32 throughout, the result rounded once.
  const bool summed = target.numel() != numel_of(spec.broadcast_shape);
  if (path.has(Fix::Float32Sum) && out.scalar_type() != at::kFloat && summed) {
    scaled.grad_output = scaled.grad_output.to(at::kFloat);
    self_nd = self_nd.to(at::kFloat);
    target_nd = target_nd.to(at::kFloat);
    result = empty_with_format(out.sizes(), out.options().dtype(at::kFloat), out.suggest_memory_format());
  }
  NPU_LOSS_EXEC_ACLNN(
      aclnnKlDivTargetBackward, scaled.grad_output, self_nd, target_nd, scaled.reduction, log_target, result);
  if (zero_target.defined()) result.masked_fill_(zero_target, 0);
  copy_back(out, result);
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, PrivateUse1, m) {
  impl_loss<KlDiv, &PlainKernels<KlDiv, KlDivApi>::forward, &kl_div_target_backward_into, SelfDeviceGuard>(m);
}

}  // namespace npu_loss::npu
