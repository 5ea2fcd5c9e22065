// The chip families, the beta classes, the compile-time checks of every loss's path rows (losses.h) and
// the table docs/npu_paths.md writes out (see paths.h). The facts behind each row are in
// docs/aclnn_reference.md.
#include "paths.h"

#include <cctype>
#include <cmath>
#include <initializer_list>
#include <string_view>
#include <limits>
#include <utility>

#include "../losses.h"

namespace npu_loss::chips {
namespace {

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// The model number after "Ascend" ("Ascend950DT_9571" -> 950), or -1.
int model_number(std::string_view name) {
  constexpr std::string_view kPrefix = "Ascend";
  if (!starts_with(name, kPrefix)) return -1;
  int number = -1;
  for (size_t i = kPrefix.size(); i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i) {
    number = (number < 0 ? 0 : number * 10) + (name[i] - '0');
  }
  return number;
}

// Names, indexed by the enums' values.
constexpr const char* kChipKeys[] = {"910", "310P", "910B", "950", "310B"};
constexpr const char* kChipNames[] = {
    "Ascend910 (Atlas training series, TBE kernels, no bf16)",
    "Ascend310P (Atlas inference series, TBE kernels, no bf16)",
    "Ascend910B/Ascend910_93 (Atlas A2/A3, TBE kernels)",
    "Ascend950 (regbase kernels)",
    "composite fallback only (Ascend310B or an unknown chip)",
};
constexpr const char* kDtypeClassNames[] = {"fp32/fp16", "bf16"};
constexpr const char* kBetaClassNames[] = {"-", "0", "tiny", "small", "normal", "inf", "(0, 1)", "1"};
constexpr const char* kTransformClassNames[] = {"none", "scale", "softcap"};

template <typename E, size_t N>
constexpr const char* name_of(const char* const (&names)[N], E value) {
  return names[static_cast<size_t>(value)];
}

}  // namespace

Chip chip_from_soc_name(const std::string& soc_name) {
  const std::string_view name = soc_name;
  // torch_npu's names: Ascend910B1..B4, 910B2C, 910B4-1 (Atlas A2); Ascend910_93xx (Atlas A3). The bare
  // "Ascend910B" is an Atlas A1 part (SocVersion::Ascend910B sits among the 910 A1 versions).
  if (starts_with(name, "Ascend910B") && name.size() > std::string_view("Ascend910B").size()) return Chip::Tbe910B;
  if (starts_with(name, "Ascend910_9")) return Chip::Tbe910B;
  if (starts_with(name, "Ascend310B")) return Chip::CompositeOnly;  // Atlas 200I/500 A2: none of the aclnn loss APIs
  if (starts_with(name, "Ascend310P")) return Chip::Tbe310P;
  if (starts_with(name, "Ascend910")) return Chip::Tbe910;
  // Every SoC at or above Ascend950 runs the regbase kernels, as op-plugin decides by SocVersion >= 950.
  if (model_number(name) >= 950) return Chip::Regbase950;
  return Chip::CompositeOnly;
}

const char* chip_family_name(Chip chip) {
  return name_of(kChipNames, chip);
}

namespace {

// The TBE kernels (Ascend 910, 910B, 910_93, 310P) divide by beta + 1e-6: a relative bias of 1e-6 / beta,
// acceptable only while it stays inside the result dtype's tolerance (about one unit in the last place of a
// typical gradient), by Dtype: float32, float16, bfloat16.
constexpr double kTbeBetaBias = 1e-6;
constexpr double kTbeTolerance[] = {1e-5, 1e-3, 1.6e-2};
// The Ascend 950 kernel sets 1 / beta to NaN below this beta.
constexpr double kRegbaseMinBeta = 1e-6;

}  // namespace

BetaClass beta_class(double beta, Dtype result) {
  // The kernels take beta as a float: a double beyond float's range reaches them as +inf.
  if (beta == 0) return BetaClass::Zero;
  if (std::isinf(static_cast<float>(beta))) return BetaClass::Inf;
  if (beta < kRegbaseMinBeta) return BetaClass::Tiny;
  const double tolerance = kTbeTolerance[static_cast<size_t>(result)];
  return kTbeBetaBias / beta <= tolerance ? BetaClass::Normal : BetaClass::Small;
}

const char* beta_class_name(BetaClass beta) {
  return name_of(kBetaClassNames, beta);
}

const char* transform_class_name(TransformClass transform) {
  return name_of(kTransformClassNames, transform);
}

namespace {

constexpr Chip kChips[] = {Chip::Tbe910, Chip::Tbe310P, Chip::Tbe910B, Chip::Regbase950, Chip::CompositeOnly};
constexpr DtypeClass kDtypeClasses[] = {DtypeClass::NoBFloat16, DtypeClass::BFloat16};
constexpr BetaClass kBetas[] = {BetaClass::Zero,    BetaClass::Tiny,    BetaClass::Small, BetaClass::Normal,
                                BetaClass::Inf,     BetaClass::Mixture, BetaClass::One};
constexpr bool kBooleans[] = {false, true};
constexpr TransformClass kTransforms[] = {TransformClass::None, TransformClass::Scale, TransformClass::Softcap};

// The beta classes a loss can be called with (from its scalar's rule: Huber's delta > 0 is never 0), and
// whether log_target tells its calls apart.
template <typename Loss>
constexpr Set beta_domain() {
  if constexpr (Loss::decl.kind == LossKind::Rows) return kUnitBetas;  // the row loss's ScalarRole::Beta, in [0, 1]
  constexpr ScalarArg s = Loss::decl.scalar;
  if (s.kind != ScalarKind::Float) return 0;
  return s.rule == ScalarRule::Positive ? static_cast<Set>(kEveryBeta & ~set_of({BetaClass::Zero})) : kEveryBeta;
}

template <typename Loss>
constexpr bool takes_log_target() {
  return Loss::decl.scalar.kind == ScalarKind::Bool;
}

// Whether a row loss transforms its logits (declares a scale or a softcap of a side), so that its calls tell the
// transform classes apart.
template <typename Loss>
constexpr bool takes_transform() {
  if constexpr (Loss::decl.kind == LossKind::Rows) {
    for (ScalarRole role : {ScalarRole::StudentScale, ScalarRole::TeacherScale, ScalarRole::StudentSoftcap,
                            ScalarRole::TeacherSoftcap}) {
      if (row_scalar_of(Loss::decl.rows, role) >= 0) return true;
    }
  }
  return false;
}

// visit(chip, dtypes, beta, log_target, transform) for every class of call of a loss's ops on every chip.
template <typename Loss, typename Visit>
constexpr void for_each_call(const Visit& visit) {
  constexpr Set betas = beta_domain<Loss>();
  for (Chip chip : kChips) {
    for (DtypeClass dtypes : kDtypeClasses) {
      for (BetaClass beta : kBetas) {
        if (betas != 0 && !contains(betas, beta)) continue;
        if (betas == 0 && beta != kBetas[0]) continue;
        for (bool log_target : kBooleans) {
          if (!takes_log_target<Loss>() && log_target) continue;
          for (TransformClass transform : kTransforms) {
            if (takes_transform<Loss>() || transform == TransformClass::None) {
              visit(chip, dtypes, betas != 0 ? beta : BetaClass::None, log_target, transform);
            }
          }
        }
      }
    }
  }
}

// Every call matches exactly one row; every row serves some call, leaves the arguments its loss does not
// take open, and applies no fix to a composite call.
template <typename Loss, bool Backward>
constexpr bool rows_are_a_partition() {
  constexpr auto rows = rows_of<Loss, Backward>();
  bool ok = true;
  for_each_call<Loss>([&](Chip chip, DtypeClass dtypes, BetaClass beta, bool log_target, TransformClass transform) {
    int n = 0;
    for (const PathRow& row : rows) n += matches(row, chip, dtypes, beta, log_target, transform);
    ok = ok && n == 1;
  });
  for (const PathRow& row : rows) {
    bool reached = false;
    for_each_call<Loss>([&](Chip chip, DtypeClass dtypes, BetaClass beta, bool log_target, TransformClass transform) {
      reached = reached || matches(row, chip, dtypes, beta, log_target, transform);
    });
    ok = ok && reached && (beta_domain<Loss>() != 0 || row.betas == kAll) &&
        (takes_log_target<Loss>() || row.log_targets == kAll) && (takes_transform<Loss>() || row.transforms == kAll) &&
        (row.aclnn != nullptr || row.fixes == 0);
  }
  return ok;
}

constexpr bool every_loss_is_partitioned() {
  bool ok = true;
  for_each_loss([&]<typename Loss>() {
    ok = ok && rows_are_a_partition<Loss, false>() && rows_are_a_partition<Loss, true>();
  });
  return ok;
}

// An aclnn row of a loss with declared APIs (AclnnUse) serves only chips, dtypes, betas and transforms where every
// API its calls use is listed.
template <typename Loss, bool Backward>
constexpr bool rows_use_listed_apis() {
  if constexpr (requires { Loss::aclnn_apis; }) {
    bool ok = true;
    for (const PathRow& row : rows_of<Loss, Backward>()) {
      if (row.aclnn == nullptr) continue;
      for (const AclnnUse& use : Loss::aclnn_apis) {
        if ((use.gradients && !Backward) || (use.betas & row.betas) == 0 || (use.transforms & row.transforms) == 0) {
          continue;
        }
        ok = ok && (row.chips & ~use.chips) == 0;
        if (contains(row.dtypes, DtypeClass::BFloat16)) ok = ok && (row.chips & ~use.bf16_chips) == 0;
      }
    }
    return ok;
  } else {
    return true;
  }
}

constexpr bool every_row_uses_listed_apis() {
  bool ok = true;
  for_each_loss([&]<typename Loss>() {
    ok = ok && rows_use_listed_apis<Loss, false>() && rows_use_listed_apis<Loss, true>();
  });
  return ok;
}

static_assert(every_row_uses_listed_apis(),
              "an aclnn path row serves a chip or dtype where an API of its calls is not listed (losses.h, aclnn_apis)");

static_assert(every_loss_is_partitioned(),
              "each call must match exactly one path row; no row may serve no call, constrain an argument its "
              "loss does not take, or fix a composite call");

// A cell: "-" when the op does not take the argument, "any" for every value, else the values in `domain`
// the row accepts, joined by ", " (only those in `values`, the ones the op can be called with).
template <typename E, size_t N, typename Name>
std::string cell(bool applies, Set set, const E (&domain)[N], const Name& name, Set values = kAll) {
  if (!applies) return "-";
  std::string text;
  bool all = true;
  for (E value : domain) {
    if (!contains(values, value)) continue;
    if (!contains(set, value)) {
      all = false;
      continue;
    }
    text += (text.empty() ? "" : ", ") + std::string(name(value));
  }
  return all ? "any" : text;
}

std::string fixes_cell(uint8_t fixes) {
  std::string text;
  for (auto [fix, name] : {std::pair{kPrescaledMean, "prescaled mean"},
                           std::pair{kZeroWhereTargetZero, "zero where target == 0"},
                           std::pair{kFloat32Sum, "fp32 sum"},
                           std::pair{kFloat32Scaled, "fp32 for half dtypes"}}) {
    if (fixes & fix) text += (text.empty() ? "" : ", ") + std::string(name);
  }
  return text.empty() ? "-" : text;
}

template <typename Loss, bool Backward>
void append_rows(std::vector<PathTableRow>& table, bool untransformed_calls = false) {
  constexpr Set betas = beta_domain<Loss>();
  for (const PathRow& row : rows_of<Loss, Backward>()) {
    if (untransformed_calls && !contains(row.transforms, TransformClass::None)) continue;
    table.push_back(PathTableRow{
        Backward ? Loss::decl.backward : Loss::decl.forward,
        cell(true, row.chips, kChips, [](Chip c) { return name_of(kChipKeys, c); }),
        cell(true, row.dtypes, kDtypeClasses, [](DtypeClass d) { return name_of(kDtypeClassNames, d); }),
        cell(betas != 0, row.betas, kBetas, beta_class_name, betas),
        cell(takes_log_target<Loss>(), row.log_targets, kBooleans, [](bool lt) { return lt ? "true" : "false"; }),
        untransformed_calls ? "any" : cell(takes_transform<Loss>(), row.transforms, kTransforms, transform_class_name),
        row.aclnn ? row.aclnn : "composite",
        fixes_cell(row.fixes),
        row.why,
    });
  }
}

}  // namespace

// A row loss's linear form runs, chunk by chunk, torch_npu's matmuls and then its forward with gradients,
// whose path is the forward's rows when no gradient is wanted (an evaluation, or torch.no_grad) and the
// backward's when one is (training): both sets, each under the linear form's name with its step written out.
// The chunk's logits are transformed before the step (they are the hard loss's and the entropy's input too), by
// torch_npu's ops, so whatever the call's transform the step's row is that of an untransformed call.
template <typename Loss>
void append_linear_rows(std::vector<PathTableRow>& table) {
  if constexpr (Loss::decl.kind == LossKind::Rows) {
    if (Loss::decl.linear.forward == nullptr) return;
    const auto relabel = [&](size_t first, const char* step, const char* rows_of_op) {
      for (size_t i = first; i < table.size(); ++i) {
        PathTableRow& row = table[i];
        row.op = Loss::decl.linear.forward;
        row.why = std::string(step) + ": each chunk's logits by torch_npu's matmul" +
            (takes_transform<Loss>() ? " (and their transform by torch_npu's ops)" : "") + ", then `" + rows_of_op +
            "`'s row" + (row.why.empty() ? "" : "; " + row.why);
      }
    };
    const size_t without = table.size();
    append_rows<Loss, false>(table, true);
    relabel(without, "without gradients", Loss::decl.forward);
    const size_t with = table.size();
    append_rows<Loss, true>(table, true);
    relabel(with, "with gradients", Loss::decl.backward);
  }
}

std::vector<PathTableRow> path_table() {
  std::vector<PathTableRow> table;
  for_each_loss([&]<typename Loss>() {
    append_rows<Loss, false>(table);
    append_rows<Loss, true>(table);
    append_linear_rows<Loss>(table);
  });
  return table;
}

}  // namespace npu_loss::chips
