// The dense kernels for the baseline ISA: every x86-64 CPU, and the only ones on other architectures
// (dense_kernels.h; the choice among the instruction sets is in isa.cpp).
#include "isa.h"

#define NPU_LOSS_ISA baseline
#define NPU_LOSS_ISA_BASELINE 1
#include "dense_kernels.h"
#include "row_table.h"
