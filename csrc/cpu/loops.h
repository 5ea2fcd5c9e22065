// Loop machinery shared by the CPU kernels (docs/cpu_kernels.md).
//
// The elementwise math lives in dense_kernels.h, compiled once per instruction set (isa.h); this header
// feeds it. Two loops, chosen per call by dense_fast_path():
//  * dense operands of one dtype and one layout (contiguous, channels_last, any permutation): the dense
//    kernels run on the raw pointers, in memory order, split across the intra-op threads.
//  * everything else (broadcast, strides, mixed dtypes): TensorIterator walks the operands, and each run of
//    up to kStridedBlock elements is gathered into opmath buffers, computed by the same dense kernels
//    (float or double) and scattered to the output. Both loops compute every element with the same code,
//    so their results are bitwise equal.
// Reductions are summed in fixed-size chunks whose partials are added in a fixed order, so results are
// bitwise identical for every thread count.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <c10/core/DynamicCast.h>
#include <ATen/core/Tensor.h>

#include "../core/checks.h"
#include "isa.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace npu_loss::cpu {

// Elements per reduction chunk: fixed, so the summation order never depends on the thread count.
constexpr int64_t kSumChunk = 4096;
// Elements per task for elementwise work: small tensors stay on the calling thread.
constexpr int64_t kGrain = 32768;
// Elements gathered per dense-kernel call on the strided loop.
constexpr int64_t kStridedBlock = 256;

// The dense kernels' storage type for a floating dtype.
inline DType dense_dtype(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat:
      return DType::Float;
    case c10::kBFloat16:
      return DType::BFloat16;
    case c10::kHalf:
      return DType::Half;
    case c10::kDouble:
      return DType::Double;
    default:
      TORCH_INTERNAL_ASSERT(false, "npu_loss CPU kernels: unexpected dtype ", dtype);
  }
}

// Runs fn(begin, end) over [0, n) on the intra-op thread pool.
template <typename Fn>
void parallel_elementwise(int64_t n, const Fn& fn) {
  at::parallel_for(0, n, kGrain, fn);
}

