// The losses' elementwise math and the dense loops, written once on simd.h's vector type and compiled once
// per instruction set by the isa_*.cpp files, each in its own namespace NPU_LOSS_ISA. The formulas and
// their special cases are those of docs/semantics.md; every element is computed by the same vector code
// whatever its position (a tail shorter than a vector goes through a zero-padded vector), so results do not
// depend on alignment, layout or thread count. float64 runs in the baseline only, with std::log/exp.
#pragma once

#include <cstring>

#include "isa.h"
#include "vec_math.h"

#ifdef NPU_LOSS_ISA_BASELINE
#include <cmath>
#endif

namespace npu_loss::cpu::NPU_LOSS_ISA {
namespace {

// Constants and helpers the loss functors use on either value type (F, or D for float64).
template <class V>
NPU_LOSS_SIMD_INLINE V cst(double c) {
  return splat(static_cast<float>(c));
}

#ifdef NPU_LOSS_ISA_BASELINE
// float64, one lane.
struct D { double v; };
struct DM { bool v; };
template <>
NPU_LOSS_SIMD_INLINE D cst<D>(double c) { return {c}; }
NPU_LOSS_SIMD_INLINE D operator+(D a, D b) { return {a.v + b.v}; }
NPU_LOSS_SIMD_INLINE D operator-(D a, D b) { return {a.v - b.v}; }
NPU_LOSS_SIMD_INLINE D operator*(D a, D b) { return {a.v * b.v}; }
NPU_LOSS_SIMD_INLINE D operator/(D a, D b) { return {a.v / b.v}; }
NPU_LOSS_SIMD_INLINE D abs(D a) { return {std::fabs(a.v)}; }
NPU_LOSS_SIMD_INLINE DM operator<(D a, D b) { return {a.v < b.v}; }
NPU_LOSS_SIMD_INLINE DM operator>(D a, D b) { return {a.v > b.v}; }
NPU_LOSS_SIMD_INLINE DM operator>=(D a, D b) { return {a.v >= b.v}; }
NPU_LOSS_SIMD_INLINE DM operator==(D a, D b) { return {a.v == b.v}; }
NPU_LOSS_SIMD_INLINE DM operator|(DM a, DM b) { return {a.v || b.v}; }
NPU_LOSS_SIMD_INLINE D select(DM m, D yes, D no) { return {m.v ? yes.v : no.v}; }
NPU_LOSS_SIMD_INLINE D log(D x, bool& special) {
  special = true;
  return {std::log(x.v)};
}
NPU_LOSS_SIMD_INLINE D exp(D x) { return {std::exp(x.v)}; }
#endif

template <class V>
NPU_LOSS_SIMD_INLINE V sign_of(V v) {
  // NaN -> 0, as PyTorch's sgn on CPU.
  return select(v > cst<V>(0), cst<V>(1), cst<V>(0)) - select(v < cst<V>(0), cst<V>(1), cst<V>(0));
}

// Smooth L1: |d| < beta ? 0.5 d^2 / beta : |d| - 0.5 beta, d = x - t.
template <class V>
struct SmoothL1 {
  V beta, half_beta;
  explicit SmoothL1(const LossParams& p) : beta(cst<V>(p.float_scalar)), half_beta(cst<V>(0.5) * beta) {}
  NPU_LOSS_SIMD_INLINE V operator()(V x, V t) const {
    const V d = x - t;
    const V ad = abs(d);
    return select(ad < beta, cst<V>(0.5) * d * d / beta, ad - half_beta);
  }
};

// Its gradient: g * (|d| >= beta ? sign(d) : d / beta); beta == 0 is the pure L1 gradient, sign(d), with
// sign(0) = sign(NaN) = 0 and no division by zero.
template <class V>
struct SmoothL1Grad {
  V beta;
  bool l1;
  explicit SmoothL1Grad(const LossParams& p) : beta(cst<V>(p.float_scalar)), l1(p.float_scalar == 0) {}
  NPU_LOSS_SIMD_INLINE V operator()(V g, V x, V t) const {
    const V d = x - t;
    if (l1) return g * sign_of(d);
    return g * select(abs(d) >= beta, sign_of(d), d / beta);
  }
};

// Huber: |d| < delta ? 0.5 d^2 : delta (|d| - 0.5 delta), d = x - t (delta may be +inf).
template <class V>
struct Huber {
  V delta, half_delta;
  explicit Huber(const LossParams& p) : delta(cst<V>(p.float_scalar)), half_delta(cst<V>(0.5) * delta) {}
  NPU_LOSS_SIMD_INLINE V operator()(V x, V t) const {
    const V d = x - t;
    const V ad = abs(d);
    return select(ad < delta, cst<V>(0.5) * d * d, delta * (ad - half_delta));
  }
};

// Its gradient: g * d clamped to [-delta, delta]; a NaN d stays NaN, as in ATen.
template <class V>
struct HuberGrad {
  V delta, neg_delta;
  explicit HuberGrad(const LossParams& p) : delta(cst<V>(p.float_scalar)), neg_delta(cst<V>(-p.float_scalar)) {}
  NPU_LOSS_SIMD_INLINE V operator()(V g, V x, V t) const {
    const V d = x - t;
    return g * select(d > delta, delta, select(d < neg_delta, neg_delta, d));
  }
};

template <class V>
struct L1 {
  explicit L1(const LossParams&) {}
  NPU_LOSS_SIMD_INLINE V operator()(V x, V t) const { return abs(x - t); }
};

template <class V>
struct L1Grad {
  explicit L1Grad(const LossParams&) {}
  NPU_LOSS_SIMD_INLINE V operator()(V g, V x, V t) const { return g * sign_of(x - t); }
};

// MSE: d * d, d = x - t.
template <class V>
struct Mse {
  explicit Mse(const LossParams&) {}
  NPU_LOSS_SIMD_INLINE V operator()(V x, V t) const {
    const V d = x - t;
    return d * d;
  }
};

// Its gradient: g * 2d.
template <class V>
struct MseGrad {
  explicit MseGrad(const LossParams&) {}
  NPU_LOSS_SIMD_INLINE V operator()(V g, V x, V t) const { return g * (cst<V>(2) * (x - t)); }
};

// log(target) for the KL functors: the lookup form when every target is a bfloat16 value (Bf16 true: the
// bfloat16 kernels and the strided loop's float buffers of bfloat16 inputs), so that both loops give the
// same bits (vec_math.h).
template <bool Bf16, class V>
NPU_LOSS_SIMD_INLINE V log_of_target(V t, bool& special) {
  if constexpr (Bf16) {
    return log_bf16(t, special);
  } else {
    return log(t, special);
  }
}

// target * (log(target) - self), with 0 for target * log(target) where target == 0 (xlogy's rule).
template <class V, bool Bf16 = false>
struct KlDiv {
  explicit KlDiv(const LossParams&) {}
  NPU_LOSS_SIMD_INLINE V operator()(V x, V t) const {
    bool special;
    V t_log_t = t * log_of_target<Bf16>(t, special);
    if (special) t_log_t = select(t == cst<V>(0), cst<V>(0), t_log_t);
    return t_log_t - t * x;
  }
};

// exp(target) * (target - self) for a log-space target.
template <class V>
struct KlDivLog {
  explicit KlDivLog(const LossParams&) {}
  NPU_LOSS_SIMD_INLINE V operator()(V x, V t) const { return exp(t) * (t - x); }
};

// g * (log(target) + 1 - self), exactly 0 where target == 0 (a zero probability gets no gradient), and NaN
// where target == +inf, as PyTorch's autograd (xlogy's t / t) and aclnn give.
template <class V, bool Bf16 = false>
struct KlTargetGrad {
  explicit KlTargetGrad(const LossParams&) {}
  NPU_LOSS_SIMD_INLINE V operator()(V g, V x, V t) const {
    bool special;
    V v = g * (log_of_target<Bf16>(t, special) + (cst<V>(1) - x));
    if (special) {
      v = select(t == cst<V>(__builtin_inf()), cst<V>(__builtin_nan("")), v);
      v = select(t == cst<V>(0), cst<V>(0), v);
    }
    return v;
  }
};

// g * exp(target) * (target + 1 - self) for a log-space target.
template <class V>
struct KlTargetGradLog {
  explicit KlTargetGradLog(const LossParams&) {}
  NPU_LOSS_SIMD_INLINE V operator()(V g, V x, V t) const { return g * exp(t) * (t + cst<V>(1) - x); }
};

// Loads and stores of one vector of each storage type.
template <DType>
struct Io;

// The storage types computed in float registers: float32, bfloat16, float16. kBf16Values: every value is a
// bfloat16 (KL's log takes its lookup form).
struct FloatRegisterIo {
  using V = F;
  static constexpr int kLanes = ::npu_loss::cpu::NPU_LOSS_ISA::kLanes;
  static constexpr bool kBf16Values = false;
};

template <>
struct Io<DType::Float> : FloatRegisterIo {
  using T = float;
  static NPU_LOSS_SIMD_INLINE F load(const T* p) { return ::npu_loss::cpu::NPU_LOSS_ISA::load(p); }
  static NPU_LOSS_SIMD_INLINE void store(T* p, F v) { ::npu_loss::cpu::NPU_LOSS_ISA::store(p, v); }
};

// float buffers that hold bfloat16 values: the strided loop's, for bfloat16 inputs (loops.h).
template <>
struct Io<DType::FloatOfBFloat16> : Io<DType::Float> {
  static constexpr bool kBf16Values = true;
};

template <>
struct Io<DType::BFloat16> : FloatRegisterIo {
  using T = uint16_t;
  static constexpr bool kBf16Values = true;
  static NPU_LOSS_SIMD_INLINE F load(const T* p) { return load_bf16(p); }
  // Round to nearest even on the bits (simd.h). A NaN stays a NaN without a check of its own: every NaN
  // these kernels produce has zero low 16 bits (a NaN operand's payload comes from bfloat16 data, the
  // invalid operations give the default NaN, vec_math.h's fix-ups a quiet NaN), so nothing carries out.
  static NPU_LOSS_SIMD_INLINE void store(T* p, F v) { store_bf16(p, v); }
};

template <>
struct Io<DType::Half> : FloatRegisterIo {
  using T = uint16_t;
  static NPU_LOSS_SIMD_INLINE F load(const T* p) { return load_half(p); }
  static NPU_LOSS_SIMD_INLINE void store(T* p, F v) { store_half(p, v); }
};

#ifdef NPU_LOSS_ISA_BASELINE
template <>
struct Io<DType::Double> {
  using T = double;
  using V = D;
  static constexpr int kLanes = 1;
  static constexpr bool kBf16Values = false;
  static NPU_LOSS_SIMD_INLINE D load(const T* p) { return {*p}; }
  static NPU_LOSS_SIMD_INLINE void store(T* p, D v) { *p = v.v; }
};
#endif

// A tail of n < kLanes elements, copied into a zero-padded vector's worth of storage.
template <class IoT>
struct Tail {
  typename IoT::T data[IoT::kLanes];
  Tail(const void* src, int64_t offset, int64_t n) {
    std::memset(data, 0, sizeof(data));
    std::memcpy(data, static_cast<const typename IoT::T*>(src) + offset, n * sizeof(typename IoT::T));
  }
  NPU_LOSS_SIMD_INLINE typename IoT::V load() const { return IoT::load(data); }
};

// Software prefetch of every input stream, kPrefetchBytes ahead (4 cache lines, whatever the dtype): with
// log or exp in the loop the hardware prefetcher alone leaves float32 short of the memory bandwidth, and
// farther (1 KB) was slower at two threads (docs/cpu_kernels.md).
constexpr int kPrefetchBytes = 256;

template <class T>
NPU_LOSS_SIMD_INLINE void prefetch_ahead(const T* p) {
  __builtin_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes);
}

// out[i] = op(g * scale, x[i], t[i]), g one value or g[i].
template <class IoT, class Op>
NPU_LOSS_SIMD_INLINE void backward_loop(
    const Op& op, const void* gv, bool g_scalar, const void* xv, const void* tv, void* outv, int64_t n,
    double scale_d) {
  using T = typename IoT::T;
  using V = typename IoT::V;
  constexpr int W = IoT::kLanes;
  const T* g = static_cast<const T*>(gv);
  const T* x = static_cast<const T*>(xv);
  const T* t = static_cast<const T*>(tv);
  T* out = static_cast<T*>(outv);
  const V scale = cst<V>(scale_d);
  int64_t i = 0;
  V gs = scale;
  if (g_scalar) {
    T gb[W];
    for (int k = 0; k < W; ++k) gb[k] = g[0];
    gs = IoT::load(gb) * scale;
    for (; i + W <= n; i += W) {
      prefetch_ahead(x + i);
      prefetch_ahead(t + i);
      IoT::store(out + i, op(gs, IoT::load(x + i), IoT::load(t + i)));
    }
  } else if (scale_d == 1.0) {  // 'none': g itself (g * 1 has g's bits)
    for (; i + W <= n; i += W) {
      prefetch_ahead(g + i);
      prefetch_ahead(x + i);
      prefetch_ahead(t + i);
      IoT::store(out + i, op(IoT::load(g + i), IoT::load(x + i), IoT::load(t + i)));
    }
  } else {
    for (; i + W <= n; i += W) {
      prefetch_ahead(g + i);
      prefetch_ahead(x + i);
      prefetch_ahead(t + i);
      IoT::store(out + i, op(IoT::load(g + i) * scale, IoT::load(x + i), IoT::load(t + i)));
    }
  }
  if (i < n) {
    const V gt = g_scalar ? gs : Tail<IoT>(g, i, n - i).load() * scale;
    T ob[W];
    IoT::store(ob, op(gt, Tail<IoT>(x, i, n - i).load(), Tail<IoT>(t, i, n - i).load()));
    std::memcpy(out + i, ob, (n - i) * sizeof(T));
  }
}

// out[i] = op(x[i], t[i]).
template <class IoT, class Op>
NPU_LOSS_SIMD_INLINE void forward_loop(const Op& op, const void* xv, const void* tv, void* outv, int64_t n) {
  using T = typename IoT::T;
  constexpr int W = IoT::kLanes;
  const T* x = static_cast<const T*>(xv);
  const T* t = static_cast<const T*>(tv);
  T* out = static_cast<T*>(outv);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    prefetch_ahead(x + i);
    prefetch_ahead(t + i);
    IoT::store(out + i, op(IoT::load(x + i), IoT::load(t + i)));
  }
  if (i < n) {
    T ob[W];
    IoT::store(ob, op(Tail<IoT>(x, i, n - i).load(), Tail<IoT>(t, i, n - i).load()));
    std::memcpy(out + i, ob, (n - i) * sizeof(T));
  }
}

