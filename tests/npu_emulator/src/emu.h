// Host-emulated CANN: declarations shared by the stand-in libraries.
// No torch headers here: libascendcl.so and libnnopbase.so are plain C++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "acl/acl_base.h"

#define EMU_API extern "C" __attribute__((visibility("default")))

typedef int32_t aclnnStatus;

// aclnn status codes (CANN "aclnn返回码").
constexpr aclnnStatus ACLNN_SUCCESS = 0;
constexpr aclnnStatus ACLNN_ERR_PARAM_NULLPTR = 161001;
constexpr aclnnStatus ACLNN_ERR_PARAM_INVALID = 161002;
constexpr aclnnStatus ACLNN_ERR_INNER = 561000;

// ---- aclnn objects (owned by libnnopbase.so, read by libopapi.so) ----
struct aclTensor {
  std::vector<int64_t> view_dims;
  std::vector<int64_t> strides;
  std::vector<int64_t> storage_dims;
  int64_t offset = 0;  // in elements, from data
  aclDataType dtype = ACL_DT_UNDEFINED;
  aclFormat format = ACL_FORMAT_ND;
  void* data = nullptr;  // storage base
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : view_dims) n *= d;
    return n;
  }
};

struct aclScalar {
  aclDataType dtype = ACL_DT_UNDEFINED;
  alignas(16) unsigned char bytes[16] = {0};
};

struct aclIntArray {
  std::vector<int64_t> v;
};
struct aclFloatArray {
  std::vector<float> v;
};
struct aclBoolArray {
  std::vector<uint8_t> v;
};
struct aclTensorList {
  std::vector<aclTensor*> v;  // owned
};
struct aclScalarList {
  std::vector<aclScalar*> v;  // owned
};

// An executor made by a GetWorkspaceSize call; run (and freed) by the second phase.
struct aclOpExecutor {
  virtual ~aclOpExecutor() = default;
  virtual aclnnStatus run() = 0;
  std::string name;
  bool repeatable = false;
  bool empty = false;  // nothing to launch (empty inputs)
};

// ---- core services exported by libascendcl.so (the one place with state) ----
EMU_API const char* npuemu_soc_name();
// Family of the emulated SoC: "910" (Ascend910 first generation), "910B", "910_93", "950", "310P", "310B",
// or "unknown".
EMU_API const char* npuemu_soc_family();
EMU_API void npuemu_trace_add(const char* key, int64_t count);
EMU_API size_t npuemu_trace_json(char* buf, size_t len);
EMU_API size_t npuemu_trace_total_json(char* buf, size_t len);
EMU_API void npuemu_trace_reset();
// Logs to stderr when NPU_EMU_LOG=1.
EMU_API void npuemu_log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// Sets the message aclGetRecentErrMsg returns next (torch_npu appends it to its error messages).
EMU_API void npuemu_set_error(const char* msg);
EMU_API bool npuemu_is_device_ptr(const void* p);
