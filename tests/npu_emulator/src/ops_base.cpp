// libopapi.so of the host-emulated CANN, part 1: the shared machinery (see ops.h) and the element-wise
// operators: math, comparisons, logical ops, fills, casts, copies. Prototypes follow the CANN aclnn API
// reference; each computes on the host what the operator documents, with ATen CPU kernels (PyTorch's
// semantics, which these operators mirror).

#include <dlfcn.h>
#include <execinfo.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include <ATen/native/TypeProperties.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/acos.h>
#include <ATen/ops/add.h>
#include <ATen/ops/addcdiv.h>
#include <ATen/ops/addcmul.h>
#include <ATen/ops/asin.h>
#include <ATen/ops/atan.h>
#include <ATen/ops/atan2.h>
#include <ATen/ops/bitwise_and.h>
#include <ATen/ops/bitwise_not.h>
#include <ATen/ops/bitwise_or.h>
#include <ATen/ops/bitwise_xor.h>
#include <ATen/ops/ceil.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/clamp_max.h>
#include <ATen/ops/clamp_min.h>
#include <ATen/ops/cos.h>
#include <ATen/ops/cosh.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/erf.h>
#include <ATen/ops/erfc.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/exp2.h>
#include <ATen/ops/expm1.h>
#include <ATen/ops/floor.h>
#include <ATen/ops/floor_divide.h>
#include <ATen/ops/fmod.h>
#include <ATen/ops/frac.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/ge.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gt.h>
#include <ATen/ops/isclose.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/isinf.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/isneginf.h>
#include <ATen/ops/isposinf.h>
#include <ATen/ops/le.h>
#include <ATen/ops/lerp.h>
#include <ATen/ops/log.h>
#include <ATen/ops/log10.h>
#include <ATen/ops/log1p.h>
#include <ATen/ops/log2.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/logical_not.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/logical_xor.h>
#include <ATen/ops/lt.h>
#include <ATen/ops/masked_fill.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/remainder.h>
#include <ATen/ops/round.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/rsub.h>
#include <ATen/ops/sgn.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/sign.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/sinh.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/square.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/tan.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/trunc.h>
#include <ATen/ops/where.h>
#include <ATen/ops/xlogy.h>
#include <ATen/ops/zeros_like.h>

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
  npuemu_set_error(msg.c_str());
  if (log_rejections()) {
    std::fprintf(stderr, "npu_emulator: %s\n", msg.c_str());
    std::fflush(stderr);
  }
  return status;
}

namespace {

// NPU_EMU_REJECT: the APIs whose first phase rejects the package's calls (161002), as a chip whose CANN does
// not have them; npu_emu_reject_set() replaces the list at run time.
std::mutex reject_mutex;

// The names of a comma-separated list ("" and null: none).
std::set<std::string> api_names(const char* list) {
  std::set<std::string> names;
  const std::string text = list ? list : "";
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    if (end > start) names.insert(text.substr(start, end - start));
    start = end + 1;
  }
  return names;
}

std::set<std::string>& rejected_for_package() {
  static std::set<std::string> apis = api_names(std::getenv("NPU_EMU_REJECT"));
  return apis;
}