// The sum of op(x[i], t[i]) in the opmath type: one accumulator per vector lane, then reduce_add's fixed
// order; one lane (the baseline, float64): lane_blocked_sum's order.
template <class IoT, class Op>
NPU_LOSS_SIMD_INLINE double sum_loop(const Op& op, const void* xv, const void* tv, int64_t n) {
  using T = typename IoT::T;
  using V = typename IoT::V;
  constexpr int W = IoT::kLanes;
  const T* x = static_cast<const T*>(xv);
  const T* t = static_cast<const T*>(tv);
  if constexpr (W == 1) {
    using Acc = decltype(V{}.v);
    return lane_blocked_sum<Acc>(0, n, [&](int64_t i) { return op(IoT::load(x + i), IoT::load(t + i)).v; });
  } else {
    V acc = cst<V>(0);
    int64_t i = 0;
    for (; i + W <= n; i += W) {
      prefetch_ahead(x + i);
      prefetch_ahead(t + i);
      acc = acc + op(IoT::load(x + i), IoT::load(t + i));
    }
    // The tail's zero padding adds nothing: every loss is exactly +0 at x = t = 0.
    if (i < n) acc = acc + op(Tail<IoT>(x, i, n - i).load(), Tail<IoT>(t, i, n - i).load());
    return reduce_add(acc);
  }
}

