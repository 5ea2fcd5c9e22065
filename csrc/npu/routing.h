// The NPU routing table: which aclnn API (or the composite fallback) serves each op on each Ascend chip
// family, for each class of dtypes, beta and log_target, and which fixes the kernels apply around the call.
// Every chip rule is a row of this one table (routing.cpp); the files in csrc/npu/ consult route() and
// nothing else decides. docs/npu_routing.md writes the same rows out, and tests/test_npu_routing.py
// compares them with routing_table().
//
// Plain C++ (no torch or torch_npu types): compiled into the static core, so that _C exposes the table on
// any machine and _C_npu routes by it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace npu_loss::npu {

// Families of Ascend chips, by what their aclnn loss kernels can do.
enum class Chip : uint8_t {
  Tbe910,         // Ascend 910 (Atlas A1) and 310P: TBE kernels, fp32/fp16 only, no KL target gradient
  Tbe910B,        // Ascend 910B / 910_93 (Atlas A2/A3): TBE kernels with bf16 and the KL target gradient
  Regbase950,     // Ascend 950 and every newer chip (op-plugin treats SocVersion >= Ascend950 alike)
  CompositeOnly,  // Ascend 310B (none of the six APIs) and chips this package does not know
};

// The family of a SoC name as aclrtGetSocName() reports it ("Ascend910B1", "Ascend950DT_9571", ...).
Chip chip_from_soc_name(const std::string& soc_name);

// A readable name of a family, for build_info().
const char* chip_family_name(Chip chip);

// The ops that have routing rows (an out= overload routes as its functional op). Each has its aclnn API.
enum class Op : uint8_t {
  SmoothL1Loss,
  SmoothL1LossBackward,
  L1Loss,
  L1LossBackward,
  KlDiv,
  KlDivTargetBackward,
  HuberLoss,          // runs aclnnSmoothL1Loss with beta = delta (huber = delta * smooth L1)
  HuberLossBackward,  // runs aclnnSmoothL1LossBackward with beta = delta
};

// The name of the aclnn API an op runs by default ("aclnnL1Loss"; Huber's is smooth L1's).
const char* aclnn_api(Op op);

// The dtypes of a call, as the chips tell them apart: whether any operand or the result is bfloat16.
enum class DtypeClass : uint8_t { NoBFloat16, BFloat16 };

// A floating dtype the NPU accepts (float64 never reaches the routing: the checks reject it there).
enum class Dtype : uint8_t { Float32, Float16, BFloat16 };

// Smooth L1's beta (and Huber's delta, which the kernels pass as beta), as the chips tell it apart. None:
// the op takes no beta.
enum class BetaClass : uint8_t {
  None,
  Zero,    // beta == 0: the L1 gradient
  Tiny,    // 0 < beta < 1e-6: the Ascend 950 kernel sets 1 / beta to NaN
  Small,   // 1e-6 <= beta, where the TBE kernels' beta + 1e-6 divisor biases the result beyond its dtype's
           // tolerance
  Normal,  // every other finite beta
  Inf,     // beta == +inf: the Ascend 950 kernel's d * (1 / beta) is NaN at d = +-inf
};

// The class of `beta` for a result of dtype `result` (the TBE bias is judged by the result's tolerance).
BetaClass beta_class(double beta, Dtype result);

// The class of Huber's `delta` (> 0, checked): beta_class of delta, and Inf where delta narrowed to the
// kernels' float is +inf.
BetaClass delta_class(double delta, Dtype result);

// The table's name of a beta class: "0", "tiny", "small", "normal", "inf" ("-" for None).
const char* beta_class_name(BetaClass beta);

// What the kernels do around an aclnn call, as bits of Route::fixes.
enum class Fix : uint8_t {
  // "mean" is passed as "sum" with grad_output pre-scaled in float32 by 1 / the op's "mean" divisor (where
  // the kernel's own divisor differs from the op's).
  PrescaledMean = 1,
  // The NaN the kernel gives where target == 0 is set to 0 (a zero probability gets a zero gradient).
  ZeroWhereTargetZero = 2,
  // float16/bfloat16 results summed over broadcast dims are computed and summed in float32, rounded once.
  Float32Sum = 4,
  // Huber in float16/bfloat16, where smooth L1's huber / delta or delta * grad_output can leave the dtype's
  // range, runs in float32 and rounds its result once: the forward at every delta != 1 (huber / delta
  // overflows where delta < 1 and |self - target| exceeds the dtype's largest value, underflows where
  // delta > 1), the backward at delta > 1 (delta * grad_output overflows; below 1 it shrinks, harmlessly).
  Float32Delta = 8,
};

// What serves a call: the aclnn API of an op (its own, or another's: smooth L1's gradient at beta == 0 runs
// L1's on Ascend 950), or, without one, the composite fallback (ATen ops on the NPU).
struct Route {
  std::optional<Op> aclnn;
  uint8_t fixes;
  bool has(Fix fix) const {
    return (fixes & static_cast<uint8_t>(fix)) != 0;
  }
};

// The path of one call. `beta` (Huber: delta_class) is BetaClass::None for the ops without one; `log_target`
// is false for the ops without one. Whether the installed CANN has the API is the caller's question (an
// older one may lack it, and then the call runs the composite).
Route route(Op op, Chip chip, DtypeClass dtypes, BetaClass beta, bool log_target);

// One row of the table, each cell as docs/npu_routing.md writes it: "any" for every value of a column, "-"
// for an argument the op does not take, else the values joined by ", ".
struct RouteRow {
  std::string op, chip, dtypes, beta, log_target, api, fixes;
};

// Every row, in the table's order.
std::vector<RouteRow> routing_table();

}  // namespace npu_loss::npu
