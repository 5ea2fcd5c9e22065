// The sparse JSD made of ATen ops (rows.h; losses.h's SparseJsd): a served teacher's top-k log-probabilities
// against the student's full log-softmax, chunk by chunk of rows or on whole tensors. Every step computes in
// float32 (float64 for float64 inputs); docs/semantics.md, "Distillation from a served teacher", has the
// formulas, and the CPU kernel (cpu/sparse_jsd_kernel.h) computes the same terms.
//
// The values are TRL 1.16's ops in TRL's order (the gather, the masks, the tail's clamp, nan_to_num and the
// mixture's clamp_min), so that autograd through them (double backward, forward AD, vmap) differentiates what
// TRL differentiates. The gradients are those derivatives written out: the per-entry ones, then the chain
// through the tail or the renormalization, then the log-softmax's, -p * sum(G) with G added at the ids.
#include <ATen/ATen.h>

#include <c10/util/accumulate.h>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "../core/checks.h"
#include "../core/reduction.h"
#include "rows.h"

namespace npu_loss::composite {
namespace {

constexpr int kBeta = row_scalar(SparseJsd::decl.rows, "beta");
constexpr double kTailLogMassMax = SparseJsd::kTailLogMassMax;

// torch.nan_to_num(x) (NaN 0, an infinity the dtype's largest finite value) and torch.isfinite(x), from ops every
// device runs through its own kernels (torch_npu sends nan_to_num and isfinite to kernels of its older path).
at::Tensor nan_to_zero(const at::Tensor& x) {
  const double largest = x.scalar_type() == at::kDouble ? std::numeric_limits<double>::max()
                                                        : static_cast<double>(std::numeric_limits<float>::max());
  return at::where(x != x, 0.0, x).clamp(-largest, largest);
}
at::Tensor finite_values(const at::Tensor& x) {
  return x.abs() < std::numeric_limits<double>::infinity();
}

// A chunk of rows: the student's logits (n, V) in the compute dtype, the teacher's log-probabilities (n, K) in
// it too, the ids (int64, 0 where off) and the mask (bool, or undefined: all on), each (n, K).
struct Chunk {
  at::Tensor zs, teacher, ids, on;
};

// What a chunk's formulas make: the entries' values (n, E), and the gradients asked for: the student's w.r.t.
// its logits (n, V) and the teacher's w.r.t. its log-probabilities (n, K).
struct Made {
  at::Tensor f, gs, gt;
};

// The chunk's values and, where `w` is defined (the weights of the entries: a 0-dim tensor or (n, E)), the
// gradients `mask` asks for: the support's terms (sparse_support_terms), then the log-softmax's chain,
// -p * sum(G) everywhere with G added at the ids.
Made sparse_terms(const Chunk& c, const DeclaredScalars& scalars, const at::Tensor& w, std::array<bool, 2> mask) {
  const double temperature = scalars.temperature();
  const auto [x, slope] = transformed(c.zs, scalars.transform(0));
  const at::Tensor log_p = at::log_softmax(x / temperature, -1);
  const at::Tensor support_on = c.on.defined() ? c.on : at::ones(c.ids.sizes(), c.ids.options().dtype(at::kBool));
  const at::Tensor neg_inf = at::full({}, -std::numeric_limits<double>::infinity(), log_p.options());
  const SupportTerms terms = sparse_support_terms(at::where(support_on, log_p.gather(-1, c.ids), neg_inf),
                                                  c.teacher, support_on, scalars, w, mask);
  Made r{terms.f, at::Tensor(), terms.gt};
  if (!terms.g.defined()) return r;
  // -p * sum(G) everywhere, then G added at the ids (index_put_ with accumulation: an op every device's own
  // kernels run; a masked entry's id 0 adds its G of 0).
  const int64_t k = c.ids.size(-1), vocab = log_p.size(-1);
  const at::Tensor ids = c.ids.reshape({-1, k});
  const at::Tensor rows = at::arange(ids.size(0), ids.options()).unsqueeze(1).expand_as(ids);
  at::Tensor gs = (-log_p.exp() * terms.g.sum(-1, true)).reshape({-1, vocab});
  gs = gs.index_put({rows, ids}, terms.g.reshape({-1, k}), /*accumulate=*/true).view(log_p.sizes()) / temperature;
  r.gs = slope.defined() ? gs * slope : gs;
  return r;
}

// The call's chunks of rows: fn(chunk, keep, first_row) with the chunk's logits copied to the compute dtype
// (the dropped rows zeroed: their logits reach no formula), the rows' keep mask (undefined without labels) and the
// chunk's first row. Never called for empty logits.
template <typename Fn>
void for_each_chunk(const RowCall& c, const SupportIds& support, const at::Tensor& keep, int64_t rows_per_chunk,
                    const Fn& fn) {
  const int64_t vocab = c.student.size(-1), k = c.teacher.size(-1);
  const int64_t rows = c.student.numel() / vocab;
  std::vector<std::pair<at::Tensor, at::Tensor>> blocks;
  row_blocks(c.student, c.teacher, blocks);
  const int64_t chunk = rows_per_chunk > 0 ? rows_per_chunk
      : chunk_rows(rows, vocab, c.student.element_size(), kCompositeTemporaries);
  const auto dtype = compute_dtype(c.student, c.teacher);
  const at::Tensor teacher = c.teacher.reshape({rows, k});
  int64_t first = 0;
  for (const auto& block : blocks) {
    const at::Tensor& zs = block.first;
    for (int64_t start = 0; start < zs.size(0); start += chunk) {
      const int64_t n = std::min(chunk, zs.size(0) - start), row = first + start;
      const at::Tensor kk = keep.defined() ? keep.narrow(0, row, n) : keep;
      Chunk ch{masked(zs.narrow(0, start, n).to(dtype), kk), teacher.narrow(0, row, n).to(dtype),
               support.ids.narrow(0, row, n), support.on.defined() ? support.on.narrow(0, row, n) : at::Tensor()};
      fn(ch, kk, row);
    }
    first += zs.size(0);
  }
}

SupportIds checked_support(const RowCall& c, const at::Tensor& keep) {
  const int64_t vocab = c.student.size(-1);
  return support_ids(SparseJsd::decl.forward, SparseJsd::decl.rows, c.inputs, keep, c.student.numel() / std::max<int64_t>(vocab, 1), vocab);
}

int64_t entries_of(const RowCall& c) {
  return c.teacher.size(-1) + (c.scalars.tail() ? 1 : 0);
}

// The values' shape without labels: the leading shape and the entries.
std::vector<int64_t> values_shape(const RowCall& c) {
  std::vector<int64_t> shape(c.student.sizes().begin(), c.student.sizes().end());
  shape.back() = entries_of(c);
  return shape;
}

at::Tensor mean_count(const RowCall& c, const at::Tensor& keep, const at::TensorOptions& options) {
  const double per_row = static_cast<double>(entries_of(c));
  if (!keep.defined()) return at::scalar_tensor(static_cast<double>(c.teacher.numel() / c.teacher.size(-1)) * per_row, options);
  return keep.sum().to(options.dtype()) * per_row;
}

// Empty logits (no row, or V = 0): 'none' empty, 'sum' 0, 'mean' NaN.
at::Tensor empty_sparse_forward(const RowCall& c, const at::Tensor& keep) {
  const auto options = c.student.options().dtype(result_dtype(c));
  if (c.reduction == kNone) {
    return keep.defined() ? at::empty({keep.sum().item<int64_t>(), entries_of(c)}, options)
                          : at::empty(values_shape(c), options);
  }
  return at::full({}, c.reduction == kSum ? 0.0 : std::numeric_limits<double>::quiet_NaN(), options);
}

}  // namespace

SupportTerms sparse_support_terms(const at::Tensor& s_raw, const at::Tensor& teacher, const at::Tensor& support_on,
                                  const DeclaredScalars& scalars, const at::Tensor& w, std::array<bool, 2> mask) {
  const double beta = scalars.real(kBeta);
  const bool tail = scalars.tail();
  const at::Tensor neg_inf = at::full({}, -std::numeric_limits<double>::infinity(), s_raw.options());
  const at::Tensor t_raw = at::where(support_on, teacher, neg_inf);
  const at::Tensor ls = at::logsumexp(s_raw, -1, true), lt = at::logsumexp(t_raw, -1, true);
  at::Tensor s, t;
  if (tail) {
    s = at::cat({s_raw, at::log(-at::expm1(ls.clamp_max(kTailLogMassMax)))}, -1);
    t = at::cat({t_raw, at::log(-at::expm1(lt.clamp_max(kTailLogMassMax)))}, -1);
  } else {
    s = s_raw - ls;
    t = t_raw - lt;
  }
  const at::Tensor on = tail ? at::cat({support_on, at::ones_like(support_on.narrow(-1, 0, 1))}, -1) : support_on;
  const at::Tensor zero = at::zeros({}, s.options());
  const at::Tensor s0 = at::where(on, s, zero), t0 = at::where(on, t, zero);
  const at::Tensor p = at::where(on, s.exp(), zero), q = at::where(on, t.exp(), zero);
  SupportTerms r;
  // Each entry's value and, for the gradients, its derivatives w.r.t. s and t (0 where off, or where
  // nan_to_num's input is not finite: its gradient passes only finite values).
  at::Tensor ds, dt;
  const bool grads = w.defined() && (mask[0] || mask[1]);
  if (beta == 0) {
    const at::Tensor a = q * (t0 - s0);
    r.f = nan_to_zero(a);
    if (grads) {
      const at::Tensor ok = finite_values(a) & on;
      ds = at::where(ok, -q, zero);
      dt = at::where(ok, a + q, zero);
    }
  } else if (beta == 1) {
    const at::Tensor a = p * (s0 - t0);
    r.f = nan_to_zero(a);
    if (grads) {
      const at::Tensor ok = finite_values(a) & on;
      ds = at::where(ok, a + p, zero);
      dt = at::where(ok, -p, zero);
    }
  } else {
    const double tiny = s.scalar_type() == at::kDouble ? std::numeric_limits<double>::min()
                                                        : static_cast<double>(std::numeric_limits<float>::min());
    const at::Tensor mixture = (1 - beta) * p + beta * q;
    const at::Tensor m = at::where(on, at::log(mixture.clamp_min(tiny)), zero);
    const at::Tensor a = q * (t0 - m), b = p * (s0 - m);
    r.f = beta * nan_to_zero(a) + (1 - beta) * nan_to_zero(b);
    if (grads) {
      const at::Tensor active = (mixture >= tiny) & on;
      const at::Tensor dm_dp = at::where(active, (1 - beta) / mixture, zero);
      const at::Tensor dm_dq = at::where(active, beta / mixture, zero);
      const at::Tensor fa = at::where(finite_values(a) & on, beta, 0.0).to(s.scalar_type());
      const at::Tensor fb = at::where(finite_values(b) & on, 1 - beta, 0.0).to(s.scalar_type());
      ds = fa * (-q * dm_dp * p) + fb * (b + p - p * dm_dp * p);
      dt = fa * (a + q - q * dm_dq * q) + fb * (-p * dm_dq * q);
    }
  }
  if (!grads) return r;
  const int64_t k = s_raw.size(-1);
  // Back to the support's log-probabilities: through the tail (-a_tail p_j / (1 - mass) where the clamp
  // passes) or the renormalization (a_j - softmax_j * sum(a)).
  const auto chain = [&](const at::Tensor& d, const at::Tensor& raw, const at::Tensor& log_mass) {
    const at::Tensor a = w * d;
    if (tail) {
      const at::Tensor entries = a.narrow(-1, 0, k), bucket = a.narrow(-1, k, 1);
      const at::Tensor factor = at::where(log_mass <= kTailLogMassMax, bucket / at::expm1(log_mass), zero);
      return at::where(support_on, entries + factor * raw.exp(), zero);
    }
    const at::Tensor sum = a.sum(-1, true);
    return at::where(support_on, a - (raw - log_mass).exp() * sum, zero);
  };
  if (mask[0]) r.g = chain(ds, s_raw, ls);
  if (mask[1]) r.gt = chain(dt, t_raw, lt);
  return r;
}

at::Tensor forward(SparseJsd, const RowCall& c) {
  const at::Tensor keep = keep_mask(c.labels, c.ignore_index);
  if (c.student.numel() == 0) return empty_sparse_forward(c, keep);
  const SupportIds support = checked_support(c, keep);
  const auto result = result_dtype(c);
  const auto options = c.student.options().dtype(compute_dtype(c.student, c.teacher));
  const int64_t entries = entries_of(c);
  if (c.reduction == kNone) {
    const std::optional<KeptRows> kept = keep.defined() ? std::optional<KeptRows>(KeptRows(keep)) : std::nullopt;
    at::Tensor values = kept ? at::empty({kept->total(), entries}, c.student.options().dtype(result))
                             : at::empty(values_shape(c), c.student.options().dtype(result));
    for_each_chunk(c, support, keep, 0, [&](const Chunk& ch, const at::Tensor& k, int64_t first) {
      const int64_t n = ch.zs.size(0);
      if (kept && kept->between(first, first + n) == 0) return;
      const at::Tensor f = sparse_terms(ch, c.scalars, {}, {false, false}).f;
      if (kept) {
        values.narrow(0, kept->before[first], kept->between(first, first + n)).copy_(rows_where(f, k));
      } else {
        rows_of(values, first, n).copy_(f);
      }
    });
    return values;
  }
  at::Tensor total = at::zeros({}, options);
  for_each_chunk(c, support, keep, 0, [&](const Chunk& ch, const at::Tensor& k, int64_t) {
    total += masked(sparse_terms(ch, c.scalars, {}, {false, false}).f, k).sum();
  });
  if (c.reduction == kMean) total = total / mean_count(c, keep, options);
  return total.to(result);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_grads(
    SparseJsd, const RowCall& c, std::array<bool, 2> mask, int64_t rows_per_chunk) {
  const at::Tensor keep = keep_mask(c.labels, c.ignore_index);
  at::Tensor gs = gradient_or_empty(c.student, mask[0]), gt = gradient_or_empty(c.teacher, mask[1]);
  const at::Tensor row_scale = at::ones(leading_shape(c.student), c.student.options().dtype(at::kFloat));
  if (c.student.numel() == 0) return {empty_sparse_forward(c, keep), gs, gt, row_scale};
  const SupportIds support = checked_support(c, keep);
  const auto result = result_dtype(c);
  const auto options = c.student.options().dtype(compute_dtype(c.student, c.teacher));
  const bool scaled = scales_rows(c.student, c.teacher, mask);
  const at::Tensor count = c.reduction == kMean ? mean_count(c, keep, options) : at::ones({}, options);
  const at::Tensor weight = 1.0 / count;
  at::Tensor total = at::zeros({}, options);
  for_each_chunk(c, support, keep, rows_per_chunk, [&](const Chunk& ch, const at::Tensor& k, int64_t first) {
    const int64_t n = ch.zs.size(0);
    Made e = sparse_terms(ch, c.scalars, weight, mask);
    total += masked(e.f, k).sum();
    if (mask[0]) e.gs = masked(e.gs, k);
    if (mask[1]) e.gt = masked(e.gt, k);
    if (scaled) scale_chunk_rows(e.gs, e.gt, mask, row_scale, first, n);  // float16
    if (mask[0]) rows_of(gs, first, n).copy_(e.gs);
    if (mask[1]) rows_of(gt, first, n).copy_(e.gt);
  });
  return {(total / count).to(result), gs, gt, row_scale};
}

std::tuple<at::Tensor, at::Tensor> backward(
    SparseJsd, const RowCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask) {
  const at::Tensor keep = keep_mask(c.labels, c.ignore_index);
  at::Tensor gs = gradient_or_empty(c.student, mask[0]), gt = gradient_or_empty(c.teacher, mask[1]);
  const std::optional<KeptRows> kept =
      c.reduction == kNone && keep.defined() ? std::optional<KeptRows>(KeptRows(keep)) : std::nullopt;
  if (kept) check_grad_output_rows(SparseJsd::decl.backward, grad_output, kept->total());
  if (c.student.numel() == 0) return {gs, gt};
  const SupportIds support = checked_support(c, keep);
  const auto options = c.student.options().dtype(compute_dtype(c.student, c.teacher));
  const int64_t entries = entries_of(c);
  const at::Tensor weights =
      c.reduction == kNone ? grad_output.to(options.dtype()).contiguous().view({-1, entries}) : at::Tensor();
  const at::Tensor weight = c.reduction == kNone ? at::Tensor()
      : c.reduction == kMean ? grad_output.to(options.dtype()) / mean_count(c, keep, options)
                             : grad_output.to(options.dtype());
  for_each_chunk(c, support, keep, 0, [&](const Chunk& ch, const at::Tensor& k, int64_t first) {
    const int64_t n = ch.zs.size(0);
    at::Tensor w = weight;
    if (c.reduction == kNone && !kept) {
      w = weights.narrow(0, first, n);
    } else if (kept) {
      w = at::zeros({n, entries}, options);
      const int64_t here = kept->between(first, first + n);
      if (here > 0) w.index_put_({k.nonzero().squeeze(1)}, weights.narrow(0, kept->before[first], here));
    }
    const Made e = sparse_terms(ch, c.scalars, w, mask);
    if (mask[0]) rows_of(gs, first, n).copy_(masked(e.gs, k));
    if (mask[1]) rows_of(gt, first, n).copy_(masked(e.gt, k));
  });
  return {gs, gt};
}

namespace {

// The whole call as one chunk, every step an ATen op (no host copy of the ids: vmap and the fake tensors of
// torch.compile reach it): the ids where the mask is off are 0, as the chunks' are.
Chunk whole(const RowCall& c, const at::Tensor& keep, c10::ScalarType dtype) {
  const int ids_at = row_input_of(SparseJsd::decl.rows, InputKind::Ids);
  const int mask_at = row_input_of(SparseJsd::decl.rows, InputKind::Mask);
  const at::Tensor on = mask_at >= 0 && c.inputs[mask_at].defined() ? c.inputs[mask_at] : at::Tensor();
  const at::Tensor ids = c.inputs[ids_at].to(at::kLong);
  return {masked(c.student.to(dtype), keep), c.teacher.to(dtype), on.defined() ? at::where(on, ids, 0) : ids, on};
}

}  // namespace

at::Tensor forward_differentiable(SparseJsd, const RowCall& c) {
  const LossDecl& d = SparseJsd::decl;
  row_forward_spec<c10::SymInt>(d, d.forward, c);
  const auto dtype = compute_dtype(c.student, c.teacher);
  const bool labels = c.labels.has_value() && c.labels->defined();
  const at::Tensor keep = labels ? c.labels->to(at::kLong) != c.ignore_index : at::Tensor();
  const at::Tensor f = sparse_terms(whole(c, keep, dtype), c.scalars, {}, {false, false}).f;
  if (c.reduction == kNone) {
    if (!labels) return f.to(result_dtype(c));
    const int64_t rows = c10::multiply_integers(leading_shape(c.student));
    return rows_where(f.reshape({rows, f.size(-1)}), keep.reshape(-1)).to(result_dtype(c));
  }
  const at::Tensor total = masked(f, keep).sum();
  if (c.reduction == kSum) return total.to(result_dtype(c));
  const at::Tensor count = labels ? keep.sum() * f.size(-1) : at::scalar_tensor(static_cast<double>(f.numel()));
  return (total / count).to(result_dtype(c));
}

std::tuple<at::Tensor, at::Tensor> backward_differentiable(
    SparseJsd, const RowCall& c, const at::Tensor& grad_output, std::array<bool, 2> mask) {
  const LossDecl& d = SparseJsd::decl;
  row_backward_spec<c10::SymInt>(d, grad_output, c);
  const auto dtype = compute_dtype(c.student, c.teacher);
  const bool labels = c.labels.has_value() && c.labels->defined();
  const at::Tensor keep = labels ? c.labels->to(at::kLong) != c.ignore_index : at::Tensor();
  const Chunk ch = whole(c, keep, dtype);
  const int64_t entries = entries_of(c);
  at::Tensor w = grad_output.to(dtype);
  if (c.reduction == kNone) {
    if (labels) {
      std::vector<int64_t> shape(c.teacher.sizes().begin(), c.teacher.sizes().end());
      shape.back() = entries;
      w = at::zeros(shape, w.options()).masked_scatter(keep.unsqueeze(-1).expand(shape), w);
    }
  } else if (c.reduction == kMean) {
    const double rows = static_cast<double>(c.teacher.numel() / c.teacher.size(-1));
    w = w / (labels ? keep.sum() * entries : at::scalar_tensor(rows * entries, w.options()));
  }
  const Made e = sparse_terms(ch, c.scalars, w, mask);
  return {mask[0] ? masked(e.gs, keep).to(c.student.scalar_type()) : at::empty({0}, c.student.options()),
          mask[1] ? masked(e.gt, keep).to(c.teacher.scalar_type()) : at::empty({0}, c.teacher.options())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_grads_differentiable(
    SparseJsd, const RowCall& c, std::array<bool, 2> mask) {
  const LossDecl& d = SparseJsd::decl;
  row_with_grads_spec<c10::SymInt>(d, c);
  const at::Tensor loss = forward_differentiable(SparseJsd{}, c);
  auto [gs, gt] = backward_differentiable(SparseJsd{}, c, at::ones({}, loss.options()), mask);
  return {loss, gs, gt, at::ones(leading_shape(c.student), c.student.options().dtype(at::kFloat))};
}

}  // namespace npu_loss::composite
