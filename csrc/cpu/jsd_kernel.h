// The generalized JSD's CPU kernel (losses.h's GeneralizedJsd), on row_kernels.h's machinery, compiled per
// instruction set through row_table.h.
//
// Per row, over its logits (docs/semantics.md, "Distillation", has the formulas), three passes:
// (z: a side's logits transformed, losses.h's ScalarRole::StudentScale ... TeacherSoftcap: times its scale,
// which folds into the 1 / T below; where softcapped, c * tanh(scale * x / c), made as pass 1 first reads the
// side's logits and kept in a scratch row that the passes read after, and each side's gradient then times
// scale * (1 - (z / c)^2), the factor applied where pass 2 keeps a and p, so pass 3 carries it whole.)
//   1. per side, in one pass a block at a time, the maximum of z / T and the sum of exp(z / T - maximum): the
//      log-softmax's two parts. Each exp is kept in a scratch row, against its block's running maximum;
//   2. s = log_softmax(student / T), t = log_softmax(teacher / T), p = exp(s) and q = exp(t) from the kept
//      exps times one factor per block, and s - m, t - m against the mixture m = log((1 - beta) p + beta q)
//      (one log): the row's values f, summed or written ('none'), and a_s = g * df/ds and a_t = g * df/dt
//      (g: each element's gradient weight), summed; p, q, a_s and a_t wait for pass 3 (RowScratch);
//   3. the gradients w.r.t. the logits, (a_s - p * sum(a_s)) / T and (a_t - q * sum(a_t)) / T.
// So 2 exp and 1 log per logit, with or without the gradients. The student's entropy, where asked for, is
// -sum(p * s) over pass 2's p and s: one more product and sum per logit. The linear form's hard loss (cross
// entropy on the student's untempered logits, isa.h's RowBatch) rides on them: pass 1's log-sum-exp where
// T == 1 (else one more pass of its own), the label's logit read in pass 2, and its gradient added to a_s there.
// Where the mixture is not a normal float in every lane of a vector (log-probabilities below -87), that
// vector's s - m and t - m come from d = s - t + log(1 - beta) - log(beta) instead:
// s - m = -log(1 - beta) - softplus(-d) and t - m = -log(beta) - softplus(d), exact where p and q underflow.
#pragma once

#include "row_kernels.h"

namespace npu_loss::cpu::NPU_LOSS_ISA {
namespace {

// The declared beta's position among the member's scalars (losses.h).
inline constexpr int kBeta = row_scalar(GeneralizedJsd::decl.rows, "beta");

// The three forms of the loss: beta == 0, beta == 1, and the mixture in between.
enum class JsdForm { TeacherKl, StudentKl, Mixture };

// One element's terms from its log-probabilities: its value f and its derivatives w.r.t. s and t.
template <class V>
struct JsdTerms {
  V p, q, f, ds, dt;
};

template <class V>
struct JsdMath {
  JsdForm form;
  V beta, one_minus_beta, log_beta, log_one_minus_beta, log_ratio;

  explicit JsdMath(double b)
      : form(b == 0 ? JsdForm::TeacherKl : b == 1 ? JsdForm::StudentKl : JsdForm::Mixture),
        beta(cst<V>(b)),
        one_minus_beta(cst<V>(1 - b)),
        log_beta(cst<V>(b > 0 ? std::log(b) : 0.0)),
        log_one_minus_beta(cst<V>(b < 1 ? std::log1p(-b) : 0.0)),
        log_ratio(cst<V>(b > 0 && b < 1 ? std::log1p(-b) - std::log(b) : 0.0)) {}

