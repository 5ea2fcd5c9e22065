// Each instruction set's table of the row members' CPU kernels (isa.h's RowKernels), indexed by the declaration
// (row_index<Loss>): every row member's math header is included here, and the table has a row for each member
// of losses.h's list; a member without a kernel fails to compile (RowKernelOf<Loss> is incomplete).
#pragma once

#include "jsd_kernel.h"
#include "sparse_jsd_kernel.h"
#include "row_kernels.h"

namespace npu_loss::cpu::NPU_LOSS_ISA {
namespace {

constexpr RowKernels row_kernel_table() {
  RowKernels table{};
  for_each_row_loss([&]<typename Loss>() {
    table.of[row_index<Loss>()] = {RowKernelOf<Loss>::run, RowKernelOf<Loss>::scratch_bytes};
  });
  return table;
}

}  // namespace

const RowKernels kRowKernels = row_kernel_table();

}  // namespace npu_loss::cpu::NPU_LOSS_ISA
