// The linear form's chunks (linear.h). docs/semantics.md, "The fused linear JSD", has what each result is.
#include "linear.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "../core/reduction.h"

namespace npu_loss::composite {
namespace {

// The dtype of the sums, the bias gradients and the hard loss's probabilities: float32, or float64 for a
// float64 input.
at::ScalarType accumulate_dtype(c10::ScalarType result) {
  return result == at::kDouble ? at::kDouble : at::kFloat;
}

int64_t itemsize(c10::ScalarType dtype) {
  return static_cast<int64_t>(c10::elementSize(dtype));
}

// fn(first, count) over blocks of a chunk's rows of about kBlockElements elements each: an op of two dtypes
// (a bfloat16 gradient and float32 probabilities) makes a float32 temporary of its operands' size, which a
// block keeps small.
constexpr int64_t kBlockElements = int64_t{1} << 20;

template <typename Fn>
void in_row_blocks(int64_t rows, int64_t vocab, const Fn& fn) {
  const int64_t block = std::max<int64_t>(1, kBlockElements / std::max<int64_t>(vocab, 1));
  for (int64_t first = 0; first < rows; first += block) fn(first, std::min(block, rows - first));
}

// The power of two float16's stored gradients are multiplied by (the node divides it out with grad_output):
// the largest factor a chunk's logits gradient is scaled by, brought to about 1, so that the division of
// 'mean' by K * V does not flush them to zero before grad_output reaches them. 1 for every other dtype.
double stored_scale(double largest_factor, bool half) {
  if (!half || !(largest_factor > 0) || !std::isfinite(largest_factor)) return 1.0;
  int exponent;
  std::frexp(largest_factor, &exponent);  // largest_factor in [2^(exponent - 1), 2^exponent); frexp, not log2,
                                          // keeps the wheel's glibc floor (log2 is versioned 2.29)
  return std::ldexp(1.0, std::clamp(1 - exponent, -60, 60));
}

// Whether a side (0 the student, 1 the teacher) gets any gradient: its input's, weight's or bias's.
bool wants_grads(std::array<bool, 6> mask, int side) {
  return mask[3 * side] || mask[3 * side + 1] || mask[3 * side + 2];
}

// Whether the teacher is given over a support (losses.h's LinearForm): no teacher logits, no teacher products.
bool over_support(const LinearCall& c) {
  return c.scalars.args->teacher == TeacherForm::Support;
}

ProductKind kind_of(const RowStep& step, const at::Tensor& x) {
  return step.resources.kind ? step.resources.kind(x) : ProductKind::Aten;
}

class AtenProducts final : public SideProducts {
 public:
  AtenProducts(const at::Tensor& w, const std::optional<at::Tensor>& b) : w_(w), b_(b) {}
  void logits(at::Tensor& out, const at::Tensor& xc) override { logits_into(out, xc, w_, b_); }
  void grads(const at::Tensor& g, const at::Tensor& xc, at::Tensor dx, at::Tensor dw, bool first) override {
    if (dx.defined()) at::mm_out(dx, g, w_);
    if (dw.defined()) dw.addmm_(g.t(), xc, /*beta=*/first ? 0 : 1);
  }

