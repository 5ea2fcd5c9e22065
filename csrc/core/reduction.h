// The reductions, each helper with one meaning, for every layer (checks, kernels, composite, autograd,
// vmap rules): the enum the ops take, element counts of shapes, the "mean" scale, and the reduction of
// elementwise loss values.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>
#include <c10/util/ArrayRef.h>

namespace npu_loss {

// Same numbering as at::Reduction and the aclnn kernels.
enum class Reduction : int64_t { None = 0, Mean = 1, Sum = 2 };

constexpr int64_t kNone = static_cast<int64_t>(Reduction::None);
constexpr int64_t kMean = static_cast<int64_t>(Reduction::Mean);
constexpr int64_t kSum = static_cast<int64_t>(Reduction::Sum);

inline bool is_mean(int64_t reduction) {
  return reduction == kMean;
}

// Whether `reduction` is one the ops accept (the checks reject the others by name).
inline bool is_valid_reduction(int64_t reduction) {
  return reduction >= kNone && reduction <= kSum;
}

// The element count of a shape, concrete or symbolic.
inline int64_t numel_of(c10::IntArrayRef shape) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

inline c10::SymInt numel_of(c10::SymIntArrayRef shape) {
  c10::SymInt n = 1;
  for (const auto& s : shape) n = n * s;
  return n;
}

// The factor "mean" applies to a gradient: 1 / count for "mean", 1 otherwise (count == 0 gives inf, as
// 1 / 0 does in PyTorch).
inline double reduction_scale(int64_t reduction, int64_t count) {
  return is_mean(reduction) ? 1.0 / static_cast<double>(count) : 1.0;
}

// `v` divided by `count` for "mean", `v` otherwise: the same factor on a tensor with symbolic counts.
inline at::Tensor apply_mean(const at::Tensor& v, int64_t reduction, const c10::SymInt& count) {
  return is_mean(reduction) ? v.div(c10::Scalar(count)) : v;
}

// A loss reduced from the sum of its `count` elementwise values: the sum for "sum", sum / count for "mean"
// (an empty mean is 0 / 0 = NaN, as in PyTorch). Not for "none".
inline double reduce_total(double total, int64_t reduction, int64_t count) {
  return is_mean(reduction) ? total / static_cast<double>(count) : total;
}

// Elementwise loss values reduced as `reduction` says: their mean, their sum, or themselves ("none").
inline at::Tensor reduce_values(const at::Tensor& values, int64_t reduction) {
  if (reduction == kMean) return values.mean();
  if (reduction == kSum) return values.sum();
  return values;
}

}  // namespace npu_loss
