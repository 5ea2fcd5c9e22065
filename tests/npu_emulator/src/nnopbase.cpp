// libnnopbase.so of the host-emulated CANN: the aclnn argument objects (aclTensor, aclScalar, arrays,
// lists) and executors. torch_npu finds these through libopapi.so (which depends on this library).

#include <cstdio>

#include "emu.h"

namespace {
size_t scalar_size(aclDataType t) {
  switch (t) {
    case ACL_INT8:
    case ACL_UINT8:
    case ACL_BOOL:
      return 1;
    case ACL_FLOAT16:
    case ACL_BF16:
    case ACL_INT16:
    case ACL_UINT16:
      return 2;
    case ACL_FLOAT:
    case ACL_INT32:
    case ACL_UINT32:
    case ACL_COMPLEX32:
      return 4;
    case ACL_INT64:
    case ACL_UINT64:
    case ACL_DOUBLE:
    case ACL_COMPLEX64:
      return 8;
    case ACL_COMPLEX128:
      return 16;
    default:
      return 0;
  }
}
}  // namespace

EMU_API aclTensor* aclCreateTensor(const int64_t* view_dims, uint64_t view_dims_num, aclDataType data_type,
                                   const int64_t* stride, int64_t offset, aclFormat format,
                                   const int64_t* storage_dims, uint64_t storage_dims_num, void* tensor_data) {
  auto* t = new aclTensor();
  if (view_dims_num > 0 && view_dims != nullptr) t->view_dims.assign(view_dims, view_dims + view_dims_num);
  if (stride != nullptr) {
    t->strides.assign(stride, stride + view_dims_num);
  } else {
    // contiguous strides
    t->strides.assign(view_dims_num, 1);
    for (int64_t i = static_cast<int64_t>(view_dims_num) - 2; i >= 0; --i) {
      t->strides[i] = t->strides[i + 1] * t->view_dims[i + 1];
    }
  }
  if (storage_dims_num > 0 && storage_dims != nullptr) {
    t->storage_dims.assign(storage_dims, storage_dims + storage_dims_num);
  }
  t->offset = offset;
  t->dtype = data_type;
  t->format = format;
  t->data = tensor_data;
  switch (format) {
    case ACL_FORMAT_ND: case ACL_FORMAT_NCHW: case ACL_FORMAT_NHWC: case ACL_FORMAT_HWCN:
    case ACL_FORMAT_NDHWC: case ACL_FORMAT_NCDHW: case ACL_FORMAT_NCL: case ACL_FORMAT_UNDEFINED:
      break;
    default: {  // a private format reached an aclnn call: counted so tests can see it
      char key[64];
      std::snprintf(key, sizeof key, "aclCreateTensor:private_format:%d", static_cast<int>(format));
      npuemu_trace_add(key, 1);
    }
  }
  return t;
}

EMU_API int aclDestroyTensor(const aclTensor* t) {
  delete t;
  return 0;
}

EMU_API aclScalar* aclCreateScalar(void* value, aclDataType data_type) {
  auto* s = new aclScalar();
  s->dtype = data_type;
  size_t n = scalar_size(data_type);
  if (value != nullptr && n > 0) std::memcpy(s->bytes, value, n);
  return s;
}
EMU_API int aclDestroyScalar(const aclScalar* s) {
  delete s;
  return 0;
}

EMU_API aclIntArray* aclCreateIntArray(const int64_t* value, uint64_t size) {
  auto* a = new aclIntArray();
  if (value != nullptr && size > 0) a->v.assign(value, value + size);
  return a;
}
EMU_API int aclDestroyIntArray(const aclIntArray* a) {
  delete a;
  return 0;
}

EMU_API aclFloatArray* aclCreateFloatArray(const float* value, uint64_t size) {
  auto* a = new aclFloatArray();
  if (value != nullptr && size > 0) a->v.assign(value, value + size);
  return a;
}
EMU_API int aclDestroyFloatArray(const aclFloatArray* a) {
  delete a;
  return 0;
}

EMU_API aclBoolArray* aclCreateBoolArray(const bool* value, uint64_t size) {
  auto* a = new aclBoolArray();
  for (uint64_t i = 0; value != nullptr && i < size; ++i) a->v.push_back(value[i] ? 1 : 0);
  return a;
}
EMU_API int aclDestroyBoolArray(const aclBoolArray* a) {
  delete a;
  return 0;
}

EMU_API aclTensorList* aclCreateTensorList(const aclTensor* const* value, uint64_t size) {
  auto* l = new aclTensorList();
  for (uint64_t i = 0; value != nullptr && i < size; ++i) l->v.push_back(const_cast<aclTensor*>(value[i]));
  return l;
}
EMU_API int aclDestroyTensorList(const aclTensorList* l) {
  if (l == nullptr) return 0;
  for (auto* t : l->v) delete t;
  delete l;
  return 0;
}

