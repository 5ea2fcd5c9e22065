#include "checks.h"

#include <ATen/native/TypeProperties.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <sstream>
#include <string>

namespace npu_loss {
namespace {

std::string dtype_name(c10::ScalarType dtype) {
  return std::string(c10::getDtypeNames(dtype).first);
}

std::string shape_str(c10::IntArrayRef shape) {
  std::ostringstream s;
  s << shape;
  return s.str();
}

void check_defined(const char* op, std::initializer_list<NamedTensor> tensors) {
  for (const auto& [name, t] : tensors) {
    TORCH_CHECK(t->defined(), op, ": ", name, " must be a defined tensor, got an undefined tensor (None)");
  }
}

void check_same_device(const char* op, std::initializer_list<NamedTensor> tensors) {
  const auto& [first_name, first] = *tensors.begin();
  for (const auto& [name, t] : tensors) {
    TORCH_CHECK(
        t->device() == first->device(), op, ": expected all tensors on the same device, but ", name,
        " is on ", t->device(), " and ", first_name, " is on ", first->device());
  }
}

bool is_accepted_dtype(c10::ScalarType dtype, bool allow_float64) {
  return dtype == c10::kFloat || dtype == c10::kHalf || dtype == c10::kBFloat16 ||
      (allow_float64 && dtype == c10::kDouble);
}

const char* accepted_dtypes(bool allow_float64) {
  return allow_float64 ? "float32, float64, float16 or bfloat16" : "float32, float16 or bfloat16";
}

void check_dtypes(const char* op, std::initializer_list<NamedTensor> tensors) {
  for (const auto& [name, t] : tensors) {
    const bool allow_float64 = float64_allowed(*t);
    TORCH_CHECK_TYPE(
        is_accepted_dtype(t->scalar_type(), allow_float64), op, ": ", name, " must have dtype ",
        accepted_dtypes(allow_float64), " on ", t->device().type(), ", got ", dtype_name(t->scalar_type()));
  }
}

void check_reduction(const char* op, int64_t reduction) {
  TORCH_CHECK_VALUE(
      is_valid_reduction(reduction), op, ": reduction must be 0 (none), 1 (mean) or 2 (sum), got ",
      reduction);
}

void check_beta(const char* op, double beta) {
  // Written so that NaN fails too.
  TORCH_CHECK_VALUE(beta >= 0, op, ": beta must be >= 0, got ", beta);
}

void check_dims(const char* op, std::initializer_list<NamedTensor> tensors) {
  for (const auto& [name, t] : tensors) {
    TORCH_CHECK(
        t->dim() <= kMaxDims, op, ": ", name, " has ", t->dim(), " dimensions, but at most ", kMaxDims,
        " are supported");
  }
}

// NumPy broadcasting of the named tensors' shapes; a clear error naming all of them when impossible.
c10::DimVector broadcast_shapes(const char* op, std::initializer_list<NamedTensor> tensors) {
  int64_t ndim = 0;
  for (const auto& nt : tensors) ndim = std::max<int64_t>(ndim, nt.second->dim());
  c10::DimVector shape(ndim, 1);
  bool ok = true;
  for (const auto& nt : tensors) {
    const auto sizes = nt.second->sizes();
    const int64_t offset = ndim - static_cast<int64_t>(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto& s = shape[offset + i];
      if (sizes[i] == s || sizes[i] == 1) continue;
      if (s == 1) {
        s = sizes[i];
      } else {
        ok = false;
      }
    }
  }
  if (!ok) {
    std::ostringstream names;
    size_t i = 0;
    for (const auto& [name, t] : tensors) {
      names << (i == 0 ? "" : (i + 1 == tensors.size() ? " and " : ", ")) << name << " " << t->sizes();
      ++i;
    }
    TORCH_CHECK(false, op, ": shapes cannot be broadcast together: ", names.str());
  }
  return shape;
}

c10::ScalarType result_type_of(std::initializer_list<NamedTensor> tensors) {
  at::native::ResultTypeState state;
  for (const auto& nt : tensors) state = at::native::update_result_type_state(*nt.second, state);
  return at::native::result_type(state);
}

// The first checks every loss shares, in the order _fake.py runs them too.
void check_common(const char* op, std::initializer_list<NamedTensor> tensors, int64_t reduction) {
  check_defined(op, tensors);
  check_same_device(op, tensors);
  check_dtypes(op, tensors);
  check_reduction(op, reduction);
}

struct MemorySpan {
  const void* storage;
  int64_t begin;  // in bytes, inclusive
  int64_t end;    // in bytes, exclusive
};

MemorySpan memory_span(const at::Tensor& t) {
  const int64_t item = static_cast<int64_t>(t.element_size());
  int64_t extent = 1;
  for (int64_t d = 0; d < t.dim(); ++d) extent += (t.size(d) - 1) * t.stride(d);
  const int64_t begin = t.storage_offset() * item;
  return {t.storage().unsafeGetStorageImpl(), begin, begin + extent * item};
}

bool has_internal_overlap(const at::Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1 && t.stride(d) == 0) return true;
  }
  return false;
}

