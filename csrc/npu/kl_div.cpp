// KL divergence on the NPU: aclnnKlDiv and aclnnKlDivTargetBackward.
#include <torch/library.h>

#include "aclnn_api.h"
#include "npu_common.h"

namespace npu_loss::npu {
namespace {

struct KlDivApi : TakesAnyDtypes {
  NPU_LOSS_PLAIN_FORWARD(aclnnKlDiv)

  // The target gradient, with the fixes its row asks for.
  static void backward(
      const Path& path, const ResultSpec& spec, at::Tensor& out, const at::Tensor& grad_output, at::Tensor self,
      at::Tensor target, int64_t reduction, bool log_target) {
    // The op's "mean" divides by the declaration's count (the broadcast count), the kernel's may not.
    auto scaled = path.has(Fix::PrescaledMean) ? mean_as_scaled_sum(grad_output, reduction, spec.mean_count)
                                               : ScaledGrad{grad_output, reduction};
    // Taken before the call: out may be target itself.
    const at::Tensor zero_target = path.has(Fix::ZeroWhereTargetZero) ? target == 0 : at::Tensor();
    // Half inputs and a result summed over broadcast dims: float32 throughout, the result rounded once.
    const bool summed = target.numel() != numel_of(spec.broadcast_shape);
    at::Tensor result = out;
    if (path.has(Fix::Float32Sum) && out.scalar_type() != at::kFloat && summed) {
      scaled.grad_output = scaled.grad_output.to(at::kFloat);
      self = self.to(at::kFloat);
      target = target.to(at::kFloat);
      result = empty_with_format(out.sizes(), out.options().dtype(at::kFloat), out.suggest_memory_format());
    }
    NPU_LOSS_EXEC_ACLNN(
        aclnnKlDivTargetBackward, scaled.grad_output, self, target, scaled.reduction, log_target, result);
    if (zero_target.defined()) result.masked_fill_(zero_target, 0);
    if (!result.is_same(out)) out.copy_(result);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, PrivateUse1, m) {
  impl_npu_loss<KlDiv, KlDivApi>(m);
}

}  // namespace npu_loss::npu
