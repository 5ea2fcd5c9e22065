// The nodes' backward formulas, and their compiled-autograd form.
//
// Each node has one functional form, `<Node>_apply(grads, needs_input_grad, saved inputs..., scalars...)`:
// eager `apply` unpacks the SavedVariables and calls it; compiled autograd binds it (through an IValue
// adapter) under the node's name and proxies a call to it into the graph it compiles, which is how
// PyTorch's generated nodes work in 2.13.
//
// Forwards: the backward ops get broadcast-expanded self and target (views, no copies) and each gradient is
// summed back to its input's shape: smooth L1's "mean" divides by self.numel(), and the target gradient is
// the same op with self and target swapped (the slope is odd in d), both of which need the broadcast shape.
// Backward ops: their own formulas (ATen's derivatives.yaml), so double backward and hessians work.
#include "functions.h"

#include <ATen/ATen.h>
#include <torch/csrc/dynamo/compiled_autograd.h>

#include "../ops.h"

namespace npu_loss::autograd {
namespace {

using torch::dynamo::autograd::IValuePacker;
using torch::dynamo::autograd::PackedArgs;

template <size_t N>
using Needs = std::array<bool, N>;

template <size_t N>
Needs<N> task_needs(const torch::autograd::Node& node) {
  Needs<N> needs{};
  for (size_t i = 0; i < N; ++i) needs[i] = node.task_should_compute_output(i);
  return needs;
}

// Compiled autograd: binds `fn` under `name` once per process (the Python side keeps one global registry
// of node functions), then proxies a call to it with the packed saved values into the graph.
variable_list proxy_into_compiled_graph(
    const torch::autograd::Node& node, SwapSavedVariables& saved, bool& bound,
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

template <typename T>
at::TypePtr packed_type() {
  return IValuePacker<T>::packed_type();
}

template <size_t N>
std::vector<bool> as_vector(const Needs<N>& needs) {
  return std::vector<bool>(needs.begin(), needs.end());
}

template <size_t N>
Needs<N> unpack_needs(PackedArgs& packed) {
  const auto v = packed.unpack<std::vector<bool>>();
  Needs<N> needs{};
  for (size_t i = 0; i < N; ++i) needs[i] = v[i];
  return needs;
}

// ---- forwards: gradients w.r.t. self and target ----

variable_list smooth_l1_loss_backward0_apply(
    const variable_list& grads, Needs<2> needs, const at::Tensor& self, const at::Tensor& target,
    int64_t reduction, double beta) {
  variable_list out(2);
  const auto& grad = grads[0];
  if (!grad.defined() || !(needs[0] || needs[1])) return out;
  const auto shape = broadcast_shape(self, target);
  const auto x = expand_to(self, shape);
  const auto t = expand_to(target, shape);
  const auto& op = ops::smooth_l1_loss_backward();
  if (needs[0]) out[0] = reduce_to(op.call(grad, x, t, reduction, beta), self);
  if (needs[1]) out[1] = reduce_to(op.call(grad, t, x, reduction, beta), target);
  return out;
}

variable_list l1_loss_backward0_apply(
    const variable_list& grads, Needs<2> needs, const at::Tensor& self, const at::Tensor& target,
    int64_t reduction) {
  variable_list out(2);
  const auto& grad = grads[0];
  if (!grad.defined() || !(needs[0] || needs[1])) return out;
  const auto shape = broadcast_shape(self, target);
  const auto x = expand_to(self, shape);
  const auto t = expand_to(target, shape);
  const auto& op = ops::l1_loss_backward();
  if (needs[0]) out[0] = reduce_to(op.call(grad, x, t, reduction), self);
  if (needs[1]) out[1] = reduce_to(op.call(grad, t, x, reduction), target);
  return out;
}

variable_list kl_div_backward0_apply(
    const variable_list& grads, Needs<2> needs, const at::Tensor& self, const at::Tensor& target,
    int64_t reduction, bool log_target) {
  variable_list out(2);
  const auto& grad = grads[0];
  if (!grad.defined()) return out;
  if (needs[0]) {
    // d/dself of target * (log target - self) is -target (-exp(target) for a log-space target), computed in
    // the gradient's dtype.
    const auto shape = broadcast_shape(self, target);
    auto p = log_target ? target.exp() : target;
    if (p.scalar_type() != grad.scalar_type()) p = p.to(grad.scalar_type());
    const auto coef = (is_mean(reduction) ? grad.div(c10::Scalar(numel_of(shape))) : grad).neg();
    out[0] = reduce_to(expand_to(coef * p, shape), self);
  }
  if (needs[1]) {
    out[1] = reduce_to(ops::kl_div_target_backward().call(grad, self, target, reduction, log_target), target);
  }
  return out;
}

// ---- backward ops: gradients w.r.t. grad_output, self and target ----

variable_list smooth_l1_loss_backward_backward0_apply(
    const variable_list& grads, Needs<3> needs, const at::Tensor& grad_output, const at::Tensor& self,
    const at::Tensor& target, int64_t reduction, double beta) {
  variable_list out(3);
  const auto& gg = grads[0];
  if (!gg.defined()) return out;
  if (needs[0]) {
    out[0] = reduce_to(ops::smooth_l1_loss_backward().call(gg, self, target, reduction, beta), grad_output);
  }
  if (!(needs[1] || needs[2])) return out;
  if (beta > 0) {
    // The slope d / beta has derivative 1 / beta inside |d| < beta and 0 elsewhere.
    const auto d = self - target;
    const auto inner = apply_mean((d.abs() < beta) * (grad_output * gg) / beta, reduction, self.sym_numel());
    if (needs[1]) out[1] = reduce_to(inner, self);
    if (needs[2]) out[2] = reduce_to(inner.neg(), target);
  } else {
    // beta == 0 is the L1 slope sign(d): piecewise constant, a zero derivative.
    if (needs[1]) out[1] = at::zeros_like(self);
    if (needs[2]) out[2] = at::zeros_like(target);
  }
  return out;
}

variable_list l1_loss_backward_backward0_apply(
    const variable_list& grads, Needs<3> needs, const at::Tensor& grad_output, const at::Tensor& self,
    const at::Tensor& target, int64_t reduction) {
  variable_list out(3);
  const auto& gg = grads[0];
  if (!gg.defined()) return out;
  if (needs[0]) out[0] = reduce_to(ops::l1_loss_backward().call(gg, self, target, reduction), grad_output);
  // sign(d) is piecewise constant: a zero derivative w.r.t. self and target.
  if (needs[1]) out[1] = at::zeros_like(self);
  if (needs[2]) out[2] = at::zeros_like(target);
  return out;
}

variable_list kl_div_target_backward_backward0_apply(
    const variable_list& grads, Needs<3> needs, const at::Tensor& grad_output, const at::Tensor& self,
    const at::Tensor& t, int64_t reduction, bool log_target) {
  variable_list out(3);
  if (!grads[0].defined()) return out;
  const auto shape = broadcast_shape(self, t);
  const auto gg = apply_mean(grads[0], reduction, numel_of(shape));
  // Each derivative is elementwise over broadcast(self, target), then summed to its input's shape.
  const auto finish = [&](const at::Tensor& v, const at::Tensor& like) {
    return reduce_to(expand_to(v, shape), like);
  };
  if (log_target) {
    const auto e = t.exp();
    if (needs[0]) out[0] = finish(gg * e * (t + 1 - self), grad_output);
    if (needs[1]) out[1] = finish(-(gg * grad_output * e), self);
    if (needs[2]) out[2] = finish(gg * grad_output * e * (t + 2 - self), t);
  } else {
    // A zero probability gets no gradient, and neither do its derivatives.
    const auto zero = t == 0;
    if (needs[0]) {
      const auto safe_t = t.masked_fill(zero, 1);
      out[0] = finish((gg * (safe_t.log() + 1 - self)).masked_fill(zero, 0), grad_output);
    }
    if (needs[1]) out[1] = finish((-(gg * grad_output)).masked_fill(zero, 0), self);
    if (needs[2]) {
      const auto safe_t = t.masked_fill(zero, 1);
      out[2] = finish((gg * grad_output / safe_t).masked_fill(zero, 0), t);
    }
  }
  return out;
}

// ---- compiled autograd: the IValue adapters of the functional forms ----

variable_list smooth_l1_loss_backward0_ivalue(const variable_list& grads, const std::vector<c10::IValue>& args) {
  PackedArgs packed(args);
  const auto needs = unpack_needs<2>(packed);
  const auto self = packed.unpack<at::Tensor>();
  const auto target = packed.unpack<at::Tensor>();
  const auto reduction = packed.unpack<int64_t>();
  const auto beta = packed.unpack<double>();
  return smooth_l1_loss_backward0_apply(grads, needs, self, target, reduction, beta);
}

variable_list l1_loss_backward0_ivalue(const variable_list& grads, const std::vector<c10::IValue>& args) {
  PackedArgs packed(args);
  const auto needs = unpack_needs<2>(packed);
  const auto self = packed.unpack<at::Tensor>();
  const auto target = packed.unpack<at::Tensor>();
  const auto reduction = packed.unpack<int64_t>();
  return l1_loss_backward0_apply(grads, needs, self, target, reduction);
}

variable_list kl_div_backward0_ivalue(const variable_list& grads, const std::vector<c10::IValue>& args) {
  PackedArgs packed(args);
  const auto needs = unpack_needs<2>(packed);
  const auto self = packed.unpack<at::Tensor>();
  const auto target = packed.unpack<at::Tensor>();
  const auto reduction = packed.unpack<int64_t>();
  const auto log_target = packed.unpack<bool>();
  return kl_div_backward0_apply(grads, needs, self, target, reduction, log_target);
}

variable_list smooth_l1_loss_backward_backward0_ivalue(
    const variable_list& grads, const std::vector<c10::IValue>& args) {
  PackedArgs packed(args);
  const auto needs = unpack_needs<3>(packed);
  const auto grad_output = packed.unpack<at::Tensor>();
  const auto self = packed.unpack<at::Tensor>();
  const auto target = packed.unpack<at::Tensor>();
  const auto reduction = packed.unpack<int64_t>();
  const auto beta = packed.unpack<double>();
  return smooth_l1_loss_backward_backward0_apply(grads, needs, grad_output, self, target, reduction, beta);
}

variable_list l1_loss_backward_backward0_ivalue(const variable_list& grads, const std::vector<c10::IValue>& args) {
  PackedArgs packed(args);
  const auto needs = unpack_needs<3>(packed);
  const auto grad_output = packed.unpack<at::Tensor>();
  const auto self = packed.unpack<at::Tensor>();
  const auto target = packed.unpack<at::Tensor>();
  const auto reduction = packed.unpack<int64_t>();
  return l1_loss_backward_backward0_apply(grads, needs, grad_output, self, target, reduction);
}

variable_list kl_div_target_backward_backward0_ivalue(
    const variable_list& grads, const std::vector<c10::IValue>& args) {
  PackedArgs packed(args);
  const auto needs = unpack_needs<3>(packed);
  const auto grad_output = packed.unpack<at::Tensor>();
  const auto self = packed.unpack<at::Tensor>();
  const auto target = packed.unpack<at::Tensor>();
  const auto reduction = packed.unpack<int64_t>();
  const auto log_target = packed.unpack<bool>();
  return kl_div_target_backward_backward0_apply(grads, needs, grad_output, self, target, reduction, log_target);
}

}  // namespace

// ---- SmoothL1LossBackward0 ----

variable_list SmoothL1LossBackward0::apply(variable_list&& grads) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto self = self_.unpack();
  const auto target = target_.unpack();
  return smooth_l1_loss_backward0_apply(grads, task_needs<2>(*this), self, target, reduction, beta);
}

void SmoothL1LossBackward0::compiled_args(CompiledNodeArgs& args) const {
  args.collect(self_, false);
  args.collect(target_, false);
  args.collect(reduction);
  args.collect(beta);
}

variable_list SmoothL1LossBackward0::apply_with_saved(const variable_list& grads, SwapSavedVariables& saved) {
  saved.before(self_);
  saved.before(target_);
  PackedArgs packed;
  packed.pack(as_vector(task_needs<2>(*this)));
  packed.pack(self_.unpack());
  packed.pack(target_.unpack());
  packed.pack(reduction);
  packed.pack(beta);
  static bool bound = false;
  auto result = proxy_into_compiled_graph(
      *this, saved, bound, smooth_l1_loss_backward0_ivalue,
      {packed_type<std::vector<bool>>(), packed_type<at::Tensor>(), packed_type<at::Tensor>(), packed_type<int64_t>(),
       packed_type<double>()},
      packed, grads);
  saved.after(self_);
  saved.after(target_);
  return result;
}

// ---- L1LossBackward0 ----

variable_list L1LossBackward0::apply(variable_list&& grads) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto self = self_.unpack();
  const auto target = target_.unpack();
  return l1_loss_backward0_apply(grads, task_needs<2>(*this), self, target, reduction);
}

