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
// stored gradients' float32 scales, one per side.
template <typename Loss>
struct LinearMeta {
  static constexpr const LossDecl& d = Loss::decl;

  static ops::LinearSignatures::Results with_grads(
      const at::Tensor& student_input, const at::Tensor& student_weight, const at::Tensor& teacher_input,
      const at::Tensor& teacher_weight, const std::optional<at::Tensor>& labels,
      const std::optional<at::Tensor>& student_bias, const std::optional<at::Tensor>& teacher_bias,
      c10::string_view reduction, double beta, double temperature, int64_t, double weight_hard, double weight_soft,
      std::optional<int64_t> chunk_size, bool, std::array<bool, 6> mask) {
    const auto spec = linear_spec<c10::SymInt>(
        d, d.linear.with_grads, student_input, student_weight, teacher_input, teacher_weight, labels, student_bias,
        teacher_bias, reduction, beta, temperature, weight_hard, weight_soft, chunk_size);
    const auto scalar = [&] { return at::empty({}, student_input.options().dtype(spec.dtype)); };
    // The inputs' and biases' gradients are new contiguous tensors, the weights' keep the weights' layout (as
    // zeros_like), as composite/linear.cpp makes them.
    const auto grad = [&](bool wanted, const at::Tensor& like, const at::Tensor& input, bool layout_of_like) {
      if (!wanted || !like.defined()) return at::empty({0}, input.options());
      return layout_of_like ? at::empty_like(like) : at::empty_symint(like.sym_sizes(), like.options());
    };
    const at::Tensor none;
    return {scalar(), scalar(), scalar(),
            grad(mask[0], student_input, student_input, false), grad(mask[1], student_weight, student_weight, true),
            grad(mask[2], student_bias.value_or(none), student_input, false),
            grad(mask[3], teacher_input, teacher_input, false), grad(mask[4], teacher_weight, teacher_weight, true),
            grad(mask[5], teacher_bias.value_or(none), teacher_input, false),
            at::empty({2}, student_input.options().dtype(at::kFloat))};
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(
      const at::Tensor& student_input, const at::Tensor& student_weight, const at::Tensor& teacher_input,
      const at::Tensor& teacher_weight, const std::optional<at::Tensor>& labels,
      const std::optional<at::Tensor>& student_bias, const std::optional<at::Tensor>& teacher_bias,
      c10::string_view reduction, double beta, double temperature, int64_t, double weight_hard, double weight_soft,
      std::optional<int64_t> chunk_size, bool) {
    const auto spec = linear_spec<c10::SymInt>(
        d, d.linear.forward, student_input, student_weight, teacher_input, teacher_weight, labels, student_bias,
        teacher_bias, reduction, beta, temperature, weight_hard, weight_soft, chunk_size);
    const auto options = student_input.options().dtype(spec.dtype);
    return {at::empty({}, options), at::empty({}, options), at::empty({}, options)};
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, Meta, m) {
  for_each_elementwise_loss([&]<typename Loss>() {
    using Kernels = WithScalars<MetaKernels, Loss>;
    impl_ops<Loss, &Kernels::forward, &Kernels::backward, &Kernels::backward_out>(m);
  });
  for_each_row_loss([&]<typename Loss>() {
    if constexpr (Loss::decl.linear.forward != nullptr) {
      m.impl(Loss::decl.linear.forward, &LinearMeta<Loss>::forward);
      m.impl(Loss::decl.linear.with_grads, &LinearMeta<Loss>::with_grads);
    }
  });
}

}  // namespace npu_loss
