// The row losses' NPU frame (rows.h): every row member's three ops and its linear form's step, registered from
// the declaration list, each running its member's chunk math (npu_row_math<Loss>) through aclnn calls
// (NPU_LOSS_EXEC_ACLNN) where this chip's path row names an API, and the chunked composite of ATen ops
// (composite/rows.h) elsewhere. The logit transform is the frame's (log_probabilities, gradient_rows): the members'
// math sees each side's transformed log-probabilities and hands its gradients back through them.
//
// A rejected call: every aclnn call's first phase runs on the calling thread, and a non-zero status enqueues
// nothing of that call (aclnn_api.h). The chunks already enqueued wrote only this call's own results and
// temporaries, which are dropped: the whole call then runs the composite (on_aclnn then sends every later call
// whose beta and transform class use the API there too, and the one warning names it: npu_common.h).
#include "rows.h"

#include <torch/library.h>

#include <array>
#include <optional>
#include <tuple>
#include <vector>

#include "../composite/linear.h"
#include "../composite/rows.h"
#include "aclnn_api.h"
#include "npu_common.h"

namespace npu_loss::npu {

namespace {
constexpr int64_t kRowDim = 1;  // the softmax's dim in a (rows, V) chunk
}  // namespace

at::Tensor f32_like(const at::Tensor& t) {
  return at::empty(t.sizes(), t.options().dtype(at::kFloat));
}

at::Tensor cast_f32(const at::Tensor& x) {
  at::Tensor out = f32_like(x);
  const at::ScalarType dtype = at::kFloat;
  NPU_LOSS_EXEC_ACLNN(aclnnCast, x, dtype, out);
  return out;
}

void cast_into(at::Tensor& out, const at::Tensor& x) {
  const at::ScalarType dtype = out.scalar_type();
  NPU_LOSS_EXEC_ACLNN(aclnnCast, x, dtype, out);
}

void scale_(at::Tensor& x, double factor) {
  const at::Scalar s(factor);
  NPU_LOSS_EXEC_ACLNN(aclnnInplaceMuls, x, s);
}

void mul_(at::Tensor& x, const at::Tensor& y) {
  NPU_LOSS_EXEC_ACLNN(aclnnInplaceMul, x, y);
}

at::Tensor log_softmax(const at::Tensor& x) {
  at::Tensor out = f32_like(x);
  const int64_t dim = kRowDim;
  NPU_LOSS_EXEC_ACLNN(aclnnLogSoftmax, x, dim, out);
  return out;
}

// out = a - e^y sum(a): the log-softmax backward at the log-probabilities y.
void log_softmax_backward_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& y) {
  const int64_t dim = kRowDim;
  NPU_LOSS_EXEC_ACLNN(aclnnLogSoftmaxBackward, a, y, dim, out);
}

// The chunk's total into a 0-dim float32 slot.
void sum_into(at::Tensor& out, const at::Tensor& x) {
  const std::vector<int64_t> dims{0, 1};
  const at::IntArrayRef dim(dims);
  const bool keep_dim = false;
  const at::ScalarType dtype = at::kFloat;
  NPU_LOSS_EXEC_ACLNN(aclnnReduceSum, x, dim, keep_dim, dtype, out);
}

void zero_rows_(at::Tensor& x, const at::Tensor& drop) {
  const at::Scalar zero(0.0);
  NPU_LOSS_EXEC_ACLNN(aclnnInplaceMaskedFillScalar, x, drop, zero);
}

namespace {

// z times `factor` in a new float32 tensor: one aclnnMuls for float32 logits, a cast (and an aclnnInplaceMuls
// unless the factor is 1) for 16-bit ones.
at::Tensor scaled_f32(const at::Tensor& z, double factor) {
  if (z.scalar_type() != at::kFloat) {
    at::Tensor x = cast_f32(z);
    if (factor != 1) scale_(x, factor);
    return x;
  }
  at::Tensor x = f32_like(z);
  const at::Scalar s(factor);
  NPU_LOSS_EXEC_ACLNN(aclnnMuls, z, s, x);
  return x;
}

}  // namespace