  // s, t: the log-probabilities; p = exp(s), q = exp(t).
  NPU_LOSS_SIMD_INLINE JsdTerms<V> terms(V s, V t, V p, V q) const {
    JsdTerms<V> r;
    r.p = p;
    r.q = q;
    if (form == JsdForm::TeacherKl) {  // exp(t) * (t - s)
      r.f = r.q * (t - s);
      r.ds = cst<V>(0) - r.q;
      r.dt = r.f + r.q;
    } else if (form == JsdForm::StudentKl) {  // exp(s) * (s - t)
      r.f = r.p * (s - t);
      r.ds = r.f + r.p;
      r.dt = cst<V>(0) - r.p;
    } else {
      // s - m and t - m, m = log((1 - beta) p + beta q): from the mixture where it is a normal number in every
      // lane; else from d = (s + log(1 - beta)) - (t + log(beta)), softplus(d) = max(d, 0) + log(1 + exp(-|d|))
      // and softplus(-d) = softplus(d) - d, exact where p and q underflow.
      using Acc = decltype(reduce_add(V{}));
      const V mixture = one_minus_beta * r.p + beta * r.q;
      V s_minus_m, t_minus_m;
      if (all(mixture >= cst<V>(std::numeric_limits<Acc>::min()))) {
        const V log_mixture = vlog(mixture);
        s_minus_m = s - log_mixture;
        t_minus_m = t - log_mixture;
      } else {
        const V d = (s - t) + log_ratio;
        const V tail = vlog(cst<V>(1) + exp(cst<V>(0) - abs_of(d)));
        s_minus_m = cst<V>(0) - log_one_minus_beta - (vmax(cst<V>(0) - d, cst<V>(0)) + tail);
        t_minus_m = cst<V>(0) - log_beta - (vmax(d, cst<V>(0)) + tail);
      }
      r.ds = one_minus_beta * r.p * s_minus_m;
      r.dt = beta * r.q * t_minus_m;
      r.f = r.ds + r.dt;
    }
    return r;
  }
};

// The scratch rows a thread's call needs: the exps of the statistics pass, which become p and q; a_s's and
// a_t's where the gradients are wanted but are not of the compute type (the direct form of float16 and
// bfloat16; float32 and float64 gradients, and the converted form's compute-type gradient rows, keep their own);
// and each softcapped side's transformed logits.
inline int64_t jsd_kept_rows(const RowBatch& c) {
  const bool grads = c.grad_student || c.grad_teacher;
  const bool wide = c.student_dtype == DType::Float || c.student_dtype == DType::Double;
  return grads && rows_direct(c) && !wide ? 4 : 2;
}
inline int64_t jsd_scratch_rows(const RowBatch& c) {
  return jsd_kept_rows(c) + (c.logit_softcap[0] != 0) + (c.logit_softcap[1] != 0);
}

// The scratch bytes a thread's call needs: each side's block maxima (doubles), the rows above, then, in the
// converted form, six rows of the compute type and one gathered row.
int64_t jsd_scratch_bytes(const RowBatch& c) {
  const int64_t compute = rows_in_float64(c) ? 8 : 4;
  return 2 * row_block_count(c.vocab) * 8 +
      compute * (jsd_scratch_rows(c) * row_cache_floats(c.vocab) + (rows_direct(c) ? 0 : 7 * c.vocab));
}

// Where a row's intermediate results wait between its passes: a thread's scratch memory (isa.h's
// jsd_scratch_bytes), carved as block maxima (tops), then rows of the compute type A: the exps of the statistics
// pass, which become p and q in place, then a_s and a_t where the gradients cannot hold them, then each
// softcapped side's transformed logits, then the converted form's rows (`rest`).
template <class A>
struct RowScratch {
  double *tops_s, *tops_t;
  A *prob_s, *prob_t, *a_s, *a_t, *capped_s, *capped_t, *rest;
  RowScratch(void* scratch, const RowBatch& c) {
    const int64_t blocks = row_block_count(c.vocab), w = row_cache_floats(c.vocab);
    tops_s = static_cast<double*>(scratch);
    tops_t = tops_s + blocks;
    prob_s = reinterpret_cast<A*>(tops_t + blocks);
    prob_t = prob_s + w;
    a_s = prob_t + w;  // within the scratch only where jsd_kept_rows counts them
    a_t = a_s + w;
    capped_s = c.logit_softcap[0] != 0 ? prob_s + jsd_kept_rows(c) * w : nullptr;
    capped_t = c.logit_softcap[1] != 0 ? prob_s + (jsd_kept_rows(c) + (capped_s != nullptr)) * w : nullptr;
    rest = prob_s + jsd_scratch_rows(c) * w;
  }
};

// One row, with the storage type IoT for every operand (the direct case: one dtype, contiguous rows).
template <class IoT>
struct JsdRow {
  using T = typename IoT::T;
  using V = typename IoT::V;
  using A = decltype(reduce_add(V{}));  // the compute type
  static constexpr int W = IoT::kLanes;
  // p and q wait in scratch rows (RowScratch), and a_s (a_t) in the gradient's own row when that is of the
  // compute type, else in a scratch row too. A scratch row is read and written a whole vector at a time, in
  // the vectors' own lane order (a bfloat16 vector's is its own).
  static constexpr bool kCacheInGrad = std::is_same_v<T, A>;
  using IoScratch = IoRow<A>;
  using IoCache = std::conditional_t<kCacheInGrad, IoT, IoScratch>;

