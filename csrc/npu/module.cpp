// The Python module _C_npu: importing it (after torch_npu) registers the aclnn kernels for PrivateUse1.
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <string>
#include <vector>

#include "npu_common.h"
#include "rows.h"

PYBIND11_MODULE(_C_npu, m) {
  m.doc() = "npu_loss_ops: the aclnn kernels for Ascend NPUs";
  // Both read aclrtGetSocName(), which needs an initialised device: Python initialises it first.
  m.def("soc_name", [] { return npu_loss::npu::soc_name(); }, "The SoC name aclrtGetSocName() reports.");
  m.def(
      "chip_family", [] { return std::string(npu_loss::npu::chip_family_name(npu_loss::npu::current_chip())); },
      "The Ascend chip family that decides each op's path.");
  m.def(
      "chip_family_of", [](const std::string& soc) {
        return std::string(npu_loss::npu::chip_family_name(npu_loss::npu::chip_from_soc_name(soc)));
      },
      "The family a SoC name maps to (for tests of the mapping).");
  m.def(
      "aclnn_api_available", [](const std::string& api) { return npu_loss::npu::aclnn_api_available(api.c_str()); },
      "Whether the installed CANN has the aclnn API (both phases).");
  m.def(
      "row_members",
      [] {
        std::vector<std::string> members;
        npu_loss::for_each_row_loss([&]<typename Loss>() {
          if constexpr (npu_loss::npu::kHasAclnnPath<Loss>) {
            if (npu_loss::npu::npu_row_math<Loss>().chunk != nullptr) members.push_back(Loss::decl.forward);
          }
        });
        return members;
      },
      "The row members whose chunk math the NPU's row frame runs (npu/rows.h), by their forward op (a member "
      "without an aclnn path runs the composite).");
  m.def("rejected_apis", &npu_loss::npu::rejected_apis,
        "The aclnn APIs this chip's CANN rejected in this process (their calls run the composite since).");
  m.def("_forget_rejected_apis", &npu_loss::npu::forget_rejected_apis,
        "Forget the rejected APIs, so that the next call tries each again (for tests).");
}
