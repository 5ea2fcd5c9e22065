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
#include "../composite/linear.h"
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

// A row loss's composite math (composite/rows.h), in chunks of rows, behind its checks (core/backend.h's
// RowBackendKernels). The NPU runs it on the chips its aclnn path does not serve (chips/paths.h).
struct CompositeRows {
  template <typename Loss>
  static at::Tensor forward(Loss, const RowSpec&, const RowCall& c) {
    return composite::forward(Loss{}, c);
  }
  template <typename Loss>
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_grads(
      Loss, const RowSpec&, const RowCall& c, std::array<bool, 2> mask) {
    return composite::with_grads(Loss{}, c, mask);
  }
  template <typename Loss>
  static std::tuple<at::Tensor, at::Tensor> backward(
      Loss, const RowSpec&, const RowCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask) {
    return composite::backward(Loss{}, c, grad_output, mask);
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
  composite::impl_row_losses<CompositeRows, composite::OpStep>(m);
}

TORCH_LIBRARY_IMPL(npu_loss, Functionalize, m) {
  for_each_elementwise_loss([&]<typename Loss>() {
    m.impl(out_overload_name(Loss::decl).c_str(), &WithScalars<CompositeOut, Loss>::functionalize);
  });
}

}  // namespace npu_loss
