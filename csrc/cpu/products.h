// The CPU's products for the linear form's chunks (composite/linear.h's ChunkResources): the BLAS over blocks of
// the vocabulary for float32 and float64, torch's own (oneDNN) for bfloat16 and float16 where oneDNN has kernels
// for them, float32 blocks where it has not; and the chunks' buffers in pages of their own.
#pragma once

#include "../composite/linear.h"

namespace npu_loss::cpu {

composite::ChunkResources chunk_resources();

}  // namespace npu_loss::cpu
