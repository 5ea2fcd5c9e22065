// The row losses made of ATen ops (losses.h's LossKind::Rows: the distillation family), after the same checks
// as every other backend: what a device without row kernels of its own runs (the NPU on the chips its aclnn path
// does not serve, chips/paths.h), the differentiable form double backward and forward-mode AD go through, and what vmap runs. rows.cpp has the
// formulas (docs/semantics.md, "Distillation").
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "../core/checks.h"
#include "../losses.h"

namespace npu_loss::composite {

// ---- the chunking every backend without a row kernel shares (the composite below; the NPU's aclnn path) ----

// The result dtype of a call: the promotion of the two logits' dtypes.
c10::ScalarType result_dtype(const RowCall& c);

// The student's and the teacher's rows as pairs of (rows, V) views, in row order (one pair when the leading
// dims of both collapse).
void row_blocks(const at::Tensor& a, const at::Tensor& b, std::vector<std::pair<at::Tensor, at::Tensor>>& out);

// The rows of a chunk: a byte budget for the chunk's float32 temporaries (`temporaries` rows of V each, the most
// a chunk's formulas hold alive at once), an eighth of one N x V tensor of the logits' dtype and at most
// kChunkMaxBytes, and at least one row (so for N below about temporaries * 4 * 8 / itemsize rows, one row's
// temporaries, more than the eighth).
inline constexpr int64_t kChunkMaxBytes = int64_t{256} << 20;

// The composite's float32 (rows, V) tensors alive at once in a chunk's formulas: the mixture with both gradients
// holds about 16 (the chunk's logits, s, t, p, q, d and its softplus parts, the terms, the gradients' products);
// 20 leaves room for the allocator's rounding.
inline constexpr int64_t kCompositeTemporaries = 20;
int64_t chunk_rows(int64_t rows, int64_t vocab, int64_t itemsize, int64_t temporaries);

// The rows kept: labels != ignore_index over the flattened leading dims, compared as int64 (as the CPU kernels
// compare them: an unsigned label never wraps onto a negative index), or undefined without labels.
at::Tensor keep_mask(const std::optional<at::Tensor>& labels, int64_t ignore_index);

// The count of the rows kept before each row, from one copy of the mask to the host: where 'none' puts each
// chunk's kept rows.
struct KeptRows {
  std::vector<int64_t> before;  // before[r]: the rows kept among rows [0, r); before.back(), all of them

