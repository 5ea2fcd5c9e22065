// The row losses made of ATen ops (losses.h's LossKind::Rows: the distillation family), after the same checks
// as every other backend: the fallback on every device without kernels of its own (the NPU, for now), the
// differentiable form double backward and forward-mode AD go through, and what vmap runs. rows.cpp has the
// formulas (docs/semantics.md, "Distillation").
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <tuple>

#include "../losses.h"

namespace npu_loss::composite {

// The arguments of one call of a row loss's op, checked.
struct RowCall {
  const at::Tensor& student;
  const at::Tensor& teacher;
  const std::optional<at::Tensor>& labels;
  int64_t reduction;
  double beta, temperature;
  int64_t ignore_index;
};

// In chunks of rows (no temporary of N x V: chunk_rows says how many rows a chunk holds), as the ops' kernels:
// the forward, the forward with the gradients of its reduced result, and the backward op.
// Each told apart by the loss's declaration type (losses.h) as its first argument, as math.h's.
at::Tensor forward(GeneralizedJsd, const RowCall& c);
std::tuple<at::Tensor, at::Tensor, at::Tensor> with_grads(GeneralizedJsd, const RowCall& c, std::array<bool, 2> mask);
std::tuple<at::Tensor, at::Tensor> backward(
    GeneralizedJsd, const RowCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask);

// The same results from whole tensors, every step an ATen op autograd and the functorch transforms see
// through: for double backward, forward-mode AD and vmap.
at::Tensor forward_differentiable(GeneralizedJsd, const RowCall& c);
std::tuple<at::Tensor, at::Tensor> backward_differentiable(
    GeneralizedJsd, const RowCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask);

// The rows of a chunk: a byte budget for the chunk's float32 temporaries (about a dozen rows of V each),
// an eighth of one N x V tensor of the logits' dtype and at most 256 MiB, and at least one row.
int64_t chunk_rows(int64_t rows, int64_t vocab, int64_t itemsize);

}  // namespace npu_loss::composite
