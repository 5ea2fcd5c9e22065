// Shared machinery of the emulated aclnn operators (libopapi.so): views of "device" memory as CPU tensors,
// executors, validation helpers, the trace.
//
// Every operator is the CANN two-phase pair:
//   aclnnXxxGetWorkspaceSize(args..., uint64_t* workspaceSize, aclOpExecutor** executor)
//       validates, records the call in an executor (workspace is always 0 here);
//   aclnnXxx(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor, aclrtStream stream)
//       runs it on the host memory behind the aclTensors, synchronously.
// The computation uses ATen CPU kernels over at::from_blob views, under a guard that keeps the calling
// thread's dispatch state (autograd, Python modes, functorch, autocast) out.
#pragma once

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "emu.h"

typedef void* aclrtStream;

namespace emu {

at::ScalarType to_at(aclDataType t);        // throws for types ATen lacks
bool has_at(aclDataType t);                 // whether ATen has the type
aclDataType to_acl(at::ScalarType t);
const char* dtype_name(aclDataType t);

// A by-value copy of an aclTensor, taken in the first phase (the caller may reuse its objects).
struct TensorDesc {
  const aclTensor* src = nullptr;  // the caller's object (aclnnNonzero rewrites its shape)
  std::vector<int64_t> sizes, strides, storage_dims;
  int64_t offset = 0;
  aclDataType dtype = ACL_DT_UNDEFINED;
  aclFormat format = ACL_FORMAT_ND;
  void* data = nullptr;
  bool defined = false;

  TensorDesc() = default;
  explicit TensorDesc(const aclTensor* t);
  int64_t numel() const;
  int64_t dim() const { return static_cast<int64_t>(sizes.size()); }
  at::ScalarType scalar_type() const { return to_at(dtype); }
  // A CPU tensor aliasing the device memory (view shape, strides, offset).
  at::Tensor get() const;
  // Writes `value` (broadcast, cast to this tensor's dtype) into the device memory.
  void write(const at::Tensor& value) const;
};

inline TensorDesc T(const aclTensor* t) { return TensorDesc(t); }

std::vector<TensorDesc> TL(const aclTensorList* l);
std::vector<at::Tensor> get_all(const std::vector<TensorDesc>& l);

at::Scalar S(const aclScalar* s);  // undefined input -> 0
aclDataType scalar_dtype(const aclScalar* s);
std::vector<int64_t> IA(const aclIntArray* a);  // null -> {}
std::vector<bool> BA(const aclBoolArray* a);

// Status helpers. submit() rejects (161002) a call of an API NPU_EMU_REJECT names when the package made it.
// reject() logs the reason (stderr unless NPU_EMU_LOG=0; also aclGetRecentErrMsg) and
// counts "<api>GetWorkspaceSize:<status>" in the trace.
aclnnStatus reject(const char* api, aclnnStatus status, const std::string& why);

// First phase: store `fn` in a new executor. `empty` marks calls with nothing to launch.
aclnnStatus submit(const char* api, uint64_t* ws, aclOpExecutor** ex, std::function<void()> fn,
                   bool empty = false);
// Second phase: run (and free) the executor under the compute guard, count it in the trace.
aclnnStatus run(const char* api, aclOpExecutor* ex);

// When the current documents of one of the generalized JSD's APIs do not list this chip, or bfloat16 on it, for
// these tensors (ops_rows.cpp): the package's own call is rejected (161002, returned), and torch_npu's is counted
// as "<api>:undocumented" in the trace (0 returned); 0 for any other API or call.
aclnnStatus documented(const char* api, std::initializer_list<const TensorDesc*> tensors);

// Whether the first phase being run was called by the package's own NPU module (npu_loss_ops/_C_npu), rather
// than by torch_npu: the first frame of the calling thread's stack outside the emulator's libraries. The knob
// NPU_EMU_REJECT (and npu_emu_reject_set) rejects the named APIs for the package's calls only.
bool called_by_package();

// The SoC family the emulator runs as (see npuemu_soc_family()).
std::string family();

// shape helpers
bool broadcastable(at::IntArrayRef a, at::IntArrayRef b);
std::vector<int64_t> broadcast_shape(at::IntArrayRef a, at::IntArrayRef b);
std::string shape_str(at::IntArrayRef s);

// Result dtype of ATen-style promotion between tensors (0-dim ones do not promote dimensioned ones of the
// same category) — what CANN calls 互推导关系 for aclnn element-wise operators.
at::ScalarType promote(const std::vector<const TensorDesc*>& ts);

// True when a defined tensor among `ts` is empty: aclnn launches nothing then.
inline bool any_empty(std::initializer_list<const TensorDesc*> ts) {
  for (auto* t : ts)
    if (t->defined && t->numel() == 0) return true;
  return false;
}

}  // namespace emu

// The second phase of operator NAME.
#define ACLNN_RUN(NAME)                                                                                  \
  EMU_API aclnnStatus NAME(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor, aclrtStream) { \
    (void)workspace;                                                                                     \
    (void)workspaceSize;                                                                                 \
    return emu::run(#NAME, executor);                                                                    \
  }

#define ACLNN_CHECK_NOTNULL(API, ...)                                                           \
  do {                                                                                          \
    const void* ptrs_[] = {__VA_ARGS__};                                                        \
    for (const void* p_ : ptrs_)                                                                \
      if (p_ == nullptr) return emu::reject(API, ACLNN_ERR_PARAM_NULLPTR, "a required argument is null"); \
  } while (0)
