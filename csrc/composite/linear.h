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
#include <optional>
#include <tuple>

#include "../core/checks.h"
#include "../core/ops.h"
#include "../core/reduction.h"
#include "../losses.h"

namespace npu_loss::composite {

// The forward with gradients' ten results (losses.h's LinearForm).
using LinearResults = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                                 at::Tensor, at::Tensor, at::Tensor>;

// What a step that fuses them (RowStep::fuses) also does to a chunk, in the same passes over its logits: the
// gradients times grad_scale (the soft loss's factor and the student's stored scale), the teacher's times
// teacher_scale more (the ratio of the two sides' stored scales), and, with `hard`, the cross entropy of the
// student's untempered logits at the labels: its sum over the kept rows (in row order, into hard_sum) and,
// where the student's gradient is made, hard_weight * (softmax - one_hot) added to it. The gradients are then
// stored as they are, without the row loss's own float16 row scales.
struct RowExtras {
  double grad_scale = 1;
  double teacher_scale = 1;
  bool hard = false;
  double hard_weight = 0;
  double hard_sum = 0;  // out
};

// One chunk of the row loss with the gradients of its sum ("sum" reduction): the row loss's four results
// (the chunk's value, 0-dim; the two gradients, empty where the mask says no; the row scales, float32). A step
// that writes the gradients over the logits (`in_place`) lets a chunk hold two rows of V instead of four; one
// that `fuses` takes RowExtras, else `extras` is null and the driver scales the gradients (times the row
// scales) and makes the hard loss with ATen ops.
struct RowStep {
  std::function<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor& student, const at::Tensor& teacher, const std::optional<at::Tensor>& labels, double beta,
      double temperature, int64_t ignore_index, std::array<bool, 2> mask, RowExtras* extras)>
      run;
  bool in_place = false;
  int64_t scratch_bytes = 0;  // per logit of a chunk: what the step itself holds at once beyond its results
  bool fuses = false;
};

// Whether the teacher's logits are made in halves of a chunk's rows, each half's step run as it is made: where
// the step writes the gradients over the logits and fuses the rest (the CPU's), the teacher gets no gradient,
// and both sides' products are torch's own (not the float32 blocks, whose buffers take the room). The chunk's
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
// kLinearHalvesShare) sixteenths of one N x V tensor of the result's dtype and kLinearChunkMaxBytes; at least
// 1, at most N.
int64_t linear_chunk_rows(const LinearSpec& spec, const LinearCall& c, std::array<bool, 6> mask, const RowStep& step);

// The forward with gradients, after the checks (`spec`).
LinearResults linear_with_grads(
    const LossDecl& d, const LinearSpec& spec, const LinearCall& c, std::array<bool, 6> mask, const RowStep& step);

// A backend's kernels of a row loss's two linear ops, made from its RowStep (`Step::step()`).
template <typename Loss, typename Step>
struct LinearKernels {
  static constexpr const LossDecl& d = Loss::decl;

  // Either op (`op` names it in the messages).
  static LinearResults run(
      const char* op, const at::Tensor& student_input, const at::Tensor& student_weight,
      const at::Tensor& teacher_input, const at::Tensor& teacher_weight, const std::optional<at::Tensor>& labels,
      const std::optional<at::Tensor>& student_bias, const std::optional<at::Tensor>& teacher_bias,
      c10::string_view reduction, double beta, double temperature, int64_t ignore_index, double weight_hard,
      double weight_soft, std::optional<int64_t> chunk_size, bool return_parts, std::array<bool, 6> mask) {
    const LinearSpec spec = linear_spec<int64_t>(
        d, op, student_input, student_weight, teacher_input, teacher_weight, labels, student_bias,
        teacher_bias, reduction, beta, temperature, weight_hard, weight_soft, chunk_size);
    const LinearCall call{{&student_input, &teacher_input}, {&student_weight, &teacher_weight},
                          {&student_bias, &teacher_bias}, labels, spec.reduction, beta, temperature, ignore_index,
                          weight_hard, weight_soft, chunk_size.value_or(0), return_parts};
    return linear_with_grads(d, spec, call, mask, Step::step());
  }

  static LinearResults with_grads(
      const at::Tensor& student_input, const at::Tensor& student_weight, const at::Tensor& teacher_input,
      const at::Tensor& teacher_weight, const std::optional<at::Tensor>& labels,
      const std::optional<at::Tensor>& student_bias, const std::optional<at::Tensor>& teacher_bias,
      c10::string_view reduction, double beta, double temperature, int64_t ignore_index, double weight_hard,
      double weight_soft, std::optional<int64_t> chunk_size, bool return_parts, std::array<bool, 6> mask) {
    return run(d.linear.with_grads, student_input, student_weight, teacher_input, teacher_weight, labels,
               student_bias, teacher_bias, reduction, beta, temperature, ignore_index, weight_hard, weight_soft,
               chunk_size, return_parts, mask);
  }

  // The forward: the same, without gradients.
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(
      const at::Tensor& student_input, const at::Tensor& student_weight, const at::Tensor& teacher_input,
      const at::Tensor& teacher_weight, const std::optional<at::Tensor>& labels,
      const std::optional<at::Tensor>& student_bias, const std::optional<at::Tensor>& teacher_bias,
      c10::string_view reduction, double beta, double temperature, int64_t ignore_index, double weight_hard,
      double weight_soft, std::optional<int64_t> chunk_size, bool return_parts) {
    auto r = run(d.linear.forward, student_input, student_weight, teacher_input, teacher_weight, labels,
                 student_bias, teacher_bias, reduction, beta, temperature, ignore_index, weight_hard, weight_soft,
                 chunk_size, return_parts, {});
    return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
  }
};

// The step through the dispatcher: the row loss's forward with gradients, on the tensors' device (the NPU's
// aclnn path, or the composite).
template <typename Loss>
struct OpStep {
  static RowStep step() {
    return {[](const at::Tensor& student, const at::Tensor& teacher, const std::optional<at::Tensor>& labels,
               double beta, double temperature, int64_t ignore_index, std::array<bool, 2> mask, RowExtras*) {
              return ops::row_with_grads<Loss>().call(student, teacher, labels, kSum, beta, temperature, ignore_index,
                                                      mask);
            },
            false};
  }
};

// Registers a backend's kernels of a row loss's linear ops.
template <typename Loss, typename Step>
void impl_linear(torch::Library& m) {
  m.impl(Loss::decl.linear.forward, &LinearKernels<Loss, Step>::forward);
  m.impl(Loss::decl.linear.with_grads, &LinearKernels<Loss, Step>::with_grads);
}

}  // namespace npu_loss::composite
