// A row loss's linear form (losses.h's LinearForm: the fused linear JSD), on every backend: the rows taken in
// chunks; each chunk's logits made with at::mm / at::addmm into buffers allocated once per call, handed to the
// row loss's forward with gradients (a RowStep: the CPU kernel writing the gradients over the logits, or the
// op itself through the dispatcher, the NPU's aclnn path), the hard loss (cross entropy on the student's
// untempered logits) added, and the logits' gradients turned into the inputs', the weights' and the biases'
// before the next chunk. The N x V logits are never made. docs/semantics.md, "The fused linear JSD", has the
// formulas and the memory.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <tuple>

#include "../core/backend.h"
#include "../core/checks.h"
#include "../core/ops.h"
#include "../core/reduction.h"
#include "../losses.h"

namespace npu_loss::composite {

// What a step that fuses them (RowStep::fuses) also does to a chunk, in the same passes over its logits: the
// gradients times grad_scale (the soft loss's factor and the student's stored scale), the teacher's times
// teacher_scale more (the ratio of the two sides' stored scales), and, with `hard`, the cross entropy of the
// student's untempered logits at the labels: its sum over the kept rows (in row order, into hard_sum) and,
// where the student's gradient is made, hard_weight * (softmax - one_hot) added to it. The gradients are then
// stored as they are, without the row loss's own float16 row scales. With `entropy` (host memory), each kept
// row's entropy of the student's tempered distribution, -sum(p * log p), at entropy[row of the step's call]
// (dropped rows untouched). Such a step also takes the logit transform from the call's scalars (the driver
// passes the chunk's logits untransformed): the hard loss and the entropy see the transformed logits, and each
// gradient is made w.r.t. the logits themselves, in the passes that read them (no slope kept beside them).
struct RowExtras {
  double grad_scale = 1;
  double teacher_scale = 1;
  bool hard = false;
  double hard_weight = 0;
  double hard_sum = 0;  // out
  float* entropy = nullptr;
};

// How a side's products are made: ATen's at::addmm / at::mm (every device; on the CPU where torch has kernels
// of its own for the dtype), the CPU's BLAS over blocks of the vocabulary (float32, float64), or the CPU's
// float32 blocks (bfloat16, float16 without oneDNN's kernels for them). cpu/products.h has the CPU's.
enum class ProductKind : uint8_t { Aten, VocabBlocks, Float32Blocks };

// A side's products with its lm_head (weight, bias): the logits of a chunk's rows, and the gradients from
// the logits' gradient. One per side per call, made for the call's chunk rows.
class SideProducts {
 public:
  virtual ~SideProducts() = default;
  // out = xc @ w.T (+ b).
  virtual void logits(at::Tensor& out, const at::Tensor& xc) = 0;
  // dx = g @ w (the chunk's rows of the input's gradient) and dw = g.T @ xc, or dw += g.T @ xc unless `first`;
  // each undefined where not wanted.
  virtual void grads(const at::Tensor& g, const at::Tensor& xc, at::Tensor dx, at::Tensor dw, bool first) = 0;
};

// x @ w.T (+ b) into `out`, through addmm (beta 0 without a bias: out's contents are ignored): on CPU,
// at::mm_out into a buffer with a transposed weight makes a temporary of the buffer's size first (measured,
// bfloat16 and float32), addmm_out does not.
void logits_into(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b);

// ATen's products.
std::unique_ptr<SideProducts> aten_products(const at::Tensor& w, const std::optional<at::Tensor>& b);

// What a backend changes in how the chunks are made: which products a side's hidden states get, those products
// (for `rows` rows per chunk), and the chunk's buffers. By default ATen's products and at::empty.
struct ChunkResources {
  std::function<ProductKind(const at::Tensor& x)> kind;
  std::function<std::unique_ptr<SideProducts>(ProductKind, const at::Tensor& w, const std::optional<at::Tensor>& b,
                                              int64_t rows)>
      products;
  std::function<at::Tensor(c10::IntArrayRef, const at::TensorOptions&)> buffer;
};

// One chunk of the row loss with the gradients of its sum ("sum" reduction): the row loss's four results
// (the chunk's value, 0-dim; the two gradients, empty where the mask says no; the row scales, float32). A step
// that writes the gradients over the logits (`in_place`) lets a chunk hold two rows of V instead of four; one
// that `fuses` takes RowExtras and the logit transform (the call's scalars), else `extras` is null, the scalars
// have no transform, and the driver transforms the logits, scales the gradients (times the row scales) and
// makes the hard loss with ATen ops. `teacher` is the chunk's teacher logits, or its rows of a support's values,
// with their rows of the Ids and Mask inputs in `inputs` (the row loss's RowInputs; none for teacher logits).
struct RowStep {
  std::function<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor& student, const at::Tensor& teacher, const RowInputs& inputs,
      const std::optional<at::Tensor>& labels, const DeclaredScalars& scalars, int64_t ignore_index,
      std::array<bool, 2> mask, RowExtras* extras)>
      run;
  bool in_place = false;
  int64_t scratch_bytes = 0;  // per logit of a chunk: what the step itself holds at once beyond its results
  bool fuses = false;
  ChunkResources resources = {};
};