// Deterministic sum: chunk_sum(begin, end) returns the sum of one chunk; chunks are fixed-size and their
// partials are added in index order in double.
template <typename ChunkSum>
double deterministic_sum(int64_t n, const ChunkSum& chunk_sum) {
  const int64_t chunks = (n + kSumChunk - 1) / kSumChunk;
  std::vector<double> partial(chunks);
  at::parallel_for(0, chunks, kGrain / kSumChunk, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t lo = c * kSumChunk;
      partial[c] = static_cast<double>(chunk_sum(lo, std::min(n, lo + kSumChunk)));
    }
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

// True when the dense loop applies: every tensor has `shape` and `dtype`, the first is dense (no
// gaps, no overlap: contiguous, channels_last or any other permutation) and the others have its strides,
// so element i of each is at the same offset from its data pointer. The loops then walk memory in order.
inline bool dense_fast_path(
    c10::IntArrayRef shape, c10::ScalarType dtype, std::initializer_list<const at::Tensor*> tensors) {
  const at::Tensor& first = **tensors.begin();
  if (!first.is_non_overlapping_and_dense()) return false;
  for (const auto* t : tensors) {
    if (t->scalar_type() != dtype || t->sizes() != shape || t->strides() != first.strides()) return false;
  }
  return true;
}

// The dtype the inputs are read in on the strided loop: theirs when they agree, else the promotion.
inline c10::ScalarType common_input_dtype(c10::ArrayRef<at::Tensor> tensors) {
  c10::ScalarType dtype = tensors[0].scalar_type();
  for (const auto& t : tensors) dtype = c10::promoteTypes(dtype, t.scalar_type());
  return dtype;
}

// The strided loop: out = dense(inputs...) elementwise with broadcasting and any strides. The inputs are
// gathered, kStridedBlock elements at a time, into buffers of their common dtype's opmath type (float or
// double), each read in its own dtype (no converted copy); dense(acc, inputs, result, n) computes those with
// the dense kernels; the results are stored directly when out has the inputs' dtype or the opmath dtype
// (then nothing is rounded twice), else through one temporary.
template <size_t N, typename Dense>
void pointwise_strided(const at::Tensor& out, const Dense& dense, const std::array<at::Tensor, N>& inputs) {
  const c10::ScalarType in_dtype = common_input_dtype(inputs);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, in_dtype, "npu_loss_pointwise", [&] {
    using A = at::opmath_type<scalar_t>;
    const c10::ScalarType acc_dtype = c10::CppTypeToScalarType<A>::value;
    const bool direct = out.scalar_type() == in_dtype || out.scalar_type() == acc_dtype;
    const at::Tensor dst = direct ? out : at::empty_like(out, out.options().dtype(acc_dtype));
    const bool store_acc = dst.scalar_type() == acc_dtype;
    at::TensorIteratorConfig config;
    config.check_all_same_dtype(false).add_output(dst);
    std::array<c10::ScalarType, N> dtypes;
    for (size_t k = 0; k < N; ++k) {
      config.add_const_input(inputs[k]);
      dtypes[k] = inputs[k].scalar_type();
    }
    auto iter = config.build();
    // bfloat16 inputs widened to float are still bfloat16 values: computed as the dense bfloat16 kernels
    // compute them (isa.h's FloatOfBFloat16), for the same bits on both loops.
    const bool all_bf16 = std::all_of(dtypes.begin(), dtypes.end(), [](auto d) { return d == at::kBFloat16; });
    const DType acc = all_bf16 ? DType::FloatOfBFloat16 : dense_dtype(acc_dtype);
    // One run of n elements along the innermost dimension.
    const auto run = [&](char* const* data, const int64_t* strides, int64_t n) {
      A in[N][kStridedBlock];
      A result[kStridedBlock];
      const A* in_ptrs[N];
      for (size_t k = 0; k < N; ++k) in_ptrs[k] = in[k];
      for (int64_t base = 0; base < n; base += kStridedBlock) {
        const int64_t m = std::min(kStridedBlock, n - base);
        for (size_t k = 0; k < N; ++k) {
          const char* src = data[k + 1] + base * strides[k + 1];
          if (dtypes[k] == in_dtype) {
            for (int64_t i = 0; i < m; ++i) {
              in[k][i] = static_cast<A>(*reinterpret_cast<const scalar_t*>(src + i * strides[k + 1]));
            }
          } else {  // a narrower floating dtype: widening to A is exact, as through in_dtype
            for (int64_t i = 0; i < m; ++i) in[k][i] = c10::fetch_and_cast<A>(dtypes[k], src + i * strides[k + 1]);
          }
        }
        dense(acc, in_ptrs, result, m);
        char* dst_ptr = data[0] + base * strides[0];
        for (int64_t i = 0; i < m; ++i) {
          if (store_acc) {
            *reinterpret_cast<A*>(dst_ptr + i * strides[0]) = result[i];
          } else {
            *reinterpret_cast<scalar_t*>(dst_ptr + i * strides[0]) = static_cast<scalar_t>(result[i]);
          }
        }
      }
    };
    iter.for_each([&](char** base, const int64_t* strides, int64_t size0, int64_t size1) {
      char* data[N + 1];
      for (size_t k = 0; k <= N; ++k) data[k] = base[k];
      for (int64_t j = 0; j < size1; ++j) {
        if (j > 0) {
          for (size_t k = 0; k <= N; ++k) data[k] += strides[N + 1 + k];
        }
        run(data, strides, size0);
      }
    });
    if (!direct) out.copy_(dst);
  });
}

// Deterministic sum of a contiguous buffer of the opmath dtype (float or double).
inline double sum_contiguous(const at::Tensor& values) {
  return AT_DISPATCH_FLOATING_TYPES(values.scalar_type(), "npu_loss_sum", [&] {
    const scalar_t* p = values.const_data_ptr<scalar_t>();
    return deterministic_sum(values.numel(), [p](int64_t begin, int64_t end) {
      return lane_blocked_sum<scalar_t>(begin, end, [p](int64_t i) { return p[i]; });
    });
  });
}

// The opmath dtype of a dtype: float for float32/16/bfloat16, double for float64.
inline c10::ScalarType acc_dtype_of(c10::ScalarType dtype) {
  return dtype == c10::kDouble ? c10::kDouble : c10::kFloat;
}

// The address of element i (in memory order) of a dense tensor.
inline const char* offset(const at::Tensor& t, int64_t i) {
  return static_cast<const char*>(t.const_data_ptr()) + i * t.element_size();
}

