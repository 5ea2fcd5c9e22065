// The row losses' NPU frame (losses.h's LossKind::Rows), one for every row member, as AclnnKernels
// (npu_common.h) is for the elementwise losses. rows.cpp has the frame: the checks, this chip's path of a call
// (the member's declared aclnn APIs, Loss::aclnn_apis, present and not rejected), the chunks of rows within
// their memory budget, the gradients' weights, float16's row scales, dropped rows, 'none''s values and the
// reduced total, and the composite (composite/rows.h) for the whole call where the path names no API or the
// chip's CANN rejects one. A member gives its math per chunk (NpuRowMath), in a file of its own
// (generalized_jsd.cpp); docs/npu_paths.md has the rows, the calls and the chunk's memory budget.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>

#include "../core/checks.h"
#include "../losses.h"

namespace npu_loss::npu {

// ---- one aclnn call each (NPU_LOSS_EXEC_ACLNN), for the frame and the members' math ----

at::Tensor f32_like(const at::Tensor& t);  // an uninitialised float32 tensor of t's shape (no call)
at::Tensor cast_f32(const at::Tensor& x);
void cast_into(at::Tensor& out, const at::Tensor& x);
void scale_(at::Tensor& x, double factor);
void mul_(at::Tensor& x, const at::Tensor& y);
at::Tensor log_softmax(const at::Tensor& x);  // over a (rows, V) chunk's rows, into float32
// out = a - e^y sum(a): the log-softmax backward at the log-probabilities y.
void log_softmax_backward_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& y);
// The chunk's total into a 0-dim float32 slot.
void sum_into(at::Tensor& out, const at::Tensor& x);
void zero_rows_(at::Tensor& x, const at::Tensor& drop);

// Every element's weight of the gradients, 1 / T folded in: a host scalar ("mean", "sum" and the forward's
// gradients) or, for the backward of 'none', a float32 (n, V) tensor per chunk.
struct Weight {
  double scalar = 1;
  bool mean = false;         // scalar is then divided by the elements of the rows kept
  at::Tensor rows;           // 'none': grad_output's rows, one per row (rows, V) or one per row kept (K, V)
  at::Tensor scalar_tensor;  // scalar as a 0-dim float32 tensor on the device, for aclnnKlDivTargetBackward
};

// What a chunk makes: its part of the total (a 0-dim float32 slot), its 'none' values (float32 (n, V): the
// result's rows themselves when they are float32 rows of every row) and the gradients' rows, each undefined where
// not wanted.
struct ChunkOut {
  at::Tensor part;
  bool values = false;
  at::Tensor f;
  at::Tensor gs, gt;
};

// One chunk as a member's math gets it: n rows of each side's logits (in their own dtype, untransformed), 1 / T,
// every element's weight of the gradients (w; and wrows, float32 (n, V) over T, for the backward of 'none'; for a
// teacher over a support (TeacherForm::Support), each entry's, without the 1 / T: w.scalar, or wrows (n, K + 1)
// or (n, K), and the teacher its (n, K) values), the
// rows the labels drop (drop: (n, 1) bool; undefined when the chunk keeps every row) and the gradients wanted.
struct RowChunk {
  const RowCall& call;
  at::Tensor student, teacher;
  at::Tensor ids, on;  // a teacher over a support: the chunk's rows of its checked ids and its mask (or undefined)
  double inv_t;
  const Weight& w;
  at::Tensor wrows, drop;
  std::array<bool, 2> mask;
};

// A row member's NPU math. chunk() fills what `o` asks for: the values' float32 rows f (o.f, allocating it when
// undefined) where o.part or o.values is set, and the gradients' rows o.gs and o.gt where defined (zero in
// dropped rows); the frame then sums, places, scales and casts them. temporaries: the float32 (rows, V)
// tensors a chunk holds alive at once, at most, with the frame's (whence the chunk's rows: composite::chunk_rows),
// besides the softcap's slopes (the frame adds one per softcapped side whose gradient is made).
struct NpuRowMath {
  void (*chunk)(const RowChunk& c, ChunkOut& o);
  int64_t temporaries;
};

// A side of a chunk as a member's math sees it: y, the float32 log-probabilities of its logits transformed (the
// scale, then the softcap c tanh(. / c): losses.h's ScalarRole) and over T; and the chain of the transform, what
// the side's gradient w.r.t. y (over T) is multiplied by to be the gradient w.r.t. its logits: `chain` and, with a
// softcap, `slope` (float32 rows; defined where the side's gradient is made). The scale alone: chain = scale; a
// softcap: slope = tanh^2 - 1 and chain = -scale.
struct LogProbabilities {
  at::Tensor y;
  at::Tensor slope;
  double chain = 1;
};

// The log-probabilities of a side of a chunk (0 the student's, 1 the teacher's).
LogProbabilities log_probabilities(const RowChunk& c, int side);

// a (scaled by the scalar weight, or times the chunk's weights, then by `factor` and the side's chain) as a
// gradient's rows of the side's logits: its log-softmax backward at the side's y, times its slope, into `out`
// (float32 rows) or through a float32 row and a cast.
void gradient_rows(at::Tensor& out, at::Tensor& a, const LogProbabilities& side, const Weight& w,
                   const at::Tensor& wrows, double factor, const at::Tensor& drop);

// Whether a member has an aclnn path (its declared aclnn_apis, and then its chunk math, npu_row_math<Loss>): a
// member without one runs the composite on every chip, as its declared paths say.
template <typename Loss>
constexpr bool kHasAclnnPath = requires { Loss::aclnn_apis; };

// Each row member's math, from its own file: one specialization per member of losses.h's list, declared here
// from the list (a member that declares aclnn_apis and has none fails to link; a member without aclnn_apis runs
// the composite on every chip, as its declared paths say, and needs none).
template <typename Loss>
const NpuRowMath& npu_row_math();
#define NPU_LOSS_DECLARE_ROW_MATH(Loss) \
  template <>                           \
  const NpuRowMath& npu_row_math<Loss>();
NPU_LOSS_FOR_EACH_ROW_LOSS(NPU_LOSS_DECLARE_ROW_MATH)
#undef NPU_LOSS_DECLARE_ROW_MATH

}  // namespace npu_loss::npu