bool is_exact_alias(const at::Tensor& a, const at::Tensor& b) {
  return a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl() &&
      a.storage_offset() * a.element_size() == b.storage_offset() * b.element_size() &&
      a.element_size() == b.element_size() && a.sizes() == b.sizes() && a.strides() == b.strides();
}

bool shares_memory(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0 || !a.has_storage() || !b.has_storage()) return false;
  const auto sa = memory_span(a);
  const auto sb = memory_span(b);
  return sa.storage == sb.storage && sa.begin < sb.end && sb.begin < sa.end;
}

}  // namespace

bool float64_allowed(const at::Tensor& t) {
  return t.device().type() != c10::DeviceType::PrivateUse1;
}

c10::MemoryFormat result_memory_format(
    c10::IntArrayRef shape, std::initializer_list<const at::Tensor*> operands_by_priority) {
  if (shape.size() != 4 && shape.size() != 5) return c10::MemoryFormat::Contiguous;
  for (const auto* t : operands_by_priority) {
    if (t->sizes() == shape) return t->suggest_memory_format();
  }
  return c10::MemoryFormat::Contiguous;
}

at::Tensor empty_with_format(c10::IntArrayRef sizes, const at::TensorOptions& options, c10::MemoryFormat format) {
  switch (format) {
    case c10::MemoryFormat::ChannelsLast:
      return at::empty_strided(sizes, c10::get_channels_last_strides_2d(sizes), options);
    case c10::MemoryFormat::ChannelsLast3d:
      return at::empty_strided(sizes, c10::get_channels_last_strides_3d(sizes), options);
    default:
      return at::empty(sizes, options);
  }
}

at::Tensor empty_result(const ResultSpec& spec, const at::TensorOptions& options) {
  return empty_with_format(spec.shape, options.dtype(spec.dtype), spec.memory_format);
}

at::Tensor with_memory_format(const at::Tensor& t, c10::MemoryFormat format) {
  // contiguous() also serves symbolic shapes (torch.compile); only the NPU needs the explicit copy.
  if (format == c10::MemoryFormat::Contiguous || t.device().type() != c10::DeviceType::PrivateUse1) {
    return t.contiguous(format);
  }
  return t.is_contiguous(format) ? t : empty_with_format(t.sizes(), t.options(), format).copy_(t);
}

ResultSpec check_smooth_l1_loss(
    const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
  constexpr const char* op = "smooth_l1_loss";
  const std::initializer_list<NamedTensor> args = {{"self", &self}, {"target", &target}};
  check_common(op, args, reduction);
  check_beta(op, beta);
  check_dims(op, args);
  auto b = broadcast_shapes(op, args);
  c10::DimVector shape = reduction == kNone ? b : c10::DimVector{};
  const auto format = result_memory_format(shape, {&self, &target});
  return {shape, result_type_of(args), b, format};
}

ResultSpec check_smooth_l1_loss_backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta) {
  constexpr const char* op = "smooth_l1_loss_backward";
  const std::initializer_list<NamedTensor> args = {
      {"grad_output", &grad_output}, {"self", &self}, {"target", &target}};
  check_common(op, args, reduction);
  check_beta(op, beta);
  check_dims(op, args);
  auto b = broadcast_shapes(op, args);
  return {b, self.scalar_type(), b, result_memory_format(b, {&self, &target, &grad_output})};
}

ResultSpec check_l1_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  constexpr const char* op = "l1_loss";
  const std::initializer_list<NamedTensor> args = {{"self", &self}, {"target", &target}};
  check_common(op, args, reduction);
  check_dims(op, args);
  auto b = broadcast_shapes(op, args);
  c10::DimVector shape = reduction == kNone ? b : c10::DimVector{};
  const auto format = result_memory_format(shape, {&self, &target});
  return {shape, result_type_of(args), b, format};
}

ResultSpec check_l1_loss_backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  constexpr const char* op = "l1_loss_backward";
  const std::initializer_list<NamedTensor> args = {
      {"grad_output", &grad_output}, {"self", &self}, {"target", &target}};
  check_common(op, args, reduction);
  check_dims(op, args);
  auto b = broadcast_shapes(op, args);
  return {b, result_type_of(args), b, result_memory_format(b, {&self, &target, &grad_output})};
}

