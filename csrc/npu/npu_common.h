// What every NPU kernel shares: the chip of this process and the path of a call on it (the rows are each
// loss's declaration's, chips/paths.h), whether the installed CANN has an aclnn API at all and whether this
// chip's CANN rejected one, private NPU formats, the small host-side fixes around the aclnn calls, and the
// frame the elementwise losses' kernels run in (AclnnKernels; the row members' is npu/rows.h's).
#pragma once

#include <ATen/ATen.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "../chips/paths.h"
#include "aclnn_api.h"
#include "../composite/math.h"
#include "../core/backend.h"
#include "../core/checks.h"
#include "../losses.h"

namespace npu_loss::npu {

using namespace npu_loss::chips;  // the paths' vocabulary

// The SoC name of this process's NPU, read with aclrtGetSocName() on first use and cached. The device must
// be initialised by then (it is, inside any kernel; Python initialises it before asking).
const std::string& soc_name();

// The family of this process's NPU (cached with the name).
Chip current_chip();

// Whether the installed CANN has the aclnn API `name` (both phases), as op-plugin's DO_COMPATIBILITY
// checks it: an older toolkit may lack one, and the frame (aclnn_api.h) would then fail looking it up.
bool aclnn_api_available(const char* name);

// An aclnn API whose first phase this chip's CANN rejected (AclnnRejected), in this process. The first
// rejection of an API is noted with one warning naming the API, its status and the chip; later calls of every
// op whose path uses that API go straight to the composite, without calling it again. A call that sees a
// rejection discards everything it made and runs the composite for the whole call (nothing half-written is
// returned, nothing of the rejected call is enqueued, and no executor, workspace or scale outlives it).
void note_rejection(const AclnnRejected& rejected);
bool api_rejected(const char* api);
// The APIs rejected so far, and (for the tests, which reject each API in turn in one process) forgetting them.
std::vector<std::string> rejected_apis();
void forget_rejected_apis();

// The dtype class of a call (chips/paths.h) from its operands and result.
DtypeClass dtype_class(std::initializer_list<const at::Tensor*> tensors);

// A result dtype as chips/paths.h names it (the checks let only float32, float16 and bfloat16 reach the NPU).
Dtype path_dtype(c10::ScalarType dtype);

// The path of a call of a loss's forward (Backward false) or backward op on this process's chip: path() of
// chips/paths.h, and the composite when the installed CANN lacks the API the row names (asked once per row:
// the answer is fixed for the process, so a call pays no lock or lookup for it).
template <typename Loss, bool Backward>
Path path_here(DtypeClass dtypes, BetaClass beta, bool log_target, TransformClass transform = TransformClass::None) {
  const Path p = path<Loss, Backward>(current_chip(), dtypes, beta, log_target, transform);
  static const std::vector<bool> present = [] {
    std::vector<bool> found;
    for (const PathRow& row : rows_of<Loss, Backward>()) found.push_back(row.aclnn && aclnn_api_available(row.aclnn));
    return found;
  }();
  return p.aclnn && present[p.row] && !api_rejected(p.aclnn) ? p : Path{nullptr, 0, p.row};
}

// The aclnn loss kernels reject private NPU storage formats (NZ, 5HD, ...) with 161002. Inputs in such a
// format are converted to ND; an out= tensor in one gets the result through an ND temporary (base_format_out,
// copy_back).
bool has_private_format(const at::Tensor& t);
at::Tensor base_format(const at::Tensor& t);

// The tensor an aclnn kernel writes for out: out itself, or an ND temporary when out has a private format;
// copy_back then moves the temporary's values into out (nothing to do when they are the same tensor).
at::Tensor base_format_out(const at::Tensor& out);
void copy_back(at::Tensor& out, const at::Tensor& result);

// A reduction the kernels get as "sum" with grad_output pre-scaled in float32 (Fix::PrescaledMean), for
// the calls where a kernel's "mean" divisor differs from the op's.
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

// The beta class (chips/paths.h) of a call with a float scalar for a result of `dtype`; BetaClass::None for a
// loss without one.
inline BetaClass beta_of(c10::ScalarType dtype, double beta) {
  return beta_class(beta, path_dtype(dtype));
}
inline BetaClass beta_of(c10::ScalarType) {
  return BetaClass::None;
}
inline BetaClass beta_of(c10::ScalarType, bool) {
  return BetaClass::None;
}

// The log_target of a call: KL's bool scalar; false for every other loss.
inline bool log_target_of() {
  return false;
}
inline bool log_target_of(double) {
  return false;
}
inline bool log_target_of(bool log_target) {
  return log_target;
}

// Every elementwise loss's NPU kernels, one frame around its aclnn calls: the checks, empty inputs, this chip's
// path of the call (the composite where it names no API, or where Api::takes refuses the operands), private
// formats in and out, and the composite for the whole call when the chip's CANN rejects an API (the frame of
// aclnn_api.h enqueues nothing of a rejected call; `out` is written only by the composite then). `Api` holds the loss's calls, each given the call's path (the API its row names, the fixes it
// asks for), its checked spec and the tensor it writes (NPU_LOSS_PLAIN_FORWARD and _BACKWARD in aclnn_api.h
// write the calls that need nothing more):
//   Api::forward(path, spec, out, self, target, reduction, scalars...)
//   Api::backward(path, spec, grad_input, grad_output, self, target, reduction, scalars...)
//   Api::takes(grad_output, self, target): whether the backward's API takes these operands' dtypes.
// Read from the top, a call goes down to the shared checks (core/) and back to this frame, then down to the
// chip helpers (npu_common.cpp) and back, in the order the contract sets: checks before any aclnn call, the
// path before the formats, the call, then the fix-ups. The includes point one way (npu/ -> chips/, core/);
// the returns to the frame between those steps are its sequence, not a dependency back up.
template <typename Loss, typename Api, typename Scalars = ScalarsOf<Loss>>
struct AclnnKernels;

template <typename Loss, typename Api, typename... S>
struct AclnnKernels<Loss, Api, std::tuple<S...>> {
  static at::Tensor forward(const at::Tensor& self, const at::Tensor& target, int64_t reduction, S... s) {
    const c10::OptionalDeviceGuard guard(at::device_of(self));
    const auto spec = LossChecks<Loss>::forward(self, target, reduction, s...);
    if (numel_of(spec.broadcast_shape) == 0) return empty_forward(spec, reduction, self.options());
    const Path path = path_here<Loss, false>(
        dtype_class({&self, &target}), beta_of(spec.dtype, s...), log_target_of(s...));
    if (!path.aclnn) return Composite<Loss>::forward(self, target, reduction, s...);
    at::Tensor out = empty_result(spec, self.options());
    try {
      Api::forward(path, spec, out, base_format(self), base_format(target), reduction, s...);
    } catch (const AclnnRejected& rejected) {
      note_rejection(rejected);
      return Composite<Loss>::forward(self, target, reduction, s...);
    }
    return out;
  }

