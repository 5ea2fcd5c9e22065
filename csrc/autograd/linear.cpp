// Autograd for a row loss's linear form (losses.h's LinearForm: the fused linear JSD).
//
// Its forward op makes, chunk by chunk, the loss and the gradients of the loss w.r.t. every input that will
// need one (composite/linear.h): the node keeps them, and its backward scales them by grad_output, in place,
// handing each to autograd without a copy (with retain_graph=True it scales copies, so that a second backward
// finds them intact). Only the loss is differentiable; the two parts and the entropy it also returns are not. The node has no
// formula of its own: double backward (create_graph=True) is refused, naming the op. Forward-mode AD: the
// loss's tangent is the gradients' dot product with the inputs' tangents. Compiled autograd lifts the stored
// gradients into its graph, as the row node does (node.h's SavedForm). docs/semantics.md, "The fused linear
// JSD", has the memory; docs/usage.md the limits.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <array>
#include <optional>

#include "../compat/torch_compat.h"
#include "../core/ops.h"
#include "node.h"

namespace npu_loss::autograd {
namespace {

using torch::autograd::SavedVariable;
constexpr size_t kInputs = 6;  // per side: the input, the weight, the bias

template <typename Loss>
struct LinearLossNode final : public torch::autograd::TraceableFunction {
  std::array<SavedVariable, kInputs> grads;
  SavedVariable scale;  // per side, what its stored gradients are multiplied by (float16's: composite/linear.h)

  std::string name() const override {
    static const std::string name = node_name(Loss::decl.linear.forward);
    return name;
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (SavedVariable* s : saved()) s->reset_data();
  }

  variable_list apply(variable_list&& incoming) override {
    std::lock_guard<std::mutex> lock(mutex_);
    // The gradients are scaled in place and handed over (autograd can then keep one as the leaf's .grad
    // without a copy), unless the graph is kept for another backward.
    const bool consume = !torch::autograd::get_current_graph_task_keep_graph();
    std::array<at::Tensor, kSaved> tensors;
    for (size_t i = 0; i < kSaved; ++i) tensors[i] = saved()[i]->unpack();
    if (consume) {
      for (size_t i = 0; i < kInputs; ++i) {
        if (task_should_compute_output(i)) grads[i].reset_data();
      }
    }
    return functional(incoming, needs(), tensors, consume);
  }

  // Compiled autograd: the stored gradients and their scales are lifted into the graph, which calls
  // `functional` through from_ivalues; there they are the graph's inputs, scaled into new tensors.
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {
    Form::collect(args, saved(), {});
  }

  variable_list apply_with_saved(
      const variable_list& incoming, torch::dynamo::autograd::SwapSavedVariables& swap) override {
    static bool bound = false;
    return Form::proxy(*this, swap, bound, &from_ivalues, needs(), saved(), {}, incoming);
  }

 private:
  static constexpr size_t kSaved = kInputs + 1;  // the gradients, then the scales
  using Form = SavedForm<kSaved, std::tuple<>>;

  std::array<SavedVariable*, kSaved> saved() {
    return {&grads[0], &grads[1], &grads[2], &grads[3], &grads[4], &grads[5], &scale};
  }
  std::array<const SavedVariable*, kSaved> saved() const {
    return {&grads[0], &grads[1], &grads[2], &grads[3], &grads[4], &grads[5], &scale};
  }
  std::vector<bool> needs() const {
    std::vector<bool> v(kInputs);
    for (size_t i = 0; i < kInputs; ++i) v[i] = task_should_compute_output(i);
    return v;
  }

  // The backward eager `apply` and compiled autograd share: each stored gradient asked for, times grad_output
  // and its side's scale. `consume`: they may be scaled in place.
  static variable_list functional(
      const variable_list& incoming, const std::vector<bool>& needs, std::array<at::Tensor, kSaved>& t,
      bool consume) {
    TORCH_CHECK(
        !c10::GradMode::is_enabled(), Loss::decl.linear.forward, ": double backward (create_graph=True) is not "
        "supported: its gradients are made in the forward, not as functions autograd can differentiate again");
    variable_list out(kInputs);
    const at::Tensor& g = incoming[0];
    if (!g.defined()) return out;
    // One per side: a 0-dim grad_output times the float32 scales is a float32 product, and a float64 one's
    // (whose gradients are float64) is made in float64 instead.
    const at::Tensor factors = g * (g.scalar_type() == at::kDouble ? t[kInputs].to(at::kDouble) : t[kInputs]);
    // Factors of 1 leave the gradients as they are (node.h): a pass over the weight's spared, 7.8 ms of a
    // 0.6 s call in bfloat16 at V 32,768, H 1,024.
    const bool unit = unit_factors(factors, consume);
    for (size_t i = 0; i < kInputs; ++i) {
      if (!needs[i] || !t[i].defined()) continue;
      const at::Tensor factor = factors.select(0, static_cast<int64_t>(i / 3));
      out[i] = unit ? t[i] : consume ? t[i].mul_(factor) : t[i] * factor;
    }
    return out;
  }

  static variable_list from_ivalues(const variable_list& incoming, const std::vector<c10::IValue>& args) {
    auto u = Form::unpack(args);
    return functional(incoming, u.needs, u.tensors, false);
  }
};

template <typename Loss, typename Scalars = RowScalarTypes<Loss>>
struct LinearAutograd;

template <typename Loss, typename... S>
struct LinearAutograd<Loss, std::tuple<S...>> {
  using Results4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

