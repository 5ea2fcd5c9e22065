// Loop machinery shared by the CPU kernels.
//
// Two routes, chosen per call by dense_fast_path():
//  * dense inputs of one dtype and one layout (contiguous, channels_last, any permutation): plain loops
//    over raw pointers, in memory order, that the compiler vectorizes. The loop
//    bodies are always_inline templates; each loss instantiates them inside functions marked
//    NPU_LOSS_TARGET_CLONES, so the CPU's best ISA (AVX512, AVX2, baseline) is picked at load time.
//  * everything else (broadcast, strides, mixed dtypes): TensorIterator + cpu_kernel.
// Reductions are summed in fixed-size chunks whose partials are added in a fixed order, so results are
// bitwise identical for every thread count.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/cpu/Loops.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "../checks.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
// x86-64-v4 (AVX512F/BW/DQ/VL: the BW part lets the half types' 16-bit loads and stores use 512-bit
// vectors) and x86-64-v3 (AVX2, FMA, F16C), chosen at load time by the CPU's features.
#define NPU_LOSS_TARGET_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
#endif
#ifndef NPU_LOSS_TARGET_CLONES
#define NPU_LOSS_TARGET_CLONES
#endif

#define NPU_LOSS_INLINE inline __attribute__((always_inline))

#if defined(_OPENMP) || defined(__clang__)
#define NPU_LOSS_SIMD _Pragma("omp simd")
#define NPU_LOSS_SIMD_SUM(acc) _Pragma("omp simd reduction(+ : acc)")
#else
#define NPU_LOSS_SIMD
#define NPU_LOSS_SIMD_SUM(acc)
#endif

