// The generic autograd layer every npu_loss op shares, driven by the op's block in derivatives.cpp (the
// role tools/autograd/derivatives.yaml plays in PyTorch, whose generated code this mirrors by hand):
//   - LossNode<Op>: the graph node, one TraceableFunction per op holding its tensor inputs as
//     SavedVariables (never intermediates) and its scalar arguments, with compiled-autograd support
//     (compiled_args / apply_with_saved proxy the node's functional form into the compiled graph);
//   - AutogradKernel<Op>: the Autograd-key kernel (one registration covers CPU, the NPU and every other
//     device): creates the node when an input requires grad, redispatches below autograd, sets the
//     history, and sets the forward-mode tangent from the op's tangent formula.
//
// An op's block gives:
//   kName                 the op's schema name; its node is named from it (node_name)
//   Signature, op()       the op's C++ signature and its dispatcher handle (ops.h)
//   kTensors              how many leading arguments are differentiable tensor inputs (all saved); the
//                         rest are the scalars the node keeps
//   backward(grad, needs, inputs..., scalars...)   one gradient per tensor input (undefined where not
//                         needed; a zero tensor where the math gives zero)
//   tangent(duals..., scalars...)                  the result's tangent (undefined: zero)
// Each gradient is summed back to its input's shape and dtype by the formulas (reduce_to).
#pragma once

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/dynamo/compiled_autograd.h>

#include <array>
#include <cctype>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../compat/torch_compat.h"
#include "../core/checks.h"
#include "../core/reduction.h"

namespace npu_loss::autograd {

// Whether gradients made in the forward may be handed over as they are instead of times `factors`: they may
// be consumed, and every factor is 1 (`loss.backward()` on an unscaled call). Asked of plain host tensors only,
// whose values reading syncs nothing (not of a fake, functional or functorch-wrapped one, which tracing and
// transforms hand over); it spares a pass over each gradient.
inline bool unit_factors(const at::Tensor& factors, bool consume) {
  const c10::DispatchKeySet plain =
      factors.key_set() - (c10::autograd_dispatch_keyset_with_ADInplaceOrView | c10::autocast_dispatch_keyset);
  return consume && plain.highestPriorityTypeId() == c10::DispatchKey::CPU && factors.eq(1).all().item<bool>();
}

using torch::autograd::variable_list;

template <size_t N>
using Needs = std::array<bool, N>;

// ---- shape and dtype helpers of the formulas ----

inline c10::SymDimVector broadcast_shape(const at::Tensor& a, const at::Tensor& b) {
  if (a.sym_sizes() == b.sym_sizes()) return c10::SymDimVector(a.sym_sizes().begin(), a.sym_sizes().end());
  return at::infer_size_symdimvector(a.sym_sizes(), b.sym_sizes());
}

// `t` as a view of `shape` (no copy); `t` itself when it already has that shape.
inline at::Tensor expand_to(const at::Tensor& t, c10::SymIntArrayRef shape) {
  return t.sym_sizes() == shape ? t : t.expand_symint(shape);
}

// A gradient summed to `like`'s shape, cast to its dtype and, for a 4-D or 5-D input, laid out in its
// suggested memory format (docs/semantics.md, "Memory format"); undefined stays undefined.
inline at::Tensor reduce_to(const at::Tensor& grad, const at::Tensor& like) {
  if (!grad.defined()) return grad;
  at::Tensor g = grad.sym_sizes() == like.sym_sizes() ? grad : at::sum_to(grad, like.sym_sizes());
  if (g.scalar_type() != like.scalar_type()) g = g.to(like.scalar_type());
  if (like.dim() == 4 || like.dim() == 5) g = with_memory_format(g, like.suggest_memory_format());
  return g;
}

// a + b where a may be undefined (a sum of tangent terms, some absent).
inline at::Tensor add_defined(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() ? a + b : b;
}

// ---- forward-mode AD ----

// Forward-mode AD has one active level, 0: torch.autograd.forward_ad.dual_level() enters it, and functorch's
// jvp nests transforms through its own tensor wrappers, each at level 0 (as ATen's generated kernels assume).
constexpr uint64_t kLevel = 0;

// An input of a tangent formula: its primal (without tangent: the formula's result must not carry one)
// and its tangent, undefined when it has none (a zero tangent).
struct Dual {
  at::Tensor p;
  at::Tensor t;

