// L1 loss on CPU: forward and gradient w.r.t. self.
#include <torch/library.h>

#include "../checks.h"
#include "loops.h"

namespace npu_loss::cpu {
namespace {

template <typename A>
struct L1 {
  NPU_LOSS_INLINE A operator()(A x, A t) const { return std::abs(x - t); }
};

template <typename A>
struct L1Grad {
  NPU_LOSS_INLINE A operator()(A g, A x, A t) const { return g * sign_of<A>(x - t); }
};

NPU_LOSS_DEFINE_DENSE_ENTRIES(l1, L1, L1Grad)

struct L1Kernels {
  template <typename T>
  void forward_dense(const T* x, const T* t, T* out, int64_t n) const {
    l1_forward(x, t, out, n, L1<acc_t<T>>{});
  }
  template <typename T>
  acc_t<T> sum_dense(const T* x, const T* t, int64_t n) const {
    return l1_sum(x, t, n, L1<acc_t<T>>{});
  }
  template <typename T>
  void backward_dense(const T* g, bool g_scalar, const T* x, const T* t, T* out, int64_t n, acc_t<T> scale) const {
    l1_backward(g, g_scalar, x, t, out, n, scale, L1Grad<acc_t<T>>{});
  }
  auto op() const {
    return [](auto x, auto t) { return L1<decltype(x)>{}(x, t); };
  }
  auto grad() const {
    return [](auto g, auto x, auto t) { return L1Grad<decltype(x)>{}(g, x, t); };
  }
};

at::Tensor l1_loss_cpu(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const auto spec = check_l1_loss(self, target, reduction);
  return loss_forward(self, target, reduction, spec, L1Kernels{});
}

// "mean" divides by the element count of the broadcast result.
void l1_loss_backward_into(
    const at::Tensor& out, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
    int64_t reduction) {
  loss_backward_into(out, grad_output, self, target, reduction_scale(reduction, out.numel()), L1Kernels{});
}

at::Tensor l1_loss_backward_cpu(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const auto spec = check_l1_loss_backward(grad_output, self, target, reduction);
  at::Tensor grad_input = empty_result(spec, self.options());
  l1_loss_backward_into(grad_input, grad_output, self, target, reduction);
  return grad_input;
}

at::Tensor& l1_loss_backward_out_cpu(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    at::Tensor& grad_input) {
  check_l1_loss_backward_out(grad_output, self, target, reduction, grad_input);
  l1_loss_backward_into(grad_input, grad_output, self, target, reduction);
  return grad_input;
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, CPU, m) {
  m.impl("l1_loss", &l1_loss_cpu);
  m.impl("l1_loss_backward", &l1_loss_backward_cpu);
  m.impl("l1_loss_backward.grad_input", &l1_loss_backward_out_cpu);
}

}  // namespace npu_loss::cpu
