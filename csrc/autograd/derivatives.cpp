// The derivatives of the elementwise losses' ops (the row losses' are autograd/rows.cpp's, their linear form's
// autograd/linear.cpp's), one block per op: ForwardBlockOf<Loss> and BackwardBlockOf<Loss>,
// each with its saved inputs (the first kTensors arguments) and scalars (the rest of its signature), its
// backward formula (one gradient per tensor input) and its tangent formula (forward-mode AD); its batching
// rule reads the rest from the loss's declaration. The blocks drive the generic node and Autograd kernel
// (node.h) and the generic vmap rules (vmap.h); the bottom of this file registers every loss's two blocks,
// from the declarations (losses.h). docs/adding_a_loss.md says what a new loss adds here.
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

// Gradients of a loss whose slope is odd in d = self - target (smooth L1, Huber, L1, MSE): `slope(g, a, b)`
// is the backward op; it gives self's gradient, and with self and target swapped, target's. Both over the
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

// The slopes of the backward ops of smooth L1, Huber, L1 and MSE (LinearSlopeBackward below uses them).
// Smooth L1 (beta): d / beta clipped at beta, derivative 1 / beta inside; beta == 0 is the L1 slope sign(d).
inline Slope slope_of(SmoothL1Loss, double beta) {
  return {.inside = beta > 0 ? 1.0 / beta : 0.0, .clip = beta};
}
// Huber (delta): d clipped at delta, derivative 1 inside.
inline Slope slope_of(HuberLoss, double delta) {
  return {.inside = 1.0, .clip = delta};
}
// L1: sign(d), piecewise constant.
inline Slope slope_of(L1Loss) {
  return {.inside = 0.0, .clip = std::nullopt};
}
// MSE: g * 2d (scaled for "mean"), derivative 2 * g w.r.t. self and -2 * g w.r.t. target (ATen's
// mse_loss_double_backward).
inline Slope slope_of(MseLoss) {
  return {.inside = 2.0, .clip = std::nullopt};
}

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

// What every block of a loss's forward op, and of its backward op, shares.
template <typename Loss>
using ForwardBlock = Block<Loss, false>;
template <typename Loss>
using BackwardBlock = Block<Loss, true>;

// A forward loss whose slope is odd in d (smooth L1, Huber, L1, MSE): its gradients and tangent are its
// backward op's (odd_slope_grads, odd_slope_tangent), whatever its scalars `s`.
template <typename Loss>
struct OddSlopeLoss : ForwardBlock<Loss> {
  template <typename... S>
  static variable_list backward(const at::Tensor& grad, const Needs<2>& needs, const at::Tensor& self,
                                const at::Tensor& target, int64_t reduction, S... s) {
    return odd_slope_grads(grad, needs, self, target, [&](const at::Tensor& g, const at::Tensor& a, const at::Tensor& b) {
      return ops::backward<Loss>().call(g, a, b, reduction, s...);
    });
  }

  template <typename... S>
  static at::Tensor tangent(const Dual& self, const Dual& target, int64_t reduction, S... s) {
    return odd_slope_tangent(self, target, reduction, [&](const at::Tensor& g, const at::Tensor& a, const at::Tensor& b) {
      return ops::backward<Loss>().call(g, a, b, kNone, s...);
    });
  }
};

// The block of a backward op linear in grad_output, with the slope slope_of(Loss{}, s...).
template <typename Loss>
struct LinearSlopeBackward : BackwardBlock<Loss> {
  template <typename... S>
  static variable_list backward(const at::Tensor& gg, const Needs<3>& needs, const at::Tensor& grad_output,
                                const at::Tensor& self, const at::Tensor& target, int64_t reduction, S... s) {
    const auto backward_op = [&](const at::Tensor& g) {
      return ops::backward<Loss>().call(g, self, target, reduction, s...);
    };
    return linear_slope_grads(gg, needs, grad_output, self, target, reduction, slope_of(Loss{}, s...), backward_op);
  }

  template <typename... S>
  static at::Tensor tangent(const Dual& grad_output, const Dual& self, const Dual& target, int64_t reduction, S... s) {
    const auto backward_op = [&](const at::Tensor& g) {
      return ops::backward<Loss>().call(g, self.p, target.p, reduction, s...);
    };
    return linear_slope_tangent(grad_output, self, target, reduction, slope_of(Loss{}, s...), backward_op);
  }
};

