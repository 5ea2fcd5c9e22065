// What every NPU kernel shares: the chip family (which decides, per call, whether the aclnn kernel can meet
// SPEC.md or the composite fallback must run), and the device guard.
#pragma once

#include <ATen/ATen.h>
#include <ATen/DeviceGuard.h>
#include <c10/core/DeviceGuard.h>

#include <initializer_list>
#include <limits>

#include "../checks.h"

#include "torch_npu/csrc/core/npu/NpuVariables.h"

namespace npu_loss::npu {

enum class Chip {
  Legacy,     // Ascend 910 (A1), 310P, 310B and anything unknown: TBE kernels, no bf16, no KL target gradient
  A2A3,       // Ascend 910B (Atlas A2) and 910_93 (Atlas A3): TBE kernels with bf16 and KL target gradient
  Ascend950,  // Ascend 950 regbase kernels
};

inline Chip current_chip() {
  using c10_npu::SocVersion;
  const SocVersion v = c10_npu::GetSocVersion();
  if ((v >= SocVersion::Ascend910B1 && v <= SocVersion::Ascend910B4_1) ||
      (v >= SocVersion::Ascend910_9391 && v <= SocVersion::Ascend910_9363)) {
    return Chip::A2A3;
  }
  if (v == SocVersion::Ascend950) return Chip::Ascend950;
  return Chip::Legacy;
}

inline bool any_bfloat16(std::initializer_list<const at::Tensor*> tensors) {
  for (const auto* t : tensors) {
    if (t->scalar_type() == at::kBFloat16) return true;
  }
  return false;
}

// A reduction the kernels get as "sum" with grad_output pre-scaled in float32, for the cases where a
// chip's "mean" divisor differs from SPEC's.
struct ScaledGrad {
  at::Tensor grad_output;
  int64_t reduction;
};

inline ScaledGrad mean_as_scaled_sum(const at::Tensor& grad_output, int64_t reduction, int64_t divisor) {
  if (reduction != static_cast<int64_t>(Reduction::Mean)) return {grad_output, reduction};
  return {grad_output.to(at::kFloat) * (1.0 / static_cast<double>(divisor)), static_cast<int64_t>(Reduction::Sum)};
}

// Forward "sum"/"mean" of an empty broadcast shape, which aclnn returns early on: 0 and NaN, as in PyTorch.
inline at::Tensor empty_forward(const ResultSpec& spec, int64_t reduction, const at::TensorOptions& options) {
  at::Tensor out = at::empty(spec.shape, options.dtype(spec.dtype));
  if (reduction == static_cast<int64_t>(Reduction::Sum)) out.zero_();
  if (reduction == static_cast<int64_t>(Reduction::Mean)) out.fill_(std::numeric_limits<double>::quiet_NaN());
  return out;
}

}  // namespace npu_loss::npu
