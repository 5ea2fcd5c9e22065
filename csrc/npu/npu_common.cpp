// This process's chip, the path of a call on it, aclnn API presence and private formats (see npu_common.h).
#include "npu_common.h"

#include <atomic>
#include <mutex>
#include <set>
#include <unordered_map>

#include <c10/util/Exception.h>
#include <torch/csrc/Exceptions.h>  // torch::PyWarningHandler

// aclrtGetSocName, aclFormat: declared in acl_base.h or in the acl_base_rt.h it includes (torch-npu 2.8.0 ships
// no acl_base_rt.h).
#include "acl/acl_base.h"
#include "op_plugin/include/npu_cpp_extension.h"  // GetOpApiFuncAddr
#include "torch_npu/csrc/core/npu/NPUFormat.h"  // get_npu_format, npu_format_cast

namespace npu_loss::npu {
namespace {

struct ChipInfo {
  std::string name;
  Chip family;
};

const ChipInfo& chip_info() {
  static const ChipInfo info = [] {
    const char* name = aclrtGetSocName();
    std::string soc = name == nullptr ? std::string() : std::string(name);
    return ChipInfo{soc, chip_from_soc_name(soc)};
  }();
  return info;
}

}  // namespace

const std::string& soc_name() {
  return chip_info().name;
}

Chip current_chip() {
  return chip_info().family;
}

bool aclnn_api_available(const char* name) {
  static std::mutex mutex;
  static std::unordered_map<std::string, bool> found;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = found.find(name);
  if (it == found.end()) {
    const std::string api(name);
    const bool present = GetOpApiFuncAddr((api + "GetWorkspaceSize").c_str()) != nullptr &&
        GetOpApiFuncAddr(api.c_str()) != nullptr;
    it = found.emplace(api, present).first;
  }
  return it->second;
}

namespace {

// The APIs rejected in this process; `any_rejected` lets the calls of a process without one skip the lock.
std::atomic<bool> any_rejected{false};
std::mutex rejected_mutex;
std::set<std::string>& rejected_api_set() {
  static std::set<std::string> apis;
  return apis;
}

}  // namespace

void throw_rejected(const char* api, int32_t status) {
  const std::string name = soc_name();
  throw AclnnRejected(api, status,
                      std::string(api) + "GetWorkspaceSize returned status " + std::to_string(status) + " on " +
                          (name.empty() ? std::string("this NPU") : name) + " (" + chip_family_name(current_chip()) +
                          "); nothing of the call was enqueued");
}

void note_rejection(const AclnnRejected& rejected) {
  bool first = false;
  {
    const std::lock_guard<std::mutex> lock(rejected_mutex);
    first = rejected_api_set().insert(rejected.api).second;
    any_rejected.store(true, std::memory_order_release);
  }
  if (first) {
    // A Python UserWarning where it is raised: torch.ops' calls install no Python warning handler of their own
    // (a bare TORCH_WARN would only reach stderr), so this scope's handler turns it into one (taking the GIL),
    // and raises it under an "error" filter. In a backward, the engine's thread does the same.
    const torch::PyWarningHandler to_python;
    TORCH_WARN("npu_loss_ops: this chip's CANN rejected ", rejected.api, " (", rejected.what(),
               "). The loss runs its composite of torch_npu ops instead, here and in every later call of this process "
               "that would use ", rejected.api, " (docs/npu_paths.md, \"A rejected aclnn call\").");
  }
}

bool api_rejected(const char* api) {
  if (!any_rejected.load(std::memory_order_acquire)) return false;
  const std::lock_guard<std::mutex> lock(rejected_mutex);
  return rejected_api_set().count(api) != 0;
}

std::vector<std::string> rejected_apis() {
  const std::lock_guard<std::mutex> lock(rejected_mutex);
  const auto& apis = rejected_api_set();
  return {apis.begin(), apis.end()};
}

void forget_rejected_apis() {
  const std::lock_guard<std::mutex> lock(rejected_mutex);
  rejected_api_set().clear();
  any_rejected.store(false, std::memory_order_release);
}

DtypeClass dtype_class(std::initializer_list<const at::Tensor*> tensors) {
  for (const auto* t : tensors) {
    if (t->scalar_type() == at::kBFloat16) return DtypeClass::BFloat16;
  }
  return DtypeClass::NoBFloat16;
}

Dtype path_dtype(c10::ScalarType dtype) {
  return dtype == at::kFloat ? Dtype::Float32 : (dtype == at::kHalf ? Dtype::Float16 : Dtype::BFloat16);
}

bool has_private_format(const at::Tensor& t) {
  switch (at_npu::native::get_npu_format(t)) {
    case ACL_FORMAT_NCHW:
    case ACL_FORMAT_NHWC:
    case ACL_FORMAT_ND:
    case ACL_FORMAT_HWCN:
    case ACL_FORMAT_NDHWC:
    case ACL_FORMAT_NCDHW:
    case ACL_FORMAT_NCL:
      return false;
    default:
      return true;
  }
}

at::Tensor base_format(const at::Tensor& t) {
  return has_private_format(t) ? at_npu::native::npu_format_cast(t, ACL_FORMAT_ND) : t;
}

at::Tensor base_format_out(const at::Tensor& out) {
  return has_private_format(out) ? at::empty(out.sizes(), out.options()) : out;
}

void copy_back(at::Tensor& out, const at::Tensor& result) {
  if (result.is_same(out)) return;
  if (!has_private_format(out)) {
    out.copy_(result);
    return;
  }
  // torch_npu copies into a private-format tensor only from one of the same format (Ascend 950 refuses
  // anything else): cast the result to out's format and dtype first.
  out.copy_(at_npu::native::npu_format_cast(result.to(out.scalar_type()), at_npu::native::get_npu_format(out)));
}

}  // namespace npu_loss::npu
