// The dense kernels for x86-64-v4: AVX-512 F, BW, DQ, VL (dense_kernels.h; selection in isa.cpp).
// Built as isa_avx2.cpp is: the pragma first, no torch header, internal functions only.
#include "isa.h"

#ifdef NPU_LOSS_HAVE_X86_KERNELS
#pragma GCC target("arch=x86-64-v4")
#define NPU_LOSS_ISA avx512
#define NPU_LOSS_ISA_AVX512 1
// GCC 12 warns inside its own avx512fintrin.h (_mm512_undefined_ps feeding the masked forms).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "dense_kernels.h"
#include "row_table.h"

static_assert(npu_loss::cpu::avx512::kLanes == 32, "isa_avx512.cpp must build the AVX-512 kernels (2 x 16 lanes)");
#endif
