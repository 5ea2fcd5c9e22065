// Autograd for the npu_loss ops, registered once at the Autograd key (CPU, NPU and every other device).
//
// In C++ rather than Python (torch.library.register_autograd) because the per-call cost of a Python
// autograd.Function kept a forward+backward step on small tensors (smooth L1 on a detector's few thousand
// boxes) about 3x behind torch.nn.functional.
//
// Forwards: gradients w.r.t. self and target. The backward ops get broadcast-expanded self and target
// (views, no copies) and each gradient is summed back to its input's shape: smooth L1's "mean" divides by
// self.numel(), and the target gradient is the same op with self and target swapped (the slope is odd in
// d), both of which need the broadcast shape.
// Backward ops: their own formulas (ATen's derivatives.yaml), so double backward works.
// Only inputs are saved, never intermediates. Shapes are handled as SymInts so torch.compile with dynamic
// shapes traces through.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "checks.h"

namespace npu_loss {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor call_smooth_l1_loss(const at::Tensor& x, const at::Tensor& t, int64_t reduction, double beta) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("npu_loss::smooth_l1_loss", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, double)>();
  return op.call(x, t, reduction, beta);
}

at::Tensor call_l1_loss(const at::Tensor& x, const at::Tensor& t, int64_t reduction) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("npu_loss::l1_loss", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>();
  return op.call(x, t, reduction);
}

at::Tensor call_kl_div(const at::Tensor& x, const at::Tensor& t, int64_t reduction, bool log_target) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("npu_loss::kl_div", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, bool)>();
  return op.call(x, t, reduction, log_target);
}

at::Tensor call_smooth_l1_loss_backward(
    const at::Tensor& g, const at::Tensor& x, const at::Tensor& t, int64_t reduction, double beta) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("npu_loss::smooth_l1_loss_backward", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, double)>();
  return op.call(g, x, t, reduction, beta);
}

at::Tensor call_l1_loss_backward(const at::Tensor& g, const at::Tensor& x, const at::Tensor& t, int64_t reduction) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("npu_loss::l1_loss_backward", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t)>();
  return op.call(g, x, t, reduction);
}

at::Tensor call_kl_div_target_backward(
    const at::Tensor& g, const at::Tensor& x, const at::Tensor& t, int64_t reduction, bool log_target) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("npu_loss::kl_div_target_backward", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, bool)>();
  return op.call(g, x, t, reduction, log_target);
}

bool is_mean(int64_t reduction) {
  return reduction == static_cast<int64_t>(Reduction::Mean);
}

// A gradient summed to `like`'s shape and cast to its dtype; undefined stays undefined.
at::Tensor reduce_to(const at::Tensor& grad, const at::Tensor& like) {
  if (!grad.defined()) return grad;
  return at::sum_to(grad, like.sym_sizes()).to(like.scalar_type());
}

c10::SymDimVector broadcast_shape(const at::Tensor& a, const at::Tensor& b) {
  return at::infer_size_symdimvector(a.sym_sizes(), b.sym_sizes());
}

c10::SymInt shape_numel(c10::SymIntArrayRef shape) {
  c10::SymInt n = 1;
  for (const auto& s : shape) n = n * s;
  return n;
}

// v / count for "mean", v otherwise (an empty count gives inf / NaN, as PyTorch's division does).
at::Tensor apply_mean(const at::Tensor& v, int64_t reduction, const c10::SymInt& count) {
  return is_mean(reduction) ? v.div(c10::Scalar(count)) : v;
}

// ---- forwards ----

class SmoothL1LossFunction : public torch::autograd::Function<SmoothL1LossFunction> {
 public:
  static at::Tensor forward(
      AutogradContext* ctx, const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["beta"] = beta;
    ctx->save_for_backward({self, target});
    return call_smooth_l1_loss(self, target, reduction, beta);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& self = saved[0];
    const auto& target = saved[1];
    const int64_t reduction = ctx->saved_data["reduction"].toInt();
    const double beta = ctx->saved_data["beta"].toDouble();
    const auto shape = broadcast_shape(self, target);
    const auto x = self.expand_symint(shape);
    const auto t = target.expand_symint(shape);
    at::Tensor grad_self, grad_target;
    if (ctx->needs_input_grad(0)) grad_self = call_smooth_l1_loss_backward(grads[0], x, t, reduction, beta);
    if (ctx->needs_input_grad(1)) grad_target = call_smooth_l1_loss_backward(grads[0], t, x, reduction, beta);
    return {reduce_to(grad_self, self), reduce_to(grad_target, target), at::Tensor(), at::Tensor()};
  }
};

