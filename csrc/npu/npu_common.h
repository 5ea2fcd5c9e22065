// What every NPU kernel shares: the chip family (which decides, per call, whether a chip's aclnn kernel
// gives the package's documented result or the composite fallback must run), whether the installed CANN
// has an aclnn API at all, private NPU formats, and the small host-side fixes around the aclnn calls.
// The routing table is written out in docs/npu_routing.md ("Which chips run which path").
#pragma once

#include <ATen/ATen.h>

#include <initializer_list>
#include <string>

#include "../core/checks.h"

namespace npu_loss::npu {

// Families of Ascend chips, by what their aclnn loss kernels can do (docs/npu_routing.md, "Which chips run
// which path").
enum class Chip {
  Tbe910,         // Ascend 910 (Atlas A1) and 310P: TBE kernels, fp32/fp16 only, no KL target gradient
  Tbe910B,        // Ascend 910B / 910_93 (Atlas A2/A3): TBE kernels with bf16 and the KL target gradient
  Regbase950,     // Ascend 950 and every newer chip (op-plugin treats SocVersion >= Ascend950 alike)
  CompositeOnly,  // Ascend 310B (none of the six APIs) and chips this package does not know
};

// The family of a SoC name as aclrtGetSocName() reports it ("Ascend910B1", "Ascend950DT_9571", ...).
Chip chip_from_soc_name(const std::string& soc_name);

// The SoC name of this process's NPU, read with aclrtGetSocName() on first use and cached. The device must
// be initialised by then (it is, inside any kernel; Python initialises it before asking).
const std::string& soc_name();

// The family of this process's NPU (cached with the name).
Chip current_chip();

// A readable name of a family, for build_info().
const char* chip_family_name(Chip chip);

// Whether the installed CANN has the aclnn API `name` (both phases), as op-plugin's DO_COMPATIBILITY
// checks it: an older toolkit may lack one, and EXEC_NPU_CMD_EXT would then fail from inside the macro.
bool aclnn_api_available(const char* name);

// aclnn_api_available cached at the call site: the answer is fixed for the process, so an op call pays no
// lock or lookup for it.
#define NPU_LOSS_HAS_ACLNN(api) \
  ([] { static const bool present = ::npu_loss::npu::aclnn_api_available(#api); return present; }())

bool any_bfloat16(std::initializer_list<const at::Tensor*> tensors);

// The aclnn loss kernels reject private NPU storage formats (NZ, 5HD, ...) with 161002, which
// EXEC_NPU_CMD_EXT does not report. Inputs in such a format are converted to ND; an out= tensor in one
// gets the result through an ND temporary (base_format_out, copy_back).
bool has_private_format(const at::Tensor& t);
at::Tensor base_format(const at::Tensor& t);

// The tensor an aclnn kernel writes for out: out itself, or an ND temporary when out has a private format;
// copy_back then moves the temporary's values into out (nothing to do when they are the same tensor).
at::Tensor base_format_out(const at::Tensor& out);
void copy_back(at::Tensor& out, const at::Tensor& result);

// A reduction the kernels get as "sum" with grad_output pre-scaled in float32, for the cases where a
// chip's "mean" divisor differs from the package's.
struct ScaledGrad {
  at::Tensor grad_output;
  int64_t reduction;
};

inline ScaledGrad mean_as_scaled_sum(const at::Tensor& grad_output, int64_t reduction, int64_t divisor) {
  if (!is_mean(reduction)) return {grad_output, reduction};
  return {grad_output.to(at::kFloat) * reduction_scale(reduction, divisor), kSum};
}

// Forward "sum"/"mean" of an empty broadcast shape, which aclnn returns early on: 0 and NaN, as in PyTorch.
inline at::Tensor empty_forward(const ResultSpec& spec, int64_t reduction, const at::TensorOptions& options) {
  at::Tensor out = empty_result(spec, options);
  if (reduction != kNone) out.fill_(reduce_total(0, reduction, 0));
  return out;
}

}  // namespace npu_loss::npu
