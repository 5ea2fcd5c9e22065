// The autograd graph nodes of the npu_loss ops, written the way PyTorch's generated
// torch/csrc/autograd/generated/Functions.h nodes are: one TraceableFunction per op, holding its inputs as
// SavedVariables (never intermediates) and its scalar arguments, with compiled-autograd support
// (compiled_args / apply_with_saved proxy a functional form of `apply` into the compiled graph).
//
// Forward-op nodes get a gradient w.r.t. self and target; backward-op nodes (double backward) w.r.t.
// grad_output, self and target. Each gradient is summed back to its input's shape and dtype. A gradient is
// undefined only when the incoming gradient is; where the derivative is zero it is a zero tensor.
//
// Node names carry the library's prefix, so that compiled autograd (which binds each node's functional form
// under its name) never confuses them with ATen's SmoothL1LossBackward0 and friends.
#pragma once

#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <array>
#include <string>

#include "../core/checks.h"

namespace npu_loss::autograd {

using torch::autograd::SavedVariable;
using torch::autograd::TraceableFunction;
using torch::autograd::variable_list;
using torch::dynamo::autograd::CompiledNodeArgs;
using torch::dynamo::autograd::SwapSavedVariables;

// ---- shape and dtype helpers shared by the nodes and the forward-AD formulas ----

inline bool is_mean(int64_t reduction) {
  return reduction == static_cast<int64_t>(Reduction::Mean);
}

inline c10::SymDimVector broadcast_shape(const at::Tensor& a, const at::Tensor& b) {
  if (a.sym_sizes() == b.sym_sizes()) return c10::SymDimVector(a.sym_sizes().begin(), a.sym_sizes().end());
  return at::infer_size_symdimvector(a.sym_sizes(), b.sym_sizes());
}

inline c10::SymInt numel_of(c10::SymIntArrayRef shape) {
  c10::SymInt n = 1;
  for (const auto& s : shape) n = n * s;
  return n;
}

// `t` as a view of `shape` (no copy); `t` itself when it already has that shape.
inline at::Tensor expand_to(const at::Tensor& t, c10::SymIntArrayRef shape) {
  return t.sym_sizes() == shape ? t : t.expand_symint(shape);
}

// A gradient summed to `like`'s shape, cast to its dtype and, for a 4-D or 5-D input, laid out in its
// suggested memory format (a channels_last input gets a channels_last gradient; docs/semantics.md,
// "Memory format"); undefined stays undefined.
inline at::Tensor reduce_to(const at::Tensor& grad, const at::Tensor& like) {
  if (!grad.defined()) return grad;
  at::Tensor g = grad.sym_sizes() == like.sym_sizes() ? grad : at::sum_to(grad, like.sym_sizes());
  if (g.scalar_type() != like.scalar_type()) g = g.to(like.scalar_type());
  if (like.dim() == 4 || like.dim() == 5) g = with_memory_format(g, like.suggest_memory_format());
  return g;
}

// v / count for "mean", v otherwise (an empty count gives inf / NaN, as PyTorch's division does).
inline at::Tensor apply_mean(const at::Tensor& v, int64_t reduction, const c10::SymInt& count) {
  return is_mean(reduction) ? v.div(c10::Scalar(count)) : v;
}

// ---- the nodes ----

struct SmoothL1LossBackward0 : public TraceableFunction {
  using TraceableFunction::TraceableFunction;
  variable_list apply(variable_list&& grads) override;
  std::string name() const override {
    return "NpuLossSmoothL1LossBackward0";
  }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    self_.reset_data();
    target_.reset_data();
  }
  void compiled_args(CompiledNodeArgs& args) const override;
  variable_list apply_with_saved(const variable_list& grads, SwapSavedVariables& saved) override;

  SavedVariable self_;
  SavedVariable target_;
  int64_t reduction = 0;
  double beta = 1.0;
};

struct L1LossBackward0 : public TraceableFunction {
  using TraceableFunction::TraceableFunction;
  variable_list apply(variable_list&& grads) override;
  std::string name() const override {
    return "NpuLossL1LossBackward0";
  }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    self_.reset_data();
    target_.reset_data();
  }
  void compiled_args(CompiledNodeArgs& args) const override;
  variable_list apply_with_saved(const variable_list& grads, SwapSavedVariables& saved) override;

  SavedVariable self_;
  SavedVariable target_;
  int64_t reduction = 0;
};

struct KlDivBackward0 : public TraceableFunction {
  using TraceableFunction::TraceableFunction;
  variable_list apply(variable_list&& grads) override;
  std::string name() const override {
    return "NpuLossKlDivBackward0";
  }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    self_.reset_data();
    target_.reset_data();
  }
  void compiled_args(CompiledNodeArgs& args) const override;
  variable_list apply_with_saved(const variable_list& grads, SwapSavedVariables& saved) override;

  SavedVariable self_;
  SavedVariable target_;
  int64_t reduction = 0;
  bool log_target = false;
};

struct SmoothL1LossBackwardBackward0 : public TraceableFunction {
  using TraceableFunction::TraceableFunction;
  variable_list apply(variable_list&& grads) override;
  std::string name() const override {
    return "NpuLossSmoothL1LossBackwardBackward0";
  }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    grad_output_.reset_data();
    self_.reset_data();
    target_.reset_data();
  }
  void compiled_args(CompiledNodeArgs& args) const override;
  variable_list apply_with_saved(const variable_list& grads, SwapSavedVariables& saved) override;

  SavedVariable grad_output_;
  SavedVariable self_;
  SavedVariable target_;
  int64_t reduction = 0;
  double beta = 1.0;
};

struct L1LossBackwardBackward0 : public TraceableFunction {
  using TraceableFunction::TraceableFunction;
  variable_list apply(variable_list&& grads) override;
  std::string name() const override {
    return "NpuLossL1LossBackwardBackward0";
  }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    grad_output_.reset_data();
    self_.reset_data();
    target_.reset_data();
  }
  void compiled_args(CompiledNodeArgs& args) const override;
  variable_list apply_with_saved(const variable_list& grads, SwapSavedVariables& saved) override;

  SavedVariable grad_output_;
  SavedVariable self_;
  SavedVariable target_;
  int64_t reduction = 0;
};

struct KlDivTargetBackwardBackward0 : public TraceableFunction {
  using TraceableFunction::TraceableFunction;
  variable_list apply(variable_list&& grads) override;
  std::string name() const override {
    return "NpuLossKlDivTargetBackwardBackward0";
  }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    grad_output_.reset_data();
    self_.reset_data();
    target_.reset_data();
  }
  void compiled_args(CompiledNodeArgs& args) const override;
  variable_list apply_with_saved(const variable_list& grads, SwapSavedVariables& saved) override;

  SavedVariable grad_output_;
  SavedVariable self_;
  SavedVariable target_;
  int64_t reduction = 0;
  bool log_target = false;
};

}  // namespace npu_loss::autograd
