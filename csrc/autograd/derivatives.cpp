// The derivatives of every npu_loss op, one block per op: its saved inputs (the first kTensors arguments)
// and scalars (the rest of its signature), its backward formula (one gradient per tensor input), its
// tangent formula (forward-mode AD); its batching rule reads the rest from the loss's declaration. The blocks
// drive the generic node and Autograd kernel (node.h) and the generic vmap rules (vmap.h); the bottom of
// this file registers them. docs/adding_a_loss.md says what a new loss adds here.
//
// Forwards: the backward ops get broadcast-expanded self and target (views, no copies) and each gradient is
// summed back to its input's shape. Backward ops: their own formulas (ATen's derivatives.yaml), so double
// backward and hessians work. Where the math gives a zero derivative the gradient is a zero tensor.
#include "derivatives.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include "../core/ops.h"
#include "node.h"
#include "vmap.h"

namespace npu_loss::autograd {

namespace detail {

variable_list proxy_into_compiled_graph(
    const torch::autograd::Node& node, torch::dynamo::autograd::SwapSavedVariables& saved, bool& bound,
    torch::autograd::functional_apply_t fn, std::vector<at::TypePtr> schema, PackedArgs& packed,
    const variable_list& grads) {
  const auto& py = torch::dynamo::autograd::getPyCompilerInterface();
  if (!bound) {
    py->bind_function(saved.get_py_compiler(), node.name(), std::move(fn), std::move(schema));
    bound = true;
  }
  const auto output_metadata = IValuePacker<std::vector<std::optional<torch::autograd::InputMetadata>>>::pack(
      torch::dynamo::autograd::get_input_metadata(node.next_edges()));
  return py->call_function(
      saved.get_py_compiler(), "apply_functional", node.name(), grads, packed.vec(), output_metadata);
}

}  // namespace detail

namespace {

// Gradients of a loss whose slope is odd in d = self - target (smooth L1, L1): `slope(g, a, b)` is the
// backward op; it gives self's gradient, and with self and target swapped, target's. Both over the
// broadcast shape (smooth L1's "mean" divides by self.numel(), which must be the broadcast count).
template <typename Slope>
variable_list odd_slope_grads(
    const at::Tensor& grad, const Needs<2>& needs, const at::Tensor& self, const at::Tensor& target,
    const Slope& slope) {
  variable_list out(2);
  const auto shape = broadcast_shape(self, target);
  const auto x = expand_to(self, shape);
  const auto t = expand_to(target, shape);
  if (needs[0]) out[0] = reduce_to(slope(grad, x, t), self);
  if (needs[1]) out[1] = reduce_to(slope(grad, t, x), target);
  return out;
}

// Their tangents: the elementwise slope (`slope` is the backward op with "none") times each input's
// tangent, reduced like the loss.
template <typename Slope>
at::Tensor odd_slope_tangent(const Dual& self, const Dual& target, int64_t reduction, const Slope& slope) {
  at::Tensor values;
  if (self.has_tangent()) values = slope(self.t, self.p, target.p);
  if (target.has_tangent()) values = add_defined(values, slope(target.t, target.p, self.p));
  return reduce_values(values, reduction);
}

// The slope of a backward op, as its double backward sees it: linear with derivative `inside` where
// |d| < clip (everywhere without a clip), constant elsewhere. smooth L1: d / beta clipped at beta; Huber: d
// clipped at delta; MSE: 2d, no clip; L1: sign(d), `inside == 0`, a piecewise-constant slope whose
// derivative w.r.t. self and target is zero.
struct Slope {
  double inside;
  std::optional<double> clip;
};

// `v` where the slope is linear: masked by |d| < clip, or expanded to the broadcast shape without a clip.
inline at::Tensor where_linear(
    const at::Tensor& v, const at::Tensor& self, const at::Tensor& target, const Slope& slope) {
  if (slope.clip) return ((self - target).abs() < *slope.clip) * v;
  return expand_to(v, at::infer_size_symdimvector(v.sym_sizes(), broadcast_shape(self, target)));
}

// The double backward of such a backward op, which is linear in grad_output: `backward_op(g)` is it with g
// as grad_output. The slope's derivative scales as "mean" does, by self.numel().
template <typename BackwardOp>
variable_list linear_slope_grads(
    const at::Tensor& gg, const Needs<3>& needs, const at::Tensor& grad_output, const at::Tensor& self,
    const at::Tensor& target, int64_t reduction, const Slope& slope, const BackwardOp& backward_op) {
  variable_list out(3);
  if (needs[0]) out[0] = reduce_to(backward_op(gg), grad_output);
  if (!(needs[1] || needs[2])) return out;
  if (slope.inside == 0) {
    if (needs[1]) out[1] = at::zeros_like(self);
    if (needs[2]) out[2] = at::zeros_like(target);
    return out;
  }
  const auto values =
      apply_mean(where_linear(grad_output * gg, self, target, slope) * slope.inside, reduction, self.sym_numel());
  if (needs[1]) out[1] = reduce_to(values, self);
  if (needs[2]) out[2] = reduce_to(values.neg(), target);
  return out;
}

// Its tangent: the backward op on grad_output's tangent, plus the slope's derivative times d's tangent.
template <typename BackwardOp>
at::Tensor linear_slope_tangent(
    const Dual& grad_output, const Dual& self, const Dual& target, int64_t reduction, const Slope& slope,
    const BackwardOp& backward_op) {
  at::Tensor out;
  if (grad_output.has_tangent()) out = backward_op(grad_output.t);
  if (!(self.has_tangent() || target.has_tangent()) || slope.inside == 0) return out;
  const auto d_tangent = self.has_tangent() ? (target.has_tangent() ? self.t - target.t : self.t) : target.t.neg();
  const auto linear = where_linear(grad_output.p * d_tangent, self.p, target.p, slope);
  return add_defined(out, apply_mean(linear * slope.inside, reduction, self.p.sym_numel()));
}

// What every block shares: its loss, its signature, how many leading arguments are (saved, differentiable)
// tensors, its dispatcher handle and its name (from the loss's declaration, losses.h).
template <typename L, bool IsBackward>
struct Block {
  using Loss = L;
  using Signature =
      std::conditional_t<IsBackward, typename Signatures<L>::Backward, typename Signatures<L>::Forward>;
  static constexpr size_t kTensors = IsBackward ? 3 : 2;
  static constexpr const char* kName = IsBackward ? L::decl.backward : L::decl.forward;
  static const c10::TypedOperatorHandle<Signature>& op() {
    if constexpr (IsBackward) {
      return ops::backward<L>();
    } else {
      return ops::forward<L>();
    }
  }
};

// The block of a loss's forward op, and of its backward op.
template <typename Loss>
using ForwardBlock = Block<Loss, false>;
template <typename Loss>
using BackwardBlock = Block<Loss, true>;

// A forward loss whose slope is odd in d (smooth L1, Huber, L1): its gradients and tangent are its backward
// op's (odd_slope_grads, odd_slope_tangent), whatever its scalars.
template <typename Loss, typename Scalars = ScalarsOf<Loss>>
struct OddSlopeLoss;

template <typename Loss, typename... S>
struct OddSlopeLoss<Loss, std::tuple<S...>> : ForwardBlock<Loss> {
  static variable_list backward(
      const at::Tensor& grad, const Needs<2>& needs, const at::Tensor& self, const at::Tensor& target,
      int64_t reduction, S... s) {
    return odd_slope_grads(grad, needs, self, target, [&](const at::Tensor& g, const at::Tensor& a, const at::Tensor& b) {
      return ops::backward<Loss>().call(g, a, b, reduction, s...);
    });
  }

