// The vmap batching rules (FuncTorchBatched kernels) every npu_loss op shares, so that torch.func.vmap,
// per-sample gradients (vmap(grad(...))), jacrev and jacfwd never fall back to PyTorch's per-sample loop.
// Written in C++ like functorch's own rules (aten/src/ATen/functorch/BatchRules*.cpp): a Python
// torch.library.register_vmap rule costs several microseconds of interpreter time per call, more than the
// whole loss on small tensors (benchmarks/bench_autograd.py measures both).
//
// Every rule moves the batch dims to the front, pads the batched operands with size-1 dims to a common
// logical rank (so they broadcast sample by sample; unbatched operands broadcast as they are) and calls the
// op once on the physical tensors:
//   - forwards (self, target, reduction, ...) with "none" run as they are; "mean"/"sum" run as "none" and
//     reduce each sample's row (half types in float32, rounded once at the end);
//   - backward ops (grad_output, self, target, reduction, ...) run with "sum" (no scaling) after grad_output
//     is divided by each sample's own "mean" count, since the op would otherwise divide by the whole
//     batch's count. What differs between them is read from the loss's declaration (losses.h): what the
//     op differentiates, its dtype rule and its "mean" count;
//   - results get the dtype of the unbatched call (a 0-dim operand does not promote a dimensioned one, even
//     though its batched physical tensor has a dim).
// Calls whose padded rank would exceed the ops' 8 dims run sample by sample.
#pragma once

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/functorch/PlumbingHelper.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <functional>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <vector>

#include "../core/checks.h"
#include "../losses.h"
#include "../core/reduction.h"

namespace npu_loss::autograd {

namespace vmap {

// One operand of a batched call: its physical value and its batch dim (none: shared by every sample).
struct Operand {
  at::Tensor value;
  std::optional<int64_t> bdim;

  int64_t logical_rank() const {
    return value.dim() - (bdim ? 1 : 0);
  }

  c10::SymDimVector logical_sizes() const {
    const auto s = value.sym_sizes();
    c10::SymDimVector sizes(s.begin(), s.end());
    if (bdim) sizes.erase(sizes.begin() + *bdim);
    return sizes;
  }
};

// The vmap level being processed, with FuncTorchBatched masked off for the calls the rule makes.
struct VmapLevel {
  c10::impl::ExcludeDispatchKeyGuard guard{c10::DispatchKey::FuncTorchBatched};
  at::functorch::DynamicLayer layer;

  VmapLevel() : layer(current()) {}

  int64_t id() const {
    return layer.layerId();
  }

  Operand unwrap(const at::Tensor& t) const {
    if (!t.defined()) return {t, std::nullopt};
    auto [value, bdim] = at::functorch::unwrapTensorAtLevel(t, id());
    return {value, bdim};
  }

  bool any_batched(std::initializer_list<const at::Tensor*> tensors) const {
    for (const auto* t : tensors) {
      if (t->defined() && at::functorch::isBatchedAtLevel(*t, id())) return true;
    }
    return false;
  }

  at::Tensor batched(const at::Tensor& physical) const {
    return at::functorch::makeBatched(physical, 0, id());
  }

