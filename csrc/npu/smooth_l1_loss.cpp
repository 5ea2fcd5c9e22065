// Smooth L1 loss and Huber loss on the NPU: aclnnSmoothL1Loss and aclnnSmoothL1LossBackward (and
// aclnnL1LossBackward at beta == 0 where smooth L1's chip paths say so).
//
// CANN has no Huber kernel that serves Huber (aclnnHuberLoss: A2 only, no broadcast, no reduction, no
// backward), but huber(d; delta) = delta * smooth_l1(d; beta = delta), so it runs smooth L1's kernels with
// beta = delta, on smooth L1's paths (losses.h):
// - backward: gradInput is linear in grad_output, so delta goes into it (delta * grad_output: a 0-dim
//   tensor for "mean"/"sum", a full-size one for "none");
// - forward: the result (0-dim for "mean"/"sum") is scaled by delta after the call.
// At delta == 1 the two losses are the same and the call is smooth L1's, nothing added. At delta == +inf
// delta * smooth L1 is inf * 0 (the composite serves it), and in a half dtype the unscaled huber / delta
// or the scaled grad_output can leave the dtype's range or round twice (delta != 1), so those calls run in
// float32 (Fix::Float32Scaled).
#include <ATen/ScalarOps.h>
#include <torch/library.h>

#include <string_view>

#include "aclnn_api.h"
#include "npu_common.h"

namespace npu_loss::npu {
namespace {

struct SmoothL1Api : TakesAnyDtypes {
  NPU_LOSS_PLAIN_FORWARD(aclnnSmoothL1Loss)

  static void backward(
      const Path& path, const ResultSpec& spec, at::Tensor& out, const at::Tensor& grad_output, at::Tensor self,
      at::Tensor target, int64_t reduction, double beta) {
    if (std::string_view(path.aclnn) == L1Loss::decl.aclnn_backward) {
      // aclnnL1LossBackward's "mean" divides by the broadcast count, the op's by its declared count (self's).
      auto scaled = path.has(Fix::PrescaledMean) && spec.mean_count != out.numel()
          ? mean_as_scaled_sum(grad_output, reduction, spec.mean_count)
          : ScaledGrad{grad_output, reduction};
      NPU_LOSS_EXEC_ACLNN(aclnnL1LossBackward, scaled.grad_output, self, target, scaled.reduction, out);
      return;
    }
    // "mean" divides by numel(self) in both kernel families, as the op does.
    const float beta_f = aclnn_scalar(beta);
    NPU_LOSS_EXEC_ACLNN(aclnnSmoothL1LossBackward, grad_output, self, target, reduction, beta_f, out);
  }
};

// Whether a Huber call whose values would otherwise be in `dtype` runs in float32 (Fix::Float32Scaled): a
// half dtype, on a row with that fix.
bool in_float32(const Path& path, c10::ScalarType dtype) {
  return path.has(Fix::Float32Scaled) && dtype != at::kFloat;
}

// Huber: smooth L1's calls with beta = delta, scaled by delta.
struct HuberApi : TakesAnyDtypes {
  static void forward(
      const Path& path, const ResultSpec& spec, at::Tensor& out, at::Tensor self, at::Tensor target,
      int64_t reduction, double delta) {
    if (delta == 1) return SmoothL1Api::forward(path, spec, out, self, target, reduction, delta);
    // The kernel writes huber / delta in the promoted dtype, which for a half dtype underflows where delta is
    // large (float16, delta = 1e4, d = 1e-2: 5e-9) and overflows where delta < 1 and |d| is beyond the dtype's
    // largest value (float16, delta = 0.5, d = 1.2e5: huber = 6e4 fits, huber / delta not).
    if (in_float32(path, spec.dtype)) {
      // Float32 inputs make the kernel write float32; the one scaling launch then rounds delta * that to
      // out's dtype once.
      ResultSpec spec32 = spec;
      spec32.dtype = at::kFloat;
      at::Tensor smooth = empty_result(spec32, self.options());
      SmoothL1Api::forward(path, spec32, smooth, self.to(at::kFloat), target.to(at::kFloat), reduction, delta);
      at::mul_out(out, smooth, at::native::wrapped_scalar_tensor(delta));
      return;
    }
    SmoothL1Api::forward(path, spec, out, self, target, reduction, delta);
    out.mul_(delta);  // 0-dim for "mean"/"sum"
  }

  // "mean" divides by numel(self) in both kernel families, as the op does.
  static void backward(
      const Path& path, const ResultSpec& spec, at::Tensor& out, const at::Tensor& grad_output, at::Tensor self,
      at::Tensor target, int64_t reduction, double delta) {
    if (delta == 1) return SmoothL1Api::backward(path, spec, out, grad_output, self, target, reduction, delta);
    // delta * grad_output, a new tensor (out may be grad_output itself). In a half dtype it is made in
    // float32, where it cannot overflow (delta > 1) nor round a second time; the kernel then computes in
    // float32 (the promoted dtype) and rounds the gradient once, to out's dtype.
    const at::Tensor scaled = in_float32(path, grad_output.scalar_type()) ? grad_output.to(at::kFloat).mul_(delta)
                                                                          : grad_output * delta;
    SmoothL1Api::backward(path, spec, out, scaled, self, target, reduction, delta);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, PrivateUse1, m) {
  impl_npu_loss<SmoothL1Loss, SmoothL1Api>(m);
  impl_npu_loss<HuberLoss, HuberApi>(m);
}

}  // namespace npu_loss::npu
