// The sparse JSD's CPU kernel (losses.h's SparseJsd: a served teacher's top-k log-probabilities), on
// row_kernels.h's machinery, compiled per instruction set through row_table.h.
//
// Per row (docs/semantics.md, "Distillation from a served teacher", has the formulas), over the student's V
// logits and the teacher's K entries (isa.h's RowBatch: the support's ids, mask and log-probabilities, which the
// frame gives as int64, bool and float64 rows):
//   1. the student's z (its logits transformed: times the scale, which folds into the 1 / T below; where
//      softcapped, c * tanh(scale * x / c), made as the row is read and kept in a scratch row) and, in one pass a
//      block at a time, the maximum of z / T and the sum of exp(z / T - maximum): the log-softmax's two parts.
//      Each exp is kept in a scratch row against its block's running maximum;
//   2. the support, K entries and the tail, in float64: the student's log-probabilities at the ids, the tail
//      bucket or the renormalization, the divergence per entry with its derivatives (TRL's clamps and
//      nan_to_num, as their gradients are), summed or written ('none'); then their chain back to each entry's
//      log-probability, G_k for the student and the teacher's gradient for the teacher;
//   3. the student's gradient w.r.t. its logits, -p * sum(G) everywhere (p from the kept exps, one factor per
//      block) and G_k added at the K ids, over T and through the transform.
// So 1 exp per logit and two passes over the row in memory: pass 1 reads it, pass 3 writes its gradient, which
// may be the row itself (the linear form's chunks): what pass 3 needs of the row is read before it. The linear
// form's extras (isa.h's RowBatch) ride on the same passes: the hard loss's log-softmax is pass 1's where T is 1
// (else one more log-sum-exp pass, its exps kept beside the first's), its gradient added in pass 3, and the
// entropy, -sum(p * log p) = log-normalizer - sum(p * z / T), one more read of the kept exps and the row.
#pragma once

#include "row_kernels.h"

namespace npu_loss::cpu::NPU_LOSS_ISA {
namespace {

// The declared scalars' positions among the member's (losses.h).
inline constexpr int kSparseBeta = row_scalar(SparseJsd::decl.rows, "beta");

constexpr double kTailLogMassMax = SparseJsd::kTailLogMassMax;

// The scratch a thread's call needs: the block maxima (doubles); the kept exps, the softcapped z and the
// converted logits, rows of the compute type; one gathered row of the storage type; the gradient's row of the
// compute type; six float64 arrays of K + 1 entries, one of the compute type and one of bools; with a hard
// loss, the untempered log-sum-exp's block maxima and kept exps.
int64_t sparse_scratch_bytes(const RowBatch& c) {
  const int64_t compute = rows_in_float64(c) ? 8 : 4;
  const int64_t hard = c.hard_labels ? row_block_count(c.vocab) * 8 + compute * row_cache_floats(c.vocab) : 0;
  return row_block_count(c.vocab) * 8 + compute * 4 * row_cache_floats(c.vocab) + 8 * c.vocab +
      (6 * 8 + compute + 1) * (c.support + 1) + hard;
}

// log(sum(exp(x))) of the entries where `on`, -inf where none is.
inline double log_sum_on(const double* x, const bool* on, int64_t n) {
  double top = -kInfinity;
  for (int64_t k = 0; k < n; ++k) {
    if (on[k] && x[k] > top) top = x[k];
  }
  if (top == -kInfinity || !std::isfinite(top)) return top;
  double total = 0;
  for (int64_t k = 0; k < n; ++k) {
    if (on[k]) total += std::exp(x[k] - top);
  }
  return top + std::log(total);
}

// torch.nan_to_num's value (NaN 0, infinities the largest finite double) and whether its gradient passes.
inline double nan_to_num(double x) {
  if (std::isnan(x)) return 0;
  if (std::isinf(x)) return x > 0 ? std::numeric_limits<double>::max() : -std::numeric_limits<double>::max();
  return x;
}

// One row's support, in float64, from the student's log-probabilities at its entries (s) and the teacher's
// (t), each -inf where off: fills f (the entries' values, E = K or K + 1 of them), and, for the weights w of the
// entries (null: all `scale`), G (the student's gradient w.r.t. s_k) and H (the teacher's w.r.t. t_k).
struct SparseRow {
  double beta;
  bool tail;
  int64_t k;  // K
  double tiny;  // the mixture's clamp: the smallest normal of the dtype the call computes in, as TRL's and the
                // composite's (float32's, or float64's for float64)

