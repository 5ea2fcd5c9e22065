// Chip detection, aclnn API presence and private formats for the NPU kernels (see npu_common.h).
#include "npu_common.h"

#include <cctype>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "acl/acl_base_rt.h"  // aclrtGetSocName, aclFormat
#include "op_plugin/include/npu_cpp_extension.h"  // GetOpApiFuncAddr
#include "torch_npu/csrc/core/npu/NPUFormat.h"  // get_npu_format, npu_format_cast

namespace npu_loss::npu {
namespace {

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// The model number after "Ascend" ("Ascend950DT_9571" -> 950), or -1.
int model_number(std::string_view name) {
  constexpr std::string_view kPrefix = "Ascend";
  if (!starts_with(name, kPrefix)) return -1;
  int number = -1;
  for (size_t i = kPrefix.size(); i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i) {
    number = (number < 0 ? 0 : number * 10) + (name[i] - '0');
  }
  return number;
}

}  // namespace

Chip chip_from_soc_name(const std::string& soc_name) {
  const std::string_view name = soc_name;
  // torch_npu's names: Ascend910B1..B4, 910B2C, 910B4-1 (Atlas A2); Ascend910_93xx (Atlas A3). The bare
  // "Ascend910B" is an Atlas A1 part (SocVersion::Ascend910B sits among the 910 A1 versions).
  if (starts_with(name, "Ascend910B") && name.size() > std::string_view("Ascend910B").size()) return Chip::Tbe910B;
  if (starts_with(name, "Ascend910_9")) return Chip::Tbe910B;
  if (starts_with(name, "Ascend310B")) return Chip::CompositeOnly;  // Atlas 200I/500 A2: none of the six APIs
  if (starts_with(name, "Ascend310P") || starts_with(name, "Ascend910")) return Chip::Tbe910;
  // Every SoC at or above Ascend950 runs the regbase kernels, as op-plugin decides by SocVersion >= 950.
  if (model_number(name) >= 950) return Chip::Regbase950;
  return Chip::CompositeOnly;
}

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

const char* chip_family_name(Chip chip) {
  switch (chip) {
    case Chip::Tbe910:
      return "Ascend910/Ascend310P (TBE kernels, no bf16)";
    case Chip::Tbe910B:
      return "Ascend910B/Ascend910_93 (Atlas A2/A3, TBE kernels)";
    case Chip::Regbase950:
      return "Ascend950 (regbase kernels)";
    case Chip::CompositeOnly:
      break;
  }
  return "composite fallback only (Ascend310B or an unknown chip)";
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

bool any_bfloat16(std::initializer_list<const at::Tensor*> tensors) {
  for (const auto* t : tensors) {
    if (t->scalar_type() == at::kBFloat16) return true;
  }
  return false;
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
