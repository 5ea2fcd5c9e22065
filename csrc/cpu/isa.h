// The CPU kernels' instruction sets and the dense kernel table each one provides (docs/cpu_kernels.md).
//
// csrc/cpu/dense_kernels.h is compiled three times on x86-64, by isa_avx512.cpp, isa_avx2.cpp and
// isa_baseline.cpp, each for its instruction set; elsewhere only the baseline exists. selected_isa() (isa.cpp) picks
// one table for the process: best_isa(), or the one NPU_LOSS_OPS_CPU_ISA names. No torch types
// here: the vector translation units must not include torch headers.
#pragma once

#include <cstdint>

#include "../losses.h"

// A loop whose iterations add into acc, vectorized as a reduction (lanes summed in a fixed order).
#if defined(_OPENMP) || defined(__clang__)
#define NPU_LOSS_SIMD_SUM(acc) _Pragma("omp simd reduction(+ : acc)")
#else
#define NPU_LOSS_SIMD_SUM(acc)
#endif

namespace npu_loss::cpu {

enum class Isa : int { Baseline = 0, Avx2 = 1, Avx512 = 2 };


// The storage types of the dense kernels' operands (all operands of one call share it). FloatOfBFloat16 is
// float storage whose values are all bfloat16: the strided route's buffers for bfloat16 inputs, computed
// as the bfloat16 kernels compute (KL's log of a bfloat16 target), so that both routes give the same bits.
enum class DType : int { Float, BFloat16, Half, Double, FloatOfBFloat16 };

// A call's loss and scalar: the loss's index in AllLosses (losses.h, loss_index), and its float scalar
// (smooth L1's beta, Huber's delta) or bool scalar (KL's log_target).
struct LossParams {
  int loss;
  double beta = 0;
  bool flag = false;
};

// Kernels over n elements at the same offsets: element i of each operand is at its pointer + i.
struct DenseKernels {
  // out = gradient(g * scale, x, t); g is one element when g_scalar.
  void (*backward)(const LossParams& loss, DType dtype, const void* g, bool g_scalar, const void* x,
                   const void* t, void* out, int64_t n, double scale);
  // out = loss(x, t)
  void (*forward)(const LossParams& loss, DType dtype, const void* x, const void* t, void* out, int64_t n);
  // The sum of loss(x, t), accumulated in the opmath type, lanes in a fixed order.
  double (*sum)(const LossParams& loss, DType dtype, const void* x, const void* t, int64_t n);
  // The float log and exp the KL kernels use, and their log of bfloat16 values (x must hold bfloat16
  // values), exposed for tests.
  void (*log)(const float* x, float* out, int64_t n);
  void (*exp)(const float* x, float* out, int64_t n);
  void (*log_bf16)(const float* x, float* out, int64_t n);
};

namespace baseline {
extern const DenseKernels kKernels;
}
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NPU_LOSS_HAVE_X86_KERNELS 1
namespace avx2 {
extern const DenseKernels kKernels;
}
namespace avx512 {
extern const DenseKernels kKernels;
}
#endif

// "avx512", "avx2" or "baseline".
const char* isa_name(Isa isa);
// A description for build_info(), e.g. "x86-64-v3 (AVX2, FMA, F16C)".
const char* isa_description(Isa isa);
// The best instruction set this CPU runs and this build has: what runs unless NPU_LOSS_OPS_CPU_ISA says
// otherwise. The AVX-512 kernels have passed the whole suite, the tests over 2^31 elements included, on
// AVX-512 CPUs, and they hold bfloat16 to its roofline where AVX2 does not (docs/cpu_kernels.md).
Isa best_isa();
// best_isa(), or NPU_LOSS_OPS_CPU_ISA's choice; read once. Throws std::invalid_argument for an unknown
// name or an instruction set this CPU or build lacks.
Isa selected_isa();
// Parses a name; throws std::invalid_argument as selected_isa() does.
Isa parse_isa(const char* name, const char* source);
const DenseKernels& kernels_for(Isa isa);

// The selected instruction set's table.
inline const DenseKernels& dense_kernels() {
  static const DenseKernels& k = kernels_for(selected_isa());
  return k;
}

}  // namespace npu_loss::cpu
