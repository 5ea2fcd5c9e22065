// L1 loss on the NPU: aclnnL1Loss and aclnnL1LossBackward.
#include <torch/library.h>

#include "../core/backend.h"
#include "../core/checks.h"
#include "../core/composite.h"
#include "aclnn_api.h"
#include "npu_common.h"

namespace npu_loss::npu {
namespace {

// aclnn's L1 kernels list bf16 from Ascend 910B on (910B, 910_93, 950); on Ascend 910/310P such calls, and
// every call on a chip or CANN without the API, run the composite fallback.
bool aclnn_serves(bool api_present, std::initializer_list<const at::Tensor*> tensors) {
  const Chip chip = current_chip();
  if (chip == Chip::CompositeOnly || !api_present) return false;
  return !(chip == Chip::Tbe910 && any_bfloat16(tensors));
}

// "mean" divides by the broadcast count. At a NaN input the 910-family TBE kernel gives -grad where PyTorch
// gives 0: the one difference left to the chip.
void l1_loss_backward_into(
    at::Tensor& out, const ResultSpec&, const at::Tensor& grad_output, const at::Tensor& self,
    const at::Tensor& target, int64_t reduction) {
  if (out.numel() == 0) return;  // aclnn launches nothing for empty inputs
  if (!aclnn_serves(NPU_LOSS_HAS_ACLNN(aclnnL1LossBackward), {&out, &grad_output, &self, &target})) {
    out.copy_(composite::l1_loss_backward(grad_output, self, target, reduction));
    return;
  }
  at::Tensor grad_output_nd = base_format(grad_output), self_nd = base_format(self),
             target_nd = base_format(target), result = base_format_out(out);
  NPU_LOSS_EXEC_ACLNN(aclnnL1LossBackward, grad_output_nd, self_nd, target_nd, reduction, result);
  copy_back(out, result);
}

at::Tensor l1_loss_npu(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const c10::OptionalDeviceGuard guard(at::device_of(self));
  const auto spec = check_l1_loss(self, target, reduction);
  if (numel_of(spec.broadcast_shape) == 0) return empty_forward(spec, reduction, self.options());
  if (!aclnn_serves(NPU_LOSS_HAS_ACLNN(aclnnL1Loss), {&self, &target})) return composite::l1_loss(self, target, reduction);
  at::Tensor out = empty_result(spec, self.options());
  at::Tensor self_nd = base_format(self), target_nd = base_format(target);
  NPU_LOSS_EXEC_ACLNN(aclnnL1Loss, self_nd, target_nd, reduction, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, PrivateUse1, m) {
  impl_loss<kL1Loss, &l1_loss_npu, &l1_loss_backward_into, SelfDeviceGuard>(m);
}

}  // namespace npu_loss::npu
