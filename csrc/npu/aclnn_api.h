// The aclnn prototypes this package calls, a compile-time guard that every call passes exactly their C
// types, and the two-phase frame every call goes through.
//
// The frame (NPU_LOSS_EXEC_ACLNN) is torch_npu's EXEC_NPU_CMD_V1_EXT with the one step that macro leaves out:
// it reads GetWorkspaceSize's status. torch_npu's EXEC_NPU_CMD_EXT ignores it and enqueues the launch with the
// executor it got (null after a rejection; with TASK_QUEUE_ENABLE=2 the first phase itself runs on the queue's
// thread), which hangs the task queue or corrupts the calls after it (docs/aclnn_reference.md, section 5). Here
// the first phase runs on the calling thread whatever TASK_QUEUE_ENABLE is, and a non-zero status releases
// what it converted and throws AclnnRejected before anything is enqueued; only a status of 0 enqueues the launch
// (torch_npu's RunAclCall: on the task queue, or at once without it). The kernels' frames (npu_common.h) catch
// AclnnRejected and run the composite for the whole call.
//
// The frame builds the function-pointer type from the arguments it is given (at::Tensor becomes aclTensor*,
// scalars pass through unchanged), as torch_npu's macro does. A `double` beta or an `int` reduction would
// therefore be passed with the wrong type, silently: NPU_LOSS_EXEC_ACLNN static_asserts each argument against
// the prototype below (std::is_same on the decayed type, since a double converts to float without complaint).
//
// Prototypes: aclnnSmoothL1LossBackward from the CANN operator document; the others from hicann/ops-nn
// op_api/aclnn_*.h (aclnn_mse_loss.h and aclnn_mse_loss_backward.h for MSE's) and hicann/ops-math
// (aclnnKlDiv).
#pragma once

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "op_plugin/include/npu_cpp_extension.h"  // ConvertTypes, RunAclCall, aclTensor, aclOpExecutor
#include "torch_npu/csrc/core/npu/NPUFunctions.h"      // c10_npu::GetDeterministicLevel
#include "torch_npu/csrc/framework/OpParamMaker.h"   // at_npu::native::ApplyDeterministicLevel

using aclnnStatus = int32_t;