// Calls fn(IoT) for the storage type; float64 runs in the baseline's table.
template <class Fn>
NPU_LOSS_SIMD_INLINE void with_io(DType dtype, const Fn& fn) {
  switch (dtype) {
    case DType::Float:
      fn(Io<DType::Float>{});
      break;
    case DType::FloatOfBFloat16:
      fn(Io<DType::FloatOfBFloat16>{});
      break;
    case DType::BFloat16:
      fn(Io<DType::BFloat16>{});
      break;
    case DType::Half:
      fn(Io<DType::Half>{});
      break;
    case DType::Double:
#ifdef NPU_LOSS_ISA_BASELINE
      fn(Io<DType::Double>{});
#endif
      break;
  }
}

// Each loss's forward and gradient functors (above), by its declaration's type: Math<Loss>::with(p, fn)
// calls fn(forward functor, gradient functor) on the storage type's value type.
template <class Loss, class IoT>
struct Math;

template <class IoT>
struct Math<::npu_loss::SmoothL1Loss, IoT> {
  template <class Fn>
  static NPU_LOSS_SIMD_INLINE void with(const LossParams& p, const Fn& fn) {
    fn(SmoothL1<typename IoT::V>(p), SmoothL1Grad<typename IoT::V>(p));
  }
};

template <class IoT>
struct Math<::npu_loss::HuberLoss, IoT> {
  template <class Fn>
  static NPU_LOSS_SIMD_INLINE void with(const LossParams& p, const Fn& fn) {
    fn(Huber<typename IoT::V>(p), HuberGrad<typename IoT::V>(p));
  }
};

