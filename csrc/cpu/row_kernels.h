// The row members' CPU kernel machinery (losses.h's LossKind::Rows: the distillation family), written once on
// simd.h's vector type and compiled per instruction set beside dense_kernels.h, whose storage types (Io) and
// tails they share: a row's log-sum-exp in one pass (the log-softmax's two parts), the row sums' one order, the
// float16 row scales, the hard loss's per-row fields, and the converted form's row reads and writes. One thread
// makes a whole row, so a row's results never depend on how the rows are split among threads, and each of a
// row's sums runs in one written-out order: a block's vectors added in their lanes, the block's lanes in
// reduce_add's order into double, the blocks in order (docs/cpu_kernels.md, "Rows").
//
// Each row member's own math is a header of its own (jsd_kernel.h: the generalized JSD) that gives
// RowKernelOf<Loss> below; row_table.h makes each instruction set's table of them, indexed by the declaration.
//
// Like dense_kernels.h, no code here may be shared with other translation units: it includes no header
// beyond those isa.h includes before the instruction-set pragma, and uses no library template (the scratch
// rows come from the caller).
#pragma once

#include <cstring>

#include "dense_kernels.h"

namespace npu_loss::cpu::NPU_LOSS_ISA {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

template <class V>
NPU_LOSS_SIMD_INLINE V vmax(V a, V b) {
  return select(a > b, a, b);
}

#ifdef NPU_LOSS_ISA_BASELINE
NPU_LOSS_SIMD_INLINE double reduce_add(D a) { return a.v; }
NPU_LOSS_SIMD_INLINE D vlog(D x) { return {std::log(x.v)}; }
NPU_LOSS_SIMD_INLINE D abs_of(D x) { return {std::fabs(x.v)}; }
NPU_LOSS_SIMD_INLINE D vtanh(D x) { return {std::tanh(x.v)}; }
NPU_LOSS_SIMD_INLINE bool all(DM m) { return m.v; }
#endif
NPU_LOSS_SIMD_INLINE F vlog(F x) { return log(x); }
NPU_LOSS_SIMD_INLINE F abs_of(F x) { return abs(x); }
NPU_LOSS_SIMD_INLINE F vtanh(F x) { return tanh(x); }

// A vector whose lanes holding a row's elements k < n are true (a row's tail). Made through the storage
// type, as the tail's elements are: bfloat16 vectors keep their lanes in load_bf16's order (simd.h).
template <class IoT>
NPU_LOSS_SIMD_INLINE auto first_lanes(int64_t n) {
  using V = typename IoT::V;
  typename IoT::T buffer[IoT::kLanes];
  IoT::store(buffer, cst<V>(1));
  std::memset(buffer + n, 0, (IoT::kLanes - n) * sizeof(buffer[0]));
  return IoT::load(buffer) > cst<V>(0);
}

// A vector whose lane holding a row's element k (0 <= k < W) is true, the rest false (a label's lane).
template <class IoT>
NPU_LOSS_SIMD_INLINE auto one_lane(int64_t k) {
  using V = typename IoT::V;
  typename IoT::T buffer[IoT::kLanes];
  IoT::store(buffer, cst<V>(1));
  std::memset(buffer, 0, k * sizeof(buffer[0]));
  std::memset(buffer + k + 1, 0, (IoT::kLanes - k - 1) * sizeof(buffer[0]));
  return IoT::load(buffer) > cst<V>(0);
}

// The vector of elements i .. i + W of a row of n, or of its tail, zero-padded.
template <class IoT>
NPU_LOSS_SIMD_INLINE typename IoT::V load_at(const typename IoT::T* p, int64_t i, int64_t n) {
  if (i + IoT::kLanes <= n) return IoT::load(p + i);
  return Tail<IoT>(p, i, n - i).load();
}

// Stores elements i .. min(i + W, n) of a row.
template <class IoT>
NPU_LOSS_SIMD_INLINE void store_at(typename IoT::T* p, int64_t i, int64_t n, typename IoT::V v) {
  if (i + IoT::kLanes <= n) return IoT::store(p + i, v);
  typename IoT::T buffer[IoT::kLanes];
  IoT::store(buffer, v);
  std::memcpy(p + i, buffer, (n - i) * sizeof(typename IoT::T));
}

// The elements of a block: a row is made in blocks of kBlockVectors vectors, and each row sum adds a block's
// vectors in their lanes, then the block's lanes (reduce_add's order) into double, the blocks in order.
constexpr int kBlockVectors = kRowBlockVectors;  // isa.h, which sizes the block maxima by it
// How many blocks ahead the statistics pass prefetches.
constexpr int kPrefetchBlocks = 2;

template <class IoT>
NPU_LOSS_SIMD_INLINE int64_t block_end(int64_t begin, int64_t n) {
  return begin + kBlockVectors * IoT::kLanes < n ? begin + kBlockVectors * IoT::kLanes : n;
}

// Asks for the vector `ahead` elements past element i of a row (software prefetch: past the row's end it is
// a no-op). The statistics pass reads each row from memory for the first time, and its exps, computed from
// L1, would otherwise leave the memory stream idle.
template <class IoT>
NPU_LOSS_SIMD_INLINE void prefetch_vector(const typename IoT::T* p, int64_t i, int64_t ahead) {
  const char* at = reinterpret_cast<const char*>(p + i + ahead);
  for (int offset = 0; offset < IoT::kLanes * static_cast<int>(sizeof(typename IoT::T)); offset += 64)
    __builtin_prefetch(at + offset);
}

// The largest lane of a vector, or `floor` if every lane is below it.
template <class V>
NPU_LOSS_SIMD_INLINE double lane_max(V v, double floor) {
  using Acc = decltype(reduce_add(V{}));
  constexpr int kN = sizeof(V) / sizeof(Acc);
  Acc lanes[kN];
  std::memcpy(lanes, &v, sizeof(lanes));
  double top = floor;
  for (int k = 0; k < kN; ++k) top = lanes[k] > top ? lanes[k] : top;
  return top;
}

// A row sum (above): add() each vector of a block, then end_block().
template <class V>
struct RowSum {
  V lanes;
  double total = 0;
  // Written out: an implicit constructor would not be built for this file's instruction set.
  NPU_LOSS_SIMD_INLINE RowSum() : lanes(cst<V>(0)) {}
  NPU_LOSS_SIMD_INLINE void add(V v) { lanes = lanes + v; }
  NPU_LOSS_SIMD_INLINE void end_block() {
    total += static_cast<double>(reduce_add(lanes));
    lanes = cst<V>(0);
  }
};

// The storage type of a scratch row of compute type A (float, or double for float64).
template <class A>
using IoRow = Io<std::is_same_v<A, double> ? DType::Double : DType::Float>;

// log(sum(exp(x))) of x = z * inv_t over a row of n, as its two parts: the row's maximum M (one of its x), and
// log(sum(exp(x - M))). One pass, a block at a time: the block's maximum first (its elements stay in L1), then
// its exps against the running maximum; when a block raises the maximum, the sum so far is rescaled once, in
// double. log_softmax is then (x - M) - log_sum: exact where x is near M, with no rounding of M + log_sum.
// -inf elements add nothing (a row of -inf only has M = -inf); a NaN or +inf element makes M NaN, as torch's
// log_softmax. Each exp(x - top) is kept in `kept` (a scratch row of the compute type, whole vectors) and each
// block's running maximum `top` in tops[block], so that exp(x - M - log_sum) = kept * exp(top - M - log_sum):
// the values pass needs no exp of its own for the probabilities.
struct RowStats {
  double max, log_sum;
  // The factor from the kept exps of the block whose running maximum was `top` to the probabilities.
  double factor(double top) const { return std::exp(top - max - log_sum); }
};

// The row's z comes from `first` (z at element i, as load_at<IoT> gives it, its padding lanes anything
// finite), called once per vector in order, then from `again` (the same z, from a block still in cache); `p`
// is the row in memory, prefetched ahead.
template <class IoT, class A, class First, class Again>
RowStats row_logsumexp(const First& first, const Again& again, const typename IoT::T* p, int64_t n,
                       double inv_t_d, A* kept, double* tops) {
  using V = typename IoT::V;
  constexpr int W = IoT::kLanes;
  const V inv_t = cst<V>(inv_t_d), neg_inf = cst<V>(-kInfinity), zero = cst<V>(0);
  const auto padded = [&](int64_t i, V z) {
    const V x = z * inv_t;
    return i + W <= n ? x : select(first_lanes<IoT>(n - i), x, neg_inf);
  };
  V nan = zero;
  double top = -kInfinity, total = 0;
  for (int64_t begin = 0; begin < n; begin += kBlockVectors * W) {
    const int64_t end = block_end<IoT>(begin, n);
    V m = neg_inf;
    for (int64_t i = begin; i < end; i += W) {
      const V x = padded(i, first(i));
      m = vmax(m, x);
      nan = nan + select(x == x, zero, cst<V>(1));
    }
    const double block_top = lane_max(m, -kInfinity);
    if (block_top > top) {
      total *= std::exp(top - block_top);  // 0 while top is -inf: nothing was added
      top = block_top;
    }
    *tops++ = top;
    if (top == -kInfinity || top == kInfinity) {  // every element so far -inf (0), or the row is NaN
      for (int64_t i = begin; i < end; i += W) IoRow<A>::store(kept + i, zero);
      continue;
    }
    const V vtop = cst<V>(top);
    RowSum<V> sum;
    for (int64_t i = begin; i < end; i += W) {
      prefetch_vector<IoT>(p, i, kPrefetchBlocks * kBlockVectors * W);
      const V e = exp(padded(i, again(i)) - vtop);  // exp(-inf) = 0: padding
      IoRow<A>::store(kept + i, e);
      sum.add(e);
    }
    sum.end_block();
    total += sum.total;
  }
  if (reduce_add(nan) != 0 || top == kInfinity) return {std::numeric_limits<double>::quiet_NaN(), 0};
  if (top == -kInfinity) return {top, 0};
  return {top, std::log(total)};
}

// The power j of row_scale (isa.h's RowBatch): a row whose gradients are at most `bound` is stored times 2^j,
// so that its largest is below 2^14 (float16's largest finite value is 65504, near 2^16: room for the bound's
// rounding) and its smaller ones keep float16's precision. Within [-60, 60]: 2^j and 2^-j are normal floats.
inline int row_power(double bound) {
  if (!(bound > 0) || !std::isfinite(bound)) return 0;
  int exponent;
  std::frexp(bound, &exponent);  // bound < 2^exponent
  const int power = 14 - exponent;
  return power < -60 ? -60 : power > 60 ? 60 : power;
}

// One row's hard loss (isa.h's RowBatch): its label (-1: none), its gradient's weight, and where its value goes.
struct RowHard {
  int64_t label;
  double weight;
  double* value;
};

// Row r's hard loss (kept row k) of a call.
inline RowHard hard_of(const RowBatch& c, int64_t r, int64_t k) {
  if (!c.hard_labels) return {-1, 0, nullptr};
  return {c.hard_labels[r], c.hard_weight, c.hard_sums ? c.hard_sums + k : nullptr};
}

// bfloat16 converts one element at a time here (simd.h's bf16_value and bf16_of; the loops vectorize): a
// bfloat16 vector's lanes are not in a row's order.
template <class IoT>
constexpr bool kBf16Storage = IoT::kBf16Values && !std::is_same_v<typename IoT::T, float>;

// Elements [0, n) of a row of storage type `dtype` (every `step`-th element from `src`, gathered through
// `gather` when step != 1) into `dst` as the compute type's values (IoAcc: float, or double for float64).
template <class IoAcc>
void read_row(DType dtype, const void* src, int64_t step, void* gather, typename IoAcc::T* dst, int64_t n) {
  using A = typename IoAcc::T;
  with_io(dtype, [&](auto io) {
    using IoT = decltype(io);
    using T = typename IoT::T;
    const T* p = static_cast<const T*>(src);
    if (step != 1) {
      T* g = static_cast<T*>(gather);
      for (int64_t i = 0; i < n; ++i) g[i] = p[i * step];
      p = g;
    }
    if constexpr (kBf16Storage<IoT>) {
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<A>(bf16_value(p[i]));
    } else if constexpr (std::is_same_v<typename IoT::V, typename IoAcc::V>) {
      for (int64_t i = 0; i < n; i += IoT::kLanes) store_at<IoAcc>(dst, i, n, load_at<IoT>(p, i, n));
    } else {  // float or float16 data into double (the baseline's float64 calls): exact
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<A>(load_at<IoT>(p, i, i + 1).v);
    }
  });
}

// A row of the compute type into `dst`, of storage type `dtype`.
template <class IoAcc>
void write_row(const typename IoAcc::T* src, DType dtype, void* dst, int64_t n) {
  with_io(dtype, [&](auto io) {
    using IoT = decltype(io);
    using T = typename IoT::T;
    T* p = static_cast<T*>(dst);
    if constexpr (kBf16Storage<IoT>) {
      // From double (the baseline's float64 calls) through float: two roundings, as torch's .to(bfloat16)
      // of a float64 tensor makes.
      for (int64_t i = 0; i < n; ++i) p[i] = bf16_of(static_cast<float>(src[i]));
    } else if constexpr (std::is_same_v<typename IoT::V, typename IoAcc::V>) {
      for (int64_t i = 0; i < n; i += IoT::kLanes) store_at<IoT>(p, i, n, load_at<IoAcc>(src, i, n));
    } else {  // double results into float or float16 (the baseline's float64 calls with another dtype)
      for (int64_t i = 0; i < n; ++i) {
        T one[IoT::kLanes];
        IoT::store(one, cst<typename IoT::V>(static_cast<double>(src[i])));
        p[i] = one[0];
      }
    }
  });
}

// A row member's kernel (isa.h's RowKernel): each member's math header specializes it with
//   static void run(const RowBatch&, int64_t begin, int64_t end, void* scratch);
//   static int64_t scratch_bytes(const RowBatch&);
template <typename Loss>
struct RowKernelOf;

}  // namespace
}  // namespace npu_loss::cpu::NPU_LOSS_ISA
