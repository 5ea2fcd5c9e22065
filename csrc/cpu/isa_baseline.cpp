// The dense kernels for the baseline ISA (every x86-64 CPU, and the only ones on other architectures), and
// the choice of instruction set for the process (docs/cpu_kernels.md).
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "isa.h"

#define NPU_LOSS_ISA baseline
#define NPU_LOSS_ISA_BASELINE 1
#include "dense_kernels.h"

namespace npu_loss::cpu {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return "avx512";
    case Isa::Avx2:
      return "avx2";
    case Isa::Baseline:
      break;
  }
  return "baseline";
}

const char* isa_description(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return "x86-64-v4 (AVX512)";
    case Isa::Avx2:
      return "x86-64-v3 (AVX2)";
    case Isa::Baseline:
      break;
  }
#if defined(__x86_64__)
  return "x86-64 baseline (SSE2)";
#elif defined(__aarch64__)
  return "aarch64 baseline (NEON)";
#else
  return "baseline";
#endif
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
  Isa isa;
  if (std::strcmp(name, "avx512") == 0) {
    isa = Isa::Avx512;
  } else if (std::strcmp(name, "avx2") == 0) {
    isa = Isa::Avx2;
  } else if (std::strcmp(name, "baseline") == 0) {
    isa = Isa::Baseline;
  } else {
    throw std::invalid_argument(std::string(source) + "='" + name +
                                "' is not an instruction set: use avx512, avx2 or baseline");
  }
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

const DenseKernels& kernels_for(Isa isa) {
  switch (isa) {
#ifdef NPU_LOSS_HAVE_X86_KERNELS
    case Isa::Avx512:
      return avx512::kKernels;
    case Isa::Avx2:
      return avx2::kKernels;
#endif
    default:
      return baseline::kKernels;
  }
}

}  // namespace npu_loss::cpu
