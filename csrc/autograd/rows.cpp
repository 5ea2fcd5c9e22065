// Autograd and vmap for the row losses (losses.h's LossKind::Rows: the distillation family).
//
// A reduced loss ("mean", "sum") has its gradients made in the forward, chunk by chunk, by the op that also
// makes the loss (the declaration's with_grads): the node keeps them, and its backward scales them by
// grad_output, in place, handing each to autograd without a copy (with retain_graph=True it scales a copy,
// so that a second backward finds them intact). Where autograd will need no gradient the forward makes none.
// 'none' keeps its inputs and calls the backward op. A backward that must itself be differentiable
// (create_graph=True) computes the gradients with the ATen-op composite's formulas instead, which autograd
// differentiates again: double backward goes through the composite. Forward-mode AD: a reduced loss's tangent is the gradients' dot product with the
// tangents; 'none''s is the composite's. vmap runs the composite (composite/rows.h), batched op by op, and so
// do the ops below the node where nested transforms differentiate them.
// docs/semantics.md, "Distillation", has the memory this costs; docs/usage.md the limits.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <array>
#include <optional>

#include "../compat/torch_compat.h"
#include "../composite/rows.h"
#include "../core/ops.h"
#include "../core/reduction.h"
#include "node.h"

namespace npu_loss::autograd {
namespace {

using torch::autograd::SavedVariable;

// The node of a row loss's forward op. It keeps the logits and the inputs without a gradient (references, as
// any node keeps its inputs: double backward and 'none' need them) and, for a reduced loss, the gradients the
// forward made with their row scales.
template <typename Loss>
struct RowLossNode final : public torch::autograd::TraceableFunction {
  static constexpr size_t kInputs = row_input_count(Loss::decl.rows);
  SavedVariable student, teacher, labels;
  std::array<SavedVariable, kInputs> inputs;  // RowArgs::inputs (an absent optional one undefined)
  bool has_labels = false;
  // The gradients the forward made (a reduced loss), or nothing ('none'); the row scales of float16 ones.
  SavedVariable grad_student, grad_teacher, row_scale;
  bool made_in_forward = false;
  int64_t reduction = 0;
  RowScalars scalars{};  // the declaration's scalars (RowArgs::scalars), by position
  int64_t ignore_index = 0;

  std::string name() const override {
    static const std::string name = node_name(Loss::decl.forward);
    return name;
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (SavedVariable* s : saved()) s->reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::array<bool, 2> need{task_should_compute_output(0), task_should_compute_output(1)};
    // The logits only where a formula reads them (double backward, 'none'): the gradients made in the forward
    // need nothing else, so an in-place change of the logits after the forward does not matter to them.
    const bool reads_logits = !made_in_forward || c10::GradMode::is_enabled();
    Saved values{reads_logits ? student.unpack() : at::Tensor(), reads_logits ? teacher.unpack() : at::Tensor(),
                 labels.unpack(), grad_student.unpack(), grad_teacher.unpack(), row_scale.unpack(), {}};
    for (size_t i = 0; i < kInputs; ++i) values.inputs[i] = inputs[i].unpack();
    // The gradients made in the forward are scaled in place and handed over (autograd can then keep one as
    // the leaf's .grad without a copy), unless the graph is kept for another backward.
    const bool consume = made_in_forward && !torch::autograd::get_current_graph_task_keep_graph();
    if (consume) {
      grad_student.reset_data();
      grad_teacher.reset_data();
    }
    return functional(grads, need, values, arguments(), consume);
  }

  // Compiled autograd: the saved tensors are lifted into the graph, which calls `functional` through
  // from_ivalues. The gradients made in the forward are the graph's inputs there: they are scaled into new
  // tensors (one more N x V each than eager), never in place.
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {
    Form::collect(args, saved(), values());
  }

