// The Meta kernels: the checks of core/checks.cpp on SymInt sizes, then an empty result of the checked
// shape, dtype and memory format (out= overloads return their out tensor). They serve tensors on the meta
// device and FakeTensorMode, which runs an op's Meta kernel when it has no Python fake kernel: so
// torch.compile (dynamic shapes included), torch.export and opcheck validate and shape every op by the same
// rules, with the same exceptions and messages, as the real kernels. Each checks before it reads an argument
// (an undefined one has no options()). _C only: a registration in the static core would be dropped by the
// linker.
#include <torch/library.h>

#include "core/checks.h"

namespace npu_loss {
namespace {

at::Tensor smooth_l1_loss_meta(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
  const auto spec = check_smooth_l1_loss<c10::SymInt>(self, target, reduction, beta);
  return empty_result(spec, self.options());
}

at::Tensor smooth_l1_loss_backward_meta(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta) {
  const auto spec = check_smooth_l1_loss_backward<c10::SymInt>(grad_output, self, target, reduction, beta);
  return empty_result(spec, self.options());
}

at::Tensor& smooth_l1_loss_backward_out_meta(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta, at::Tensor& grad_input) {
  check_smooth_l1_loss_backward_out<c10::SymInt>(grad_output, self, target, reduction, beta, grad_input);
  return grad_input;
}

at::Tensor huber_loss_meta(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double delta) {
  const auto spec = check_huber_loss<c10::SymInt>(self, target, reduction, delta);
  return empty_result(spec, self.options());
}

at::Tensor huber_loss_backward_meta(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double delta) {
  const auto spec = check_huber_loss_backward<c10::SymInt>(grad_output, self, target, reduction, delta);
  return empty_result(spec, self.options());
}

at::Tensor& huber_loss_backward_out_meta(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double delta, at::Tensor& grad_input) {
  check_huber_loss_backward_out<c10::SymInt>(grad_output, self, target, reduction, delta, grad_input);
  return grad_input;
}

at::Tensor l1_loss_meta(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const auto spec = check_l1_loss<c10::SymInt>(self, target, reduction);
  return empty_result(spec, self.options());
}

at::Tensor l1_loss_backward_meta(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const auto spec = check_l1_loss_backward<c10::SymInt>(grad_output, self, target, reduction);
  return empty_result(spec, self.options());
}

at::Tensor& l1_loss_backward_out_meta(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    at::Tensor& grad_input) {
  check_l1_loss_backward_out<c10::SymInt>(grad_output, self, target, reduction, grad_input);
  return grad_input;
}

at::Tensor kl_div_meta(const at::Tensor& self, const at::Tensor& target, int64_t reduction, bool /*log_target*/) {
  const auto spec = check_kl_div<c10::SymInt>(self, target, reduction);
  return empty_result(spec, self.options());
}

at::Tensor kl_div_target_backward_meta(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    bool /*log_target*/) {
  const auto spec = check_kl_div_target_backward<c10::SymInt>(grad_output, self, target, reduction);
  return empty_result(spec, target.options());
}

at::Tensor& kl_div_target_backward_out_meta(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    bool /*log_target*/, at::Tensor& grad_target) {
  check_kl_div_target_backward_out<c10::SymInt>(grad_output, self, target, reduction, grad_target);
  return grad_target;
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, Meta, m) {
  m.impl("smooth_l1_loss", &smooth_l1_loss_meta);
  m.impl("smooth_l1_loss_backward", &smooth_l1_loss_backward_meta);
  m.impl("smooth_l1_loss_backward.grad_input", &smooth_l1_loss_backward_out_meta);
  m.impl("l1_loss", &l1_loss_meta);
  m.impl("l1_loss_backward", &l1_loss_backward_meta);
  m.impl("l1_loss_backward.grad_input", &l1_loss_backward_out_meta);
  m.impl("kl_div", &kl_div_meta);
  m.impl("kl_div_target_backward", &kl_div_target_backward_meta);
  m.impl("kl_div_target_backward.grad_target", &kl_div_target_backward_out_meta);
  m.impl("huber_loss", &huber_loss_meta);
  m.impl("huber_loss_backward", &huber_loss_backward_meta);
  m.impl("huber_loss_backward.out", &huber_loss_backward_out_meta);
}

}  // namespace npu_loss
