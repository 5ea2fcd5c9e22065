// The schemas of a loss's three ops, written from its declaration (losses.h). An elementwise loss's names and
// argument order follow ATen and torch_npu, so each op is a drop-in for its twin:
//   <forward>(Tensor self, Tensor target, int reduction=1[, <scalar>=<default>]) -> Tensor
//   <backward>(Tensor grad_output, Tensor self, Tensor target, int reduction[, <scalar>]) -> Tensor
//   <backward>.<out_overload>(<backward's arguments>, *, Tensor(a!) <out_arg>) -> Tensor(a!)
#pragma once

#include <string>
#include <vector>

#include "../losses.h"

namespace npu_loss {

namespace detail {
inline std::string scalar_param(const ScalarArg& s) {
  const char* type = s.kind == ScalarKind::Bool            ? "bool "
                     : s.kind == ScalarKind::Int           ? "int "
                     : s.kind == ScalarKind::OptionalFloat ? "float? "
                                                           : "float ";
  return std::string(type) + s.name;
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

// A row loss's ops (LossKind::Rows, losses.h's RowArgs):
//   <forward>(Tensor <logits>, Tensor <logits>, <its inputs>..., Tensor? <labels>=None, int reduction=1,
//             <its scalars>=<default>..., int <index>=<default>) -> Tensor
//   <backward>(Tensor grad_output, <the forward's arguments, no defaults>, bool[2] output_mask) -> (Tensor, Tensor)
//   <with_grads>(<the forward's arguments, no defaults>, bool[2] output_mask) -> (Tensor, Tensor, Tensor, Tensor)
//     (the value, the two gradients, the row scales: checks.h, scales_rows)
namespace detail {
// ", <type> <name>[=<default>]".
inline std::string declared_param(const ScalarArg& s, bool defaults) {
  return ", " + scalar_param(s) + (defaults ? std::string("=") + s.default_value : std::string());
}

// The same for each declared scalar of a row loss, then its index.
inline std::string row_scalar_params(const RowArgs& r, bool defaults) {
  std::string params;
  for (int i = 0; i < row_scalar_count(r); ++i) params += declared_param(r.scalars[i], defaults);
  return params + declared_param(r.index, defaults);
}

inline std::string row_params(const RowArgs& r, bool defaults) {
  std::string params = std::string("Tensor ") + r.logits[0] + ", Tensor " + r.logits[1];
  for (int i = 0; i < row_input_count(r); ++i) {
    const RowInput& in = r.inputs[i];
    params += std::string(in.optional ? ", Tensor? " : ", Tensor ") + in.name + (in.optional && defaults ? "=None" : "");
  }
  return params + ", Tensor? " + r.labels + (defaults ? "=None" : "") + ", int reduction" + (defaults ? "=1" : "") +
      row_scalar_params(r, defaults);
}
}  // namespace detail

inline std::string row_forward_schema(const LossDecl& d) {
  return std::string(d.forward) + "(" + detail::row_params(d.rows, true) + ") -> Tensor";
}

inline std::string row_backward_schema(const LossDecl& d) {
  return std::string(d.backward) + "(Tensor grad_output, " + detail::row_params(d.rows, false) +
      ", bool[2] output_mask) -> (Tensor, Tensor)";
}

inline std::string row_with_grads_schema(const LossDecl& d) {
  return std::string(d.with_grads) + "(" + detail::row_params(d.rows, false) +
      ", bool[2] output_mask) -> (Tensor, Tensor, Tensor, Tensor)";
}

// A row loss's linear form (losses.h's LinearForm): its two ops.
namespace detail {
inline std::string linear_params(const LossDecl& d, bool defaults) {
  const RowArgs& r = d.rows;
  const LinearForm& f = d.linear;
  const auto tensor = [&](const char* name, bool optional) {
    return std::string(optional ? "Tensor? " : "Tensor ") + name + (defaults && optional ? "=None" : "");
  };
  std::string params = tensor(f.inputs[0], false) + ", " + tensor(f.weights[0], false) + ", " +
      tensor(f.inputs[1], false) + ", " + tensor(f.weights[1], false) + ", " + tensor(r.labels, true) + ", " +
      tensor(f.biases[0], true) + ", " + tensor(f.biases[1], true) +
      (defaults ? ", str reduction=\"batchmean\"" : ", str reduction") + row_scalar_params(r, defaults);
  for (const ScalarArg& s : f.weights_of) params += declared_param(s, defaults);
  return params + (defaults ? ", int? chunk_size=None, bool return_soft_hard_loss=False, bool return_entropy=False"
                            : ", int? chunk_size, bool return_soft_hard_loss, bool return_entropy");
}
}  // namespace detail

inline std::string linear_forward_schema(const LossDecl& d) {
  return std::string(d.linear.forward) + "(" + detail::linear_params(d, true) + ") -> (Tensor, Tensor, Tensor, Tensor)";
}

inline std::string linear_with_grads_schema(const LossDecl& d) {
  std::string results = "Tensor";
  for (int i = 1; i < 11; ++i) results += ", Tensor";
  return std::string(d.linear.with_grads) + "(" + detail::linear_params(d, false) + ", bool[6] output_mask) -> (" +
      results + ")";
}

// Every schema of a loss, by its kind.
inline std::vector<std::string> schemas(const LossDecl& d) {
  if (d.kind == LossKind::Rows) {
    std::vector<std::string> all{row_forward_schema(d), row_backward_schema(d), row_with_grads_schema(d)};
    if (d.linear.forward != nullptr) {
      all.push_back(linear_forward_schema(d));
      all.push_back(linear_with_grads_schema(d));
    }
    return all;
  }
  return {forward_schema(d), backward_schema(d), backward_out_schema(d)};
}

}  // namespace npu_loss