// Whether the teacher's logits are made in halves of a chunk's rows, each half's step run as it is made: where
// the step writes the gradients over the logits and fuses the rest (the CPU's), the teacher gets no gradient,
// and neither side's products are the float32 blocks (whose buffers take the room). The chunk's
// products (the student's logits and gradients) then take twice the rows of a 1/8 chunk, in 3/16 of one N x V:
// oneDNN's bfloat16 `g @ w` took 1.26x its time per row unchunked at 128 rows, 1.10x at 256
// (docs/semantics.md, "The fused linear JSD").
bool teacher_in_halves(const LinearCall& c, std::array<bool, 6> mask, const RowStep& step);

// The default share of one N x V tensor of the result's dtype a chunk's buffers may take, in sixteenths: 2
// (1/8), and 3 where the teacher's logits are made in halves, which gives the student's side twice the rows
// of the 1/8 chunk when both sides' dtypes agree. The contract's bound is 0.25x: the rest is left to the
// allocator's rounding and the kernels' own scratch. And the cap.
inline constexpr int64_t kLinearChunkShare = 2;
inline constexpr int64_t kLinearHalvesShare = 3;
inline constexpr int64_t kLinearChunkMaxBytes = int64_t{1} << 30;

// The bytes one row of a chunk holds: both logits (the teacher's half a row where it is made in halves), the
// gradients where the step does not write them over the logits, the step's own temporaries, and, where the
// step does not fuse it, the hard loss's float32 (float64 for float64) probabilities.
int64_t linear_row_bytes(const LinearSpec& spec, const LinearCall& c, std::array<bool, 6> mask, const RowStep& step);

// The rows per chunk: chunk_size when given, else the most rows whose buffers fit kLinearChunkShare (or
// kLinearHalvesShare) sixteenths of one N x V tensor of the result's dtype (a support's: the student's, whose
// logits alone are made) and kLinearChunkMaxBytes; at least 1, at most N.
int64_t linear_chunk_rows(const LinearSpec& spec, const LinearCall& c, std::array<bool, 6> mask, const RowStep& step);

// The forward with gradients, after the checks (`spec`).
LinearResults linear_with_grads(
    const LossDecl& d, const LinearSpec& spec, const LinearCall& c, std::array<bool, 6> mask, const RowStep& step);

// The linear form's two ops on a backend whose row loss's chunks run as `Step::step()` (core/backend.h's
// LinearBackendKernels makes the kernels): the checks, then the chunks.
template <typename Loss, typename Step>
struct LinearMath {
  static LinearResults run(const char* op, const LinearCall& c, std::array<bool, 6> mask) {
    return linear_with_grads(Loss::decl, linear_spec<int64_t>(Loss::decl, op, c), c, mask, Step::step());
  }
};

// The step through the dispatcher: the row loss's forward with gradients, on the tensors' device (the NPU's
// aclnn path, or the composite).
template <typename Loss>
struct OpStep {
  static RowStep step() {
    return {[](const at::Tensor& student, const at::Tensor& teacher, const RowInputs& inputs,
               const std::optional<at::Tensor>& labels, const DeclaredScalars& scalars, int64_t ignore_index,
               std::array<bool, 2> mask, RowExtras*) {
              return with_row_inputs<Loss>(inputs, [&](const auto&... i) {
                return with_row_scalars<Loss>(scalars.values, [&](auto... s) {
                  return ops::row_with_grads<Loss>().call(student, teacher, i..., labels, kSum, s..., ignore_index,
                                                          mask);
                });
              });
            },
            false};
  }
};

// Registers a backend's kernels of every row loss's ops, made from its `Rows` math (core/backend.h's
// RowBackendKernels), and of its linear form's, whose chunks run as `Step<Loss>::step()`.
template <typename Rows, template <typename> class Step>
void impl_row_losses(torch::Library& m) {
  for_each_row_loss([&]<typename Loss>() {
    impl_row_loss<Loss, Rows>(m);
    if constexpr (Loss::decl.linear.forward != nullptr) impl_linear<Loss, LinearMath<Loss, Step<Loss>>>(m);
  });
}

}  // namespace npu_loss::composite
