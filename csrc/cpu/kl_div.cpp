// KL divergence on CPU: forward and gradient w.r.t. target.
#include <torch/library.h>

#include <limits>

#include "../checks.h"
#include "loops.h"
#include "vec_math.h"

namespace npu_loss::cpu {
namespace {

// target * (log(target) - self), with 0 where target == 0 (xlogy's rule).
template <typename A>
struct KlDiv {
  NPU_LOSS_INLINE A operator()(A x, A t) const {
    const A t_log_t = t == A(0) ? A(0) : t * vec_log(t);
    return t_log_t - t * x;
  }
};

// exp(target) * (target - self) for a log-space target.
template <typename A>
struct KlDivLog {
  NPU_LOSS_INLINE A operator()(A x, A t) const { return vec_exp(t) * (t - x); }
};

// g * (log(target) + 1 - self), exactly 0 where target == 0 (a zero probability gets no gradient), and NaN
// where target == +inf, as PyTorch's autograd (xlogy's t / t) and aclnn give.
template <typename A>
struct KlTargetGrad {
  NPU_LOSS_INLINE A operator()(A g, A x, A t) const {
    const A v = g * (vec_log(t) + A(1) - x);
    const A finite = t == std::numeric_limits<A>::infinity() ? std::numeric_limits<A>::quiet_NaN() : v;
    return t == A(0) ? A(0) : finite;
  }
};

// g * exp(target) * (target + 1 - self) for a log-space target.
template <typename A>
struct KlTargetGradLog {
  NPU_LOSS_INLINE A operator()(A g, A x, A t) const { return g * vec_exp(t) * (t + A(1) - x); }
};

NPU_LOSS_DEFINE_DENSE_ENTRIES(kl_div, KlDiv, KlTargetGrad)
NPU_LOSS_DEFINE_DENSE_ENTRIES(kl_div_log, KlDivLog, KlTargetGradLog)

template <bool LogTarget>
struct KlKernels {
  template <typename A>
  using Fwd = std::conditional_t<LogTarget, KlDivLog<A>, KlDiv<A>>;
  template <typename A>
  using Bwd = std::conditional_t<LogTarget, KlTargetGradLog<A>, KlTargetGrad<A>>;

  template <typename T>
  void forward_dense(const T* x, const T* t, T* out, int64_t n) const {
    if constexpr (LogTarget) {
      kl_div_log_forward(x, t, out, n, Fwd<acc_t<T>>{});
    } else {
      kl_div_forward(x, t, out, n, Fwd<acc_t<T>>{});
    }
  }
  template <typename T>
  acc_t<T> sum_dense(const T* x, const T* t, int64_t n) const {
    if constexpr (LogTarget) {
      return kl_div_log_sum(x, t, n, Fwd<acc_t<T>>{});
    } else {
      return kl_div_sum(x, t, n, Fwd<acc_t<T>>{});
    }
  }
  template <typename T>
  void backward_dense(const T* g, bool g_scalar, const T* x, const T* t, T* out, int64_t n, acc_t<T> scale) const {
    if constexpr (LogTarget) {
      kl_div_log_backward(g, g_scalar, x, t, out, n, scale, Bwd<acc_t<T>>{});
    } else {
      kl_div_backward(g, g_scalar, x, t, out, n, scale, Bwd<acc_t<T>>{});
    }
  }
  auto op() const {
    return [](auto x, auto t) { return Fwd<decltype(x)>{}(x, t); };
  }
  auto grad() const {
    return [](auto g, auto x, auto t) { return Bwd<decltype(x)>{}(g, x, t); };
  }
};

at::Tensor kl_div_cpu(const at::Tensor& self, const at::Tensor& target, int64_t reduction, bool log_target) {
  const auto spec = check_kl_div(self, target, reduction);
  return log_target ? loss_forward(self, target, reduction, spec, KlKernels<true>{})
                    : loss_forward(self, target, reduction, spec, KlKernels<false>{});
}

// Sums `values` (contiguous, viewed as rows x cols) along each row into `sums` (contiguous, `rows` long).
// Every row is cut into fixed chunks whose partials are added in order: the same bits for any thread count.
void sum_rows(const at::Tensor& values, int64_t rows, int64_t cols, const at::Tensor& sums) {
  AT_DISPATCH_FLOATING_TYPES(values.scalar_type(), "kl_div_target_backward_sum", [&] {
    const scalar_t* v = values.const_data_ptr<scalar_t>();
    scalar_t* s = sums.mutable_data_ptr<scalar_t>();
    const int64_t chunks_per_row = (cols + kSumChunk - 1) / kSumChunk;
    std::vector<double> partial(rows * chunks_per_row);
    const int64_t grain = std::max<int64_t>(1, kGrain / std::min(cols, kSumChunk));
    at::parallel_for(0, rows * chunks_per_row, grain, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t row = task / chunks_per_row;
        const int64_t lo = (task % chunks_per_row) * kSumChunk;
        const int64_t hi = std::min(cols, lo + kSumChunk);
        const scalar_t* p = v + row * cols;
        scalar_t acc = 0;
        NPU_LOSS_SIMD_SUM(acc)
        for (int64_t i = lo; i < hi; ++i) acc += p[i];
        partial[task] = acc;
      }
    });
    for (int64_t row = 0; row < rows; ++row) {
      double total = 0;
      for (int64_t c = 0; c < chunks_per_row; ++c) total += partial[row * chunks_per_row + c];
      s[row] = static_cast<scalar_t>(total);
    }
  });
}