  variable_list apply_with_saved(
      const variable_list& grads, torch::dynamo::autograd::SwapSavedVariables& swap) override {
    static bool bound = false;
    return Form::proxy(*this, swap, bound, &from_ivalues, {task_should_compute_output(0), task_should_compute_output(1)},
                       saved(), values(), grads);
  }

 private:
  static constexpr size_t kSaved = 6 + kInputs;
  static constexpr int kScalars = row_scalar_count(Loss::decl.rows);
  struct Saved {
    at::Tensor student, teacher, labels, grad_student, grad_teacher, row_scale;
    RowInputs inputs;
  };
  // The node's arguments other than tensors.
  struct Arguments {
    bool has_labels, made_in_forward;
    int64_t reduction;
    RowScalars scalars;
    int64_t ignore_index;
  };
  // As compiled autograd packs them: has_labels, made_in_forward, reduction, the declared scalars' values of
  // each kind (losses.h's ScalarValue: reals, integers, flags, absences), the index.
  using Values = std::tuple<bool, bool, int64_t, std::vector<double>, std::vector<int64_t>, std::vector<bool>,
                            std::vector<bool>, int64_t>;
  using Form = SavedForm<kSaved, Values>;

  // The saved tensors in one order: the six above, then the inputs.
  template <typename Self>
  static auto saved_of(Self& self) {
    using Pointer = decltype(&self.student);
    std::array<Pointer, kSaved> all{&self.student, &self.teacher, &self.labels, &self.grad_student,
                                    &self.grad_teacher, &self.row_scale};
    for (size_t i = 0; i < kInputs; ++i) all[6 + i] = &self.inputs[i];
    return all;
  }
  std::array<SavedVariable*, kSaved> saved() { return saved_of(*this); }
  std::array<const SavedVariable*, kSaved> saved() const { return saved_of(*this); }
  Arguments arguments() const { return {has_labels, made_in_forward, reduction, scalars, ignore_index}; }

  Values values() const {
    std::vector<double> reals;
    std::vector<int64_t> integers;
    std::vector<bool> flags, absences;
    for (int i = 0; i < kScalars; ++i) {
      reals.push_back(scalars[i].real);
      integers.push_back(scalars[i].integer);
      flags.push_back(scalars[i].flag);
      absences.push_back(scalars[i].absent);
    }
    return {has_labels, made_in_forward, reduction, reals, integers, flags, absences, ignore_index};
  }

  static Arguments arguments_of(const Values& v) {
    Arguments a{std::get<0>(v), std::get<1>(v), std::get<2>(v), {}, std::get<7>(v)};
    for (int i = 0; i < kScalars; ++i) {
      a.scalars[i] = {std::get<3>(v)[i], std::get<4>(v)[i], std::get<5>(v)[i], std::get<6>(v)[i]};
    }
    return a;
  }

  // The backward eager `apply` and compiled autograd share. `consume`: the saved gradients may be scaled in
  // place.
  static variable_list functional(
      const variable_list& grads, std::array<bool, 2> need, Saved& v, const Arguments& sc, bool consume) {
    variable_list out(2);
    const at::Tensor& g = grads[0];
    if (!g.defined() || !(need[0] || need[1])) return out;
    const std::optional<at::Tensor> l = sc.has_labels ? std::optional<at::Tensor>(v.labels) : std::nullopt;
    const RowCall call = row_call<Loss>(v.student, v.teacher, v.inputs, l, sc.reduction, sc.scalars, sc.ignore_index);
    if (c10::GradMode::is_enabled()) {
      // create_graph=True: the gradients as ATen-op functions of the inputs and grad_output (the composite),
      // which autograd and the functorch transforms differentiate again.
      auto [gs, gt] = composite::backward_differentiable(Loss{}, call, g, need);
      if (need[0]) out[0] = gs;
      if (need[1]) out[1] = gt;
      return out;
    }
    if (sc.made_in_forward) {
      // grad_output times each row's scale (float16: checks.h, scales_rows), rounded once into the gradient;
      // a reduced loss's grad_output of 1 without row scales leaves the gradients as they are (node.h): a pass
      // over each spared.
      const at::Tensor factor = v.row_scale.defined() ? g * v.row_scale.unsqueeze(-1) : g;
      const bool unit = !v.row_scale.defined() && g.numel() == 1 && unit_factors(g, consume);
      for (size_t i = 0; i < 2; ++i) {
        if (!need[i]) continue;
        at::Tensor& gradient = i == 0 ? v.grad_student : v.grad_teacher;
        out[i] = unit ? gradient : consume ? gradient.mul_(factor) : gradient * factor;
      }
      return out;
    }
    auto [gs, gt] = with_row_inputs<Loss>(v.inputs, [&](const auto&... i) {
      return with_row_scalars<Loss>(sc.scalars, [&](auto... s) {
        return ops::row_backward<Loss>().call(
            g, v.student, v.teacher, i..., l, sc.reduction, s..., sc.ignore_index, need);
      });
    });
    if (need[0]) out[0] = gs;
    if (need[1]) out[1] = gt;
    return out;
  }

