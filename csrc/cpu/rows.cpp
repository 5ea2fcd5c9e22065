// The row losses' CPU kernels (losses.h's LossKind::Rows): the checks, the results' allocation, the rows split
// over the intra-op threads and the loss summed in row order, around the row kernel of the selected
// instruction set (row_kernels.h). Registered for the three ops of every row loss: the forward, the forward
// that also makes the gradients, and the backward op.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "../core/checks.h"
#include "../core/reduction.h"
#include "isa.h"
#include "loops.h"

namespace npu_loss::cpu {
namespace {

// Rows per parallel task: small rows are grouped so that a task has about kGrain elements.
int64_t row_grain(int64_t vocab) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(vocab, 1));
}

// The element offset of each row of a (..., V) tensor, in row order.
std::vector<int64_t> row_offsets(const at::Tensor& t, int64_t rows) {
  std::vector<int64_t> offsets(rows);
  const int64_t lead = t.dim() - 1;
  std::vector<int64_t> index(lead, 0);
  int64_t offset = 0;
  for (int64_t r = 0; r < rows; ++r) {
    offsets[r] = offset;
    for (int64_t d = lead - 1; d >= 0; --d) {  // the next row: an odometer over the leading dims
      offset += t.stride(d);
      if (++index[d] < t.size(d)) break;
      offset -= index[d] * t.stride(d);
      index[d] = 0;
    }
  }
  return offsets;
}

// kept[r]: row r's index among the rows whose label is not ignore_index, or -1. Empty without labels.
std::vector<int64_t> kept_rows(const std::optional<at::Tensor>& labels, int64_t ignore_index, int64_t& count) {
  std::vector<int64_t> kept;
  if (!labels.has_value() || !labels->defined()) return kept;
  const at::Tensor l = labels->to(at::kLong).contiguous();
  const int64_t* p = l.const_data_ptr<int64_t>();
  kept.resize(l.numel());
  count = 0;
  for (int64_t r = 0; r < l.numel(); ++r) kept[r] = p[r] == ignore_index ? -1 : count++;
  return kept;
}

// One call of the row kernel over every row: `call` with the rows, the labels and the scratch filled in.
void run_rows(JsdRows call, const at::Tensor& student, const at::Tensor& teacher, int64_t rows) {
  const std::vector<int64_t> so = row_offsets(student, rows), to = row_offsets(teacher, rows);
  call.student_offsets = so.data();
  call.teacher_offsets = to.data();
  const RowKernels& kernels = row_kernels();
  const int64_t scratch_bytes = jsd_scratch_bytes(call);
  at::parallel_for(0, rows, row_grain(call.vocab), [&](int64_t begin, int64_t end) {
    std::vector<char> scratch(scratch_bytes);
    kernels.jsd(call, begin, end, scratch.data());
  });
}

// What one call makes: the row losses' forward ('none' values or the reduced loss), its gradients, or the
// backward op's gradients.
struct JsdCall {
  const char* op;
  const RowSpec& spec;
  const at::Tensor& student;
  const at::Tensor& teacher;
  const std::optional<at::Tensor>& labels;
  int64_t reduction;
  double beta, temperature;
  int64_t ignore_index;
};

JsdRows rows_of(const JsdCall& c, double* row_sums) {
  JsdRows r{};
  r.student_dtype = dense_dtype(c.student.scalar_type());
  r.teacher_dtype = dense_dtype(c.teacher.scalar_type());
  r.result_dtype = dense_dtype(c.spec.dtype);
  r.student = c.student.const_data_ptr();
  r.teacher = c.teacher.const_data_ptr();
  r.student_step = c.student.dim() > 0 ? c.student.stride(-1) : 1;
  r.teacher_step = c.teacher.dim() > 0 ? c.teacher.stride(-1) : 1;
  r.vocab = c.spec.vocab;
  r.beta = c.beta;
  r.inv_temperature = 1.0 / c.temperature;
  r.row_sums = row_sums;
  r.grad_scale = 1.0;
  return r;
}

// The gradients wanted, allocated in the logits' dtypes and contiguous (undefined where not wanted).
std::pair<at::Tensor, at::Tensor> gradients(const JsdCall& c, std::array<bool, 2> mask, JsdRows& r) {
  at::Tensor gs, gt;
  if (mask[0]) gs = at::empty(c.spec.logits_shape, c.student.options());
  if (mask[1]) gt = at::empty(c.spec.logits_shape, c.teacher.options());
  r.grad_student = gs.defined() ? gs.mutable_data_ptr() : nullptr;
  r.grad_teacher = gt.defined() ? gt.mutable_data_ptr() : nullptr;
  return {gs, gt};
}

// A gradient not asked for: an empty tensor of the logits' dtype (the ops return one tensor per output).
at::Tensor or_empty(const at::Tensor& t, const at::Tensor& like) {
  return t.defined() ? t : at::empty({0}, like.options());
}

