// The composite fallback's registrations: CompositeExplicitAutograd kernels for every op (the math of
// composite.cpp, plus the out= overloads writing it into out), and the Functionalize kernels of the out=
// overloads. _C only; _C_npu calls the math directly where a chip falls back.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "core/backend.h"
#include "core/checks.h"
#include "core/composite.h"
#include "ops.h"

namespace npu_loss {
namespace {

// The into kernel (core/backend.h) of a composite op: its result, copied into out.
template <auto op, typename = decltype(op)>
struct CopyInto;

template <auto op, typename... Scalars>
struct CopyInto<op, at::Tensor (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&, Scalars...)> {
  static void into(
      at::Tensor& out, const ResultSpec&, const at::Tensor& grad_output, const at::Tensor& self,
      const at::Tensor& target, Scalars... scalars) {
    out.copy_(op(grad_output, self, target, scalars...));
  }
};

// The composite's math is its own functional kernel (it runs the checks itself); the out= overload runs the
// out= checks and copies the math's result into out.
template <const auto& loss, auto forward, auto backward>
void impl_composite(torch::Library& m) {
  using Ops = std::remove_cvref_t<decltype(loss)>;
  m.impl(loss.forward, forward);
  m.impl(loss.backward, backward);
  m.impl(loss.backward_out, &BackendKernels<&CopyInto<backward>::into>::template out<Ops::check_out>);
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
  const auto result = ops::smooth_l1_loss_backward().call(grad_output, self, target, reduction, beta);
  return copy_into_out("smooth_l1_loss_backward", "grad_input", grad_input, result);
}

at::Tensor& l1_loss_backward_out_functionalize(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    at::Tensor& grad_input) {
  const auto result = ops::l1_loss_backward().call(grad_output, self, target, reduction);
  return copy_into_out("l1_loss_backward", "grad_input", grad_input, result);
}

at::Tensor& kl_div_target_backward_out_functionalize(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    bool log_target, at::Tensor& grad_target) {
  const auto result = ops::kl_div_target_backward().call(grad_output, self, target, reduction, log_target);
  TORCH_CHECK_TYPE(
      grad_target.scalar_type() == result.scalar_type(), "kl_div_target_backward: grad_target must have dtype ",
      c10::getDtypeNames(result.scalar_type()).first, " (the result's dtype), got ",
      c10::getDtypeNames(grad_target.scalar_type()).first);
  return copy_into_out("kl_div_target_backward", "grad_target", grad_target, result);
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, CompositeExplicitAutograd, m) {
  impl_composite<kSmoothL1Loss, &composite::smooth_l1_loss, &composite::smooth_l1_loss_backward>(m);
  impl_composite<kL1Loss, &composite::l1_loss, &composite::l1_loss_backward>(m);
  impl_composite<kKlDiv, &composite::kl_div, &composite::kl_div_target_backward>(m);
}

TORCH_LIBRARY_IMPL(npu_loss, Functionalize, m) {
  m.impl("smooth_l1_loss_backward.grad_input", &smooth_l1_loss_backward_out_functionalize);
  m.impl("l1_loss_backward.grad_input", &l1_loss_backward_out_functionalize);
  m.impl("kl_div_target_backward.grad_target", &kl_div_target_backward_out_functionalize);
}

}  // namespace npu_loss
