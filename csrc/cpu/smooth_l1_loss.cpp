// Smooth L1 loss on CPU: forward and gradient w.r.t. self.
#include <torch/library.h>

#include "../checks.h"
#include "loops.h"

namespace npu_loss::cpu {
namespace {

template <typename A>
struct SmoothL1 {
  A beta;
  NPU_LOSS_INLINE A operator()(A x, A t) const {
    const A d = x - t;
    const A ad = std::abs(d);
    return ad < beta ? A(0.5) * d * d / beta : ad - A(0.5) * beta;
  }
};

template <typename A>
struct SmoothL1Grad {
  A beta;
  // beta == 0 is the pure L1 gradient: sign(d), with sign(0) = sign(NaN) = 0 and no division by zero.
  bool l1;
  NPU_LOSS_INLINE A operator()(A g, A x, A t) const {
    const A d = x - t;
    const A slope = (std::abs(d) >= beta || l1) ? sign_of<A>(d) : d / beta;
    return g * slope;
  }
};

NPU_LOSS_DEFINE_DENSE_ENTRIES(smooth_l1, SmoothL1, SmoothL1Grad)

struct SmoothL1Kernels {
  double beta;
  template <typename T>
  void forward_dense(const T* x, const T* t, T* out, int64_t n) const {
    smooth_l1_forward(x, t, out, n, SmoothL1<acc_t<T>>{static_cast<acc_t<T>>(beta)});
  }
  template <typename T>
  acc_t<T> sum_dense(const T* x, const T* t, int64_t n) const {
    return smooth_l1_sum(x, t, n, SmoothL1<acc_t<T>>{static_cast<acc_t<T>>(beta)});
  }
  template <typename T>
  void backward_dense(const T* g, bool g_scalar, const T* x, const T* t, T* out, int64_t n, acc_t<T> scale) const {
    smooth_l1_backward(g, g_scalar, x, t, out, n, scale, SmoothL1Grad<acc_t<T>>{static_cast<acc_t<T>>(beta), beta == 0});
  }
  auto op() const {
    const double b = beta;
    return [b](auto x, auto t) { return SmoothL1<decltype(x)>{static_cast<decltype(x)>(b)}(x, t); };
  }
  auto grad() const {
    const double b = beta;
    return [b](auto g, auto x, auto t) {
      return SmoothL1Grad<decltype(x)>{static_cast<decltype(x)>(b), b == 0}(g, x, t);
    };
  }
};

at::Tensor smooth_l1_loss_cpu(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
  const auto spec = check_smooth_l1_loss(self, target, reduction, beta);
  return loss_forward(self, target, reduction, spec, SmoothL1Kernels{beta});
}

// "mean" divides by self.numel(), as ATen and both Ascend kernels do.
void smooth_l1_loss_backward_into(
    const at::Tensor& out, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
    int64_t reduction, double beta) {
  loss_backward_into(
      out, grad_output, self, target, reduction_scale(reduction, self.numel()), SmoothL1Kernels{beta});
}

at::Tensor smooth_l1_loss_backward_cpu(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta) {
  const auto spec = check_smooth_l1_loss_backward(grad_output, self, target, reduction, beta);
  at::Tensor grad_input = empty_result(spec, self.options());
  smooth_l1_loss_backward_into(grad_input, grad_output, self, target, reduction, beta);
  return grad_input;
}

at::Tensor& smooth_l1_loss_backward_out_cpu(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta, at::Tensor& grad_input) {
  check_smooth_l1_loss_backward_out(grad_output, self, target, reduction, beta, grad_input);
  smooth_l1_loss_backward_into(grad_input, grad_output, self, target, reduction, beta);
  return grad_input;
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, CPU, m) {
  m.impl("smooth_l1_loss", &smooth_l1_loss_cpu);
  m.impl("smooth_l1_loss_backward", &smooth_l1_loss_backward_cpu);
  m.impl("smooth_l1_loss_backward.grad_input", &smooth_l1_loss_backward_out_cpu);
}

}  // namespace npu_loss::cpu