// A 0-dim result of `value` rounded to the options' dtype as scalar_tensor rounds it (double to float, then to
// a half dtype), inf beyond the dtype's range as ATen's own reductions give it. torch 2.7's scalar_tensor
// refuses such a value ("cannot be converted to type at::Half without overflow"); a cast takes the same
// rounding and never refuses, so only those values take it.
inline at::Tensor scalar_result(double value, const at::TensorOptions& options) {
  double largest = std::numeric_limits<double>::max();
  switch (options.dtype().toScalarType()) {
    case at::kHalf: largest = static_cast<double>(std::numeric_limits<c10::Half>::max()); break;
    case at::kBFloat16: largest = static_cast<double>(std::numeric_limits<c10::BFloat16>::max()); break;
    case at::kFloat: largest = std::numeric_limits<float>::max(); break;
    default: break;
  }
  if (std::isfinite(value) && std::abs(value) > largest) {
    return at::scalar_tensor(value, options.dtype(at::kDouble)).to(options.dtype());
  }
  return at::scalar_tensor(value, options);
}

// A forward loss on CPU: elementwise ('none') or a deterministic sum ('mean', 'sum').
inline at::Tensor loss_forward(
    const at::Tensor& x, const at::Tensor& t, int64_t reduction, const ResultSpec& spec, const LossParams& loss) {
  const auto& shape = spec.broadcast_shape;
  const int64_t n = numel_of(shape);
  const DenseKernels& kernels = dense_kernels();
  if (reduction == kNone) {
    at::Tensor out = empty_result(spec, x.options());
    if (n == 0) return out;
    if (dense_fast_path(shape, spec.dtype, {&out, &x, &t})) {
      const DType dtype = dense_dtype(spec.dtype);
      char* op = static_cast<char*>(out.mutable_data_ptr());
      parallel_elementwise(n, [&](int64_t b, int64_t e) {
        kernels.forward(loss, dtype, offset(x, b), offset(t, b), op + b * out.element_size(), e - b);
      });
    } else {
      pointwise_strided(out, [&](DType acc, const auto* in, auto* result, int64_t m) {
        kernels.forward(loss, acc, in[0], in[1], result, m);
      }, std::array<at::Tensor, 2>{x, t});
    }
    return out;
  }
  double total = 0;
  if (n > 0 && dense_fast_path(shape, x.scalar_type(), {&x, &t})) {
    const DType dtype = dense_dtype(x.scalar_type());
    total = deterministic_sum(n, [&](int64_t b, int64_t e) {
      return kernels.sum(loss, dtype, offset(x, b), offset(t, b), e - b);
    });
  } else if (n > 0) {
    // Mixed dtypes or layouts: one temporary in the opmath dtype, then the same deterministic sum.
    at::Tensor values = at::empty(shape, x.options().dtype(acc_dtype_of(spec.dtype)));
    pointwise_strided(values, [&](DType acc, const auto* in, auto* result, int64_t m) {
      kernels.forward(loss, acc, in[0], in[1], result, m);
    }, std::array<at::Tensor, 2>{x, t});
    total = sum_contiguous(values);
  }
  return scalar_result(reduce_total(total, reduction, n), x.options().dtype(spec.dtype));
}

// out = gradient(g * scale, x, t) elementwise, with out, g, x, t broadcast to out's shape (KL's reduced
// form sums this into target's shape: kl_div.cpp).
inline void loss_pointwise_backward(
    const at::Tensor& out, const at::Tensor& g, const at::Tensor& x, const at::Tensor& t, double scale,
    const LossParams& loss) {
  const DenseKernels& kernels = dense_kernels();
  pointwise_strided(out, [&](DType acc, const auto* in, auto* result, int64_t m) {
    kernels.backward(loss, acc, in[0], false, in[1], in[2], result, m, scale);
  }, std::array<at::Tensor, 3>{g, x, t});
}

// An elementwise loss gradient on CPU: out = gradient(g * scale, x, t) over out's shape.
inline void loss_backward_into(
    const at::Tensor& out, const at::Tensor& g, const at::Tensor& x, const at::Tensor& t, double scale,
    const LossParams& loss) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const auto shape = out.sizes();
  const bool g_scalar = g.numel() == 1;
  const bool g_scalar_or_dense = g_scalar || (g.sizes() == shape && g.strides() == out.strides());
  if (g_scalar_or_dense && g.scalar_type() == out.scalar_type() &&
      dense_fast_path(shape, out.scalar_type(), {&out, &x, &t})) {
    const DenseKernels& kernels = dense_kernels();
    const DType dtype = dense_dtype(out.scalar_type());
    char* op = static_cast<char*>(out.mutable_data_ptr());
    parallel_elementwise(n, [&](int64_t b, int64_t e) {
      kernels.backward(loss, dtype, offset(g, g_scalar ? 0 : b), g_scalar, offset(x, b), offset(t, b),
                       op + b * out.element_size(), e - b, scale);
    });
    return;
  }
  loss_pointwise_backward(out, g, x, t, scale, loss);
}

}  // namespace npu_loss::cpu
