// MSE on the NPU: aclnnMseLoss and aclnnMseLossBackward.
#include <torch/library.h>

#include "../composite/math.h"
#include "../core/backend.h"
#include "../core/checks.h"
#include "aclnn_api.h"
#include "npu_common.h"

// The two APIs' prototypes, from hicann/ops-nn's op_api/aclnn_mse_loss.h and aclnn_mse_loss_backward.h (the
// guard of aclnn_api.h checks every call's argument types against them).
extern "C" {
aclnnStatus aclnnMseLossGetWorkspaceSize(
    const aclTensor* self, const aclTensor* target, int64_t reduction, aclTensor* out, uint64_t* workspaceSize,
    aclOpExecutor** executor);
aclnnStatus aclnnMseLossBackwardGetWorkspaceSize(
    const aclTensor* gradOutput, const aclTensor* self, const aclTensor* target, int64_t reduction,
    aclTensor* gradInput, uint64_t* workspaceSize, aclOpExecutor** executor);
}

namespace npu_loss::npu {
namespace {

at::Tensor mse_loss_npu(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const c10::OptionalDeviceGuard guard(at::device_of(self));
  const auto spec = LossChecks<MseLoss>::forward(self, target, reduction);
  if (numel_of(spec.broadcast_shape) == 0) return empty_forward(spec, reduction, self.options());
  if (!path_here<MseLoss, false>(dtype_class({&self, &target}), BetaClass::None, false).aclnn) {
    return Composite<MseLoss>::forward(self, target, reduction);
  }
  at::Tensor out = empty_result(spec, self.options());
  at::Tensor self_nd = base_format(self), target_nd = base_format(target);
  NPU_LOSS_EXEC_ACLNN(aclnnMseLoss, self_nd, target_nd, reduction, out);
  return out;
}

// "mean" divides by self.numel(), as the op does. The API takes gradOutput and target only in self's dtype
// (161002 otherwise), so a call with mixed dtypes runs the composite, which computes in float32 as the CPU does.
void mse_loss_backward_into(
    at::Tensor& out, const ResultSpec&, const at::Tensor& grad_output, const at::Tensor& self,
    const at::Tensor& target, int64_t reduction) {
  if (out.numel() == 0) return;  // aclnn launches nothing for empty inputs
  const auto dtypes = dtype_class({&out, &grad_output, &self, &target});
  const bool one_dtype =
      grad_output.scalar_type() == self.scalar_type() && target.scalar_type() == self.scalar_type();
  if (!one_dtype || !path_here<MseLoss, true>(dtypes, BetaClass::None, false).aclnn) {
    out.copy_(Composite<MseLoss>::backward(grad_output, self, target, reduction));
    return;
  }
  at::Tensor grad_output_nd = base_format(grad_output), self_nd = base_format(self),
             target_nd = base_format(target), result = base_format_out(out);
  NPU_LOSS_EXEC_ACLNN(aclnnMseLossBackward, grad_output_nd, self_nd, target_nd, reduction, result);
  copy_back(out, result);
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, PrivateUse1, m) {
  impl_loss<MseLoss, &mse_loss_npu, &mse_loss_backward_into, SelfDeviceGuard>(m);
}

}  // namespace npu_loss::npu
