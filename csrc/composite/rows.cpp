// The row losses made of ATen ops (rows.h): the generalized JSD's values and derivatives per element, on
// whole tensors or chunk by chunk. Every step computes in float32 (float64 for float64 logits) and each
// result is rounded once, to its dtype (docs/semantics.md, "Distillation", has the formulas; the CPU kernels,
// cpu/row_kernels.h, compute the same terms).
#include "rows.h"

#include <ATen/ATen.h>

#include <c10/util/accumulate.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "../core/checks.h"
#include "../core/reduction.h"

namespace npu_loss::composite {
namespace {

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

}  // namespace

c10::ScalarType result_dtype(const RowCall& c) {
  return at::promote_types(c.student.scalar_type(), c.teacher.scalar_type());
}

at::Tensor rows_where(const at::Tensor& t, const at::Tensor& keep) {
  return t.index_select(0, keep.nonzero().squeeze(1));
}

void row_blocks(const at::Tensor& a, const at::Tensor& b, std::vector<std::pair<at::Tensor, at::Tensor>>& out) {
  if (a.dim() <= 2 || (rows_collapse(a) && rows_collapse(b))) {
    out.emplace_back(a.view({-1, a.size(-1)}), b.view({-1, b.size(-1)}));
    return;
  }
  for (int64_t i = 0; i < a.size(0); ++i) row_blocks(a.select(0, i), b.select(0, i), out);
}

int64_t chunk_rows(int64_t rows, int64_t vocab, int64_t itemsize, int64_t temporaries) {
  const int64_t budget = std::min(rows * std::max<int64_t>(vocab, 1) * itemsize / 8, kChunkMaxBytes);
  return std::max<int64_t>(1, budget / (temporaries * std::max<int64_t>(vocab, 1) * 4));
}

at::Tensor keep_mask(const std::optional<at::Tensor>& labels, int64_t ignore_index) {
  if (!labels.has_value() || !labels->defined()) return {};
  return labels->reshape(-1).to(at::kLong) != ignore_index;
}

KeptRows::KeptRows(const at::Tensor& keep) : before(keep.numel() + 1, 0) {
  const at::Tensor host = keep.to(at::kCPU, at::kBool).contiguous();
  const bool* p = host.const_data_ptr<bool>();
  for (int64_t r = 0; r < keep.numel(); ++r) before[r + 1] = before[r] + (p[r] ? 1 : 0);
}

c10::IntArrayRef leading_shape(const at::Tensor& logits) {
  return logits.sizes().slice(0, logits.dim() - 1);
}

at::Tensor gradient_or_empty(const at::Tensor& logits, bool wanted) {
  return wanted ? at::empty(logits.sizes(), logits.options()) : at::empty({0}, logits.options());
}

at::Tensor rows_of(const at::Tensor& t, int64_t first, int64_t n) {
  return t.view({-1, t.size(-1)}).narrow(0, first, n);
}

at::Tensor empty_forward(const RowCall& c, const at::Tensor& keep) {
  const auto options = c.student.options().dtype(result_dtype(c));
  if (c.reduction == kNone) {
    return keep.defined() ? at::empty({keep.sum().item<int64_t>(), c.student.size(-1)}, options)
                          : at::empty(c.student.sizes(), options);
  }
  return at::full({}, c.reduction == kSum ? 0.0 : std::numeric_limits<double>::quiet_NaN(), options);
}

at::Tensor row_powers(const at::Tensor& bound) {
  const at::Tensor exponent = at::floor(at::log2(bound)) + 1;
  return at::where((bound > 0) & at::isfinite(bound), (14 - exponent).clamp(-60, 60), 0);
}

void scale_chunk_rows(at::Tensor& gs, at::Tensor& gt, std::array<bool, 2> mask, const at::Tensor& row_scale,
                      int64_t first, int64_t n) {
  const at::Tensor bound = mask[0] && mask[1] ? at::maximum(gs.abs().amax(-1), gt.abs().amax(-1))
                           : (mask[0] ? gs : gt).abs().amax(-1);
  const at::Tensor power = row_powers(bound);
  const at::Tensor factor = at::exp2(power).unsqueeze(-1);
  if (mask[0]) gs = gs * factor;
  if (mask[1]) gt = gt * factor;
  row_scale.view({-1}).narrow(0, first, n).copy_(at::exp2(-power));
}

c10::ScalarType compute_dtype(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == at::kDouble || b.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// A side's transformed logits x and dx/dz: z * scale, then softcap * tanh(x / softcap) where one is given
// (TRL's order); dx/dz is scale * (1 - tanh^2), or the scale alone (undefined at 1: z itself, the same bits).
std::pair<at::Tensor, at::Tensor> transformed(const at::Tensor& z, const DeclaredScalars::Transform& tr) {
  if (tr.identity()) return {z, at::Tensor()};
  const at::Tensor x = tr.scale == 1.0 ? z : z * tr.scale;
  if (tr.softcap == 0.0) return {x, at::full({}, tr.scale, z.options())};
  const at::Tensor th = at::tanh(x / tr.softcap);
  return {th * tr.softcap, (1 - th * th) * tr.scale};
}

// A row mask's where: x's rows where `keep` (a (rows,) bool tensor) is true, 0 elsewhere; x itself without a
// mask. A dropped row is zeroed, never multiplied by 0: a NaN or an infinity there must not reach a sum.
at::Tensor masked(const at::Tensor& x, const at::Tensor& keep) {
  return keep.defined() ? at::where(keep.unsqueeze(-1), x, 0) : x;
}

namespace {

// One element's terms from the logits: p = softmax(x_s / T), q = softmax(x_t / T) of each side's transformed
// logits x (the scale, then the softcap), the value f and its derivatives w.r.t. the log-probabilities s and
// t, and each side's dx/dz (undefined where it is 1). The mixture's m is never formed: s - m and t - m come
// from d = s - t + log(1 - beta) - log(beta) through softplus, exact where p and q underflow.
struct Terms {
  at::Tensor p, q, f, ds, dt;
  at::Tensor slope_s, slope_t;
};

// The declared beta's position among the member's scalars (losses.h).
constexpr int kBeta = row_scalar(GeneralizedJsd::decl.rows, "beta");

Terms jsd_terms(const at::Tensor& zs, const at::Tensor& zt, const DeclaredScalars& scalars) {
  const double beta = scalars.real(kBeta), temperature = scalars.temperature();
  const auto [xs, slope_s] = transformed(zs, scalars.transform(0));
  const auto [xt, slope_t] = transformed(zt, scalars.transform(1));
  const at::Tensor s = at::log_softmax(xs / temperature, -1);
  const at::Tensor t = at::log_softmax(xt / temperature, -1);
  Terms r{s.exp(), t.exp(), {}, {}, {}, slope_s, slope_t};
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
    if (e.slope_s.defined()) gs = gs * e.slope_s;
  }
  if (mask[1]) {
    const at::Tensor a = w * e.dt;
    gt = (a - e.q * a.sum(-1, true)) / temperature;
    if (e.slope_t.defined()) gt = gt * e.slope_t;
  }
  return {gs, gt};
}


// Calls fn(zs, zt, keep, first_row) for every chunk of rows: the chunk's logits in the compute dtype (copies of
// the chunk alone, the dropped rows zeroed: their logits reach no formula), the rows' keep mask (undefined
// without labels), the chunk's first row. `rows_per_chunk`: 0 for chunk_rows's, relative to the call's rows.
// Never called for empty logits.
template <typename Fn>
void for_each_chunk(const RowCall& c, const at::Tensor& keep, const Fn& fn, int64_t rows_per_chunk = 0) {
  std::vector<std::pair<at::Tensor, at::Tensor>> blocks;
  row_blocks(c.student, c.teacher, blocks);
  const int64_t vocab = c.student.size(-1);
  const int64_t chunk = rows_per_chunk > 0 ? rows_per_chunk
      : chunk_rows(c.student.numel() / vocab, vocab, std::max(c.student.element_size(), c.teacher.element_size()),
                   kCompositeTemporaries);
  const auto dtype = compute_dtype(c.student, c.teacher);
  int64_t first = 0;
  for (const auto& [zs, zt] : blocks) {
    for (int64_t start = 0; start < zs.size(0); start += chunk) {
      const int64_t n = std::min(chunk, zs.size(0) - start);
      const at::Tensor k = keep.defined() ? keep.narrow(0, first + start, n) : keep;
      // One copy of each side alive at a time: the unmasked one is released as the masked one replaces it.
      at::Tensor s = zs.narrow(0, start, n).to(dtype);
      s = masked(s, k);
      at::Tensor t = zt.narrow(0, start, n).to(dtype);
      t = masked(t, k);
      fn(s, t, k, first + start);
    }
    first += zs.size(0);
  }
}


// The count "mean" divides by: the elements of the rows kept.
at::Tensor mean_count(const RowCall& c, const at::Tensor& keep, const at::TensorOptions& options) {
  const int64_t vocab = c.student.size(-1);
  if (!keep.defined()) return at::scalar_tensor(static_cast<double>(c.student.numel()), options);
  return keep.sum().to(options.dtype()) * static_cast<double>(vocab);
}

}  // namespace

at::Tensor forward(GeneralizedJsd, const RowCall& c) {
  const at::Tensor keep = keep_mask(c.labels, c.ignore_index);
  if (c.student.numel() == 0) return empty_forward(c, keep);
  const auto result = result_dtype(c);
  const auto options = c.student.options().dtype(compute_dtype(c.student, c.teacher));
  if (c.reduction == kNone) {
    // Without labels every row in place; with them the kept rows, each chunk's after the earlier chunks'.
    const std::optional<KeptRows> kept = keep.defined() ? std::optional<KeptRows>(KeptRows(keep)) : std::nullopt;
    at::Tensor values = kept ? at::empty({kept->total(), c.student.size(-1)}, c.student.options().dtype(result))
                             : at::empty(c.student.sizes(), c.student.options().dtype(result));
    for_each_chunk(c, keep, [&](const at::Tensor& zs, const at::Tensor& zt, const at::Tensor& k, int64_t first) {
      const int64_t n = zs.size(0);
      if (kept && kept->between(first, first + n) == 0) return;
      const at::Tensor f = jsd_terms(zs, zt, c.scalars).f;
      if (kept) {
        values.narrow(0, kept->before[first], kept->between(first, first + n)).copy_(rows_where(f, k));
      } else {
        rows_of(values, first, n).copy_(f);
      }
    });
    return values;
  }
  at::Tensor total = at::zeros({}, options);
  for_each_chunk(c, keep, [&](const at::Tensor& zs, const at::Tensor& zt, const at::Tensor& k, int64_t) {
    total += masked(jsd_terms(zs, zt, c.scalars).f, k).sum();
  });
  if (c.reduction == kMean) total = total / mean_count(c, keep, options);
  return total.to(result);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_grads(
    GeneralizedJsd, const RowCall& c, std::array<bool, 2> mask, int64_t rows_per_chunk) {
  const at::Tensor keep = keep_mask(c.labels, c.ignore_index);
  at::Tensor gs = gradient_or_empty(c.student, mask[0]), gt = gradient_or_empty(c.teacher, mask[1]);
  const at::Tensor row_scale = at::ones(leading_shape(c.student), c.student.options().dtype(at::kFloat));
  if (c.student.numel() == 0) return {empty_forward(c, keep), gs, gt, row_scale};
  const auto result = result_dtype(c);
  const auto options = c.student.options().dtype(compute_dtype(c.student, c.teacher));
  const bool scaled = scales_rows(c.student, c.teacher, mask);
  // Every element's weight: 1, or 1 / count for "mean" (inf when no row is kept: no kept row to weigh).
  const at::Tensor count = c.reduction == kMean ? mean_count(c, keep, options) : at::ones({}, options);
  const at::Tensor weight = 1.0 / count;
  at::Tensor total = at::zeros({}, options);
  for_each_chunk(c, keep, [&](const at::Tensor& zs, const at::Tensor& zt, const at::Tensor& k, int64_t first) {
    const int64_t n = zs.size(0);
    const Terms e = jsd_terms(zs, zt, c.scalars);
    total += masked(e.f, k).sum();
    auto [cs, ct] = logit_gradients(e, weight, c.scalars.temperature(), mask);
    if (mask[0]) cs = masked(cs, k);
    if (mask[1]) ct = masked(ct, k);
    if (scaled) scale_chunk_rows(cs, ct, mask, row_scale, first, n);  // float16
    if (mask[0]) rows_of(gs, first, n).copy_(cs);
    if (mask[1]) rows_of(gt, first, n).copy_(ct);
  }, rows_per_chunk);
  return {(total / count).to(result), gs, gt, row_scale};  // the forward's division, the same bits
}

std::tuple<at::Tensor, at::Tensor> backward(
    GeneralizedJsd, const RowCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask) {
  const at::Tensor keep = keep_mask(c.labels, c.ignore_index);
  at::Tensor gs = gradient_or_empty(c.student, mask[0]), gt = gradient_or_empty(c.teacher, mask[1]);
  // 'none' with labels: grad_output has one row per row kept, the kept rows of each chunk after the earlier
  // chunks' ('none' is exempt from the memory bounds).
  const std::optional<KeptRows> kept =
      c.reduction == kNone && keep.defined() ? std::optional<KeptRows>(KeptRows(keep)) : std::nullopt;
  if (kept) check_grad_output_rows(GeneralizedJsd::decl.backward, grad_output, kept->total());
  if (c.student.numel() == 0) return {gs, gt};
  const auto options = c.student.options().dtype(compute_dtype(c.student, c.teacher));
  const int64_t vocab = c.student.size(-1);
  const at::Tensor weights =
      c.reduction == kNone ? grad_output.to(options.dtype()).contiguous().view({-1, vocab}) : at::Tensor();
  const at::Tensor weight = c.reduction == kNone ? at::Tensor()
      : c.reduction == kMean ? grad_output.to(options.dtype()) / mean_count(c, keep, options)
                             : grad_output.to(options.dtype());
  for_each_chunk(c, keep, [&](const at::Tensor& zs, const at::Tensor& zt, const at::Tensor& k, int64_t first) {
    const int64_t n = zs.size(0);
    const Terms e = jsd_terms(zs, zt, c.scalars);
    at::Tensor w = weight;
    if (c.reduction == kNone && !kept) {
      w = weights.narrow(0, first, n);
    } else if (kept) {
      w = at::zeros({n, vocab}, options);
      const int64_t here = kept->between(first, first + n);
      // index_put_ rather than index_copy_: the same rows, through an op every chip's aclnn has.
      if (here > 0) w.index_put_({k.nonzero().squeeze(1)}, weights.narrow(0, kept->before[first], here));
    }
    const auto [cs, ct] = logit_gradients(e, w, c.scalars.temperature(), mask);
    if (mask[0]) rows_of(gs, first, n).copy_(masked(cs, k));
    if (mask[1]) rows_of(gt, first, n).copy_(masked(ct, k));
  });
  return {gs, gt};
}

at::Tensor forward_differentiable(GeneralizedJsd, const RowCall& c) {
  const LossDecl& d = GeneralizedJsd::decl;
  row_forward_spec<c10::SymInt>(d, d.forward, c);
  const auto dtype = compute_dtype(c.student, c.teacher);
  const bool labels = c.labels.has_value() && c.labels->defined();
  // The rows kept, of the leading shape; the dropped rows' logits zeroed (their derivatives then stay finite).
  const at::Tensor keep = labels ? c.labels->to(at::kLong) != c.ignore_index : at::Tensor();
  const at::Tensor f = jsd_terms(masked(c.student.to(dtype), keep), masked(c.teacher.to(dtype), keep), c.scalars).f;
  if (c.reduction == kNone) {
    if (!labels) return f.to(result_dtype(c));
    const int64_t rows = c10::multiply_integers(leading_shape(c.student));
    return rows_where(f.reshape({rows, f.size(-1)}), keep.reshape(-1)).to(result_dtype(c));
  }
  const at::Tensor total = masked(f, keep).sum();
  if (c.reduction == kSum) return total.to(result_dtype(c));
  const at::Tensor count = labels ? keep.sum() * c.student.size(-1) : at::scalar_tensor(static_cast<double>(f.numel()));
  return (total / count).to(result_dtype(c));
}

std::tuple<at::Tensor, at::Tensor> backward_differentiable(
    GeneralizedJsd, const RowCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask) {
  const LossDecl& d = GeneralizedJsd::decl;
  row_backward_spec<c10::SymInt>(d, grad_output, c);
  const auto dtype = compute_dtype(c.student, c.teacher);
  const bool labels = c.labels.has_value() && c.labels->defined();
  const at::Tensor keep = labels ? c.labels->to(at::kLong) != c.ignore_index : at::Tensor();
  const Terms e = jsd_terms(masked(c.student.to(dtype), keep), masked(c.teacher.to(dtype), keep), c.scalars);
  at::Tensor w = grad_output.to(dtype);
  if (c.reduction == kNone) {
    if (labels) w = at::zeros_like(e.f).masked_scatter(keep.unsqueeze(-1).expand_as(e.f), w);
  } else if (c.reduction == kMean) {
    w = w / (labels ? keep.sum() * c.student.size(-1) : at::scalar_tensor(static_cast<double>(e.f.numel()), w.options()));
  }
  auto [gs, gt] = logit_gradients(e, w, c.scalars.temperature(), mask);
  return {mask[0] ? masked(gs, keep).to(c.student.scalar_type()) : at::empty({0}, c.student.options()),
          mask[1] ? masked(gt, keep).to(c.teacher.scalar_type()) : at::empty({0}, c.teacher.options())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_grads_differentiable(
    GeneralizedJsd, const RowCall& c, std::array<bool, 2> mask) {
  const LossDecl& d = GeneralizedJsd::decl;
  row_with_grads_spec<c10::SymInt>(d, c);
  const at::Tensor loss = forward_differentiable(GeneralizedJsd{}, c);
  auto [gs, gt] = backward_differentiable(GeneralizedJsd{}, c, at::ones({}, loss.options()), mask);
  return {loss, gs, gt, at::ones(leading_shape(c.student), c.student.options().dtype(at::kFloat))};
}

}  // namespace npu_loss::composite
