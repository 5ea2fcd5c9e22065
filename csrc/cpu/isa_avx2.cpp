// The dense kernels for x86-64-v3: AVX2, FMA, F16C (dense_kernels.h; selection in isa.cpp).
// The pragma comes before every include, so all of this translation unit is built for that level; it
// includes no torch header and all its functions are internal, so none of its code is shared with callers
// built for the baseline.
#include "isa.h"

#ifdef NPU_LOSS_HAVE_X86_KERNELS
#pragma GCC target("arch=x86-64-v3")
#define NPU_LOSS_ISA avx2
#define NPU_LOSS_ISA_AVX2 1
#include "dense_kernels.h"
#include "row_table.h"

static_assert(npu_loss::cpu::avx2::kLanes == 16, "isa_avx2.cpp must build the AVX2 kernels (2 x 8 lanes)");
#endif