void L1LossBackward0::compiled_args(CompiledNodeArgs& args) const {
  args.collect(self_, false);
  args.collect(target_, false);
  args.collect(reduction);
}

variable_list L1LossBackward0::apply_with_saved(const variable_list& grads, SwapSavedVariables& saved) {
  saved.before(self_);
  saved.before(target_);
  PackedArgs packed;
  packed.pack(as_vector(task_needs<2>(*this)));
  packed.pack(self_.unpack());
  packed.pack(target_.unpack());
  packed.pack(reduction);
  static bool bound = false;
  auto result = proxy_into_compiled_graph(
      *this, saved, bound, l1_loss_backward0_ivalue,
      {packed_type<std::vector<bool>>(), packed_type<at::Tensor>(), packed_type<at::Tensor>(), packed_type<int64_t>()},
      packed, grads);
  saved.after(self_);
  saved.after(target_);
  return result;
}

// ---- KlDivBackward0 ----

variable_list KlDivBackward0::apply(variable_list&& grads) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto self = self_.unpack();
  const auto target = target_.unpack();
  return kl_div_backward0_apply(grads, task_needs<2>(*this), self, target, reduction, log_target);
}

void KlDivBackward0::compiled_args(CompiledNodeArgs& args) const {
  args.collect(self_, false);
  args.collect(target_, false);
  args.collect(reduction);
  args.collect(log_target);
}

