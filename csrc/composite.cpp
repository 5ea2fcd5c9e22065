// The fallback for any device without a dedicated kernel (CUDA, XPU, MPS, ... and the NPU for calls a
// chip's aclnn kernel cannot serve): CompositeExplicitAutograd kernels made of ATen ops, after the same
// checks as every other backend. Also the Functionalize kernels of the out= overloads.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <torch/library.h>

#include <limits>

#include "composite.h"

#include "checks.h"

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

at::Tensor reduce_loss(const at::Tensor& values, int64_t reduction, const ResultSpec& spec) {
  switch (static_cast<Reduction>(reduction)) {
    case Reduction::None:
      return with_memory_format(values.to(spec.dtype), spec.memory_format);
    case Reduction::Mean:
      return values.mean().to(spec.dtype);
    case Reduction::Sum:
      break;
  }
  return values.sum().to(spec.dtype);
}

}  // namespace

namespace composite {

at::Tensor smooth_l1_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
  const auto spec = check_smooth_l1_loss(self, target, reduction, beta);
  const auto c = compute_dtype({&self, &target});
  const auto d = operand(self, c) - operand(target, c);
  const auto ad = d.abs();
  const auto values = at::where(ad < beta, d * d * (0.5 / beta), ad - 0.5 * beta);
  return reduce_loss(values, reduction, spec);
}

at::Tensor smooth_l1_loss_backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta) {
  const auto spec = check_smooth_l1_loss_backward(grad_output, self, target, reduction, beta);
  const auto c = compute_dtype({&grad_output, &self, &target});
  const auto d = operand(self, c) - operand(target, c);
  const auto sign = sign_nan_zero(d);
  const auto slope = beta == 0 ? sign : at::where(d.abs() >= beta, sign, d / beta);
  const auto g = operand(grad_output, c) * reduction_scale(reduction, self.numel());
  return with_memory_format((g * slope).expand(spec.shape).to(spec.dtype), spec.memory_format);
}

at::Tensor l1_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const auto spec = check_l1_loss(self, target, reduction);
  const auto c = compute_dtype({&self, &target});
  return reduce_loss((operand(self, c) - operand(target, c)).abs(), reduction, spec);
}

at::Tensor l1_loss_backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const auto spec = check_l1_loss_backward(grad_output, self, target, reduction);
  const auto c = compute_dtype({&grad_output, &self, &target});
  const auto g = operand(grad_output, c) * reduction_scale(reduction, shape_numel(spec.shape));
  const auto values = g * sign_nan_zero(operand(self, c) - operand(target, c));
  return with_memory_format(values.expand(spec.shape).to(spec.dtype), spec.memory_format);
}

at::Tensor kl_div(const at::Tensor& self, const at::Tensor& target, int64_t reduction, bool log_target) {
  const auto spec = check_kl_div(self, target, reduction);
  const auto c = compute_dtype({&self, &target});
  const auto x = operand(self, c);
  const auto t = operand(target, c);
  const auto values = log_target ? t.exp() * (t - x) : at::xlogy(t, t) - t * x;
  return reduce_loss(values, reduction, spec);
}

at::Tensor kl_div_target_backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    bool log_target) {
  const auto spec = check_kl_div_target_backward(grad_output, self, target, reduction);
  const auto c = compute_dtype({&grad_output, &self, &target});
  const auto x = operand(self, c);
  const auto t = operand(target, c);
  const auto g = operand(grad_output, c) * reduction_scale(reduction, shape_numel(spec.broadcast_shape));
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

}  // namespace composite

