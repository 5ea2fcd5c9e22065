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

#include "../losses.h"

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

// A row loss's three ops (losses.h's RowArgs; core/schema.h): the forward, the forward with the gradients of
// its reduced result, the backward op.
struct RowSignatures {
  using Forward = at::Tensor(
      const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t, double, double, int64_t);
  using WithGrads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t, double, double, int64_t,
      std::array<bool, 2>);
  using Backward = std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t, double,
      double, int64_t, std::array<bool, 2>);
};

template <typename Loss>
const c10::TypedOperatorHandle<RowSignatures::Forward>& row_forward() {
  static const auto op = find<RowSignatures::Forward>(Loss::decl.forward);
  return op;
}

template <typename Loss>
const c10::TypedOperatorHandle<RowSignatures::WithGrads>& row_with_grads() {
  static const auto op = find<RowSignatures::WithGrads>(Loss::decl.with_grads);
  return op;
}

template <typename Loss>
const c10::TypedOperatorHandle<RowSignatures::Backward>& row_backward() {
  static const auto op = find<RowSignatures::Backward>(Loss::decl.backward);
  return op;
}

// A row loss's linear form's two ops (losses.h's LinearForm; core/schema.h).
struct LinearSignatures {
  using Results = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                             at::Tensor, at::Tensor, at::Tensor>;
  using Forward = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
      const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, c10::string_view, double, double, int64_t,
      double, double, std::optional<int64_t>, bool);
  using WithGrads = Results(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
      const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, c10::string_view, double, double, int64_t,
      double, double, std::optional<int64_t>, bool, std::array<bool, 6>);
};

template <typename Loss>
const c10::TypedOperatorHandle<LinearSignatures::Forward>& linear_forward() {
  static const auto op = find<LinearSignatures::Forward>(Loss::decl.linear.forward);
  return op;
}

template <typename Loss>
const c10::TypedOperatorHandle<LinearSignatures::WithGrads>& linear_with_grads() {
  static const auto op = find<LinearSignatures::WithGrads>(Loss::decl.linear.with_grads);
  return op;
}

}  // namespace ops
}  // namespace npu_loss