variable_list KlDivBackward0::apply_with_saved(const variable_list& grads, SwapSavedVariables& saved) {
  saved.before(self_);
  saved.before(target_);
  PackedArgs packed;
  packed.pack(as_vector(task_needs<2>(*this)));
  packed.pack(self_.unpack());
  packed.pack(target_.unpack());
  packed.pack(reduction);
  packed.pack(log_target);
  static bool bound = false;
  auto result = proxy_into_compiled_graph(
      *this, saved, bound, kl_div_backward0_ivalue,
      {packed_type<std::vector<bool>>(), packed_type<at::Tensor>(), packed_type<at::Tensor>(), packed_type<int64_t>(),
       packed_type<bool>()},
      packed, grads);
  saved.after(self_);
  saved.after(target_);
  return result;
}

// ---- SmoothL1LossBackwardBackward0 ----

variable_list SmoothL1LossBackwardBackward0::apply(variable_list&& grads) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto grad_output = grad_output_.unpack();
  const auto self = self_.unpack();
  const auto target = target_.unpack();
  return smooth_l1_loss_backward_backward0_apply(
      grads, task_needs<3>(*this), grad_output, self, target, reduction, beta);
}

void SmoothL1LossBackwardBackward0::compiled_args(CompiledNodeArgs& args) const {
  args.collect(grad_output_, false);
  args.collect(self_, false);
  args.collect(target_, false);
  args.collect(reduction);
  args.collect(beta);
}

