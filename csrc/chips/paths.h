// What serves each call on each Ascend chip family: an aclnn API (with the fixes the kernels apply around
// it) or the composite fallback. The rows are part of each loss's declaration (losses.h, forward_paths and
// backward_paths); this header is their vocabulary and the lookup. docs/npu_paths.md writes the rows out
// with the reason for each, and tests/test_npu_paths.py compares them with path_table().
//
// Plain C++ (no torch or torch_npu types): compiled into the static library (setup.py's STATIC_SOURCES), so
// that _C exposes the table on any machine and _C_npu takes its paths from it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

namespace npu_loss::chips {

// Families of Ascend chips, by what their aclnn loss kernels can do.
enum class Chip : uint8_t {
  Tbe910,         // Ascend 910 (Atlas A1, the training series): TBE kernels, fp32/fp16 only, no KL target gradient
  Tbe310P,        // Ascend 310P (the Atlas inference series): as 910, but with aclnnMseLossBackward
  Tbe910B,        // Ascend 910B / 910_93 (Atlas A2/A3): TBE kernels with bf16 and the KL target gradient
  Regbase950,     // Ascend 950 and every newer chip (op-plugin treats SocVersion >= Ascend950 alike)
  CompositeOnly,  // Ascend 310B (none of the aclnn loss APIs) and chips this package does not know
};

// The family of a SoC name as aclrtGetSocName() reports it ("Ascend910B1", "Ascend950DT_9571", ...).
Chip chip_from_soc_name(const std::string& soc_name);

// A readable name of a family, for build_info().
const char* chip_family_name(Chip chip);

// The dtypes of a call, as the chips tell them apart: whether any operand or the result is bfloat16.
enum class DtypeClass : uint8_t { NoBFloat16, BFloat16 };

// A floating dtype the NPU accepts (float64 never reaches the paths: the checks reject it there).
enum class Dtype : uint8_t { Float32, Float16, BFloat16 };

// A loss's float scalar (smooth L1's beta, Huber's delta), as the chips tell it apart. None: the loss has
// no float scalar.
enum class BetaClass : uint8_t {
  None,
  Zero,    // 0: the L1 gradient
  Tiny,    // 0 < beta < 1e-6: the Ascend 950 kernel sets 1 / beta to NaN
  Small,   // 1e-6 <= beta, where the TBE kernels' beta + 1e-6 divisor biases the result beyond its dtype's
           // tolerance
  Normal,  // every other finite beta
  Inf,     // +inf: the Ascend 950 kernel's d * (1 / beta) is NaN at d = +-inf
  // A row loss's beta in [0, 1] (the generalized JSD's: Zero, Mixture or One).
  Mixture,  // 0 < beta < 1: the mixture of the two distributions
  One,      // 1: KL(student || teacher)
};

// The class of a float scalar for a result of dtype `result` (the TBE bias is judged by the result's
// tolerance), as the kernels receive it: a float, so a double beyond float's range is +inf.
BetaClass beta_class(double beta, Dtype result);

// The class of a row loss's beta in [0, 1] (the checks reject any other): Zero, Mixture or One.
constexpr BetaClass unit_beta_class(double beta) {
  return beta == 0 ? BetaClass::Zero : beta == 1 ? BetaClass::One : BetaClass::Mixture;
}

// The table's name of a beta class: "0", "tiny", "small", "normal", "inf", "(0, 1)", "1" ("-" for None).
const char* beta_class_name(BetaClass beta);

// What a row loss's call does to its logits before the temperature (losses.h's ScalarRole::StudentScale ...
// TeacherSoftcap), as the chips tell it apart: the softcap's tanh is an API of its own; a scale is folded into
// the scaling every path already makes.
enum class TransformClass : uint8_t {
  None,     // neither side's logits are transformed
  Scale,    // a side's logits are scaled, neither is softcapped
  Softcap,  // a side's logits are softcapped (and maybe scaled)
};

// The table's name of a transform class: "none", "scale", "softcap".
const char* transform_class_name(TransformClass transform);

// What the kernels do around an aclnn call, as bits of a row's fixes.
enum class Fix : uint8_t {
  // "mean" is passed as "sum" with grad_output pre-scaled in float32 by 1 / the op's "mean" count (where
  // the kernel's own divisor differs from the op's).
  PrescaledMean = 1,
  // The NaN the kernel gives where target == 0 is set to 0 (a zero probability gets a zero gradient).
  ZeroWhereTargetZero = 2,
  // float16/bfloat16 results summed over broadcast dims are computed and summed in float32, rounded once.
  Float32Sum = 4,
  // A result the loss scales by its scalar (Huber through smooth L1's kernels) is computed in float32 in
  // float16/bfloat16, where the scaling could leave the dtype's range (npu/smooth_l1_loss.cpp says where).
  Float32Scaled = 8,
};

// ---- the rows' vocabulary: a column is a set of values, one bit each ----

using Set = uint8_t;
inline constexpr Set kAll = 0xFF;

template <typename E>
constexpr Set set_of(std::initializer_list<E> values) {
  Set s = 0;
  for (E v : values) s |= static_cast<Set>(1u << static_cast<unsigned>(v));
  return s;
}

template <typename E>
constexpr bool contains(Set s, E value) {
  return (s >> static_cast<unsigned>(value)) & 1u;
}

inline constexpr Set k910 = set_of({Chip::Tbe910});
inline constexpr Set k310P = set_of({Chip::Tbe310P});
inline constexpr Set k910B = set_of({Chip::Tbe910B});
inline constexpr Set k950 = set_of({Chip::Regbase950});
inline constexpr Set k310B = set_of({Chip::CompositeOnly});
// Why every 310B row is a composite one.
inline constexpr const char* kNoLossApis = "Ascend 310B has none of the aclnn loss APIs";
inline constexpr Set kNoBf16 = set_of({DtypeClass::NoBFloat16});
inline constexpr Set kBf16 = set_of({DtypeClass::BFloat16});
inline constexpr Set kEveryBeta =
    set_of({BetaClass::Zero, BetaClass::Tiny, BetaClass::Small, BetaClass::Normal, BetaClass::Inf});
// The betas at which the TBE kernels' beta + 1e-6 divisor biases the result beyond its dtype's tolerance.
inline constexpr Set kTbeBiased = set_of({BetaClass::Tiny, BetaClass::Small});
inline constexpr Set kTbeExact = set_of({BetaClass::Zero, BetaClass::Normal, BetaClass::Inf});
inline constexpr Set kFinite = set_of({BetaClass::Zero, BetaClass::Tiny, BetaClass::Small, BetaClass::Normal});
// A row loss's beta classes: the two KL divergences at its ends, the mixture between them.
inline constexpr Set kUnitBetas = set_of({BetaClass::Zero, BetaClass::Mixture, BetaClass::One});
inline constexpr Set kKlEnds = set_of({BetaClass::Zero, BetaClass::One});
inline constexpr Set kMixture = set_of({BetaClass::Mixture});
inline constexpr Set kUnsoftcapped = set_of({TransformClass::None, TransformClass::Scale});
inline constexpr Set kSoftcapped = set_of({TransformClass::Softcap});
inline constexpr Set kProbabilities = set_of({false});  // log_target=False
inline constexpr Set kLogProbabilities = set_of({true});
inline constexpr uint8_t kPrescaledMean = static_cast<uint8_t>(Fix::PrescaledMean);
inline constexpr uint8_t kZeroWhereTargetZero = static_cast<uint8_t>(Fix::ZeroWhereTargetZero);
inline constexpr uint8_t kFloat32Sum = static_cast<uint8_t>(Fix::Float32Sum);
inline constexpr uint8_t kFloat32Scaled = static_cast<uint8_t>(Fix::Float32Scaled);

// One row of an op's paths: the calls it serves (chips, dtype classes, beta classes, log_target values, a row
// loss's transform classes: kAll for every value) and what serves them.
struct PathRow {
  Set chips;
  Set dtypes = kAll;
  Set betas = kAll;
  Set log_targets = kAll;
  Set transforms = kAll;
  const char* aclnn = nullptr;  // the aclnn API that serves the call (possibly another loss's); none: the composite
  uint8_t fixes = 0;
  const char* why = "";  // the reason, for docs/npu_paths.md (docs/aclnn_reference.md has the facts)
};

// The rows of an op whose aclnn API every chip family with aclnn loss kernels has: in fp32/fp16 on 910 and
// 310P (bf16 from Ascend 910B on), in every dtype on 910B and 950; 310B has none.
constexpr std::array<PathRow, 4> on_every_chip(const char* api) {
  return {{
      {.chips = k910 | k310P, .dtypes = kNoBf16, .aclnn = api},
      {.chips = k910 | k310P, .dtypes = kBf16, .why = "aclnn lists bf16 from Ascend 910B on"},
      {.chips = k910B | k950, .aclnn = api},
      {.chips = k310B, .why = kNoLossApis},
  }};
}

// The rows of a loss that runs another loss's kernels with its own scalar as their beta and scales the
// result by that scalar (Huber: delta * smooth L1 with beta = delta), from the other loss's rows: each
// aclnn row keeps its finite scalars (those in `domain`) and gets Fix::Float32Scaled; where it served
// +inf, a composite row takes over (the scaled result is inf * 0 there); composite rows stay as they are.
inline constexpr Set kInf = set_of({BetaClass::Inf});

template <typename Rows>
constexpr size_t scaled_count(const Rows& base, Set domain) {
  size_t n = 0;
  for (const PathRow& row : base) {
    if (row.aclnn == nullptr) {
      ++n;
      continue;
    }
    n += (row.betas & domain & ~kInf) != 0;
    n += contains(row.betas & domain, BetaClass::Inf);
  }
  return n;
}

template <const auto& base, Set domain>
constexpr auto scaled_paths(const char* why_scaled, const char* why_inf) {
  std::array<PathRow, scaled_count(base, domain)> rows{};
  size_t n = 0;
  for (const PathRow& row : base) {
    if (row.aclnn == nullptr) {
      rows[n++] = row;
      continue;
    }
    if ((row.betas & domain & ~kInf) != 0) {
      PathRow finite = row;
      finite.betas = static_cast<Set>(row.betas & domain & ~kInf);
      finite.fixes = static_cast<uint8_t>(row.fixes | static_cast<uint8_t>(Fix::Float32Scaled));
      finite.why = why_scaled;
      rows[n++] = finite;
    }
    if (contains(row.betas & domain, BetaClass::Inf)) {
      PathRow inf = row;
      inf.betas = kInf;
      inf.aclnn = nullptr;
      inf.fixes = 0;
      inf.why = why_inf;
      rows[n++] = inf;
    }
  }
  return rows;
}

// An aclnn API a row loss's path calls, with the chip families whose CANN documents list it (`chips`), and
// those that list it in bfloat16 too (`bf16_chips`); `betas` and `transforms`: the beta and transform classes
// whose calls use it; `gradients`: used only by the ops that make gradients. An API with two uses (two sets of
// calls) has two entries. Checked against the loss's rows (paths.cpp): an aclnn row may serve a chip, dtype
// class, beta class and transform class only where every API its calls use is listed.
struct AclnnUse {
  const char* api;
  Set chips;
  Set bf16_chips;
  Set betas = kAll;
  bool gradients = false;
  Set transforms = kAll;
};

// What serves one call: its row's API and fixes, and the row's index among its op's rows.
struct Path {
  const char* aclnn;
  uint8_t fixes;
  size_t row;
  bool has(Fix fix) const {
    return (fixes & static_cast<uint8_t>(fix)) != 0;
  }
};

// The rows of a loss's forward (Backward false) or backward op.
template <typename Loss, bool Backward>
constexpr std::span<const PathRow> rows_of() {
  if constexpr (Backward) {
    return Loss::backward_paths;
  } else {
    return Loss::forward_paths;
  }
}

constexpr bool matches(const PathRow& row, Chip chip, DtypeClass dtypes, BetaClass beta, bool log_target,
                       TransformClass transform = TransformClass::None) {
  return contains(row.chips, chip) && contains(row.dtypes, dtypes) && contains(row.betas, beta) &&
      contains(row.log_targets, log_target) && contains(row.transforms, transform);
}

// Whether an API a loss declares (AclnnUse) serves a call of this beta and transform class on the op that makes
// gradients (Backward) or the forward.
constexpr bool used_by(const AclnnUse& use, bool backward, BetaClass beta, TransformClass transform) {
  return (backward || !use.gradients) && contains(use.betas, beta) && contains(use.transforms, transform);
}

// The path of one call of a loss's op. `beta` is BetaClass::None for a loss without a float scalar;
// `log_target` false for one without it; `transform` None for a loss without a logit transform. Exactly one
// row matches each call (checked at compile time in paths.cpp). Whether the installed CANN has the API is the
// caller's question (an older one may lack it, and then the call runs the composite).
template <typename Loss, bool Backward>
constexpr Path path(Chip chip, DtypeClass dtypes, BetaClass beta, bool log_target,
                    TransformClass transform = TransformClass::None) {
  const auto rows = rows_of<Loss, Backward>();
  for (size_t i = 0; i < rows.size(); ++i) {
    if (matches(rows[i], chip, dtypes, beta, log_target, transform)) return {rows[i].aclnn, rows[i].fixes, i};
  }
  return {nullptr, 0, rows.size()};  // unreachable for the calls the rows cover (paths.cpp)
}

// One row of the table, each cell as docs/npu_paths.md writes it: "any" for every value of a column, "-"
// for an argument the op does not take, else the values joined by ", ".
struct PathTableRow {
  std::string op, chip, dtypes, beta, log_target, transform, api, fixes, why;
};

// Every row of every loss's ops, in the declarations' order.
std::vector<PathTableRow> path_table();

}  // namespace npu_loss::chips