ResultSpec check_kl_div(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  constexpr const char* op = "kl_div";
  const std::initializer_list<NamedTensor> args = {{"self", &self}, {"target", &target}};
  check_common(op, args, reduction);
  check_dims(op, args);
  auto b = broadcast_shapes(op, args);
  c10::DimVector shape = reduction == kNone ? b : c10::DimVector{};
  const auto format = result_memory_format(shape, {&self, &target});
  return {shape, result_type_of(args), b, format};
}

ResultSpec check_kl_div_target_backward(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  constexpr const char* op = "kl_div_target_backward";
  const std::initializer_list<NamedTensor> args = {
      {"grad_output", &grad_output}, {"self", &self}, {"target", &target}};
  check_common(op, args, reduction);
  check_dims(op, args);
  auto b = broadcast_shapes(op, {{"self", &self}, {"target", &target}});
  auto with_grad = broadcast_shapes(op, args);
  TORCH_CHECK(
      with_grad == b, op, ": grad_output of shape ", grad_output.sizes(),
      " must broadcast to the shape of broadcast(self, target) ", c10::IntArrayRef(b),
      " without enlarging it");
  return {c10::DimVector(target.sizes()), target.scalar_type(), b,
          result_memory_format(target.sizes(), {&target})};
}

void check_out(
    const char* op, const char* name, const at::Tensor& out, const ResultSpec& spec, OutDtype rule,
    std::initializer_list<NamedTensor> inputs) {
  TORCH_CHECK(out.defined(), op, ": ", name, " must be a defined tensor, got an undefined tensor (None)");
  const auto& first = *inputs.begin();
  TORCH_CHECK(
      out.device() == first.second->device(), op, ": expected all tensors on the same device, but ", name,
      " is on ", out.device(), " and ", first.first, " is on ", first.second->device());
  if (rule == OutDtype::EqualsResult) {
    TORCH_CHECK_TYPE(
        out.scalar_type() == spec.dtype, op, ": ", name, " must have dtype ", dtype_name(spec.dtype),
        " (the result's dtype), got ", dtype_name(out.scalar_type()));
  } else {
    const bool allow_float64 = float64_allowed(out);
    TORCH_CHECK_TYPE(
        is_accepted_dtype(out.scalar_type(), allow_float64), op, ": ", name, " must have dtype ",
        accepted_dtypes(allow_float64), " on ", out.device().type(), ", got ", dtype_name(out.scalar_type()));
  }
  TORCH_CHECK(
      out.sizes() == c10::IntArrayRef(spec.shape), op, ": ", name, " must have shape ",
      shape_str(spec.shape), " (the result's shape), got ", out.sizes());
  TORCH_CHECK(
      !has_internal_overlap(out), op, ": ", name,
      " must not overlap itself (expanded or stride-0 outputs are not supported)");
  const bool alias_allowed = spec.shape == spec.broadcast_shape;
  for (const auto& [input_name, input] : inputs) {
    if (!shares_memory(out, *input)) continue;
    TORCH_CHECK(
        alias_allowed && is_exact_alias(out, *input), op, ": ", name, " overlaps ", input_name,
        "; it must be a separate tensor",
        alias_allowed ? std::string(" or exactly ") + input_name : std::string(""));
  }
}

ResultSpec check_smooth_l1_loss_backward_out(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    double beta, const at::Tensor& grad_input) {
  auto spec = check_smooth_l1_loss_backward(grad_output, self, target, reduction, beta);
  check_out(
      "smooth_l1_loss_backward", "grad_input", grad_input, spec, OutDtype::AnyFloating,
      {{"grad_output", &grad_output}, {"self", &self}, {"target", &target}});
  return spec;
}

ResultSpec check_l1_loss_backward_out(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    const at::Tensor& grad_input) {
  auto spec = check_l1_loss_backward(grad_output, self, target, reduction);
  check_out(
      "l1_loss_backward", "grad_input", grad_input, spec, OutDtype::AnyFloating,
      {{"grad_output", &grad_output}, {"self", &self}, {"target", &target}});
  return spec;
}

ResultSpec check_kl_div_target_backward_out(
    const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction,
    const at::Tensor& grad_target) {
  auto spec = check_kl_div_target_backward(grad_output, self, target, reduction);
  check_out(
      "kl_div_target_backward", "grad_target", grad_target, spec, OutDtype::EqualsResult,
      {{"grad_output", &grad_output}, {"self", &self}, {"target", &target}});
  return spec;
}

}  // namespace npu_loss
