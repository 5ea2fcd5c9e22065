// The row losses made of ATen ops (rows.h): the generalized JSD's values and derivatives per element, on
// whole tensors or chunk by chunk. Every step computes in float32 (float64 for float64 logits) and each
// result is rounded once, to its dtype (docs/semantics.md, "Distillation", has the formulas; the CPU kernels,
// cpu/row_kernels.h, compute the same terms).
#include "rows.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../core/reduction.h"

namespace npu_loss::composite {
namespace {

c10::ScalarType compute_dtype(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == at::kDouble || b.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// One element's terms from the logits: p = softmax(student / T), q = softmax(teacher / T), the value f and
// its derivatives w.r.t. the log-probabilities s and t. The mixture's m is never formed: s - m and t - m come
// from d = s - t + log(1 - beta) - log(beta) through softplus, exact where p and q underflow.
struct Terms {
  at::Tensor p, q, f, ds, dt;
};

Terms jsd_terms(const at::Tensor& zs, const at::Tensor& zt, double beta, double temperature) {
  const at::Tensor s = at::log_softmax(zs / temperature, -1);
  const at::Tensor t = at::log_softmax(zt / temperature, -1);
  Terms r{s.exp(), t.exp(), {}, {}, {}};
  if (beta == 0) {  // KL(teacher || student) = q (t - s)
    r.f = r.q * (t - s);
    r.ds = -r.q;
    r.dt = r.f + r.q;
  } else if (beta == 1) {  // KL(student || teacher) = p (s - t)
    r.f = r.p * (s - t);
    r.ds = r.f + r.p;
    r.dt = -r.p;
  } else {
    const at::Tensor d = (s - t) + (std::log1p(-beta) - std::log(beta));
    const at::Tensor tail = at::log1p(at::exp(-d.abs()));
    const at::Tensor s_minus_m = -(d.neg().clamp_min(0) + tail) - std::log1p(-beta);
    const at::Tensor t_minus_m = -(d.clamp_min(0) + tail) - std::log(beta);
    r.ds = (1 - beta) * r.p * s_minus_m;
    r.dt = beta * r.q * t_minus_m;
    r.f = r.ds + r.dt;
  }
  return r;
}

// The gradients w.r.t. the logits from the terms and each element's weight w: (a - p * sum(a)) / T, a = w * ds
// (and the teacher's alike).
std::pair<at::Tensor, at::Tensor> logit_gradients(const Terms& e, const at::Tensor& w, double temperature,
                                                  std::array<bool, 2> mask) {
  at::Tensor gs, gt;
  if (mask[0]) {
    const at::Tensor a = w * e.ds;
    gs = (a - e.p * a.sum(-1, true)) / temperature;
  }
  if (mask[1]) {
    const at::Tensor a = w * e.dt;
    gt = (a - e.q * a.sum(-1, true)) / temperature;
  }
  return {gs, gt};
}

c10::ScalarType result_dtype(const RowCall& c) {
  return at::promote_types(c.student.scalar_type(), c.teacher.scalar_type());
}

// The rows of a (rows, V) tensor where a bool (rows,) mask is true.
at::Tensor rows_where(const at::Tensor& t, const at::Tensor& keep) {
  return t.index_select(0, keep.nonzero().squeeze(1));
}

// Whether a (..., V) tensor's rows are one (rows, V) view: its leading dims collapse.
bool rows_collapse(const at::Tensor& t) {
  int64_t expected = -1;
  for (int64_t d = t.dim() - 2; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (expected >= 0 && t.stride(d) != expected) return false;
    expected = t.stride(d) * t.size(d);
  }
  return true;
}

// The student's and the teacher's rows as pairs of (rows, V) views, in row order.
void row_blocks(const at::Tensor& a, const at::Tensor& b, std::vector<std::pair<at::Tensor, at::Tensor>>& out) {
  if (a.dim() <= 2 || (rows_collapse(a) && rows_collapse(b))) {
    out.emplace_back(a.view({-1, a.size(-1)}), b.view({-1, b.size(-1)}));
    return;
  }
  for (int64_t i = 0; i < a.size(0); ++i) row_blocks(a.select(0, i), b.select(0, i), out);
}

// Calls fn(zs, zt, keep, first_row) for every chunk of rows: the chunk's logits in the compute dtype (copies of
// the chunk alone), the rows' keep mask (undefined without labels), the chunk's first row.
template <typename Fn>
void for_each_chunk(const RowCall& c, const at::Tensor& keep, const Fn& fn) {
  std::vector<std::pair<at::Tensor, at::Tensor>> blocks;
  row_blocks(c.student, c.teacher, blocks);
  const int64_t vocab = c.student.size(-1);
  const int64_t rows = vocab == 0 ? c.student.numel() : c.student.numel() / vocab;
  const int64_t chunk = chunk_rows(rows, vocab, std::max(c.student.element_size(), c.teacher.element_size()));
  const auto dtype = compute_dtype(c.student, c.teacher);
  int64_t first = 0;
  for (const auto& [zs, zt] : blocks) {
    for (int64_t start = 0; start < zs.size(0); start += chunk) {
      const int64_t n = std::min(chunk, zs.size(0) - start);
      fn(zs.narrow(0, start, n).to(dtype), zt.narrow(0, start, n).to(dtype),
         keep.defined() ? keep.narrow(0, first + start, n) : keep, first + start);
    }
    first += zs.size(0);
  }
}

// The rows kept: labels != ignore_index over the flattened leading dims, or undefined without labels.
at::Tensor keep_mask(const RowCall& c) {
  if (!c.labels.has_value() || !c.labels->defined()) return {};
  return c.labels->reshape(-1) != c.ignore_index;
}

// The count "mean" divides by: the elements of the rows kept.
at::Tensor mean_count(const RowCall& c, const at::Tensor& keep, const at::TensorOptions& options) {
  const int64_t vocab = c.student.size(-1);
  if (!keep.defined()) return at::scalar_tensor(static_cast<double>(c.student.numel()), options);
  return keep.sum().to(options.dtype()) * static_cast<double>(vocab);
}

// A row weight of the chunk's rows: `scale` (a 0-dim tensor or a number) where kept, 0 where dropped.
at::Tensor row_weights(const at::Tensor& keep, const at::Tensor& scale, int64_t rows, const at::TensorOptions& options) {
  const at::Tensor ones = keep.defined() ? keep.to(options.dtype()) : at::ones({rows}, options);
  return (ones * scale).unsqueeze(-1);
}

}  // namespace

int64_t chunk_rows(int64_t rows, int64_t vocab, int64_t itemsize) {
  // float32 (rows, V) tensors alive at once in a chunk's formulas: the mixture with both gradients holds about
  // 16 (the chunk's logits, s, t, p, q, d and its softplus parts, the terms, the gradients' products); 20 leaves
  // room for the allocator's rounding.
  constexpr int64_t kTemporaries = 20;
  constexpr int64_t kMaxBytes = int64_t{256} << 20;
  const int64_t budget = std::min(rows * std::max<int64_t>(vocab, 1) * itemsize / 8, kMaxBytes);
  return std::max<int64_t>(1, budget / (kTemporaries * std::max<int64_t>(vocab, 1) * 4));
}

at::Tensor forward(GeneralizedJsd, const RowCall& c) {
  const auto result = result_dtype(c);
  const at::Tensor keep = keep_mask(c);
  const auto options = c.student.options().dtype(compute_dtype(c.student, c.teacher));
  const int64_t vocab = c.student.size(-1);
  if (c.reduction == kNone) {
    at::Tensor values;
    std::vector<at::Tensor> kept;
    if (!keep.defined()) values = at::empty(c.student.sizes(), c.student.options().dtype(result));
    for_each_chunk(c, keep, [&](const at::Tensor& zs, const at::Tensor& zt, const at::Tensor& k, int64_t first) {
      const at::Tensor f = jsd_terms(zs, zt, c.beta, c.temperature).f;
      if (k.defined()) {
        kept.push_back(rows_where(f, k).to(result));
      } else {
        values.view({-1, vocab}).narrow(0, first, zs.size(0)).copy_(f);
      }
    });
    if (!keep.defined()) return values;
    if (kept.empty()) return at::empty({0, vocab}, c.student.options().dtype(result));
    return at::cat(kept);
  }
  at::Tensor total = at::zeros({}, options);
  for_each_chunk(c, keep, [&](const at::Tensor& zs, const at::Tensor& zt, const at::Tensor& k, int64_t) {
    const at::Tensor f = jsd_terms(zs, zt, c.beta, c.temperature).f;
    total += k.defined() ? (f * k.unsqueeze(-1)).sum() : f.sum();
  });
  if (c.reduction == kMean) total = total / mean_count(c, keep, options);
  return total.to(result);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> with_grads(GeneralizedJsd, const RowCall& c, std::array<bool, 2> mask) {
  const auto result = result_dtype(c);
  const at::Tensor keep = keep_mask(c);
  const auto options = c.student.options().dtype(compute_dtype(c.student, c.teacher));
  const int64_t vocab = c.student.size(-1);
  at::Tensor gs = mask[0] ? at::empty(c.student.sizes(), c.student.options()) : at::empty({0}, c.student.options());
  at::Tensor gt = mask[1] ? at::empty(c.teacher.sizes(), c.teacher.options()) : at::empty({0}, c.teacher.options());
  const at::Tensor scale = c.reduction == kMean ? 1.0 / mean_count(c, keep, options) : at::ones({}, options);
  at::Tensor total = at::zeros({}, options);
  for_each_chunk(c, keep, [&](const at::Tensor& zs, const at::Tensor& zt, const at::Tensor& k, int64_t first) {
    const Terms e = jsd_terms(zs, zt, c.beta, c.temperature);
    total += k.defined() ? (e.f * k.unsqueeze(-1)).sum() : e.f.sum();
    const auto [cs, ct] = logit_gradients(e, row_weights(k, scale, zs.size(0), options), c.temperature, mask);
    if (mask[0]) gs.view({-1, vocab}).narrow(0, first, zs.size(0)).copy_(cs);
    if (mask[1]) gt.view({-1, vocab}).narrow(0, first, zs.size(0)).copy_(ct);
  });
  return {(total * scale).to(result), gs, gt};
}

std::tuple<at::Tensor, at::Tensor> backward(
    GeneralizedJsd, const RowCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask) {
  const at::Tensor keep = keep_mask(c);
  const auto options = c.student.options().dtype(compute_dtype(c.student, c.teacher));
  const int64_t vocab = c.student.size(-1);
  at::Tensor gs = mask[0] ? at::empty(c.student.sizes(), c.student.options()) : at::empty({0}, c.student.options());
  at::Tensor gt = mask[1] ? at::empty(c.teacher.sizes(), c.teacher.options()) : at::empty({0}, c.teacher.options());
  // 'none': the weights of the rows kept, row after row ('none' is exempt from the memory bounds).
  const at::Tensor weights = c.reduction == kNone ? grad_output.to(options.dtype()).contiguous().view({-1, vocab}) : at::Tensor();
  const at::Tensor scale = c.reduction == kNone ? at::Tensor()
      : c.reduction == kMean ? grad_output.to(options.dtype()) / mean_count(c, keep, options)
                             : grad_output.to(options.dtype());
  int64_t next_weight_row = 0;
  for_each_chunk(c, keep, [&](const at::Tensor& zs, const at::Tensor& zt, const at::Tensor& k, int64_t first) {
    const Terms e = jsd_terms(zs, zt, c.beta, c.temperature);
    at::Tensor w;
    if (c.reduction != kNone) {
      w = row_weights(k, scale, zs.size(0), options);
    } else if (!k.defined()) {
      w = weights.narrow(0, first, zs.size(0));
    } else {  // the kept rows of this chunk are the next rows of grad_output, in order
      const int64_t n = k.sum().item<int64_t>();
      w = at::zeros({zs.size(0), vocab}, options);
      w.index_copy_(0, k.nonzero().squeeze(1), weights.narrow(0, next_weight_row, n));
      next_weight_row += n;
    }
    const auto [cs, ct] = logit_gradients(e, w, c.temperature, mask);
    if (mask[0]) gs.view({-1, vocab}).narrow(0, first, zs.size(0)).copy_(cs);
    if (mask[1]) gt.view({-1, vocab}).narrow(0, first, zs.size(0)).copy_(ct);
  });
  return {gs, gt};
}

at::Tensor forward_differentiable(GeneralizedJsd, const RowCall& c) {
  const auto dtype = compute_dtype(c.student, c.teacher);
  const auto result = at::promote_types(c.student.scalar_type(), c.teacher.scalar_type());
  const at::Tensor f = jsd_terms(c.student.to(dtype), c.teacher.to(dtype), c.beta, c.temperature).f;
  const bool labels = c.labels.has_value() && c.labels->defined();
  const at::Tensor keep = labels ? (*c.labels != c.ignore_index) : at::Tensor();
  if (c.reduction == kNone) {
    return (labels ? rows_where(f.reshape({-1, f.size(-1)}), keep.reshape(-1)) : f).to(result);
  }
  const at::Tensor total = labels ? (f * keep.unsqueeze(-1)).sum() : f.sum();
  if (c.reduction == kSum) return total.to(result);
  const at::Tensor count = labels ? keep.sum() * c.student.size(-1) : at::scalar_tensor(static_cast<double>(f.numel()));
  return (total / count).to(result);
}

std::tuple<at::Tensor, at::Tensor> backward_differentiable(
    GeneralizedJsd, const RowCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask) {
  const auto dtype = compute_dtype(c.student, c.teacher);
  const Terms e = jsd_terms(c.student.to(dtype), c.teacher.to(dtype), c.beta, c.temperature);
  const bool labels = c.labels.has_value() && c.labels->defined();
  const at::Tensor keep = labels ? (*c.labels != c.ignore_index).to(dtype).unsqueeze(-1) : at::Tensor();
  at::Tensor w;
  if (c.reduction == kNone) {
    w = grad_output.to(dtype);
    if (labels) w = at::zeros_like(e.f).masked_scatter((*c.labels != c.ignore_index).unsqueeze(-1).expand_as(e.f), w);
  } else {
    w = grad_output.to(dtype);
    if (c.reduction == kMean) {
      w = w / (labels ? keep.sum() * c.student.size(-1) : at::scalar_tensor(static_cast<double>(e.f.numel()), w.options()));
    }
    if (labels) w = w * keep;
  }
  auto [gs, gt] = logit_gradients(e, w, c.temperature, mask);
  return {mask[0] ? gs.to(c.student.scalar_type()) : at::empty({0}, c.student.options()),
          mask[1] ? gt.to(c.teacher.scalar_type()) : at::empty({0}, c.teacher.options())};
}

}  // namespace npu_loss::composite
