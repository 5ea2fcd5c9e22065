// The Meta kernels: the checks of core/checks.cpp on SymInt sizes, then an empty result of the checked
// shape, dtype and memory format (out= overloads return their out tensor). They serve tensors on the meta
// device and FakeTensorMode, which runs an op's Meta kernel when it has no Python fake kernel: so
// torch.compile (dynamic shapes included), torch.export and opcheck validate and shape every op by the same
// rules, with the same exceptions and messages, as the real kernels. Each checks before it reads an argument
// (an undefined one has no options()). _C only: a registration in the static core would be dropped by the
// linker.
#include <torch/library.h>

#include "core/backend.h"
#include "core/checks.h"

namespace npu_loss {
namespace {

// A forward (self, target, reduction, scalars...): its checks take the leading arguments they need (KL's
// no log_target).
template <auto check, typename... Scalars>
at::Tensor forward_meta(const at::Tensor& self, const at::Tensor& target, int64_t reduction, Scalars... s) {
  const auto spec = detail::check_leading(check, self, target, reduction, s...);
  return empty_result(spec, self.options());
}

// A backward op (grad_output, self, target, reduction, scalars...); the result's dtype and shape come from
// the checks, its device is every input's.
template <auto check, typename... Scalars>
at::Tensor backward_meta(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    Scalars... s) {
  const auto spec = detail::check_leading(check, grad_output, self, target, reduction, s...);
  return empty_result(spec, self.options());
}

// Its out= overload: the out= checks, then out itself.
template <auto check_out, typename... Scalars>
at::Tensor& out_meta(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    Scalars... s, at::Tensor& out) {
  detail::check_leading_and_out(check_out, out, grad_output, self, target, reduction, s...);
  return out;
}

using Sym = c10::SymInt;

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, Meta, m) {
  m.impl("smooth_l1_loss", &forward_meta<&check_smooth_l1_loss<Sym>, double>);
  m.impl("smooth_l1_loss_backward", &backward_meta<&check_smooth_l1_loss_backward<Sym>, double>);
  m.impl("smooth_l1_loss_backward.grad_input", &out_meta<&check_smooth_l1_loss_backward_out<Sym>, double>);
  m.impl("l1_loss", &forward_meta<&check_l1_loss<Sym>>);
  m.impl("l1_loss_backward", &backward_meta<&check_l1_loss_backward<Sym>>);
  m.impl("l1_loss_backward.grad_input", &out_meta<&check_l1_loss_backward_out<Sym>>);
  m.impl("kl_div", &forward_meta<&check_kl_div<Sym>, bool>);
  m.impl("kl_div_target_backward", &backward_meta<&check_kl_div_target_backward<Sym>, bool>);
  m.impl("kl_div_target_backward.grad_target", &out_meta<&check_kl_div_target_backward_out<Sym>, bool>);
  m.impl("huber_loss", &forward_meta<&check_huber_loss<Sym>, double>);
  m.impl("huber_loss_backward", &backward_meta<&check_huber_loss_backward<Sym>, double>);
  m.impl("huber_loss_backward.out", &out_meta<&check_huber_loss_backward_out<Sym>, double>);
}

}  // namespace npu_loss
