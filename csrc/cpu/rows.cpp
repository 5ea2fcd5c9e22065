// The row losses' CPU frame (losses.h's LossKind::Rows), one for every row member: the checks, the results'
// allocation, the rows split over the intra-op threads and the loss summed in row order, around the member's
// row kernel of the selected instruction set (isa.h's RowKernels, indexed by the declaration: row_table.h).
// Registered for the three ops of every row loss (the forward, the forward that also makes the gradients, and
// the backward op) and for its linear form's step.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "../composite/linear.h"
#include "../core/backend.h"
#include "../core/checks.h"
#include "../core/reduction.h"
#include "isa.h"
#include "products.h"
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

// The rows a call keeps: index[r], row r's place among the rows whose label is not ignore_index, or -1 (empty
// without labels: every row kept); count, how many; and "mean"'s factor, 1 / (count * entries), the values'
// entries per row (RowSpec::entries: V, or a support's K or K + 1).
struct Kept {
  std::vector<int64_t> index;
  int64_t count = 0;
  double mean_factor = 0;

  Kept(const std::optional<at::Tensor>& labels, int64_t ignore_index, int64_t rows, int64_t entries) : count(rows) {
    if (labels.has_value() && labels->defined()) {
      const at::Tensor l = labels->to(at::kLong).contiguous();
      const int64_t* p = l.const_data_ptr<int64_t>();
      index.resize(l.numel());
      count = 0;
      for (int64_t r = 0; r < l.numel(); ++r) index[r] = p[r] == ignore_index ? -1 : count++;
    }
    mean_factor = 1.0 / (static_cast<double>(count) * static_cast<double>(entries));
  }
  const int64_t* rows() const { return index.empty() ? nullptr : index.data(); }
  // The rows kept as a bool (rows,) tensor, or undefined without labels.
  at::Tensor mask() const {
    if (index.empty()) return {};
    at::Tensor keep = at::empty({static_cast<int64_t>(index.size())}, at::TensorOptions().dtype(at::kBool));
    bool* p = keep.mutable_data_ptr<bool>();
    for (size_t r = 0; r < index.size(); ++r) p[r] = index[r] >= 0;
    return keep;
  }
};

// What one call makes (the row losses' forward, 'none' values or the reduced loss, its gradients, or the
// backward op's gradients): the op's arguments, what its checks said of them, and its member's place in the
// declaration list (row_index<Loss>), which selects the kernel.
struct FrameCall : RowCall {
  const RowSpec& spec;
  int member;
  const char* op;  // the member's forward, named in the messages of what the frame checks
};

// One call of the member's row kernel over every row: `call` with the rows, the labels and the scratch filled
// in. float64 runs the baseline's kernel, whatever the instruction set (the vector sets have float lanes).
void run_rows(const FrameCall& c, RowBatch call) {
  const int64_t rows = c.spec.rows;
  const std::vector<int64_t> so = row_offsets(c.student, rows), to = row_offsets(c.teacher, rows);
  call.student_offsets = so.data();
  call.teacher_offsets = to.data();
  const RowKernel& kernel =
      (rows_in_float64(call) ? row_kernels_for(Isa::Baseline) : row_kernels()).of[c.member];
  const int64_t scratch_bytes = kernel.scratch_bytes(call);
  at::parallel_for(0, rows, row_grain(call.vocab), [&](int64_t begin, int64_t end) {
    std::vector<char> scratch(scratch_bytes);
    kernel.run(call, begin, end, scratch.data());
  });
}

// A teacher over a support (RowSpec::support > 0) as the kernel reads it (isa.h's RowBatch): the ids and the
// mask checked and made contiguous (core/checks.h's support_ids), the teacher's log-probabilities as float64
// rows, and its gradient's float64 rows, cast to the teacher's dtype and shape once the kernel has run.
struct SupportRows {
  SupportIds ids;
  at::Tensor teacher, grad;

  SupportRows(const FrameCall& c, const Kept& kept) {
    if (c.spec.support == 0) return;
    ids = support_ids(c.op, *c.scalars.args, c.inputs, kept.mask(), c.spec.rows, c.spec.vocab);
    teacher = c.teacher.reshape({c.spec.rows, c.spec.support}).to(at::kDouble).contiguous();
  }
  void fill(const FrameCall& c, RowBatch& r, bool teacher_grad) {
    if (!teacher.defined()) return;
    r.support = teacher.size(1);
    r.support_tail = c.scalars.tail();
    r.support_ids = ids.ids.const_data_ptr<int64_t>();
    r.support_on = ids.on.defined() ? ids.on.const_data_ptr<bool>() : nullptr;
    r.support_teacher = teacher.const_data_ptr<double>();
    if (teacher_grad) {
      grad = at::empty_like(teacher);
      r.support_grad_teacher = grad.mutable_data_ptr<double>();
      r.grad_teacher = nullptr;
    }
  }
  // The teacher's gradient in its dtype and shape (the frame's, where no support).
  at::Tensor teacher_gradient(const FrameCall& c, const at::Tensor& gt) const {
    return grad.defined() ? grad.to(c.teacher.scalar_type()).view(c.teacher.sizes()) : gt;
  }
};