// NPU_EMU_TRACE_PACKAGE=1: each first phase the package's own module passes is also counted as "<api>:package".
bool trace_package_calls() {
  static const bool on = [] {
    const char* v = std::getenv("NPU_EMU_TRACE_PACKAGE");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

bool knob_rejects(const char* api) {
  const std::lock_guard<std::mutex> lock(reject_mutex);
  const auto& apis = rejected_for_package();
  return !apis.empty() && apis.count(api) != 0;
}

}  // namespace

bool called_by_package() {
  // The calling thread's stack: the first frame outside this library (and nnopbase, which it calls back
  // through) is the caller of the first phase: the package's own NPU module, or torch_npu (its own kernels, the
  // package's composite among them, whose first phases torch_npu calls).
  void* frames[16];
  const int n = backtrace(frames, 16);
  Dl_info self{};
  dladdr(reinterpret_cast<void*>(&called_by_package), &self);
  for (int i = 0; i < n; ++i) {
    Dl_info info{};
    if (dladdr(frames[i], &info) == 0 || info.dli_fname == nullptr) continue;
    if (self.dli_fname != nullptr && std::strcmp(info.dli_fname, self.dli_fname) == 0) continue;
    if (std::strstr(info.dli_fname, "libnnopbase") != nullptr) continue;
    return std::strstr(info.dli_fname, "npu_loss_ops/_C_npu") != nullptr;
  }
  return false;
}

aclnnStatus submit(const char* api, uint64_t* ws, aclOpExecutor** ex, std::function<void()> fn, bool empty) {
  if (ws == nullptr || ex == nullptr) return reject(api, ACLNN_ERR_PARAM_NULLPTR, "workspaceSize or executor is null");
  if (knob_rejects(api) && called_by_package()) {
    return reject(api, ACLNN_ERR_PARAM_INVALID, "rejected for the package's calls (NPU_EMU_REJECT)");
  }
  if (trace_package_calls() && called_by_package()) npuemu_trace_add((std::string(api) + ":package").c_str(), 1);
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
    npuemu_set_error(msg.c_str());
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

// Replaces NPU_EMU_REJECT's list (comma-separated API names; "" for none) for the calls that follow.
EMU_API void npu_emu_reject_set(const char* apis) {
  std::set<std::string> names = emu::api_names(apis);
  const std::lock_guard<std::mutex> lock(emu::reject_mutex);
  emu::rejected_for_package() = std::move(names);
}
EMU_API void npu_emu_trace_reset() { npuemu_trace_reset(); }


using emu::S;
using emu::T;
using emu::TensorDesc;
using emu::any_empty;

// ---------------------------------------------------------------------------------------------------------
// Macros for the common shapes of prototypes. EXPR sees `x` (self), `y` (other tensor) or `s` (scalar).

// aclnnNAME(const aclTensor* self, aclTensor* out)
#define EMU_UNARY(NAME, EXPR)                                                                              \
  EMU_API aclnnStatus aclnn##NAME##GetWorkspaceSize(const aclTensor* self, aclTensor* out, uint64_t* ws,    \
                                                    aclOpExecutor** ex) {                                  \
    ACLNN_CHECK_NOTNULL("aclnn" #NAME, self, out);                                                        \
    auto a = T(self), o = T(out);                                                                          \
    if (const aclnnStatus st_ = emu::documented("aclnn" #NAME, {&a, &o})) return st_;                      \
    return emu::submit("aclnn" #NAME, ws, ex, [=] {                                                        \
      at::Tensor x = a.get();                                                                              \
      o.write(EXPR);                                                                                       \
    }, any_empty({&a, &o}));                                                                               \
  }                                                                                                        \
  ACLNN_RUN(aclnn##NAME)

// aclnnInplaceNAME(aclTensor* selfRef)
#define EMU_INPLACE_UNARY(NAME, EXPR)                                                                      \
  EMU_API aclnnStatus aclnnInplace##NAME##GetWorkspaceSize(aclTensor* self, uint64_t* ws, aclOpExecutor** ex) { \
    ACLNN_CHECK_NOTNULL("aclnnInplace" #NAME, self);                                                      \
    auto a = T(self);                                                                                      \
    if (const aclnnStatus st_ = emu::documented("aclnnInplace" #NAME, {&a})) return st_;                   \
    return emu::submit("aclnnInplace" #NAME, ws, ex, [=] {                                                 \
      at::Tensor x = a.get();                                                                              \
      a.write(EXPR);                                                                                       \
    }, any_empty({&a}));                                                                                   \
  }                                                                                                        \
  ACLNN_RUN(aclnnInplace##NAME)

#define EMU_UNARY_BOTH(NAME, EXPR) \
  EMU_UNARY(NAME, EXPR)            \
  EMU_INPLACE_UNARY(NAME, EXPR)

// aclnnNAME(const aclTensor* self, const aclTensor* other, aclTensor* out)
#define EMU_BINARY(NAME, EXPR)                                                                             \
  EMU_API aclnnStatus aclnn##NAME##GetWorkspaceSize(const aclTensor* self, const aclTensor* other,          \
                                                    aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {    \
    ACLNN_CHECK_NOTNULL("aclnn" #NAME, self, other, out);                                                 \
    auto a = T(self), b = T(other), o = T(out);                                                            \
    if (const aclnnStatus st_ = emu::documented("aclnn" #NAME, {&a, &b, &o})) return st_;                  \
    return emu::submit("aclnn" #NAME, ws, ex, [=] {                                                        \
      at::Tensor x = a.get(), y = b.get();                                                                 \
      o.write(EXPR);                                                                                       \
    }, any_empty({&a, &b, &o}));                                                                           \
  }                                                                                                        \
  ACLNN_RUN(aclnn##NAME)

// aclnnInplaceNAME(aclTensor* selfRef, const aclTensor* other)
#define EMU_INPLACE_BINARY(NAME, EXPR)                                                                     \
  EMU_API aclnnStatus aclnnInplace##NAME##GetWorkspaceSize(aclTensor* self, const aclTensor* other,         \
                                                           uint64_t* ws, aclOpExecutor** ex) {             \
    ACLNN_CHECK_NOTNULL("aclnnInplace" #NAME, self, other);                                               \
    auto a = T(self), b = T(other);                                                                        \
    if (const aclnnStatus st_ = emu::documented("aclnnInplace" #NAME, {&a, &b})) return st_;               \
    return emu::submit("aclnnInplace" #NAME, ws, ex, [=] {                                                 \
      at::Tensor x = a.get(), y = b.get();                                                                 \
      a.write(EXPR);                                                                                       \
    }, any_empty({&a, &b}));                                                                               \
  }                                                                                                        \
  ACLNN_RUN(aclnnInplace##NAME)

// aclnnNAME(const aclTensor* self, const aclScalar* other, aclTensor* out)
#define EMU_BINARY_SCALAR(NAME, EXPR)                                                                      \
  EMU_API aclnnStatus aclnn##NAME##GetWorkspaceSize(const aclTensor* self, const aclScalar* other,          \
                                                    aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {    \
    ACLNN_CHECK_NOTNULL("aclnn" #NAME, self, other, out);                                                 \
    auto a = T(self), o = T(out);                                                                          \
    if (const aclnnStatus st_ = emu::documented("aclnn" #NAME, {&a, &o})) return st_;                      \
    at::Scalar s = S(other);                                                                               \
    return emu::submit("aclnn" #NAME, ws, ex, [=] {                                                        \
      at::Tensor x = a.get();                                                                              \
      o.write(EXPR);                                                                                       \
    }, any_empty({&a, &o}));                                                                               \
  }                                                                                                        \
  ACLNN_RUN(aclnn##NAME)

// aclnnInplaceNAME(aclTensor* selfRef, const aclScalar* other)
#define EMU_INPLACE_BINARY_SCALAR(NAME, EXPR)                                                              \
  EMU_API aclnnStatus aclnnInplace##NAME##GetWorkspaceSize(aclTensor* self, const aclScalar* other,         \
                                                           uint64_t* ws, aclOpExecutor** ex) {             \
    ACLNN_CHECK_NOTNULL("aclnnInplace" #NAME, self, other);                                               \
    auto a = T(self);                                                                                      \
    if (const aclnnStatus st_ = emu::documented("aclnnInplace" #NAME, {&a})) return st_;                   \
    at::Scalar s = S(other);                                                                               \
    return emu::submit("aclnnInplace" #NAME, ws, ex, [=] {                                                 \
      at::Tensor x = a.get();                                                                              \
      a.write(EXPR);                                                                                       \
    }, any_empty({&a}));                                                                                   \
  }                                                                                                        \
  ACLNN_RUN(aclnnInplace##NAME)

#define EMU_BINARY_ALL(NAME, EXPR_T, EXPR_S)   \
  EMU_BINARY(NAME##Tensor, EXPR_T)             \
  EMU_INPLACE_BINARY(NAME##Tensor, EXPR_T)     \
  EMU_BINARY_SCALAR(NAME##Scalar, EXPR_S)      \
  EMU_INPLACE_BINARY_SCALAR(NAME##Scalar, EXPR_S)

// ---------------------------------------------------------------------------------------------------------
// Fills, casts, copies.

EMU_INPLACE_UNARY(Zero, at::zeros_like(x))
EMU_INPLACE_UNARY(One, at::ones_like(x))
EMU_INPLACE_BINARY_SCALAR(FillScalar, at::full_like(x, s))
EMU_INPLACE_BINARY(FillTensor, y.reshape({}).expand(x.sizes()))

// aclnnCast(const aclTensor* self, aclDataType dtype, aclTensor* out)
EMU_API aclnnStatus aclnnCastGetWorkspaceSize(const aclTensor* self, aclDataType dtype, aclTensor* out, uint64_t* ws,
                                              aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnCast", self, out);
  auto a = T(self), o = T(out);
  if (const aclnnStatus st_ = emu::documented("aclnnCast", {&a, &o})) return st_;
  (void)dtype;  // the out tensor carries it
  return emu::submit("aclnnCast", ws, ex, [=] { o.write(a.get()); }, any_empty({&a, &o}));
}
ACLNN_RUN(aclnnCast)

// aclnnInplaceCopy(aclTensor* selfRef, const aclTensor* src): broadcast src into self, casting.
EMU_INPLACE_BINARY(Copy, y)

// ---------------------------------------------------------------------------------------------------------
// Arithmetic. alpha scales other: self + alpha * other.

#define EMU_ADD_SUB(NAME, OP)                                                                              \
  EMU_API aclnnStatus aclnn##NAME##GetWorkspaceSize(const aclTensor* self, const aclTensor* other,          \
                                                    const aclScalar* alpha, aclTensor* out, uint64_t* ws,  \
                                                    aclOpExecutor** ex) {                                  \
    ACLNN_CHECK_NOTNULL("aclnn" #NAME, self, other, out);                                                 \
    auto a = T(self), b = T(other), o = T(out);                                                            \
    if (const aclnnStatus st_ = emu::documented("aclnn" #NAME, {&a, &b, &o})) return st_;                  \
    at::Scalar al = alpha ? S(alpha) : at::Scalar(1);                                                      \
    return emu::submit("aclnn" #NAME, ws, ex,                                                              \
                       [=] { o.write(at::OP(a.get(), b.get(), al)); }, any_empty({&a, &b, &o}));           \
  }                                                                                                        \
  ACLNN_RUN(aclnn##NAME)                                                                                   \
  EMU_API aclnnStatus aclnn##NAME##sGetWorkspaceSize(const aclTensor* self, const aclScalar* other,         \
                                                     const aclScalar* alpha, aclTensor* out, uint64_t* ws, \
                                                     aclOpExecutor** ex) {                                 \
    ACLNN_CHECK_NOTNULL("aclnn" #NAME "s", self, other, out);                                             \
    auto a = T(self), o = T(out);                                                                          \
    if (const aclnnStatus st_ = emu::documented("aclnn" #NAME "s", {&a, &o})) return st_;                  \
    at::Scalar s = S(other), al = alpha ? S(alpha) : at::Scalar(1);                                        \
    return emu::submit("aclnn" #NAME "s", ws, ex,                                                          \
                       [=] { o.write(at::OP(a.get(), s, al)); }, any_empty({&a, &o}));                     \
  }                                                                                                        \
  ACLNN_RUN(aclnn##NAME##s)                                                                                \
  EMU_API aclnnStatus aclnnInplace##NAME##GetWorkspaceSize(aclTensor* self, const aclTensor* other,         \
                                                           const aclScalar* alpha, uint64_t* ws,           \
                                                           aclOpExecutor** ex) {                           \
    ACLNN_CHECK_NOTNULL("aclnnInplace" #NAME, self, other);                                               \
    auto a = T(self), b = T(other);                                                                        \
    if (const aclnnStatus st_ = emu::documented("aclnnInplace" #NAME, {&a, &b})) return st_;               \
    at::Scalar al = alpha ? S(alpha) : at::Scalar(1);                                                      \
    return emu::submit("aclnnInplace" #NAME, ws, ex,                                                       \
                       [=] { a.write(at::OP(a.get(), b.get(), al)); }, any_empty({&a, &b}));               \
  }                                                                                                        \
  ACLNN_RUN(aclnnInplace##NAME)                                                                            \
  EMU_API aclnnStatus aclnnInplace##NAME##sGetWorkspaceSize(aclTensor* self, const aclScalar* other,        \
                                                            const aclScalar* alpha, uint64_t* ws,          \
                                                            aclOpExecutor** ex) {                          \
    ACLNN_CHECK_NOTNULL("aclnnInplace" #NAME "s", self, other);                                           \
    auto a = T(self);                                                                                      \
    at::Scalar s = S(other), al = alpha ? S(alpha) : at::Scalar(1);                                       \
    return emu::submit("aclnnInplace" #NAME "s", ws, ex,                                                   \
                       [=] { a.write(at::OP(a.get(), s, al)); }, any_empty({&a}));                         \
  }                                                                                                        \
  ACLNN_RUN(aclnnInplace##NAME##s)

EMU_ADD_SUB(Add, add)
EMU_ADD_SUB(Sub, sub)

// rsub: other - alpha * self
EMU_API aclnnStatus aclnnRsubGetWorkspaceSize(const aclTensor* self, const aclTensor* other, const aclScalar* alpha,
                                              aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnRsub", self, other, out);
  auto a = T(self), b = T(other), o = T(out);
  at::Scalar al = alpha ? S(alpha) : at::Scalar(1);
  return emu::submit("aclnnRsub", ws, ex, [=] { o.write(at::sub(b.get(), a.get(), al)); }, any_empty({&a, &b, &o}));
}
ACLNN_RUN(aclnnRsub)
EMU_API aclnnStatus aclnnRsubsGetWorkspaceSize(const aclTensor* self, const aclScalar* other, const aclScalar* alpha,
                                               aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnRsubs", self, other, out);
  auto a = T(self), o = T(out);
  at::Scalar s = S(other), al = alpha ? S(alpha) : at::Scalar(1);
  return emu::submit("aclnnRsubs", ws, ex, [=] { o.write(at::rsub(a.get(), s, al)); }, any_empty({&a, &o}));
}
ACLNN_RUN(aclnnRsubs)

EMU_BINARY(Mul, at::mul(x, y))
EMU_INPLACE_BINARY(Mul, at::mul(x, y))
EMU_BINARY_SCALAR(Muls, at::mul(x, s))
EMU_INPLACE_BINARY_SCALAR(Muls, at::mul(x, s))
EMU_BINARY(Div, at::div(x, y))
EMU_INPLACE_BINARY(Div, at::div(x, y))
EMU_BINARY_SCALAR(Divs, at::div(x, s))
EMU_INPLACE_BINARY_SCALAR(Divs, at::div(x, s))

// aclnnDivMod(self, other, int mode, out): mode 0 true division, 1 trunc, 2 floor.
static c10::optional<c10::string_view> rounding(int mode) {
  if (mode == 1) return c10::string_view("trunc");
  if (mode == 2) return c10::string_view("floor");
  return c10::nullopt;
}
EMU_API aclnnStatus aclnnDivModGetWorkspaceSize(const aclTensor* self, const aclTensor* other, int mode, aclTensor* out,
                                                uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnDivMod", self, other, out);
  auto a = T(self), b = T(other), o = T(out);
  return emu::submit("aclnnDivMod", ws, ex, [=] { o.write(at::div(a.get(), b.get(), rounding(mode))); },
                     any_empty({&a, &b, &o}));
}
ACLNN_RUN(aclnnDivMod)
EMU_API aclnnStatus aclnnDivModsGetWorkspaceSize(const aclTensor* self, const aclScalar* other, int mode,
                                                 aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnDivMods", self, other, out);
  auto a = T(self), o = T(out);
  at::Scalar s = S(other);
  return emu::submit("aclnnDivMods", ws, ex, [=] { o.write(at::div(a.get(), s, rounding(mode))); },
                     any_empty({&a, &o}));
}
ACLNN_RUN(aclnnDivMods)
EMU_API aclnnStatus aclnnInplaceDivModGetWorkspaceSize(aclTensor* self, const aclTensor* other, int mode, uint64_t* ws,
                                                       aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnInplaceDivMod", self, other);
  auto a = T(self), b = T(other);
  return emu::submit("aclnnInplaceDivMod", ws, ex, [=] { a.write(at::div(a.get(), b.get(), rounding(mode))); },
                     any_empty({&a, &b}));
}
ACLNN_RUN(aclnnInplaceDivMod)
EMU_API aclnnStatus aclnnInplaceDivModsGetWorkspaceSize(aclTensor* self, const aclScalar* other, int mode,
                                                        uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnInplaceDivMods", self, other);
  auto a = T(self);
  at::Scalar s = S(other);
  return emu::submit("aclnnInplaceDivMods", ws, ex, [=] { a.write(at::div(a.get(), s, rounding(mode))); },
                     any_empty({&a}));
}
ACLNN_RUN(aclnnInplaceDivMods)

EMU_BINARY(FloorDivide, at::floor_divide(x, y))
EMU_BINARY_SCALAR(FloorDivides, at::floor_divide(x, s))
EMU_INPLACE_BINARY(FloorDivide, at::floor_divide(x, y))
EMU_BINARY(RemainderTensorTensor, at::remainder(x, y))
EMU_BINARY_SCALAR(RemainderTensorScalar, at::remainder(x, s))
EMU_INPLACE_BINARY(RemainderTensorTensor, at::remainder(x, y))
EMU_INPLACE_BINARY_SCALAR(RemainderTensorScalar, at::remainder(x, s))
EMU_BINARY(FmodTensor, at::fmod(x, y))
EMU_BINARY_SCALAR(FmodScalar, at::fmod(x, s))
EMU_INPLACE_BINARY(FmodTensor, at::fmod(x, y))
EMU_INPLACE_BINARY_SCALAR(FmodScalar, at::fmod(x, s))
EMU_BINARY(Maximum, at::maximum(x, y))
EMU_BINARY(Minimum, at::minimum(x, y))
EMU_BINARY(Atan2, at::atan2(x, y))
EMU_INPLACE_BINARY(Atan2, at::atan2(x, y))

// Powers.
EMU_BINARY_SCALAR(PowTensorScalar, at::pow(x, s))
EMU_INPLACE_BINARY_SCALAR(PowTensorScalar, at::pow(x, s))
EMU_BINARY(PowTensorTensor, at::pow(x, y))
EMU_INPLACE_BINARY(PowTensorTensor, at::pow(x, y))
// aclnnPowScalarTensor(const aclScalar* self, const aclTensor* exponent, aclTensor* out)
EMU_API aclnnStatus aclnnPowScalarTensorGetWorkspaceSize(const aclScalar* self, const aclTensor* exponent,
                                                         aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnPowScalarTensor", self, exponent, out);
  auto b = T(exponent), o = T(out);
  at::Scalar s = S(self);
  return emu::submit("aclnnPowScalarTensor", ws, ex, [=] { o.write(at::pow(s, b.get())); }, any_empty({&b, &o}));
}
ACLNN_RUN(aclnnPowScalarTensor)

// xlogy: x * log(y), 0 where x == 0 (unless y is NaN).
EMU_BINARY(XLogYTensor, at::xlogy(x, y))
EMU_INPLACE_BINARY(XLogYTensor, at::xlogy(x, y))
EMU_BINARY_SCALAR(XLogYScalarOther, at::xlogy(x, s))
EMU_INPLACE_BINARY_SCALAR(XLogYScalarOther, at::xlogy(x, s))
// aclnnXLogYScalarSelf(const aclScalar* self, const aclTensor* other, aclTensor* out)
EMU_API aclnnStatus aclnnXLogYScalarSelfGetWorkspaceSize(const aclScalar* self, const aclTensor* other, aclTensor* out,
                                                         uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnXLogYScalarSelf", self, other, out);
  auto b = T(other), o = T(out);
  at::Scalar s = S(self);
  return emu::submit("aclnnXLogYScalarSelf", ws, ex, [=] { o.write(at::xlogy(s, b.get())); }, any_empty({&b, &o}));
}
ACLNN_RUN(aclnnXLogYScalarSelf)

// Unary math.
EMU_UNARY_BOTH(Neg, at::neg(x))
EMU_UNARY_BOTH(Abs, at::abs(x))
EMU_UNARY_BOTH(Sign, at::sign(x))
EMU_UNARY(Sgn, at::sgn(x))
EMU_UNARY_BOTH(Exp, at::exp(x))
EMU_UNARY_BOTH(Exp2, at::exp2(x))
EMU_UNARY_BOTH(Expm1, at::expm1(x))
EMU_UNARY_BOTH(Log, at::log(x))
EMU_UNARY_BOTH(Log2, at::log2(x))
EMU_UNARY_BOTH(Log10, at::log10(x))
EMU_UNARY_BOTH(Log1p, at::log1p(x))
EMU_UNARY_BOTH(Sqrt, at::sqrt(x))
EMU_UNARY_BOTH(Rsqrt, at::rsqrt(x))
EMU_UNARY_BOTH(Reciprocal, at::reciprocal(x))
EMU_UNARY_BOTH(Floor, at::floor(x))
EMU_UNARY_BOTH(Ceil, at::ceil(x))
EMU_UNARY_BOTH(Round, at::round(x))
EMU_UNARY_BOTH(Trunc, at::trunc(x))
EMU_UNARY_BOTH(Frac, at::frac(x))
EMU_UNARY_BOTH(Sin, at::sin(x))
EMU_UNARY_BOTH(Cos, at::cos(x))
EMU_UNARY_BOTH(Tan, at::tan(x))
EMU_UNARY_BOTH(Tanh, at::tanh(x))
EMU_UNARY_BOTH(Sinh, at::sinh(x))
EMU_UNARY_BOTH(Cosh, at::cosh(x))
EMU_UNARY_BOTH(Asin, at::asin(x))
EMU_UNARY_BOTH(Acos, at::acos(x))
EMU_UNARY_BOTH(Atan, at::atan(x))
EMU_UNARY_BOTH(Erf, at::erf(x))
EMU_UNARY_BOTH(Erfc, at::erfc(x))
EMU_UNARY_BOTH(Sigmoid, at::sigmoid(x))
EMU_UNARY_BOTH(Relu, at::relu(x))
EMU_UNARY_BOTH(Square, at::square(x))
EMU_UNARY(Gelu, at::gelu(x))
// aclnnGeluV2(self, int64_t approximate (0 none, 1 tanh), out)
EMU_API aclnnStatus aclnnGeluV2GetWorkspaceSize(const aclTensor* self, int64_t approximate, aclTensor* out, uint64_t* ws,
                                                aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnGeluV2", self, out);
  auto a = T(self), o = T(out);
  return emu::submit("aclnnGeluV2", ws, ex, [=] { o.write(at::gelu(a.get(), approximate == 1 ? "tanh" : "none")); },
                     any_empty({&a, &o}));
}
ACLNN_RUN(aclnnGeluV2)
EMU_UNARY(Silu, at::silu(x))

// aclnnRoundDecimals(self, int64_t decimals, out)
EMU_API aclnnStatus aclnnRoundDecimalsGetWorkspaceSize(const aclTensor* self, int64_t decimals, aclTensor* out,
                                                       uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnRoundDecimals", self, out);
  auto a = T(self), o = T(out);
  return emu::submit("aclnnRoundDecimals", ws, ex, [=] { o.write(at::round(a.get(), decimals)); },
                     any_empty({&a, &o}));
}
ACLNN_RUN(aclnnRoundDecimals)

// Predicates.
EMU_UNARY(IsInf, at::isinf(x))
EMU_UNARY(IsPosInf, at::isposinf(x))
EMU_UNARY(IsNegInf, at::isneginf(x))
EMU_UNARY(IsFinite, at::isfinite(x))
EMU_UNARY(IsNan, at::isnan(x))

// aclnnIsClose(self, other, double rtol, double atol, bool equalNan, out)
EMU_API aclnnStatus aclnnIsCloseGetWorkspaceSize(const aclTensor* self, const aclTensor* other, double rtol,
                                                 double atol, bool equal_nan, aclTensor* out, uint64_t* ws,
                                                 aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnIsClose", self, other, out);
  auto a = T(self), b = T(other), o = T(out);
  return emu::submit("aclnnIsClose", ws, ex, [=] { o.write(at::isclose(a.get(), b.get(), rtol, atol, equal_nan)); },
                     any_empty({&a, &b, &o}));
}
ACLNN_RUN(aclnnIsClose)

// Comparisons: aclnnXxTensor / aclnnXxScalar and their in-place forms.
EMU_BINARY_ALL(Eq, at::eq(x, y), at::eq(x, s))
EMU_BINARY_ALL(Ne, at::ne(x, y), at::ne(x, s))
EMU_BINARY_ALL(Gt, at::gt(x, y), at::gt(x, s))
EMU_BINARY_ALL(Ge, at::ge(x, y), at::ge(x, s))
EMU_BINARY_ALL(Lt, at::lt(x, y), at::lt(x, s))
EMU_BINARY_ALL(Le, at::le(x, y), at::le(x, s))

// Logical and bitwise.
EMU_BINARY(LogicalAnd, at::logical_and(x, y))
EMU_INPLACE_BINARY(LogicalAnd, at::logical_and(x, y))
EMU_BINARY(LogicalOr, at::logical_or(x, y))
EMU_INPLACE_BINARY(LogicalOr, at::logical_or(x, y))
EMU_BINARY(LogicalXor, at::logical_xor(x, y))
EMU_INPLACE_BINARY(LogicalXor, at::logical_xor(x, y))
EMU_UNARY_BOTH(LogicalNot, at::logical_not(x))
EMU_BINARY_ALL(BitwiseAnd, at::bitwise_and(x, y), at::bitwise_and(x, s))
EMU_BINARY_ALL(BitwiseOr, at::bitwise_or(x, y), at::bitwise_or(x, s))
EMU_BINARY_ALL(BitwiseXor, at::bitwise_xor(x, y), at::bitwise_xor(x, s))
EMU_UNARY_BOTH(BitwiseNot, at::bitwise_not(x))

// ---------------------------------------------------------------------------------------------------------
// Clamp: scalar bounds may be null (unbounded on that side); tensor bounds too.

EMU_API aclnnStatus aclnnClampGetWorkspaceSize(const aclTensor* self, const aclScalar* min, const aclScalar* max,
                                               aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnClamp", self, out);
  auto a = T(self), o = T(out);
  c10::optional<at::Scalar> lo, hi;
  if (min) lo = S(min);
  if (max) hi = S(max);
  return emu::submit("aclnnClamp", ws, ex, [=] { o.write(at::clamp(a.get(), lo, hi)); }, any_empty({&a, &o}));
}
ACLNN_RUN(aclnnClamp)
EMU_BINARY_SCALAR(ClampMin, at::clamp_min(x, s))
EMU_BINARY_SCALAR(ClampMax, at::clamp_max(x, s))
EMU_BINARY(ClampMinTensor, at::clamp_min(x, y))
EMU_BINARY(ClampMaxTensor, at::clamp_max(x, y))
EMU_INPLACE_BINARY(ClampMinTensor, at::clamp_min(x, y))
EMU_INPLACE_BINARY(ClampMaxTensor, at::clamp_max(x, y))
EMU_API aclnnStatus aclnnClampTensorGetWorkspaceSize(const aclTensor* self, const aclTensor* min, const aclTensor* max,
                                                     aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnClampTensor", self, out);
  auto a = T(self), lo = T(min), hi = T(max), o = T(out);
  return emu::submit("aclnnClampTensor", ws, ex, [=] {
    c10::optional<at::Tensor> l, h;
    if (lo.defined) l = lo.get();
    if (hi.defined) h = hi.get();
    o.write(at::clamp(a.get(), l, h));
  }, any_empty({&a, &o}));
}
ACLNN_RUN(aclnnClampTensor)

// ---------------------------------------------------------------------------------------------------------
// where / masked_fill / lerp / addcmul / addcdiv

// aclnnSWhere(const aclTensor* condition, const aclTensor* self, const aclTensor* other, aclTensor* out)
EMU_API aclnnStatus aclnnSWhereGetWorkspaceSize(const aclTensor* condition, const aclTensor* self,
                                                const aclTensor* other, aclTensor* out, uint64_t* ws,
                                                aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnSWhere", condition, self, other, out);
  auto c = T(condition), a = T(self), b = T(other), o = T(out);
  return emu::submit("aclnnSWhere", ws, ex, [=] {
    o.write(at::where(c.get().to(at::kBool), a.get(), b.get()));
  }, any_empty({&c, &a, &b, &o}));
}
ACLNN_RUN(aclnnSWhere)

// aclnnInplaceMaskedFillScalar(aclTensor* selfRef, const aclTensor* mask, const aclScalar* value)
EMU_API aclnnStatus aclnnInplaceMaskedFillScalarGetWorkspaceSize(aclTensor* self, const aclTensor* mask,
                                                                 const aclScalar* value, uint64_t* ws,
                                                                 aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnInplaceMaskedFillScalar", self, mask, value);
  auto a = T(self), m = T(mask);
  if (const aclnnStatus st_ = emu::documented("aclnnInplaceMaskedFillScalar", {&a})) return st_;
  // 161002: selfRef's shape is the broadcast shape of selfRef and mask
  if (!emu::broadcastable(a.sizes, m.sizes) || emu::broadcast_shape(a.sizes, m.sizes) != a.sizes) {
    return emu::reject("aclnnInplaceMaskedFillScalar", ACLNN_ERR_PARAM_INVALID, "mask does not broadcast to selfRef");
  }
  at::Scalar s = S(value);
  return emu::submit("aclnnInplaceMaskedFillScalar", ws, ex, [=] {
    a.write(at::masked_fill(a.get(), m.get().to(at::kBool), s));
  }, any_empty({&a, &m}));
}
ACLNN_RUN(aclnnInplaceMaskedFillScalar)
EMU_API aclnnStatus aclnnInplaceMaskedFillTensorGetWorkspaceSize(aclTensor* self, const aclTensor* mask,
                                                                 const aclTensor* value, uint64_t* ws,
                                                                 aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnInplaceMaskedFillTensor", self, mask, value);
  auto a = T(self), m = T(mask), v = T(value);
  return emu::submit("aclnnInplaceMaskedFillTensor", ws, ex, [=] {
    a.write(at::masked_fill(a.get(), m.get().to(at::kBool), v.get().reshape({})));
  }, any_empty({&a, &m}));
}
ACLNN_RUN(aclnnInplaceMaskedFillTensor)

EMU_API aclnnStatus aclnnLerpGetWorkspaceSize(const aclTensor* self, const aclTensor* end, const aclTensor* weight,
                                              aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnLerp", self, end, weight, out);
  auto a = T(self), e = T(end), w = T(weight), o = T(out);
  return emu::submit("aclnnLerp", ws, ex, [=] { o.write(at::lerp(a.get(), e.get(), w.get())); },
                     any_empty({&a, &e, &w, &o}));
}
ACLNN_RUN(aclnnLerp)
EMU_API aclnnStatus aclnnLerpsGetWorkspaceSize(const aclTensor* self, const aclTensor* end, const aclScalar* weight,
                                               aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnLerps", self, end, weight, out);
  auto a = T(self), e = T(end), o = T(out);
  at::Scalar s = S(weight);
  return emu::submit("aclnnLerps", ws, ex, [=] { o.write(at::lerp(a.get(), e.get(), s)); }, any_empty({&a, &e, &o}));
}
ACLNN_RUN(aclnnLerps)

#define EMU_ADDC(NAME, FN)                                                                                  \
  EMU_API aclnnStatus aclnn##NAME##GetWorkspaceSize(const aclTensor* self, const aclTensor* t1,             \
                                                    const aclTensor* t2, const aclScalar* value,           \
                                                    aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {    \
    ACLNN_CHECK_NOTNULL("aclnn" #NAME, self, t1, t2, out);                                                \
    auto a = T(self), b = T(t1), c = T(t2), o = T(out);                                                    \
    at::Scalar v = value ? S(value) : at::Scalar(1);                                                       \
    return emu::submit("aclnn" #NAME, ws, ex, [=] { o.write(at::FN(a.get(), b.get(), c.get(), v)); },     \
                       any_empty({&a, &b, &c, &o}));                                                       \
  }                                                                                                        \
  ACLNN_RUN(aclnn##NAME)                                                                                   \
  EMU_API aclnnStatus aclnnInplace##NAME##GetWorkspaceSize(aclTensor* self, const aclTensor* t1,            \
                                                           const aclTensor* t2, const aclScalar* value,    \
                                                           uint64_t* ws, aclOpExecutor** ex) {             \
    ACLNN_CHECK_NOTNULL("aclnnInplace" #NAME, self, t1, t2);                                              \
    auto a = T(self), b = T(t1), c = T(t2);                                                                \
    at::Scalar v = value ? S(value) : at::Scalar(1);                                                       \
    return emu::submit("aclnnInplace" #NAME, ws, ex, [=] { a.write(at::FN(a.get(), b.get(), c.get(), v)); }, \
                       any_empty({&a, &b, &c}));                                                           \
  }                                                                                                        \
  ACLNN_RUN(aclnnInplace##NAME)

EMU_ADDC(Addcmul, addcmul)
EMU_ADDC(Addcdiv, addcdiv)