template <class IoT>
struct Math<::npu_loss::L1Loss, IoT> {
  template <class Fn>
  static NPU_LOSS_SIMD_INLINE void with(const LossParams& p, const Fn& fn) {
    fn(L1<typename IoT::V>(p), L1Grad<typename IoT::V>(p));
  }
};

template <class IoT>
struct Math<::npu_loss::MseLoss, IoT> {
  template <class Fn>
  static NPU_LOSS_SIMD_INLINE void with(const LossParams& p, const Fn& fn) {
    fn(Mse<typename IoT::V>(p), MseGrad<typename IoT::V>(p));
  }
};

// KL: the bool scalar is log_target.
template <class IoT>
struct Math<::npu_loss::KlDiv, IoT> {
  template <class Fn>
  static NPU_LOSS_SIMD_INLINE void with(const LossParams& p, const Fn& fn) {
    using V = typename IoT::V;
    if (p.bool_scalar) {
      fn(KlDivLog<V>(p), KlTargetGradLog<V>(p));
    } else {
      fn(KlDiv<V, IoT::kBf16Values>(p), KlTargetGrad<V, IoT::kBf16Values>(p));
    }
  }
};

// Calls fn(forward functor, gradient functor) for the call's loss (an elementwise one: loss_index<Loss>()).
template <class IoT, class Fn>
NPU_LOSS_SIMD_INLINE void with_loss(const LossParams& p, const Fn& fn) {
  for_each_elementwise_loss([&]<typename Loss>() {
    if (p.loss == loss_index<Loss>()) Math<Loss, IoT>::with(p, fn);
  });
}

