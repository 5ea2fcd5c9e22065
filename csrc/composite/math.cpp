// The fallback's math for any device without a dedicated kernel (CUDA, XPU, MPS, ... and the NPU for calls a
// chip's aclnn kernel cannot serve): each op made of ATen ops, after the same checks as every other
// backend. Math only: registration/composite.cpp registers it (with the out= overloads and the Functionalize
// kernels), and _C_npu links it too (the static library), to call the same math where the NPU falls back. One
// forward and one backward per loss, told apart by the loss's declaration type (losses.h) as their first
// argument.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <torch/library.h>

#include <limits>

#include "math.h"

#include "../core/checks.h"

namespace npu_loss {
namespace {

// The math runs in float32 (float64 when an input is float64) and is rounded once at the end.
c10::ScalarType compute_dtype(std::initializer_list<const at::Tensor*> tensors) {
  for (const auto* t : tensors) {
    if (t->scalar_type() == at::kDouble) return at::kDouble;
  }
  return at::kFloat;
}

// An input in the compute dtype. On the NPU a channels-last input is made contiguous first: some of
// torch_npu's own ATen kernels allocate their result in the input's memory format, which torch_npu cannot
// create. (The result is laid out as docs/semantics.md says at the end, by with_memory_format.)
at::Tensor operand(const at::Tensor& t, c10::ScalarType dtype) {
  at::Tensor v = t.to(dtype);
  if (v.device().type() == c10::DeviceType::PrivateUse1 && v.suggest_memory_format() != c10::MemoryFormat::Contiguous) {
    v = v.contiguous();
  }
  return v;
}

// sign(d) with sign(0) = sign(NaN) = 0.
at::Tensor sign_nan_zero(const at::Tensor& d) {
  return (d > 0).to(d.scalar_type()) - (d < 0).to(d.scalar_type());
}

// The loss from its float32/float64 elementwise values: reduced, in the result's dtype and layout.
at::Tensor loss_result(const at::Tensor& values, int64_t reduction, const ResultSpec& spec) {
  if (reduction == kNone) return with_memory_format(values.to(spec.dtype), spec.memory_format);
  return reduce_values(values, reduction).to(spec.dtype);
}


at::Tensor forward(SmoothL1Loss, const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
  const auto spec = LossChecks<SmoothL1Loss>::forward(self, target, reduction, beta);
  const auto c = compute_dtype({&self, &target});
  const auto d = operand(self, c) - operand(target, c);
  const auto ad = d.abs();
  const auto values = at::where(ad < beta, d * d * (0.5 / beta), ad - 0.5 * beta);
  return loss_result(values, reduction, spec);
}

at::Tensor backward(SmoothL1Loss, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta) {
  const auto spec = LossChecks<SmoothL1Loss>::backward(grad_output, self, target, reduction, beta);
  const auto c = compute_dtype({&grad_output, &self, &target});
  const auto d = operand(self, c) - operand(target, c);
  const auto sign = sign_nan_zero(d);
  const auto slope = beta == 0 ? sign : at::where(d.abs() >= beta, sign, d / beta);
  const auto g = operand(grad_output, c) * reduction_scale(reduction, spec.mean_count);
  return with_memory_format((g * slope).expand(spec.shape).to(spec.dtype), spec.memory_format);
}

at::Tensor forward(HuberLoss, const at::Tensor& self, const at::Tensor& target, int64_t reduction, double delta) {
  const auto spec = LossChecks<HuberLoss>::forward(self, target, reduction, delta);
  const auto c = compute_dtype({&self, &target});
  const auto d = operand(self, c) - operand(target, c);
  const auto ad = d.abs();
  const auto values = at::where(ad < delta, d * d * 0.5, (ad - 0.5 * delta) * delta);
  return loss_result(values, reduction, spec);
}

at::Tensor backward(HuberLoss, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double delta) {
  const auto spec = LossChecks<HuberLoss>::backward(grad_output, self, target, reduction, delta);
  const auto c = compute_dtype({&grad_output, &self, &target});
  // d clamped to [-delta, delta]; a NaN d stays NaN, as in ATen. A delta beyond float's range clamps no
  // float (ATen's clamp rejects such a bound for a float tensor, torch_npu's too).
  const double bound = c == at::kFloat && delta > std::numeric_limits<float>::max()
      ? std::numeric_limits<double>::infinity()
      : delta;
  const auto slope = (operand(self, c) - operand(target, c)).clamp(-bound, bound);
  const auto g = operand(grad_output, c) * reduction_scale(reduction, spec.mean_count);
  return with_memory_format((g * slope).expand(spec.shape).to(spec.dtype), spec.memory_format);
}

at::Tensor forward(L1Loss, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const auto spec = LossChecks<L1Loss>::forward(self, target, reduction);
  const auto c = compute_dtype({&self, &target});
  return loss_result((operand(self, c) - operand(target, c)).abs(), reduction, spec);
}

at::Tensor backward(L1Loss, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const auto spec = LossChecks<L1Loss>::backward(grad_output, self, target, reduction);
  const auto c = compute_dtype({&grad_output, &self, &target});
  const auto g = operand(grad_output, c) * reduction_scale(reduction, spec.mean_count);
  const auto values = g * sign_nan_zero(operand(self, c) - operand(target, c));
  return with_memory_format(values.expand(spec.shape).to(spec.dtype), spec.memory_format);
}

at::Tensor forward(KlDiv, const at::Tensor& self, const at::Tensor& target, int64_t reduction, bool log_target) {
  const auto spec = LossChecks<KlDiv>::forward(self, target, reduction, log_target);
  const auto c = compute_dtype({&self, &target});
  const auto x = operand(self, c);
  const auto t = operand(target, c);
  const auto values = log_target ? t.exp() * (t - x) : at::xlogy(t, t) - t * x;
  return loss_result(values, reduction, spec);
}

at::Tensor backward(KlDiv, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    bool log_target) {
  const auto spec = LossChecks<KlDiv>::backward(grad_output, self, target, reduction, log_target);
  const auto c = compute_dtype({&grad_output, &self, &target});
  const auto x = operand(self, c);
  const auto t = operand(target, c);
  const auto g = operand(grad_output, c) * reduction_scale(reduction, spec.mean_count);
  at::Tensor values;
  if (log_target) {
    values = g * t.exp() * (t + 1 - x);
  } else {
    // A zero probability gets a zero gradient (never NaN); +inf gives NaN, as PyTorch's autograd.
    const auto nan = at::full({}, std::numeric_limits<double>::quiet_NaN(), t.options());
    values = at::where(t == 0, at::zeros({}, t.options()), at::where(t.isposinf(), nan, g * (t.log() + 1 - x)));
  }
  values = values.expand(spec.broadcast_shape);
  return with_memory_format(at::sum_to(values, target.sizes()).to(spec.dtype), spec.memory_format);
}

at::Tensor forward(MseLoss, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const auto spec = LossChecks<MseLoss>::forward(self, target, reduction);
  const auto c = compute_dtype({&self, &target});
  const auto d = operand(self, c) - operand(target, c);
  return loss_result(d * d, reduction, spec);
}

at::Tensor backward(
    MseLoss, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const auto spec = LossChecks<MseLoss>::backward(grad_output, self, target, reduction);
  const auto c = compute_dtype({&grad_output, &self, &target});
  const auto g = operand(grad_output, c) * reduction_scale(reduction, spec.mean_count);
  const auto values = g * ((operand(self, c) - operand(target, c)) * 2);
  return with_memory_format(values.expand(spec.shape).to(spec.dtype), spec.memory_format);
}

}  // namespace

template <typename Loss, typename... S>
at::Tensor Composite<Loss, std::tuple<S...>>::forward(
    const at::Tensor& self, const at::Tensor& target, int64_t reduction, S... s) {
  return npu_loss::forward(Loss{}, self, target, reduction, s...);
}

template <typename Loss, typename... S>
at::Tensor Composite<Loss, std::tuple<S...>>::backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction, S... s) {
  return npu_loss::backward(Loss{}, grad_output, self, target, reduction, s...);
}

#define NPU_LOSS_INSTANTIATE(Loss) template struct Composite<Loss>;
NPU_LOSS_FOR_EACH_ELEMENTWISE_LOSS(NPU_LOSS_INSTANTIATE)
#undef NPU_LOSS_INSTANTIATE

}  // namespace npu_loss
