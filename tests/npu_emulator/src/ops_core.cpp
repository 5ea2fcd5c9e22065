// libopapi.so of the host-emulated CANN: the shared machinery (see ops.h).

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

#include <ATen/native/TypeProperties.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include "ops.h"

namespace emu {

at::ScalarType to_at(aclDataType t) {
  switch (t) {
    case ACL_FLOAT: return at::kFloat;
    case ACL_FLOAT16: return at::kHalf;
    case ACL_BF16: return at::kBFloat16;
    case ACL_DOUBLE: return at::kDouble;
    case ACL_INT8: return at::kChar;
    case ACL_UINT8: return at::kByte;
    case ACL_INT16: return at::kShort;
    case ACL_UINT16: return at::kUInt16;
    case ACL_INT32: return at::kInt;
    case ACL_UINT32: return at::kUInt32;
    case ACL_INT64: return at::kLong;
    case ACL_UINT64: return at::kUInt64;
    case ACL_BOOL: return at::kBool;
    case ACL_COMPLEX64: return at::kComplexFloat;
    case ACL_COMPLEX128: return at::kComplexDouble;
    case ACL_COMPLEX32: return at::kComplexHalf;
    case ACL_FLOAT8_E5M2: return at::kFloat8_e5m2;
    case ACL_FLOAT8_E4M3FN: return at::kFloat8_e4m3fn;
    default: break;
  }
  TORCH_CHECK(false, "npu_emulator: aclDataType ", static_cast<int>(t), " has no host equivalent");
}

bool has_at(aclDataType t) {
  try {
    (void)to_at(t);
    return true;
  } catch (...) {
    return false;
  }
}

aclDataType to_acl(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ACL_FLOAT;
    case at::kHalf: return ACL_FLOAT16;
    case at::kBFloat16: return ACL_BF16;
    case at::kDouble: return ACL_DOUBLE;
    case at::kChar: return ACL_INT8;
    case at::kByte: return ACL_UINT8;
    case at::kShort: return ACL_INT16;
    case at::kUInt16: return ACL_UINT16;
    case at::kInt: return ACL_INT32;
    case at::kUInt32: return ACL_UINT32;
    case at::kLong: return ACL_INT64;
    case at::kUInt64: return ACL_UINT64;
    case at::kBool: return ACL_BOOL;
    case at::kComplexFloat: return ACL_COMPLEX64;
    case at::kComplexDouble: return ACL_COMPLEX128;
    case at::kComplexHalf: return ACL_COMPLEX32;
    default: return ACL_DT_UNDEFINED;
  }
}

const char* dtype_name(aclDataType t) {
  switch (t) {
    case ACL_FLOAT: return "FLOAT";
    case ACL_FLOAT16: return "FLOAT16";
    case ACL_BF16: return "BFLOAT16";
    case ACL_DOUBLE: return "DOUBLE";
    case ACL_INT8: return "INT8";
    case ACL_UINT8: return "UINT8";
    case ACL_INT16: return "INT16";
    case ACL_INT32: return "INT32";
    case ACL_INT64: return "INT64";
    case ACL_BOOL: return "BOOL";
    case ACL_COMPLEX64: return "COMPLEX64";
    case ACL_COMPLEX128: return "COMPLEX128";
    default: return "OTHER";
  }
}

TensorDesc::TensorDesc(const aclTensor* t) : src(t) {
  if (t == nullptr) return;
  defined = true;
  sizes = t->view_dims;
  strides = t->strides;
  storage_dims = t->storage_dims;
  offset = t->offset;
  dtype = t->dtype;
  format = t->format;
  data = t->data;
}

int64_t TensorDesc::numel() const {
  int64_t n = 1;
  for (auto s : sizes) n *= s;
  return n;
}

at::Tensor TensorDesc::get() const {
  TORCH_CHECK(defined, "npu_emulator: undefined tensor");
  auto opts = at::TensorOptions().dtype(scalar_type()).device(at::kCPU);
  if (numel() == 0) return at::empty(sizes, opts);
  TORCH_CHECK(data != nullptr, "npu_emulator: tensor without data");
  char* base = static_cast<char*>(data) + offset * static_cast<int64_t>(c10::elementSize(scalar_type()));
  return at::from_blob(base, sizes, strides, opts);
}