extern "C" {
aclnnStatus aclnnSmoothL1LossBackwardGetWorkspaceSize(
    const aclTensor* gradOut, const aclTensor* self, const aclTensor* target, int64_t reduction, float beta,
    aclTensor* gradInput, uint64_t* workspaceSize, aclOpExecutor** executor);
aclnnStatus aclnnL1LossBackwardGetWorkspaceSize(
    const aclTensor* gradOutput, const aclTensor* self, const aclTensor* target, int64_t reduction,
    aclTensor* gradInput, uint64_t* workspaceSize, aclOpExecutor** executor);
aclnnStatus aclnnKlDivTargetBackwardGetWorkspaceSize(
    const aclTensor* gradOutput, const aclTensor* self, const aclTensor* target, int64_t reduction,
    bool logTarget, aclTensor* gradTarget, uint64_t* workspaceSize, aclOpExecutor** executor);
aclnnStatus aclnnSmoothL1LossGetWorkspaceSize(
    const aclTensor* self, const aclTensor* target, int64_t reduction, float beta, aclTensor* out,
    uint64_t* workspaceSize, aclOpExecutor** executor);
aclnnStatus aclnnL1LossGetWorkspaceSize(
    const aclTensor* self, const aclTensor* target, int64_t reduction, aclTensor* out, uint64_t* workspaceSize,
    aclOpExecutor** executor);
aclnnStatus aclnnKlDivGetWorkspaceSize(
    const aclTensor* self, const aclTensor* target, int64_t reduction, bool logTarget, aclTensor* out,
    uint64_t* workspaceSize, aclOpExecutor** executor);
aclnnStatus aclnnMseLossGetWorkspaceSize(
    const aclTensor* self, const aclTensor* target, int64_t reduction, aclTensor* out, uint64_t* workspaceSize,
    aclOpExecutor** executor);
aclnnStatus aclnnMseLossBackwardGetWorkspaceSize(
    const aclTensor* gradOutput, const aclTensor* self, const aclTensor* target, int64_t reduction,
    aclTensor* gradInput, uint64_t* workspaceSize, aclOpExecutor** executor);

// The generalized JSD's chunk math (npu/generalized_jsd.cpp): ops-nn (aclnnLogSoftmax, aclnnLogSoftmaxBackward)
// and ops-math (the rest); each row member's aclnn_apis (losses.h) lists the chips of each.
aclnnStatus aclnnCastGetWorkspaceSize(
    const aclTensor* self, const aclDataType dtype, aclTensor* out, uint64_t* workspaceSize, aclOpExecutor** executor);
aclnnStatus aclnnMulsGetWorkspaceSize(
    const aclTensor* self, const aclScalar* other, aclTensor* out, uint64_t* workspaceSize, aclOpExecutor** executor);
aclnnStatus aclnnInplaceMulsGetWorkspaceSize(
    aclTensor* selfRef, const aclScalar* other, uint64_t* workspaceSize, aclOpExecutor** executor);
aclnnStatus aclnnMulGetWorkspaceSize(
    const aclTensor* self, const aclTensor* other, aclTensor* out, uint64_t* workspaceSize, aclOpExecutor** executor);
aclnnStatus aclnnInplaceMulGetWorkspaceSize(
    aclTensor* selfRef, const aclTensor* other, uint64_t* workspaceSize, aclOpExecutor** executor);
aclnnStatus aclnnInplaceTanhGetWorkspaceSize(aclTensor* selfRef, uint64_t* workspaceSize, aclOpExecutor** executor);
aclnnStatus aclnnAddGetWorkspaceSize(
    const aclTensor* self, const aclTensor* other, const aclScalar* alpha, aclTensor* out, uint64_t* workspaceSize,
    aclOpExecutor** executor);
aclnnStatus aclnnAddsGetWorkspaceSize(
    const aclTensor* self, const aclScalar* other, const aclScalar* alpha, aclTensor* out, uint64_t* workspaceSize,
    aclOpExecutor** executor);
aclnnStatus aclnnSubGetWorkspaceSize(
    const aclTensor* self, const aclTensor* other, const aclScalar* alpha, aclTensor* out, uint64_t* workspaceSize,
    aclOpExecutor** executor);
aclnnStatus aclnnDivsGetWorkspaceSize(
    const aclTensor* self, const aclScalar* other, aclTensor* out, uint64_t* workspaceSize, aclOpExecutor** executor);
aclnnStatus aclnnExpGetWorkspaceSize(
    const aclTensor* self, aclTensor* out, uint64_t* workspaceSize, aclOpExecutor** executor);
aclnnStatus aclnnLogAddExpGetWorkspaceSize(
    const aclTensor* self, const aclTensor* other, aclTensor* out, uint64_t* workspaceSize, aclOpExecutor** executor);
aclnnStatus aclnnReduceSumGetWorkspaceSize(
    const aclTensor* self, const aclIntArray* dim, bool keepDim, aclDataType dtype, aclTensor* out,
    uint64_t* workspaceSize, aclOpExecutor** executor);
aclnnStatus aclnnInplaceMaskedFillScalarGetWorkspaceSize(
    aclTensor* selfRef, const aclTensor* mask, const aclScalar* value, uint64_t* workspaceSize,
    aclOpExecutor** executor);
aclnnStatus aclnnLogSoftmaxGetWorkspaceSize(
    const aclTensor* self, int64_t dim, aclTensor* out, uint64_t* workspaceSize, aclOpExecutor** executor);
aclnnStatus aclnnLogSoftmaxBackwardGetWorkspaceSize(
    const aclTensor* gradOutput, const aclTensor* output, int64_t dim, aclTensor* out, uint64_t* workspaceSize,
    aclOpExecutor** executor);
// The sparse JSD's (npu/sparse_jsd.cpp): ops-nn v9.1.0 index/gather_elements_v2/docs/aclnnGather.md and
// index/scatter_elements_v2/docs/aclnnScatter&aclnnInplaceScatter.md (reduce: 0 replace, 1 add, 2 multiply).
aclnnStatus aclnnGatherGetWorkspaceSize(
    const aclTensor* self, const int64_t dim, const aclTensor* index, aclTensor* out, uint64_t* workspaceSize,
    aclOpExecutor** executor);
aclnnStatus aclnnScatterGetWorkspaceSize(
    const aclTensor* self, int64_t dim, const aclTensor* index, const aclTensor* src, int64_t reduce, aclTensor* out,
    uint64_t* workspaceSize, aclOpExecutor** executor);
}

