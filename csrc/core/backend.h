// What every backend's kernels share: the functional and out= kernels of a loss's backward op, made once
// from the op's checks and the backend's `into` kernel, and the registration of a loss's three ops; for a
// row loss, its three kernels from the backend's row math (RowBackendKernels).
//
// A backend writes, per loss, its forward kernel and an into kernel that writes the backward's result into
// a tensor of the result's shape:
//
//   void into(at::Tensor& out, const ResultSpec& spec, const at::Tensor& grad_output, const at::Tensor& self,
//             const at::Tensor& target, <the op's scalar arguments>...);
//
// BackendKernels<Loss, &into>::functional checks, allocates the result (empty_result) and calls into;
// BackendKernels<Loss, &into>::out runs the out= checks and calls into on out. impl_loss registers a loss's
// forward kernel and those two, so a backend file holds its kernels and one registration per loss.
#pragma once

#include <ATen/DeviceGuard.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <tuple>
#include <utility>

#include "checks.h"
#include "ops.h"

namespace npu_loss {

// The device guard a backend's kernels run under: none on CPU and in the composite, self's device on the NPU.
struct NoDeviceGuard {
  explicit NoDeviceGuard(const at::Tensor&) {}
};

struct SelfDeviceGuard {
  explicit SelfDeviceGuard(const at::Tensor& self) : guard(at::device_of(self)) {}
  c10::OptionalDeviceGuard guard;
};

// The functional and out= kernels of a loss's backward op on one backend, made from the backend's into
// kernel after the op's checks (core/checks.h).
template <typename Loss, auto into, typename Guard = NoDeviceGuard, typename Scalars = ScalarsOf<Loss>>
struct BackendKernels;

template <typename Loss, auto into, typename Guard, typename... S>
struct BackendKernels<Loss, into, Guard, std::tuple<S...>> {
  static at::Tensor functional(
      const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction, S... s) {
    const Guard guard(self);
    const ResultSpec spec = LossChecks<Loss>::backward(grad_output, self, target, reduction, s...);
    at::Tensor result = empty_result(spec, self.options());
    into(result, spec, grad_output, self, target, reduction, s...);
    return result;
  }

  static at::Tensor& out(
      const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction, S... s,
      at::Tensor& result) {
    const Guard guard(self);
    const ResultSpec spec = LossChecks<Loss>::backward_out(grad_output, self, target, reduction, s..., result);
    into(result, spec, grad_output, self, target, reduction, s...);
    return result;
  }
};

// The into kernels of a result summed to a smaller shape (KL's target gradient) start here: true when no
// kernel is needed, because out is empty or the broadcast shape is (then out is zero-filled: the sum over
// nothing is 0; aclnn would leave it unwritten).
inline bool empty_sum_into(at::Tensor& out, const ResultSpec& spec) {
  if (out.numel() == 0) return true;
  if (numel_of(spec.broadcast_shape) != 0) return false;
  out.zero_();
  return true;
}

// Registers the kernels of `Loss`'s three ops at one dispatch key: its forward, its backward and the
// backward's out= overload.
template <typename Loss, auto forward, auto backward, auto backward_out>
void impl_ops(torch::Library& m) {
  m.impl(Loss::decl.forward, forward);
  m.impl(Loss::decl.backward, backward);
  m.impl(out_overload_name(Loss::decl).c_str(), backward_out);
}

// Registers a backend's kernels for `Loss`: `forward`, and the backward's functional and out= kernels made
// from `into`.
template <typename Loss, auto forward, auto into, typename Guard = NoDeviceGuard>
void impl_loss(torch::Library& m) {
  using Kernels = BackendKernels<Loss, into, Guard>;
  impl_ops<Loss, forward, &Kernels::functional, &Kernels::out>(m);
}

// A row loss's three kernels on one backend (LossKind::Rows), made from the backend's math after the op's
// checks: `Math` has
//   static at::Tensor forward(Loss, const RowSpec&, const RowCall&);
//   static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_grads(Loss, const RowSpec&,
//       const RowCall&, std::array<bool, 2> mask);
//   static std::tuple<at::Tensor, at::Tensor> backward(Loss, const RowSpec&, const RowCall&,
//       const at::Tensor& grad_output, std::array<bool, 2> mask);
template <typename Loss, typename Math, typename Inputs = RowInputTypes<Loss>, typename Scalars = RowScalarTypes<Loss>>
struct RowBackendKernels;

template <typename Loss, typename Math, typename... I, typename... S>
struct RowBackendKernels<Loss, Math, std::tuple<I...>, std::tuple<S...>> {
  static constexpr const LossDecl& d = Loss::decl;