namespace npu_loss::cpu {

template <typename T>
using acc_t = at::opmath_type<T>;

// Elements per reduction chunk: fixed, so the summation order never depends on the thread count.
constexpr int64_t kSumChunk = 4096;
// Elements per task for elementwise work: small tensors stay on the calling thread.
constexpr int64_t kGrain = 32768;

// Elements are read and written through their raw bits (uint16_t for the half types: a struct copy per
// element keeps GCC from vectorizing), converted to and from the opmath type without branches:
// bfloat16 <-> float is a 16-bit shift plus round-to-nearest-even (NaN stays a quiet NaN); float16 uses
// c10's branch-free IEEE conversions.
template <typename T>
struct Raw {
  using type = T;
  static NPU_LOSS_INLINE acc_t<T> load(T v) { return static_cast<acc_t<T>>(v); }
  static NPU_LOSS_INLINE T store(acc_t<T> v) { return static_cast<T>(v); }
};

template <>
struct Raw<c10::BFloat16> {
  using type = uint16_t;
  static NPU_LOSS_INLINE float load(uint16_t v) {
    const uint32_t bits = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  }
  static NPU_LOSS_INLINE uint16_t store(float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    const uint32_t rounded = (bits + UINT32_C(0x7FFF) + ((bits >> 16) & 1)) >> 16;
    return static_cast<uint16_t>(v != v ? UINT32_C(0x7FC0) : rounded);
  }
};

template <>
struct Raw<c10::Half> {
  using type = uint16_t;
  static NPU_LOSS_INLINE float load(uint16_t v) { return c10::detail::fp16_ieee_to_fp32_value(v); }
  static NPU_LOSS_INLINE uint16_t store(float v) { return c10::detail::fp16_ieee_from_fp32_value(v); }
};

template <typename T>
NPU_LOSS_INLINE const typename Raw<T>::type* raw(const T* p) {
  return reinterpret_cast<const typename Raw<T>::type*>(p);
}

template <typename T>
NPU_LOSS_INLINE typename Raw<T>::type* raw(T* p) {
  return reinterpret_cast<typename Raw<T>::type*>(p);
}

template <typename T>
NPU_LOSS_INLINE acc_t<T> sign_of(acc_t<T> v) {
  // NaN -> 0, as PyTorch's sgn on CPU.
  return static_cast<acc_t<T>>(v > 0) - static_cast<acc_t<T>>(v < 0);
}

// out[i] = op(g, x[i], t[i]) where g is either one value (g_scalar) or g[i].
template <typename T, typename Op>
NPU_LOSS_INLINE void backward_loop(
    const T* g, bool g_scalar, const T* x, const T* t, T* out, int64_t n, acc_t<T> scale, const Op& op) {
  using A = acc_t<T>;
  using R = Raw<T>;
  const auto* gr = raw(g);
  const auto* xr = raw(x);
  const auto* tr = raw(t);
  auto* outr = raw(out);
  if (g_scalar) {
    const A gs = R::load(gr[0]) * scale;
    NPU_LOSS_SIMD
    for (int64_t i = 0; i < n; ++i) {
      outr[i] = R::store(op(gs, R::load(xr[i]), R::load(tr[i])));
    }
  } else {
    NPU_LOSS_SIMD
    for (int64_t i = 0; i < n; ++i) {
      outr[i] = R::store(op(R::load(gr[i]) * scale, R::load(xr[i]), R::load(tr[i])));
    }
  }
}

// out[i] = op(x[i], t[i]).
template <typename T, typename Op>
NPU_LOSS_INLINE void forward_loop(const T* x, const T* t, T* out, int64_t n, const Op& op) {
  using R = Raw<T>;
  const auto* xr = raw(x);
  const auto* tr = raw(t);
  auto* outr = raw(out);
  NPU_LOSS_SIMD
  for (int64_t i = 0; i < n; ++i) {
    outr[i] = R::store(op(R::load(xr[i]), R::load(tr[i])));
  }
}

// Sum of op(x[i], t[i]) over one chunk, accumulated in acc_t<T>.
template <typename T, typename Op>
NPU_LOSS_INLINE acc_t<T> sum_loop(const T* x, const T* t, int64_t n, const Op& op) {
  using R = Raw<T>;
  const auto* xr = raw(x);
  const auto* tr = raw(t);
  acc_t<T> acc = 0;
  NPU_LOSS_SIMD_SUM(acc)
  for (int64_t i = 0; i < n; ++i) {
    acc += op(R::load(xr[i]), R::load(tr[i]));
  }
  return acc;
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

// True when the raw-pointer route applies: every tensor has `shape` and `dtype`, the first is dense (no
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

// The dtype the inputs are read in on the strided route: theirs when they agree, else the promotion.
inline c10::ScalarType common_input_dtype(std::initializer_list<const at::Tensor*> tensors) {
  c10::ScalarType dtype = (*tensors.begin())->scalar_type();
  for (const auto* t : tensors) dtype = c10::promoteTypes(dtype, t->scalar_type());
  return dtype;
}

template <typename A, typename>
using first_t = A;

// The strided route: out = op(inputs...) elementwise with broadcasting and any strides. Inputs are read in
// their common dtype (cast first only when they differ), computed in its opmath type, and stored directly
// when out has the inputs' dtype or the opmath dtype (then nothing is rounded before the store), else
// through one temporary.
template <typename Op, typename... Ts>
void pointwise_strided(const at::Tensor& out, const Op& op, const Ts&... inputs) {
  const c10::ScalarType in_dtype = common_input_dtype({&inputs...});
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, in_dtype, "npu_loss_pointwise", [&] {
    using A = acc_t<scalar_t>;
    const c10::ScalarType acc_dtype = c10::CppTypeToScalarType<A>::value;
    const bool direct = out.scalar_type() == in_dtype || out.scalar_type() == acc_dtype;
    const at::Tensor dst = direct ? out : at::empty_like(out, out.options().dtype(acc_dtype));
    at::TensorIteratorConfig config;
    config.check_all_same_dtype(false).add_output(dst);
    const at::Tensor cast[] = {inputs.scalar_type() == in_dtype ? inputs : inputs.to(in_dtype)...};
    for (const auto& c : cast) config.add_const_input(c);
    auto iter = config.build();
    if (dst.scalar_type() == in_dtype) {
      at::native::cpu_kernel(iter, [op](first_t<scalar_t, Ts>... v) -> scalar_t {
        return static_cast<scalar_t>(op(static_cast<A>(v)...));
      });
    } else {
      at::native::cpu_kernel(iter, [op](first_t<scalar_t, Ts>... v) -> A { return op(static_cast<A>(v)...); });
    }
    if (!direct) out.copy_(dst);
  });
}

// Deterministic sum of a contiguous buffer of the opmath dtype (float or double).
inline double sum_contiguous(const at::Tensor& values) {
  return AT_DISPATCH_FLOATING_TYPES(values.scalar_type(), "npu_loss_sum", [&] {
    const scalar_t* p = values.const_data_ptr<scalar_t>();
    return deterministic_sum(values.numel(), [p](int64_t begin, int64_t end) {
      scalar_t acc = 0;
      NPU_LOSS_SIMD_SUM(acc)
      for (int64_t i = begin; i < end; ++i) acc += p[i];
      return acc;
    });
  });
}

// The opmath dtype of a dtype: float for float32/16/bfloat16, double for float64.
inline c10::ScalarType acc_dtype_of(c10::ScalarType dtype) {
  return dtype == c10::kDouble ? c10::kDouble : c10::kFloat;
}

// A forward loss on CPU. Loss provides, for each floating T: forward_dense(x, t, out, n) and
// sum_dense(x, t, n) (the target_clones entries), and op(), a generic functor (x, t) -> loss.
template <typename Loss>
at::Tensor loss_forward(
    const at::Tensor& x, const at::Tensor& t, int64_t reduction, const ResultSpec& spec, const Loss& loss) {
  const auto& shape = spec.broadcast_shape;
  const int64_t n = shape_numel(shape);
  const auto options = x.options().dtype(spec.dtype);
  if (reduction == static_cast<int64_t>(Reduction::None)) {
    at::Tensor out = empty_result(spec, x.options());
    if (n == 0) return out;
    if (dense_fast_path(shape, spec.dtype, {&out, &x, &t})) {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, spec.dtype, "npu_loss_forward", [&] {
        const scalar_t* xp = x.const_data_ptr<scalar_t>();
        const scalar_t* tp = t.const_data_ptr<scalar_t>();
        scalar_t* op = out.mutable_data_ptr<scalar_t>();
        parallel_elementwise(n, [&](int64_t b, int64_t e) { loss.forward_dense(xp + b, tp + b, op + b, e - b); });
      });
    } else {
      pointwise_strided(out, loss.op(), x, t);
    }
    return out;
  }
  double total = 0;
  if (n > 0 && dense_fast_path(shape, x.scalar_type(), {&x, &t})) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "npu_loss_forward_sum", [&] {
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      const scalar_t* tp = t.const_data_ptr<scalar_t>();
      total = deterministic_sum(n, [&](int64_t b, int64_t e) { return loss.sum_dense(xp + b, tp + b, e - b); });
    });
  } else if (n > 0) {
    // Mixed dtypes or layouts: one temporary in the opmath dtype, then the same deterministic sum.
    at::Tensor values = at::empty(shape, x.options().dtype(acc_dtype_of(spec.dtype)));
    pointwise_strided(values, loss.op(), x, t);
    total = sum_contiguous(values);
  }
  // An empty mean is 0 / 0 = NaN, as in PyTorch.
  const double value = reduction == static_cast<int64_t>(Reduction::Mean) ? total / static_cast<double>(n) : total;
  return at::scalar_tensor(value, options);
}