  static at::Tensor tangent(const Dual& self, const Dual& target, int64_t reduction, S... s) {
    return odd_slope_tangent(self, target, reduction, [&](const at::Tensor& g, const at::Tensor& a, const at::Tensor& b) {
      return ops::backward<Loss>().call(g, a, b, kNone, s...);
    });
  }
};

// The block of a backward op whose slope is Derived::slope(scalars...).
template <typename Derived, typename Loss, typename Scalars = ScalarsOf<Loss>>
struct LinearSlopeBackward;

template <typename Derived, typename Loss, typename... S>
struct LinearSlopeBackward<Derived, Loss, std::tuple<S...>> : BackwardBlock<Loss> {
  static variable_list backward(
      const at::Tensor& gg, const Needs<3>& needs, const at::Tensor& grad_output, const at::Tensor& self,
      const at::Tensor& target, int64_t reduction, S... s) {
    return linear_slope_grads(
        gg, needs, grad_output, self, target, reduction, Derived::slope(s...),
        [&](const at::Tensor& g) { return ops::backward<Loss>().call(g, self, target, reduction, s...); });
  }

  static at::Tensor tangent(const Dual& grad_output, const Dual& self, const Dual& target, int64_t reduction, S... s) {
    return linear_slope_tangent(
        grad_output, self, target, reduction, Derived::slope(s...),
        [&](const at::Tensor& g) { return ops::backward<Loss>().call(g, self.p, target.p, reduction, s...); });
  }
};

// ---- smooth L1: its forward, and its backward op (grad_output, self, target, reduction, beta) ----
using SmoothL1LossForward = OddSlopeLoss<SmoothL1Loss>;

struct SmoothL1LossBackward : LinearSlopeBackward<SmoothL1LossBackward, SmoothL1Loss> {
  // d / beta clipped at beta: derivative 1 / beta inside; beta == 0 is the L1 slope sign(d).
  static Slope slope(double beta) {
    return {.inside = beta > 0 ? 1.0 / beta : 0.0, .clip = beta};
  }
};

// ---- Huber: its forward, and its backward op (grad_output, self, target, reduction, delta) ----
using HuberLossForward = OddSlopeLoss<HuberLoss>;

struct HuberLossBackward : LinearSlopeBackward<HuberLossBackward, HuberLoss> {
  // d clipped at delta: derivative 1 inside.
  static Slope slope(double delta) {
    return {.inside = 1.0, .clip = delta};
  }
};

// ---- L1: its forward, and its backward op (grad_output, self, target, reduction) ----
using L1LossForward = OddSlopeLoss<L1Loss>;

struct L1LossBackward : LinearSlopeBackward<L1LossBackward, L1Loss> {
  // sign(d): piecewise constant.
  static Slope slope() {
    return {.inside = 0.0, .clip = std::nullopt};
  }
};

// ---- KL: its forward (self, target, reduction, *, log_target), and its backward op ----
struct KlDivForward : ForwardBlock<KlDiv> {