  static at::Tensor forward(
      const at::Tensor& student, const at::Tensor& teacher, I... i, const std::optional<at::Tensor>& labels,
      int64_t reduction, S... s, int64_t ignore_index) {
    const RowCall c =
        row_call<Loss>(student, teacher, row_inputs(i...), labels, reduction, row_scalars(s...), ignore_index);
    return Math::forward(Loss{}, row_forward_spec<int64_t>(d, d.forward, c), c);
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_grads(
      const at::Tensor& student, const at::Tensor& teacher, I... i, const std::optional<at::Tensor>& labels,
      int64_t reduction, S... s, int64_t ignore_index, std::array<bool, 2> mask) {
    const RowCall c =
        row_call<Loss>(student, teacher, row_inputs(i...), labels, reduction, row_scalars(s...), ignore_index);
    return Math::with_grads(Loss{}, row_with_grads_spec<int64_t>(d, c), c, mask);
  }

  static std::tuple<at::Tensor, at::Tensor> backward(
      const at::Tensor& grad_output, const at::Tensor& student, const at::Tensor& teacher, I... i,
      const std::optional<at::Tensor>& labels, int64_t reduction, S... s, int64_t ignore_index,
      std::array<bool, 2> mask) {
    const RowCall c =
        row_call<Loss>(student, teacher, row_inputs(i...), labels, reduction, row_scalars(s...), ignore_index);
    return Math::backward(Loss{}, row_backward_spec<int64_t>(d, grad_output, c), c, grad_output, mask);
  }
};

// Registers a backend's kernels of a row loss's three ops, made from its math.
template <typename Loss, typename Math>
void impl_row_loss(torch::Library& m) {
  using Kernels = RowBackendKernels<Loss, Math>;
  m.impl(Loss::decl.forward, &Kernels::forward);
  m.impl(Loss::decl.with_grads, &Kernels::with_grads);
  m.impl(Loss::decl.backward, &Kernels::backward);
}

// A backend's kernels of a row loss's linear form's two ops, from `Impl`, which takes their arguments as one
// LinearCall (the op's name for its messages, and output_mask: none for the forward):
//   static LinearResults run(const char* op, const LinearCall&, std::array<bool, 6> mask);
// The forward returns its first three results and the entropy (the last).
template <typename Loss, typename Impl, typename Scalars = RowScalarTypes<Loss>>
struct LinearBackendKernels;

template <typename Loss, typename Impl, typename... S>
struct LinearBackendKernels<Loss, Impl, std::tuple<S...>> {
  static constexpr const LinearForm& f = Loss::decl.linear;

  static LinearResults run(
      const char* op, const at::Tensor& student_input, const at::Tensor& student_weight,
      const at::Tensor& teacher_input, const at::Tensor& teacher_weight, const std::optional<at::Tensor>& labels,
      const std::optional<at::Tensor>& student_bias, const std::optional<at::Tensor>& teacher_bias,
      c10::string_view reduction, const RowScalars& scalars, int64_t ignore_index, double weight_hard,
      double weight_soft, std::optional<int64_t> chunk_size, bool return_parts, bool return_entropy,
      std::array<bool, 6> mask) {
    return Impl::run(
        op,
        {{&student_input, &teacher_input}, {&student_weight, &teacher_weight}, {&student_bias, &teacher_bias},
         labels, reduction, {&Loss::decl.rows, scalars}, ignore_index, weight_hard, weight_soft, chunk_size,
         return_parts, return_entropy},
        mask);
  }

  static LinearResults with_grads(
      const at::Tensor& student_input, const at::Tensor& student_weight, const at::Tensor& teacher_input,
      const at::Tensor& teacher_weight, const std::optional<at::Tensor>& labels,
      const std::optional<at::Tensor>& student_bias, const std::optional<at::Tensor>& teacher_bias,
      c10::string_view reduction, S... s, int64_t ignore_index, double weight_hard, double weight_soft,
      std::optional<int64_t> chunk_size, bool return_parts, bool return_entropy, std::array<bool, 6> mask) {
    return run(f.with_grads, student_input, student_weight, teacher_input, teacher_weight, labels, student_bias,
               teacher_bias, reduction, row_scalars(s...), ignore_index, weight_hard, weight_soft, chunk_size,
               return_parts, return_entropy, mask);
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> forward(
      const at::Tensor& student_input, const at::Tensor& student_weight, const at::Tensor& teacher_input,
      const at::Tensor& teacher_weight, const std::optional<at::Tensor>& labels,
      const std::optional<at::Tensor>& student_bias, const std::optional<at::Tensor>& teacher_bias,
      c10::string_view reduction, S... s, int64_t ignore_index, double weight_hard, double weight_soft,
      std::optional<int64_t> chunk_size, bool return_parts, bool return_entropy) {
    auto r = run(f.forward, student_input, student_weight, teacher_input, teacher_weight, labels, student_bias,
                 teacher_bias, reduction, row_scalars(s...), ignore_index, weight_hard, weight_soft, chunk_size,
                 return_parts, return_entropy, {});
    return {std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<10>(r)};
  }
};

// Registers them.
template <typename Loss, typename Impl>
void impl_linear(torch::Library& m) {
  m.impl(Loss::decl.linear.forward, &LinearBackendKernels<Loss, Impl>::forward);
  m.impl(Loss::decl.linear.with_grads, &LinearBackendKernels<Loss, Impl>::with_grads);
}

}  // namespace npu_loss