  static Results4 forward(
      c10::DispatchKeySet ks, const at::Tensor& student_input, const at::Tensor& student_weight,
      const at::Tensor& teacher_input, const at::Tensor& teacher_weight, const std::optional<at::Tensor>& labels,
      const std::optional<at::Tensor>& student_bias, const std::optional<at::Tensor>& teacher_bias,
      c10::string_view reduction, S... s, int64_t ignore_index, double weight_hard, double weight_soft,
      std::optional<int64_t> chunk_size, bool return_parts, bool return_entropy) {
    const c10::DispatchKeySet below = ks & c10::after_autograd_keyset;
    const at::Tensor none;
    const std::array<const at::Tensor*, kInputs> inputs{
        &student_input, &student_weight, student_bias.has_value() ? &*student_bias : &none,
        &teacher_input, &teacher_weight, teacher_bias.has_value() ? &*teacher_bias : &none};
    // An undefined required tensor skips autograd, so that the kernel's checks report it by name.
    const bool defined = student_input.defined() && student_weight.defined() && teacher_input.defined() &&
        teacher_weight.defined();
    const bool grad_mode = c10::GradMode::is_enabled();
    std::array<bool, kInputs> need{}, mask{};
    std::array<at::Tensor, kInputs> tangents;
    bool any = false, forward_ad = false;
    for (size_t i = 0; i < kInputs; ++i) {
      if (!defined || !inputs[i]->defined()) continue;
      need[i] = grad_mode && inputs[i]->requires_grad();
      tangents[i] = inputs[i]->_fw_grad(kLevel);
      forward_ad = forward_ad || tangents[i].defined();
      mask[i] = need[i] || tangents[i].defined();
      any = any || need[i];
    }
    LinearResults r;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      r = ops::linear_with_grads<Loss>().redispatch(
          below, student_input, student_weight, teacher_input, teacher_weight, labels, student_bias, teacher_bias,
          reduction, s..., ignore_index, weight_hard, weight_soft, chunk_size, return_parts, return_entropy, mask);
    }
    std::array<at::Tensor, kInputs> grads{std::get<3>(r), std::get<4>(r), std::get<5>(r),
                                          std::get<6>(r), std::get<7>(r), std::get<8>(r)};
    const at::Tensor& scale = std::get<9>(r);
    at::Tensor loss = std::get<0>(r);
    if (forward_ad) {
      // Before the node may scale the gradients in place: the dot product of each with its input's tangent.
      const at::ScalarType acc = at::promote_types(loss.scalar_type(), at::kFloat);
      at::Tensor value = at::zeros({}, loss.options().dtype(acc));
      for (size_t i = 0; i < kInputs; ++i) {
        if (!tangents[i].defined()) continue;
        const at::Tensor side_scale = scale.select(0, static_cast<int64_t>(i / 3)).to(acc);
        value = value + (grads[i].to(acc) * tangents[i].to(acc)).sum() * side_scale;
      }
      loss._set_fw_grad(value.to(loss.scalar_type()), kLevel, false);
    }
    if (any) {
      auto node = compat::make_node<LinearLossNode<Loss>>();
      node->set_next_edges(torch::autograd::collect_next_edges(
          *inputs[0], *inputs[1], *inputs[2], *inputs[3], *inputs[4], *inputs[5]));
      for (size_t i = 0; i < kInputs; ++i) {
        if (need[i]) node->grads[i] = SavedVariable(grads[i], false);
      }
      node->scale = SavedVariable(scale, false);
      torch::autograd::set_history(loss, node);
    }
    return {loss, std::get<1>(r), std::get<2>(r), std::get<10>(r)};
  }

  // The forward with gradients called directly: its results are values, not differentiable (the gradients
  // it returns are made by the kernels, not recorded).
  static LinearResults with_grads(
      c10::DispatchKeySet ks, const at::Tensor& student_input, const at::Tensor& student_weight,
      const at::Tensor& teacher_input, const at::Tensor& teacher_weight, const std::optional<at::Tensor>& labels,
      const std::optional<at::Tensor>& student_bias, const std::optional<at::Tensor>& teacher_bias,
      c10::string_view reduction, S... s, int64_t ignore_index, double weight_hard, double weight_soft,
      std::optional<int64_t> chunk_size, bool return_parts, bool return_entropy, std::array<bool, 6> mask) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return ops::linear_with_grads<Loss>().redispatch(
        ks & c10::after_autograd_keyset, student_input, student_weight, teacher_input, teacher_weight, labels,
        student_bias, teacher_bias, reduction, s..., ignore_index, weight_hard, weight_soft, chunk_size, return_parts,
        return_entropy, mask);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, Autograd, m) {
  for_each_row_loss([&]<typename Loss>() {
    if constexpr (Loss::decl.linear.forward != nullptr) {
      m.impl(Loss::decl.linear.forward, TORCH_FN(LinearAutograd<Loss>::forward));
      m.impl(Loss::decl.linear.with_grads, TORCH_FN(LinearAutograd<Loss>::with_grads));
    }
  });
}

}  // namespace npu_loss::autograd
