// The one definition of the npu_loss operator library: every loss's three schemas, written from its
// declaration (losses.h, core/schema.h).
#include <torch/library.h>

#include "../core/schema.h"

TORCH_LIBRARY(npu_loss, m) {
  npu_loss::for_each_loss([&]<typename Loss>() {
    for (const auto& schema : npu_loss::schemas(Loss::decl)) m.def(schema.c_str());
  });
}