void backward(const LossParams& p, DType dtype, const void* g, bool g_scalar, const void* x, const void* t,
              void* out, int64_t n, double scale) {
#ifndef NPU_LOSS_ISA_BASELINE
  if (dtype == DType::Double) return baseline::kKernels.backward(p, dtype, g, g_scalar, x, t, out, n, scale);
#endif
  with_io(dtype, [&](auto io) {
    using IoT = decltype(io);
    with_loss<IoT>(p, [&](const auto&, const auto& grad) {
      backward_loop<IoT>(grad, g, g_scalar, x, t, out, n, scale);
    });
  });
}

void forward(const LossParams& p, DType dtype, const void* x, const void* t, void* out, int64_t n) {
#ifndef NPU_LOSS_ISA_BASELINE
  if (dtype == DType::Double) return baseline::kKernels.forward(p, dtype, x, t, out, n);
#endif
  with_io(dtype, [&](auto io) {
    using IoT = decltype(io);
    with_loss<IoT>(p, [&](const auto& fwd, const auto&) { forward_loop<IoT>(fwd, x, t, out, n); });
  });
}

double sum(const LossParams& p, DType dtype, const void* x, const void* t, int64_t n) {
#ifndef NPU_LOSS_ISA_BASELINE
  if (dtype == DType::Double) return baseline::kKernels.sum(p, dtype, x, t, n);
#endif
  double total = 0;
  with_io(dtype, [&](auto io) {
    using IoT = decltype(io);
    with_loss<IoT>(p, [&](const auto& fwd, const auto&) { total = sum_loop<IoT>(fwd, x, t, n); });
  });
  return total;
}

// The KL kernels' float log and exp, and log of bfloat16 values, over a buffer, for tests.
template <class Fn>
NPU_LOSS_SIMD_INLINE void map_float(const float* x, float* out, int64_t n, const Fn& fn) {
  using IoT = Io<DType::Float>;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(out + i, fn(load(x + i)));
  if (i < n) {
    float ob[kLanes];
    store(ob, fn(Tail<IoT>(x, i, n - i).load()));
    std::memcpy(out + i, ob, (n - i) * sizeof(float));
  }
}

void log_buffer(const float* x, float* out, int64_t n) {
  map_float(x, out, n, [](F v) { return log(v); });
}

void exp_buffer(const float* x, float* out, int64_t n) {
  map_float(x, out, n, [](F v) { return exp(v); });
}

void log_bf16_buffer(const float* x, float* out, int64_t n) {
  map_float(x, out, n, [](F v) { return log_bf16(v); });
}

void tanh_buffer(const float* x, float* out, int64_t n) {
  map_float(x, out, n, [](F v) { return tanh(v); });
}

}  // namespace
}  // namespace npu_loss::cpu::NPU_LOSS_ISA

namespace npu_loss::cpu::NPU_LOSS_ISA {
const DenseKernels kKernels = {&backward, &forward, &sum, &log_buffer, &exp_buffer, &log_bf16_buffer, &tanh_buffer};
}  // namespace npu_loss::cpu::NPU_LOSS_ISA
