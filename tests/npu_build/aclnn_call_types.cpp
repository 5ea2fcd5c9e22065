// Compile-only probe of NPU_LOSS_EXEC_ACLNN's type guard (scripts/check_npu_build.py).
// Without a define it must compile; with one of the MISMATCH_* defines it must fail on the static_assert.
#include "../../csrc/npu/aclnn_api.h"

void call_smooth_l1_loss_backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, at::Tensor& out) {
#if defined(MISMATCH_DOUBLE_BETA)
  const double beta = 1.0;
#else
  const float beta = 1.0f;
#endif
#if defined(MISMATCH_INT_REDUCTION)
  const int reduction = 1;
#else
  const int64_t reduction = 1;
#endif
#if defined(MISMATCH_MISSING_ARGUMENT)
  NPU_LOSS_EXEC_ACLNN(aclnnSmoothL1LossBackward, grad_output, self, target, reduction, out);
#elif defined(MISMATCH_INT_LOG_TARGET)
  const int log_target = 0;
  NPU_LOSS_EXEC_ACLNN(aclnnKlDivTargetBackward, grad_output, self, target, reduction, log_target, out);
#else
  NPU_LOSS_EXEC_ACLNN(aclnnSmoothL1LossBackward, grad_output, self, target, reduction, beta, out);
#endif
}