// An elementwise loss gradient on CPU: out = grad(g * scale, x, t) over the broadcast shape. Grad provides,
// for each floating T, backward_dense(g, g_scalar, x, t, out, n, scale) (the target_clones entry) and
// grad(), a generic functor (g, x, t) -> gradient.
template <typename Grad>
void loss_backward_into(
    const at::Tensor& out, const at::Tensor& g, const at::Tensor& x, const at::Tensor& t, double scale,
    const Grad& grad) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const auto shape = out.sizes();
  const bool g_scalar_or_dense = g.numel() == 1 || (g.sizes() == shape && g.strides() == out.strides());
  if (g_scalar_or_dense && g.scalar_type() == out.scalar_type() &&
      dense_fast_path(shape, out.scalar_type(), {&out, &x, &t})) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "npu_loss_backward", [&] {
      using A = acc_t<scalar_t>;
      const bool g_scalar = g.numel() == 1;
      const scalar_t* gp = g.const_data_ptr<scalar_t>();
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      const scalar_t* tp = t.const_data_ptr<scalar_t>();
      scalar_t* op = out.mutable_data_ptr<scalar_t>();
      parallel_elementwise(n, [&](int64_t b, int64_t e) {
        grad.backward_dense(gp + (g_scalar ? 0 : b), g_scalar, xp + b, tp + b, op + b, e - b, static_cast<A>(scale));
      });
    });
    return;
  }
  const auto op = grad.grad();
  pointwise_strided(
      out, [op, scale](auto gv, auto xv, auto tv) { return op(gv * static_cast<decltype(gv)>(scale), xv, tv); },
      g, x, t);
}

}  // namespace npu_loss::cpu

// Defines the target_clones entry points of one loss for every floating dtype: NAME_forward and NAME_sum
// run the forward math FWD<A>, NAME_backward the gradient math BWD<A> (A = the opmath type). The entries
// are overloads on T; each is its own symbol, so the loop inside is compiled once per ISA.
#define NPU_LOSS_DEFINE_DENSE_ENTRIES_FOR(T, NAME, FWD, BWD)                                               \
  NPU_LOSS_TARGET_CLONES void NAME##_forward(                                                          \
      const T* x, const T* t, T* out, int64_t n, FWD<::npu_loss::cpu::acc_t<T>> f) {                    \
    ::npu_loss::cpu::forward_loop(x, t, out, n, f);                                                    \
  }                                                                                                    \
  NPU_LOSS_TARGET_CLONES ::npu_loss::cpu::acc_t<T> NAME##_sum(                                         \
      const T* x, const T* t, int64_t n, FWD<::npu_loss::cpu::acc_t<T>> f) {                            \
    return ::npu_loss::cpu::sum_loop(x, t, n, f);                                                      \
  }                                                                                                    \
  NPU_LOSS_TARGET_CLONES void NAME##_backward(                                                         \
      const T* g, bool g_scalar, const T* x, const T* t, T* out, int64_t n,                             \
      ::npu_loss::cpu::acc_t<T> scale, BWD<::npu_loss::cpu::acc_t<T>> b) {                              \
    ::npu_loss::cpu::backward_loop(g, g_scalar, x, t, out, n, scale, b);                               \
  }

#define NPU_LOSS_DEFINE_DENSE_ENTRIES(NAME, FWD, BWD)                         \
  NPU_LOSS_DEFINE_DENSE_ENTRIES_FOR(float, NAME, FWD, BWD)                    \
  NPU_LOSS_DEFINE_DENSE_ENTRIES_FOR(double, NAME, FWD, BWD)                   \
  NPU_LOSS_DEFINE_DENSE_ENTRIES_FOR(c10::Half, NAME, FWD, BWD)                \
  NPU_LOSS_DEFINE_DENSE_ENTRIES_FOR(c10::BFloat16, NAME, FWD, BWD)