// The blocks of a loss's forward op and of its backward op: by default a forward whose slope is odd in d and a
// backward op linear in grad_output with the loss's slope_of (a loss with neither slope_of nor blocks of its
// own does not compile); KL's are its own.
template <typename Loss>
struct ForwardBlockOf : OddSlopeLoss<Loss> {};
template <typename Loss>
struct BackwardBlockOf : LinearSlopeBackward<Loss> {};

// ---- KL: its forward (self, target, reduction, *, log_target), and its backward op ----
template <>
struct ForwardBlockOf<KlDiv> : ForwardBlock<KlDiv> {
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

template <>
struct BackwardBlockOf<KlDiv> : BackwardBlock<KlDiv> {
  static variable_list backward(
      const at::Tensor& gg_in, const Needs<3>& needs, const at::Tensor& grad_output_in, const at::Tensor& self_in,
      const at::Tensor& t_in, int64_t reduction, bool log_target) {
    variable_list out(3);
    // float16/bfloat16 in float32: each derivative is a product of several factors, summed over the broadcast
    // dims (5000 terms for a (5000,) grad_output of a 5000 x 5000 call), and rounded once, to its input's dtype.
    const auto opmath = [](const at::Tensor& v) {
      return at::isReducedFloatingType(v.scalar_type()) ? v.to(at::kFloat) : v;
    };
    const auto grad_output = opmath(grad_output_in), self = opmath(self_in), t = opmath(t_in);
    const auto shape = broadcast_shape(self, t);
    const auto gg = apply_mean(opmath(gg_in), reduction, numel_of(shape));
    // Each derivative is elementwise over broadcast(self, target), then summed to its input's shape and dtype.
    const auto finish = [&](const at::Tensor& v, const at::Tensor& like) {
      return reduce_to(expand_to(v, shape), like);
    };
    if (log_target) {
      const auto e = t.exp();
      if (needs[0]) out[0] = finish(gg * e * (t + 1 - self), grad_output_in);
      if (needs[1]) out[1] = finish(-(gg * grad_output * e), self_in);
      if (needs[2]) out[2] = finish(gg * grad_output * e * (t + 2 - self), t_in);
      return out;
    }
    // A zero probability gets no gradient, and neither do its derivatives.
    const auto zero = t == 0;
    const auto safe_t = t.masked_fill(zero, 1);
    if (needs[0]) out[0] = finish((gg * (safe_t.log() + 1 - self)).masked_fill(zero, 0), grad_output_in);
    if (needs[1]) out[1] = finish((-(gg * grad_output)).masked_fill(zero, 0), self_in);
    if (needs[2]) out[2] = finish((gg * grad_output / safe_t).masked_fill(zero, 0), t_in);
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

// ---- registration: every loss's two blocks, at the Autograd and FuncTorchBatched keys ----

}  // namespace

std::vector<std::string> differentiable_ops() {
  std::vector<std::string> names;
  for_each_elementwise_loss([&]<typename Loss>() {
    names.emplace_back(ForwardBlockOf<Loss>::kName);
    names.emplace_back(BackwardBlockOf<Loss>::kName);
  });
  // A row loss's three ops have their Autograd kernels in rows.cpp.
  for_each_row_loss([&]<typename Loss>() {
    for (const char* op : {Loss::decl.forward, Loss::decl.with_grads, Loss::decl.backward}) names.emplace_back(op);
    // Its linear form's two, in linear.cpp.
    if (Loss::decl.linear.forward != nullptr) {
      names.emplace_back(Loss::decl.linear.forward);
      names.emplace_back(Loss::decl.linear.with_grads);
    }
  });
  return names;
}

TORCH_LIBRARY_IMPL(npu_loss, Autograd, m) {
  for_each_elementwise_loss([&]<typename Loss>() {
    m.impl(ForwardBlockOf<Loss>::kName, TORCH_FN(AutogradKernel<ForwardBlockOf<Loss>>::call));
    m.impl(BackwardBlockOf<Loss>::kName, TORCH_FN(AutogradKernel<BackwardBlockOf<Loss>>::call));
  });
}

TORCH_LIBRARY_IMPL(npu_loss, FuncTorchBatched, m) {
  for_each_elementwise_loss([&]<typename Loss>() {
    m.impl(ForwardBlockOf<Loss>::kName, &VmapKernel<ForwardBlockOf<Loss>>::call);
    m.impl(BackwardBlockOf<Loss>::kName, &VmapKernel<BackwardBlockOf<Loss>>::call);
  });
}

}  // namespace npu_loss::autograd