RowBatch rows_of(const FrameCall& c, double* row_sums) {
  RowBatch r{};
  r.student_dtype = dense_dtype(c.student.scalar_type());
  r.teacher_dtype = dense_dtype(c.teacher.scalar_type());
  r.result_dtype = dense_dtype(c.spec.dtype);
  r.student = c.student.const_data_ptr();
  r.teacher = c.teacher.const_data_ptr();
  r.student_step = c.student.dim() > 0 ? c.student.stride(-1) : 1;
  r.teacher_step = c.teacher.dim() > 0 ? c.teacher.stride(-1) : 1;
  r.vocab = c.spec.vocab;
  r.scalars = c.scalars.values;
  r.temperature = c.scalars.temperature();
  r.logit_scale[0] = c.scalars.transform(0).scale;
  r.logit_scale[1] = c.scalars.transform(1).scale;
  r.logit_softcap[0] = c.scalars.transform(0).softcap;
  r.logit_softcap[1] = c.scalars.transform(1).softcap;
  r.row_sums = row_sums;
  r.grad_scale = 1.0;
  r.teacher_scale = 1.0;
  return r;
}

// The gradients wanted, allocated in the logits' dtypes and contiguous (undefined where not wanted), or the
// logits themselves (`over_logits`, contiguous logits): the row kernel reads each element of a row before it
// writes that element's gradient, and never reads it again.
std::pair<at::Tensor, at::Tensor> gradients(
    const FrameCall& c, std::array<bool, 2> mask, RowBatch& r, bool over_logits = false) {
  at::Tensor gs, gt;
  if (over_logits) {  // a support's values are not logits: its gradient is SupportRows'
    TORCH_INTERNAL_ASSERT(c.student.is_contiguous() && (c.spec.support > 0 || c.teacher.is_contiguous()));
    if (mask[0]) gs = c.student;
    if (mask[1] && c.spec.support == 0) gt = c.teacher;
  }
  if (mask[0] && !gs.defined()) gs = at::empty(c.spec.logits_shape, c.student.options());
  if (mask[1] && !gt.defined() && c.spec.support == 0) gt = at::empty(c.spec.logits_shape, c.teacher.options());
  r.grad_student = gs.defined() ? gs.mutable_data_ptr() : nullptr;
  r.grad_teacher = gt.defined() ? gt.mutable_data_ptr() : nullptr;
  return {gs, gt};
}

// A gradient not asked for: an empty tensor of the logits' dtype (the ops return one tensor per output).
at::Tensor or_empty(const at::Tensor& t, const at::Tensor& like) {
  return t.defined() ? t : at::empty({0}, like.options());
}

