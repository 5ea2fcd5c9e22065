// Every loss's CPU kernels, from its declaration (losses.h): the forward, and the backward's into kernel
// for core/backend.h. The math is each loss's functors in dense_kernels.h (Math<Loss>); the loops are
// loops.h's. A gradient w.r.t. self is elementwise over the broadcast shape; one w.r.t. target (KL's) is
// summed back to target's shape.
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "../core/backend.h"
#include "../core/checks.h"
#include "loops.h"

namespace npu_loss::cpu {
namespace {

// The call's loss and scalar, as the dense kernels take them.
template <typename Loss>
LossParams params_of() {
  return {loss_index<Loss>()};
}
template <typename Loss>
LossParams params_of(double value) {
  return {.loss = loss_index<Loss>(), .float_scalar = value};
}
template <typename Loss>
LossParams params_of(bool value) {
  return {.loss = loss_index<Loss>(), .bool_scalar = value};
}

// Sums `values` (contiguous, viewed as rows x cols) along each row into `sums` (contiguous, `rows` long).
// Every row is cut into fixed chunks whose partials are added in order: the same bits for any thread count.
void sum_rows(const at::Tensor& values, int64_t rows, int64_t cols, const at::Tensor& sums) {
  AT_DISPATCH_FLOATING_TYPES(values.scalar_type(), "npu_loss_sum_rows", [&] {
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
        partial[task] = lane_blocked_sum<scalar_t>(lo, hi, [p](int64_t i) { return p[i]; });
      }
    });
    for (int64_t row = 0; row < rows; ++row) {
      double total = 0;
      for (int64_t c = 0; c < chunks_per_row; ++c) total += partial[row * chunks_per_row + c];
      s[row] = static_cast<scalar_t>(total);
    }
  });
}

// A gradient w.r.t. target over broadcast(self, target), summed back to target's shape. The broadcast values
// go into one opmath temporary laid out with target's dims first and the summed dims last, so each output
// element is the sum of one contiguous row.
void target_gradient_summed(
    const at::Tensor& out, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
    const ResultSpec& spec, double scale, const LossParams& loss) {
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

  const auto acc_dtype = acc_dtype_of(common_input_dtype({grad_output, self, target}));
  at::Tensor values = at::empty(permuted_shape, self.options().dtype(acc_dtype));
  loss_pointwise_backward(values.permute(inverse), grad_output, self, target, scale, loss);

  const int64_t rows = target.numel();
  const int64_t cols = values.numel() / rows;
  at::Tensor sums = at::empty(target.sizes(), self.options().dtype(acc_dtype));
  sum_rows(values, rows, cols, sums);
  out.copy_(sums);
}

template <typename Loss, typename Scalars = ScalarsOf<Loss>>
struct CpuKernels;

template <typename Loss, typename... S>
struct CpuKernels<Loss, std::tuple<S...>> {
  static at::Tensor forward(const at::Tensor& self, const at::Tensor& target, int64_t reduction, S... s) {
    const auto spec = LossChecks<Loss>::forward(self, target, reduction, s...);
    return loss_forward(self, target, reduction, spec, params_of<Loss>(s...));
  }

  static void backward_into(
      at::Tensor& out, const ResultSpec& spec, const at::Tensor& grad_output, const at::Tensor& self,
      const at::Tensor& target, int64_t reduction, S... s) {
    const double scale = reduction_scale(reduction, spec.mean_count);
    if constexpr (Loss::decl.grad_of == GradOf::Target) {
      if (empty_sum_into(out, spec)) return;
      if (target.sizes() != c10::IntArrayRef(spec.broadcast_shape)) {
        target_gradient_summed(out, grad_output, self, target, spec, scale, params_of<Loss>(s...));
        return;
      }
    }
    loss_backward_into(out, grad_output, self, target, scale, params_of<Loss>(s...));
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, CPU, m) {
  for_each_elementwise_loss([&]<typename Loss>() {
    impl_loss<Loss, &CpuKernels<Loss>::forward, &CpuKernels<Loss>::backward_into>(m);
  });
}

}  // namespace npu_loss::cpu
