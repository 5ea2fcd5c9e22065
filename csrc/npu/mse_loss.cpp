// MSE on the NPU: aclnnMseLoss and aclnnMseLossBackward. The backward's "mean" divides by self.numel(), as
// the op's does.
#include <torch/library.h>

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

struct MseApi {
  NPU_LOSS_PLAIN_CALLS(aclnnMseLoss, aclnnMseLossBackward)
  // The backward API takes gradOutput and target only in self's dtype (161002 otherwise): a call with mixed
  // dtypes runs the composite, which computes in float32 as the CPU does.
  static bool takes(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target) {
    return grad_output.scalar_type() == self.scalar_type() && target.scalar_type() == self.scalar_type();
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, PrivateUse1, m) {
  using Kernels = PlainKernels<MseLoss, MseApi>;
  impl_loss<MseLoss, &Kernels::forward, &Kernels::backward_into, SelfDeviceGuard>(m);
}

}  // namespace npu_loss::npu