namespace npu_loss::npu {

template <typename... Ts>
struct type_list {};

// Unevaluated only: the decayed types of a call's arguments.
template <typename... Args>
type_list<std::decay_t<Args>...> decayed_types(Args&&...);

// Does an argument of host type Passed fill a parameter of type Param? Tensors fill aclTensor pointers
// (const for inputs, mutable for outputs); everything else must be exactly the parameter's type.
template <typename Passed, typename Param>
struct fills_param : std::is_same<Passed, Param> {};
template <>
struct fills_param<at::Tensor, const aclTensor*> : std::true_type {};
template <>
struct fills_param<at::Tensor, aclTensor*> : std::true_type {};
// Scalars, int arrays and dtypes, which op-plugin's ConvertType converts.
template <>
struct fills_param<at::Scalar, const aclScalar*> : std::true_type {};
template <>
struct fills_param<at::IntArrayRef, const aclIntArray*> : std::true_type {};
template <>
struct fills_param<at::ScalarType, aclDataType> : std::true_type {};

template <typename Prototype, typename Passed>
struct call_matches;

// GetWorkspaceSize takes the operator's arguments followed by workspaceSize and executor.
template <typename... Params, typename... Passed>
struct call_matches<aclnnStatus(Params...), type_list<Passed...>> {
  template <size_t... I>
  static constexpr bool check(std::index_sequence<I...>) {
    using params = std::tuple<Params...>;
    return (fills_param<Passed, std::tuple_element_t<I, params>>::value && ...);
  }
  static constexpr bool value = sizeof...(Passed) + 2 == sizeof...(Params) &&
      check(std::make_index_sequence<(sizeof...(Passed) + 2 == sizeof...(Params)) ? sizeof...(Passed) : 0>{});
};

// A loss's one scalar as the aclnn prototypes take it: beta as float (the ops' float scalars are doubles),
// log_target as bool.
inline float aclnn_scalar(double value) {
  return static_cast<float>(value);
}
inline bool aclnn_scalar(bool value) {
  return value;
}

// An aclnn first phase (GetWorkspaceSize) that returned a non-zero status: nothing of the call was enqueued.
// Thrown by the frame below; the kernels' frames (npu_common.h) catch it, note it (note_rejection) and run the
// composite for the whole call. Its message names the API, the status and the chip.
struct AclnnRejected : std::runtime_error {
  AclnnRejected(std::string api_name, int32_t status_code, const std::string& message)
      : std::runtime_error(message), api(std::move(api_name)), status(status_code) {}
  std::string api;
  int32_t status;
};

// Throws AclnnRejected for `api`'s status (npu_common.cpp: the message names this process's chip).
[[noreturn]] void throw_rejected(const char* api, int32_t status);

}  // namespace npu_loss::npu

// The frame's one step that differs between torch_npu lines: the execution config (deterministic algorithms).
// torch_npu 2.8 declares a global SetExecConfig() (and exports no c10_npu::GetDeterministicLevel); 2.7.1 and
// 2.9 on declare at_npu::native::ApplyDeterministicLevel(level, deterministic, is_opapi) instead. These
// stand-in templates tell which the line declares: a declared function beats a template as good a match, so a
// call resolves to the stand-in (returning Missing) only where the line has no such function.
namespace npu_loss_exec_config_fallback {
struct Missing {};
template <typename = void>
Missing SetExecConfig() {
  return {};
}
template <typename = void>
Missing ApplyDeterministicLevel(int64_t, bool, bool) {
  return {};
}
}  // namespace npu_loss_exec_config_fallback