  explicit Dual(const at::Tensor& input) {
    const auto& tangent = input._fw_grad(kLevel);
    if (tangent.defined()) {
      p = input._fw_primal(kLevel);
      t = tangent;
    } else {
      p = input;
    }
  }

  bool has_tangent() const {
    return t.defined();
  }
};

// ---- compiled autograd plumbing (generic over the saved values' types) ----

namespace detail {

using torch::dynamo::autograd::IValuePacker;
using torch::dynamo::autograd::PackedArgs;

template <size_t N, typename Tuple, size_t... I>
auto tail_type(std::index_sequence<I...>) -> std::tuple<std::tuple_element_t<N + I, Tuple>...>;

// The scalar arguments of a signature: everything after its first N (tensor) arguments, decayed.
template <typename Signature, size_t N>
struct SignatureParts;

template <typename... Args, size_t N>
struct SignatureParts<at::Tensor(Args...), N> {
  using All = std::tuple<std::decay_t<Args>...>;
  using Scalars = decltype(tail_type<N, All>(std::make_index_sequence<sizeof...(Args) - N>{}));
};

// Binds `fn` under the node's name once per process and op (the Python side keeps one global registry of
// node functions), then proxies a call to it with the packed saved values into the compiled graph.
variable_list proxy_into_compiled_graph(
    const torch::autograd::Node& node, torch::dynamo::autograd::SwapSavedVariables& saved, bool& bound,
    torch::autograd::functional_apply_t fn, std::vector<at::TypePtr> schema, PackedArgs& packed,
    const variable_list& grads);

}  // namespace detail

template <typename Op>
using SavedScalars = typename detail::SignatureParts<typename Op::Signature, Op::kTensors>::Scalars;

// The compiled-autograd half of a node that keeps N tensors as SavedVariables, any of them undefined (the row
// and linear nodes: their inputs, and the gradients their forward made), and its other values as a tuple of
// packable types: `collect` (compiled_args) hashes them; `proxy` (apply_with_saved) lifts the tensors into the
// compiled graph and proxies `fn`, the node's from_ivalues, which reads them back with `unpack` and runs the
// node's functional form (never in place there: the lifted gradients are the graph's inputs).
template <size_t N, typename Values>
struct SavedForm {
  using Saved = std::array<torch::autograd::SavedVariable*, N>;
  using ConstSaved = std::array<const torch::autograd::SavedVariable*, N>;

  struct Unpacked {
    std::vector<bool> needs;
    std::array<at::Tensor, N> tensors;
    Values values;
  };

  static void collect(torch::dynamo::autograd::CompiledNodeArgs& args, const ConstSaved& saved,
                      const Values& values) {
    for (const auto* s : saved) args.collect(*s, false);
    std::apply([&](const auto&... v) { (args.collect(v), ...); }, values);
  }

  static variable_list proxy(
      const torch::autograd::Node& node, torch::dynamo::autograd::SwapSavedVariables& swap, bool& bound,
      torch::autograd::functional_apply_t fn, const std::vector<bool>& needs, const Saved& saved,
      const Values& values, const variable_list& grads) {
    for (auto* s : saved) swap.before(*s);
    detail::PackedArgs packed;
    packed.pack(needs);
    for (auto* s : saved) {
      const at::Tensor t = s->unpack();
      packed.pack(t.defined() ? std::optional<at::Tensor>(t) : std::nullopt);
    }
    std::apply([&](const auto&... v) { (packed.pack(v), ...); }, values);
    auto result = detail::proxy_into_compiled_graph(node, swap, bound, fn, schema(), packed, grads);
    for (auto* s : saved) swap.after(*s);
    return result;
  }