 private:
  const at::Tensor& w_;
  const std::optional<at::Tensor>& b_;
};

}  // namespace

// x @ w.T (+ b) into `out`, through addmm (beta 0 without a bias: out's contents are ignored): on CPU,
// at::mm_out into a buffer with a transposed weight makes a temporary of the buffer's size first (measured,
// bfloat16 and float32), addmm_out does not.
void logits_into(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b) {
  if (b.has_value() && b->defined()) {
    at::addmm_out(out, *b, x, w.t());
  } else {
    at::addmm_out(out, out, x, w.t(), /*beta=*/0);
  }
}
std::unique_ptr<SideProducts> aten_products(const at::Tensor& w, const std::optional<at::Tensor>& b) {
  return std::make_unique<AtenProducts>(w, b);
}

bool teacher_in_halves(const LinearCall& c, std::array<bool, 6> mask, const RowStep& step) {
  return !over_support(c) && step.in_place && step.fuses && !wants_grads(mask, 1) &&
         kind_of(step, *c.input[0]) != ProductKind::Float32Blocks &&
         kind_of(step, *c.input[1]) != ProductKind::Float32Blocks;
}

int64_t linear_row_bytes(const LinearSpec& spec, const LinearCall& c, std::array<bool, 6> mask, const RowStep& step) {
  // A support's values and gradient are K per row, not V: not counted.
  const int64_t s = itemsize(c.input[0]->scalar_type()), t = over_support(c) ? 0 : itemsize(c.input[1]->scalar_type());
  const bool probs = spec.labels && (c.weight_hard != 0 || c.return_parts) && !step.fuses;
  int64_t bytes = s + (teacher_in_halves(c, mask, step) ? t / 2 : t) +
                  (probs ? itemsize(accumulate_dtype(spec.dtype)) : 0) + step.scratch_bytes;
  // A softcapped side whose gradient is made keeps its logits' slope in the accumulate dtype (transform_chunk),
  // unless the step fuses the transform.
  const int64_t slope = itemsize(accumulate_dtype(spec.dtype));
  if (!step.fuses && wants_grads(mask, 0) && c.scalars.transform(0).softcap != 0) bytes += slope;
  if (!step.fuses && wants_grads(mask, 1) && c.scalars.transform(1).softcap != 0) bytes += slope;
  if (!step.in_place) bytes += (wants_grads(mask, 0) ? s : 0) + (wants_grads(mask, 1) ? t : 0);
  return bytes * std::max<int64_t>(spec.vocab, 1);
}

int64_t linear_chunk_rows(const LinearSpec& spec, const LinearCall& c, std::array<bool, 6> mask, const RowStep& step) {
  if (c.chunk_size.has_value()) return std::max<int64_t>(1, std::min(*c.chunk_size, spec.rows));
  // In units of the logits' dtype: the result's, or for a support (whose values may be float32 beside 16-bit
  // hidden states) the student's, whose logits alone the chunks make.
  const c10::ScalarType unit = over_support(c) ? c.input[0]->scalar_type() : spec.dtype;
  const int64_t share = spec.rows * std::max<int64_t>(spec.vocab, 1) * itemsize(unit) *
                        (teacher_in_halves(c, mask, step) ? kLinearHalvesShare : kLinearChunkShare) / 16;
  const int64_t budget = std::min(share, kLinearChunkMaxBytes);
  return std::clamp<int64_t>(budget / linear_row_bytes(spec, c, mask, step), 1, std::max<int64_t>(spec.rows, 1));
}

namespace {

// What a call's chunks share, planned before the first: the rows kept (their labels as int64 and the mask of
// them), which parts run, what the soft (row loss) and hard (cross entropy) sums are divided by and weighted
// with, each side's stored scale, and the rows of a chunk and of the teacher's part of it.
struct LinearPlan {
  int64_t n = 0, vocab = 0, kept = 0;
  std::optional<at::Tensor> labels;
  at::Tensor keep;
  bool hard = false, hard_grad = false, fuse = false, halves = false;
  std::array<bool, 2> side_grads{};
  double soft_div = 1, hard_div = 1, soft_factor = 0, hard_factor = 0;
  double scales[2] = {1, 1};
  int64_t chunk = 1, rows = 0, teacher_rows = 0;
  at::ScalarType acc = at::kFloat;  // accumulate_dtype of the result's dtype
};

// The rows kept, from one copy of the labels to the host, with their range checked where the cross entropy
// reads them.
int64_t count_kept(const LinearSpec& spec, const LinearCall& c, const at::Tensor& labels, bool hard) {
  const at::Tensor host = labels.to(at::kCPU).contiguous();
  const int64_t* p = host.const_data_ptr<int64_t>();
  int64_t kept = 0;
  for (int64_t r = 0; r < spec.rows; ++r) {
    if (p[r] == c.ignore_index) continue;
    ++kept;
    TORCH_CHECK_VALUE(
        !hard || (p[r] >= 0 && p[r] < spec.vocab), spec.op, ": with the hard loss, every kept label must be "
        "in [0, ", spec.vocab, ") (the vocabulary), got ", p[r]);
  }
  return kept;
}

LinearPlan plan_linear(const LinearSpec& spec, const LinearCall& c, std::array<bool, 6> mask, const RowStep& step) {
  LinearPlan p;
  p.n = spec.rows;
  p.vocab = spec.vocab;
  p.side_grads = {wants_grads(mask, 0), wants_grads(mask, 1)};
  p.hard = spec.labels && (c.weight_hard != 0 || c.return_parts);
  p.hard_grad = p.hard && c.weight_hard != 0 && p.side_grads[0];
  p.fuse = step.fuses;
  p.acc = accumulate_dtype(spec.dtype);
  p.kept = p.n;
  if (spec.labels) {
    p.labels = c.labels->reshape({p.n}).to(at::kLong);
    p.keep = *p.labels != c.ignore_index;
    p.kept = count_kept(spec, c, *p.labels, p.hard);
  }
  const double kept_rows = static_cast<double>(std::max<int64_t>(p.kept, 1));
  if (spec.reduction == FamilyReduction::BatchMean) {
    p.soft_div = spec.labels ? kept_rows : static_cast<double>(std::max<int64_t>(spec.batch_rows, 1));
    p.hard_div = kept_rows;
  } else if (spec.reduction == FamilyReduction::Mean) {
    p.soft_div = static_cast<double>(p.kept) * static_cast<double>(spec.entries);
    p.hard_div = kept_rows;
  }
  p.soft_factor = c.weight_soft / std::max(p.soft_div, 1.0);
  p.hard_factor = c.weight_hard / p.hard_div;
  // Per side: the student's logits gradient carries the hard loss's factor too.
  p.scales[0] = stored_scale(std::max(p.soft_factor, p.hard_grad ? p.hard_factor : 0.0),
                             c.input[0]->scalar_type() == at::kHalf);
  p.scales[1] = stored_scale(p.soft_factor, c.input[1]->scalar_type() == at::kHalf);
  p.chunk = linear_chunk_rows(spec, c, mask, step);
  p.rows = std::min(p.chunk, p.n);
  // The teacher's logits whole, or in halves of the chunk's rows (linear.h), each part's step run as it is made.
  p.halves = teacher_in_halves(c, mask, step);
  p.teacher_rows = p.halves ? (p.rows + 1) / 2 : p.rows;
  // A support's ids, checked once for the call (so that a message names the row of the call, not of a chunk).
  if (over_support(c)) {
    support_ids(spec.op, *c.scalars.args, linear_support_inputs(*c.scalars.args, c), p.keep, p.n, p.vocab);
  }
  return p;
}

// The cross entropy of a chunk's student logits z where the step does not fuse it: its sum over the kept rows
// taken from hard_sum, and with `grad` its gradient softmax - one_hot, times `factor` on the kept rows, left in
// h (the chunk's rows of the probabilities' buffer), before the row loss may write over z.
void hard_loss_chunk(const at::Tensor& z, at::Tensor& h, const at::Tensor& chunk_keep, const at::Tensor& labels,
                     bool grad, double factor, at::Tensor& hard_sum) {
  const int64_t m = z.size(0);
  const at::Tensor target = at::where(chunk_keep, labels, 0).unsqueeze(-1);
  const at::Tensor rows_index = at::arange(m, target.options());
  h.copy_(z);
  // The label's logit by index (torch_npu's aclnnIndex), not gather: ops-nn's aclnnGather document lists the A2
  // and A3 series alone (docs/aclnn_reference.md, section 11).
  const at::Tensor at_label = h.index({rows_index, target.squeeze(-1)}).unsqueeze(-1);
  const at::Tensor top = std::get<0>(h.max(-1, true));
  h.sub_(top).exp_();
  const at::Tensor total = h.sum({-1}, true);
  const at::Tensor picked = (at_label - top - total.log()).squeeze(-1);  // the log-softmax at the label
  hard_sum.sub_(at::where(chunk_keep, picked, 0).sum().to(hard_sum.scalar_type()));
  if (!grad) return;
  h.div_(total);
  // softmax - one_hot, through index_put_ (torch_npu runs scatter through an aclop kernel)
  h.index_put_({rows_index, target.squeeze(-1)}, at::full({m}, -1.0, h.options()), /*accumulate=*/true);
  h.mul_((chunk_keep.to(h.scalar_type()) * factor).unsqueeze(-1));
}

// The logit transform of a chunk's side (losses.h's ScalarRole::StudentScale ... TeacherSoftcap), in place on
// its logits z, before the hard loss and the step see them (the step then runs with the transform at its
// identity: DeclaredScalars::without_transform): z * scale, then softcap * tanh(z / softcap). With a softcap
// and `slope` defined (of `acc`, the accumulate dtype), slope = scale * (1 - tanh^2), the factor of the side's
// gradient (chain_transform). The tanh runs in `acc` whatever the logits' dtype, as the CPU's kernels and the
// NPU's row path run it: 16-bit logits are converted a row block at a time, and z is rounded once.
void transform_chunk(at::Tensor& z, const DeclaredScalars::Transform& tr, at::Tensor slope, at::ScalarType acc) {
  if (tr.identity()) return;
  if (tr.softcap == 0.0) {
    z.mul_(tr.scale);  // one rounding in any dtype
    return;
  }
  const auto softcap = [&](at::Tensor rows, at::Tensor slope_rows) {
    at::Tensor u = rows.scalar_type() == acc ? rows : rows.to(acc);
    u.mul_(tr.scale / tr.softcap).tanh_();  // one pass for scale / softcap
    if (slope_rows.defined()) slope_rows.copy_(u).mul_(u).neg_().add_(1.0).mul_(tr.scale);
    u.mul_(tr.softcap);
    if (!u.is_same(rows)) rows.copy_(u);
  };
  if (z.scalar_type() == acc) return softcap(z, slope);
  in_row_blocks(z.size(0), z.size(1), [&](int64_t first, int64_t count) {
    softcap(z.narrow(0, first, count), slope.defined() ? slope.narrow(0, first, count) : at::Tensor());
  });
}

// The entropy of the student's tempered distribution, -sum(p * log p) with p = softmax(z / T), of each row of a
// chunk's transformed logits z, where the step does not make it in its passes: into `out` (float32, the chunk's
// rows), in row blocks (its temporaries are a block's), 0 on the rows `keep` drops (undefined: none dropped).
void entropy_chunk(const at::Tensor& z, double temperature, const at::Tensor& keep, at::Tensor out,
                   at::ScalarType acc) {
  in_row_blocks(z.size(0), z.size(1), [&](int64_t first, int64_t count) {
    const at::Tensor log_p = at::log_softmax(z.narrow(0, first, count).to(acc).div(temperature), -1);
    const at::Tensor p = log_p.exp();
    // p * log p is 0 where p is (a logit of -inf, whose log p is -inf: 0 * -inf would be NaN); NaN stays NaN.
    const at::Tensor terms = at::where(p == 0, at::zeros({}, p.options()), p * log_p);
    out.narrow(0, first, count).copy_(terms.sum({-1}).neg());
  });
  if (keep.defined()) out.masked_fill_(keep.logical_not(), 0);
}

// A side's logits gradient g w.r.t. its transformed logits, made the gradient w.r.t. the logits themselves.
void chain_transform(at::Tensor& g, const DeclaredScalars::Transform& tr, const at::Tensor& slope) {
  if (tr.identity()) return;
  if (tr.softcap == 0.0) {
    g.mul_(tr.scale);
  } else {
    g.mul_(slope);
  }
}

// A side's logits gradient g of the loss where the step does not fuse it: the row loss's (times its row scales
// for float16, which need not be representable in float16 themselves) times `factor` (the soft factor and the
// stored scale), plus, for the student, the hard loss's (h, already scaled).
void scale_grad(at::Tensor& g, const at::Tensor& row_scale, bool row_scaled, double factor, const at::Tensor* h,
                at::ScalarType acc) {
  const int64_t m = g.size(0), vocab = g.size(1);
  if (row_scaled) {
    in_row_blocks(m, vocab, [&](int64_t first, int64_t count) {
      const at::Tensor f = row_scale.narrow(0, first, count).to(acc) * factor;
      g.narrow(0, first, count).mul_(f.unsqueeze(-1));
    });
  } else {
    g.mul_(factor);
  }
  if (h == nullptr) return;
  if (g.scalar_type() == h->scalar_type()) {
    g.add_(*h);
  } else {
    in_row_blocks(m, vocab, [&](int64_t first, int64_t count) {
      at::Tensor into = h->narrow(0, first, count);
      g.narrow(0, first, count).copy_(into.add_(g.narrow(0, first, count)));
    });
  }
}

// What the chunks write: the gradients (the inputs' written chunk by chunk, the weights' summed over the
// chunks in their dtype: at::addmm rounds once per chunk), the biases' sums in the accumulation dtype, the
// two losses' sums, and the student's entropy per row where asked for (float32, zeros: a dropped row keeps 0).
struct LinearSums {
  std::array<at::Tensor, 6> grads;
  at::Tensor bias_sum[2];
  at::Tensor soft, hard;
  at::Tensor entropy;
};

LinearSums allocate_sums(const LinearCall& c, const LinearPlan& p, std::array<bool, 6> mask) {
  LinearSums s;
  if (over_support(c)) {  // the values' gradient, (N, K); the ids and the mask get none
    const at::Tensor& t = *c.input[1];
    s.grads[3] = at::empty(mask[3] ? c10::IntArrayRef{p.n, t.size(-1)} : c10::IntArrayRef{0}, t.options());
    s.grads[4] = at::empty({0}, c.weight[1]->options());  // empty tensors of the options Meta gives them
    s.grads[5] = at::empty({0}, t.options());
  }
  for (int side = 0; side < (over_support(c) ? 1 : 2); ++side) {
    const at::Tensor& x = *c.input[side];
    const at::Tensor& w = *c.weight[side];
    const std::optional<at::Tensor>& b = *c.bias[side];
    s.grads[3 * side] = at::empty(mask[3 * side] ? c10::IntArrayRef{p.n, x.size(-1)} : c10::IntArrayRef{0},
                                  x.options());
    // Written by the first chunk (beta 0): zeros only where there is no chunk.
    s.grads[3 * side + 1] = mask[3 * side + 1] ? (p.n > 0 ? at::empty_like(w) : at::zeros_like(w))
                                               : at::empty({0}, w.options());
    if (mask[3 * side + 2] && b.has_value() && b->defined()) {
      s.bias_sum[side] = at::zeros({p.vocab}, w.options().dtype(p.acc));
    }
  }
  // Sums on the host's float64 where the device has it (CPU), else in the accumulation dtype.
  const auto sums = c.input[0]->options().dtype(c.input[0]->is_cpu() ? at::kDouble : p.acc);
  s.soft = at::zeros({}, sums);
  s.hard = at::zeros({}, sums);
  const auto floats = c.input[0]->options().dtype(at::kFloat);
  s.entropy = c.return_entropy ? at::zeros({p.n}, floats) : at::empty({0}, floats);
  return s;
}

// The chunks, one after another: each chunk's student logits, the hard loss where not fused, the teacher's
// logits and the step (over the whole chunk, or over each half of its rows in turn: then the step writes each
// half's student gradient over its logits, and the chunk's products below take the whole chunk), then each
// side's gradients from its logits' gradient.
void run_chunks(const LinearCall& c, const LinearPlan& p, std::array<bool, 6> mask, const RowStep& step,
                const at::Tensor* x[2], LinearSums& s) {
  const ChunkResources& r = step.resources;
  const auto buffer = [&](c10::IntArrayRef sizes, const at::TensorOptions& options) {
    return r.buffer ? r.buffer(sizes, options) : at::empty(sizes, options);
  };
  // The chunk's buffers, allocated once per call (a new one per chunk leaves the C library's heap holding the
  // freed ones), and each side's products, chosen once.
  const bool support = over_support(c);
  at::Tensor logits[2] = {buffer({p.rows, p.vocab}, x[0]->options()),
                          support ? at::Tensor() : buffer({p.teacher_rows, p.vocab}, x[1]->options())};
  at::Tensor probs = p.hard && !p.fuse ? buffer({p.rows, p.vocab}, x[0]->options().dtype(p.acc)) : at::Tensor();
  // The logit transform: made by a step that fuses it in its passes (the CPU's: the call's scalars passed on
  // whole), else here, on each chunk's logits, which the step then sees transformed.
  const DeclaredScalars::Transform tr[2] = {p.fuse ? DeclaredScalars::Transform{} : c.scalars.transform(0),
                                            p.fuse ? DeclaredScalars::Transform{} : c.scalars.transform(1)};
  const DeclaredScalars scalars = p.fuse ? c.scalars : c.scalars.without_transform();
  at::Tensor slopes[2];  // a softcapped side's, where the driver transforms
  for (int side = 0; side < 2; ++side) {
    if (!p.fuse && tr[side].softcap != 0 && p.side_grads[side]) {
      slopes[side] = buffer({side == 0 ? p.rows : p.teacher_rows, p.vocab}, x[side]->options().dtype(p.acc));
    }
  }
  std::unique_ptr<SideProducts> products[2];
  for (int side = 0; side < (support ? 1 : 2); ++side) {
    const ProductKind kind = kind_of(step, *x[side]);
    products[side] = r.products ? r.products(kind, *c.weight[side], *c.bias[side], p.rows)
                                : aten_products(*c.weight[side], *c.bias[side]);
  }
  const std::array<bool, 2> row_mask{p.side_grads[0], p.side_grads[1]};
  // A support's Ids and Mask inputs as (N, K) rows (none for teacher logits).
  RowInputs inputs;
  if (support) {
    inputs = linear_support_inputs(*c.scalars.args, c);
    for (at::Tensor& t : inputs) {
      if (t.defined()) t = t.reshape({p.n, t.size(-1)});
    }
  }
  for (int64_t start = 0; start < p.n; start += p.chunk) {
    const int64_t m = std::min(p.chunk, p.n - start);
    at::Tensor z[2], xc[2] = {x[0]->narrow(0, start, m), x[1]->narrow(0, start, m)};
    z[0] = logits[0].narrow(0, 0, m);
    products[0]->logits(z[0], xc[0]);
    transform_chunk(z[0], tr[0], slopes[0].defined() ? slopes[0].narrow(0, 0, m) : at::Tensor(), p.acc);
    const std::optional<at::Tensor> lab =
        p.labels ? std::optional<at::Tensor>(p.labels->narrow(0, start, m)) : std::nullopt;
    at::Tensor h;
    if (p.hard && !p.fuse) {
      h = probs.narrow(0, 0, m);
      hard_loss_chunk(z[0], h, p.keep.narrow(0, start, m), *lab, p.hard_grad, p.hard_factor * p.scales[0], s.hard);
    }
    const bool entropy = c.return_entropy;
    if (entropy && !p.fuse) {
      entropy_chunk(z[0], c.scalars.temperature(), p.labels ? p.keep.narrow(0, start, m) : at::Tensor(),
                    s.entropy.narrow(0, start, m), p.acc);
    }
    // Fused: the soft factor times the stored scales, the hard loss and the entropy, in the step's passes.
    RowExtras extras{p.soft_factor * p.scales[0], p.scales[1] / p.scales[0], p.hard,
                     p.hard_grad ? p.hard_factor * p.scales[0] : 0.0};
    at::Tensor g[2], row_scale;
    for (int64_t first = 0; first < m; first += p.teacher_rows) {
      const int64_t k = std::min(p.teacher_rows, m - first);
      RowInputs part_inputs;
      if (support) {
        z[1] = xc[1].narrow(0, first, k);
        for (size_t i = 0; i < inputs.size(); ++i) {
          if (inputs[i].defined()) part_inputs[i] = inputs[i].narrow(0, start + first, k);
        }
      } else {
        z[1] = logits[1].narrow(0, 0, k);
        products[1]->logits(z[1], xc[1].narrow(0, first, k));
        transform_chunk(z[1], tr[1], slopes[1].defined() ? slopes[1].narrow(0, 0, k) : at::Tensor(), p.acc);
      }
      const std::optional<at::Tensor> part_labels =
          lab ? std::optional<at::Tensor>(lab->narrow(0, first, k)) : std::nullopt;
      extras.entropy = entropy && p.fuse ? s.entropy.mutable_data_ptr<float>() + start + first : nullptr;
      auto [value, gs, gt, scale] = step.run(z[0].narrow(0, first, k), z[1], part_inputs, part_labels, scalars,
                                             c.ignore_index, row_mask, p.fuse ? &extras : nullptr);
      s.soft.add_(value.to(s.soft.scalar_type()));
      if (p.fuse && p.hard) s.hard.add_(extras.hard_sum);
      g[0] = p.halves ? z[0] : gs;
      g[1] = gt;
      row_scale = scale;
    }
    const bool row_scaled = scales_rows(z[0], z[1], row_mask);
    for (int side = 0; side < 2; ++side) {
      if (!p.side_grads[side]) continue;
      if (!p.fuse) {
        scale_grad(g[side], row_scale, row_scaled, p.soft_factor * p.scales[side],
                   side == 0 && p.hard_grad ? &h : nullptr, p.acc);
      }
      if (!p.fuse) {
        chain_transform(g[side], tr[side], slopes[side].defined() ? slopes[side].narrow(0, 0, m) : at::Tensor());
      }
      if (side == 1 && support) {  // the values' gradient is the step's, of the chunk's rows
        s.grads[3].narrow(0, start, m).copy_(g[1]);
        continue;
      }
      products[side]->grads(g[side], xc[side],
                            mask[3 * side] ? s.grads[3 * side].narrow(0, start, m) : at::Tensor(),
                            mask[3 * side + 1] ? s.grads[3 * side + 1] : at::Tensor(), start == 0);
      if (s.bias_sum[side].defined()) {
        in_row_blocks(m, p.vocab, [&](int64_t first, int64_t count) {
          s.bias_sum[side].add_(g[side].narrow(0, first, count).sum({0}, false, p.acc));
        });
      }
    }
  }
}

}  // namespace

LinearResults linear_with_grads(
    const LossDecl&, const LinearSpec& spec, const LinearCall& c, std::array<bool, 6> mask, const RowStep& step) {
  mask = linear_mask(*c.scalars.args, mask);
  const LinearPlan p = plan_linear(spec, c, mask, step);
  const at::Tensor xs = c.input[0]->reshape({p.n, c.input[0]->size(-1)});
  const at::Tensor xt = c.input[1]->reshape({p.n, c.input[1]->size(-1)});
  const at::Tensor* x[2] = {&xs, &xt};
  LinearSums s = allocate_sums(c, p, mask);
  run_chunks(c, p, mask, step, x, s);

  // The results: the parts divided, the loss weighted, each rounded once to the result's dtype.
  at::Tensor soft = s.soft / p.soft_div;
  if (spec.reduction == FamilyReduction::Mean && p.kept == 0) {
    soft = at::full({}, std::numeric_limits<double>::quiet_NaN(), soft.options());
  }
  const at::Tensor hard_value = s.hard / p.hard_div;
  const at::Tensor loss = soft * c.weight_soft + hard_value * c.weight_hard;
  for (int side = 0; side < (over_support(c) ? 1 : 2); ++side) {
    at::Tensor& out = s.grads[3 * side + 2];
    out = s.bias_sum[side].defined() ? s.bias_sum[side].to(c.bias[side]->value().scalar_type())
                                     : at::empty({0}, x[side]->options());
    if (mask[3 * side]) s.grads[3 * side] = s.grads[3 * side].view(c.input[side]->sizes());
  }
  if (over_support(c) && mask[3]) s.grads[3] = s.grads[3].view(c.input[1]->sizes());
  const auto dtype = spec.dtype;
  return {loss.to(dtype), soft.to(dtype), hard_value.to(dtype), s.grads[0], s.grads[1], s.grads[2], s.grads[3],
          s.grads[4], s.grads[5],
          at::tensor({static_cast<float>(1.0 / p.scales[0]), static_cast<float>(1.0 / p.scales[1])}, at::kFloat)
              .to(xs.device()),
          c.return_entropy ? s.entropy.view(spec.leading) : s.entropy};
}

}  // namespace npu_loss::composite
