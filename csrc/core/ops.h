// The typed dispatcher handles of every loss's ops, derived from its declaration (losses.h) and looked up
// once per process. `.call(...)` enters the dispatcher at the top (autograd, vmap, autocast all apply);
// `.redispatch(ks, ...)` continues below the keys a kernel has masked off.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../losses.h"
#include "checks.h"

namespace npu_loss {

// The C++ signatures of a loss's three ops, for its scalars S...: (self, target, reduction, scalars...),
// (grad_output, self, target, reduction, scalars...) and the latter with the out= tensor last.
template <typename Loss, typename... S>
struct SignaturesWith {
  using Forward = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, S...);
  using Backward = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, S...);
  using BackwardOut = at::Tensor&(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, S..., at::Tensor&);
};

template <typename Loss>
using Signatures = WithScalars<SignaturesWith, Loss>;

// "backward.out_overload", the out= overload's full name.
inline std::string out_overload_name(const LossDecl& decl) {
  return std::string(decl.backward) + "." + decl.out_overload;
}

namespace ops {

template <typename Schema>
c10::TypedOperatorHandle<Schema> find(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow((std::string("npu_loss::") + name).c_str(), overload).typed<Schema>();
}

// The handle of a loss's forward op, of its backward op, and of the backward's out= overload.
template <typename Loss>
const c10::TypedOperatorHandle<typename Signatures<Loss>::Forward>& forward() {
  static const auto op = find<typename Signatures<Loss>::Forward>(Loss::decl.forward);
  return op;
}

template <typename Loss>
const c10::TypedOperatorHandle<typename Signatures<Loss>::Backward>& backward() {
  static const auto op = find<typename Signatures<Loss>::Backward>(Loss::decl.backward);
  return op;
}

template <typename Loss>
const c10::TypedOperatorHandle<typename Signatures<Loss>::BackwardOut>& backward_out() {
  static const auto op =
      find<typename Signatures<Loss>::BackwardOut>(Loss::decl.backward, Loss::decl.out_overload);
  return op;
}

}  // namespace ops

// A row loss's scalars in C++: each declared kind's type (Float double, Int int64_t, Bool bool, OptionalFloat
// std::optional<double>), as a tuple in
// the declaration's order (RowScalarTypes), to and from the one RowScalars every layer below the ops takes.
namespace detail {
template <ScalarKind K>
struct RowScalarType;
template <>
struct RowScalarType<ScalarKind::Float> {
  using type = double;
};
template <>
struct RowScalarType<ScalarKind::Int> {
  using type = int64_t;
};
template <>
struct RowScalarType<ScalarKind::Bool> {
  using type = bool;
};
template <>
struct RowScalarType<ScalarKind::OptionalFloat> {
  using type = std::optional<double>;
};

template <const RowArgs& R, size_t... I>
std::tuple<typename RowScalarType<R.scalars[I].kind>::type...> row_scalar_types(std::index_sequence<I...>);
}  // namespace detail

template <typename Loss>
using RowScalarTypes = decltype(detail::row_scalar_types<Loss::decl.rows>(
    std::make_index_sequence<row_scalar_count(Loss::decl.rows)>{}));

inline ScalarValue scalar_value(double v) { return {.real = v}; }
inline ScalarValue scalar_value(int64_t v) { return {.integer = v}; }
inline ScalarValue scalar_value(bool v) { return {.flag = v}; }
inline ScalarValue scalar_value(std::optional<double> v) { return {.real = v.value_or(0.0), .absent = !v}; }

// The scalars of a call, from the op's typed arguments.
template <typename... S>
RowScalars row_scalars(S... s) {
  static_assert(sizeof...(S) <= kMaxRowScalars, "row_scalars: more scalars than kMaxRowScalars");
  return RowScalars{scalar_value(s)...};
}

template <typename T>
T scalar_as(const ScalarValue& v) {
  static_assert(std::is_same_v<T, double> || std::is_same_v<T, int64_t> || std::is_same_v<T, bool> ||
                    std::is_same_v<T, std::optional<double>>,
                "scalar_as: a type RowScalarType does not map to");
  if constexpr (std::is_same_v<T, double>) return v.real;
  else if constexpr (std::is_same_v<T, int64_t>) return v.integer;
  else if constexpr (std::is_same_v<T, bool>) return v.flag;
  else return v.absent ? std::optional<double>() : std::optional<double>(v.real);
}

// f(s...) with the scalars as the op's typed arguments, in their order.
template <typename Loss, typename F>
decltype(auto) with_row_scalars(const RowScalars& values, F&& f) {
  return [&]<size_t... I>(std::index_sequence<I...>) -> decltype(auto) {
    return f(scalar_as<std::tuple_element_t<I, RowScalarTypes<Loss>>>(values[I])...);
  }(std::make_index_sequence<std::tuple_size_v<RowScalarTypes<Loss>>>{});
}

