// The sparse JSD's NPU math (losses.h's SparseJsd), one chunk of rows at a time in the row frame (rows.h).
// docs/npu_paths.md has the calls; docs/semantics.md, "Distillation from a served teacher", the formulas.
//
// Per chunk of n rows, the rows of V through aclnn calls (NPU_LOSS_EXEC_ACLNN), the support's (n, K) with
// torch_npu's ops:
//   y = the student's log-softmax of its transformed logits over T (the frame's log_probabilities:
//       aclnnLogSoftmax, float32);
//   s = y at the support's ids (aclnnGather), -inf where the mask is off;
//   the entries' values f and their derivatives G (w.r.t. s) and H (the teacher's), through the tail or the
//       renormalization (composite::sparse_support_terms, the composite's formulas on (n, K) tensors);
//   the student's gradient: G added at the ids of a zeroed float32 row (aclnnScatter, reduction add), then the
//       log-softmax backward at y, G - e^y sum(G) (aclnnLogSoftmaxBackward), over T and through the transform
//       (the frame's gradient_rows); the teacher's is H.
// Dropped rows are computed like any other (their ids are 0: support_ids) and then overwritten with 0.
#include <ATen/ATen.h>

#include <limits>

#include "../composite/rows.h"
#include "aclnn_api.h"
#include "rows.h"

namespace npu_loss::npu {
namespace {

// out = x's elements at index along the rows (aclnnGather, dim 1).
void gather_into(at::Tensor& out, const at::Tensor& x, const at::Tensor& index) {
  const int64_t dim = 1;
  NPU_LOSS_EXEC_ACLNN(aclnnGather, x, dim, index, out);
}

// out = x with src added at index along the rows (aclnnScatter, reduction 1: add).
void scatter_add_into(at::Tensor& out, const at::Tensor& x, const at::Tensor& index, const at::Tensor& src) {
  const int64_t dim = 1, reduction = 1;
  NPU_LOSS_EXEC_ACLNN(aclnnScatter, x, dim, index, src, reduction, out);
}

void chunk(const RowChunk& c, ChunkOut& o) {
  const LogProbabilities s = log_probabilities(c, 0);
  at::Tensor gathered = at::empty(c.ids.sizes(), s.y.options());
  gather_into(gathered, s.y, c.ids);
  const at::Tensor on = c.on.defined() ? c.on : at::ones(c.ids.sizes(), c.ids.options().dtype(at::kBool));
  const at::Tensor neg_inf = at::full({}, -std::numeric_limits<double>::infinity(), gathered.options());
  const at::Tensor teacher = c.teacher.to(at::kFloat);
  // Each entry's weight: the frame's scalar, or the chunk's grad_output rows ('none'), without 1 / T.
  const std::array<bool, 2> grads{o.gs.defined(), o.gt.defined()};
  at::Tensor w;
  if (grads[0] || grads[1]) w = c.wrows.defined() ? c.wrows : at::scalar_tensor(c.w.scalar, teacher.options());
  const composite::SupportTerms terms =
      composite::sparse_support_terms(at::where(on, gathered, neg_inf), teacher, on, c.call.scalars, w, grads);
  if (o.part.defined() || o.values) {
    if (o.f.defined()) {
      o.f.copy_(terms.f);
    } else {
      o.f = terms.f;
    }
  }
  if (grads[0]) {
    const at::Tensor zeros = at::zeros(s.y.sizes(), s.y.options());
    at::Tensor a = f32_like(s.y);
    scatter_add_into(a, zeros, c.ids, terms.g);
    const Weight unit{};  // the entries' weights are in G already
    gradient_rows(o.gs, a, s, unit, at::Tensor(), c.inv_t, c.drop);
  }
  if (grads[1]) {
    at::Tensor h = terms.gt;
    if (c.drop.defined()) zero_rows_(h, c.drop);
    if (o.gt.scalar_type() == at::kFloat) {
      o.gt.copy_(h);
    } else {
      cast_into(o.gt, h);
    }
  }
}

// y, the zeroed row and the gradient's row before the log-softmax backward, a gradient's float32 row before its
// cast (two for float16's row scales), and one more for the allocator's rounding; the support's (n, K) tensors are
// not counted.
constexpr NpuRowMath kMath{&chunk, 6};

}  // namespace

template <>
const NpuRowMath& npu_row_math<SparseJsd>() {
  return kMath;
}

}  // namespace npu_loss::npu
