// vmap batching rules (FuncTorchBatched kernels) for the six functional ops, so that torch.func.vmap,
// per-sample gradients (vmap(grad(...))), jacrev and jacfwd never fall back to PyTorch's per-sample loop.
// Written in C++ like functorch's own rules (aten/src/ATen/functorch/BatchRules*.cpp): a Python
// torch.library.register_vmap rule costs several microseconds of interpreter time per call, more than the
// whole loss on small tensors (benchmarks/bench_autograd.py measures both).
//
// Every rule moves the batch dims to the front, pads the batched operands with size-1 dims to a common
// logical rank (so they broadcast sample by sample; unbatched operands broadcast as they are) and calls the
// op once on the physical tensors:
//   - forwards with "none" run as they are; "mean"/"sum" run as "none" and reduce each sample's row
//     (half types in float32, rounded once at the end);
//   - backward ops run with "sum" (no scaling) after grad_output is divided by each sample's own "mean"
//     count, since the op would otherwise divide by the whole batch's count;
//   - results get the dtype of the unbatched call (a 0-dim operand does not promote a dimensioned one, even
//     though its batched physical tensor has a dim).
// Calls whose padded rank would exceed the ops' 8 dims run sample by sample.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/functorch/PlumbingHelper.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <functional>
#include <numeric>
#include <optional>
#include <vector>

#include "../core/checks.h"
#include "../ops.h"