  static variable_list from_ivalues(const variable_list& grads, const std::vector<c10::IValue>& args) {
    const auto u = Form::unpack(args);
    const auto& t = u.tensors;
    Saved v{t[0], t[1], t[2], t[3], t[4], t[5], {}};
    for (size_t i = 0; i < kInputs; ++i) v.inputs[i] = t[6 + i];
    return functional(grads, {u.needs[0], u.needs[1]}, v, arguments_of(u.values), false);
  }
};

// The Autograd-key kernel of a row loss's forward op, for its declared inputs I... and scalars S...
template <typename Loss, typename Inputs = RowInputTypes<Loss>, typename Scalars = RowScalarTypes<Loss>>
struct RowAutograd;

template <typename Loss, typename... I, typename... S>
struct RowAutograd<Loss, std::tuple<I...>, std::tuple<S...>> {
  static at::Tensor forward(
      c10::DispatchKeySet ks, const at::Tensor& student, const at::Tensor& teacher, I... i,
      const std::optional<at::Tensor>& labels, int64_t reduction, S... s, int64_t ignore_index) {
    const c10::DispatchKeySet below = ks & c10::after_autograd_keyset;
    // An undefined tensor skips autograd, so that the kernel's checks report it by name.
    const bool defined = student.defined() && teacher.defined();
    const bool grad_mode = c10::GradMode::is_enabled();
    const std::array<bool, 2> need{defined && grad_mode && student.requires_grad(),
                                   defined && grad_mode && teacher.requires_grad()};
    if (!defined) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return ops::row_forward<Loss>().redispatch(below, student, teacher, i..., labels, reduction, s..., ignore_index);
    }
    const Dual s_dual(student), t_dual(teacher);
    const bool forward_ad = s_dual.has_tangent() || t_dual.has_tangent();
    at::Tensor result, gs, gt, row_scale;
    bool scaled = false;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      if (reduction != kNone && (need[0] || need[1] || forward_ad)) {
        const std::array<bool, 2> mask{need[0] || s_dual.has_tangent(), need[1] || t_dual.has_tangent()};
        std::tie(result, gs, gt, row_scale) = ops::row_with_grads<Loss>().redispatch(
            below, student, teacher, i..., labels, reduction, s..., ignore_index, mask);
        scaled = scales_rows(student, teacher, mask);
      } else {
        result =
            ops::row_forward<Loss>().redispatch(below, student, teacher, i..., labels, reduction, s..., ignore_index);
      }
    }
    if (need[0] || need[1]) {
      auto node = compat::make_node<RowLossNode<Loss>>();
      node->set_next_edges(torch::autograd::collect_next_edges(student, teacher));
      node->student = SavedVariable(student, false);
      node->teacher = SavedVariable(teacher, false);
      const RowInputs values = row_inputs(i...);
      for (size_t k = 0; k < node->kInputs; ++k) {
        if (values[k].defined()) node->inputs[k] = SavedVariable(values[k], false);
      }
      node->has_labels = labels.has_value() && labels->defined();
      if (node->has_labels) node->labels = SavedVariable(*labels, false);
      node->reduction = reduction;
      node->scalars = row_scalars(s...);
      node->ignore_index = ignore_index;
      if (reduction != kNone) {
        node->made_in_forward = true;
        if (need[0]) node->grad_student = SavedVariable(gs, false);
        if (need[1]) node->grad_teacher = SavedVariable(gt, false);
        if (scaled) node->row_scale = SavedVariable(row_scale, false);
      }
      torch::autograd::set_history(result, node);
    }
    if (forward_ad) {
      if (scaled) {  // the gradients as they are, for the dot product
        const at::Tensor factor = row_scale.unsqueeze(-1);
        if (gs.numel() > 0) gs = gs * factor;
        if (gt.numel() > 0) gt = gt * factor;
      }
      result._set_fw_grad(
          tangent(s_dual, t_dual, row_inputs(i...), labels, reduction, row_scalars(s...), ignore_index, gs, gt, result),
          kLevel, false);
    }
    return result;
  }