LogProbabilities log_probabilities(const RowChunk& c, int side) {
  const at::Tensor& z = side == 0 ? c.student : c.teacher;
  const DeclaredScalars::Transform tr = c.call.scalars.transform(side);
  LogProbabilities r;
  r.chain = tr.scale;
  if (tr.softcap == 0) {  // the scale folded into the logits' scaling over T
    const double factor = tr.scale * c.inv_t;
    r.y = z.scalar_type() == at::kFloat && factor == 1 ? log_softmax(z) : log_softmax(scaled_f32(z, factor));
    return r;
  }
  // u = tanh(z scale / c), the logits over T c u / T; where the side's gradient is made, its slope u^2 - 1 into
  // x's rows once the log-softmax has read them (so the side holds one float32 row more, the slope).
  at::Tensor x = scaled_f32(z, tr.scale / tr.softcap);
  NPU_LOSS_EXEC_ACLNN(aclnnInplaceTanh, x);
  at::Tensor square;
  if (c.mask[side]) {
    square = f32_like(x);
    NPU_LOSS_EXEC_ACLNN(aclnnMul, x, x, square);
  }
  if (tr.softcap * c.inv_t != 1) scale_(x, tr.softcap * c.inv_t);
  r.y = log_softmax(x);
  if (square.defined()) {
    const at::Scalar minus_one(-1.0), one(1.0);
    NPU_LOSS_EXEC_ACLNN(aclnnAdds, square, minus_one, one, x);
    r.slope = x;
    r.chain = -tr.scale;  // scale (1 - u^2) = -scale (u^2 - 1)
  }
  return r;
}

void gradient_rows(at::Tensor& out, at::Tensor& a, const LogProbabilities& side, const Weight& w,
                   const at::Tensor& wrows, double factor, const at::Tensor& drop) {
  factor *= side.chain;
  if (wrows.defined()) {
    mul_(a, wrows);
    if (factor != 1) scale_(a, factor);
  } else if (w.scalar * factor != 1) {
    scale_(a, w.scalar * factor);
  }
  if (out.scalar_type() == at::kFloat) {
    log_softmax_backward_into(out, a, side.y);
    if (side.slope.defined()) mul_(out, side.slope);
  } else {
    at::Tensor g = f32_like(a);
    log_softmax_backward_into(g, a, side.y);
    if (side.slope.defined()) mul_(g, side.slope);
    cast_into(out, g);
  }
  if (drop.defined()) zero_rows_(out, drop);
}

