// The Meta kernels of every loss's ops: its checks (core/checks.h) on SymInt sizes, then an empty result of
// the checked shape, dtype and memory format (the out= overload returns its out tensor). They serve tensors
// on the meta device and FakeTensorMode, which runs an op's Meta kernel when it has no Python fake kernel:
// so torch.compile (dynamic shapes included), torch.export and opcheck validate and shape every op by the
// same rules, with the same exceptions and messages, as the real kernels. Each checks before it reads an
// argument (an undefined one has no options()). _C only: a registration in the static library would be
// dropped by the linker.
#include <ATen/ATen.h>
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

// A row loss's linear form: its checks on SymInt sizes, then the results (losses.h's LinearForm): three 0-dim
// tensors of the result's dtype, each gradient asked for of its input's shape (an empty tensor otherwise), the
// stored gradients' float32 scales, one per side, and the student's entropy (float32, of the leading shape, where
// asked for; else empty).
template <typename Loss>
struct LinearMeta {
  static LinearResults run(const char* op, const LinearCall& c, std::array<bool, 6> mask) {
    const auto spec = linear_spec<c10::SymInt>(Loss::decl, op, c);
    mask = linear_mask(Loss::decl.rows, mask);
    const at::Tensor& input = *c.input[0];
    const auto scalar = [&] { return at::empty({}, input.options().dtype(spec.dtype)); };
    // The inputs' and biases' gradients are new contiguous tensors, the weights' keep the weights' layout (as
    // zeros_like), as composite/linear.cpp makes them.
    const auto grad = [&](bool wanted, const at::Tensor& like, const at::Tensor& of, bool layout_of_like) {
      if (!wanted || !like.defined()) return at::empty({0}, of.options());
      return layout_of_like ? at::empty_like(like) : at::empty_symint(like.sym_sizes(), like.options());
    };
    const at::Tensor none;
    const auto side = [&](int s, int m) {
      const at::Tensor& x = *c.input[s];
      return std::make_tuple(grad(mask[m], x, x, false), grad(mask[m + 1], *c.weight[s], *c.weight[s], true),
                             grad(mask[m + 2], c.bias[s]->value_or(none), x, false));
    };
    const auto [gxs, gws, gbs] = side(0, 0);
    const auto [gxt, gwt, gbt] = side(1, 3);
    const auto floats = input.options().dtype(at::kFloat);
    return {scalar(), scalar(), scalar(), gxs, gws, gbs, gxt, gwt, gbt, at::empty({2}, floats),
            c.return_entropy ? at::empty_symint(spec.leading, floats) : at::empty({0}, floats)};
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, Meta, m) {
  for_each_elementwise_loss([&]<typename Loss>() {
    using Kernels = WithScalars<MetaKernels, Loss>;
    impl_ops<Loss, &Kernels::forward, &Kernels::backward, &Kernels::backward_out>(m);
  });
  for_each_row_loss([&]<typename Loss>() {
    if constexpr (Loss::decl.linear.forward != nullptr) impl_linear<Loss, LinearMeta<Loss>>(m);
  });
}

}  // namespace npu_loss
