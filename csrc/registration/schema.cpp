// The one definition of the npu_loss operator library: every loss's three schemas, written from its
// declaration (losses.h, core/schema.h).
#include <torch/library.h>

#include "../core/schema.h"

TORCH_LIBRARY(npu_loss, m) {
  npu_loss::for_each_loss([&]<typename Loss>() {
    m.def(npu_loss::forward_schema(Loss::decl).c_str());
    m.def(npu_loss::backward_schema(Loss::decl).c_str());
    m.def(npu_loss::backward_out_schema(Loss::decl).c_str());
  });
}