  static Unpacked unpack(const std::vector<c10::IValue>& args) {
    detail::PackedArgs packed(args);
    Unpacked u;
    u.needs = packed.unpack<std::vector<bool>>();
    for (auto& t : u.tensors) t = packed.unpack<std::optional<at::Tensor>>().value_or(at::Tensor());
    u.values = std::apply(
        [&](auto... v) {
          // Braced initialisation evaluates left to right: the values come out in the order they went in.
          return Values{packed.unpack<decltype(v)>()...};
        },
        Values{});
    return u;
  }

 private:
  static std::vector<at::TypePtr> schema() {
    std::vector<at::TypePtr> types{detail::IValuePacker<std::vector<bool>>::packed_type()};
    for (size_t i = 0; i < N; ++i) types.push_back(detail::IValuePacker<std::optional<at::Tensor>>::packed_type());
    std::apply([&](auto... v) { (types.push_back(detail::IValuePacker<decltype(v)>::packed_type()), ...); }, Values{});
    return types;
  }
};

// ---- the node ----

// "NpuLoss", the op's name in CamelCase, "Backward0" (smooth_l1_loss: NpuLossSmoothL1LossBackward0): prefixed,
// so that compiled autograd never confuses it with ATen's SmoothL1LossBackward0 and friends.
inline std::string node_name(const char* op) {
  std::string name = "NpuLoss";
  bool upper = true;
  for (const char* c = op; *c != '\0'; ++c) {
    if (*c == '_') {
      upper = true;
      continue;
    }
    name += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(*c))) : *c;
    upper = false;
  }
  return name + "Backward0";
}

template <typename Op>
struct LossNode final : public torch::autograd::TraceableFunction {
  static constexpr size_t N = Op::kTensors;
  using Scalars = SavedScalars<Op>;
  using Inputs = std::array<at::Tensor, N>;

  std::array<torch::autograd::SavedVariable, N> saved;
  Scalars scalars;

  std::string name() const override {
    static const std::string name = node_name(Op::kName);
    return name;
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& s : saved) s.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    Inputs inputs;
    for (size_t i = 0; i < N; ++i) inputs[i] = saved[i].unpack();
    return functional(grads, task_needs(), inputs, scalars);
  }

  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {
    for (const auto& s : saved) args.collect(s, false);
    std::apply([&](const auto&... s) { (args.collect(s), ...); }, scalars);
  }

  variable_list apply_with_saved(
      const variable_list& grads, torch::dynamo::autograd::SwapSavedVariables& swap) override {
    for (auto& s : saved) swap.before(s);
    detail::PackedArgs packed;
    const auto needs = task_needs();
    packed.pack(std::vector<bool>(needs.begin(), needs.end()));
    for (auto& s : saved) packed.pack(s.unpack());
    std::apply([&](const auto&... s) { (packed.pack(s), ...); }, scalars);
    static bool bound = false;
    auto result = detail::proxy_into_compiled_graph(
        *this, swap, bound, &from_ivalues, packed_schema(std::make_index_sequence<std::tuple_size_v<Scalars>>{}),
        packed, grads);
    for (auto& s : saved) swap.after(s);
    return result;
  }

  // The functional form eager `apply` and compiled autograd share.
  static variable_list functional(
      const variable_list& grads, const Needs<N>& needs, const Inputs& inputs, const Scalars& s) {
    const auto& grad = grads[0];
    bool any = false;
    for (bool n : needs) any = any || n;
    if (!grad.defined() || !any) return variable_list(N);
    return call(grad, needs, inputs, s, std::make_index_sequence<N>{},
                std::make_index_sequence<std::tuple_size_v<Scalars>>{});
  }

 private:
  template <size_t... I, size_t... J>
  static variable_list call(
      const at::Tensor& grad, const Needs<N>& needs, const Inputs& inputs, const Scalars& s,
      std::index_sequence<I...>, std::index_sequence<J...>) {
    return Op::backward(grad, needs, inputs[I]..., std::get<J>(s)...);
  }

  Needs<N> task_needs() const {
    Needs<N> needs{};
    for (size_t i = 0; i < N; ++i) needs[i] = task_should_compute_output(i);
    return needs;
  }

  template <size_t... J>
  static std::vector<at::TypePtr> packed_schema(std::index_sequence<J...>) {
    std::vector<at::TypePtr> schema{detail::IValuePacker<std::vector<bool>>::packed_type()};
    for (size_t i = 0; i < N; ++i) schema.push_back(detail::IValuePacker<at::Tensor>::packed_type());
    (schema.push_back(detail::IValuePacker<std::tuple_element_t<J, Scalars>>::packed_type()), ...);
    return schema;
  }

  template <size_t... J>
  static Scalars unpack_scalars(detail::PackedArgs& packed, std::index_sequence<J...>) {
    // Braced initialisation evaluates left to right: the scalars come out in the order they went in.
    return Scalars{packed.unpack<std::tuple_element_t<J, Scalars>>()...};
  }

  static variable_list from_ivalues(const variable_list& grads, const std::vector<c10::IValue>& args) {
    detail::PackedArgs packed(args);
    const auto v = packed.unpack<std::vector<bool>>();
    Needs<N> needs{};
    for (size_t i = 0; i < N; ++i) needs[i] = v[i];
    Inputs inputs;
    for (size_t i = 0; i < N; ++i) inputs[i] = packed.unpack<at::Tensor>();
    const auto s = unpack_scalars(packed, std::make_index_sequence<std::tuple_size_v<Scalars>>{});
    return functional(grads, needs, inputs, s);
  }
};