namespace npu_loss::batching {
namespace {

constexpr int64_t kNone = static_cast<int64_t>(Reduction::None);
constexpr int64_t kSum = static_cast<int64_t>(Reduction::Sum);

bool is_mean(int64_t reduction) {
  return reduction == static_cast<int64_t>(Reduction::Mean);
}

// The rules call the ops with a reduction of their own; an invalid one goes to the op as it is, to be
// rejected with the op's own error.
bool is_valid(int64_t reduction) {
  return reduction >= 0 && reduction <= 2;
}

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

bool all_defined(std::initializer_list<const Operand*> operands) {
  for (const auto* o : operands) {
    if (!o->value.defined()) return false;
  }
  return true;
}

// The batch dim first, then size-1 dims up to `rank` logical dims. Unbatched operands stay as they are:
// right-aligned broadcasting already pairs them with every sample.
at::Tensor batch_first(const Operand& o, int64_t rank) {
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
at::Tensor batch_first_expanded(const Operand& o, int64_t rank, const c10::SymInt& batch_size) {
  if (o.bdim) return batch_first(o, rank);
  c10::SymDimVector shape(static_cast<size_t>(rank - o.logical_rank() + 1), c10::SymInt(1));
  const auto sizes = o.value.sym_sizes();
  shape.append(sizes.begin(), sizes.end());
  auto expanded = shape;
  expanded[0] = batch_size;
  return o.value.view_symint(shape).expand_symint(expanded);
}

int64_t max_logical_rank(std::initializer_list<const Operand*> operands) {
  int64_t rank = 0;
  for (const auto* o : operands) rank = std::max(rank, o->logical_rank());
  return rank;
}

c10::SymInt numel_of(c10::SymIntArrayRef shape) {
  c10::SymInt n = 1;
  for (const auto& s : shape) n = n * s;
  return n;
}

bool is_half(c10::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16;
}

// PyTorch's result_type with the operands' logical dims: dimensioned operands decide, 0-dim ones only when
// no operand has a dim (every dtype the ops accept is floating, so categories never differ).
c10::ScalarType logical_result_type(std::initializer_list<const Operand*> operands) {
  std::optional<c10::ScalarType> dimensioned, zero_dim;
  for (const auto* o : operands) {
    auto& slot = o->logical_rank() > 0 ? dimensioned : zero_dim;
    const auto t = o->value.scalar_type();
    slot = slot ? c10::promoteTypes(*slot, t) : t;
  }
  return dimensioned ? *dimensioned : *zero_dim;
}

// float32 for half types (a per-sample reduction is then rounded once), the tensor itself otherwise.
at::Tensor upcast(const at::Tensor& t) {
  return is_half(t.scalar_type()) ? t.to(at::kFloat) : t;
}

// grad_output divided by each sample's "mean" count (in float32 for half types), for a "sum" call.
at::Tensor scale_for_mean(const at::Tensor& grad, int64_t reduction, const c10::SymInt& count) {
  return is_mean(reduction) ? upcast(grad).div(c10::Scalar(count)) : grad;
}

// The slow path for calls the padded physical rank would push past the ops' dimension limit.
at::Tensor per_sample(
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

// ---- forwards ----

using LossCall = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>;

at::Tensor loss_batched(const at::Tensor& self, const at::Tensor& target, int64_t reduction, const LossCall& call) {
  VmapLevel level;
  if (!level.any_batched({&self, &target})) return call(self, target, reduction);
  const auto x = level.unwrap(self);
  const auto t = level.unwrap(target);
  if (!all_defined({&x, &t}) || !is_valid(reduction)) return call(x.value, t.value, reduction);
  const int64_t rank = max_logical_rank({&x, &t});
  if (rank + 1 > kMaxDims) {
    return per_sample(level, {x, t}, [&](const std::vector<at::Tensor>& a) { return call(a[0], a[1], reduction); });
  }
  const auto dtype = logical_result_type({&x, &t});
  auto xv = batch_first(x, rank);
  auto tv = batch_first(t, rank);
  at::Tensor result;
  if (reduction == kNone) {
    result = call(xv, tv, kNone);
  } else {
    if (is_half(dtype)) {
      xv = upcast(xv);
      tv = upcast(tv);
    }
    const auto values = call(xv, tv, kNone);
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

at::Tensor smooth_l1_loss_batched(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
  return loss_batched(self, target, reduction, [beta](const at::Tensor& x, const at::Tensor& t, int64_t r) {
    return ops::smooth_l1_loss().call(x, t, r, beta);
  });
}

at::Tensor l1_loss_batched(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  return loss_batched(self, target, reduction, [](const at::Tensor& x, const at::Tensor& t, int64_t r) {
    return ops::l1_loss().call(x, t, r);
  });
}

at::Tensor kl_div_batched(const at::Tensor& self, const at::Tensor& target, int64_t reduction, bool log_target) {
  return loss_batched(self, target, reduction, [log_target](const at::Tensor& x, const at::Tensor& t, int64_t r) {
    return ops::kl_div().call(x, t, r, log_target);
  });
}

// ---- backward ops ----

at::Tensor smooth_l1_loss_backward_batched(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta) {
  const auto& op = ops::smooth_l1_loss_backward();
  VmapLevel level;
  if (!level.any_batched({&grad_output, &self, &target})) return op.call(grad_output, self, target, reduction, beta);
  const auto g = level.unwrap(grad_output);
  const auto x = level.unwrap(self);
  const auto t = level.unwrap(target);
  if (!all_defined({&g, &x, &t}) || !is_valid(reduction)) {
    return op.call(g.value, x.value, t.value, reduction, beta);
  }
  const int64_t rank = max_logical_rank({&g, &x, &t});
  if (rank + 1 > kMaxDims) {
    return per_sample(level, {g, x, t}, [&](const std::vector<at::Tensor>& a) {
      return op.call(a[0], a[1], a[2], reduction, beta);
    });
  }
  // "mean" divides by each sample's self.numel().
  const auto gv = scale_for_mean(batch_first(g, rank), reduction, numel_of(x.logical_sizes()));
  return level.batched(op.call(gv, batch_first(x, rank), batch_first(t, rank), kSum, beta));
}

at::Tensor l1_loss_backward_batched(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const auto& op = ops::l1_loss_backward();
  VmapLevel level;
  if (!level.any_batched({&grad_output, &self, &target})) return op.call(grad_output, self, target, reduction);
  const auto g = level.unwrap(grad_output);
  const auto x = level.unwrap(self);
  const auto t = level.unwrap(target);
  if (!all_defined({&g, &x, &t}) || !is_valid(reduction)) {
    return op.call(g.value, x.value, t.value, reduction);
  }
  const int64_t rank = max_logical_rank({&g, &x, &t});
  if (rank + 1 > kMaxDims) {
    return per_sample(level, {g, x, t}, [&](const std::vector<at::Tensor>& a) {
      return op.call(a[0], a[1], a[2], reduction);
    });
  }
  // "mean" divides by each sample's broadcast(grad_output, self, target) count.
  const auto count = numel_of(at::infer_size_symdimvector(
      at::infer_size_symdimvector(g.logical_sizes(), x.logical_sizes()), t.logical_sizes()));
  const auto gv = scale_for_mean(batch_first(g, rank), reduction, count);
  auto result = op.call(gv, batch_first(x, rank), batch_first(t, rank), kSum);
  const auto dtype = logical_result_type({&g, &x, &t});
  if (result.scalar_type() != dtype) result = result.to(dtype);
  return level.batched(result);
}

at::Tensor kl_div_target_backward_batched(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    bool log_target) {
  const auto& op = ops::kl_div_target_backward();
  VmapLevel level;
  if (!level.any_batched({&grad_output, &self, &target})) {
    return op.call(grad_output, self, target, reduction, log_target);
  }
  const auto g = level.unwrap(grad_output);
  const auto x = level.unwrap(self);
  const auto t = level.unwrap(target);
  if (!all_defined({&g, &x, &t}) || !is_valid(reduction)) {
    return op.call(g.value, x.value, t.value, reduction, log_target);
  }
  const auto shape = at::infer_size_symdimvector(x.logical_sizes(), t.logical_sizes());
  // The op's own rule, on each sample's shapes (the physical call could not see it).
  TORCH_CHECK(
      at::infer_size_symdimvector(g.logical_sizes(), shape) == shape, "kl_div_target_backward: grad_output of shape ",
      c10::SymIntArrayRef(g.logical_sizes()), " must broadcast to the shape of broadcast(self, target) ",
      c10::SymIntArrayRef(shape), " without enlarging it");
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (rank + 1 > kMaxDims) {
    return per_sample(level, {g, x, t}, [&](const std::vector<at::Tensor>& a) {
      return op.call(a[0], a[1], a[2], reduction, log_target);
    });
  }
  // The result has target's shape, so target carries the batch dim even when it is shared.
  const auto batch_size = level.layer.batchSize();
  const auto tv = batch_first_expanded(t, rank, batch_size);
  const auto gv = scale_for_mean(batch_first(g, rank), reduction, numel_of(shape));
  auto result = op.call(gv, batch_first(x, rank), tv, kSum, log_target);
  if (t.logical_rank() < rank) {
    auto sizes = t.logical_sizes();
    sizes.insert(sizes.begin(), batch_size);
    result = result.view_symint(sizes);
  }
  return level.batched(result);
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, FuncTorchBatched, m) {
  m.impl("smooth_l1_loss", &smooth_l1_loss_batched);
  m.impl("l1_loss", &l1_loss_batched);
  m.impl("kl_div", &kl_div_batched);
  m.impl("smooth_l1_loss_backward", &smooth_l1_loss_backward_batched);
  m.impl("l1_loss_backward", &l1_loss_backward_batched);
  m.impl("kl_div_target_backward", &kl_div_target_backward_batched);
}

}  // namespace npu_loss::batching