EMU_API aclScalarList* aclCreateScalarList(const aclScalar* const* value, uint64_t size) {
  auto* l = new aclScalarList();
  for (uint64_t i = 0; value != nullptr && i < size; ++i) l->v.push_back(const_cast<aclScalar*>(value[i]));
  return l;
}
EMU_API int aclDestroyScalarList(const aclScalarList* l) {
  if (l == nullptr) return 0;
  for (auto* s : l->v) delete s;
  delete l;
  return 0;
}

EMU_API int aclDestroyAclOpExecutor(aclOpExecutor* ex) {
  delete ex;
  return 0;
}

EMU_API int aclSetAclOpExecutorRepeatable(aclOpExecutor* ex) {
  if (ex == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  ex->repeatable = true;
  return 0;
}

// The caller releases *view_dims with delete[] (op-plugin's nonzero does).
EMU_API int aclGetViewShape(const aclTensor* t, int64_t** view_dims, uint64_t* view_dims_num) {
  if (t == nullptr || view_dims == nullptr || view_dims_num == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  *view_dims_num = t->view_dims.size();
  *view_dims = new int64_t[t->view_dims.size() + 1];
  for (size_t i = 0; i < t->view_dims.size(); ++i) (*view_dims)[i] = t->view_dims[i];
  return 0;
}

EMU_API int aclGetStorageShape(const aclTensor* t, int64_t** dims, uint64_t* num) {
  if (t == nullptr || dims == nullptr || num == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  *num = t->storage_dims.size();
  *dims = new int64_t[t->storage_dims.size() + 1];
  for (size_t i = 0; i < t->storage_dims.size(); ++i) (*dims)[i] = t->storage_dims[i];
  return 0;
}

EMU_API int aclGetViewStrides(const aclTensor* t, int64_t** strides, uint64_t* num) {
  if (t == nullptr || strides == nullptr || num == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  *num = t->strides.size();
  *strides = new int64_t[t->strides.size() + 1];
  for (size_t i = 0; i < t->strides.size(); ++i) (*strides)[i] = t->strides[i];
  return 0;
}

EMU_API int aclGetViewOffset(const aclTensor* t, int64_t* offset) {
  if (t == nullptr || offset == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  *offset = t->offset;
  return 0;
}

EMU_API int aclGetFormat(const aclTensor* t, aclFormat* format) {
  if (t == nullptr || format == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  *format = t->format;
  return 0;
}

EMU_API int aclGetDataType(const aclTensor* t, aclDataType* dtype) {
  if (t == nullptr || dtype == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  *dtype = t->dtype;
  return 0;
}

EMU_API int aclGetIntArraySize(const aclIntArray* a, uint64_t* size) {
  if (a == nullptr || size == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  *size = a->v.size();
  return 0;
}

EMU_API int aclGetTensorListSize(const aclTensorList* l, uint64_t* size) {
  if (l == nullptr || size == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  *size = l->v.size();
  return 0;
}

EMU_API int aclGetFloatArraySize(const aclFloatArray* a, uint64_t* size) {
  if (a == nullptr || size == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  *size = a->v.size();
  return 0;
}

EMU_API int aclGetBoolArraySize(const aclBoolArray* a, uint64_t* size) {
  if (a == nullptr || size == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  *size = a->v.size();
  return 0;
}

EMU_API int aclGetScalarListSize(const aclScalarList* l, uint64_t* size) {
  if (l == nullptr || size == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  *size = l->v.size();
  return 0;
}

EMU_API int aclnnInit(const char*) { return 0; }
EMU_API int aclnnFinalize() { return 0; }

// torch_npu's executor cache and huge-memory hooks: present (so failed-lookup lists show only what matters)
// but inert — CanUsePTACache says no, so every call takes the two-phase path.
EMU_API int InitHugeMemThreadLocal(void*, bool) { return 0; }
EMU_API void UnInitHugeMemThreadLocal(void*, bool) {}
EMU_API void ReleaseHugeMem(void*, bool) {}
EMU_API void InitPTACacheThreadLocal() {}
EMU_API void UnInitPTACacheThreadLocal() {}
EMU_API void SetPTAHashKey(uint64_t) {}
EMU_API void SetPTACacheHashKey(uint8_t*, size_t) {}
EMU_API bool CanUsePTACache(const char*) { return false; }
EMU_API aclOpExecutor* PTAGetExecCache(uint64_t, uint64_t*) { return nullptr; }
EMU_API aclOpExecutor* PTAFindExecCache(uint8_t*, size_t, uint64_t*) { return nullptr; }