// ---- the Autograd-key kernel ----

template <typename Op, typename Signature = typename Op::Signature>
struct AutogradKernel;

template <typename Op, typename... Args>
struct AutogradKernel<Op, at::Tensor(Args...)> {
  static constexpr size_t N = Op::kTensors;

  static at::Tensor call(c10::DispatchKeySet ks, Args... args) {
    const std::tuple<Args...> all(args...);
    return run(ks, all, std::make_index_sequence<N>{},
               std::make_index_sequence<sizeof...(Args) - N>{});
  }

 private:
  template <size_t... I, size_t... J>
  static at::Tensor run(
      c10::DispatchKeySet ks, const std::tuple<Args...>& all, std::index_sequence<I...>,
      std::index_sequence<J...>) {
    const std::array<const at::Tensor*, N> inputs{&std::get<I>(all)...};
    // An undefined (None) tensor skips autograd, so that the kernel's checks report it by name.
    bool defined = true;
    for (const auto* t : inputs) defined = defined && t->defined();
    compat::NodePtr<LossNode<Op>> grad_fn;
    if (defined && torch::autograd::compute_requires_grad(std::get<I>(all)...)) {
      grad_fn = compat::make_node<LossNode<Op>>();
      grad_fn->set_next_edges(torch::autograd::collect_next_edges(std::get<I>(all)...));
      for (size_t i = 0; i < N; ++i) grad_fn->saved[i] = torch::autograd::SavedVariable(*inputs[i], false);
      grad_fn->scalars = SavedScalars<Op>(std::get<N + J>(all)...);
    }
    bool forward_ad = false;
    for (const auto* t : inputs) forward_ad = forward_ad || (defined && t->_fw_grad(kLevel).defined());
    at::Tensor result;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      result = Op::op().redispatch(ks & c10::after_autograd_keyset, std::get<I>(all)..., std::get<N + J>(all)...);
    }
    if (grad_fn) torch::autograd::set_history(result, grad_fn);
    if (forward_ad) set_tangent(result, Op::tangent(Dual(std::get<I>(all))..., std::get<N + J>(all)...));
    return result;
  }

  // Sets `value` as the result's tangent: zeros when no term was defined, cast and expanded to the result.
  static void set_tangent(const at::Tensor& result, at::Tensor value) {
    if (!value.defined()) value = at::zeros_like(result);
    if (value.scalar_type() != result.scalar_type()) value = value.to(result.scalar_type());
    result._set_fw_grad(expand_to(value, result.sym_sizes()), kLevel, /*is_inplace_op=*/false);
  }
};

}  // namespace npu_loss::autograd