variable_list SmoothL1LossBackwardBackward0::apply_with_saved(
    const variable_list& grads, SwapSavedVariables& saved) {
  saved.before(grad_output_);
  saved.before(self_);
  saved.before(target_);
  PackedArgs packed;
  packed.pack(as_vector(task_needs<3>(*this)));
  packed.pack(grad_output_.unpack());
  packed.pack(self_.unpack());
  packed.pack(target_.unpack());
  packed.pack(reduction);
  packed.pack(beta);
  static bool bound = false;
  auto result = proxy_into_compiled_graph(
      *this, saved, bound, smooth_l1_loss_backward_backward0_ivalue,
      {packed_type<std::vector<bool>>(), packed_type<at::Tensor>(), packed_type<at::Tensor>(), packed_type<at::Tensor>(),
       packed_type<int64_t>(), packed_type<double>()},
      packed, grads);
  saved.after(grad_output_);
  saved.after(self_);
  saved.after(target_);
  return result;
}

// ---- L1LossBackwardBackward0 ----

variable_list L1LossBackwardBackward0::apply(variable_list&& grads) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto grad_output = grad_output_.unpack();
  const auto self = self_.unpack();
  const auto target = target_.unpack();
  return l1_loss_backward_backward0_apply(grads, task_needs<3>(*this), grad_output, self, target, reduction);
}

