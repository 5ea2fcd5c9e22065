// The aclnn prototypes this package calls, and a compile-time guard that every call passes exactly their
// C types.
//
// EXEC_NPU_CMD_EXT looks the functions up by name at run time and builds the function-pointer type from
// the arguments it is given (at::Tensor becomes aclTensor*, scalars pass through unchanged). A `double`
// beta or an `int` reduction would therefore be passed with the wrong type, silently. NPU_LOSS_EXEC_ACLNN
// static_asserts each argument against the prototype below (std::is_same on the decayed type, since a
// double converts to float without complaint) before expanding EXEC_NPU_CMD_EXT.
//
// Prototypes: aclnnSmoothL1LossBackward from the CANN operator document; the others from hicann/ops-nn
// op_api/aclnn_*.h and hicann/ops-math (aclnnKlDiv).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "op_plugin/include/npu_cpp_extension.h"  // EXEC_NPU_CMD_EXT, aclTensor, aclOpExecutor

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

}  // namespace npu_loss::npu

#define NPU_LOSS_EXEC_ACLNN(aclnn_api, ...)                                                                  \
  do {                                                                                                       \
    static_assert(                                                                                           \
        ::npu_loss::npu::call_matches<                                                                       \
            decltype(aclnn_api##GetWorkspaceSize),                                                           \
            decltype(::npu_loss::npu::decayed_types(__VA_ARGS__))>::value,                                   \
        "arguments do not match the prototype of " #aclnn_api "GetWorkspaceSize (exact C types required)"); \
    EXEC_NPU_CMD_EXT(aclnn_api, __VA_ARGS__);                                                                \
  } while (false)

// The calls of PlainKernels (npu_common.h) for a loss without a scalar: `forward_api(self, target,
// reduction, out)` and `backward_api(grad_output, self, target, reduction, grad_input)`.
#define NPU_LOSS_PLAIN_CALLS(forward_api, backward_api)                                                     \
  static void forward(at::Tensor self, at::Tensor target, int64_t reduction, at::Tensor& out) {             \
    NPU_LOSS_EXEC_ACLNN(forward_api, self, target, reduction, out);                                          \
  }                                                                                                          \
  static void backward(                                                                                      \
      at::Tensor grad_output, at::Tensor self, at::Tensor target, int64_t reduction, at::Tensor& out) {      \
    NPU_LOSS_EXEC_ACLNN(backward_api, grad_output, self, target, reduction, out);                            \
  }
