// The schemas of a loss's three ops, written from its declaration (losses.h). Names and argument order
// follow ATen and torch_npu, so each op is a drop-in for its twin:
//   <forward>(Tensor self, Tensor target, int reduction=1[, <scalar>=<default>]) -> Tensor
//   <backward>(Tensor grad_output, Tensor self, Tensor target, int reduction[, <scalar>]) -> Tensor
//   <backward>.<out_overload>(<backward's arguments>, *, Tensor(a!) <out_arg>) -> Tensor(a!)
#pragma once

#include <string>

#include "../losses.h"

namespace npu_loss {

namespace detail {
inline std::string scalar_param(const ScalarArg& s) {
  return std::string(s.kind == ScalarKind::Bool ? "bool " : "float ") + s.name;
}

inline std::string backward_params(const LossDecl& d) {
  std::string params = "Tensor grad_output, Tensor self, Tensor target, int reduction";
  if (d.scalar.kind != ScalarKind::None) params += ", " + scalar_param(d.scalar);
  return params;
}
}  // namespace detail

inline std::string forward_schema(const LossDecl& d) {
  std::string params = "Tensor self, Tensor target, int reduction=1";
  if (d.scalar.kind != ScalarKind::None) {
    params += std::string(d.scalar.keyword_only ? ", *, " : ", ") + detail::scalar_param(d.scalar) + "=" +
        d.scalar.default_value;
  }
  return std::string(d.forward) + "(" + params + ") -> Tensor";
}

inline std::string backward_schema(const LossDecl& d) {
  return std::string(d.backward) + "(" + detail::backward_params(d) + ") -> Tensor";
}

inline std::string backward_out_schema(const LossDecl& d) {
  return std::string(d.backward) + "." + d.out_overload + "(" + detail::backward_params(d) + ", *, Tensor(a!) " +
      d.out_arg + ") -> Tensor(a!)";
}

}  // namespace npu_loss