class L1LossFunction : public torch::autograd::Function<L1LossFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->saved_data["reduction"] = reduction;
    ctx->save_for_backward({self, target});
    return call_l1_loss(self, target, reduction);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& self = saved[0];
    const auto& target = saved[1];
    const int64_t reduction = ctx->saved_data["reduction"].toInt();
    const auto shape = broadcast_shape(self, target);
    const auto x = self.expand_symint(shape);
    const auto t = target.expand_symint(shape);
    at::Tensor grad_self, grad_target;
    if (ctx->needs_input_grad(0)) grad_self = call_l1_loss_backward(grads[0], x, t, reduction);
    if (ctx->needs_input_grad(1)) grad_target = call_l1_loss_backward(grads[0], t, x, reduction);
    return {reduce_to(grad_self, self), reduce_to(grad_target, target), at::Tensor()};
  }
};

class KlDivFunction : public torch::autograd::Function<KlDivFunction> {
 public:
  static at::Tensor forward(
      AutogradContext* ctx, const at::Tensor& self, const at::Tensor& target, int64_t reduction, bool log_target) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["log_target"] = log_target;
    ctx->save_for_backward({self, target});
    return call_kl_div(self, target, reduction, log_target);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& self = saved[0];
    const auto& target = saved[1];
    const int64_t reduction = ctx->saved_data["reduction"].toInt();
    const bool log_target = ctx->saved_data["log_target"].toBool();
    const auto& grad = grads[0];
    at::Tensor grad_self, grad_target;
    if (ctx->needs_input_grad(0)) {
      // d/dself of target * (log target - self) is -target (-exp(target) for a log-space target), computed
      // in the gradient's dtype.
      const auto shape = broadcast_shape(self, target);
      const auto p = (log_target ? target.exp() : target).to(grad.scalar_type());
      grad_self = apply_mean(-(grad * p), reduction, shape_numel(shape)).expand_symint(shape);
    }
    if (ctx->needs_input_grad(1)) grad_target = call_kl_div_target_backward(grad, self, target, reduction, log_target);
    return {reduce_to(grad_self, self), reduce_to(grad_target, target), at::Tensor(), at::Tensor()};
  }
};

// ---- the backward ops (double backward) ----

class SmoothL1LossBackwardFunction : public torch::autograd::Function<SmoothL1LossBackwardFunction> {
 public:
  static at::Tensor forward(
      AutogradContext* ctx, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
      int64_t reduction, double beta) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["beta"] = beta;
    ctx->save_for_backward({grad_output, self, target});
    return call_smooth_l1_loss_backward(grad_output, self, target, reduction, beta);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& grad_output = saved[0];
    const auto& self = saved[1];
    const auto& target = saved[2];
    const int64_t reduction = ctx->saved_data["reduction"].toInt();
    const double beta = ctx->saved_data["beta"].toDouble();
    const auto& gg = grads[0];
    at::Tensor d_grad_output, d_self, d_target;
    if (ctx->needs_input_grad(0)) d_grad_output = call_smooth_l1_loss_backward(gg, self, target, reduction, beta);
    if ((ctx->needs_input_grad(1) || ctx->needs_input_grad(2)) && beta > 0) {
      // The slope d / beta has derivative 1 / beta inside |d| < beta and 0 elsewhere (also at beta == 0).
      const auto d = self - target;
      const auto inner = apply_mean((d.abs() < beta) * (grad_output * gg) / beta, reduction, self.sym_numel());
      d_self = inner;
      d_target = -inner;
    }
    return {
        reduce_to(d_grad_output, grad_output), reduce_to(d_self, self), reduce_to(d_target, target), at::Tensor(),
        at::Tensor()};
  }
};

