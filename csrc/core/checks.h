// Validation, result shapes, dtypes and memory formats for every npu_loss op: every rule exists once, here.
//
// Every backend (CPU kernels, the composite fallback, the NPU kernels) calls these before doing any work,
// and the Meta kernels (meta_kernels.cpp) call the same rules on SymInt sizes, so fake and meta tensors
// (torch.compile, torch.export, opcheck) are validated and shaped exactly as real ones. docs/validation.md
// lists the rules (rule, exception class, message) and docs/semantics.md the shapes, dtypes and layouts of
// results.
//
// Each rule is written once, as a template over the size type: `check_l1_loss(...)` checks real tensors
// (int64_t sizes, a ResultSpec), `check_l1_loss<c10::SymInt>(...)` fake and meta tensors, whose sizes may be
// symbolic (a SymResultSpec). checks.cpp instantiates both.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>
#include <c10/util/DimVector.h>
#include <c10/util/SmallVector.h>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "reduction.h"

namespace npu_loss {

constexpr int64_t kMaxDims = 8;

// What an op returns: its shape, its dtype, the shape all inputs broadcast to, and the memory format a
// result this op allocates gets (see result_memory_format; out= tensors keep their own layout).
template <typename Int>
struct BasicResultSpec {
  c10::SmallVector<Int, c10::kDimVectorStaticSize> shape;  // c10::DimVector / c10::SymDimVector
  c10::ScalarType dtype;
  c10::SmallVector<Int, c10::kDimVectorStaticSize> broadcast_shape;
  c10::MemoryFormat memory_format = c10::MemoryFormat::Contiguous;
};

using ResultSpec = BasicResultSpec<int64_t>;
using SymResultSpec = BasicResultSpec<c10::SymInt>;

// A named tensor argument, for messages.
using NamedTensor = std::pair<const char*, const at::Tensor*>;

template <typename Int = int64_t>
BasicResultSpec<Int> check_smooth_l1_loss(
    const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta);
template <typename Int = int64_t>
BasicResultSpec<Int> check_smooth_l1_loss_backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta);
template <typename Int = int64_t>
BasicResultSpec<Int> check_huber_loss(
    const at::Tensor& self, const at::Tensor& target, int64_t reduction, double delta);
template <typename Int = int64_t>
BasicResultSpec<Int> check_huber_loss_backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double delta);
template <typename Int = int64_t>
BasicResultSpec<Int> check_l1_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction);
template <typename Int = int64_t>
BasicResultSpec<Int> check_l1_loss_backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction);
template <typename Int = int64_t>
BasicResultSpec<Int> check_kl_div(const at::Tensor& self, const at::Tensor& target, int64_t reduction);
template <typename Int = int64_t>
BasicResultSpec<Int> check_kl_div_target_backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction);

// How an out= tensor's dtype is constrained.
enum class OutDtype {
  AnyFloating,   // any accepted floating dtype (the result is cast into it)
  EqualsResult,  // exactly the result's dtype (grad_target must have target's dtype)
};

// Validates an out= tensor against the result it will receive: defined, same device, dtype, exact shape,
// no internal overlap, and no partial overlap with any input (an exact alias is allowed only where the
// result has the broadcast shape). For ResultSpec and SymResultSpec.
template <typename Int>
void check_out(
    const char* op, const char* name, const at::Tensor& out, const BasicResultSpec<Int>& spec, OutDtype rule,
    std::initializer_list<NamedTensor> inputs);

// The layout of an op's result, as TensorIterator lays out an elementwise output: the suggested memory
// format (channels_last for a 4-D NHWC tensor, channels_last_3d for a 5-D NDHWC one, else contiguous) of
// the first operand, in priority order, that has the result's full shape; contiguous when none has it.
// docs/semantics.md ("Memory format") lists each op's operand order.
c10::MemoryFormat result_memory_format(
    c10::IntArrayRef shape, std::initializer_list<const at::Tensor*> operands_by_priority);

// A new tensor of `sizes` laid out in `format`. Made with empty_strided, which every backend supports
// (torch_npu creates tensors in the contiguous format only, but takes any strides).
at::Tensor empty_with_format(c10::IntArrayRef sizes, const at::TensorOptions& options, c10::MemoryFormat format);

// A new tensor for `spec`'s result: its shape, dtype and memory format, with `options`' device.
template <typename Int>
at::Tensor empty_result(const BasicResultSpec<Int>& spec, const at::TensorOptions& options);

// `t` itself when it is dense in `format`, else a copy that is (Tensor::contiguous(format) without the
// NPU's restriction to the contiguous format).
at::Tensor with_memory_format(const at::Tensor& t, c10::MemoryFormat format);

// The checks of an out= overload: its op's checks, then check_out on the out tensor. Every backend's out=
// kernel starts with one of these; the Meta kernels with its SymInt form.
template <typename Int = int64_t>
BasicResultSpec<Int> check_smooth_l1_loss_backward_out(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta, const at::Tensor& grad_input);
template <typename Int = int64_t>
BasicResultSpec<Int> check_huber_loss_backward_out(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double delta, const at::Tensor& grad_input);
template <typename Int = int64_t>
BasicResultSpec<Int> check_l1_loss_backward_out(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    const at::Tensor& grad_input);
template <typename Int = int64_t>
BasicResultSpec<Int> check_kl_div_target_backward_out(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    const at::Tensor& grad_target);

// float64 runs on CPU and the fallback, never on the NPU.
bool float64_allowed(const at::Tensor& t);

// The ops and out= overloads the functions above check, by schema name ("l1_loss",
// "l1_loss_backward.grad_input"): the rule table's rows, which the tests compare with the registered ops.
const std::vector<std::string>& checked_ops();

}  // namespace npu_loss
