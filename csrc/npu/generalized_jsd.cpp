// The generalized JSD's NPU math (losses.h's GeneralizedJsd), one chunk of rows at a time in the row frame
// (rows.h): its log-softmaxes, values and gradients through aclnn calls (NPU_LOSS_EXEC_ACLNN). docs/npu_paths.md
// has the calls of each beta class; docs/semantics.md, "Distillation", the formulas.
//
// Per chunk of n rows, in float32 (s and t the log-softmaxes of the logits, transformed by the frame's
// log_probabilities, over T; p = e^s, q = e^t; w the weight of each element, 1 / T folded into it; each gradient
// then goes through its side's transform in the frame's gradient_rows):
//   beta = 0, KL(teacher || student): f = q (t - s); the student's gradient is the log-softmax backward of -w q
//     at s; the teacher's is aclnnKlDivTargetBackward(w, s, t, log_target) = w q (t - s + 1), then the
//     log-softmax backward at t: w q (t - s - KL(t || s)).
//   beta = 1, KL(student || teacher): the same with the two sides exchanged.
//   0 < beta < 1: m = logaddexp(s + log(1 - beta), t + log(beta)) (exact where p and q underflow);
//     f = (1 - beta) p (s - m) + beta q (t - m); the gradients are the log-softmax backwards of
//     w (1 - beta) p (s - m) at s and of w beta q (t - m) at t (the teacher's: beta q (t - m - KL(t || m)) w).
// Dropped rows are computed like any other and then overwritten with 0 (a NaN there reaches no sum: each row's
// sums stay in the row, and the chunk's total is taken after the fill).
#include <ATen/ATen.h>

#include <cmath>

#include "aclnn_api.h"
#include "rows.h"

namespace npu_loss::npu {
namespace {

// The declared beta's position among the member's scalars (losses.h).
constexpr int kBeta = row_scalar(GeneralizedJsd::decl.rows, "beta");

void exp_into(at::Tensor& out, const at::Tensor& x) {
  NPU_LOSS_EXEC_ACLNN(aclnnExp, x, out);
}

// out = x - y
void sub_into(at::Tensor& out, const at::Tensor& x, const at::Tensor& y) {
  const at::Scalar one(1.0);
  NPU_LOSS_EXEC_ACLNN(aclnnSub, x, y, one, out);
}

// out = x + alpha * y
void add_into(at::Tensor& out, const at::Tensor& x, const at::Tensor& y, double alpha) {
  const at::Scalar a(alpha);
  NPU_LOSS_EXEC_ACLNN(aclnnAdd, x, y, a, out);
}

// out = x + c
void adds_into(at::Tensor& out, const at::Tensor& x, double c) {
  const at::Scalar value(c), one(1.0);
  NPU_LOSS_EXEC_ACLNN(aclnnAdds, x, value, one, out);
}

void log_add_exp_into(at::Tensor& out, const at::Tensor& x, const at::Tensor& y) {
  NPU_LOSS_EXEC_ACLNN(aclnnLogAddExp, x, y, out);
}

// aclnnKlDivTargetBackward with log_target: w e^a (a - b + 1), the gradient of KL(a || b) w.r.t. its target's
// log-probabilities a (the seed kernel). w: a 0-dim tensor ("sum") or the chunk's weights ("none").
void kl_target_gradient_into(at::Tensor& out, const at::Tensor& w, const at::Tensor& b, const at::Tensor& a) {
  const int64_t reduction = w.dim() == 0 ? kSum : kNone;
  const bool log_target = true;
  NPU_LOSS_EXEC_ACLNN(aclnnKlDivTargetBackward, w, b, a, reduction, log_target, out);
}

// KL(a || b) of log-probabilities a, b (beta 0: a = t, b = s; beta 1: a = s, b = t). ga, gb: the gradients'
// rows of a's and b's logits (undefined where not wanted).
void kl_chunk(const LogProbabilities& a, const LogProbabilities& b, ChunkOut& o, at::Tensor& ga, at::Tensor& gb,
              const Weight& w, const at::Tensor& wrows, const at::Tensor& drop) {
  at::Tensor ea = f32_like(a.y);
  exp_into(ea, a.y);
  if (o.part.defined() || o.values) {
    if (!o.f.defined()) o.f = f32_like(a.y);
    sub_into(o.f, a.y, b.y);
    mul_(o.f, ea);
  }
  if (ga.defined()) {
    at::Tensor d = f32_like(a.y);
    kl_target_gradient_into(d, wrows.defined() ? wrows : w.scalar_tensor, b.y, a.y);
    const Weight unit{};  // the weights are in d already
    gradient_rows(ga, d, a, unit, at::Tensor(), 1.0, drop);
  }
  if (gb.defined()) gradient_rows(gb, ea, b, w, wrows, -1.0, drop);
}

// 0 < beta < 1.
void mixture_chunk(const LogProbabilities& s, const LogProbabilities& t, double beta, ChunkOut& o, const Weight& w,
                   const at::Tensor& wrows, const at::Tensor& drop) {
  at::Tensor a = f32_like(s.y), b = f32_like(t.y), c = f32_like(s.y);
  adds_into(a, s.y, std::log1p(-beta));
  adds_into(b, t.y, std::log(beta));
  log_add_exp_into(c, a, b);  // m
  sub_into(a, s.y, c);        // s - m
  sub_into(b, t.y, c);        // t - m
  exp_into(c, s.y);
  mul_(a, c);  // p (s - m)
  exp_into(c, t.y);
  mul_(b, c);  // q (t - m)
  c = at::Tensor();
  double student_factor = 1 - beta;
  if (o.part.defined() || o.values) {
    scale_(a, 1 - beta);
    if (!o.f.defined()) o.f = f32_like(s.y);
    add_into(o.f, a, b, beta);
    student_factor = 1;
  }
  if (o.gs.defined()) gradient_rows(o.gs, a, s, w, wrows, student_factor, drop);
  if (o.gt.defined()) gradient_rows(o.gt, b, t, w, wrows, beta, drop);
}

// One chunk (rows.h's NpuRowMath): the log-softmaxes of both sides (their logits transformed), then the form of
// its beta class.
void chunk(const RowChunk& c, ChunkOut& o) {
  const LogProbabilities s = log_probabilities(c, 0);
  const LogProbabilities t = log_probabilities(c, 1);
  const auto beta_class = chips::unit_beta_class(c.call.scalars.real(kBeta));
  if (beta_class == chips::BetaClass::Zero) {
    kl_chunk(t, s, o, o.gt, o.gs, c.w, c.wrows, c.drop);
  } else if (beta_class == chips::BetaClass::One) {
    kl_chunk(s, t, o, o.gs, o.gt, c.w, c.wrows, c.drop);
  } else {
    mixture_chunk(s, t, c.call.scalars.real(kBeta), o, c.w, c.wrows, c.drop);
  }
}

// s, t, three of the terms, the chunk's values, a gradient's float32 row before its cast (two for float16's row
// scales), and one more for the allocator's rounding.
constexpr NpuRowMath kMath{&chunk, 8};

}  // namespace

template <>
const NpuRowMath& npu_row_math<GeneralizedJsd>() {
  return kMath;
}

}  // namespace npu_loss::npu
