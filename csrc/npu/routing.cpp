// The NPU routing table (see routing.h). The facts behind each row are in docs/aclnn_reference.md; the
// rows themselves, with the reason for each, are written out in docs/npu_routing.md.
#include "routing.h"

#include <cctype>
#include <cmath>
#include <initializer_list>
#include <string_view>
#include <utility>

namespace npu_loss::npu {
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
constexpr const char* kChipKeys[] = {"910", "910B", "950", "310B"};
constexpr const char* kChipNames[] = {
    "Ascend910/Ascend310P (TBE kernels, no bf16)",
    "Ascend910B/Ascend910_93 (Atlas A2/A3, TBE kernels)",
    "Ascend950 (regbase kernels)",
    "composite fallback only (Ascend310B or an unknown chip)",
};
constexpr const char* kDtypeClassNames[] = {"fp32/fp16", "bf16"};
constexpr const char* kBetaClassNames[] = {"-", "0", "tiny", "small", "normal", "inf"};

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
  if (starts_with(name, "Ascend310B")) return Chip::CompositeOnly;  // Atlas 200I/500 A2: none of the six APIs
  if (starts_with(name, "Ascend310P") || starts_with(name, "Ascend910")) return Chip::Tbe910;
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
  if (beta == 0) return BetaClass::Zero;
  if (std::isinf(beta)) return BetaClass::Inf;
  if (beta < kRegbaseMinBeta) return BetaClass::Tiny;
  const double tolerance = kTbeTolerance[static_cast<size_t>(result)];
  return kTbeBetaBias / beta <= tolerance ? BetaClass::Normal : BetaClass::Small;
}

BetaClass delta_class(double delta, Dtype result) {
  // The kernels take delta as a float: a double delta above float's range reaches them as +inf.
  return beta_class(std::isinf(static_cast<float>(delta)) ? INFINITY : delta, result);
}

const char* beta_class_name(BetaClass beta) {
  return name_of(kBetaClassNames, beta);
}

namespace {

// A column of a row is a set of values, one bit each; kAll is every value.
using Set = uint8_t;
constexpr Set kAll = 0xFF;

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

constexpr Set kNoBetas = 0;
constexpr Set kEveryBeta =
    set_of({BetaClass::Zero, BetaClass::Tiny, BetaClass::Small, BetaClass::Normal, BetaClass::Inf});
// Huber's delta is never 0 (the checks require delta > 0).
constexpr Set kEveryDelta = set_of({BetaClass::Tiny, BetaClass::Small, BetaClass::Normal, BetaClass::Inf});

// Each op's name, its aclnn API, the beta classes it can be called with (none: it takes no beta) and
// whether log_target routes it.
struct OpInfo {
  Op op;
  const char* name;
  const char* aclnn;
  Set betas;
  bool takes_log_target;
  constexpr bool takes_beta() const {
    return betas != kNoBetas;
  }
};

constexpr OpInfo kOps[] = {
    {Op::SmoothL1Loss, "smooth_l1_loss", "aclnnSmoothL1Loss", kEveryBeta, false},
    {Op::SmoothL1LossBackward, "smooth_l1_loss_backward", "aclnnSmoothL1LossBackward", kEveryBeta, false},
    {Op::L1Loss, "l1_loss", "aclnnL1Loss", kNoBetas, false},
    {Op::L1LossBackward, "l1_loss_backward", "aclnnL1LossBackward", kNoBetas, false},
    {Op::KlDiv, "kl_div", "aclnnKlDiv", kNoBetas, true},
    {Op::KlDivTargetBackward, "kl_div_target_backward", "aclnnKlDivTargetBackward", kNoBetas, true},
    {Op::HuberLoss, "huber_loss", "aclnnSmoothL1Loss", kEveryDelta, false},
    {Op::HuberLossBackward, "huber_loss_backward", "aclnnSmoothL1LossBackward", kEveryDelta, false},
};

constexpr const OpInfo& op_info(Op op) {
  return kOps[static_cast<size_t>(op)];
}

static_assert([] {
  for (size_t i = 0; i < std::size(kOps); ++i) {
    if (static_cast<size_t>(kOps[i].op) != i) return false;
  }
  return true;
}(), "kOps is indexed by Op");

}  // namespace

const char* aclnn_api(Op op) {
  return op_info(op).aclnn;
}

