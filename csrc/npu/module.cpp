// The Python module _C_npu: importing it (after torch_npu) registers the aclnn kernels for PrivateUse1.
#include <torch/extension.h>

#include <string>

#include "npu_common.h"

namespace {

// Which chip family this process runs on, i.e. which path each op takes (see README, "On Ascend NPU").
std::string chip_family() {
  switch (npu_loss::npu::current_chip()) {
    case npu_loss::npu::Chip::A2A3:
      return "Ascend910B/Ascend910_93 (Atlas A2/A3)";
    case npu_loss::npu::Chip::Ascend950:
      return "Ascend950";
    case npu_loss::npu::Chip::Legacy:
      break;
  }
  return "Ascend910/Ascend310P (or unknown)";
}

}  // namespace

PYBIND11_MODULE(_C_npu, m) {
  m.doc() = "npu_loss_ops: the aclnn kernels for Ascend NPUs";
  m.def("chip_family", &chip_family, "The Ascend chip family that decides each op's path.");
}