void L1LossBackwardBackward0::compiled_args(CompiledNodeArgs& args) const {
  args.collect(grad_output_, false);
  args.collect(self_, false);
  args.collect(target_, false);
  args.collect(reduction);
}

variable_list L1LossBackwardBackward0::apply_with_saved(const variable_list& grads, SwapSavedVariables& saved) {
  saved.before(grad_output_);
  saved.before(self_);
  saved.before(target_);
  PackedArgs packed;
  packed.pack(as_vector(task_needs<3>(*this)));
  packed.pack(grad_output_.unpack());
  packed.pack(self_.unpack());
  packed.pack(target_.unpack());
  packed.pack(reduction);
  static bool bound = false;
  auto result = proxy_into_compiled_graph(
      *this, saved, bound, l1_loss_backward_backward0_ivalue,
      {packed_type<std::vector<bool>>(), packed_type<at::Tensor>(), packed_type<at::Tensor>(), packed_type<at::Tensor>(),
       packed_type<int64_t>()},
      packed, grads);
  saved.after(grad_output_);
  saved.after(self_);
  saved.after(target_);
  return result;
}

// ---- KlDivTargetBackwardBackward0 ----

variable_list KlDivTargetBackwardBackward0::apply(variable_list&& grads) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto grad_output = grad_output_.unpack();
  const auto self = self_.unpack();
  const auto target = target_.unpack();
  return kl_div_target_backward_backward0_apply(
      grads, task_needs<3>(*this), grad_output, self, target, reduction, log_target);
}

void KlDivTargetBackwardBackward0::compiled_args(CompiledNodeArgs& args) const {
  args.collect(grad_output_, false);
  args.collect(self_, false);
  args.collect(target_, false);
  args.collect(reduction);
  args.collect(log_target);
}

variable_list KlDivTargetBackwardBackward0::apply_with_saved(
    const variable_list& grads, SwapSavedVariables& saved) {
  saved.before(grad_output_);
  saved.before(self_);
  saved.before(target_);
  PackedArgs packed;
  packed.pack(as_vector(task_needs<3>(*this)));
  packed.pack(grad_output_.unpack());
  packed.pack(self_.unpack());
  packed.pack(target_.unpack());
  packed.pack(reduction);
  packed.pack(log_target);
  static bool bound = false;
  auto result = proxy_into_compiled_graph(
      *this, saved, bound, kl_div_target_backward_backward0_ivalue,
      {packed_type<std::vector<bool>>(), packed_type<at::Tensor>(), packed_type<at::Tensor>(), packed_type<at::Tensor>(),
       packed_type<int64_t>(), packed_type<bool>()},
      packed, grads);
  saved.after(grad_output_);
  saved.after(self_);
  saved.after(target_);
  return result;
}

}  // namespace npu_loss::autograd