  // The result's tangent: for a reduced loss the gradients' dot product with the inputs' tangents; for 'none'
  // the composite's own (forward-mode AD through its ATen ops).
  static at::Tensor tangent(
      const Dual& s, const Dual& t, const RowInputs& inputs, const std::optional<at::Tensor>& labels, int64_t reduction,
      const RowScalars& scalars, int64_t ignore_index, const at::Tensor& gs, const at::Tensor& gt,
      const at::Tensor& result) {
    if (reduction == kNone) {
      c10::AutoGradMode no_grad(false);
      const at::Tensor student = s.has_tangent() ? at::_make_dual(s.p, s.t, kLevel) : s.p;
      const at::Tensor teacher = t.has_tangent() ? at::_make_dual(t.p, t.t, kLevel) : t.p;
      const at::Tensor dual = composite::forward_differentiable(
          Loss{}, row_call<Loss>(student, teacher, inputs, labels, reduction, scalars, ignore_index));
      const at::Tensor value = dual._fw_grad(kLevel);
      return value.defined() ? value.to(result.scalar_type()) : at::zeros_like(result);
    }
    // Summed in float32 at least (float64 stays float64), rounded once to the result's dtype.
    const at::ScalarType acc = at::promote_types(result.scalar_type(), at::kFloat);
    at::Tensor value = at::zeros({}, result.options().dtype(acc));
    if (s.has_tangent()) value = value + (gs.to(acc) * s.t.to(acc)).sum();
    if (t.has_tangent()) value = value + (gt.to(acc) * t.t.to(acc)).sum();
    return value.to(result.scalar_type());
  }
};

// Whether a call needs autograd or forward-mode AD of its own: an input that requires grad (in grad mode) or
// carries a tangent.
bool differentiated(std::initializer_list<const at::Tensor*> tensors) {
  for (const at::Tensor* t : tensors) {
    if (!t->defined()) continue;
    if ((c10::GradMode::is_enabled() && t->requires_grad()) || t->_fw_grad(kLevel).defined()) return true;
  }
  return false;
}

// The Autograd-key kernels of the two ops the forward's node calls below autograd (the forward with gradients,
// the backward op): called where their own results are differentiated (nested transforms: hessian,
// jacfwd(jacrev), a direct call), they run the composite, whose ATen ops autograd records; else the kernels.
template <typename Loss, typename Inputs = RowInputTypes<Loss>, typename Scalars = RowScalarTypes<Loss>>
struct RowOpsBelow;