namespace npu_loss::npu::exec_config {

using namespace at_npu::native;                 // ApplyDeterministicLevel (2.7.1, 2.9 on)
using namespace npu_loss_exec_config_fallback;  // the stand-ins

inline constexpr bool kSetExecConfig = !std::is_same_v<decltype(SetExecConfig()), Missing>;
inline constexpr bool kApplyDeterministicLevel =
    !std::is_same_v<decltype(ApplyDeterministicLevel(int64_t{0}, false, true)), Missing>;
static_assert(kSetExecConfig != kApplyDeterministicLevel,
              "torch_npu declares neither (or both) of SetExecConfig() and ApplyDeterministicLevel(level, "
              "deterministic, is_opapi): its EXEC_NPU_CMD_V1_EXT changed, and NPU_LOSS_CHECKED_EXEC with it");

// Sets the execution config of the call about to be made, as the line's own EXEC_NPU_CMD_V1_EXT does, and
// returns the deterministic level its executor cache hashes into the key (0 on 2.8, whose hit_cache_ext takes
// no level: there it is one more value of the key). A template, so that only the line's own branch is
// instantiated (and 2.8's unexported GetDeterministicLevel never referenced).
template <bool Legacy = kSetExecConfig>
uint32_t apply() {
  if constexpr (Legacy) {
    SetExecConfig();
    return 0;
  } else {
    const uint32_t level = c10_npu::GetDeterministicLevel();
    ApplyDeterministicLevel(static_cast<int64_t>(level), at::globalContext().deterministicAlgorithms(), true);
    return level;
  }
}

}  // namespace npu_loss::npu::exec_config