  static variable_list backward(
      const at::Tensor& grad, const Needs<2>& needs, const at::Tensor& self, const at::Tensor& target,
      int64_t reduction, bool log_target) {
    variable_list out(2);
    if (needs[0]) {
      // d/dself of target * (log target - self) is -target (-exp(target) for a log-space target), computed in
      // the gradient's dtype.
      const auto shape = broadcast_shape(self, target);
      auto p = log_target ? target.exp() : target;
      if (p.scalar_type() != grad.scalar_type()) p = p.to(grad.scalar_type());
      // -grad / n for "mean" in one operation (an aclnn launch on the NPU): dividing by -n is exactly the
      // negated quotient, so the bits are those of -(grad / n).
      const auto coef = is_mean(reduction) ? grad.div(c10::Scalar(-numel_of(shape))) : grad.neg();
      out[0] = reduce_to(expand_to(coef * p, shape), self);
    }
    if (needs[1]) {
      out[1] = reduce_to(ops::backward<KlDiv>().call(grad, self, target, reduction, log_target), target);
    }
    return out;
  }

  static at::Tensor tangent(const Dual& self, const Dual& target, int64_t reduction, bool log_target) {
    at::Tensor values;
    if (self.has_tangent()) values = (self.t * (log_target ? target.p.exp() : target.p)).neg();
    if (target.has_tangent()) {
      // The target gradient with target's tangent as grad_output, over the broadcast shape (nothing summed).
      const auto shape = broadcast_shape(self.p, target.p);
      values = add_defined(
          values, ops::backward<KlDiv>().call(
                      expand_to(target.t, shape), self.p, expand_to(target.p, shape), kNone, log_target));
    }
    return reduce_values(values, reduction);
  }
};

struct KlDivBackward : BackwardBlock<KlDiv> {