  const JsdMath<V>& math;
  // Each side's logits (or, softcapped, its scratch row of z) times inv_s (inv_q): its scale / T, or 1 / T.
  double inv_s, inv_q;
  double raw_inv;       // the student's, untempered: the hard loss's logits are its z, or its logits times it
  int64_t n;
  double teacher_scale;  // isa.h's RowBatch
  // A softcapped side's transform, z = cap * tanh(x * cap_in), cap_in = scale / cap, and its gradient's factor
  // slope_scale * (1 - (z / cap)^2) = slope_scale - z^2 * slope_curve; cap 0 where the side is not softcapped.
  double cap[2], cap_in[2], slope_curve[2], slope_scale[2];

  JsdRow(const JsdMath<V>& m, const RowBatch& c)
      : math(m),
        inv_s((c.logit_softcap[0] != 0 ? 1.0 : c.logit_scale[0]) / c.temperature),
        inv_q((c.logit_softcap[1] != 0 ? 1.0 : c.logit_scale[1]) / c.temperature),
        raw_inv(c.logit_softcap[0] != 0 ? 1.0 : c.logit_scale[0]),
        n(c.vocab),
        teacher_scale(c.teacher_scale) {
    for (int side = 0; side < 2; ++side) {
      const double c_side = c.logit_softcap[side];
      cap[side] = c_side;
      cap_in[side] = c_side != 0 ? c.logit_scale[side] / c_side : 0.0;
      slope_curve[side] = c_side != 0 ? c.logit_scale[side] / (c_side * c_side) : 0.0;
      slope_scale[side] = c_side != 0 ? c.logit_scale[side] : 1.0;
    }
  }

  // A side's z at element i, from its logits x: x itself, or, softcapped, made and kept in its scratch row z
  // (whole vectors; the padding lanes 0).
  NPU_LOSS_SIMD_INLINE V made(int side, const T* x, A* z, int64_t i) const {
    const V v = load_at<IoT>(x, i, n);
    if (!z) return v;
    const V c = vtanh(v * cst<V>(cap_in[side])) * cst<V>(cap[side]);
    IoScratch::store(z + i, c);
    return c;
  }

  // A side's kept gradient term `a` and probability `p`, both times the factor of its gradient at its z
  // (softcapped sides only): scale * (1 - (z / cap)^2). Pass 3's (a - p * sum(a)) then carries it whole.
  NPU_LOSS_SIMD_INLINE void chained(int side, V z, V& a, V& p) const {
    if (cap[side] == 0) return;
    const V slope = cst<V>(slope_scale[side]) - (z * z) * cst<V>(slope_curve[side]);
    a = a * slope;
    p = p * slope;
  }

