// The Meta kernels of every loss's ops: its checks (core/checks.h) on SymInt sizes, then an empty result of
// the checked shape, dtype and memory format (the out= overload returns its out tensor). They serve tensors
// on the meta device and FakeTensorMode, which runs an op's Meta kernel when it has no Python fake kernel:
// so torch.compile (dynamic shapes included), torch.export and opcheck validate and shape every op by the
// same rules, with the same exceptions and messages, as the real kernels. Each checks before it reads an
// argument (an undefined one has no options()). _C only: a registration in the static library would be
// dropped by the linker.
#include <torch/library.h>

#include "../core/backend.h"
#include "../core/checks.h"
#include "../core/ops.h"

namespace npu_loss {
namespace {

template <typename Loss, typename... S>
struct MetaKernels {
  using Checks = LossChecks<Loss, c10::SymInt>;

  static at::Tensor forward(const at::Tensor& self, const at::Tensor& target, int64_t reduction, S... s) {
    const auto spec = Checks::forward(self, target, reduction, s...);  // before self.options(): self may be None
    return empty_result(spec, self.options());
  }

  // The result's dtype and shape come from the checks, its device is every input's.
  static at::Tensor backward(
      const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction, S... s) {
    const auto spec = Checks::backward(grad_output, self, target, reduction, s...);
    return empty_result(spec, self.options());
  }

  static at::Tensor& backward_out(
      const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction, S... s,
      at::Tensor& out) {
    Checks::backward_out(grad_output, self, target, reduction, s..., out);
    return out;
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, Meta, m) {
  for_each_elementwise_loss([&]<typename Loss>() {
    using Kernels = WithScalars<MetaKernels, Loss>;
    impl_ops<Loss, &Kernels::forward, &Kernels::backward, &Kernels::backward_out>(m);
  });
}

}  // namespace npu_loss
