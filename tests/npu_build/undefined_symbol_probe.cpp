// A shared object with the defect the symbol guard exists for (scripts/check_npu_build.py builds it):
// c10_npu::GetSocVersion() is declared in torch_npu's headers but not exported by libtorch_npu.so, so this
// links and then fails to load. The guard must name the symbol.
#include "torch_npu/csrc/core/npu/NpuVariables.h"

extern "C" int undefined_symbol_probe() {
  return static_cast<int>(c10_npu::GetSocVersion());
}
