// The Autograd-key kernels of the npu_loss ops (one registration covers CPU, the NPU and every other
// device), written the way PyTorch's generated VariableType kernels are:
//   1. when an input requires grad, create the node, its next edges and its saved inputs;
//   2. redispatch below autograd (`ks & after_autograd_keyset` under AutoDispatchBelowADInplaceOrView);
//   3. set_history on the result;
//   4. forward-mode AD: when an input carries a tangent (level 0), compute the result's tangent from the
//      primals with differentiable ops (the package's own backward ops where they fit) and set it. Missing
//      tangents count as zeros.
// Because the graph is recorded like ATen's, functorch's grad/vjp/jacrev/jvp/jacfwd/hessian transforms and
// compiled autograd handle these ops as they do ATen's.
// Autograd lives in C++ rather than in Python (torch.library.register_autograd) for small-tensor speed: a
// Python autograd.Function costs several microseconds per call.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include "../ops.h"
#include "functions.h"

namespace npu_loss::autograd {
namespace {

using torch::autograd::collect_next_edges;
using torch::autograd::compute_requires_grad;
using torch::autograd::set_history;

// Forward-mode AD has one active level, 0: torch.autograd.forward_ad.dual_level() enters it, and functorch's
// jvp nests transforms through its own tensor wrappers, each at level 0 (as ATen's generated kernels assume).
constexpr uint64_t kLevel = 0;

bool has_tangent(const at::Tensor& t) {
  return t._fw_grad(kLevel).defined();
}

const at::Tensor& tangent(const at::Tensor& t) {
  return t._fw_grad(kLevel);
}

// The input without its tangent, for the tangent formulas (their results must not carry tangents).
at::Tensor primal(const at::Tensor& t) {
  return has_tangent(t) ? t._fw_primal(kLevel) : t;
}

at::Tensor add_defined(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() ? a + b : b;
}

at::Tensor reduce_loss(const at::Tensor& values, int64_t reduction) {
  switch (static_cast<Reduction>(reduction)) {
    case Reduction::Mean:
      return values.mean();
    case Reduction::Sum:
      return values.sum();
    case Reduction::None:
      break;
  }
  return values;
}

// Sets `value` as the result's tangent: zeros when no term was defined, cast and expanded to the result.
void set_tangent(const at::Tensor& result, at::Tensor value) {
  if (!value.defined()) value = at::zeros_like(result);
  if (value.scalar_type() != result.scalar_type()) value = value.to(result.scalar_type());
  result._set_fw_grad(expand_to(value, result.sym_sizes()), kLevel, /*is_inplace_op=*/false);
}

constexpr int64_t kNone = static_cast<int64_t>(Reduction::None);

// ---- tangents of the forwards: the elementwise slope (the backward op with reduction "none") times each
// input's tangent, then reduced like the loss ----

at::Tensor smooth_l1_loss_tangent(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
  const auto x = primal(self);
  const auto t = primal(target);
  const auto& op = ops::smooth_l1_loss_backward();
  at::Tensor values;
  if (has_tangent(self)) values = op.call(tangent(self), x, t, kNone, beta);
  if (has_tangent(target)) values = add_defined(values, op.call(tangent(target), t, x, kNone, beta));
  return reduce_loss(values, reduction);
}

at::Tensor l1_loss_tangent(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const auto x = primal(self);
  const auto t = primal(target);
  const auto& op = ops::l1_loss_backward();
  at::Tensor values;
  if (has_tangent(self)) values = op.call(tangent(self), x, t, kNone);
  if (has_tangent(target)) values = add_defined(values, op.call(tangent(target), t, x, kNone));
  return reduce_loss(values, reduction);
}

at::Tensor kl_div_tangent(const at::Tensor& self, const at::Tensor& target, int64_t reduction, bool log_target) {
  const auto x = primal(self);
  const auto t = primal(target);
  at::Tensor values;
  if (has_tangent(self)) values = (tangent(self) * (log_target ? t.exp() : t)).neg();
  if (has_tangent(target)) {
    // The target gradient with target's tangent as grad_output, over the broadcast shape (nothing summed).
    const auto shape = broadcast_shape(x, t);
    values = add_defined(
        values,
        ops::kl_div_target_backward().call(expand_to(tangent(target), shape), x, expand_to(t, shape), kNone, log_target));
  }
  return reduce_loss(values, reduction);
}

// ---- tangents of the backward ops (ATen's derivatives.yaml formulas); hessians need them ----

at::Tensor smooth_l1_loss_backward_tangent(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta) {
  const auto g = primal(grad_output);
  const auto x = primal(self);
  const auto t = primal(target);
  at::Tensor out;
  if (has_tangent(grad_output)) out = ops::smooth_l1_loss_backward().call(tangent(grad_output), x, t, reduction, beta);
  const bool dx = has_tangent(self);
  const bool dt = has_tangent(target);
  if ((dx || dt) && beta > 0) {
    // The slope d / beta has derivative 1 / beta inside |d| < beta, 0 elsewhere (and everywhere at beta == 0).
    const auto d_tangent = dx ? (dt ? tangent(self) - tangent(target) : tangent(self)) : tangent(target).neg();
    const auto d = x - t;
    out = add_defined(out, apply_mean((d.abs() < beta) * (g * d_tangent) / beta, reduction, x.sym_numel()));
  }
  return out;
}

at::Tensor l1_loss_backward_tangent(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  // sign(d) is piecewise constant: only grad_output's tangent contributes.
  if (!has_tangent(grad_output)) return at::Tensor();
  return ops::l1_loss_backward().call(tangent(grad_output), primal(self), primal(target), reduction);
}

at::Tensor kl_div_target_backward_tangent(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    bool log_target) {
  const auto g = primal(grad_output);
  const auto x = primal(self);
  const auto t = primal(target);
  at::Tensor out;
  if (has_tangent(grad_output)) {
    out = ops::kl_div_target_backward().call(tangent(grad_output), x, t, reduction, log_target);
  }
  const bool dx = has_tangent(self);
  const bool dt = has_tangent(target);
  if (!(dx || dt)) return out;
  const auto shape = broadcast_shape(x, t);
  at::Tensor values;
  if (log_target) {
    const auto ge = g * t.exp();
    if (dx) values = (ge * tangent(self)).neg();
    if (dt) values = add_defined(values, ge * (t + 2 - x) * tangent(target));
    values = expand_to(values, shape);
  } else {
    // A zero probability has a zero gradient, whatever self and grad_output do.
    const auto zero = t == 0;
    if (dx) values = (g * tangent(self)).neg();
    if (dt) values = add_defined(values, g * tangent(target) / t.masked_fill(zero, 1));
    values = expand_to(values, shape).masked_fill(zero, 0);
  }
  values = apply_mean(values, reduction, numel_of(shape));
  return add_defined(out, reduce_to(values, t));
}

// An undefined (None) tensor skips autograd, so that the kernel's checks report it by name.
bool all_defined(std::initializer_list<const at::Tensor*> tensors) {
  for (const auto* t : tensors) {
    if (!t->defined()) return false;
  }
  return true;
}

// ---- the Autograd kernels ----

at::Tensor smooth_l1_loss_autograd(
    c10::DispatchKeySet ks, const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
  const auto below = ks & c10::after_autograd_keyset;
  c10::intrusive_ptr<SmoothL1LossBackward0> grad_fn;
  const bool defined = all_defined({&self, &target});
  if (defined && compute_requires_grad(self, target)) {
    grad_fn = c10::make_intrusive<SmoothL1LossBackward0>();
    grad_fn->set_next_edges(collect_next_edges(self, target));
    grad_fn->self_ = SavedVariable(self, false);
    grad_fn->target_ = SavedVariable(target, false);
    grad_fn->reduction = reduction;
    grad_fn->beta = beta;
  }
  const bool forward_ad = defined && (has_tangent(self) || has_tangent(target));
  at::Tensor result;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    result = ops::smooth_l1_loss().redispatch(below, self, target, reduction, beta);
  }
  if (grad_fn) set_history(result, grad_fn);
  if (forward_ad) set_tangent(result, smooth_l1_loss_tangent(self, target, reduction, beta));
  return result;
}

at::Tensor l1_loss_autograd(c10::DispatchKeySet ks, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const auto below = ks & c10::after_autograd_keyset;
  c10::intrusive_ptr<L1LossBackward0> grad_fn;
  const bool defined = all_defined({&self, &target});
  if (defined && compute_requires_grad(self, target)) {
    grad_fn = c10::make_intrusive<L1LossBackward0>();
    grad_fn->set_next_edges(collect_next_edges(self, target));
    grad_fn->self_ = SavedVariable(self, false);
    grad_fn->target_ = SavedVariable(target, false);
    grad_fn->reduction = reduction;
  }
  const bool forward_ad = defined && (has_tangent(self) || has_tangent(target));
  at::Tensor result;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    result = ops::l1_loss().redispatch(below, self, target, reduction);
  }
  if (grad_fn) set_history(result, grad_fn);
  if (forward_ad) set_tangent(result, l1_loss_tangent(self, target, reduction));
  return result;
}

