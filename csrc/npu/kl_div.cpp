// KL divergence on the NPU: aclnnKlDiv and aclnnKlDivTargetBackward.
#include <torch/library.h>

#include "../core/backend.h"
#include "../core/checks.h"
#include "../core/composite.h"
#include "aclnn_api.h"
#include "npu_common.h"

namespace npu_loss::npu {
namespace {

void kl_div_target_backward_into(
    at::Tensor& out, const ResultSpec& spec, const at::Tensor& grad_output, const at::Tensor& self,
    const at::Tensor& target, int64_t reduction, bool log_target) {
  if (empty_sum_into(out, spec)) return;  // aclnn would leave grad_target unwritten for an empty self
  const int64_t n = numel_of(spec.broadcast_shape);
  const Chip chip = current_chip();
  if (chip == Chip::Tbe910 || chip == Chip::CompositeOnly || !NPU_LOSS_HAS_ACLNN(aclnnKlDivTargetBackward)) {
    // aclnnKlDivTargetBackward supports no dtype on Ascend 910/310P, and 310B has no aclnn loss API.
    out.copy_(composite::kl_div_target_backward(grad_output, self, target, reduction, log_target));
    return;
  }
  // Ascend 950 divides "mean" by numel(self) instead of the broadcast count: pre-scale on every chip.
  auto scaled = mean_as_scaled_sum(base_format(grad_output), reduction, n);
  at::Tensor self_nd = base_format(self), target_nd = base_format(target), result = base_format_out(out);
  // Taken before the call: out may be target itself.
  const at::Tensor zero_target = log_target ? at::Tensor() : target_nd == 0;
  // Ascend 950 feeds inputs of one half dtype to the kernel as they are and sums the broadcast dims of its
  // half results, rounding twice; float32 inputs (and result, which must have target's dtype) keep the sum
  // in float32 and the result rounded once.
  if (chip == Chip::Regbase950 && out.scalar_type() != at::kFloat && target.numel() != n) {
    scaled.grad_output = scaled.grad_output.to(at::kFloat);
    self_nd = self_nd.to(at::kFloat);
    target_nd = target_nd.to(at::kFloat);
    result = empty_with_format(out.sizes(), out.options().dtype(at::kFloat), out.suggest_memory_format());
  }
  NPU_LOSS_EXEC_ACLNN(
      aclnnKlDivTargetBackward, scaled.grad_output, self_nd, target_nd, scaled.reduction, log_target, result);
  if (zero_target.defined()) {
    // aclnn gives NaN where target == 0; this package gives 0 there (a zero probability gets a zero
    // gradient).
    result.masked_fill_(zero_target, 0);
  }
  copy_back(out, result);
}

at::Tensor kl_div_npu(const at::Tensor& self, const at::Tensor& target, int64_t reduction, bool log_target) {
  const c10::OptionalDeviceGuard guard(at::device_of(self));
  const auto spec = check_kl_div(self, target, reduction);
  if (numel_of(spec.broadcast_shape) == 0) return empty_forward(spec, reduction, self.options());
  // Only the Ascend 950 kernel is documented to give 0 at target == 0 (the others' formula gives NaN), and
  // Ascend 910/310P lack bf16: those calls run the composite fallback.
  const Chip chip = current_chip();
  const bool aclnn_serves = NPU_LOSS_HAS_ACLNN(aclnnKlDiv) &&
      (chip == Chip::Regbase950 || (chip == Chip::Tbe910B && log_target) ||
       (chip == Chip::Tbe910 && log_target && !any_bfloat16({&self, &target})));
  if (!aclnn_serves) return composite::kl_div(self, target, reduction, log_target);
  at::Tensor out = empty_result(spec, self.options());
  at::Tensor self_nd = base_format(self), target_nd = base_format(target);
  NPU_LOSS_EXEC_ACLNN(aclnnKlDiv, self_nd, target_nd, reduction, log_target, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, PrivateUse1, m) {
  impl_loss<kKlDiv, &kl_div_npu, &kl_div_target_backward_into, SelfDeviceGuard>(m);
}

}  // namespace npu_loss::npu
