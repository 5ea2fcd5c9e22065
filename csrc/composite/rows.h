// The row losses made of ATen ops (losses.h's LossKind::Rows: the distillation family), after the same checks
// as every other backend: the fallback on every device without kernels of its own (the NPU, for now), the
// differentiable form double backward and forward-mode AD go through, and what vmap runs. rows.cpp has the
// formulas (docs/semantics.md, "Distillation").
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <tuple>

#include "../core/checks.h"
#include "../losses.h"

namespace npu_loss::composite {


// In chunks of rows (no temporary of N x V: chunk_rows says how many rows a chunk holds), as the ops' kernels:
// the forward, the forward with the gradients of its reduced result, and the backward op.
// Each told apart by the loss's declaration type (losses.h) as its first argument, as math.h's.
at::Tensor forward(GeneralizedJsd, const RowCall& c);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_grads(
    GeneralizedJsd, const RowCall& c, std::array<bool, 2> mask);
std::tuple<at::Tensor, at::Tensor> backward(
    GeneralizedJsd, const RowCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask);

// The same results from whole tensors, every step an ATen op autograd and the functorch transforms see
// through: for double backward, forward-mode AD and vmap.
// Each runs the op's checks first (on symbolic sizes too), as the kernels do: vmap reaches them directly.
at::Tensor forward_differentiable(GeneralizedJsd, const RowCall& c);
std::tuple<at::Tensor, at::Tensor> backward_differentiable(
    GeneralizedJsd, const RowCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask);
// The forward with gradients' four results (the row scales are ones: nothing is stored in float16 here).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_grads_differentiable(
    GeneralizedJsd, const RowCall& c, std::array<bool, 2> mask);

}  // namespace npu_loss::composite