at::Tensor kl_div_autograd(
    c10::DispatchKeySet ks, const at::Tensor& self, const at::Tensor& target, int64_t reduction, bool log_target) {
  const auto below = ks & c10::after_autograd_keyset;
  c10::intrusive_ptr<KlDivBackward0> grad_fn;
  const bool defined = all_defined({&self, &target});
  if (defined && compute_requires_grad(self, target)) {
    grad_fn = c10::make_intrusive<KlDivBackward0>();
    grad_fn->set_next_edges(collect_next_edges(self, target));
    grad_fn->self_ = SavedVariable(self, false);
    grad_fn->target_ = SavedVariable(target, false);
    grad_fn->reduction = reduction;
    grad_fn->log_target = log_target;
  }
  const bool forward_ad = defined && (has_tangent(self) || has_tangent(target));
  at::Tensor result;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    result = ops::kl_div().redispatch(below, self, target, reduction, log_target);
  }
  if (grad_fn) set_history(result, grad_fn);
  if (forward_ad) set_tangent(result, kl_div_tangent(self, target, reduction, log_target));
  return result;
}

at::Tensor smooth_l1_loss_backward_autograd(
    c10::DispatchKeySet ks, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
    int64_t reduction, double beta) {
  const auto below = ks & c10::after_autograd_keyset;
  c10::intrusive_ptr<SmoothL1LossBackwardBackward0> grad_fn;
  const bool defined = all_defined({&grad_output, &self, &target});
  if (defined && compute_requires_grad(grad_output, self, target)) {
    grad_fn = c10::make_intrusive<SmoothL1LossBackwardBackward0>();
    grad_fn->set_next_edges(collect_next_edges(grad_output, self, target));
    grad_fn->grad_output_ = SavedVariable(grad_output, false);
    grad_fn->self_ = SavedVariable(self, false);
    grad_fn->target_ = SavedVariable(target, false);
    grad_fn->reduction = reduction;
    grad_fn->beta = beta;
  }
  const bool forward_ad = defined && (has_tangent(grad_output) || has_tangent(self) || has_tangent(target));
  at::Tensor result;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    result = ops::smooth_l1_loss_backward().redispatch(below, grad_output, self, target, reduction, beta);
  }
  if (grad_fn) set_history(result, grad_fn);
  if (forward_ad) {
    set_tangent(result, smooth_l1_loss_backward_tangent(grad_output, self, target, reduction, beta));
  }
  return result;
}