// The gradient over broadcast(self, target), summed back to target's shape. The broadcast values go into
// one opmath temporary laid out with target's dims first and the summed dims last, so each output element
// is the sum of one contiguous row.
template <typename Kernels>
void kl_div_target_backward_reduced(
    const at::Tensor& out, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
    const ResultSpec& spec, double scale, const Kernels& kernels) {
  const auto& b = spec.broadcast_shape;
  const int64_t ndim = static_cast<int64_t>(b.size());
  const int64_t lead = ndim - target.dim();
  std::vector<int64_t> kept, summed;
  for (int64_t d = 0; d < ndim; ++d) {
    const bool broadcast_dim = d < lead || (target.size(d - lead) == 1 && b[d] != 1);
    (broadcast_dim ? summed : kept).push_back(d);
  }
  std::vector<int64_t> perm(kept);
  perm.insert(perm.end(), summed.begin(), summed.end());
  c10::DimVector permuted_shape;
  for (auto d : perm) permuted_shape.push_back(b[d]);
  std::vector<int64_t> inverse(ndim);
  for (int64_t i = 0; i < ndim; ++i) inverse[perm[i]] = i;

  const auto acc_dtype = acc_dtype_of(common_input_dtype({&grad_output, &self, &target}));
  at::Tensor values = at::empty(permuted_shape, self.options().dtype(acc_dtype));
  const auto op = kernels.grad();
  pointwise_strided(
      values.permute(inverse),
      [op, scale](auto gv, auto xv, auto tv) { return op(gv * static_cast<decltype(gv)>(scale), xv, tv); },
      grad_output, self, target);

  const int64_t rows = target.numel();
  const int64_t cols = values.numel() / rows;
  at::Tensor sums = at::empty(target.sizes(), self.options().dtype(acc_dtype));
  sum_rows(values, rows, cols, sums);
  out.copy_(sums);
}

template <typename Kernels>
void kl_div_target_backward_into(
    const at::Tensor& out, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
    int64_t reduction, const ResultSpec& spec, const Kernels& kernels) {
  if (out.numel() == 0) return;
  const int64_t n = shape_numel(spec.broadcast_shape);
  if (n == 0) {
    // Empty self with a non-empty target: the sum over nothing is zero.
    out.zero_();
    return;
  }
  const double scale = reduction_scale(reduction, n);
  if (target.sizes() == c10::IntArrayRef(spec.broadcast_shape)) {
    loss_backward_into(out, grad_output, self, target, scale, kernels);
  } else {
    kl_div_target_backward_reduced(out, grad_output, self, target, spec, scale, kernels);
  }
}

void kl_div_target_backward_dispatch(
    const at::Tensor& out, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
    int64_t reduction, bool log_target, const ResultSpec& spec) {
  if (log_target) {
    kl_div_target_backward_into(out, grad_output, self, target, reduction, spec, KlKernels<true>{});
  } else {
    kl_div_target_backward_into(out, grad_output, self, target, reduction, spec, KlKernels<false>{});
  }
}

at::Tensor kl_div_target_backward_cpu(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    bool log_target) {
  const auto spec = check_kl_div_target_backward(grad_output, self, target, reduction);
  at::Tensor grad_target = empty_result(spec, target.options());
  kl_div_target_backward_dispatch(grad_target, grad_output, self, target, reduction, log_target, spec);
  return grad_target;
}

at::Tensor& kl_div_target_backward_out_cpu(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    bool log_target, at::Tensor& grad_target) {
  const auto spec = check_kl_div_target_backward_out(grad_output, self, target, reduction, grad_target);
  kl_div_target_backward_dispatch(grad_target, grad_output, self, target, reduction, log_target, spec);
  return grad_target;
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, CPU, m) {
  m.impl("kl_div", &kl_div_cpu);
  m.impl("kl_div_target_backward", &kl_div_target_backward_cpu);
  m.impl("kl_div_target_backward.grad_target", &kl_div_target_backward_out_cpu);
}

}  // namespace npu_loss::cpu
