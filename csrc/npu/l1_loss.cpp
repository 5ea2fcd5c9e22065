// L1 loss on the NPU: aclnnL1Loss and aclnnL1LossBackward. "mean" divides by the broadcast count in both.
// At a NaN input the 910-family TBE kernel's gradient is -grad where PyTorch gives 0: the one difference left
// to the chip.
#include <torch/library.h>

#include "aclnn_api.h"
#include "npu_common.h"

namespace npu_loss::npu {
namespace {

struct L1Api {
  NPU_LOSS_PLAIN_CALLS(aclnnL1Loss, aclnnL1LossBackward)
  static bool takes(const at::Tensor&, const at::Tensor&, const at::Tensor&) {
    return true;  // any mix: the API promotes
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, PrivateUse1, m) {
  using Kernels = PlainKernels<L1Loss, L1Api>;
  impl_loss<L1Loss, &Kernels::forward, &Kernels::backward_into, SelfDeviceGuard>(m);
}

}  // namespace npu_loss::npu