namespace {
// [first, last) bytes a strided tensor touches.
std::pair<uintptr_t, uintptr_t> byte_range(const at::Tensor& t) {
  auto base = reinterpret_cast<uintptr_t>(t.data_ptr());
  int64_t lo = 0, hi = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    int64_t span = (t.size(d) - 1) * t.stride(d);
    if (span < 0) lo += span; else hi += span;
  }
  auto es = static_cast<int64_t>(t.element_size());
  return {base + lo * es, base + (hi + 1) * es};
}
}  // namespace

void TensorDesc::write(const at::Tensor& value) const {
  if (numel() == 0) return;
  at::Tensor dst = get();
  at::Tensor src = value;
  if (src.numel() > 0 && src.device().is_cpu()) {
    if (src.data_ptr() == dst.data_ptr() && src.sizes().equals(dst.sizes()) && src.strides().equals(dst.strides()) &&
        src.scalar_type() == dst.scalar_type()) {
      return;  // already in place
    }
    auto a = byte_range(dst), b = byte_range(src);
    if (a.first < b.second && b.first < a.second) src = src.clone();  // overlapping memory: read first
  }
  dst.copy_(src);
}

std::vector<TensorDesc> TL(const aclTensorList* l) {
  std::vector<TensorDesc> out;
  if (l == nullptr) return out;
  for (auto* t : l->v) out.emplace_back(t);
  return out;
}

std::vector<at::Tensor> get_all(const std::vector<TensorDesc>& l) {
  std::vector<at::Tensor> out;
  out.reserve(l.size());
  for (const auto& t : l) out.push_back(t.get());
  return out;
}

at::Scalar S(const aclScalar* s) {
  if (s == nullptr) return at::Scalar(0);
  const void* b = s->bytes;
  switch (s->dtype) {
    case ACL_DOUBLE: return at::Scalar(*static_cast<const double*>(b));
    case ACL_FLOAT: return at::Scalar(static_cast<double>(*static_cast<const float*>(b)));
    case ACL_FLOAT16: return at::Scalar(static_cast<double>(static_cast<float>(*static_cast<const at::Half*>(b))));
    case ACL_BF16:
      return at::Scalar(static_cast<double>(static_cast<float>(*static_cast<const at::BFloat16*>(b))));
    case ACL_INT64: return at::Scalar(*static_cast<const int64_t*>(b));
    case ACL_UINT64: return at::Scalar(static_cast<int64_t>(*static_cast<const uint64_t*>(b)));
    case ACL_INT32: return at::Scalar(static_cast<int64_t>(*static_cast<const int32_t*>(b)));
    case ACL_UINT32: return at::Scalar(static_cast<int64_t>(*static_cast<const uint32_t*>(b)));
    case ACL_INT16: return at::Scalar(static_cast<int64_t>(*static_cast<const int16_t*>(b)));
    case ACL_UINT16: return at::Scalar(static_cast<int64_t>(*static_cast<const uint16_t*>(b)));
    case ACL_INT8: return at::Scalar(static_cast<int64_t>(*static_cast<const int8_t*>(b)));
    case ACL_UINT8: return at::Scalar(static_cast<int64_t>(*static_cast<const uint8_t*>(b)));
    case ACL_BOOL: return at::Scalar(*static_cast<const uint8_t*>(b) != 0);
    case ACL_COMPLEX128: return at::Scalar(*static_cast<const c10::complex<double>*>(b));
    case ACL_COMPLEX64:
      return at::Scalar(static_cast<c10::complex<double>>(*static_cast<const c10::complex<float>*>(b)));
    default: break;
  }
  TORCH_CHECK(false, "npu_emulator: aclScalar of aclDataType ", static_cast<int>(s->dtype));
}

aclDataType scalar_dtype(const aclScalar* s) { return s ? s->dtype : ACL_DT_UNDEFINED; }

std::vector<int64_t> IA(const aclIntArray* a) { return a ? a->v : std::vector<int64_t>{}; }

std::vector<bool> BA(const aclBoolArray* a) {
  std::vector<bool> out;
  if (a) for (auto b : a->v) out.push_back(b != 0);
  return out;
}

