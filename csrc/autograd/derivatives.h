// The ops that have a derivatives block (derivatives.cpp) or a row loss's Autograd kernel (rows.cpp), for the
// test that every registered op has a block in every per-op table (docs/adding_a_loss.md).
#pragma once

#include <string>
#include <vector>

namespace npu_loss::autograd {

std::vector<std::string> differentiable_ops();

}  // namespace npu_loss::autograd
