// The kernels npu_loss_ops.enable() puts on ATen's loss ops (npu_loss_ops/_enable.py keeps the switch's
// state; docs/usage.md, "Use it in existing code", is the user's description).
#pragma once

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include <string>
#include <utility>
#include <vector>

namespace npu_loss::enable {

// The routing table's rows, one block per loss: (torch.nn.functional name, ATen overload), e.g.
// ("smooth_l1_loss", "smooth_l1_loss_backward.grad_input"). Each ATen overload has an npu_loss overload of
// the same name and schema.
std::vector<std::pair<std::string, std::string>> routes();

// Makes `overloads` (names from routes()) exactly the routed set: every earlier routing kernel is removed,
// then these get theirs. An empty list restores torch's kernels everywhere. Not thread-safe: the caller
// (_enable.py) holds a lock.
void set_routed(const std::vector<std::string>& overloads);

// Whether a routing kernel would call the npu_loss op for these arguments of `overload` (an ATen overload
// name from routes(); `args`: every argument of its schema, in order), rather than torch's own kernel.
bool accepts(const std::string& overload, const std::vector<c10::IValue>& args);

// The schema of a routed ATen overload (a name from routes()), for callers that build its arguments.
const c10::FunctionSchema& aten_schema(const std::string& overload);

}  // namespace npu_loss::enable
