// Validation, result shapes, dtypes and memory formats for every npu_loss op: every rule exists once, here.
//
// Every backend (CPU kernels, the composite fallback, the NPU kernels) calls these before doing any work,
// and the Meta kernels (registration/meta.cpp) call the same rules on SymInt sizes, so fake and meta tensors
// (torch.compile, torch.export, opcheck) are validated and shaped exactly as real ones. docs/validation.md
// lists the rules (rule, exception class, message) and docs/semantics.md the shapes, dtypes and layouts of
// results.
//
// Each rule is written once, as a template over the size type: `LossChecks<L1Loss>::forward(...)` checks real
// tensors (int64_t sizes, a ResultSpec), `LossChecks<L1Loss, c10::SymInt>::forward(...)` fake and meta
// tensors, whose sizes may be symbolic (a SymResultSpec). A loss's checks are made from its declaration
// (losses.h) and the shared rules, which checks.cpp instantiates for both size types.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>
#include <c10/util/DimVector.h>
#include <c10/util/SmallVector.h>

#include <array>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "../losses.h"
#include "reduction.h"

namespace npu_loss {

constexpr int64_t kMaxDims = 8;

// What an op returns: its shape, its dtype, the shape all inputs broadcast to, and the memory format a
// result this op allocates gets (docs/semantics.md, "Memory format"; out= tensors keep their own layout).
template <typename Int>
struct BasicResultSpec {
  c10::SmallVector<Int, c10::kDimVectorStaticSize> shape;  // c10::DimVector / c10::SymDimVector
  c10::ScalarType dtype;
  c10::SmallVector<Int, c10::kDimVectorStaticSize> broadcast_shape;
  c10::MemoryFormat memory_format = c10::MemoryFormat::Contiguous;
  // What "mean" divides by: the broadcast count for a forward, the count the declaration names
  // (losses.h, MeanCount) for a backward op.
  Int mean_count = 0;
};

using ResultSpec = BasicResultSpec<int64_t>;
using SymResultSpec = BasicResultSpec<c10::SymInt>;

// A named tensor argument, for messages.
using NamedTensor = std::pair<const char*, const at::Tensor*>;

// Validates an out= tensor against the result it will receive: defined, same device, dtype, exact shape,
// no internal overlap, and no partial overlap with any input (an exact alias is allowed only where the
// result has the broadcast shape). For ResultSpec and SymResultSpec.
template <typename Int>
void check_out(
    const char* op, const char* name, const at::Tensor& out, const BasicResultSpec<Int>& spec, OutDtype rule,
    std::initializer_list<NamedTensor> inputs);

// A new tensor of `sizes` laid out in `format`. Made with empty_strided, which every backend supports
// (torch_npu creates tensors in the contiguous format only, but takes any strides).
at::Tensor empty_with_format(c10::IntArrayRef sizes, const at::TensorOptions& options, c10::MemoryFormat format);

// A new tensor for `spec`'s result: its shape, dtype and memory format, with `options`' device.
template <typename Int>
at::Tensor empty_result(const BasicResultSpec<Int>& spec, const at::TensorOptions& options);

// `t` itself when it is dense in `format`, else a copy that is (Tensor::contiguous(format) without the
// NPU's restriction to the contiguous format).
at::Tensor with_memory_format(const at::Tensor& t, c10::MemoryFormat format);

// float64 runs on CPU and the fallback, never on the NPU.
bool float64_allowed(const at::Tensor& t);

// ---- the rules every loss shares, written for either size type (checks.cpp) ----

// The first checks of every op, in this order: tensors defined, on one device, of accepted dtypes, and a
// valid reduction.
void check_common(const char* op, std::initializer_list<NamedTensor> tensors, int64_t reduction);

// A float scalar's rule (losses.h, ScalarRule), naming it; a bool scalar has none.
void check_scalar(const char* op, const ScalarArg& arg, double value);
inline void check_scalar(const char*, const ScalarArg&, bool) {}

// A forward's result: broadcast(self, target) for "none", 0-dim otherwise, in at::result_type(self, target).
template <typename Int>
BasicResultSpec<Int> forward_spec(const char* op, const at::Tensor& self, const at::Tensor& target, int64_t reduction);

// A backward op's result, by what it differentiates, its dtype rule and its "mean" count (losses.h): self's gradient over
// broadcast(grad_output, self, target), or target's over target's own shape (grad_output must broadcast to
// broadcast(self, target) without enlarging it).
template <typename Int>
BasicResultSpec<Int> backward_spec(
    const char* op, const LossDecl& decl, const at::Tensor& grad_output, const at::Tensor& self,
    const at::Tensor& target);

// ---- each loss's checks, from its declaration ----
//
// LossChecks<Loss>::forward(self, target, reduction, scalars...), ::backward(grad_output, self, target,
// reduction, scalars...) and ::backward_out(..., out): the checks of the loss's three ops, returning the
// result's spec. LossChecks<Loss, c10::SymInt> checks fake and meta tensors.
template <typename Loss, typename Int = int64_t, typename Scalars = ScalarsOf<Loss>>
struct LossChecks;

template <typename Loss, typename Int, typename... S>
struct LossChecks<Loss, Int, std::tuple<S...>> {
  static constexpr const LossDecl& d = Loss::decl;