  static void backward_into(
      at::Tensor& out, const ResultSpec& spec, const at::Tensor& grad_output, const at::Tensor& self,
      const at::Tensor& target, int64_t reduction, S... s) {
    if (empty_sum_into(out, spec)) return;  // aclnn launches nothing for empty inputs
    const Path path = path_here<Loss, true>(
        dtype_class({&out, &grad_output, &self, &target}), beta_of(out.scalar_type(), s...), log_target_of(s...));
    if (!path.aclnn || !Api::takes(grad_output, self, target)) {
      out.copy_(Composite<Loss>::backward(grad_output, self, target, reduction, s...));
      return;
    }
    at::Tensor result = base_format_out(out);
    try {
      Api::backward(path, spec, result, base_format(grad_output), base_format(self), base_format(target), reduction,
                    s...);
    } catch (const AclnnRejected& rejected) {
      // Each backward makes one aclnn call, its fixes' torch ops before it write only temporaries: out is
      // untouched (and may alias self or target, which the composite reads before out is written).
      note_rejection(rejected);
      out.copy_(Composite<Loss>::backward(grad_output, self, target, reduction, s...));
      return;
    }
    copy_back(out, result);
  }
};

// Api::takes for an API that takes any mix of dtypes (it promotes).
struct TakesAnyDtypes {
  static bool takes(const at::Tensor&, const at::Tensor&, const at::Tensor&) {
    return true;
  }
};

// Registers a loss's NPU kernels: AclnnKernels<Loss, Api> under self's device guard.
template <typename Loss, typename Api>
void impl_npu_loss(torch::Library& m) {
  using Kernels = AclnnKernels<Loss, Api>;
  impl_loss<Loss, &Kernels::forward, &Kernels::backward_into, SelfDeviceGuard>(m);
}

}  // namespace npu_loss::npu