at::Tensor l1_loss_backward_autograd(
    c10::DispatchKeySet ks, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
    int64_t reduction) {
  const auto below = ks & c10::after_autograd_keyset;
  c10::intrusive_ptr<L1LossBackwardBackward0> grad_fn;
  const bool defined = all_defined({&grad_output, &self, &target});
  if (defined && compute_requires_grad(grad_output, self, target)) {
    grad_fn = c10::make_intrusive<L1LossBackwardBackward0>();
    grad_fn->set_next_edges(collect_next_edges(grad_output, self, target));
    grad_fn->grad_output_ = SavedVariable(grad_output, false);
    grad_fn->self_ = SavedVariable(self, false);
    grad_fn->target_ = SavedVariable(target, false);
    grad_fn->reduction = reduction;
  }
  const bool forward_ad = defined && (has_tangent(grad_output) || has_tangent(self) || has_tangent(target));
  at::Tensor result;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    result = ops::l1_loss_backward().redispatch(below, grad_output, self, target, reduction);
  }
  if (grad_fn) set_history(result, grad_fn);
  if (forward_ad) set_tangent(result, l1_loss_backward_tangent(grad_output, self, target, reduction));
  return result;
}

at::Tensor kl_div_target_backward_autograd(
    c10::DispatchKeySet ks, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
    int64_t reduction, bool log_target) {
  const auto below = ks & c10::after_autograd_keyset;
  c10::intrusive_ptr<KlDivTargetBackwardBackward0> grad_fn;
  const bool defined = all_defined({&grad_output, &self, &target});
  if (defined && compute_requires_grad(grad_output, self, target)) {
    grad_fn = c10::make_intrusive<KlDivTargetBackwardBackward0>();
    grad_fn->set_next_edges(collect_next_edges(grad_output, self, target));
    grad_fn->grad_output_ = SavedVariable(grad_output, false);
    grad_fn->self_ = SavedVariable(self, false);
    grad_fn->target_ = SavedVariable(target, false);
    grad_fn->reduction = reduction;
    grad_fn->log_target = log_target;
  }
  const bool forward_ad = defined && (has_tangent(grad_output) || has_tangent(self) || has_tangent(target));
  at::Tensor result;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    result = ops::kl_div_target_backward().redispatch(below, grad_output, self, target, reduction, log_target);
  }
  if (grad_fn) set_history(result, grad_fn);
  if (forward_ad) {
    set_tangent(result, kl_div_target_backward_tangent(grad_output, self, target, reduction, log_target));
  }
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, Autograd, m) {
  m.impl("smooth_l1_loss", TORCH_FN(smooth_l1_loss_autograd));
  m.impl("l1_loss", TORCH_FN(l1_loss_autograd));
  m.impl("kl_div", TORCH_FN(kl_div_autograd));
  m.impl("smooth_l1_loss_backward", TORCH_FN(smooth_l1_loss_backward_autograd));
  m.impl("l1_loss_backward", TORCH_FN(l1_loss_backward_autograd));
  m.impl("kl_div_target_backward", TORCH_FN(kl_div_target_backward_autograd));
}

}  // namespace npu_loss::autograd