namespace {

using composite::KeptRows;

// The chunk's weights ('none'): its grad_output rows (`width` per row: V, or a support's entries) as float32
// times `factor` (1 / T; 1 for a support's, whose member applies it) (with labels, the kept rows' placed at their
// rows and the dropped rows 0).
at::Tensor chunk_weights(const Weight& w, const std::optional<KeptRows>& kept, const at::Tensor& keep, int64_t first,
                         int64_t n, int64_t width, double factor) {
  at::Tensor rows;
  if (!kept) {
    rows = w.rows.narrow(0, first, n);
  } else {
    // index_put_, as the composite's: an op every chip's aclnn has.
    rows = at::zeros({n, width}, w.rows.options().dtype(at::kFloat));
    const int64_t here = kept->between(first, first + n);
    if (here > 0) {
      rows.index_put_({keep.narrow(0, first, n).nonzero().squeeze(1)},
                      w.rows.narrow(0, kept->before[first], here).to(at::kFloat));
    }
  }
  at::Tensor scaled = f32_like(rows);
  const at::Scalar s(factor);
  NPU_LOSS_EXEC_ACLNN(aclnnMuls, rows, s, scaled);
  return scaled;
}

// One call as the frame runs it: the op's arguments after its checks, its backward op's name (for its messages),
// its member's math, and what to make.
struct FrameCall {
  const RowCall& c;
  const char* forward_op;  // for the messages of the support's check
  const char* backward_op;
  const NpuRowMath& math;
  std::array<bool, 2> mask;  // the gradients wanted
  bool with_values;          // the forward's value ('none' values, or the reduced total)
  int64_t chunk = 0;         // rows per chunk; 0: composite::chunk_rows's, relative to the call's rows
};

struct Results {
  at::Tensor value, gs, gt, row_scale;
};

// What a call's chunks share, planned before the first: the rows kept (with labels), the rows to drop, the
// sizes, 1 / T, whether the gradients are stored with row scales, the result's dtype and the rows of a chunk.
struct Plan {
  at::Tensor keep;
  std::optional<KeptRows> kept;
  at::Tensor drop;
  int64_t vocab = 0, rows = 0, chunk = 0;
  int64_t entries = 0;   // the values per row: V, or a support's K + 1 (K without the tail)
  bool support = false;  // a teacher over a support (TeacherForm::Support)
  SupportIds ids;        // its ids, checked, and its mask
  double inv_t = 1;
  bool none = false, scaled = false;
  at::ScalarType result;
};

// The softcap's slopes a chunk holds: one float32 row per softcapped side whose gradient is made.
int64_t slope_rows(const RowCall& c, std::array<bool, 2> mask) {
  int64_t n = 0;
  for (int side = 0; side < 2; ++side) n += mask[side] && c.scalars.transform(side).softcap != 0;
  return n;
}

Plan plan_call(const FrameCall& jc) {
  const RowCall& c = jc.c;
  Plan p;
  p.keep = composite::keep_mask(c.labels, c.ignore_index);
  if (p.keep.defined()) {
    p.kept.emplace(p.keep);
    p.drop = p.keep.logical_not().unsqueeze(-1);
  }
  p.vocab = c.student.size(-1);
  p.rows = c.student.numel() / p.vocab;
  p.support = c.scalars.args->teacher == TeacherForm::Support;
  p.entries = p.support ? c.teacher.size(-1) + (c.scalars.tail() ? 1 : 0) : p.vocab;
  if (p.support) p.ids = support_ids(jc.forward_op, *c.scalars.args, c.inputs, p.keep, p.rows, p.vocab);
  p.inv_t = 1.0 / c.scalars.temperature();
  p.none = c.reduction == kNone;
  p.scaled = jc.with_values && scales_rows(c.student, c.teacher, jc.mask);
  p.result = composite::result_dtype(c);
  p.chunk = jc.chunk > 0 ? jc.chunk : composite::chunk_rows(
      p.rows, p.vocab, std::max(c.student.element_size(), c.teacher.element_size()),
      jc.math.temporaries + slope_rows(c, jc.mask));
  return p;
}

// The results, allocated before the first chunk (the gradients wanted, the row scales, 'none''s values).
Results allocate(const FrameCall& jc, const Plan& p) {
  const RowCall& c = jc.c;
  Results r;
  r.gs = composite::gradient_or_empty(c.student, jc.mask[0]);
  r.gt = composite::gradient_or_empty(c.teacher, jc.mask[1]);
  r.row_scale = at::ones(composite::leading_shape(c.student), c.student.options().dtype(at::kFloat));
  if (jc.with_values && p.none) {
    std::vector<int64_t> shape(c.student.sizes().begin(), c.student.sizes().end());
    shape.back() = p.entries;
    r.value = p.kept ? at::empty({p.kept->total(), p.entries}, c.student.options().dtype(p.result))
                     : at::empty(shape, c.student.options().dtype(p.result));
  }
  return r;
}

// After a chunk's math: float16's gradients stored with their row scales, the dropped rows' values zeroed,
// the chunk's part of the total, and its 'none' values placed (the kept rows', or cast into the result).
void finish_chunk(const Plan& p, ChunkOut& o, at::Tensor& gs_rows, at::Tensor& gt_rows, Results& r, int64_t row0,
                  int64_t n, const at::Tensor& d) {
  if (p.scaled) {
    const at::Tensor bound = o.gs.defined() && o.gt.defined()
        ? at::maximum(o.gs.abs().amax(-1), o.gt.abs().amax(-1))
        : (o.gs.defined() ? o.gs : o.gt).abs().amax(-1);
    const at::Tensor power = composite::row_powers(bound);
    const at::Tensor factor = at::exp2(power).unsqueeze(-1);
    if (o.gs.defined()) gs_rows.copy_(o.gs * factor);
    if (o.gt.defined()) gt_rows.copy_(o.gt * factor);
    r.row_scale.view({-1}).narrow(0, row0, n).copy_(at::exp2(-power));
  }
  if (!o.f.defined()) return;
  if (d.defined()) zero_rows_(o.f, d);
  if (o.part.defined()) sum_into(o.part, o.f);
  if (!o.values) return;
  if (p.kept) {
    const int64_t here = p.kept->between(row0, row0 + n);
    if (here > 0) {
      r.value.narrow(0, p.kept->before[row0], here).copy_(composite::rows_where(o.f, p.keep.narrow(0, row0, n)));
    }
  } else if (p.result != at::kFloat) {
    at::Tensor values = composite::rows_of(r.value, row0, n);
    cast_into(values, o.f);
  }
}

// The reduced result from the chunks' parts: their sum, divided for "mean" by the elements of the rows kept
// (NaN when none is), in the result's dtype.
at::Tensor total_of(const RowCall& c, const Plan& p, const at::Tensor& parts) {
  at::Tensor total = at::empty({}, parts.options());
  const std::vector<int64_t> dims{0};
  const at::IntArrayRef dim(dims);
  const bool keep_dim = false;
  const at::ScalarType dtype = at::kFloat;
  NPU_LOSS_EXEC_ACLNN(aclnnReduceSum, parts, dim, keep_dim, dtype, total);
  if (c.reduction == kMean) {
    const at::Scalar count(static_cast<double>(p.kept ? p.kept->total() : p.rows) * static_cast<double>(p.entries));
    at::Tensor mean = at::empty({}, parts.options());
    NPU_LOSS_EXEC_ACLNN(aclnnDivs, total, count, mean);
    total = mean;
  }
  if (p.result == at::kFloat) return total;
  at::Tensor value = at::empty({}, c.student.options().dtype(p.result));
  cast_into(value, total);
  return value;
}

// The call, chunk by chunk of rows (composite::row_blocks: the rows of each side that lie evenly in memory).
Results run(const FrameCall& jc, Weight w) {
  const RowCall& c = jc.c;
  const Plan p = plan_call(jc);
  if (w.rows.defined() && p.kept) check_grad_output_rows(jc.backward_op, w.rows, p.kept->total());
  if (w.mean) w.scalar /= static_cast<double>(p.kept ? p.kept->total() : p.rows) * static_cast<double>(p.entries);
  Results r = allocate(jc, p);
  if (!p.support) w.scalar *= p.inv_t;  // a support's member applies 1 / T to the student's side alone
  if (jc.mask[0] || jc.mask[1]) {
    w.scalar_tensor = at::scalar_tensor(w.scalar, c.student.options().dtype(at::kFloat));
  }

  std::vector<std::pair<at::Tensor, at::Tensor>> blocks;
  composite::row_blocks(c.student, c.teacher, blocks);
  int64_t chunks = 0;
  for (const auto& [zs, zt] : blocks) chunks += (zs.size(0) + p.chunk - 1) / p.chunk;
  const at::Tensor parts = jc.with_values && !p.none ? at::empty({chunks}, c.student.options().dtype(at::kFloat))
                                                     : at::Tensor();
  int64_t first = 0, index = 0;
  for (const auto& [zs, zt] : blocks) {
    for (int64_t start = 0; start < zs.size(0); start += p.chunk, ++index) {
      const int64_t n = std::min(p.chunk, zs.size(0) - start);
      const int64_t row0 = first + start;
      const bool drops = p.kept && p.kept->between(row0, row0 + n) < n;
      const at::Tensor d = drops ? p.drop.narrow(0, row0, n) : at::Tensor();
      const at::Tensor wrows =
          w.rows.defined() ? chunk_weights(w, p.kept, p.keep, row0, n, p.entries, p.support ? 1.0 : p.inv_t)
                           : at::Tensor();
      ChunkOut o;
      if (parts.defined()) o.part = parts.select(0, index);
      o.values = jc.with_values && p.none;
      if (o.values && !p.kept && p.result == at::kFloat) o.f = composite::rows_of(r.value, row0, n);
      // A gradient's rows: written in place in float32 (no row scales), else through a float32 row.
      at::Tensor gs_rows = jc.mask[0] ? composite::rows_of(r.gs, row0, n) : at::Tensor();
      at::Tensor gt_rows = jc.mask[1] ? composite::rows_of(r.gt, row0, n) : at::Tensor();
      // float16's row scales are taken on the float32 rows (composite/rows.cpp's with_grads).
      o.gs = p.scaled && gs_rows.defined() ? f32_like(gs_rows) : gs_rows;
      o.gt = p.scaled && gt_rows.defined() ? f32_like(gt_rows) : gt_rows;
      const at::Tensor ids = p.support ? p.ids.ids.narrow(0, row0, n) : at::Tensor();
      const at::Tensor on = p.support && p.ids.on.defined() ? p.ids.on.narrow(0, row0, n) : at::Tensor();
      jc.math.chunk({c, zs.narrow(0, start, n), zt.narrow(0, start, n), ids, on, p.inv_t, w, wrows, d, jc.mask}, o);
      finish_chunk(p, o, gs_rows, gt_rows, r, row0, n, d);
    }
    first += zs.size(0);
  }
  if (parts.defined()) r.value = total_of(c, p, parts);
  return r;
}

// The transform class of a call (chips/paths.h): whether a side is softcapped, else whether one is scaled.
chips::TransformClass transform_class(const DeclaredScalars& scalars) {
  const DeclaredScalars::Transform student = scalars.transform(0), teacher = scalars.transform(1);
  if (student.softcap != 0 || teacher.softcap != 0) return chips::TransformClass::Softcap;
  return student.identity() && teacher.identity() ? chips::TransformClass::None : chips::TransformClass::Scale;
}

// Every aclnn API a call of this beta and transform class makes on the path (the forward's, or also the
// gradients'), present in this CANN (asked once per pair of classes: an older toolkit may lack one,
// aclnnKlDivTargetBackward first).
template <typename Loss, bool Backward>
bool apis_present(chips::BetaClass beta, chips::TransformClass transform) {
  static constexpr chips::BetaClass kBetas[] = {chips::BetaClass::Zero, chips::BetaClass::Mixture,
                                                chips::BetaClass::One};
  static constexpr chips::TransformClass kTransforms[] = {
      chips::TransformClass::None, chips::TransformClass::Scale, chips::TransformClass::Softcap};
  static const std::array<std::array<bool, 3>, 3> present = [] {
    std::array<std::array<bool, 3>, 3> found{};
    for (size_t i = 0; i < 3; ++i) {
      for (size_t j = 0; j < 3; ++j) {
        found[i][j] = true;
        for (const auto& use : Loss::aclnn_apis) {
          if (!chips::used_by(use, Backward, kBetas[i], kTransforms[j])) continue;
          found[i][j] = found[i][j] && aclnn_api_available(use.api);
        }
      }
    }
    return found;
  }();
  const size_t i = beta == chips::BetaClass::Zero ? 0 : beta == chips::BetaClass::Mixture ? 1 : 2;
  return present[i][static_cast<size_t>(transform)];
}

// Whether this chip's CANN rejected, in this process, an API a call of this beta and transform class makes on
// the path.
template <typename Loss, bool Backward>
bool apis_rejected(chips::BetaClass beta, chips::TransformClass transform) {
  for (const auto& use : Loss::aclnn_apis) {
    if (chips::used_by(use, Backward, beta, transform) && api_rejected(use.api)) return true;
  }
  return false;
}

// Whether a call of the forward (Backward false) or of an op that makes gradients runs the aclnn path here.
template <typename Loss, bool Backward>
bool on_aclnn(const RowCall& c) {
  const chips::BetaClass beta = chips::unit_beta_class(c.scalars.beta());
  const chips::TransformClass transform = transform_class(c.scalars);
  const Path p = path_here<Loss, Backward>(dtype_class({&c.student, &c.teacher}), beta, false, transform);
  return p.aclnn != nullptr && apis_present<Loss, Backward>(beta, transform) &&
      !apis_rejected<Loss, Backward>(beta, transform);
}

// run(), or nothing when the chip's CANN rejected one of its calls (noted: the caller runs the composite).
std::optional<Results> run_or_rejected(const FrameCall& jc, const Weight& w) {
  try {
    return run(jc, w);
  } catch (const AclnnRejected& rejected) {
    note_rejection(rejected);
    return std::nullopt;
  }
}

// A call of the member `Loss` as the frame runs it.
template <typename Loss>
FrameCall frame_of(const RowCall& c, std::array<bool, 2> mask, bool with_values, int64_t chunk = 0) {
  return {c, Loss::decl.forward, Loss::decl.backward, npu_row_math<Loss>(), mask, with_values, chunk};
}

// The frame's three ops for a member `Loss` with an aclnn path.
struct NpuPathRows {
  template <typename Loss>
  static at::Tensor forward(Loss, const RowSpec&, const RowCall& c) {
    const c10::OptionalDeviceGuard guard(at::device_of(c.student));
    if (c.student.numel() == 0 || !on_aclnn<Loss, false>(c)) return composite::forward(Loss{}, c);
    if (auto r = run_or_rejected(frame_of<Loss>(c, {false, false}, true), Weight{})) return r->value;
    return composite::forward(Loss{}, c);
  }
  template <typename Loss>
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_grads(
      Loss, const RowSpec&, const RowCall& c, std::array<bool, 2> mask) {
    const c10::OptionalDeviceGuard guard(at::device_of(c.student));
    const bool grads = mask[0] || mask[1];
    if (c.student.numel() == 0 || !(grads ? on_aclnn<Loss, true>(c) : on_aclnn<Loss, false>(c))) {
      return composite::with_grads(Loss{}, c, mask);
    }
    Weight w;
    w.mean = c.reduction == kMean;
    if (auto r = run_or_rejected(frame_of<Loss>(c, mask, true), w)) return {r->value, r->gs, r->gt, r->row_scale};
    return composite::with_grads(Loss{}, c, mask);
  }
  template <typename Loss>
  static std::tuple<at::Tensor, at::Tensor> backward(
      Loss, const RowSpec&, const RowCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask) {
    const c10::OptionalDeviceGuard guard(at::device_of(c.student));
    if (c.student.numel() == 0 || !on_aclnn<Loss, true>(c)) return composite::backward(Loss{}, c, grad_output, mask);
    Weight w;
    if (c.reduction == kNone) {
      const bool labels = c.labels.has_value() && c.labels->defined();
      // One row per row (the logits' shape) or one per row kept (checked in run()).
      w.rows = labels ? grad_output : grad_output.contiguous().view({-1, grad_output.size(-1)});
    } else {
      w.scalar = grad_output.item<double>();
      w.mean = c.reduction == kMean;
    }
    if (auto r = run_or_rejected(frame_of<Loss>(c, mask, false), w)) return {r->gs, r->gt};
    return composite::backward(Loss{}, c, grad_output, mask);
  }
};

// The frame's three ops for a member `Loss` (core/backend.h's RowBackendKernels runs the checks first): its path,
// or the composite where it has none.
struct NpuRows {
  template <typename Loss>
  static at::Tensor forward(Loss, const RowSpec& spec, const RowCall& c) {
    if constexpr (kHasAclnnPath<Loss>) {
      return NpuPathRows::forward(Loss{}, spec, c);
    } else {
      const c10::OptionalDeviceGuard guard(at::device_of(c.student));
      return composite::forward(Loss{}, c);
    }
  }
  template <typename Loss>
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_grads(
      Loss, const RowSpec& spec, const RowCall& c, std::array<bool, 2> mask) {
    if constexpr (kHasAclnnPath<Loss>) {
      return NpuPathRows::with_grads(Loss{}, spec, c, mask);
    } else {
      const c10::OptionalDeviceGuard guard(at::device_of(c.student));
      return composite::with_grads(Loss{}, c, mask);
    }
  }
  template <typename Loss>
  static std::tuple<at::Tensor, at::Tensor> backward(
      Loss, const RowSpec& spec, const RowCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask) {
    if constexpr (kHasAclnnPath<Loss>) {
      return NpuPathRows::backward(Loss{}, spec, c, grad_output, mask);
    } else {
      const c10::OptionalDeviceGuard guard(at::device_of(c.student));
      return composite::backward(Loss{}, c, grad_output, mask);
    }
  }
};

// The linear form's step (composite/linear.h): each of its chunks, already sized by its own budget (which counts
// this path's float32 temporaries), in one chunk of the path above; sized relative to the chunk's own rows,
// the path would split it again into chunks of a few rows, each a round of launches. Where the row is the
// composite (or this chip's CANN rejected an API of the path), the composite's chunks within the same budget:
// the member's temporaries of its kCompositeTemporaries rows per row of the step.
template <typename Loss>
struct NpuLinearStep {
  static composite::RowStep step() {
    return {[](const at::Tensor& student, const at::Tensor& teacher, const RowInputs& inputs,
               const std::optional<at::Tensor>& labels, const DeclaredScalars& scalars, int64_t ignore_index,
               std::array<bool, 2> mask, composite::RowExtras*) -> std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> {
              const RowCall c{student, teacher, inputs, labels, kSum, scalars, ignore_index};
              const c10::OptionalDeviceGuard guard(at::device_of(student));
              const bool grads = mask[0] || mask[1];
              if constexpr (kHasAclnnPath<Loss>) {
                if (student.numel() > 0 && (grads ? on_aclnn<Loss, true>(c) : on_aclnn<Loss, false>(c))) {
                  if (auto r = run_or_rejected(frame_of<Loss>(c, mask, true, student.size(0)), Weight{})) {
                    return {r->value, r->gs, r->gt, r->row_scale};
                  }
                }
              }
              const int64_t rows = student.numel() / std::max<int64_t>(student.size(-1), 1);
              return composite::with_grads(
                  Loss{}, c, mask, std::max<int64_t>(1, rows * temporaries() / composite::kCompositeTemporaries));
            },
            false, temporaries() * 4};
  }
  // The float32 rows of V the step holds per row: its path's, or the composite's for a member without one.
  static int64_t temporaries() {
    if constexpr (kHasAclnnPath<Loss>) {
      return npu_row_math<Loss>().temporaries;
    } else {
      return composite::kCompositeTemporaries;
    }
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, PrivateUse1, m) {
  // Every row member's ops and its linear form (each chunk's matmuls torch_npu's, its rows the frame's path).
  composite::impl_row_losses<NpuRows, NpuLinearStep>(m);
}

}  // namespace npu_loss::npu
