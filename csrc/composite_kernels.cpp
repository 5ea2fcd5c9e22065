// The composite fallback's registrations: CompositeExplicitAutograd kernels for every op (the math of
// composite.cpp, plus the out= overloads writing it into out), and the Functionalize kernels of the out=
// overloads. _C only; _C_npu calls the math directly where a chip falls back.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "core/backend.h"
#include "core/checks.h"
#include "core/composite.h"
#include "ops.h"

namespace npu_loss {
namespace {

// The into kernel (core/backend.h) of a composite op: its result, copied into out.
template <auto op, typename = decltype(op)>
struct CopyInto;

template <auto op, typename... Scalars>
struct CopyInto<op, at::Tensor (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&, Scalars...)> {
  static void into(
      at::Tensor& out, const ResultSpec&, const at::Tensor& grad_output, const at::Tensor& self,
      const at::Tensor& target, Scalars... scalars) {
    out.copy_(op(grad_output, self, target, scalars...));
  }
};

// The composite's math is its own functional kernel (it runs the checks itself); the out= overload runs the
// out= checks and copies the math's result into out.
template <const auto& loss, auto forward, auto backward>
void impl_composite(torch::Library& m) {
  using Ops = std::remove_cvref_t<decltype(loss)>;
  m.impl(loss.forward, forward);
  m.impl(loss.backward, backward);
  m.impl(loss.backward_out, &BackendKernels<&CopyInto<backward>::into>::template out<Ops::check_out>);
}

// Functionalize kernels: PyTorch does not functionalize a custom op whose result aliases an input, so
// each out= overload is rewritten as its functional op (through `handle`) plus a copy into out (both
// functionalizable), after the out tensor's shape and dtype rules on the result.
template <const auto& loss, auto handle, typename = decltype(handle)>
struct FunctionalizeOut;

template <const auto& loss, typename... Scalars,
          const c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                                                    Scalars...)>& (*handle)()>
struct FunctionalizeOut<loss, handle,
                        const c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&,
                                                                  const at::Tensor&, int64_t, Scalars...)>& (*)()> {
  static at::Tensor& call(
      const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
      Scalars... scalars, at::Tensor& out) {
    const auto result = handle().call(grad_output, self, target, reduction, scalars...);
    TORCH_CHECK_TYPE(
        loss.out_dtype != OutDtype::EqualsResult || out.scalar_type() == result.scalar_type(), loss.backward, ": ",
        loss.out_arg, " must have dtype ", c10::getDtypeNames(result.scalar_type()).first,
        " (the result's dtype), got ", c10::getDtypeNames(out.scalar_type()).first);
    TORCH_CHECK(
        out.sym_sizes() == result.sym_sizes(), loss.backward, ": ", loss.out_arg, " must have shape ",
        result.sym_sizes(), " (the result's shape), got ", out.sym_sizes());
    out.copy_(result);
    return out;
  }
};

template <const auto& loss, auto handle>
void impl_functionalize(torch::Library& m) {
  m.impl(loss.backward_out, &FunctionalizeOut<loss, handle>::call);
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, CompositeExplicitAutograd, m) {
  impl_composite<kSmoothL1Loss, &composite::smooth_l1_loss, &composite::smooth_l1_loss_backward>(m);
  impl_composite<kL1Loss, &composite::l1_loss, &composite::l1_loss_backward>(m);
  impl_composite<kKlDiv, &composite::kl_div, &composite::kl_div_target_backward>(m);
  impl_composite<kHuberLoss, &composite::huber_loss, &composite::huber_loss_backward>(m);
}

TORCH_LIBRARY_IMPL(npu_loss, Functionalize, m) {
  impl_functionalize<kSmoothL1Loss, ops::smooth_l1_loss_backward>(m);
  impl_functionalize<kL1Loss, ops::l1_loss_backward>(m);
  impl_functionalize<kKlDiv, ops::kl_div_target_backward>(m);
  impl_functionalize<kHuberLoss, ops::huber_loss_backward>(m);
}

}  // namespace npu_loss