namespace {

bool log_rejections() {
  static const bool on = [] {
    const char* v = std::getenv("NPU_EMU_LOG");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

// Keeps the calling thread's dispatch state out of the host computation: no autograd, no Python
// modes/subclasses, no functorch layers, no autocast, no tracer — plain CPU kernels only.
struct ComputeGuard {
  static c10::DispatchKeySet excluded() {
    using K = c10::DispatchKey;
    c10::DispatchKeySet ks = c10::autograd_dispatch_keyset_with_ADInplaceOrView;
    ks = ks | c10::autocast_dispatch_keyset;
    for (K k : {K::Python, K::PythonTLSSnapshot, K::PythonDispatcher, K::PreDispatch, K::Functionalize,
                K::FuncTorchDynamicLayerFrontMode, K::FuncTorchDynamicLayerBackMode, K::FuncTorchGradWrapper,
                K::FuncTorchBatched, K::FuncTorchVmapMode, K::Batched, K::VmapMode, K::Tracer}) {
      ks = ks.add(k);
    }
    return ks;
  }
  // BackendSelect stays included (it is by default): factory functions need it.
  c10::impl::ForceDispatchKeyGuard force{c10::DispatchKeySet(c10::DispatchKey::BackendSelect), excluded()};
  c10::AutoGradMode no_grad{false};
};

struct FnExecutor : aclOpExecutor {
  std::function<void()> fn;
  aclnnStatus run() override {
    if (!empty && fn) fn();
    return ACLNN_SUCCESS;
  }
};

}  // namespace

aclnnStatus reject(const char* api, aclnnStatus status, const std::string& why) {
  std::string key = std::string(api) + "GetWorkspaceSize:" + std::to_string(status);
  npuemu_trace_add(key.c_str(), 1);
  std::string msg = std::string(api) + "GetWorkspaceSize returned " + std::to_string(status) + " on " +
                    npuemu_soc_name() + ": " + why;
  npuemu_log("%s", msg.c_str());
  if (log_rejections()) {
    std::fprintf(stderr, "npu_emulator: %s\n", msg.c_str());
    std::fflush(stderr);
  }
  return status;
}

aclnnStatus submit(const char* api, uint64_t* ws, aclOpExecutor** ex, std::function<void()> fn, bool empty) {
  if (ws == nullptr || ex == nullptr) return reject(api, ACLNN_ERR_PARAM_NULLPTR, "workspaceSize or executor is null");
  auto* e = new FnExecutor();
  e->name = api;
  e->fn = std::move(fn);
  e->empty = empty;
  *ws = 0;
  *ex = e;
  return ACLNN_SUCCESS;
}

aclnnStatus run(const char* api, aclOpExecutor* ex) {
  if (ex == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  npuemu_trace_add(api, 1);
  if (ex->empty) npuemu_trace_add((std::string(api) + ":empty").c_str(), 1);
  aclnnStatus st = ACLNN_SUCCESS;
  try {
    ComputeGuard guard;
    st = ex->run();
  } catch (const std::exception& e) {
    std::string msg = std::string(api) + " failed in the emulator: " + e.what();
    npuemu_log("%s", msg.c_str());
    std::fprintf(stderr, "npu_emulator: %s\n", msg.c_str());
    npuemu_trace_add((std::string(api) + ":failed").c_str(), 1);
    st = ACLNN_ERR_INNER;
  }
  if (!ex->repeatable) delete ex;
  return st;
}

std::string family() { return npuemu_soc_family(); }

bool broadcastable(at::IntArrayRef a, at::IntArrayRef b) {
  size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1;
    int64_t y = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (x != y && x != 1 && y != 1) return false;
  }
  return true;
}

std::vector<int64_t> broadcast_shape(at::IntArrayRef a, at::IntArrayRef b) {
  size_t n = std::max(a.size(), b.size());
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1;
    int64_t y = i < b.size() ? b[b.size() - 1 - i] : 1;
    out[n - 1 - i] = x == 1 ? y : x;
  }
  return out;
}

std::string shape_str(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

at::ScalarType promote(const std::vector<const TensorDesc*>& ts) {
  // ATen's rule, from dtypes and ranks only (no tensors are made in the calling thread).
  at::native::ResultTypeState state = {};
  for (const auto* t : ts) {
    auto st = t->scalar_type();
    if (t->dim() > 0) {
      state.dimResult = state.dimResult == at::ScalarType::Undefined ? st : at::promoteTypes(state.dimResult, st);
    } else {
      state.zeroResult =
          state.zeroResult == at::ScalarType::Undefined ? st : at::promoteTypes(state.zeroResult, st);
    }
  }
  return at::native::result_type(state);
}

}  // namespace emu

// The trace, readable with ctypes on libopapi.so (the counts live in libascendcl.so).
EMU_API size_t npu_emu_trace_json(char* buf, size_t len) { return npuemu_trace_json(buf, len); }
EMU_API void npu_emu_trace_reset() { npuemu_trace_reset(); }