// The forward, with the gradients of its reduced result (scaled as "mean" or "sum" says) when `mask` asks,
// and their row scales (composite/rows.h, with_grads). With `extras` (the linear form's step, "sum"): the
// gradients times extras->grad_scale, and the hard loss made in the same passes (composite/linear.h).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> forward(
    const FrameCall& c, std::array<bool, 2> mask, bool over_logits = false, composite::RowExtras* extras = nullptr) {
  const Kept kept(c.labels, c.ignore_index, c.spec.rows, c.spec.entries);
  SupportRows support(c, kept);
  std::vector<double> row_sums(kept.count);
  RowBatch r = rows_of(c, row_sums.data());
  r.kept = kept.rows();
  at::Tensor hard_labels;
  std::vector<double> hard_sums;
  if (extras && extras->hard) {
    TORCH_INTERNAL_ASSERT(c.spec.labels);
    hard_labels = c.labels->reshape({c.spec.rows}).to(at::kLong).contiguous();
    hard_sums.resize(kept.count);
    r.hard_labels = hard_labels.const_data_ptr<int64_t>();
    r.hard_sums = hard_sums.data();
    r.hard_weight = extras->hard_weight;
  }
  const auto options = c.student.options().dtype(c.spec.dtype);
  at::Tensor values;
  if (c.reduction == kNone) {
    c10::SmallVector<int64_t, 8> shape(c.spec.logits_shape.begin(), c.spec.logits_shape.end());
    shape.back() = c.spec.entries;
    values = c.spec.labels ? at::empty({kept.count, c.spec.entries}, options) : at::empty(shape, options);
    r.values = values.mutable_data_ptr();
    r.row_sums = nullptr;
  }
  r.grad_scale = c.reduction == kMean ? kept.mean_factor : 1.0;  // "mean" over the elements of the rows kept
  if (extras) {
    r.grad_scale *= extras->grad_scale;
    r.teacher_scale = extras->teacher_scale;
    r.entropy = extras->entropy;
  }
  auto [gs, gt] = gradients(c, mask, r, over_logits);
  support.fill(c, r, mask[1]);
  const c10::IntArrayRef leading(c.spec.logits_shape.data(), c.spec.logits_shape.size() - 1);
  const at::Tensor row_scale = at::ones(leading, c.student.options().dtype(at::kFloat));
  // The linear form's step gives its own scales (its float16 gradients are stored times a power of two).
  if (!extras && scales_rows(c.student, c.teacher, mask)) r.row_scale = row_scale.mutable_data_ptr<float>();
  run_rows(c, r);
  gt = support.teacher_gradient(c, gt);
  if (c.reduction == kNone) return {values, or_empty(gs, c.student), or_empty(gt, c.teacher), row_scale};
  double total = 0;
  for (double s : row_sums) total += s;  // in row order: the same bits for any thread count
  if (extras && extras->hard) {
    extras->hard_sum = 0;
    for (double s : hard_sums) extras->hard_sum += s;
  }
  return {scalar_result(reduce_total(total, c.reduction, kept.count * c.spec.entries), options),
          or_empty(gs, c.student), or_empty(gt, c.teacher), row_scale};
}

// The backward op (`op`): the gradients of the forward's result, weighted by grad_output.
std::tuple<at::Tensor, at::Tensor> backward(
    const char* op, const FrameCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask) {
  const Kept kept(c.labels, c.ignore_index, c.spec.rows, c.spec.entries);
  SupportRows support(c, kept);
  RowBatch r = rows_of(c, nullptr);
  r.kept = kept.rows();
  at::Tensor weights;
  if (c.reduction == kNone) {
    if (c.spec.labels) check_grad_output_rows(op, grad_output, kept.count);
    weights = grad_output.to(c.spec.dtype).contiguous();
    r.grad_output = weights.const_data_ptr();
  } else {
    r.grad_scale = grad_output.item<double>() * (c.reduction == kMean ? kept.mean_factor : 1.0);
  }
  auto [gs, gt] = gradients(c, mask, r);
  support.fill(c, r, mask[1]);
  run_rows(c, r);
  gt = support.teacher_gradient(c, gt);
  return {or_empty(gs, c.student), or_empty(gt, c.teacher)};
}

// The frame's three ops for a member `Loss` (core/backend.h's RowBackendKernels runs the checks first).
struct CpuRows {
  template <typename Loss>
  static at::Tensor forward(Loss, const RowSpec& spec, const RowCall& c) {
    return std::get<0>(cpu::forward({c, spec, row_index<Loss>(), Loss::decl.forward}, {false, false}));
  }
  template <typename Loss>
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_grads(
      Loss, const RowSpec& spec, const RowCall& c, std::array<bool, 2> mask) {
    return cpu::forward({c, spec, row_index<Loss>(), Loss::decl.forward}, mask);
  }
  template <typename Loss>
  static std::tuple<at::Tensor, at::Tensor> backward(
      Loss, const RowSpec& spec, const RowCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask) {
    return cpu::backward(Loss::decl.backward, {c, spec, row_index<Loss>(), Loss::decl.backward}, grad_output, mask);
  }
};

// The linear form's step (composite/linear.h): a chunk's forward with the gradients of its sum, written over
// the chunk's logits (buffers of the linear form's own), with the CPU's products and buffers (products.h).
template <typename Loss>
struct CpuLinearStep {
  static composite::RowStep step() {
    return {[](const at::Tensor& student, const at::Tensor& teacher, const RowInputs& inputs,
               const std::optional<at::Tensor>& labels, const DeclaredScalars& scalars, int64_t ignore_index,
               std::array<bool, 2> mask, composite::RowExtras* extras) {
              const RowCall call{student, teacher, inputs, labels, kSum, scalars, ignore_index};
              const RowSpec spec = row_with_grads_spec<int64_t>(Loss::decl, call);
              return cpu::forward({call, spec, row_index<Loss>(), Loss::decl.linear.forward}, mask, /*over_logits=*/true, extras);
            },
            /*in_place=*/true, /*scratch_bytes=*/0, /*fuses=*/true, chunk_resources()};
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, CPU, m) {
  composite::impl_row_losses<CpuRows, CpuLinearStep>(m);
}

}  // namespace npu_loss::cpu
