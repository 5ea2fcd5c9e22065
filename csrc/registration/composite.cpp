// The composite fallback's registrations, for every loss: CompositeExplicitAutograd kernels for its ops
// (the math of composite/math.cpp, plus the out= overload writing it into out, or a row loss's of
// composite/rows.cpp), and the Functionalize kernel of an elementwise loss's out= overload. _C only; _C_npu
// calls the math directly where a chip falls back.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../core/backend.h"
#include "../core/checks.h"
#include "../core/ops.h"
#include "../composite/math.h"
#include "../composite/rows.h"

namespace npu_loss {
namespace {

template <typename Loss, typename... S>
struct CompositeOut {
  // The into kernel (core/backend.h) of the composite: its result, copied into out.
  static void into(
      at::Tensor& out, const ResultSpec&, const at::Tensor& grad_output, const at::Tensor& self,
      const at::Tensor& target, int64_t reduction, S... s) {
    out.copy_(Composite<Loss>::backward(grad_output, self, target, reduction, s...));
  }

  // The Functionalize kernel: PyTorch does not functionalize a custom op whose result aliases an input, so
  // the out= overload is rewritten as its functional op plus a copy into out (both functionalizable), after
  // the out tensor's shape and dtype rules on the result.
  static at::Tensor& functionalize(
      const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction, S... s,
      at::Tensor& out) {
    constexpr const LossDecl& d = Loss::decl;
    const auto result = ops::backward<Loss>().call(grad_output, self, target, reduction, s...);
    TORCH_CHECK_TYPE(
        d.out_dtype != OutDtype::EqualsResult || out.scalar_type() == result.scalar_type(), d.backward, ": ",
        d.out_arg, " must have dtype ", c10::getDtypeNames(result.scalar_type()).first,
        " (the result's dtype), got ", c10::getDtypeNames(out.scalar_type()).first);
    TORCH_CHECK(
        out.sym_sizes() == result.sym_sizes(), d.backward, ": ", d.out_arg, " must have shape ",
        result.sym_sizes(), " (the result's shape), got ", out.sym_sizes());
    out.copy_(result);
    return out;
  }
};

// A row loss's composite kernels: its checks (core/checks.h), then its ATen-op math in chunks of rows
// (composite/rows.h). The NPU runs them too, until it has kernels of its own.
template <typename Loss>
struct RowCompositeKernels {
  static constexpr const LossDecl& d = Loss::decl;

  static at::Tensor forward(
      const at::Tensor& student, const at::Tensor& teacher, const std::optional<at::Tensor>& labels,
      int64_t reduction, double first, double second, int64_t index) {
    row_forward_spec<int64_t>(d, d.forward, student, teacher, labels, reduction, first, second);
    return composite::forward(Loss{}, {student, teacher, labels, reduction, first, second, index});
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor> with_grads(
      const at::Tensor& student, const at::Tensor& teacher, const std::optional<at::Tensor>& labels,
      int64_t reduction, double first, double second, int64_t index, std::array<bool, 2> mask) {
    row_with_grads_spec<int64_t>(d, student, teacher, labels, reduction, first, second);
    return composite::with_grads(Loss{}, {student, teacher, labels, reduction, first, second, index}, mask);
  }

  static std::tuple<at::Tensor, at::Tensor> backward(
      const at::Tensor& grad_output, const at::Tensor& student, const at::Tensor& teacher,
      const std::optional<at::Tensor>& labels, int64_t reduction, double first, double second, int64_t index,
      std::array<bool, 2> mask) {
    row_backward_spec<int64_t>(d, grad_output, student, teacher, labels, reduction, first, second);
    return composite::backward(Loss{}, {student, teacher, labels, reduction, first, second, index}, grad_output, mask);
  }
};

}  // namespace

// The composite's math is its own functional kernel (it runs the checks itself); the out= overload runs the
// out= checks and copies the math's result into out.
TORCH_LIBRARY_IMPL(npu_loss, CompositeExplicitAutograd, m) {
  for_each_elementwise_loss([&]<typename Loss>() {
    using Out = BackendKernels<Loss, &WithScalars<CompositeOut, Loss>::into>;
    impl_ops<Loss, &Composite<Loss>::forward, &Composite<Loss>::backward, &Out::out>(m);
  });
  for_each_row_loss([&]<typename Loss>() {
    using Kernels = RowCompositeKernels<Loss>;
    m.impl(Loss::decl.forward, &Kernels::forward);
    m.impl(Loss::decl.with_grads, &Kernels::with_grads);
    m.impl(Loss::decl.backward, &Kernels::backward);
  });
}

TORCH_LIBRARY_IMPL(npu_loss, Functionalize, m) {
  for_each_elementwise_loss([&]<typename Loss>() {
    m.impl(out_overload_name(Loss::decl).c_str(), &WithScalars<CompositeOut, Loss>::functionalize);
  });
}

}  // namespace npu_loss