  static variable_list backward(
      const at::Tensor& gg_in, const Needs<3>& needs, const at::Tensor& grad_output, const at::Tensor& self,
      const at::Tensor& t, int64_t reduction, bool log_target) {
    variable_list out(3);
    const auto shape = broadcast_shape(self, t);
    const auto gg = apply_mean(gg_in, reduction, numel_of(shape));
    // Each derivative is elementwise over broadcast(self, target), then summed to its input's shape.
    const auto finish = [&](const at::Tensor& v, const at::Tensor& like) {
      return reduce_to(expand_to(v, shape), like);
    };
    if (log_target) {
      const auto e = t.exp();
      if (needs[0]) out[0] = finish(gg * e * (t + 1 - self), grad_output);
      if (needs[1]) out[1] = finish(-(gg * grad_output * e), self);
      if (needs[2]) out[2] = finish(gg * grad_output * e * (t + 2 - self), t);
      return out;
    }
    // A zero probability gets no gradient, and neither do its derivatives.
    const auto zero = t == 0;
    const auto safe_t = t.masked_fill(zero, 1);
    if (needs[0]) out[0] = finish((gg * (safe_t.log() + 1 - self)).masked_fill(zero, 0), grad_output);
    if (needs[1]) out[1] = finish((-(gg * grad_output)).masked_fill(zero, 0), self);
    if (needs[2]) out[2] = finish((gg * grad_output / safe_t).masked_fill(zero, 0), t);
    return out;
  }

  static at::Tensor tangent(
      const Dual& grad_output, const Dual& self, const Dual& target, int64_t reduction, bool log_target) {
    const auto& g = grad_output.p;
    const auto& x = self.p;
    const auto& t = target.p;
    at::Tensor out;
    if (grad_output.has_tangent()) out = op().call(grad_output.t, x, t, reduction, log_target);
    if (!(self.has_tangent() || target.has_tangent())) return out;
    const auto shape = broadcast_shape(x, t);
    at::Tensor values;
    if (log_target) {
      const auto ge = g * t.exp();
      if (self.has_tangent()) values = (ge * self.t).neg();
      if (target.has_tangent()) values = add_defined(values, ge * (t + 2 - x) * target.t);
      values = expand_to(values, shape);
    } else {
      // A zero probability has a zero gradient, whatever self and grad_output do.
      const auto zero = t == 0;
      if (self.has_tangent()) values = (g * self.t).neg();
      if (target.has_tangent()) values = add_defined(values, g * target.t / t.masked_fill(zero, 1));
      values = expand_to(values, shape).masked_fill(zero, 0);
    }
    values = apply_mean(values, reduction, numel_of(shape));
    return add_defined(out, reduce_to(values, t));
  }
};

// ---- MSE: its forward, and its backward op (grad_output, self, target, reduction) ----
using MseLossForward = OddSlopeLoss<MseLoss>;

// The backward op is g * 2d (scaled for "mean"): its derivative is 2 * g w.r.t. self and -2 * g w.r.t. target
// (ATen's mse_loss_double_backward).
struct MseLossBackward : LinearSlopeBackward<MseLossBackward, MseLoss> {
  static Slope slope() {
    return {.inside = 2.0, .clip = std::nullopt};
  }
};

// ---- registration: every block, at the Autograd and FuncTorchBatched keys ----

template <typename... Op>
struct Blocks {
  static void register_autograd(torch::Library& m) {
    (m.impl(Op::kName, TORCH_FN(AutogradKernel<Op>::call)), ...);
  }
  static void register_vmap(torch::Library& m) {
    (m.impl(Op::kName, &VmapKernel<Op>::call), ...);
  }
  static std::vector<std::string> names() {
    return {Op::kName...};
  }
};

using AllBlocks = Blocks<
    SmoothL1LossForward, SmoothL1LossBackward, HuberLossForward, HuberLossBackward, L1LossForward, L1LossBackward,
    KlDivForward, KlDivBackward, MseLossForward, MseLossBackward>;

}  // namespace

std::vector<std::string> differentiable_ops() {
  return AllBlocks::names();
}

TORCH_LIBRARY_IMPL(npu_loss, Autograd, m) {
  AllBlocks::register_autograd(m);
}

TORCH_LIBRARY_IMPL(npu_loss, FuncTorchBatched, m) {
  AllBlocks::register_vmap(m);
}

}  // namespace npu_loss::autograd
