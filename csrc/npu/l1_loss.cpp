// L1 loss on the NPU: aclnnL1Loss and aclnnL1LossBackward. "mean" divides by the broadcast count in both.
// At a NaN input the 910-family TBE kernel's gradient is -grad where PyTorch gives 0: the one difference left
// to the chip.
#include <torch/library.h>

#include "aclnn_api.h"
#include "npu_common.h"

namespace npu_loss::npu {
namespace {

struct L1Api : TakesAnyDtypes {
  NPU_LOSS_PLAIN_FORWARD(aclnnL1Loss)
  NPU_LOSS_PLAIN_BACKWARD(aclnnL1LossBackward)
};

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, PrivateUse1, m) {
  impl_npu_loss<L1Loss, L1Api>(m);
}

}  // namespace npu_loss::npu