  static BasicResultSpec<Int> forward(const at::Tensor& self, const at::Tensor& target, int64_t reduction, S... s) {
    check_common(d.forward, {{"self", &self}, {"target", &target}}, reduction);
    (check_scalar(d.forward, d.scalar, s), ...);
    return forward_spec<Int>(d.forward, self, target, reduction);
  }

  static BasicResultSpec<Int> backward(
      const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction, S... s) {
    check_common(d.backward, {{"grad_output", &grad_output}, {"self", &self}, {"target", &target}}, reduction);
    (check_scalar(d.backward, d.scalar, s), ...);
    return backward_spec<Int>(d.backward, d, grad_output, self, target);
  }

  // The out= overload: the backward's checks, then check_out on the out tensor.
  static BasicResultSpec<Int> backward_out(
      const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction, S... s,
      const at::Tensor& out) {
    auto spec = backward(grad_output, self, target, reduction, s...);
    check_out<Int>(
        d.backward, d.out_arg, out, spec, d.out_dtype,
        {{"grad_output", &grad_output}, {"self", &self}, {"target", &target}});
    return spec;
  }
};

// ---- a row loss's checks (LossKind::Rows: losses.h's RowArgs) ----

// What a row loss's op returns, from its checked arguments: the result's dtype (the promotion of the two
// logits' dtypes; each gradient has its logits' dtype), the logits' shape (..., V), the number of rows (the
// product of the leading dims) and V. With labels, 'none' keeps the rows whose label is not the index: a
// count only the data tells.
template <typename Int>
struct BasicRowSpec {
  c10::ScalarType dtype;
  c10::SmallVector<Int, c10::kDimVectorStaticSize> logits_shape;
  Int rows = 0;
  Int vocab = 0;
  bool labels = false;
  // The values' entries per row ('none''s last dimension, and what "mean" counts per row kept): V for a teacher
  // of logits; K, or K + 1 with the tail bucket (ScalarRole::SupportTail), for a teacher over a support.
  Int entries = 0;
  // A teacher over a support: its K (0 for logits).
  Int support = 0;
};

using RowSpec = BasicRowSpec<int64_t>;

// A call's values of a row loss's scalars with their declaration: the frames read them by role, the member's
// math by name (losses.h's row_scalar gives the position).
struct DeclaredScalars {
  const RowArgs* args;
  RowScalars values;