 private:
  static at::functorch::DynamicLayer current() {
    auto layer = at::functorch::maybeCurrentDynamicLayer();
    TORCH_CHECK(layer.has_value(), "npu_loss: a vmap batching rule ran outside of vmap (an escaped BatchedTensor)");
    return *layer;
  }
};

inline bool all_defined(const std::vector<Operand>& operands) {
  for (const auto& o : operands) {
    if (!o.value.defined()) return false;
  }
  return true;
}

// The batch dim first, then size-1 dims up to `rank` logical dims. Unbatched operands stay as they are:
// right-aligned broadcasting already pairs them with every sample.
inline at::Tensor batch_first(const Operand& o, int64_t rank) {
  if (!o.bdim) return o.value;
  const auto v = *o.bdim == 0 ? o.value : o.value.movedim(*o.bdim, 0);
  const int64_t logical = v.dim() - 1;
  if (logical == rank) return v;
  c10::SymDimVector shape;
  shape.push_back(v.sym_size(0));
  shape.append(static_cast<size_t>(rank - logical), c10::SymInt(1));
  const auto sizes = v.sym_sizes();
  shape.append(sizes.begin() + 1, sizes.end());
  return v.view_symint(shape);
}

// batch_first for an operand whose shape the result takes: a shared one is expanded over the batch (a view).
inline at::Tensor batch_first_expanded(const Operand& o, int64_t rank, const c10::SymInt& batch_size) {
  if (o.bdim) return batch_first(o, rank);
  c10::SymDimVector shape(static_cast<size_t>(rank - o.logical_rank() + 1), c10::SymInt(1));
  const auto sizes = o.value.sym_sizes();
  shape.append(sizes.begin(), sizes.end());
  auto expanded = shape;
  expanded[0] = batch_size;
  return o.value.view_symint(shape).expand_symint(expanded);
}

inline int64_t max_logical_rank(const std::vector<Operand>& operands) {
  int64_t rank = 0;
  for (const auto& o : operands) rank = std::max(rank, o.logical_rank());
  return rank;
}

inline bool is_half(c10::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16;
}

// PyTorch's result_type with the operands' logical dims: dimensioned operands decide, 0-dim ones only when
// no operand has a dim (every dtype the ops accept is floating, so categories never differ).
inline c10::ScalarType logical_result_type(const std::vector<Operand>& operands) {
  std::optional<c10::ScalarType> dimensioned, zero_dim;
  for (const auto& o : operands) {
    auto& slot = o.logical_rank() > 0 ? dimensioned : zero_dim;
    const auto t = o.value.scalar_type();
    slot = slot ? c10::promoteTypes(*slot, t) : t;
  }
  return dimensioned ? *dimensioned : *zero_dim;
}

// float32 for half types (a per-sample reduction is then rounded once), the tensor itself otherwise.
inline at::Tensor upcast(const at::Tensor& t) {
  return is_half(t.scalar_type()) ? t.to(at::kFloat) : t;
}

// The slow path for calls the padded physical rank would push past the ops' dimension limit.
inline at::Tensor per_sample(
    const VmapLevel& level, const std::vector<Operand>& operands,
    const std::function<at::Tensor(const std::vector<at::Tensor>&)>& call) {
  const int64_t batch_size = level.layer.batchSize().guard_int(__FILE__, __LINE__);
  std::vector<at::Tensor> results;
  results.reserve(batch_size);
  for (int64_t i = 0; i < batch_size; ++i) {
    std::vector<at::Tensor> args;
    args.reserve(operands.size());
    for (const auto& o : operands) args.push_back(o.bdim ? o.value.select(*o.bdim, i) : o.value);
    results.push_back(call(args));
  }
  return level.batched(at::stack(results));
}

// The count a sample's "mean" divides by, from the operands' logical (per-sample) shapes.
inline c10::SymInt mean_count(MeanCount rule, const Operand& g, const Operand& x, const Operand& t) {
  switch (rule) {
    case MeanCount::Self:
      return numel_of(x.logical_sizes());
    case MeanCount::SelfTargetBroadcast:
      return numel_of(at::infer_size_symdimvector(x.logical_sizes(), t.logical_sizes()));
    case MeanCount::Broadcast:
      break;
  }
  return numel_of(at::infer_size_symdimvector(
      at::infer_size_symdimvector(g.logical_sizes(), x.logical_sizes()), t.logical_sizes()));
}

}  // namespace vmap

template <typename Op, typename Signature = typename Op::Signature>
struct VmapKernel;

// Forwards: (self, target, reduction, scalars...).
template <typename Op, typename... Scalars>
struct VmapKernel<Op, at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, Scalars...)> {
  static at::Tensor call(const at::Tensor& self, const at::Tensor& target, int64_t reduction, Scalars... s) {
    using namespace vmap;
    const auto op = [&](const at::Tensor& x, const at::Tensor& t, int64_t r) { return Op::op().call(x, t, r, s...); };
    VmapLevel level;
    if (!level.any_batched({&self, &target})) return op(self, target, reduction);
    const std::vector<Operand> operands{level.unwrap(self), level.unwrap(target)};
    const auto& x = operands[0];
    const auto& t = operands[1];
    if (!all_defined(operands) || !is_valid_reduction(reduction)) return op(x.value, t.value, reduction);
    const int64_t rank = max_logical_rank(operands);
    if (rank + 1 > kMaxDims) {
      return per_sample(level, operands, [&](const std::vector<at::Tensor>& a) { return op(a[0], a[1], reduction); });
    }
    const auto dtype = logical_result_type(operands);
    auto xv = batch_first(x, rank);
    auto tv = batch_first(t, rank);
    at::Tensor result;
    if (reduction == kNone) {
      result = op(xv, tv, kNone);
    } else {
      if (is_half(dtype)) {
        xv = upcast(xv);
        tv = upcast(tv);
      }
      const auto values = op(xv, tv, kNone);
      if (values.dim() == 1) {
        result = values;  // 0-dim samples: each loss is its one element
      } else {
        std::vector<int64_t> sample_dims(values.dim() - 1);
        std::iota(sample_dims.begin(), sample_dims.end(), 1);
        result = is_mean(reduction) ? values.mean(sample_dims) : values.sum(sample_dims);
      }
    }
    if (result.scalar_type() != dtype) result = result.to(dtype);
    return level.batched(result);
  }
};

