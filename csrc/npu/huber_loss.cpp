// Huber loss on the NPU. CANN has no Huber kernel that serves it (aclnnHuberLoss: A2 only, no broadcast, no
// reduction, no backward), but huber(d; delta) = delta * smooth_l1(d; beta = delta), so it runs
// aclnnSmoothL1Loss and aclnnSmoothL1LossBackward with beta = delta, on smooth L1's paths (losses.h):
// - backward: gradInput is linear in grad_output, so delta goes into it (delta * grad_output: a 0-dim
//   tensor for "mean"/"sum", a full-size one for "none");
// - forward: the result (0-dim for "mean"/"sum") is scaled by delta after the call.
// At delta == 1 the two losses are the same and the call is smooth L1's, nothing added. At delta == +inf
// delta * smooth L1 is inf * 0 (the composite serves it), and in a half dtype the unscaled huber / delta
// or the scaled grad_output can leave the dtype's range or round twice (delta != 1), so those calls run in
// float32 (Fix::Float32Scaled).
#include <ATen/ScalarOps.h>
#include <torch/library.h>

#include "aclnn_api.h"
#include "npu_common.h"

namespace npu_loss::npu {
namespace {

// Whether a call whose values would otherwise be in `dtype` runs in float32 (Fix::Float32Scaled): a half
// dtype, on a row with that fix.
bool in_float32(const Path& path, c10::ScalarType dtype) {
  return path.has(Fix::Float32Scaled) && dtype != at::kFloat;
}

at::Tensor huber_loss_npu(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double delta) {
  const c10::OptionalDeviceGuard guard(at::device_of(self));
  const auto spec = LossChecks<HuberLoss>::forward(self, target, reduction, delta);
  if (numel_of(spec.broadcast_shape) == 0) return empty_forward(spec, reduction, self.options());
  const auto path = path_here<HuberLoss, false>(
      dtype_class({&self, &target}), beta_class(delta, routing_dtype(spec.dtype)), false);
  if (!path.aclnn) return Composite<HuberLoss>::forward(self, target, reduction, delta);
  at::Tensor out = empty_result(spec, self.options());
  const float beta = static_cast<float>(delta);  // aclnn takes beta as float
  at::Tensor self_nd = base_format(self), target_nd = base_format(target);
  if (delta == 1) {
    NPU_LOSS_EXEC_ACLNN(aclnnSmoothL1Loss, self_nd, target_nd, reduction, beta, out);
    return out;
  }
  // delta != 1 here. The kernel writes huber / delta in the promoted dtype, which for a half dtype underflows
  // where delta is large (float16, delta = 1e4, d = 1e-2: 5e-9) and overflows where delta < 1 and |d| is
  // beyond the dtype's largest value (float16, delta = 0.5, d = 1.2e5: huber = 6e4 fits, huber / delta not).
  if (in_float32(path, spec.dtype)) {
    // Float32 inputs make the kernel write float32; the one scaling launch then rounds delta * that to
    // out's dtype once.
    at::Tensor self32 = self_nd.to(at::kFloat), target32 = target_nd.to(at::kFloat);
    ResultSpec spec32 = spec;
    spec32.dtype = at::kFloat;
    at::Tensor smooth = empty_result(spec32, self.options());
    NPU_LOSS_EXEC_ACLNN(aclnnSmoothL1Loss, self32, target32, reduction, beta, smooth);
    at::mul_out(out, smooth, at::native::wrapped_scalar_tensor(delta));
    return out;
  }
  NPU_LOSS_EXEC_ACLNN(aclnnSmoothL1Loss, self_nd, target_nd, reduction, beta, out);
  out.mul_(delta);  // 0-dim for "mean"/"sum"
  return out;
}

// "mean" divides by numel(self) in both kernel families, as the op does.
void huber_loss_backward_into(
    at::Tensor& out, const ResultSpec&, const at::Tensor& grad_output_in, const at::Tensor& self_in,
    const at::Tensor& target_in, int64_t reduction, double delta) {
  if (out.numel() == 0) return;  // aclnn launches nothing for empty inputs
  const auto path = path_here<HuberLoss, true>(
      dtype_class({&out, &grad_output_in, &self_in, &target_in}),
      beta_class(delta, routing_dtype(out.scalar_type())), false);
  if (!path.aclnn) {
    out.copy_(Composite<HuberLoss>::backward(grad_output_in, self_in, target_in, reduction, delta));
    return;
  }
  at::Tensor grad_output = base_format(grad_output_in), self = base_format(self_in), target = base_format(target_in),
             result = base_format_out(out);
  if (delta != 1) {
    // delta * grad_output, a new tensor (out may be grad_output itself). In a half dtype it is made in
    // float32, where it cannot overflow (delta > 1) nor round a second time; the kernel then computes in
    // float32 (the promoted dtype) and rounds the gradient once, to out's dtype.
    grad_output = in_float32(path, grad_output.scalar_type()) ? grad_output.to(at::kFloat).mul_(delta)
                                                                    : grad_output * delta;
  }
  const float beta = static_cast<float>(delta);
  NPU_LOSS_EXEC_ACLNN(aclnnSmoothL1LossBackward, grad_output, self, target, reduction, beta, result);
  copy_back(out, result);
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, PrivateUse1, m) {
  impl_loss<HuberLoss, &huber_loss_npu, &huber_loss_backward_into, SelfDeviceGuard>(m);
}

}  // namespace npu_loss::npu