// A row loss's inputs without a gradient in C++ (RowArgs::inputs): `const at::Tensor&`, or
// `const std::optional<at::Tensor>&` for an optional one, as a tuple in the declaration's order
// (RowInputTypes), to and from the one RowInputs (checks.h) every layer below the ops takes.
namespace detail {
template <bool Optional>
struct RowInputType {
  using type = const at::Tensor&;
};
template <>
struct RowInputType<true> {
  using type = const std::optional<at::Tensor>&;
};

template <const RowArgs& R, size_t... I>
std::tuple<typename RowInputType<R.inputs[I].optional>::type...> row_input_types(std::index_sequence<I...>);
}  // namespace detail

template <typename Loss>
using RowInputTypes = decltype(detail::row_input_types<Loss::decl.rows>(
    std::make_index_sequence<row_input_count(Loss::decl.rows)>{}));

inline at::Tensor input_value(const at::Tensor& t) { return t; }
inline at::Tensor input_value(const std::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }

// The inputs of a call, from the op's typed arguments.
template <typename... I>
RowInputs row_inputs(const I&... i) {
  static_assert(sizeof...(I) <= kMaxRowInputs, "row_inputs: more inputs than kMaxRowInputs");
  return RowInputs{input_value(i)...};
}

// f(i...) with the inputs as the op's typed arguments, in their order (an undefined optional one as nullopt).
template <typename Loss, typename F>
decltype(auto) with_row_inputs(const RowInputs& values, F&& f) {
  return [&]<size_t... I>(std::index_sequence<I...>) -> decltype(auto) {
    const auto as = [&]<size_t J>() {
      if constexpr (Loss::decl.rows.inputs[J].optional) {
        return values[J].defined() ? std::optional<at::Tensor>(values[J]) : std::optional<at::Tensor>();
      } else {
        return values[J];
      }
    };
    return f(as.template operator()<I>()...);
  }(std::make_index_sequence<std::tuple_size_v<RowInputTypes<Loss>>>{});
}

// A row loss's three ops (losses.h's RowArgs; core/schema.h): the forward, the forward with the gradients of
// its reduced result, the backward op, with the loss's inputs I... after the two logits and its scalars S...
// between the reduction and the index.
template <typename Inputs, typename Scalars>
struct RowSignaturesWith;

template <typename... I, typename... S>
struct RowSignaturesWith<std::tuple<I...>, std::tuple<S...>> {
  using Forward = at::Tensor(
      const at::Tensor&, const at::Tensor&, I..., const std::optional<at::Tensor>&, int64_t, S..., int64_t);
  using WithGrads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, I..., const std::optional<at::Tensor>&, int64_t, S..., int64_t,
      std::array<bool, 2>);
  using Backward = std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, I..., const std::optional<at::Tensor>&, int64_t,
      S..., int64_t, std::array<bool, 2>);
};

template <typename Loss>
using RowSignatures = RowSignaturesWith<RowInputTypes<Loss>, RowScalarTypes<Loss>>;

namespace ops {

template <typename Loss>
const c10::TypedOperatorHandle<typename RowSignatures<Loss>::Forward>& row_forward() {
  static const auto op = find<typename RowSignatures<Loss>::Forward>(Loss::decl.forward);
  return op;
}

template <typename Loss>
const c10::TypedOperatorHandle<typename RowSignatures<Loss>::WithGrads>& row_with_grads() {
  static const auto op = find<typename RowSignatures<Loss>::WithGrads>(Loss::decl.with_grads);
  return op;
}

template <typename Loss>
const c10::TypedOperatorHandle<typename RowSignatures<Loss>::Backward>& row_backward() {
  static const auto op = find<typename RowSignatures<Loss>::Backward>(Loss::decl.backward);
  return op;
}

}  // namespace ops

// A row loss's linear form's two ops (losses.h's LinearForm; core/schema.h), with the row loss's scalars S...
// after the reduction. The forward with gradients' eleven results:
using LinearResults = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                                 at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

template <typename Scalars>
struct LinearSignaturesWith;

template <typename... S>
struct LinearSignaturesWith<std::tuple<S...>> {
  using Forward = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
      const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, c10::string_view, S..., int64_t, double,
      double, std::optional<int64_t>, bool, bool);
  using WithGrads = LinearResults(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
      const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, c10::string_view, S..., int64_t, double,
      double, std::optional<int64_t>, bool, bool, std::array<bool, 6>);
};

template <typename Loss>
using LinearSignatures = LinearSignaturesWith<RowScalarTypes<Loss>>;

namespace ops {

template <typename Loss>
const c10::TypedOperatorHandle<typename LinearSignatures<Loss>::Forward>& linear_forward() {
  static const auto op = find<typename LinearSignatures<Loss>::Forward>(Loss::decl.linear.forward);
  return op;
}

template <typename Loss>
const c10::TypedOperatorHandle<typename LinearSignatures<Loss>::WithGrads>& linear_with_grads() {
  static const auto op = find<typename LinearSignatures<Loss>::WithGrads>(Loss::decl.linear.with_grads);
  return op;
}

}  // namespace ops
}  // namespace npu_loss