  double real(int i) const { return values[i].real; }
  // The temperature (ScalarRole::Temperature), or 1 when the loss declares none.
  double temperature() const {
    const int i = row_scalar_of(*args, ScalarRole::Temperature);
    return i < 0 ? 1.0 : values[i].real;
  }
  // A side's logit transform (0 the student's, 1 the teacher's): its scale (1 where the loss declares none) and
  // its softcap (0: none).
  struct Transform {
    double scale = 1.0;
    double softcap = 0.0;
    bool identity() const { return scale == 1.0 && softcap == 0.0; }
  };
  Transform transform(int side) const {
    Transform t;
    const int scale = row_scalar_of(*args, side == 0 ? ScalarRole::StudentScale : ScalarRole::TeacherScale);
    const int cap = row_scalar_of(*args, side == 0 ? ScalarRole::StudentSoftcap : ScalarRole::TeacherSoftcap);
    if (scale >= 0) t.scale = values[scale].real;
    if (cap >= 0 && !values[cap].absent) t.softcap = values[cap].real;
    return t;
  }
  // Whether neither side's logits are transformed.
  bool untransformed() const { return transform(0).identity() && transform(1).identity(); }
  // The same values with each side's transform at its identity (scale 1, no softcap): for logits the caller
  // has transformed itself (the linear form's chunks).
  DeclaredScalars without_transform() const {
    DeclaredScalars d = *this;
    for (const ScalarRole role : {ScalarRole::StudentScale, ScalarRole::TeacherScale}) {
      if (const int i = row_scalar_of(*args, role); i >= 0) d.values[i].real = 1.0;
    }
    for (const ScalarRole role : {ScalarRole::StudentSoftcap, ScalarRole::TeacherSoftcap}) {
      if (const int i = row_scalar_of(*args, role); i >= 0) d.values[i] = {.absent = true};
    }
    return d;
  }
  // Whether a teacher over a support has the tail bucket (ScalarRole::SupportTail; false where none is declared).
  bool tail() const {
    const int i = row_scalar_of(*args, ScalarRole::SupportTail);
    return i >= 0 && values[i].flag;
  }
  // The family's beta (ScalarRole::Beta), which the loss must declare.
  double beta() const {
    const int i = row_scalar_of(*args, ScalarRole::Beta);
    TORCH_INTERNAL_ASSERT(i >= 0, "the row loss declares no beta");
    return values[i].real;
  }
};

// A call's inputs without a gradient (RowArgs::inputs), by position: undefined where an optional one is absent.
using RowInputs = std::array<at::Tensor, kMaxRowInputs>;

// The arguments of one call of a row loss's op: what its checks and every backend's row math take.
struct RowCall {
  const at::Tensor& student;
  const at::Tensor& teacher;
  RowInputs inputs;  // RowArgs::inputs (undefined where an optional one is absent)
  const std::optional<at::Tensor>& labels;
  int64_t reduction;
  DeclaredScalars scalars;  // RowArgs::scalars
  int64_t ignore_index;
};

// A row loss's RowCall of an op's arguments.
template <typename Loss>
RowCall row_call(const at::Tensor& student, const at::Tensor& teacher, const RowInputs& inputs,
                 const std::optional<at::Tensor>& labels, int64_t reduction, const RowScalars& scalars,
                 int64_t ignore_index) {
  return {student, teacher, inputs, labels, reduction, {&Loss::decl.rows, scalars}, ignore_index};
}

// Whether the forward with gradients stores them with row scales (isa.h's RowBatch, row_scale): when a gradient
// it makes is float16's, whose range would flush most of a large vocabulary's gradients before the loss scale
// reaches them. Its fourth result, the row scales, is then 2^-j per row; else ones.
inline bool scales_rows(const at::Tensor& student, const at::Tensor& teacher, std::array<bool, 2> mask) {
  return (mask[0] && student.scalar_type() == at::kHalf) || (mask[1] && teacher.scalar_type() == at::kHalf);
}

// The backward op's grad_output of 'none' with labels has one row per row kept: `kept`, counted from the labels
// by the kernel that reads them (a count the Meta kernels cannot know).
void check_grad_output_rows(const char* op, const at::Tensor& grad_output, int64_t kept);

// A teacher over a support (TeacherForm::Support): its ids and mask (RowArgs::inputs of kind Ids and Mask) as every
// backend reads them, (rows, K) and contiguous on their device: the ids as int64, 0 where the mask is off; the
// mask as bool, undefined where it is absent (every entry on). Checked on the host, over the rows `keep` keeps
// (a bool (rows,) tensor; undefined: every row): an id outside [0, vocab) where the mask is on is an IndexError,
// and an id twice in a row where the mask is on a ValueError, each naming the row (the divergence would count
// that token twice).
struct SupportIds {
  at::Tensor ids, on;
};
SupportIds support_ids(const char* op, const RowArgs& r, const RowInputs& inputs, const at::Tensor& keep,
                       int64_t rows, int64_t vocab);

// The forward's checks (the forward with gradients has the same arguments): every tensor defined (an optional
// input may be absent) and on one device; floating logits with at least one dimension (the vocabulary) and at
// most 8; the teacher of the student's shape (TeacherForm::Logits) or of its leading shape and a last dimension
// K >= 1 (Support); each input of the teacher's shape and of its kind's dtype (Ids integer, Mask bool); labels of
// an integer dtype and the leading shape; the reduction; each declared scalar's rule.
template <typename Int>
BasicRowSpec<Int> row_forward_spec(const LossDecl& d, const char* op, const RowCall& c);

// The forward with gradients': the forward's, and a reduced result ("mean" or "sum": the gradients are those
// of a scalar).
template <typename Int>
BasicRowSpec<Int> row_with_grads_spec(const LossDecl& d, const RowCall& c);

// The backward op's: the forward's, and grad_output, floating, on the same device, 0-dim for "mean" and
// "sum", and for "none" of the values' shape: the leading shape and the entries per row without labels, (kept,
// entries) with them (kept, the rows kept, is checked against the labels by the kernels, which read them).
template <typename Int>
BasicRowSpec<Int> row_backward_spec(const LossDecl& d, const at::Tensor& grad_output, const RowCall& c);

// ---- a row loss's linear form (losses.h's LinearForm) ----

// The row family's reductions, by the names its Python API takes (TRL's), in one vocabulary for every member
// and its linear form: the sum divided by the rows kept ('batchmean'; without labels by the logits' first
// dimension; at least 1), by the elements of the rows kept ('mean'), not at all ('sum'), or each element's
// value ('none'). The row ops take 'none', 'mean' and 'sum' as ATen's integers (their 'batchmean' is the
// Python function's division of the sum, a tensor op so that DTensor divides by the whole count); the linear
// form's ops take the names, all but 'none' (their gradients are made in the forward, for a scalar loss).
enum class FamilyReduction : uint8_t { BatchMean, Mean, Sum, None };

// Their names, in FamilyReduction's order.
inline constexpr std::array<const char*, 4> kFamilyReductions{"batchmean", "mean", "sum", "none"};

// The reduction `how` names, for `op`'s messages: a ValueError for any other name, and for 'none' when
// `scalar_only`.
FamilyReduction family_reduction(const char* op, c10::string_view how, bool scalar_only);

// Its arguments, as both ops take them (the forward with gradients adds its output_mask): the two sides' hidden
// states, weights and biases; the labels; the reduction; the row loss's scalars and index; the hard and
// soft losses' weights; the rows per chunk asked for (none: the default); whether the parts are returned, and
// the student's entropy per row.
struct LinearCall {
  const at::Tensor* input[2];
  const at::Tensor* weight[2];
  const std::optional<at::Tensor>* bias[2];
  const std::optional<at::Tensor>& labels;
  c10::string_view reduction;
  DeclaredScalars scalars;  // the row loss's (RowArgs::scalars)
  int64_t ignore_index;
  double weight_hard, weight_soft;
  std::optional<int64_t> chunk_size;
  bool return_parts;
  bool return_entropy;
};

// A teacher over a support (losses.h's LinearForm): its Ids and Mask inputs, from the teacher side's weight and
// bias places, as the row loss's RowInputs (at their declared positions).
RowInputs linear_support_inputs(const RowArgs& r, const LinearCall& c);

// The gradients a call makes of those output_mask asks for: a support's ids and mask get none.
inline std::array<bool, 6> linear_mask(const RowArgs& r, std::array<bool, 6> mask) {
  if (r.teacher == TeacherForm::Support) mask[4] = mask[5] = false;
  return mask;
}

// What its checks say of a call: the result's dtype (the promotion of the two inputs'), the inputs' leading
// shape, its rows and the vocabulary, a support's K (0 for teacher logits), the values per row "mean" counts
// (V, or K + 1 with a support's tail, K without), and what 'batchmean' divides by without labels (the first
// dimension of the logits the inputs would make: the rows of a 2-D input, V of a 1-D one).
template <typename Int>
struct BasicLinearSpec {
  const char* op = nullptr;  // the op checked, named in the messages of what its kernels check later
  c10::ScalarType dtype;
  c10::SmallVector<Int, c10::kDimVectorStaticSize> leading;
  Int rows = 0;
  Int vocab = 0;
  Int support = 0;
  Int entries = 0;
  Int batch_rows = 0;
  bool labels = false;
  FamilyReduction reduction = FamilyReduction::BatchMean;
};

using LinearSpec = BasicLinearSpec<int64_t>;

// The checks of both of the linear form's ops (`op` names it in messages): the four tensors defined, every
// tensor on one device; hidden states of at least one and at most 8 dimensions with the same leading shape;
// weights (V, H) with the same V, each H its input's last dimension; biases (V,); each weight and bias of its
// input's dtype; labels of an integer dtype and the leading shape; the reduction ('none' refused); the scalars'
// rules; labels given when weight_hard_loss != 0; a chunk_size >= 1 when given. A teacher over a support: its
// values floating, of the inputs' leading shape and K >= 1 entries, its ids and mask as the row loss checks them.
template <typename Int>
BasicLinearSpec<Int> linear_spec(const LossDecl& d, const char* op, const LinearCall& c);

}  // namespace npu_loss
