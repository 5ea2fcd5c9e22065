// Validation, result shapes, dtypes and memory formats for every npu_loss op.
//
// Every backend (CPU kernels, the composite fallback, the NPU kernels) calls these before doing any work,
// so the rules live in one place: docs/validation.md lists them (rule, exception class, message) and
// docs/semantics.md the shapes, dtypes and layouts of results. npu_loss_ops/_checks.py mirrors them rule
// for rule, with the same exception classes and messages (tests/test_errors.py compares the two).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <initializer_list>
#include <utility>

#include "reduction.h"

namespace npu_loss {

constexpr int64_t kMaxDims = 8;

// What an op returns: its shape, its dtype, the shape all inputs broadcast to, and the memory format a
// result this op allocates gets (see result_memory_format; out= tensors keep their own layout).
struct ResultSpec {
  c10::DimVector shape;
  c10::ScalarType dtype;
  c10::DimVector broadcast_shape;
  c10::MemoryFormat memory_format = c10::MemoryFormat::Contiguous;
};

// A named tensor argument, for messages.
using NamedTensor = std::pair<const char*, const at::Tensor*>;

ResultSpec check_smooth_l1_loss(
    const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta);
ResultSpec check_smooth_l1_loss_backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
    int64_t reduction, double beta);
ResultSpec check_l1_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction);
ResultSpec check_l1_loss_backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
    int64_t reduction);
ResultSpec check_kl_div(const at::Tensor& self, const at::Tensor& target, int64_t reduction);
ResultSpec check_kl_div_target_backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
    int64_t reduction);

// How an out= tensor's dtype is constrained.
enum class OutDtype {
  AnyFloating,   // any accepted floating dtype (the result is cast into it)
  EqualsResult,  // exactly the result's dtype (grad_target must have target's dtype)
};

// Validates an out= tensor against the result it will receive: defined, same device, dtype, exact shape,
// no internal overlap, and no partial overlap with any input (an exact alias is allowed only where the
// result has the broadcast shape).
void check_out(
    const char* op, const char* name, const at::Tensor& out, const ResultSpec& spec, OutDtype rule,
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
at::Tensor empty_result(const ResultSpec& spec, const at::TensorOptions& options);

// `t` itself when it is dense in `format`, else a copy that is (Tensor::contiguous(format) without the
// NPU's restriction to the contiguous format).
at::Tensor with_memory_format(const at::Tensor& t, c10::MemoryFormat format);

// The checks of an out= overload: its op's checks, then check_out on the out tensor. Every backend's out=
// kernel starts with one of these.
ResultSpec check_smooth_l1_loss_backward_out(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta, const at::Tensor& grad_input);
ResultSpec check_l1_loss_backward_out(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    const at::Tensor& grad_input);
ResultSpec check_kl_div_target_backward_out(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    const at::Tensor& grad_target);

// float64 runs on CPU and the fallback, never on the NPU.
bool float64_allowed(const at::Tensor& t);

}  // namespace npu_loss