// The registrations live in _C only; _C_npu compiles this file for the composite math above.
#ifndef NPU_LOSS_NPU_MODULE
namespace {

at::Tensor& smooth_l1_loss_backward_out_composite(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta, at::Tensor& grad_input) {
  const auto spec = check_smooth_l1_loss_backward(grad_output, self, target, reduction, beta);
  check_out(
      "smooth_l1_loss_backward", "grad_input", grad_input, spec, OutDtype::AnyFloating,
      {{"grad_output", &grad_output}, {"self", &self}, {"target", &target}});
  return grad_input.copy_(composite::smooth_l1_loss_backward(grad_output, self, target, reduction, beta));
}

at::Tensor& l1_loss_backward_out_composite(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    at::Tensor& grad_input) {
  const auto spec = check_l1_loss_backward(grad_output, self, target, reduction);
  check_out(
      "l1_loss_backward", "grad_input", grad_input, spec, OutDtype::AnyFloating,
      {{"grad_output", &grad_output}, {"self", &self}, {"target", &target}});
  return grad_input.copy_(composite::l1_loss_backward(grad_output, self, target, reduction));
}

at::Tensor& kl_div_target_backward_out_composite(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    bool log_target, at::Tensor& grad_target) {
  const auto spec = check_kl_div_target_backward(grad_output, self, target, reduction);
  check_out(
      "kl_div_target_backward", "grad_target", grad_target, spec, OutDtype::EqualsResult,
      {{"grad_output", &grad_output}, {"self", &self}, {"target", &target}});
  return grad_target.copy_(composite::kl_div_target_backward(grad_output, self, target, reduction, log_target));
}

// Functionalize kernels: PyTorch does not functionalize a custom op whose result aliases an input, so
// each out= overload is rewritten as its functional op plus a copy into out (both functionalizable).
at::Tensor& copy_into_out(const char* op, const char* name, at::Tensor& out, const at::Tensor& result) {
  TORCH_CHECK(
      out.sym_sizes() == result.sym_sizes(), op, ": ", name, " must have shape ", result.sym_sizes(),
      " (the result's shape), got ", out.sym_sizes());
  out.copy_(result);
  return out;
}

at::Tensor& smooth_l1_loss_backward_out_functionalize(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta, at::Tensor& grad_input) {
  static auto handle = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("npu_loss::smooth_l1_loss_backward", "")
                           .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, double)>();
  const auto result = handle.call(grad_output, self, target, reduction, beta);
  return copy_into_out("smooth_l1_loss_backward", "grad_input", grad_input, result);
}

at::Tensor& l1_loss_backward_out_functionalize(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    at::Tensor& grad_input) {
  static auto handle = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("npu_loss::l1_loss_backward", "")
                           .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t)>();
  const auto result = handle.call(grad_output, self, target, reduction);
  return copy_into_out("l1_loss_backward", "grad_input", grad_input, result);
}

at::Tensor& kl_div_target_backward_out_functionalize(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    bool log_target, at::Tensor& grad_target) {
  static auto handle = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("npu_loss::kl_div_target_backward", "")
                           .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, bool)>();
  const auto result = handle.call(grad_output, self, target, reduction, log_target);
  TORCH_CHECK_TYPE(
      grad_target.scalar_type() == result.scalar_type(), "kl_div_target_backward: grad_target must have dtype ",
      c10::getDtypeNames(result.scalar_type()).first, " (the result's dtype), got ",
      c10::getDtypeNames(grad_target.scalar_type()).first);
  return copy_into_out("kl_div_target_backward", "grad_target", grad_target, result);
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, CompositeExplicitAutograd, m) {
  m.impl("smooth_l1_loss", &composite::smooth_l1_loss);
  m.impl("smooth_l1_loss_backward", &composite::smooth_l1_loss_backward);
  m.impl("smooth_l1_loss_backward.grad_input", &smooth_l1_loss_backward_out_composite);
  m.impl("l1_loss", &composite::l1_loss);
  m.impl("l1_loss_backward", &composite::l1_loss_backward);
  m.impl("l1_loss_backward.grad_input", &l1_loss_backward_out_composite);
  m.impl("kl_div", &composite::kl_div);
  m.impl("kl_div_target_backward", &composite::kl_div_target_backward);
  m.impl("kl_div_target_backward.grad_target", &kl_div_target_backward_out_composite);
}

TORCH_LIBRARY_IMPL(npu_loss, Functionalize, m) {
  m.impl("smooth_l1_loss_backward.grad_input", &smooth_l1_loss_backward_out_functionalize);
  m.impl("l1_loss_backward.grad_input", &l1_loss_backward_out_functionalize);
  m.impl("kl_div_target_backward.grad_target", &kl_div_target_backward_out_functionalize);
}
#endif  // NPU_LOSS_NPU_MODULE

}  // namespace npu_loss