  // Passes 1 to 3 of one row: fills what the pointers ask for, with `scratch` for what waits between them.
  // With a hard loss (hard.label >= 0): the untempered log-softmax's two parts come from pass 1 (a pass of
  // their own where T != 1); pass 2 reads the label's logit, and adds weight * T * (softmax - one_hot) to
  // the a_s it keeps (not to sum(a_s)), which pass 3 divides by T.
  void run(const T* zs, const T* zt, const T* g, double g_scale, double* row_sum, T* values, T* grad_s,
           T* grad_t, float* row_scale, const RowHard& hard, float* entropy, const RowScratch<A>& scratch) const {
    A* const prob_s = scratch.prob_s;
    A* const prob_t = scratch.prob_t;
    A* const cache_s = kCacheInGrad ? reinterpret_cast<A*>(grad_s) : scratch.a_s;
    A* const cache_t = kCacheInGrad ? reinterpret_cast<A*>(grad_t) : scratch.a_t;
    const bool has_hard = hard.label >= 0, untempered = inv_s == raw_inv;
    // A side's z at element i: its logits, or, softcapped, its scratch row, which pass 1 makes as it reads the
    // logits (its first statistics pass: the tanh overlaps the row's stream from memory).
    A* const capped_s = scratch.capped_s;
    A* const capped_t = scratch.capped_t;
    const auto z_s = [&](int64_t i) { return capped_s ? IoScratch::load(capped_s + i) : load_at<IoT>(zs, i, n); };
    const auto z_t = [&](int64_t i) { return capped_t ? IoScratch::load(capped_t + i) : load_at<IoT>(zt, i, n); };
    const auto make_s = [&](int64_t i) { return made(0, zs, capped_s, i); };
    const auto make_t = [&](int64_t i) { return made(1, zt, capped_t, i); };
    RowStats raw{0, 0}, stats_s;
    if (has_hard && !untempered) {
      raw = row_logsumexp<IoT>(make_s, z_s, zs, n, raw_inv, prob_s, scratch.tops_s);
      stats_s = row_logsumexp<IoT>(z_s, z_s, zs, n, inv_s, prob_s, scratch.tops_s);
    } else {
      stats_s = row_logsumexp<IoT>(make_s, z_s, zs, n, inv_s, prob_s, scratch.tops_s);
    }
    if (has_hard && untempered) raw = stats_s;
    const bool hard_grad = has_hard && grad_s && hard.weight != 0;
    // The hard loss's gradient raw_inv * (softmax - one_hot), kept in a_s, which pass 3 multiplies by inv_s.
    const V hard_weight = cst<V>(hard_grad ? hard.weight * raw_inv / inv_s : 0.0);
    const V raw_max = cst<V>(raw.max), raw_log_sum = cst<V>(raw.log_sum), vraw_inv = cst<V>(raw_inv);
    double label_logit = 0;
    const RowStats stats_t = row_logsumexp<IoT>(make_t, z_t, zt, n, inv_q, prob_t, scratch.tops_t);
    const V vinv_s = cst<V>(inv_s), vinv_q = cst<V>(inv_q), scale = cst<V>(g_scale);
    const V max_s = cst<V>(stats_s.max), log_sum_s = cst<V>(stats_s.log_sum);
    const V max_t = cst<V>(stats_t.max), log_sum_t = cst<V>(stats_t.log_sum);
    const int64_t n_cache = kCacheInGrad ? n : row_cache_floats(n);
    const auto log_p = [&](V z) { return (z * vinv_s - max_s) - log_sum_s; };
    const auto log_q = [&](V z) { return (z * vinv_q - max_t) - log_sum_t; };
    const auto weight = [&](int64_t i) { return g ? load_at<IoT>(g, i, n) * scale : scale; };
    RowSum<V> sum_f, sum_as, sum_at, sum_ps;
    // For row_scale: the largest |a_s|, |a_t|, p and q, whence a bound on every gradient of the row.
    V max_as = cst<V>(0), max_at = cst<V>(0), max_p = cst<V>(0), max_q = cst<V>(0);
    for (int64_t begin = 0, block = 0; begin < n; begin += kBlockVectors * W, ++block) {
      const int64_t end = block_end<IoT>(begin, n);
      const V factor_s = cst<V>(stats_s.factor(scratch.tops_s[block]));
      const V factor_t = cst<V>(stats_t.factor(scratch.tops_t[block]));
      for (int64_t i = begin; i < end; i += W) {
        const V zsi = z_s(i), zti = z_t(i);  // read once: the stores below may write over the logits
        const V s = log_p(zsi);
        JsdTerms<V> e = math.terms(s, log_q(zti), IoScratch::load(prob_s + i) * factor_s,
                                   IoScratch::load(prob_t + i) * factor_t);
        if (i + W > n) {  // the tail's padding lanes add nothing
          const auto valid = first_lanes<IoT>(n - i);
          e.f = select(valid, e.f, cst<V>(0));
          e.ds = select(valid, e.ds, cst<V>(0));
          e.dt = select(valid, e.dt, cst<V>(0));
          e.p = select(valid, e.p, cst<V>(0));
          e.q = select(valid, e.q, cst<V>(0));
        }
        if (values) store_at<IoT>(values, i, n, e.f);
        sum_f.add(e.f);
        // p * s is 0 where p is (the padding, a logit of -inf: 0 * -inf would be NaN); a NaN stays NaN.
        if (entropy) sum_ps.add(select(e.p == cst<V>(0), cst<V>(0), e.p * s));
        const bool at_label = has_hard && hard.label >= i && hard.label < i + W;
        if (at_label) {
          label_logit = reduce_add(select(one_lane<IoT>(hard.label - i), zsi, cst<V>(0)));
        }
        if (grad_s) {
          const V as = weight(i) * e.ds;
          sum_as.add(as);
          V kept_as = as;
          if (hard_grad) {
            V softmax = e.p;
            if (!untempered) {
              softmax = exp((zsi * vraw_inv - raw_max) - raw_log_sum);
              if (i + W > n) softmax = select(first_lanes<IoT>(n - i), softmax, cst<V>(0));
            }
            if (at_label) softmax = softmax - select(one_lane<IoT>(hard.label - i), cst<V>(1), cst<V>(0));
            kept_as = as + hard_weight * softmax;
          }
          V p_kept = e.p;
          if (capped_s) chained(0, zsi, kept_as, p_kept);
          store_at<IoCache>(cache_s, i, n_cache, kept_as);
          IoScratch::store(prob_s + i, p_kept);
          if (row_scale) {  // the padding lanes hold 0 (above)
            max_as = vmax(max_as, abs_of(as));
            max_p = vmax(max_p, e.p);
          }
        }
        if (grad_t) {
          const V at = weight(i) * e.dt;
          sum_at.add(at);
          V q_kept = e.q, kept_at = at;
          if (capped_t) chained(1, zti, kept_at, q_kept);
          store_at<IoCache>(cache_t, i, n_cache, kept_at);
          IoScratch::store(prob_t + i, q_kept);
          if (row_scale) {
            max_at = vmax(max_at, abs_of(at));
            max_q = vmax(max_q, e.q);
          }
        }
      }
      sum_f.end_block();
      sum_ps.end_block();
      sum_as.end_block();
      sum_at.end_block();
    }
    if (row_sum) *row_sum = sum_f.total;
    if (entropy) *entropy = static_cast<float>(-sum_ps.total);
    if (has_hard && hard.value) *hard.value = (raw.max - label_logit * raw_inv) + raw.log_sum;
    if (!grad_s && !grad_t) return;
    const V total_as = cst<V>(sum_as.total), total_at = cst<V>(sum_at.total);
    V out_scale = vinv_s, out_scale_t = cst<V>(inv_q * teacher_scale);
    if (row_scale) {
      // |gradient| <= (max |a| + max p * |sum a|) * scale / T on each side; the bound, rounded up, sets the
      // power.
      // (A softcapped side's factor is at most its scale.)
      const double bound_s =
          (lane_max(max_as, 0) + lane_max(max_p, 0) * std::fabs(sum_as.total)) * inv_s * slope_scale[0];
      const double bound_t =
          (lane_max(max_at, 0) + lane_max(max_q, 0) * std::fabs(sum_at.total)) * inv_q * slope_scale[1];
      const int power = row_power(bound_s > bound_t ? bound_s : bound_t);
      *row_scale = std::ldexp(1.0f, -power);
      out_scale = cst<V>(std::ldexp(inv_s, power));
      out_scale_t = cst<V>(std::ldexp(inv_q, power));
    }
    // Pass 3: what pass 2 kept.
    for (int64_t i = 0; i < n; i += W) {
      if (grad_s) {
        const V a = load_at<IoCache>(cache_s, i, n_cache);
        store_at<IoT>(grad_s, i, n, (a - IoScratch::load(prob_s + i) * total_as) * out_scale);
      }
      if (grad_t) {
        const V a = load_at<IoCache>(cache_t, i, n_cache);
        store_at<IoT>(grad_t, i, n, (a - IoScratch::load(prob_t + i) * total_at) * out_scale_t);
      }
    }
  }
};

// Rows [begin, end) of a call whose operands share one storage type and whose rows are contiguous.
template <class IoT>
void jsd_rows_direct(const RowBatch& c, int64_t begin, int64_t end, void* scratch) {
  using T = typename IoT::T;
  using Row = JsdRow<IoT>;
  using A = typename Row::A;
  const JsdMath<typename IoT::V> math(c.scalars[kBeta].real);
  const Row row(math, c);
  const RowScratch<A> rows(scratch, c);
  const T* zs = static_cast<const T*>(c.student);
  const T* zt = static_cast<const T*>(c.teacher);
  const int64_t v = c.vocab;
  for (int64_t r = begin; r < end; ++r) {
    T* gs = c.grad_student ? static_cast<T*>(c.grad_student) + r * v : nullptr;
    T* gt = c.grad_teacher ? static_cast<T*>(c.grad_teacher) + r * v : nullptr;
    const int64_t k = c.kept ? c.kept[r] : r;
    if (k < 0) {  // a dropped row: no value, no gradient
      if (gs) std::memset(gs, 0, v * sizeof(T));
      if (gt) std::memset(gt, 0, v * sizeof(T));
      continue;
    }
    row.run(zs + c.student_offsets[r], zt + c.teacher_offsets[r],
            c.grad_output ? static_cast<const T*>(c.grad_output) + k * v : nullptr, c.grad_scale,
            c.row_sums ? c.row_sums + k : nullptr, c.values ? static_cast<T*>(c.values) + k * v : nullptr, gs, gt,
            c.row_scale ? c.row_scale + r : nullptr, hard_of(c, r, k), c.entropy ? c.entropy + r : nullptr, rows);
  }
}

// Rows [begin, end) of any other call (logits of different dtypes, or rows with gaps): each row read into the
// compute type in `scratch` (jsd_scratch_bytes), computed as above, and every result written in its own dtype.
template <class IoAcc>
void jsd_converted(const RowBatch& c, int64_t begin, int64_t end, void* scratch) {
  using A = typename IoAcc::T;
  const int64_t v = c.vocab;
  const JsdMath<typename IoAcc::V> math(c.scalars[kBeta].real);
  const JsdRow<IoAcc> row(math, c);
  const RowScratch<A> kept(scratch, c);
  A* rows = kept.rest;
  A *zs = rows, *zt = rows + v, *g = rows + 2 * v, *values = rows + 3 * v, *gs = rows + 4 * v, *gt = rows + 5 * v;
  void* gather = rows + 6 * v;
  const auto at = [&](const void* base, DType dtype, int64_t row) {
    return static_cast<char*>(const_cast<void*>(base)) + row * v * dtype_size(dtype);
  };
  for (int64_t r = begin; r < end; ++r) {
    const int64_t k = c.kept ? c.kept[r] : r;
    if (k < 0) {
      if (c.grad_student) std::memset(at(c.grad_student, c.student_dtype, r), 0, v * dtype_size(c.student_dtype));
      if (c.grad_teacher) std::memset(at(c.grad_teacher, c.teacher_dtype, r), 0, v * dtype_size(c.teacher_dtype));
      continue;
    }
    read_row<IoAcc>(c.student_dtype, at(c.student, c.student_dtype, 0) + c.student_offsets[r] * dtype_size(c.student_dtype),
                    c.student_step, gather, zs, v);
    read_row<IoAcc>(c.teacher_dtype, at(c.teacher, c.teacher_dtype, 0) + c.teacher_offsets[r] * dtype_size(c.teacher_dtype),
                    c.teacher_step, gather, zt, v);
    if (c.grad_output) read_row<IoAcc>(c.result_dtype, at(c.grad_output, c.result_dtype, k), 1, gather, g, v);
    row.run(zs, zt, c.grad_output ? g : nullptr, c.grad_scale, c.row_sums ? c.row_sums + k : nullptr,
            c.values ? values : nullptr, c.grad_student ? gs : nullptr, c.grad_teacher ? gt : nullptr,
            c.row_scale ? c.row_scale + r : nullptr, hard_of(c, r, k), c.entropy ? c.entropy + r : nullptr, kept);
    if (c.values) write_row<IoAcc>(values, c.result_dtype, at(c.values, c.result_dtype, k), v);
    if (c.grad_student) write_row<IoAcc>(gs, c.student_dtype, at(c.grad_student, c.student_dtype, r), v);
    if (c.grad_teacher) write_row<IoAcc>(gt, c.teacher_dtype, at(c.grad_teacher, c.teacher_dtype, r), v);
  }
}

// The frame (cpu/rows.cpp) sends float64 calls to the baseline's table.
void jsd(const RowBatch& c, int64_t begin, int64_t end, void* scratch) {
  if (rows_direct(c)) {
    with_io(c.student_dtype, [&](auto io) { jsd_rows_direct<decltype(io)>(c, begin, end, scratch); });
    return;
  }
#ifdef NPU_LOSS_ISA_BASELINE
  if (rows_in_float64(c)) return jsd_converted<Io<DType::Double>>(c, begin, end, scratch);
#endif
  jsd_converted<Io<DType::Float>>(c, begin, end, scratch);
}

template <>
struct RowKernelOf<GeneralizedJsd> {
  static constexpr auto run = &jsd;
  static constexpr auto scratch_bytes = &jsd_scratch_bytes;
};

}  // namespace
}  // namespace npu_loss::cpu::NPU_LOSS_ISA
