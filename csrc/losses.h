// The declaration of every loss: the one source the package's tables are derived from, as PyTorch's
// native_functions.yaml and derivatives.yaml are for ATen. One block per loss holds its facts: its kind, its
// ops and their schemas, its scalar arguments, what its backward op differentiates and how its "mean"
// divides, the dtype and out= rules, which ATen overloads enable() routes to it, its autocast policy and its
// aclnn APIs. What stays per loss is its math: the CPU functor (cpu/), the composite formula (composite/), the
// derivative formulas (autograd/) and the NPU call (npu/). docs/adding_a_loss.md walks through a new block.
//
// Two kinds of loss share the vocabulary (LossKind): elementwise losses of self and target (the first five),
// and losses over rows of logits, with a softmax inside each row (the distillation family).
//
// Plain C++ (no torch types): the chip paths and every layer include it.
#pragma once

#include "chips/paths.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

namespace npu_loss {

// ---- the vocabulary of a declaration ----

// What a declaration describes: its ops' arguments, and so what each layer derives from it.
enum class LossKind : uint8_t {
  Elementwise,  // self and target broadcast together, one value per element, reduced (SmoothL1Loss ... MseLoss)
  Rows,         // rows of logits (the last dimension), a softmax inside each, rows that labels drop (RowArgs)
};

// A scalar argument: an elementwise loss's one after `reduction`, if any (smooth L1's beta, Huber's delta,
// KL's log_target), or one of a row loss's (RowArgs).
enum class ScalarKind : uint8_t { None, Float, Bool, Int, OptionalFloat /* float or None (a row loss's) */ };

// What the checks require of a float scalar, or of an optional one that is given (NaN fails every rule but Any).
enum class ScalarRule : uint8_t { Any, NonNegative, Positive, UnitInterval };

// What a row loss's frames (the checks, the chunks, the chip paths) read of one of its scalars; the member's
// own math reads the rest, by name (row_scalar).
enum class ScalarRole : uint8_t {
  Own,             // the member's math alone
  Beta,            // the family's beta: KL at 0 and 1, the mixture between (the chip paths' beta classes)
  Temperature,     // every logit is divided by it
  StudentScale,    // the logit transform (TRL's order: the scale, the softcap, then the temperature): the
  TeacherScale,    //   student's or the teacher's logits times it
  StudentSoftcap,  //   an optional float: c * tanh(z / c) of the scaled logits, where given
  TeacherSoftcap,
  SupportTail,     // a bool of a teacher given over a support (TeacherForm::Support): where true, each row has one
                   //   more entry, the tail bucket (its values' last dimension, and what "mean" counts, are K + 1)
};

struct ScalarArg {
  ScalarKind kind = ScalarKind::None;
  const char* name = nullptr;
  const char* default_value = nullptr;  // in the forward's schema, as the schema writes it
  bool keyword_only = false;            // in the forward's schema (KL's log_target, as in ATen)
  ScalarRule rule = ScalarRule::Any;
  ScalarRole role = ScalarRole::Own;
};

// The input a backward op differentiates (its result has that input's shape: the broadcast shape for self,
// whose gradient autograd sums to self's own shape; target's own shape for target).
enum class GradOf : uint8_t { Self, Target };

// The element count a backward op's "mean" divides by.
enum class MeanCount : uint8_t {
  Self,                 // self.numel() (smooth L1, Huber and MSE, as ATen and the Ascend kernels do)
  Broadcast,            // broadcast(grad_output, self, target).numel()
  SelfTargetBroadcast,  // broadcast(self, target).numel()
};

// The dtype of a backward op's result.
enum class GradDtype : uint8_t {
  Self,      // self's dtype
  Promoted,  // the promotion of grad_output, self and target
  Target,    // target's dtype
};

// How an out= tensor's dtype is constrained.
enum class OutDtype : uint8_t {
  AnyFloating,   // any accepted floating dtype (the result is cast into it)
  EqualsResult,  // exactly the result's dtype
};

// The ATen overloads of the same name and schema that enable() routes to the loss's ops, as bits. torch has
// no l1_loss or kl_div backward op (their autograd formulas are made of other ops), and no row loss.
enum class AtenTwin : uint8_t { None = 0, Forward = 1, Backward = 2, BackwardOut = 4, All = 7 };

constexpr bool has_twin(AtenTwin twins, AtenTwin twin) {
  return (static_cast<uint8_t>(twins) & static_cast<uint8_t>(twin)) != 0;
}

// The arguments of a loss over rows (LossKind::Rows), in its forward's schema: the student's logits (..., V)
// and the teacher, each with a gradient; the member's inputs without one (`inputs`: any number up to
// kMaxRowInputs, each of the teacher's shape); an optional integer tensor of the leading shape, whose entries
// equal to the index drop their rows (the loss reads nothing else of it); the reduction; the member's own
// scalars as it declares them (any number up to kMaxRowScalars, each with its kind, name, default, rule and
// role); and the index:
//   <forward>(Tensor <logits[0]>, Tensor <logits[1]>, Tensor[?] <inputs[0]>[=None], ..., Tensor? <labels>=None,
//             int reduction=1, <scalars[0]>=..., <scalars[1]>=..., ..., int <index>=...)
// Its backward op takes grad_output first and, like its forward with gradients (LossDecl::with_grads),
// `bool[2] output_mask` last: which of the two gradients to make. Every layer below takes the inputs as one
// RowInputs and the scalars as one RowScalars (their values, by position) and reads the scalars by name
// (row_scalar) or by role (ScalarRole).
inline constexpr int kMaxRowScalars = 8;
inline constexpr int kMaxRowInputs = 4;

// What a row loss's teacher is (its second tensor, `logits[1]`).
enum class TeacherForm : uint8_t {
  Logits,   // logits of the student's shape (..., V)
  Support,  // (..., K), K >= 1: values at K entries of each row's vocabulary, named by an Ids input
};

// A row loss's input without a gradient, of the teacher's shape.
enum class InputKind : uint8_t {
  None,
  Ids,   // an integer tensor: entries of the vocabulary, in [0, V) (the member's kernels check those they read)
  Mask,  // a bool tensor: which of the teacher's entries count
};

struct RowInput {
  InputKind kind = InputKind::None;
  const char* name = nullptr;
  bool optional = false;  // `Tensor? <name>=None` in the schema (absent: every entry counts)
};

struct RowArgs {
  const char* logits[2] = {};  // the student's logits, then the teacher (TeacherForm says which form)
  TeacherForm teacher = TeacherForm::Logits;
  RowInput inputs[kMaxRowInputs] = {};  // the declared ones first; the rest InputKind::None
  const char* labels = nullptr;
  ScalarArg scalars[kMaxRowScalars] = {};  // the declared ones first; the rest ScalarKind::None
  ScalarArg index = {};
};

// How many of a declaration's list (RowArgs::inputs, RowArgs::scalars) are declared: those before the first
// of kind None.
template <typename Arg, size_t N>
constexpr int declared_count(const Arg (&args)[N]) {
  int n = 0;
  while (n < static_cast<int>(N) && args[n].kind != decltype(args[0].kind)::None) ++n;
  return n;
}

// The position of a declared one by its name: a compile-time error when the list has none of that name.
template <typename Arg, size_t N>
consteval int declared_position(const Arg (&args)[N], std::string_view name) {
  for (int i = 0; i < declared_count(args); ++i) {
    if (std::string_view(args[i].name) == name) return i;
  }
  throw "the declaration has no argument of this name";
}

// How many inputs without a gradient, and how many scalars, a row loss declares; the position of each by name.
constexpr int row_input_count(const RowArgs& r) { return declared_count(r.inputs); }
constexpr int row_scalar_count(const RowArgs& r) { return declared_count(r.scalars); }
consteval int row_input(const RowArgs& r, std::string_view name) { return declared_position(r.inputs, name); }
consteval int row_scalar(const RowArgs& r, std::string_view name) { return declared_position(r.scalars, name); }

// The position of its scalar of a role, or -1.
constexpr int row_scalar_of(const RowArgs& r, ScalarRole role) {
  for (int i = 0; i < row_scalar_count(r); ++i) {
    if (r.scalars[i].role == role) return i;
  }
  return -1;
}

// The position of its (first) input without a gradient of a kind, or -1.
constexpr int row_input_of(const RowArgs& r, InputKind kind) {
  for (int i = 0; i < row_input_count(r); ++i) {
    if (r.inputs[i].kind == kind) return i;
  }
  return -1;
}

// One scalar's value, of the kind its declaration says (the field of that kind is the one set).
struct ScalarValue {
  double real = 0;      // ScalarKind::Float, OptionalFloat
  int64_t integer = 0;  // ScalarKind::Int
  bool flag = false;    // ScalarKind::Bool
  bool absent = false;  // ScalarKind::OptionalFloat: None
};

// A call's values of a row loss's scalars, by their position in its declaration.
using RowScalars = std::array<ScalarValue, kMaxRowScalars>;

// The linear form of a row loss (LinearForm): its logits made chunk by chunk from hidden states and `lm_head`
// weights (student and teacher), never whole, with a hard loss (cross entropy on the first logits, untempered)
// beside the row loss (the soft loss), each with its weight:
//   <forward>(Tensor <inputs[0]>, Tensor <weights[0]>, Tensor <inputs[1]>, Tensor <weights[1]>,
//             Tensor? <labels>=None, Tensor? <biases[0]>=None, Tensor? <biases[1]>=None,
//             str reduction="batchmean", <the row loss's scalars>=..., int <index>=...,
//             float <weights_of[0]>=..., float <weights_of[1]>=..., int? chunk_size=None,
//             bool return_soft_hard_loss=False, bool return_entropy=False) -> (Tensor, Tensor, Tensor, Tensor)
//     (the loss, the soft and hard parts unweighted, and the entropy of the first side's transformed, tempered
//     distribution per row, float32 of the inputs' leading shape, 0 on dropped rows: empty unless asked for;
//     every argument positional, as DTensor's rules read them; the Python function makes all but the first
//     five keyword-only)
//   <with_grads>(<the forward's arguments, positional, no defaults>, bool[6] output_mask)
//     -> (Tensor x 11): the three results, the gradients of the loss w.r.t. the two inputs, weights and biases
//     (in that order, per side; empty where the mask says no), the scales they are stored at (float32, one
//     per side: the gradient is the stored tensor times its side's; 1 but for float16, composite/linear.h), and
//     the entropy.
//   A teacher over a support (TeacherForm::Support) has no hidden states: its side's three places take its values,
//   its Ids input and its Mask input (the names are the row loss's, `Tensor? <Mask>=None` after the student's
//   bias), the chunks make no teacher logits, and its "input"'s gradient is the values' (..., K).
struct LinearForm {
  const char* forward = nullptr;
  const char* with_grads = nullptr;
  const char* inputs[2] = {};
  const char* weights[2] = {};
  const char* biases[2] = {};
  ScalarArg weights_of[2] = {};  // the hard loss's weight, then the soft loss's
};

// A field a block leaves out takes the common case: ATen's elementwise loss of self with no scalar (as MSE is).
struct LossDecl {
  const char* forward;                      // the forward op, e.g. "smooth_l1_loss"
  const char* backward;                     // its backward op
  const char* out_overload = "grad_input";  // the backward's out= overload name
  const char* out_arg = "grad_input";       // the out= tensor's name
  ScalarArg scalar = {};
  GradOf grad_of = GradOf::Self;
  MeanCount mean_count = MeanCount::Self;
  GradDtype grad_dtype = GradDtype::Self;
  OutDtype out_dtype = OutDtype::AnyFloating;
  AtenTwin aten_twin = AtenTwin::All;
  bool autocast_float32 = true;  // under torch.autocast the forward runs in float32 (torch's float32 op list)
  const char* aclnn_forward = nullptr;  // the aclnn APIs of the loss's own NPU kernels
  const char* aclnn_backward = nullptr;
  LossKind kind = LossKind::Elementwise;
  RowArgs rows = {};                  // a row loss's arguments
  const char* with_grads = nullptr;   // a row loss's forward that also makes the gradients, in one pass
  LinearForm linear = {};             // a row loss's linear form, if it has one
};

// Beside `decl`, each block has `forward_paths` and `backward_paths`: what serves each call of its forward
// and backward ops on each chip family (chips/paths.h; docs/npu_paths.md gives the reason for each row).

// ---- one block per loss ----

struct SmoothL1Loss {
  static constexpr LossDecl decl{
      .forward = "smooth_l1_loss", .backward = "smooth_l1_loss_backward",
      .scalar = {ScalarKind::Float, "beta", "1.0", false, ScalarRule::NonNegative},
      .aclnn_forward = "aclnnSmoothL1Loss", .aclnn_backward = "aclnnSmoothL1LossBackward"};
  static constexpr auto forward_paths = chips::on_every_chip(decl.aclnn_forward);
  // The TBE kernels divide by beta + 1e-6 (and list bf16 from 910B on). The Ascend 950 kernel gives NaN for
  // beta < 1e-6, at d == 0 for beta == 0 (where its L1 kernel serves, with its own "mean" divisor) and at
  // d = +-inf for beta == inf.
  static constexpr chips::PathRow backward_paths[] = {
      {.chips = chips::k910 | chips::k310P, .dtypes = chips::kBf16, .why = "aclnn lists bf16 from Ascend 910B on"},
      {.chips = chips::k910 | chips::k310P, .dtypes = chips::kNoBf16, .betas = chips::kTbeExact,
       .aclnn = decl.aclnn_backward,
       .why = "at beta == 0 the TBE kernel gives sign(d) with sign(0) = 0 and 0 at a NaN, this package's result "
              "(its `aclnnL1LossBackward` would give -grad at a NaN)"},
      {.chips = chips::k910 | chips::k310P, .dtypes = chips::kNoBf16, .betas = chips::kTbeBiased,
       .why = "the TBE kernel divides by `beta + 1e-6`"},
      {.chips = chips::k910B, .betas = chips::kTbeExact, .aclnn = decl.aclnn_backward, .why = "as on 910"},
      {.chips = chips::k910B, .betas = chips::kTbeBiased, .why = "the TBE kernel divides by `beta + 1e-6`"},
      {.chips = chips::k950, .betas = chips::set_of({chips::BetaClass::Zero}), .aclnn = "aclnnL1LossBackward",
       .fixes = chips::kPrescaledMean,
       .why = "the regbase smooth-L1 kernel gives NaN at d == 0 with a tensor grad_output; its L1 kernel gives "
              "sign(d), 0 at a NaN, and divides \"mean\" by the broadcast count"},
      {.chips = chips::k950, .betas = chips::set_of({chips::BetaClass::Small, chips::BetaClass::Normal}),
       .aclnn = decl.aclnn_backward},
      {.chips = chips::k950, .betas = chips::set_of({chips::BetaClass::Tiny, chips::BetaClass::Inf}),
       .why = "the kernel sets 1/beta to NaN below 1e-6, and its `d * (1/beta)` is NaN at d = ±inf for beta == inf"},
      {.chips = chips::k310B, .why = chips::kNoLossApis},
  };
};

// Huber runs smooth L1's aclnn kernels with beta = delta (npu/smooth_l1_loss.cpp).
struct HuberLoss {
  static constexpr LossDecl decl{
      .forward = "huber_loss", .backward = "huber_loss_backward", .out_overload = "out",
      .scalar = {ScalarKind::Float, "delta", "1.0", false, ScalarRule::Positive},
      .aclnn_forward = "aclnnSmoothL1Loss", .aclnn_backward = "aclnnSmoothL1LossBackward"};
  // Smooth L1's rows (scaled_paths): delta folded into grad_output (the backward) or applied to the result
  // (the forward), and at delta == +inf the composite.
  static constexpr auto kDeltas =
      static_cast<chips::Set>(chips::kEveryBeta & ~chips::set_of({chips::BetaClass::Zero}));
  static constexpr auto forward_paths = chips::scaled_paths<SmoothL1Loss::forward_paths, kDeltas>(
      "δ · smooth L1 (β = δ), on smooth L1's row",
      "δ · smooth L1 is inf · 0 = NaN at δ == +inf (Huber is 0.5·d² there)");
  static constexpr auto backward_paths = chips::scaled_paths<SmoothL1Loss::backward_paths, kDeltas>(
      "δ · grad_output as gradOutput, β = δ, on smooth L1's row",
      "at δ == +inf the gradient δ · g · d/δ is inf · 0");
};

struct L1Loss {
  static constexpr LossDecl decl{
      .forward = "l1_loss", .backward = "l1_loss_backward", .mean_count = MeanCount::Broadcast,
      .grad_dtype = GradDtype::Promoted, .aten_twin = AtenTwin::Forward, .aclnn_forward = "aclnnL1Loss",
      .aclnn_backward = "aclnnL1LossBackward"};
  static constexpr auto forward_paths = chips::on_every_chip(decl.aclnn_forward);
  static constexpr chips::PathRow backward_paths[] = {
      {.chips = chips::k910 | chips::k310P, .dtypes = chips::kNoBf16, .aclnn = decl.aclnn_backward,
       .why = "at a NaN input the TBE kernel gives -grad: the one difference left to the chip"},
      {.chips = chips::k910 | chips::k310P, .dtypes = chips::kBf16, .why = "aclnn lists bf16 from Ascend 910B on"},
      {.chips = chips::k910B | chips::k950, .aclnn = decl.aclnn_backward,
       .why = "as on 910 (the 950 kernel gives 0 at a NaN)"},
      {.chips = chips::k310B, .why = chips::kNoLossApis},
  };
};

struct KlDiv {
  static constexpr LossDecl decl{
      .forward = "kl_div", .backward = "kl_div_target_backward", .out_overload = "grad_target",
      .out_arg = "grad_target", .scalar = {ScalarKind::Bool, "log_target", "False", true, ScalarRule::Any},
      .grad_of = GradOf::Target, .mean_count = MeanCount::SelfTargetBroadcast, .grad_dtype = GradDtype::Target,
      .out_dtype = OutDtype::EqualsResult, .aten_twin = AtenTwin::Forward, .aclnn_forward = "aclnnKlDiv",
      .aclnn_backward = "aclnnKlDivTargetBackward"};
  // Only the Ascend 950 kernel gives 0 at target == 0 (the TBE formula gives NaN); no bf16 on 910/310P.
  static constexpr chips::PathRow forward_paths[] = {
      {.chips = chips::k910 | chips::k310P | chips::k910B, .log_targets = chips::kProbabilities,
       .why = "the TBE formula gives NaN at target == 0 (PyTorch and the 950 kernel give 0)"},
      {.chips = chips::k910 | chips::k310P, .dtypes = chips::kBf16, .log_targets = chips::kLogProbabilities,
       .why = "aclnn lists bf16 from Ascend 910B on"},
      {.chips = chips::k910 | chips::k310P, .dtypes = chips::kNoBf16, .log_targets = chips::kLogProbabilities,
       .aclnn = decl.aclnn_forward},
      {.chips = chips::k910B, .log_targets = chips::kLogProbabilities, .aclnn = decl.aclnn_forward},
      {.chips = chips::k950, .aclnn = decl.aclnn_forward},
      {.chips = chips::k310B, .why = chips::kNoLossApis},
  };
  // No dtype at all on 910/310P. Every chip's kernel gives NaN at target == 0; Ascend 950's divides "mean"
  // by numel(self) and sums half results in their own dtype.
  static constexpr chips::PathRow backward_paths[] = {
      {.chips = chips::k910 | chips::k310P,
       .why = "`aclnnKlDivTargetBackward` supports no dtype on Ascend 910/310P"},
      {.chips = chips::k910B, .log_targets = chips::kProbabilities, .aclnn = decl.aclnn_backward,
       .fixes = chips::kPrescaledMean | chips::kZeroWhereTargetZero,
       .why = "the kernel gives NaN where target == 0; \"mean\" is pre-scaled on every chip"},
      {.chips = chips::k910B, .log_targets = chips::kLogProbabilities, .aclnn = decl.aclnn_backward,
       .fixes = chips::kPrescaledMean},
      {.chips = chips::k950, .log_targets = chips::kProbabilities, .aclnn = decl.aclnn_backward,
       .fixes = chips::kPrescaledMean | chips::kZeroWhereTargetZero | chips::kFloat32Sum,
       .why = "the 950 kernel divides \"mean\" by numel(self), and sums half results over broadcast dims in their"
              " own dtype (rounding twice)"},
      {.chips = chips::k950, .log_targets = chips::kLogProbabilities, .aclnn = decl.aclnn_backward,
       .fixes = chips::kPrescaledMean | chips::kFloat32Sum,
       .why = "as with log_target=False, where target == 0 is no special point"},
      {.chips = chips::k310B, .why = chips::kNoLossApis},
  };
};

// MSE, from the CANN ops-nn documents loss/mse_loss/docs/aclnnMseLoss.md and
// loss/mse_loss_grad_v2/docs/aclnnMseLossBackward.md at version 1d9173072 (2026-08-05): aclnnMseLoss on Atlas
// A2/A3, Ascend 950, 310P and the Atlas training series (910; fp32/fp16 on these two), not on 310B;
// aclnnMseLossBackward on A2/A3, Ascend 950 (listed since version 530416542 of 2026-02-09; earlier versions
// and the op's README do not list it) and 310P (fp32/fp16), not on 910: the one API where 310P's rows differ
// from 910's.
struct MseLoss {
  static constexpr LossDecl decl{
      .forward = "mse_loss", .backward = "mse_loss_backward", .aclnn_forward = "aclnnMseLoss",
      .aclnn_backward = "aclnnMseLossBackward"};
  static constexpr auto forward_paths = chips::on_every_chip(decl.aclnn_forward);
  static constexpr chips::PathRow backward_paths[] = {
      {.chips = chips::k910, .why = "the Atlas training series (910) has no aclnnMseLossBackward kernel"},
      {.chips = chips::k310P, .dtypes = chips::kNoBf16, .aclnn = decl.aclnn_backward},
      {.chips = chips::k310P, .dtypes = chips::kBf16, .why = "aclnn lists bf16 from Ascend 910B on"},
      {.chips = chips::k910B | chips::k950, .aclnn = decl.aclnn_backward},
      {.chips = chips::k310B, .why = chips::kNoLossApis},
  };
};

// The generalized Jensen-Shannon divergence of TRL 1.16's GKDTrainer.generalized_jsd_loss, between a
// student's and a teacher's logits (docs/semantics.md, "Distillation"): beta 0 is KL(teacher || student),
// beta 1 KL(student || teacher), and in between beta KL(teacher || m) + (1 - beta) KL(student || m) with the
// mixture m. "mean" divides by the elements of the rows kept (the sum; 'batchmean' and num_items_in_batch are
// the Python function's divisions of the sum). The result has the promoted dtype, each gradient its logits'.
struct GeneralizedJsd {
  static constexpr LossDecl decl{
      .forward = "generalized_jsd_loss", .backward = "generalized_jsd_loss_backward", .out_overload = nullptr,
      .out_arg = nullptr, .aten_twin = AtenTwin::None,
      // Under torch.autocast the family runs in the logits' own dtype, accumulating in float32 inside: a
      // float32 copy of the logits would be one more N x V tensor.
      .autocast_float32 = false, .kind = LossKind::Rows,
      .rows = {.logits = {"student_logits", "teacher_logits"},
               .labels = "labels",
               .scalars = {{ScalarKind::Float, "beta", "0.5", false, ScalarRule::UnitInterval, ScalarRole::Beta},
                           {ScalarKind::Float, "temperature", "1.0", false, ScalarRule::Positive,
                            ScalarRole::Temperature},
                           {ScalarKind::Float, "student_logit_scale", "1.0", false, ScalarRule::Positive,
                            ScalarRole::StudentScale},
                           {ScalarKind::Float, "teacher_logit_scale", "1.0", false, ScalarRule::Positive,
                            ScalarRole::TeacherScale},
                           {ScalarKind::OptionalFloat, "student_softcap", "None", false, ScalarRule::Positive,
                            ScalarRole::StudentSoftcap},
                           {ScalarKind::OptionalFloat, "teacher_softcap", "None", false, ScalarRule::Positive,
                            ScalarRole::TeacherSoftcap}},
               .index = {ScalarKind::Int, "ignore_index", "-100"}},
      .with_grads = "_generalized_jsd_loss_and_grads",
      // Liger-Kernel's LigerFusedLinearJSDLoss, with TRL's weights as the defaults (Liger's own are 0.5 / 0.5).
      .linear = {.forward = "fused_linear_jsd_loss",
                 .with_grads = "_fused_linear_jsd_loss_and_grads",
                 .inputs = {"student_input", "teacher_input"},
                 .weights = {"student_weight", "teacher_weight"},
                 .biases = {"student_bias", "teacher_bias"},
                 .weights_of = {{ScalarKind::Float, "weight_hard_loss", "0.0", false, ScalarRule::NonNegative},
                                {ScalarKind::Float, "weight_soft_loss", "1.0", false, ScalarRule::NonNegative}}}};
  // The aclnn APIs of its NPU path (npu/generalized_jsd.cpp), on the chips where every CANN version the package
  // supports documents them, the newest included (docs/aclnn_reference.md, section 10, cites the document or
  // commit behind each claim): the chips of each, those with bf16, the beta classes whose calls use it and
  // whether only the gradients do. aclnnExp: ops-math's document has listed the Atlas training (910) and
  // inference (310P) series as unsupported since commit 9d65d0d11 (2026-01-22), while the CANN 8.0 to 8.3
  // references list them; the documents disagree, so it counts only where all of them list it (910B, 950), and
  // 910 runs the composite (whose exp is torch_npu's, through torch_npu's own path). 'none' with labels places
  // the kept rows' values and grad_output rows with torch_npu's index_select and index_put_, as the composite
  // does. The logit transform: a scale is folded into the aclnnMuls of the logits over T (and into the
  // gradients' weights); a softcap adds aclnnInplaceTanh (ops-math lists it on 910, 910B and 950 in every
  // version from v8.5.0 on, never on 310P or 310B) and, for a side's gradient, its slope tanh^2 - 1 (aclnnMul,
  // aclnnAdds) times the gradient's rows (aclnnInplaceMul).
  static constexpr chips::Set kListed = chips::k910 | chips::k310P | chips::k910B | chips::k950;
  static constexpr chips::Set kNot310P = chips::k910 | chips::k910B | chips::k950;
  static constexpr chips::Set kWithBf16 = chips::k910B | chips::k950;
  static constexpr chips::Set kTanh = chips::k910 | chips::k910B | chips::k950;
  static constexpr chips::AclnnUse aclnn_apis[] = {
      {"aclnnCast", kListed, kWithBf16},
      {"aclnnMuls", kListed, kWithBf16},
      {"aclnnInplaceMuls", kListed, kWithBf16},
      {"aclnnInplaceMul", kListed, kWithBf16},
      {"aclnnLogSoftmax", kListed, kWithBf16},
      {"aclnnExp", kWithBf16, kWithBf16},
      {"aclnnSub", kNot310P, kWithBf16},
      {"aclnnReduceSum", kListed, kWithBf16},
      {"aclnnDivs", kNot310P, kWithBf16},
      {"aclnnInplaceMaskedFillScalar", kListed, kWithBf16},
      {"aclnnAdds", kListed, kWithBf16, chips::kMixture},
      {"aclnnAdd", kNot310P, kWithBf16, chips::kMixture},
      {"aclnnLogAddExp", kListed, kWithBf16, chips::kMixture},
      {"aclnnLogSoftmaxBackward", kListed, kWithBf16, chips::kAll, true},
      {"aclnnKlDivTargetBackward", kWithBf16, kWithBf16, chips::kKlEnds, true},
      {"aclnnInplaceTanh", kTanh, kWithBf16, chips::kAll, false, chips::kSoftcapped},
      {"aclnnMul", kListed, kWithBf16, chips::kAll, true, chips::kSoftcapped},
      {"aclnnAdds", kListed, kWithBf16, chips::kAll, true, chips::kSoftcapped},  // the slope's - 1
  };
  static constexpr const char* kWhy910 =
      "ops-math's aclnnExp document lists no Atlas training series (910) since 9d65d0d11 (2026-01-22); every beta "
      "class calls it";
  static constexpr const char* kWhy310P =
      "ops-math does not list aclnnAdd, aclnnSub or aclnnDivs for Ascend 310P, nor aclnnExp since 9d65d0d11";
  static constexpr const char* kWhy310B = "Ascend 310B has none of the path's APIs (aclnnLogSoftmax, aclnnExp, ...)";
  static constexpr const char* kWhySoftcap = "the softcap's tanh, then the calls of the call's beta class";
  static constexpr chips::PathRow forward_paths[] = {
      {.chips = chips::k910B | chips::k950, .betas = chips::kKlEnds, .transforms = chips::kUnsoftcapped,
       .aclnn = "aclnnLogSoftmax"},
      {.chips = chips::k910B | chips::k950, .betas = chips::kMixture, .transforms = chips::kUnsoftcapped,
       .aclnn = "aclnnLogAddExp"},
      {.chips = chips::k910B | chips::k950, .transforms = chips::kSoftcapped, .aclnn = "aclnnInplaceTanh",
       .why = kWhySoftcap},
      {.chips = chips::k910, .why = kWhy910},
      {.chips = chips::k310P, .why = kWhy310P},
      {.chips = chips::k310B, .why = kWhy310B},
  };
  static constexpr chips::PathRow backward_paths[] = {
      {.chips = chips::k910B | chips::k950, .betas = chips::kKlEnds, .transforms = chips::kUnsoftcapped,
       .aclnn = "aclnnKlDivTargetBackward",
       .why = "the teacher's gradient at beta 0 (the student's at beta 1) is the seed kernel's"},
      {.chips = chips::k910B | chips::k950, .betas = chips::kMixture, .transforms = chips::kUnsoftcapped,
       .aclnn = "aclnnLogAddExp"},
      {.chips = chips::k910B | chips::k950, .transforms = chips::kSoftcapped, .aclnn = "aclnnInplaceTanh",
       .why = kWhySoftcap},
      {.chips = chips::k910, .why = kWhy910},
      {.chips = chips::k310P, .why = kWhy310P},
      {.chips = chips::k310B, .why = kWhy310B},
  };
};

// The generalized JSD over a sparse support: a served teacher's top-k log-probabilities and their token ids, as
// TRL 1.16's ServerDistillationTrainer computes it (docs/semantics.md, "Distillation from a served teacher"): the
// student's full log_softmax of its transformed logits over T gathered at the support, masked entries left out,
// the tail bucket log(1 - sum p) appended to both sides (or each side renormalized over the support), then the
// divergence per entry (beta 0 forward KL, 1 reverse KL, the mixture between). 'none' has K + 1 entries per row
// with the tail, K without, and "mean" divides by them. The student's gradient is dense (through the normalizer),
// the teacher's of its (..., K) shape; the ids and the mask get none.
struct SparseJsd {
  static constexpr LossDecl decl{
      .forward = "sparse_jsd_loss", .backward = "sparse_jsd_loss_backward", .out_overload = nullptr,
      .out_arg = nullptr, .aten_twin = AtenTwin::None, .autocast_float32 = false, .kind = LossKind::Rows,
      .rows = {.logits = {"student_logits", "teacher_logprobs"},
               .teacher = TeacherForm::Support,
               .inputs = {{InputKind::Ids, "teacher_token_ids"}, {InputKind::Mask, "support_mask", true}},
               .labels = "labels",
               .scalars = {{ScalarKind::Float, "beta", "0.0", false, ScalarRule::UnitInterval, ScalarRole::Beta},
                           {ScalarKind::Float, "temperature", "1.0", false, ScalarRule::Positive,
                            ScalarRole::Temperature},
                           {ScalarKind::Bool, "add_tail", "True", false, ScalarRule::Any, ScalarRole::SupportTail},
                           {ScalarKind::Float, "student_logit_scale", "1.0", false, ScalarRule::Positive,
                            ScalarRole::StudentScale},
                           {ScalarKind::OptionalFloat, "student_softcap", "None", false, ScalarRule::Positive,
                            ScalarRole::StudentSoftcap}},
               .index = {ScalarKind::Int, "ignore_index", "-100"}},
      .with_grads = "_sparse_jsd_loss_and_grads",
      // The same from hidden states: the student's logits made chunk by chunk, the served teacher as it is.
      .linear = {.forward = "fused_linear_sparse_jsd_loss",
                 .with_grads = "_fused_linear_sparse_jsd_loss_and_grads",
                 .inputs = {"student_input", "teacher_logprobs"},
                 .weights = {"student_weight", "teacher_token_ids"},
                 .biases = {"student_bias", "support_mask"},
                 .weights_of = {{ScalarKind::Float, "weight_hard_loss", "0.0", false, ScalarRule::NonNegative},
                                {ScalarKind::Float, "weight_soft_loss", "1.0", false, ScalarRule::NonNegative}}}};
  static_assert(std::string_view(decl.linear.inputs[1]) == decl.rows.logits[1] &&
                    std::string_view(decl.linear.weights[1]) == decl.rows.inputs[0].name &&
                    std::string_view(decl.linear.biases[1]) == decl.rows.inputs[1].name,
                "a support's linear form takes its teacher side's places with the row loss's names (LinearForm)");
  // TRL's tail bucket clamps the log of the support's mass at most to this, so that log(1 - mass) stays finite
  // (the CPU kernel's and the composite's).
  static constexpr double kTailLogMassMax = -1e-7;
  // The aclnn APIs of its NPU path (npu/sparse_jsd.cpp): the rows of V through aclnn (the log-softmax, the gather
  // at the support, the gradient's scatter and log-softmax backward), the (n, K) support with torch_npu's ops,
  // on the chips where every CANN version the package supports documents each API, the newest included
  // (docs/aclnn_reference.md, section 11, cites the documents): ops-nn's aclnnGather (index/gather_elements_v2,
  // v9.1.0) lists the Atlas A2 and A3 series alone, × on Ascend 950, 910, 310P and 310B since f47987103
  // (2026-02-05); its aclnnScatter (index/scatter_elements_v2) lists A2, A3 and 950. So the path runs on 910B and
  // 910_93 in every dtype, and the composite elsewhere. The logit transform as the generalized JSD's: a scale
  // folded into the aclnnMuls of the logits over T, a softcap's aclnnInplaceTanh and, for the student's gradient,
  // its slope (aclnnMul, aclnnAdds, aclnnInplaceMul).
  static constexpr chips::Set kPathChips = chips::k910B;
  static constexpr chips::AclnnUse aclnn_apis[] = {
      {"aclnnCast", kPathChips, kPathChips},
      {"aclnnMuls", kPathChips, kPathChips},
      {"aclnnInplaceMuls", kPathChips, kPathChips},
      {"aclnnLogSoftmax", kPathChips, kPathChips},
      {"aclnnGather", kPathChips, kPathChips},
      {"aclnnReduceSum", kPathChips, kPathChips},
      {"aclnnDivs", kPathChips, kPathChips},
      {"aclnnInplaceMaskedFillScalar", kPathChips, kPathChips},
      {"aclnnScatter", kPathChips, kPathChips, chips::kAll, true},
      {"aclnnLogSoftmaxBackward", kPathChips, kPathChips, chips::kAll, true},
      {"aclnnInplaceTanh", kPathChips, kPathChips, chips::kAll, false, chips::kSoftcapped},
      {"aclnnMul", kPathChips, kPathChips, chips::kAll, true, chips::kSoftcapped},
      {"aclnnAdds", kPathChips, kPathChips, chips::kAll, true, chips::kSoftcapped},
      {"aclnnInplaceMul", kPathChips, kPathChips, chips::kAll, true, chips::kSoftcapped},
  };
  static constexpr const char* kWhy950 =
      "ops-nn's aclnnGather document lists no Ascend 950 (× since f47987103, 2026-02-05; v9.1.0)";
  static constexpr const char* kWhyTbe =
      "ops-nn's aclnnGather and aclnnScatter documents list neither the Atlas training (910) nor the inference "
      "(310P) series (v9.1.0)";
  static constexpr const char* kWhySoftcap = "the softcap's tanh, then the path's calls";
  static constexpr chips::PathRow forward_paths[] = {
      {.chips = kPathChips, .transforms = chips::kUnsoftcapped, .aclnn = "aclnnGather"},
      {.chips = kPathChips, .transforms = chips::kSoftcapped, .aclnn = "aclnnInplaceTanh", .why = kWhySoftcap},
      {.chips = chips::k950, .why = kWhy950},
      {.chips = chips::k910 | chips::k310P, .why = kWhyTbe},
      {.chips = chips::k310B, .why = chips::kNoLossApis},
  };
  static constexpr chips::PathRow backward_paths[] = {
      {.chips = kPathChips, .transforms = chips::kUnsoftcapped, .aclnn = "aclnnScatter",
       .why = "the support's G placed at the ids, then the log-softmax backward"},
      {.chips = kPathChips, .transforms = chips::kSoftcapped, .aclnn = "aclnnInplaceTanh", .why = kWhySoftcap},
      {.chips = chips::k950, .why = kWhy950},
      {.chips = chips::k910 | chips::k310P, .why = kWhyTbe},
      {.chips = chips::k310B, .why = chips::kNoLossApis},
  };
};

// Every loss, in the order of the package's tables: X(Loss) for each, for the few places that must name each
// type (explicit instantiations), and as a tuple for everything else.
#define NPU_LOSS_FOR_EACH_ELEMENTWISE_LOSS(X) X(SmoothL1Loss) X(HuberLoss) X(L1Loss) X(KlDiv) X(MseLoss)
#define NPU_LOSS_FOR_EACH_ROW_LOSS(X) X(GeneralizedJsd) X(SparseJsd)
#define NPU_LOSS_FOR_EACH_LOSS(X) NPU_LOSS_FOR_EACH_ELEMENTWISE_LOSS(X) NPU_LOSS_FOR_EACH_ROW_LOSS(X)

namespace detail {
template <typename First, typename... Rest>
using TupleOfRest = std::tuple<Rest...>;
}  // namespace detail

#define NPU_LOSS_COMMA_AND_TYPE(Loss) , Loss
using AllLosses = detail::TupleOfRest<void NPU_LOSS_FOR_EACH_LOSS(NPU_LOSS_COMMA_AND_TYPE)>;
#undef NPU_LOSS_COMMA_AND_TYPE

// ---- what the layers derive from a block ----

// f.template operator()<Loss>() for every loss, in order.
template <typename F>
constexpr void for_each_loss(F&& f) {
  [&]<size_t... I>(std::index_sequence<I...>) {
    (f.template operator()<std::tuple_element_t<I, AllLosses>>(), ...);
  }(std::make_index_sequence<std::tuple_size_v<AllLosses>>{});
}

// The same for every loss of one kind.
template <LossKind Kind, typename F>
constexpr void for_each_loss_of(F&& f) {
  for_each_loss([&]<typename Loss>() {
    if constexpr (Loss::decl.kind == Kind) f.template operator()<Loss>();
  });
}

template <typename F>
constexpr void for_each_elementwise_loss(F&& f) {
  for_each_loss_of<LossKind::Elementwise>(f);
}

template <typename F>
constexpr void for_each_row_loss(F&& f) {
  for_each_loss_of<LossKind::Rows>(f);
}

// A loss's position in AllLosses (the CPU kernels' tables are indexed by it).
template <typename Loss>
constexpr int loss_index() {
  int index = -1, i = 0;
  for_each_loss([&]<typename L>() {
    if (std::is_same_v<L, Loss>) index = i;
    ++i;
  });
  return index;
}

// How many row losses the list holds, and a row loss's position among them (the row kernels' tables are indexed
// by it).
constexpr int count_row_losses() {
  int n = 0;
  for_each_row_loss([&]<typename>() { ++n; });
  return n;
}
inline constexpr int kRowLosses = count_row_losses();

template <typename Loss>
constexpr int row_index() {
  static_assert(Loss::decl.kind == LossKind::Rows, "row_index: not a row loss");
  int index = -1, i = 0;
  for_each_row_loss([&]<typename L>() {
    if (std::is_same_v<L, Loss>) index = i;
    ++i;
  });
  return index;
}

namespace detail {
template <ScalarKind K>
struct ScalarTypes;
template <>
struct ScalarTypes<ScalarKind::None> {
  using type = std::tuple<>;
};
template <>
struct ScalarTypes<ScalarKind::Float> {
  using type = std::tuple<double>;
};
template <>
struct ScalarTypes<ScalarKind::Bool> {
  using type = std::tuple<bool>;
};
}  // namespace detail

// The C++ types of a loss's scalar arguments, as a tuple: std::tuple<>, std::tuple<double> or std::tuple<bool>.
template <typename Loss>
using ScalarsOf = typename detail::ScalarTypes<Loss::decl.scalar.kind>::type;

namespace detail {
template <template <typename, typename...> class Of, typename Loss, typename Scalars>
struct BindScalars;
template <template <typename, typename...> class Of, typename Loss, typename... S>
struct BindScalars<Of, Loss, std::tuple<S...>> {
  using type = Of<Loss, S...>;
};
}  // namespace detail

// Of<Loss, S...> with S... the C++ types of the loss's scalar arguments (ScalarsOf): a struct written once for
// any list of scalars, taken for one loss.
template <template <typename, typename...> class Of, typename Loss>
using WithScalars = typename detail::BindScalars<Of, Loss, ScalarsOf<Loss>>::type;

}  // namespace npu_loss