  // s, t: K + 1 entries each (the tail's written here); on: K + 1 (the tail's set). f, G, H: K + 1.
  void run(double* s, double* t, bool* on, const double* w, double scale, double* f, double* g, double* h) const {
    const int64_t e = tail ? k + 1 : k;
    const double ls = log_sum_on(s, on, k), lt = log_sum_on(t, on, k);
    double raw_s = 0, raw_t = 0;  // the tail's own derivatives below: w.r.t. s_tail and t_tail
    // The entries' log-probabilities the divergence sees: with the tail, s itself and the tail's log(1 - mass)
    // (the log-mass clamped at -1e-7); without, s renormalized over the entries on.
    if (tail) {
      s[k] = std::log(-std::expm1(ls < kTailLogMassMax ? ls : kTailLogMassMax));
      t[k] = std::log(-std::expm1(lt < kTailLogMassMax ? lt : kTailLogMassMax));
      on[k] = true;
    } else {
      for (int64_t j = 0; j < k; ++j) {
        s[j] -= ls;
        t[j] -= lt;
      }
    }
    for (int64_t j = 0; j < e; ++j) {
      if (!on[j]) {
        f[j] = g[j] = h[j] = 0;
        continue;
      }
      const double sj = s[j], tj = t[j], p = std::exp(sj), q = std::exp(tj);
      const double weight = w ? w[j] * scale : scale;
      double value, ds, dt;
      if (beta == 0) {  // q (t - s)
        const double a = q * (tj - sj);
        const bool ok = std::isfinite(a);
        value = nan_to_num(a);
        ds = ok ? -q : 0;
        dt = ok ? a + q : 0;
      } else if (beta == 1) {  // p (s - t)
        const double a = p * (sj - tj);
        const bool ok = std::isfinite(a);
        value = nan_to_num(a);
        ds = ok ? a + p : 0;
        dt = ok ? -p : 0;
      } else {  // beta q (t - m) + (1 - beta) p (s - m), m = log(max(mixture, tiny))
        const double mixture = (1 - beta) * p + beta * q;
        const bool active = mixture >= tiny;
        const double m = std::log(active ? mixture : tiny);
        const double dm_dp = active ? (1 - beta) / mixture : 0, dm_dq = active ? beta / mixture : 0;
        const double a = q * (tj - m), b = p * (sj - m);
        const double fa = std::isfinite(a) ? beta : 0, fb = std::isfinite(b) ? 1 - beta : 0;
        value = beta * nan_to_num(a) + (1 - beta) * nan_to_num(b);
        ds = fa * (-q * dm_dp * p) + fb * (b + p - p * dm_dp * p);
        dt = fa * (a + q - q * dm_dq * q) + fb * (-p * dm_dq * q);
      }
      f[j] = value;
      g[j] = weight * ds;
      h[j] = weight * dt;
    }
    // Back through the tail (d log(1 - mass) / d s_j = -p_j / (1 - mass) where the clamp passes) or the
    // renormalization (d s^_i / d s_j = [i == j] - softmax_j).
    if (tail) {
      raw_s = ls <= kTailLogMassMax ? g[k] / std::expm1(ls) : 0;  // -a_tail / (1 - mass)
      raw_t = lt <= kTailLogMassMax ? h[k] / std::expm1(lt) : 0;
      for (int64_t j = 0; j < k; ++j) {
        if (!on[j]) continue;
        g[j] += raw_s * std::exp(s[j]);
        h[j] += raw_t * std::exp(t[j]);
      }
    } else {
      double sum_g = 0, sum_h = 0;
      for (int64_t j = 0; j < k; ++j) {
        sum_g += g[j];
        sum_h += h[j];
      }
      for (int64_t j = 0; j < k; ++j) {
        if (!on[j]) continue;
        g[j] -= std::exp(s[j]) * sum_g;  // s[j] is renormalized here: exp(s^_j) = softmax_j
        h[j] -= std::exp(t[j]) * sum_h;
      }
    }
  }
};

// Rows [begin, end) of a call, computed in A (float, or double for float64: the baseline's). IoS: the storage of a
// 16-bit row read and written as it is (contiguous, no softcap, no row scale: passes 1 and 3 load and store it
// through IoS, whose vectors keep their lanes in one order both ways); else the row in A (read directly, or
// converted into scratch first).
template <class A, class IoS = IoRow<A>>
void sparse_rows(const RowBatch& c, int64_t begin, int64_t end, void* scratch) {
  constexpr bool kStorage = !std::is_same_v<IoS, IoRow<A>>;
  using TS = typename IoS::T;
  using IoA = IoRow<A>;
  using V = typename IoA::V;
  constexpr int W = IoA::kLanes;
  const int64_t n = c.vocab, kk = c.support, w = row_cache_floats(n);
  const int64_t entries = c.support_tail ? kk + 1 : kk;
  const bool softcapped = c.logit_softcap[0] != 0;
  const double cap = c.logit_softcap[0], scale = c.logit_scale[0];
  // z / T: the logits times inv (their scale over T), or the softcapped z over T.
  const double inv = (softcapped ? 1.0 : scale) / c.temperature;
  const A inv_a = static_cast<A>(inv);
  double* tops = static_cast<double*>(scratch);
  A* kept = reinterpret_cast<A*>(tops + row_block_count(n));
  A* capped = kept + w;
  A* converted = capped + w;
  A* grad = converted + w;
  void* gather = grad + w;
  double* s = reinterpret_cast<double*>(static_cast<char*>(gather) + 8 * n);
  double* t = s + (kk + 1);
  double* f = t + (kk + 1);
  double* g = f + (kk + 1);
  double* h = g + (kk + 1);
  double* zs = h + (kk + 1);  // z at the ids, read before pass 3 may write over the row
  A* small = reinterpret_cast<A*>(zs + (kk + 1));  // K + 1 entries of the compute type: 'none''s rows
  bool* on = reinterpret_cast<bool*>(small + (kk + 1));
  // The hard loss's untempered log-sum-exp, where T is not 1: its block maxima and kept exps.
  double* raw_tops = reinterpret_cast<double*>(reinterpret_cast<char*>(on) + (kk + 1));
  A* raw_kept = reinterpret_cast<A*>(raw_tops + (c.hard_labels ? row_block_count(n) : 0));
  // The hard loss's logits are z untempered: the softcapped z, or the logits times their scale.
  const double raw_inv = softcapped ? 1.0 : scale;
  const bool untempered = inv == raw_inv;
  const SparseRow support{c.scalars[kSparseBeta].real, c.support_tail, kk,
                          static_cast<double>(std::numeric_limits<A>::min())};
  const int64_t student_size = dtype_size(c.student_dtype), result_size = dtype_size(c.result_dtype);
  const bool direct = c.student_step == 1 && c.student_dtype == (sizeof(A) == 8 ? DType::Double : DType::Float);
  // The gradient straight into its row where it is the compute type and stored as it is made.
  const bool grad_in_place = c.grad_student && !c.row_scale &&
      c.student_dtype == (sizeof(A) == 8 ? DType::Double : DType::Float);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t row = c.kept ? c.kept[r] : r;
    char* grad_row = c.grad_student ? static_cast<char*>(c.grad_student) + r * n * student_size : nullptr;
    double* teacher_grad = c.support_grad_teacher ? c.support_grad_teacher + r * kk : nullptr;
    if (row < 0) {
      if (grad_row) std::memset(grad_row, 0, n * student_size);
      if (teacher_grad) std::memset(teacher_grad, 0, kk * sizeof(double));
      continue;
    }
    // Pass 1: z, and the log-softmax's two parts.
    const char* src = static_cast<const char*>(c.student) + c.student_offsets[r] * student_size;
    const A* x = nullptr;
    const TS* stored = reinterpret_cast<const TS*>(src);
    RowStats stats{};
    if constexpr (kStorage) {
      const auto z = [&](int64_t i) { return load_at<IoS>(stored, i, n); };
      stats = row_logsumexp<IoS, A>(z, z, stored, n, inv, kept, tops);
    } else {
      if (direct) {
        x = reinterpret_cast<const A*>(src);
      } else {
        read_row<IoA>(c.student_dtype, src, c.student_step, gather, converted, n);
        x = converted;
      }
      if (softcapped) {
        const V cap_in = cst<V>(scale / cap), cap_v = cst<V>(cap);
        for (int64_t i = 0; i < n; i += W) {
          IoA::store(capped + i, vtanh(load_at<IoA>(x, i, n) * cap_in) * cap_v);
        }
        x = capped;
      }
      const auto z = [&](int64_t i) { return load_at<IoA>(x, i, n); };
      stats = row_logsumexp<IoA, A>(z, z, x, n, inv, kept, tops);
    }
    // The row's z at one element, in A.
    const auto z_at = [&](int64_t id) {
      if constexpr (kStorage) {
        A one;
        read_row<IoA>(c.student_dtype, stored + id, 1, gather, &one, 1);
        return one;
      } else {
        return x[id];
      }
    };
    // Pass 2: the support, in float64.
    const int64_t* ids = c.support_ids + r * kk;
    const bool* mask = c.support_on ? c.support_on + r * kk : nullptr;
    const double* teacher = c.support_teacher + r * kk;
    const double log_norm = stats.max + stats.log_sum;
    for (int64_t j = 0; j < kk; ++j) {
      on[j] = mask ? mask[j] : true;
      // The log-probability as the row's log-softmax makes it: x / T in the compute type, less both parts.
      zs[j] = on[j] ? static_cast<double>(z_at(ids[j])) : 0.0;
      s[j] = on[j] ? static_cast<double>(static_cast<A>(zs[j]) * inv_a) - log_norm : -kInfinity;
      t[j] = on[j] ? teacher[j] : -kInfinity;
    }
    // The linear form's extras, from the row before pass 3: the hard loss (its log-softmax's two parts, the
    // label's z) and the entropy.
    const RowHard hard = hard_of(c, r, row);
    const bool has_hard = hard.label >= 0, hard_grad = has_hard && grad_row && hard.weight != 0;
    RowStats raw = stats;
    double z_label = 0;
    if (has_hard) {
      z_label = static_cast<double>(z_at(hard.label));
      if (!untempered) {
        if constexpr (kStorage) {
          const auto z = [&](int64_t i) { return load_at<IoS>(stored, i, n); };
          raw = row_logsumexp<IoS, A>(z, z, stored, n, raw_inv, raw_kept, raw_tops);
        } else {
          const auto z = [&](int64_t i) { return load_at<IoA>(x, i, n); };
          raw = row_logsumexp<IoA, A>(z, z, x, n, raw_inv, raw_kept, raw_tops);
        }
      }
      if (hard.value) *hard.value = (raw.max - static_cast<double>(static_cast<A>(z_label) * static_cast<A>(raw_inv))) +
                                    raw.log_sum;
    }
    if (c.entropy) {
      // sum(p * z / T) over the kept exps, a block at a time (0 where p is: a logit of -inf), then
      // -sum(p log p) = log_norm - sum(p * z / T).
      double weighted = 0;
      int64_t block = 0;
      const V inv_v = cst<V>(inv);
      for (int64_t b = 0; b < n; b += kBlockVectors * W, ++block) {
        const int64_t e = block_end<IoA>(b, n);
        RowSum<V> sum;
        for (int64_t i = b; i < e; i += W) {
          V zi;
          if constexpr (kStorage) {
            zi = load_at<IoS>(stored, i, n);
          } else {
            zi = load_at<IoA>(x, i, n);
          }
          const V k = IoRow<A>::load(kept + i);
          sum.add(select(k == cst<V>(0), cst<V>(0), k * (zi * inv_v)));
        }
        sum.end_block();
        weighted += sum.total * stats.factor(tops[block]);
      }
      c.entropy[r] = static_cast<float>(log_norm - weighted);
    }
    // 'none''s backward: kept row `row`'s weights (of the result's dtype) into f, which run reads at each entry
    // before it writes that entry's value there.
    const double* weights = nullptr;
    if (c.grad_output) {
      read_row<IoA>(c.result_dtype, static_cast<const char*>(c.grad_output) + row * entries * result_size, 1,
                    gather, small, entries);
      for (int64_t j = 0; j < entries; ++j) f[j] = static_cast<double>(small[j]);
      weights = f;
    }
    support.run(s, t, on, weights, c.grad_scale, f, g, h);
    if (c.row_sums) {
      double total = 0;
      for (int64_t j = 0; j < entries; ++j) total += f[j];
      c.row_sums[row] = total;
    }
    if (c.values) {
      for (int64_t j = 0; j < entries; ++j) small[j] = static_cast<A>(f[j]);
      write_row<IoA>(small, c.result_dtype, static_cast<char*>(c.values) + row * entries * result_size, entries);
    }
    // Pass 3: the student's gradient, -p sum(G) + G at the ids, over T and through the transform.
    const auto teacher_bound = [&] {
      double bound = 0;
      for (int64_t j = 0; j < kk && teacher_grad; ++j) bound = std::fmax(bound, std::fabs(h[j] * c.teacher_scale));
      return bound;
    };
    // float16's row scale (isa.h's RowBatch): 2^-j stored, 2^j returned.
    const auto scaled_row = [&](double bound, int64_t at) {
      const int power = row_power(bound);
      c.row_scale[at] = static_cast<float>(std::ldexp(1.0, -power));
      return std::ldexp(1.0, power);
    };
    double power_factor = 1;
    double sum_g = 0;
    for (int64_t j = 0; j < kk; ++j) sum_g += g[j];
    // The dense part's factors of a block: of the kept exps (the divergence's -p sum(G) over T, and the hard
    // loss's weight * softmax where T is 1) and, where T is not 1, of the untempered kept exps (the hard loss's).
    const double hard_factor = hard_grad ? hard.weight * raw_inv : 0.0;
    const auto kept_factor = [&](int64_t block) {
      return stats.factor(tops[block]) * (-sum_g * inv + (untempered ? hard_factor : 0.0));
    };
    const bool raw_part = hard_grad && !untempered;
    if (kStorage && grad_row) {
      TS* out = reinterpret_cast<TS*>(grad_row);
      int64_t block = 0;
      for (int64_t b = 0; b < n; b += kBlockVectors * W, ++block) {
        const int64_t e = block_end<IoA>(b, n);
        const V factor = cst<V>(kept_factor(block));
        if (raw_part) {
          const V raw_factor = cst<V>(hard_factor * raw.factor(raw_tops[block]));
          for (int64_t i = b; i < e; i += W) {
            store_at<IoS>(out, i, n, IoRow<A>::load(kept + i) * factor + IoRow<A>::load(raw_kept + i) * raw_factor);
          }
        } else {
          for (int64_t i = b; i < e; i += W) store_at<IoS>(out, i, n, IoRow<A>::load(kept + i) * factor);
        }
      }
      // At the ids and the label, the whole gradient made again in float64 and rounded once: -p sum(G) + G_k,
      // over T, and the hard loss's weight * (softmax - [the label]).
      const auto exact = [&](double z, double gk, bool label) {
        const double p = std::exp(static_cast<double>(static_cast<A>(z) * inv_a) - log_norm);
        double value = (gk - sum_g * p) * inv;
        if (hard_grad) {
          const double q = untempered ? p : std::exp(static_cast<double>(static_cast<A>(z) * static_cast<A>(raw_inv)) -
                                                     raw.max - raw.log_sum);
          value += hard_factor * (q - (label ? 1.0 : 0.0));
        }
        return static_cast<A>(value);
      };
      bool label_done = !hard_grad;
      for (int64_t j = 0; j < kk; ++j) {
        if (!on[j]) continue;
        const bool label = hard_grad && ids[j] == hard.label;
        if (g[j] == 0 && !label) continue;
        label_done = label_done || label;
        const A value = exact(zs[j], g[j], label);
        write_row<IoA>(&value, c.student_dtype, out + ids[j], 1);
      }
      if (!label_done) {
        const A value = exact(z_label, 0.0, true);
        write_row<IoA>(&value, c.student_dtype, out + hard.label, 1);
      }
    } else if (grad_row) {
      A* out = grad_in_place ? reinterpret_cast<A*>(grad_row) : grad;
      const double slope_curve = softcapped ? scale / (cap * cap) : 0.0;
      const V curve = cst<V>(slope_curve), slope_scale = cst<V>(scale);
      int64_t block = 0;
      for (int64_t b = 0; b < n; b += kBlockVectors * W, ++block) {
        const int64_t e = block_end<IoA>(b, n);
        const V factor = cst<V>(kept_factor(block));
        const V raw_factor = cst<V>(raw_part ? hard_factor * raw.factor(raw_tops[block]) : 0.0);
        for (int64_t i = b; i < e; i += W) {
          V v = IoRow<A>::load(kept + i) * factor;
          if (raw_part) v = v + IoRow<A>::load(raw_kept + i) * raw_factor;
          if (softcapped) {
            const V zi = IoA::load(x + i);
            v = v * (slope_scale - zi * zi * curve);
          }
          store_at<IoA>(out, i, n, v);
        }
      }
      // The slope of the softcap at an element (its z kept in scratch: pass 3 does not write over it).
      const auto slope_at = [&](int64_t id) {
        if (!softcapped) return 1.0;
        const double zi = static_cast<double>(x[id]);
        return scale * (1 - (zi / cap) * (zi / cap));
      };
      for (int64_t j = 0; j < kk; ++j) {
        if (!on[j] || g[j] == 0) continue;
        const int64_t id = ids[j];
        out[id] = static_cast<A>(static_cast<double>(out[id]) + g[j] * inv * slope_at(id));
      }
      if (hard_grad) {
        out[hard.label] = static_cast<A>(static_cast<double>(out[hard.label]) - hard_factor * slope_at(hard.label));
      }
      if (c.row_scale) {  // float16: the row's gradients stored times 2^j (isa.h)
        double bound = teacher_bound();
        for (int64_t i = 0; i < n; ++i) bound = std::fmax(bound, std::fabs(static_cast<double>(out[i])));
        power_factor = scaled_row(bound, r);
        const V pf = cst<V>(power_factor);
        for (int64_t i = 0; i < n; i += W) store_at<IoA>(out, i, n, load_at<IoA>(out, i, n) * pf);
      }
      if (!grad_in_place) write_row<IoA>(out, c.student_dtype, grad_row, n);
    } else if (c.row_scale) {
      power_factor = scaled_row(teacher_bound(), r);
    }
    if (teacher_grad) {
      for (int64_t j = 0; j < kk; ++j) teacher_grad[j] = on[j] ? h[j] * c.teacher_scale * power_factor : 0.0;
    }
  }
}

void sparse_jsd(const RowBatch& c, int64_t begin, int64_t end, void* scratch) {
#ifdef NPU_LOSS_ISA_BASELINE
  if (rows_in_float64(c)) return sparse_rows<double>(c, begin, end, scratch);
#endif
  // bfloat16 and float16 rows read and written as they are, where nothing asks for the converted row (a softcap
  // keeps z in scratch; float16's row scales bound the whole row first).
  if (c.student_step == 1 && c.logit_softcap[0] == 0 && !c.row_scale) {
    if (c.student_dtype == DType::BFloat16) return sparse_rows<float, Io<DType::BFloat16>>(c, begin, end, scratch);
    if (c.student_dtype == DType::Half) return sparse_rows<float, Io<DType::Half>>(c, begin, end, scratch);
  }
  sparse_rows<float>(c, begin, end, scratch);
}

template <>
struct RowKernelOf<SparseJsd> {
  static constexpr auto run = &sparse_jsd;
  static constexpr auto scratch_bytes = &sparse_scratch_bytes;
};

}  // namespace
}  // namespace npu_loss::cpu::NPU_LOSS_ISA
