// L1 loss on the NPU: aclnnL1Loss and aclnnL1LossBackward.
#include <torch/library.h>

#include "../core/backend.h"
#include "../core/checks.h"
#include "../composite/math.h"
#include "aclnn_api.h"
#include "npu_common.h"

namespace npu_loss::npu {
namespace {

at::Tensor l1_loss_npu(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const c10::OptionalDeviceGuard guard(at::device_of(self));
  const auto spec = LossChecks<L1Loss>::forward(self, target, reduction);
  if (numel_of(spec.broadcast_shape) == 0) return empty_forward(spec, reduction, self.options());
  if (!path_here<L1Loss, false>(dtype_class({&self, &target}), BetaClass::None, false).aclnn) {
    return Composite<L1Loss>::forward(self, target, reduction);
  }
  at::Tensor out = empty_result(spec, self.options());
  at::Tensor self_nd = base_format(self), target_nd = base_format(target);
  NPU_LOSS_EXEC_ACLNN(aclnnL1Loss, self_nd, target_nd, reduction, out);
  return out;
}

// "mean" divides by the broadcast count. At a NaN input the 910-family TBE kernel gives -grad where PyTorch
// gives 0: the one difference left to the chip.
void l1_loss_backward_into(
    at::Tensor& out, const ResultSpec&, const at::Tensor& grad_output, const at::Tensor& self,
    const at::Tensor& target, int64_t reduction) {
  if (out.numel() == 0) return;  // aclnn launches nothing for empty inputs
  const auto dtypes = dtype_class({&out, &grad_output, &self, &target});
  if (!path_here<L1Loss, true>(dtypes, BetaClass::None, false).aclnn) {
    out.copy_(Composite<L1Loss>::backward(grad_output, self, target, reduction));
    return;
  }
  at::Tensor grad_output_nd = base_format(grad_output), self_nd = base_format(self),
             target_nd = base_format(target), result = base_format_out(out);
  NPU_LOSS_EXEC_ACLNN(aclnnL1LossBackward, grad_output_nd, self_nd, target_nd, reduction, result);
  copy_back(out, result);
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, PrivateUse1, m) {
  impl_loss<L1Loss, &l1_loss_npu, &l1_loss_backward_into, SelfDeviceGuard>(m);
}

}  // namespace npu_loss::npu