namespace {

constexpr Set k910 = set_of({Chip::Tbe910});
constexpr Set k910B = set_of({Chip::Tbe910B});
constexpr Set k950 = set_of({Chip::Regbase950});
constexpr Set k310B = set_of({Chip::CompositeOnly});
constexpr Set kNoBf16 = set_of({DtypeClass::NoBFloat16});
constexpr Set kBf16 = set_of({DtypeClass::BFloat16});
// The betas at which the TBE kernels' beta + 1e-6 divisor biases the result beyond its dtype's tolerance.
constexpr Set kTbeBiased = set_of({BetaClass::Tiny, BetaClass::Small});
constexpr Set kTbeExact = set_of({BetaClass::Zero, BetaClass::Normal, BetaClass::Inf});
constexpr Set kProbabilities = set_of({false});  // log_target=False
constexpr Set kLogProbabilities = set_of({true});
constexpr uint8_t kPrescaledMean = static_cast<uint8_t>(Fix::PrescaledMean);
constexpr uint8_t kZeroWhereTargetZero = static_cast<uint8_t>(Fix::ZeroWhereTargetZero);
constexpr uint8_t kFloat32Sum = static_cast<uint8_t>(Fix::Float32Sum);
constexpr uint8_t kFloat32Delta = static_cast<uint8_t>(Fix::Float32Delta);
// Huber's finite deltas: huber = delta * smooth L1 (beta = delta) holds; at +inf it is inf * 0 = NaN.
constexpr Set kFiniteDelta = set_of({BetaClass::Tiny, BetaClass::Small, BetaClass::Normal});
constexpr Set kInfDelta = set_of({BetaClass::Inf});

struct Row {
  Op op;
  Set chips;
  Set dtypes = kAll;
  Set betas = kAll;
  Set log_targets = kAll;
  std::optional<Op> aclnn = std::nullopt;  // whose aclnn API serves the call; none: the composite
  uint8_t fixes = 0;
};

// Exactly one row matches each call (checked at compile time below). The reason for each row is in
// docs/npu_routing.md, "Which chips run which path".
constexpr Row kRoutes[] = {
    // aclnnSmoothL1Loss lists bf16 from Ascend 910B on.
    {.op = Op::SmoothL1Loss, .chips = k910, .dtypes = kNoBf16, .aclnn = Op::SmoothL1Loss},
    {.op = Op::SmoothL1Loss, .chips = k910, .dtypes = kBf16},
    {.op = Op::SmoothL1Loss, .chips = k910B | k950, .aclnn = Op::SmoothL1Loss},
    {.op = Op::SmoothL1Loss, .chips = k310B},

    // The TBE kernels divide by beta + 1e-6 (and list bf16 from 910B on). The Ascend 950 kernel gives NaN
    // for beta < 1e-6, at d == 0 for beta == 0 (where its L1 kernel serves, with its own "mean" divisor)
    // and at d = +-inf for beta == inf.
    {.op = Op::SmoothL1LossBackward, .chips = k910, .dtypes = kBf16},
    {.op = Op::SmoothL1LossBackward, .chips = k910, .dtypes = kNoBf16, .betas = kTbeExact,
     .aclnn = Op::SmoothL1LossBackward},
    {.op = Op::SmoothL1LossBackward, .chips = k910, .dtypes = kNoBf16, .betas = kTbeBiased},
    {.op = Op::SmoothL1LossBackward, .chips = k910B, .betas = kTbeExact, .aclnn = Op::SmoothL1LossBackward},
    {.op = Op::SmoothL1LossBackward, .chips = k910B, .betas = kTbeBiased},
    {.op = Op::SmoothL1LossBackward, .chips = k950, .betas = set_of({BetaClass::Zero}),
     .aclnn = Op::L1LossBackward, .fixes = kPrescaledMean},
    {.op = Op::SmoothL1LossBackward, .chips = k950, .betas = set_of({BetaClass::Small, BetaClass::Normal}),
     .aclnn = Op::SmoothL1LossBackward},
    {.op = Op::SmoothL1LossBackward, .chips = k950, .betas = set_of({BetaClass::Tiny, BetaClass::Inf})},
    {.op = Op::SmoothL1LossBackward, .chips = k310B},

    // aclnn's L1 kernels list bf16 from Ascend 910B on.
    {.op = Op::L1Loss, .chips = k910, .dtypes = kNoBf16, .aclnn = Op::L1Loss},
    {.op = Op::L1Loss, .chips = k910, .dtypes = kBf16},
    {.op = Op::L1Loss, .chips = k910B | k950, .aclnn = Op::L1Loss},
    {.op = Op::L1Loss, .chips = k310B},
    {.op = Op::L1LossBackward, .chips = k910, .dtypes = kNoBf16, .aclnn = Op::L1LossBackward},
    {.op = Op::L1LossBackward, .chips = k910, .dtypes = kBf16},
    {.op = Op::L1LossBackward, .chips = k910B | k950, .aclnn = Op::L1LossBackward},
    {.op = Op::L1LossBackward, .chips = k310B},

    // Only the Ascend 950 kernel gives 0 at target == 0 (the TBE formula gives NaN); no bf16 on 910/310P.
    {.op = Op::KlDiv, .chips = k910 | k910B, .log_targets = kProbabilities},
    {.op = Op::KlDiv, .chips = k910, .dtypes = kBf16, .log_targets = kLogProbabilities},
    {.op = Op::KlDiv, .chips = k910, .dtypes = kNoBf16, .log_targets = kLogProbabilities, .aclnn = Op::KlDiv},
    {.op = Op::KlDiv, .chips = k910B, .log_targets = kLogProbabilities, .aclnn = Op::KlDiv},
    {.op = Op::KlDiv, .chips = k950, .aclnn = Op::KlDiv},
    {.op = Op::KlDiv, .chips = k310B},

    // No dtype at all on 910/310P. Every chip's kernel gives NaN at target == 0; Ascend 950's divides "mean"
    // by numel(self) and sums half results in their own dtype.
    {.op = Op::KlDivTargetBackward, .chips = k910},
    {.op = Op::KlDivTargetBackward, .chips = k910B, .log_targets = kProbabilities,
     .aclnn = Op::KlDivTargetBackward, .fixes = kPrescaledMean | kZeroWhereTargetZero},
    {.op = Op::KlDivTargetBackward, .chips = k910B, .log_targets = kLogProbabilities,
     .aclnn = Op::KlDivTargetBackward, .fixes = kPrescaledMean},
    {.op = Op::KlDivTargetBackward, .chips = k950, .log_targets = kProbabilities,
     .aclnn = Op::KlDivTargetBackward, .fixes = kPrescaledMean | kZeroWhereTargetZero | kFloat32Sum},
    {.op = Op::KlDivTargetBackward, .chips = k950, .log_targets = kLogProbabilities,
     .aclnn = Op::KlDivTargetBackward, .fixes = kPrescaledMean | kFloat32Sum},
    {.op = Op::KlDivTargetBackward, .chips = k310B},

    // Huber runs smooth L1's kernels with beta = delta and the factor delta folded into grad_output (the
    // backward) or applied to the result (the forward): smooth L1's rows, except at delta == +inf, where
    // delta * smooth L1 is inf * 0.
    {.op = Op::HuberLoss, .chips = k910, .dtypes = kNoBf16, .betas = kFiniteDelta, .aclnn = Op::SmoothL1Loss,
     .fixes = kFloat32Delta},
    {.op = Op::HuberLoss, .chips = k910, .dtypes = kBf16},
    {.op = Op::HuberLoss, .chips = k910, .dtypes = kNoBf16, .betas = kInfDelta},
    {.op = Op::HuberLoss, .chips = k910B | k950, .betas = kFiniteDelta, .aclnn = Op::SmoothL1Loss,
     .fixes = kFloat32Delta},
    {.op = Op::HuberLoss, .chips = k910B | k950, .betas = kInfDelta},
    {.op = Op::HuberLoss, .chips = k310B},

    // As smooth L1's gradient (the TBE beta + 1e-6 divisor, the 950 kernel's 1/beta), and at delta == +inf
    // the composite on every chip.
    {.op = Op::HuberLossBackward, .chips = k910, .dtypes = kBf16},
    {.op = Op::HuberLossBackward, .chips = k910, .dtypes = kNoBf16, .betas = set_of({BetaClass::Normal}),
     .aclnn = Op::SmoothL1LossBackward, .fixes = kFloat32Delta},
    {.op = Op::HuberLossBackward, .chips = k910, .dtypes = kNoBf16, .betas = kTbeBiased | kInfDelta},
    {.op = Op::HuberLossBackward, .chips = k910B, .betas = set_of({BetaClass::Normal}),
     .aclnn = Op::SmoothL1LossBackward, .fixes = kFloat32Delta},
    {.op = Op::HuberLossBackward, .chips = k910B, .betas = kTbeBiased | kInfDelta},
    {.op = Op::HuberLossBackward, .chips = k950, .betas = set_of({BetaClass::Small, BetaClass::Normal}),
     .aclnn = Op::SmoothL1LossBackward, .fixes = kFloat32Delta},
    {.op = Op::HuberLossBackward, .chips = k950, .betas = set_of({BetaClass::Tiny, BetaClass::Inf})},
    {.op = Op::HuberLossBackward, .chips = k310B},
};

constexpr Chip kChips[] = {Chip::Tbe910, Chip::Tbe910B, Chip::Regbase950, Chip::CompositeOnly};
constexpr DtypeClass kDtypeClasses[] = {DtypeClass::NoBFloat16, DtypeClass::BFloat16};
constexpr BetaClass kBetas[] = {BetaClass::Zero, BetaClass::Tiny, BetaClass::Small, BetaClass::Normal, BetaClass::Inf};
constexpr bool kBooleans[] = {false, true};

constexpr bool matches(const Row& row, Op op, Chip chip, DtypeClass dtypes, BetaClass beta, bool log_target) {
  return row.op == op && contains(row.chips, chip) && contains(row.dtypes, dtypes) && contains(row.betas, beta) &&
      contains(row.log_targets, log_target);
}

// visit(op, chip, dtypes, beta, log_target) for every class of call of every op on every chip.
template <typename Visit>
constexpr void for_each_call(const Visit& visit) {
  for (const OpInfo& info : kOps) {
    for (Chip chip : kChips) {
      for (DtypeClass dtypes : kDtypeClasses) {
        for (BetaClass beta : kBetas) {
          if (info.takes_beta() && !contains(info.betas, beta)) continue;
          if (!info.takes_beta() && beta != kBetas[0]) continue;
          for (bool log_target : kBooleans) {
            if (info.takes_log_target || !log_target) {
              visit(info.op, chip, dtypes, info.takes_beta() ? beta : BetaClass::None, log_target);
            }
          }
        }
      }
    }
  }
}

constexpr bool table_is_a_partition() {
  bool ok = true;
  for_each_call([&](Op op, Chip chip, DtypeClass dtypes, BetaClass beta, bool log_target) {
    int n = 0;
    for (const Row& row : kRoutes) n += matches(row, op, chip, dtypes, beta, log_target);
    ok = ok && n == 1;
  });
  return ok;
}

// Every row serves some call; a row leaves the arguments its op does not take open; a composite row
// applies no fix.
constexpr bool every_row_is_well_formed() {
  for (const Row& row : kRoutes) {
    bool reached = false;
    for_each_call([&](Op op, Chip chip, DtypeClass dtypes, BetaClass beta, bool log_target) {
      reached = reached || matches(row, op, chip, dtypes, beta, log_target);
    });
    const OpInfo& info = op_info(row.op);
    if (!reached || (!info.takes_beta() && row.betas != kAll) || (!info.takes_log_target && row.log_targets != kAll) ||
        (!row.aclnn && row.fixes != 0)) {
      return false;
    }
  }
  return true;
}

static_assert(table_is_a_partition(), "every call must match exactly one routing row");
static_assert(every_row_is_well_formed(), "a routing row that serves no call, constrains an argument its op does "
              "not take, or fixes a composite call");

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
                           std::pair{kFloat32Delta, "fp32 for half dtypes"}}) {
    if (fixes & fix) text += (text.empty() ? "" : ", ") + std::string(name);
  }
  return text.empty() ? "-" : text;
}

}  // namespace

Route route(Op op, Chip chip, DtypeClass dtypes, BetaClass beta, bool log_target) {
  for (const Row& row : kRoutes) {
    if (matches(row, op, chip, dtypes, beta, log_target)) return {row.aclnn, row.fixes};
  }
  return {std::nullopt, 0};  // unreachable for the calls the table covers (static_assert above)
}

std::vector<RouteRow> routing_table() {
  std::vector<RouteRow> rows;
  for (const Row& row : kRoutes) {
    const OpInfo& info = op_info(row.op);
    rows.push_back(RouteRow{
        info.name,
        cell(true, row.chips, kChips, [](Chip c) { return name_of(kChipKeys, c); }),
        cell(true, row.dtypes, kDtypeClasses, [](DtypeClass d) { return name_of(kDtypeClassNames, d); }),
        cell(info.takes_beta(), row.betas, kBetas, beta_class_name, info.betas),
        cell(info.takes_log_target, row.log_targets, kBooleans, [](bool lt) { return lt ? "true" : "false"; }),
        row.aclnn ? aclnn_api(*row.aclnn) : "composite",
        fixes_cell(row.fixes),
    });
  }
  return rows;
}

}  // namespace npu_loss::npu