class L1LossBackwardFunction : public torch::autograd::Function<L1LossBackwardFunction> {
 public:
  static at::Tensor forward(
      AutogradContext* ctx, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
      int64_t reduction) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->saved_data["reduction"] = reduction;
    ctx->save_for_backward({grad_output, self, target});
    return call_l1_loss_backward(grad_output, self, target, reduction);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t reduction = ctx->saved_data["reduction"].toInt();
    at::Tensor d_grad_output;
    if (ctx->needs_input_grad(0)) d_grad_output = call_l1_loss_backward(grads[0], saved[1], saved[2], reduction);
    // sign(d) is piecewise constant: no gradient w.r.t. self or target.
    return {reduce_to(d_grad_output, saved[0]), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class KlDivTargetBackwardFunction : public torch::autograd::Function<KlDivTargetBackwardFunction> {
 public:
  static at::Tensor forward(
      AutogradContext* ctx, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
      int64_t reduction, bool log_target) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["log_target"] = log_target;
    ctx->save_for_backward({grad_output, self, target});
    return call_kl_div_target_backward(grad_output, self, target, reduction, log_target);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& grad_output = saved[0];
    const auto& self = saved[1];
    const auto& t = saved[2];
    const int64_t reduction = ctx->saved_data["reduction"].toInt();
    const bool log_target = ctx->saved_data["log_target"].toBool();
    const auto shape = broadcast_shape(self, t);
    const auto count = shape_numel(shape);
    const auto gg = apply_mean(grads[0], reduction, count);
    at::Tensor d_g, d_x, d_t;
    if (log_target) {
      const auto e = t.exp();
      d_g = gg * e * (t + 1 - self);
      d_x = -gg * grad_output * e;
      d_t = gg * grad_output * e * (t + 2 - self);
    } else {
      // A zero probability gets no gradient, and neither do its derivatives.
      const auto zero = t == 0;
      const auto safe_t = at::where(zero, at::ones_like(t), t);
      const auto none = at::zeros({}, gg.options());
      d_g = at::where(zero, none, gg * (safe_t.log() + 1 - self));
      d_x = at::where(zero, none, -gg * grad_output);
      d_t = at::where(zero, none, gg * grad_output / safe_t);
    }
    const auto expand = [&](const at::Tensor& v) { return v.expand_symint(shape); };
    return {
        ctx->needs_input_grad(0) ? reduce_to(expand(d_g), grad_output) : at::Tensor(),
        ctx->needs_input_grad(1) ? reduce_to(expand(d_x), self) : at::Tensor(),
        ctx->needs_input_grad(2) ? reduce_to(expand(d_t), t) : at::Tensor(),
        at::Tensor(),
        at::Tensor()};
  }
};

// An undefined (None) tensor skips autograd, so the kernel's checks report it by name.
bool all_defined(std::initializer_list<const at::Tensor*> tensors) {
  for (const auto* t : tensors) {
    if (!t->defined()) return false;
  }
  return true;
}

at::Tensor smooth_l1_loss_autograd(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
  if (!all_defined({&self, &target})) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_smooth_l1_loss(self, target, reduction, beta);
  }
  return SmoothL1LossFunction::apply(self, target, reduction, beta);
}

at::Tensor l1_loss_autograd(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  if (!all_defined({&self, &target})) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_l1_loss(self, target, reduction);
  }
  return L1LossFunction::apply(self, target, reduction);
}

at::Tensor kl_div_autograd(const at::Tensor& self, const at::Tensor& target, int64_t reduction, bool log_target) {
  if (!all_defined({&self, &target})) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_kl_div(self, target, reduction, log_target);
  }
  return KlDivFunction::apply(self, target, reduction, log_target);
}

at::Tensor smooth_l1_loss_backward_autograd(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta) {
  if (!all_defined({&grad_output, &self, &target})) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_smooth_l1_loss_backward(grad_output, self, target, reduction, beta);
  }
  return SmoothL1LossBackwardFunction::apply(grad_output, self, target, reduction, beta);
}

at::Tensor l1_loss_backward_autograd(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  if (!all_defined({&grad_output, &self, &target})) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_l1_loss_backward(grad_output, self, target, reduction);
  }
  return L1LossBackwardFunction::apply(grad_output, self, target, reduction);
}

at::Tensor kl_div_target_backward_autograd(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    bool log_target) {
  if (!all_defined({&grad_output, &self, &target})) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_kl_div_target_backward(grad_output, self, target, reduction, log_target);
  }
  return KlDivTargetBackwardFunction::apply(grad_output, self, target, reduction, log_target);
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, Autograd, m) {
  m.impl("smooth_l1_loss", &smooth_l1_loss_autograd);
  m.impl("l1_loss", &l1_loss_autograd);
  m.impl("kl_div", &kl_div_autograd);
  m.impl("smooth_l1_loss_backward", &smooth_l1_loss_backward_autograd);
  m.impl("l1_loss_backward", &l1_loss_backward_autograd);
  m.impl("kl_div_target_backward", &kl_div_target_backward_autograd);
}

}  // namespace npu_loss
