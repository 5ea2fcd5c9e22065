// The choice of instruction set for the process (docs/cpu_kernels.md): which ones this CPU and build run,
// the default, and NPU_LOSS_OPS_CPU_ISA's override. No torch headers, like the kernels it chooses among.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>

#include "isa.h"

namespace npu_loss::cpu {

namespace {

struct IsaInfo {
  const char* name;
  const char* description;
};

// Indexed by Isa.
constexpr IsaInfo kIsaInfo[] = {
#if defined(__x86_64__)
    {"baseline", "x86-64 baseline (SSE2)"},
#elif defined(__aarch64__)
    {"baseline", "aarch64 baseline (NEON)"},
#else
    {"baseline", "baseline"},
#endif
    {"avx2", "x86-64-v3 (AVX2)"},
    {"avx512", "x86-64-v4 (AVX512)"},
};

}  // namespace

const char* isa_name(Isa isa) {
  return kIsaInfo[static_cast<int>(isa)].name;
}

const char* isa_description(Isa isa) {
  return kIsaInfo[static_cast<int>(isa)].description;
}

Isa best_isa() {
#ifdef NPU_LOSS_HAVE_X86_KERNELS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return Isa::Avx512;
  if (__builtin_cpu_supports("x86-64-v3")) return Isa::Avx2;
#endif
  return Isa::Baseline;
}

Isa parse_isa(const char* name, const char* source) {
  int found = -1;
  for (int i = 0; i < static_cast<int>(std::size(kIsaInfo)); ++i) {
    if (std::strcmp(name, kIsaInfo[i].name) == 0) found = i;
  }
  if (found < 0) {
    throw std::invalid_argument(std::string(source) + "='" + name +
                                "' is not an instruction set: use avx512, avx2 or baseline");
  }
  const Isa isa = static_cast<Isa>(found);
  if (static_cast<int>(isa) > static_cast<int>(best_isa())) {
    throw std::invalid_argument(std::string(source) + "='" + name + "': this CPU (or build) runs at most '" +
                                isa_name(best_isa()) + "'");
  }
  return isa;
}


Isa selected_isa() {
  static const Isa isa = [] {
    const char* env = std::getenv("NPU_LOSS_OPS_CPU_ISA");
    return env == nullptr || *env == '\0' ? best_isa() : parse_isa(env, "NPU_LOSS_OPS_CPU_ISA");
  }();
  return isa;
}

// The table `name` of an instruction set's kernels: each x86 set's, or the baseline's (aarch64, and x86
// builds without them).
#ifdef NPU_LOSS_HAVE_X86_KERNELS
#define NPU_LOSS_TABLE_OF(isa, name) \
  ((isa) == Isa::Avx512 ? avx512::name : (isa) == Isa::Avx2 ? avx2::name : baseline::name)
#else
#define NPU_LOSS_TABLE_OF(isa, name) ((void)(isa), baseline::name)
#endif

const DenseKernels& kernels_for(Isa isa) { return NPU_LOSS_TABLE_OF(isa, kKernels); }
const RowKernels& row_kernels_for(Isa isa) { return NPU_LOSS_TABLE_OF(isa, kRowKernels); }

#undef NPU_LOSS_TABLE_OF

}  // namespace npu_loss::cpu
