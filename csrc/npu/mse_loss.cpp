// MSE on the NPU: aclnnMseLoss and aclnnMseLossBackward. The backward's "mean" divides by self.numel(), as
// the op's does.
#include <torch/library.h>

#include "aclnn_api.h"
#include "npu_common.h"

namespace npu_loss::npu {
namespace {

struct MseApi {
  NPU_LOSS_PLAIN_FORWARD(aclnnMseLoss)
  NPU_LOSS_PLAIN_BACKWARD(aclnnMseLossBackward)
  // The backward API takes gradOutput and target only in self's dtype (161002 otherwise): a call with mixed
  // dtypes runs the composite, which computes in float32 as the CPU does.
  static bool takes(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target) {
    return grad_output.scalar_type() == self.scalar_type() && target.scalar_type() == self.scalar_type();
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, PrivateUse1, m) {
  impl_npu_loss<MseLoss, MseApi>(m);
}

}  // namespace npu_loss::npu