  explicit KeptRows(const at::Tensor& keep);
  int64_t total() const { return before.back(); }
  int64_t between(int64_t first, int64_t end) const { return before[end] - before[first]; }
};

// The rows of a (rows, V) tensor where a bool (rows,) mask is true.
at::Tensor rows_where(const at::Tensor& t, const at::Tensor& keep);

// The leading shape of (..., V) logits: the shape of the row scales.
c10::IntArrayRef leading_shape(const at::Tensor& logits);

// A gradient the mask asks for, of its logits' shape and dtype, or the empty tensor the ops return instead.
at::Tensor gradient_or_empty(const at::Tensor& logits, bool wanted);

// Rows [first, first + n) of a (..., V) result viewed as (rows, V).
at::Tensor rows_of(const at::Tensor& t, int64_t first, int64_t n);

// The forward's result for empty logits (no row, or V = 0): 'none' empty, 'sum' 0, 'mean' NaN.
at::Tensor empty_forward(const RowCall& c, const at::Tensor& keep);

// float16's row scales on a chunk's gradients (rows `first` .. first + n of the call; isa.h's RowBatch, row_scale):
// each row of the gradients the mask asks for times 2^power, from the rows' largest gradient on either side, and
// row_scale's rows set to 2^-power.
void scale_chunk_rows(at::Tensor& gs, at::Tensor& gt, std::array<bool, 2> mask, const at::Tensor& row_scale,
                      int64_t first, int64_t n);

// row_power of the CPU kernels (cpu/row_kernels.h) on a tensor of the rows' largest gradients: 14 minus the
// exponent of each (bound < 2^exponent), 0 for a row whose bound is 0 or not finite, within [-60, 60].
at::Tensor row_powers(const at::Tensor& bound);

// ---- what the members' formulas share ----

// The dtype the formulas compute in: float64 where either tensor is, else float32.
c10::ScalarType compute_dtype(const at::Tensor& a, const at::Tensor& b);

// A side's transformed logits x and dx/dz: z * scale, then softcap * tanh(x / softcap) where one is given
// (TRL's order); dx/dz is scale * (1 - tanh^2), or the scale alone (undefined at 1: z itself, the same bits).
std::pair<at::Tensor, at::Tensor> transformed(const at::Tensor& z, const DeclaredScalars::Transform& tr);

// x's rows where `keep` (a (rows,) bool tensor) is true, 0 elsewhere; x itself without a mask. A dropped row is
// zeroed, never multiplied by 0: a NaN or an infinity there must not reach a sum.
at::Tensor masked(const at::Tensor& x, const at::Tensor& keep);

// ---- the composite ----


// In chunks of rows (no temporary of N x V: chunk_rows says how many rows a chunk holds), as the ops' kernels:
// the forward, the forward with the gradients of its reduced result, and the backward op. with_grads takes the
// rows of a chunk where its caller has sized them already (the linear form's step on the NPU; 0: chunk_rows's).
// Each told apart by the loss's declaration type (losses.h) as its first argument, as math.h's.
at::Tensor forward(GeneralizedJsd, const RowCall& c);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_grads(
    GeneralizedJsd, const RowCall& c, std::array<bool, 2> mask, int64_t rows_per_chunk = 0);
std::tuple<at::Tensor, at::Tensor> backward(
    GeneralizedJsd, const RowCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask);

at::Tensor forward(SparseJsd, const RowCall& c);
// The sparse JSD's terms over a chunk's support, for a backend that makes the log-softmax and the gather its own
// way (the NPU's aclnn path), from (n, K) tensors of the compute dtype: the student's log-probabilities at the
// support s_raw (-inf where off), the teacher's log-probabilities and the support's mask. The entries' values f
// (n, E) and, where `w` is defined (the entries' weights: a 0-dim tensor or (n, E)), the gradients of
// sum(w * f) w.r.t. s_raw (g) and the teacher's (gt), as `mask` asks, 0 where off.
struct SupportTerms {
  at::Tensor f, g, gt;
};
SupportTerms sparse_support_terms(const at::Tensor& s_raw, const at::Tensor& teacher, const at::Tensor& support_on,
                                  const DeclaredScalars& scalars, const at::Tensor& w, std::array<bool, 2> mask);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_grads(
    SparseJsd, const RowCall& c, std::array<bool, 2> mask, int64_t rows_per_chunk = 0);
std::tuple<at::Tensor, at::Tensor> backward(
    SparseJsd, const RowCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask);

// The same results from whole tensors, every step an ATen op autograd and the functorch transforms see
// through: for double backward, forward-mode AD and vmap.
// Each runs the op's checks first (on symbolic sizes too), as the kernels do: vmap reaches them directly.
at::Tensor forward_differentiable(GeneralizedJsd, const RowCall& c);
std::tuple<at::Tensor, at::Tensor> backward_differentiable(
    GeneralizedJsd, const RowCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask);
// The forward with gradients' four results (the row scales are ones: nothing is stored in float16 here).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_grads_differentiable(
    GeneralizedJsd, const RowCall& c, std::array<bool, 2> mask);

at::Tensor forward_differentiable(SparseJsd, const RowCall& c);
std::tuple<at::Tensor, at::Tensor> backward_differentiable(
    SparseJsd, const RowCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_grads_differentiable(
    SparseJsd, const RowCall& c, std::array<bool, 2> mask);

}  // namespace npu_loss::composite