template <typename Loss, typename... I, typename... S>
struct RowOpsBelow<Loss, std::tuple<I...>, std::tuple<S...>> {
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_grads(
      c10::DispatchKeySet ks, const at::Tensor& student, const at::Tensor& teacher, I... i,
      const std::optional<at::Tensor>& labels, int64_t reduction, S... s, int64_t ignore_index,
      std::array<bool, 2> mask) {
    if (!differentiated({&student, &teacher})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return ops::row_with_grads<Loss>().redispatch(
          ks & c10::after_autograd_keyset, student, teacher, i..., labels, reduction, s..., ignore_index, mask);
    }
    return composite::with_grads_differentiable(
        Loss{}, row_call<Loss>(student, teacher, row_inputs(i...), labels, reduction, row_scalars(s...), ignore_index), mask);
  }

  static std::tuple<at::Tensor, at::Tensor> backward(
      c10::DispatchKeySet ks, const at::Tensor& grad_output, const at::Tensor& student, const at::Tensor& teacher,
      I... i, const std::optional<at::Tensor>& labels, int64_t reduction, S... s, int64_t ignore_index,
      std::array<bool, 2> mask) {
    if (!differentiated({&grad_output, &student, &teacher})) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return ops::row_backward<Loss>().redispatch(
          ks & c10::after_autograd_keyset, grad_output, student, teacher, i..., labels, reduction, s..., ignore_index,
          mask);
    }
    return composite::backward_differentiable(
        Loss{}, row_call<Loss>(student, teacher, row_inputs(i...), labels, reduction, row_scalars(s...), ignore_index), grad_output,
        mask);
  }
};

// vmap: the composite, whose ATen ops batch one by one (the forward op, and the two ops autograd calls below it).
template <typename Loss, typename Inputs = RowInputTypes<Loss>, typename Scalars = RowScalarTypes<Loss>>
struct RowVmap;

template <typename Loss, typename... I, typename... S>
struct RowVmap<Loss, std::tuple<I...>, std::tuple<S...>> {
  static at::Tensor forward(
      const at::Tensor& student, const at::Tensor& teacher, I... i, const std::optional<at::Tensor>& labels,
      int64_t reduction, S... s, int64_t ignore_index) {
    return composite::forward_differentiable(
        Loss{}, row_call<Loss>(student, teacher, row_inputs(i...), labels, reduction, row_scalars(s...), ignore_index));
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_grads(
      const at::Tensor& student, const at::Tensor& teacher, I... i, const std::optional<at::Tensor>& labels,
      int64_t reduction, S... s, int64_t ignore_index, std::array<bool, 2> mask) {
    return composite::with_grads_differentiable(
        Loss{}, row_call<Loss>(student, teacher, row_inputs(i...), labels, reduction, row_scalars(s...), ignore_index), mask);
  }

  static std::tuple<at::Tensor, at::Tensor> backward(
      const at::Tensor& grad_output, const at::Tensor& student, const at::Tensor& teacher, I... i,
      const std::optional<at::Tensor>& labels, int64_t reduction, S... s, int64_t ignore_index,
      std::array<bool, 2> mask) {
    return composite::backward_differentiable(
        Loss{}, row_call<Loss>(student, teacher, row_inputs(i...), labels, reduction, row_scalars(s...), ignore_index), grad_output,
        mask);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, Autograd, m) {
  for_each_row_loss([&]<typename Loss>() {
    m.impl(Loss::decl.forward, TORCH_FN(RowAutograd<Loss>::forward));
    m.impl(Loss::decl.with_grads, TORCH_FN(RowOpsBelow<Loss>::with_grads));
    m.impl(Loss::decl.backward, TORCH_FN(RowOpsBelow<Loss>::backward));
  });
}

TORCH_LIBRARY_IMPL(npu_loss, FuncTorchBatched, m) {
  for_each_row_loss([&]<typename Loss>() {
    m.impl(Loss::decl.forward, &RowVmap<Loss>::forward);
    m.impl(Loss::decl.with_grads, &RowVmap<Loss>::with_grads);
    m.impl(Loss::decl.backward, &RowVmap<Loss>::backward);
  });
}

}  // namespace npu_loss::autograd
