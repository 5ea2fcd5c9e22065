// The one definition of the npu_loss operator library: every schema, nothing else.
// Names and argument order follow ATen and torch_npu, so each op is a drop-in for its twin.
#include <torch/library.h>

TORCH_LIBRARY(npu_loss, m) {
  m.def("smooth_l1_loss(Tensor self, Tensor target, int reduction=1, float beta=1.0) -> Tensor");
  m.def(
      "smooth_l1_loss_backward(Tensor grad_output, Tensor self, Tensor target, int reduction, "
      "float beta) -> Tensor");
  m.def(
      "smooth_l1_loss_backward.grad_input(Tensor grad_output, Tensor self, Tensor target, int reduction, "
      "float beta, *, Tensor(a!) grad_input) -> Tensor(a!)");

  m.def("l1_loss(Tensor self, Tensor target, int reduction=1) -> Tensor");
  m.def("l1_loss_backward(Tensor grad_output, Tensor self, Tensor target, int reduction) -> Tensor");
  m.def(
      "l1_loss_backward.grad_input(Tensor grad_output, Tensor self, Tensor target, int reduction, *, "
      "Tensor(a!) grad_input) -> Tensor(a!)");

  m.def("kl_div(Tensor self, Tensor target, int reduction=1, *, bool log_target=False) -> Tensor");
  m.def(
      "kl_div_target_backward(Tensor grad_output, Tensor self, Tensor target, int reduction, "
      "bool log_target) -> Tensor");
  m.def(
      "kl_div_target_backward.grad_target(Tensor grad_output, Tensor self, Tensor target, int reduction, "
      "bool log_target, *, Tensor(a!) grad_target) -> Tensor(a!)");

  m.def("huber_loss(Tensor self, Tensor target, int reduction=1, float delta=1.0) -> Tensor");
  m.def(
      "huber_loss_backward(Tensor grad_output, Tensor self, Tensor target, int reduction, "
      "float delta) -> Tensor");
  m.def(
      "huber_loss_backward.out(Tensor grad_output, Tensor self, Tensor target, int reduction, "
      "float delta, *, Tensor(a!) grad_input) -> Tensor(a!)");
}