// Backward ops: (grad_output, self, target, reduction, scalars...), shaped by their loss's declaration.
template <typename Op, typename... Scalars>
struct VmapKernel<Op, at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, Scalars...)> {
  static at::Tensor call(
      const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
      Scalars... s) {
    using namespace vmap;
    constexpr const LossDecl& d = Op::Loss::decl;
    constexpr bool result_like_target = d.grad_of == GradOf::Target;  // target carries the batch dim
    const auto op = [&](const at::Tensor& g, const at::Tensor& x, const at::Tensor& t, int64_t r) {
      return Op::op().call(g, x, t, r, s...);
    };
    VmapLevel level;
    if (!level.any_batched({&grad_output, &self, &target})) return op(grad_output, self, target, reduction);
    const std::vector<Operand> operands{level.unwrap(grad_output), level.unwrap(self), level.unwrap(target)};
    const auto& g = operands[0];
    const auto& x = operands[1];
    const auto& t = operands[2];
    if (!all_defined(operands) || !is_valid_reduction(reduction)) return op(g.value, x.value, t.value, reduction);
    if (result_like_target) {
      // The op's own rule, on each sample's shapes (the physical call could not see it).
      const auto shape = at::infer_size_symdimvector(x.logical_sizes(), t.logical_sizes());
      TORCH_CHECK(
          at::infer_size_symdimvector(g.logical_sizes(), shape) == shape, d.backward, ": grad_output of shape ",
          c10::SymIntArrayRef(g.logical_sizes()), " must broadcast to the shape of broadcast(self, target) ",
          c10::SymIntArrayRef(shape), " without enlarging it");
    }
    const int64_t rank = max_logical_rank(operands);
    if (rank + 1 > kMaxDims) {
      return per_sample(
          level, operands, [&](const std::vector<at::Tensor>& a) { return op(a[0], a[1], a[2], reduction); });
    }
    auto gv = batch_first(g, rank);
    if (is_mean(reduction)) gv = upcast(gv).div(c10::Scalar(mean_count(d.mean_count, g, x, t)));
    const auto batch_size = level.layer.batchSize();
    const auto tv = result_like_target ? batch_first_expanded(t, rank, batch_size) : batch_first(t, rank);
    auto result = op(gv, batch_first(x, rank), tv, kSum);
    if (result_like_target && t.logical_rank() < rank) {
      auto sizes = t.logical_sizes();
      sizes.insert(sizes.begin(), batch_size);
      result = result.view_symint(sizes);
    }
    if constexpr (d.grad_dtype == GradDtype::Promoted) {  // else the physical call gives the unbatched dtype
      const auto dtype = logical_result_type(operands);
      if (result.scalar_type() != dtype) result = result.to(dtype);
    }
    return level.batched(result);
  }
};

}  // namespace npu_loss::autograd