// The forward, with the gradients of its reduced result (scaled as "mean" or "sum" says) when `mask` asks.
std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const JsdCall& c, std::array<bool, 2> mask) {
  int64_t kept_count = c.spec.rows;
  const std::vector<int64_t> kept = kept_rows(c.labels, c.ignore_index, kept_count);
  std::vector<double> row_sums(kept_count);
  JsdRows r = rows_of(c, row_sums.data());
  r.kept = kept.empty() ? nullptr : kept.data();
  const auto options = c.student.options().dtype(c.spec.dtype);
  at::Tensor values;
  if (c.reduction == kNone) {
    values = c.spec.labels ? at::empty({kept_count, c.spec.vocab}, options) : at::empty(c.spec.logits_shape, options);
    r.values = values.mutable_data_ptr();
    r.row_sums = nullptr;
  }
  // "mean" over the elements of the rows kept.
  const double count = static_cast<double>(kept_count) * static_cast<double>(c.spec.vocab);
  r.grad_scale = c.reduction == kMean ? 1.0 / count : 1.0;
  auto [gs, gt] = gradients(c, mask, r);
  run_rows(r, c.student, c.teacher, c.spec.rows);
  if (c.reduction == kNone) return {values, or_empty(gs, c.student), or_empty(gt, c.teacher)};
  double total = 0;
  for (double s : row_sums) total += s;  // in row order: the same bits for any thread count
  return {scalar_result(reduce_total(total, c.reduction, static_cast<int64_t>(count)), options),
          or_empty(gs, c.student), or_empty(gt, c.teacher)};
}

// The backward op: the gradients of the forward's result, weighted by grad_output.
std::tuple<at::Tensor, at::Tensor> backward(const JsdCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask) {
  int64_t kept_count = c.spec.rows;
  const std::vector<int64_t> kept = kept_rows(c.labels, c.ignore_index, kept_count);
  JsdRows r = rows_of(c, nullptr);
  r.kept = kept.empty() ? nullptr : kept.data();
  at::Tensor weights;
  if (c.reduction == kNone) {
    TORCH_CHECK(
        !c.spec.labels || grad_output.size(0) == kept_count, c.op, ": grad_output of 'none' must have one row per "
        "row its labels keep (", kept_count, "), got ", grad_output.size(0));
    weights = grad_output.to(c.spec.dtype).contiguous();
    r.grad_output = weights.const_data_ptr();
  } else {
    const double count = static_cast<double>(kept_count) * static_cast<double>(c.spec.vocab);
    r.grad_scale = grad_output.item<double>() * (c.reduction == kMean ? 1.0 / count : 1.0);
  }
  auto [gs, gt] = gradients(c, mask, r);
  run_rows(r, c.student, c.teacher, c.spec.rows);
  return {or_empty(gs, c.student), or_empty(gt, c.teacher)};
}

template <typename Loss>
struct RowCpuKernels {
  static constexpr const LossDecl& d = Loss::decl;

  static at::Tensor forward(
      const at::Tensor& student, const at::Tensor& teacher, const std::optional<at::Tensor>& labels,
      int64_t reduction, double beta, double temperature, int64_t ignore_index) {
    const RowSpec spec = row_forward_spec<int64_t>(d, d.forward, student, teacher, labels, reduction, beta, temperature);
    return std::get<0>(cpu::forward({d.forward, spec, student, teacher, labels, reduction, beta, temperature, ignore_index}, {false, false}));
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor> with_grads(
      const at::Tensor& student, const at::Tensor& teacher, const std::optional<at::Tensor>& labels,
      int64_t reduction, double beta, double temperature, int64_t ignore_index, std::array<bool, 2> mask) {
    const RowSpec spec = row_with_grads_spec<int64_t>(d, student, teacher, labels, reduction, beta, temperature);
    return cpu::forward({d.with_grads, spec, student, teacher, labels, reduction, beta, temperature, ignore_index}, mask);
  }

  static std::tuple<at::Tensor, at::Tensor> backward(
      const at::Tensor& grad_output, const at::Tensor& student, const at::Tensor& teacher,
      const std::optional<at::Tensor>& labels, int64_t reduction, double beta, double temperature,
      int64_t ignore_index, std::array<bool, 2> mask) {
    const RowSpec spec =
        row_backward_spec<int64_t>(d, grad_output, student, teacher, labels, reduction, beta, temperature);
    return cpu::backward({d.backward, spec, student, teacher, labels, reduction, beta, temperature, ignore_index}, grad_output, mask);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, CPU, m) {
  for_each_row_loss([&]<typename Loss>() {
    using Kernels = RowCpuKernels<Loss>;
    m.impl(Loss::decl.forward, &Kernels::forward);
    m.impl(Loss::decl.with_grads, &Kernels::with_grads);
    m.impl(Loss::decl.backward, &Kernels::backward);
  });
}

}  // namespace npu_loss::cpu