// The two phases of one aclnn call (see the top of this file): torch_npu's EXEC_NPU_CMD_V1_EXT steps, with the
// first phase's status read on the calling thread before anything is enqueued.
#define NPU_LOSS_CHECKED_EXEC(aclnn_api, ...)                                                                      \
  do {                                                                                                             \
    static void* opApiFuncAddr = nullptr;                                                                          \
    static void* getWorkspaceSizeFuncAddr = nullptr;                                                               \
    GetApiFunc(#aclnn_api, #aclnn_api "GetWorkspaceSize", opApiFuncAddr, getWorkspaceSizeFuncAddr);                \
    InitExecCommonCtx();                                                                                           \
    auto acl_stream = GetAclStream();                                                                              \
    const uint32_t level = ::npu_loss::npu::exec_config::apply();                                                  \
    /* a hit is an executor a successful first phase of the same call left in CANN's cache (torch_npu's macro */  \
    /* leaves the context as it is then, and so does this one) */                                                 \
    if (hit_cache_ext(acl_stream, #aclnn_api, opApiFuncAddr, level, __VA_ARGS__)) break;                          \
    uint64_t workspace_size = 0;                                                                                   \
    uint64_t* workspace_size_addr = &workspace_size;                                                               \
    aclOpExecutor* executor = nullptr;                                                                             \
    aclOpExecutor** executor_addr = &executor;                                                                     \
    /* every exit by an exception below releases what was made so far (torch_npu's macro leaves it) */            \
    auto converted_params = [&] {                                                                                  \
      try {                                                                                                        \
        return ConvertTypes(__VA_ARGS__, workspace_size_addr, executor_addr);                                     \
      } catch (...) {                                                                                              \
        UnInitExecCommonCtx();                                                                                     \
        throw;                                                                                                     \
      }                                                                                                            \
    }();                                                                                                           \
    const auto release_call = [&] {                                                                                \
      ReleaseConvertTypes(converted_params);                                                                       \
      ReleaseExecCommonCtx();                                                                                      \
      UnInitExecCommonCtx();                                                                                       \
    };                                                                                                             \
    auto getWorkspaceSizeFunc = ConvertToOpApiFunc(converted_params, getWorkspaceSizeFuncAddr);                    \
    const auto workspace_status = call(getWorkspaceSizeFunc, converted_params);                                    \
    if (workspace_status != 0) {                                                                                   \
      /* rejected: release what was converted, enqueue nothing */                                                  \
      release_call();                                                                                              \
      ::npu_loss::npu::throw_rejected(#aclnn_api, static_cast<int32_t>(workspace_status));                         \
    }                                                                                                              \
    void* workspace_addr = nullptr;                                                                                \
    try {                                                                                                          \
      workspace_addr = GetWorkSpaceAddr(workspace_size);                                                           \
    } catch (...) {                                                                                                \
      release_call(); /* out of device memory: the executor, never run, is left as torch_npu's macro leaves it */ \
      throw;                                                                                                       \
    }                                                                                                              \
    auto acl_call = [converted_params, workspace_addr, workspace_size, acl_stream, executor]() -> int {            \
      InitExecSubTheadCtx(acl_stream);                                                                             \
      const auto api_ret = ExecuteApiFunc(opApiFuncAddr, acl_stream, workspace_addr, workspace_size, executor);    \
      ReleaseConvertTypes(converted_params);                                                                       \
      ReleaseExecCommonCtx();                                                                                      \
      return api_ret;                                                                                              \
    };                                                                                                             \
    /* handed off: the launch releases the converted arguments; a launch error (raised here without the task */   \
    /* queue, at the next synchronization with it) leaves only the context to close */                             \
    try {                                                                                                          \
      RunAclCall(#aclnn_api, acl_call);                                                                            \
    } catch (...) {                                                                                                \
      UnInitExecCommonCtx();                                                                                       \
      throw;                                                                                                       \
    }                                                                                                              \
    UnInitExecCommonCtx();                                                                                         \
  } while (false)

#define NPU_LOSS_EXEC_ACLNN(aclnn_api, ...)                                                                  \
  do {                                                                                                       \
    static_assert(                                                                                           \
        ::npu_loss::npu::call_matches<                                                                       \
            decltype(aclnn_api##GetWorkspaceSize),                                                           \
            decltype(::npu_loss::npu::decayed_types(__VA_ARGS__))>::value,                                   \
        "arguments do not match the prototype of " #aclnn_api "GetWorkspaceSize (exact C types required)"); \
    NPU_LOSS_CHECKED_EXEC(aclnn_api, __VA_ARGS__);                                                           \
  } while (false)

// The forward and backward calls (AclnnKernels, npu_common.h) of a loss whose row's API is its own, with
// nothing around it: `forward_api(self, target, reduction, scalars..., out)` and `backward_api(grad_output,
// self, target, reduction, scalars..., grad_input)`, the loss's scalars as the prototype takes them.
#define NPU_LOSS_PLAIN_FORWARD(forward_api)                                                                  \
  template <typename... S>                                                                                   \
  static void forward(                                                                                       \
      const ::npu_loss::chips::Path&, const ::npu_loss::ResultSpec&, at::Tensor& out, at::Tensor self,       \
      at::Tensor target, int64_t reduction, S... s) {                                                        \
    /* the macro takes lvalues: the scalars as the prototype's types, each a parameter of its own */         \
    [&](auto... scalar) {                                                                                    \
      NPU_LOSS_EXEC_ACLNN(forward_api, self, target, reduction, scalar..., out);                             \
    }(::npu_loss::npu::aclnn_scalar(s)...);                                                                  \
  }
#define NPU_LOSS_PLAIN_BACKWARD(backward_api)                                                                \
  template <typename... S>                                                                                   \
  static void backward(                                                                                      \
      const ::npu_loss::chips::Path&, const ::npu_loss::ResultSpec&, at::Tensor& out, at::Tensor grad_output, \
      at::Tensor self, at::Tensor target, int64_t reduction, S... s) {                                       \
    [&](auto... scalar) {                                                                                    \
      NPU_LOSS_EXEC_ACLNN(backward_api, grad_output, self, target, reduction, scalar..., out);               \
    }(::npu_loss::npu::aclnn_scalar(s)...);                                                                  \
  }
