#include "checks.h"

#include <ATen/native/TypeProperties.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/where.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace npu_loss {
namespace {

// A tensor's geometry in the size type Int: concrete for real tensors, symbolic (SymInt) for the fake and
// meta tensors of the Meta kernels. Every rule below reads sizes, strides and offsets through this only.
template <typename Int>
struct Geometry;

template <>
struct Geometry<int64_t> {
  static c10::IntArrayRef sizes(const at::Tensor& t) { return t.sizes(); }
  static c10::IntArrayRef strides(const at::Tensor& t) { return t.strides(); }
  static int64_t storage_offset(const at::Tensor& t) { return t.storage_offset(); }
  static int64_t numel(const at::Tensor& t) { return t.numel(); }
};

template <>
struct Geometry<c10::SymInt> {
  static c10::SymIntArrayRef sizes(const at::Tensor& t) { return t.sym_sizes(); }
  static c10::SymIntArrayRef strides(const at::Tensor& t) { return t.sym_strides(); }
  static c10::SymInt storage_offset(const at::Tensor& t) { return t.sym_storage_offset(); }
  static c10::SymInt numel(const at::Tensor& t) { return t.sym_numel(); }
};

template <typename Int>
using Shape = c10::SmallVector<Int, c10::kDimVectorStaticSize>;

std::string dtype_name(c10::ScalarType dtype) {
  return std::string(c10::getDtypeNames(dtype).first);
}

template <typename Int>
std::string shape_str(c10::ArrayRef<Int> shape) {
  std::ostringstream s;
  s << shape;
  return s.str();
}

// The type of the device a tensor is on, for the rules that depend on it. A FakeTensor (torch.compile,
// torch.export, opcheck) reaches its Meta kernel reporting the meta device, but keeps the backend of the
// device it stands for in its dispatch keys (FakeTensorMode builds it that way): read there, a fake tensor
// is checked as the tensor it stands for, with the same messages.
c10::DeviceType device_type(const at::Tensor& t) {
  const c10::DeviceType type = t.device().type();
  if (type != c10::DeviceType::Meta) return type;
  const c10::BackendComponent backend = t.key_set().highestBackendKey();
  if (backend == c10::BackendComponent::InvalidBit || backend == c10::BackendComponent::MetaBit) return type;
  return c10::dispatchKeyToDeviceType(c10::toRuntimePerBackendFunctionalityKey(c10::DispatchKey::Dense, backend));
}

// Where a tensor is, for a device-mismatch message: the device type when the two differ in type ("cpu",
// "meta", "npu" — all a fake tensor can tell), the full device ("npu:1") when only the index differs.
std::string device_str(const at::Tensor& t, bool types_differ) {
  std::ostringstream s;
  if (types_differ) {
    s << device_type(t);
  } else {
    s << t.device();
  }
  return s.str();
}

// Rule 2 (and 9, for out=): `t` is on `first`'s device.
void check_same_device(const char* op, const char* name, const at::Tensor& t, const NamedTensor& first) {
  const at::Tensor& f = *first.second;
  const bool types_differ = device_type(t) != device_type(f);
  TORCH_CHECK(
      !types_differ && t.device() == f.device(), op, ": expected all tensors on the same device, but ", name,
      " is on ", device_str(t, types_differ), " and ", first.first, " is on ", device_str(f, types_differ));
}

void check_defined(const char* op, std::initializer_list<NamedTensor> tensors) {
  for (const auto& [name, t] : tensors) {
    TORCH_CHECK(t->defined(), op, ": ", name, " must be a defined tensor, got an undefined tensor (None)");
  }
}

void check_same_device(const char* op, std::initializer_list<NamedTensor> tensors) {
  for (const auto& [name, t] : tensors) check_same_device(op, name, *t, *tensors.begin());
}

bool is_accepted_dtype(c10::ScalarType dtype, bool allow_float64) {
  return dtype == c10::kFloat || dtype == c10::kHalf || dtype == c10::kBFloat16 ||
      (allow_float64 && dtype == c10::kDouble);
}

const char* accepted_dtypes(bool allow_float64) {
  return allow_float64 ? "float32, float64, float16 or bfloat16" : "float32, float16 or bfloat16";
}

void check_dtype(const char* op, const char* name, const at::Tensor& t) {
  const bool allow_float64 = float64_allowed(t);
  TORCH_CHECK_TYPE(
      is_accepted_dtype(t.scalar_type(), allow_float64), op, ": ", name, " must have dtype ",
      accepted_dtypes(allow_float64), " on ", device_type(t), ", got ", dtype_name(t.scalar_type()));
}

void check_dtypes(const char* op, std::initializer_list<NamedTensor> tensors) {
  for (const auto& [name, t] : tensors) check_dtype(op, name, *t);
}

void check_reduction(const char* op, int64_t reduction) {
  TORCH_CHECK_VALUE(
      is_valid_reduction(reduction), op, ": reduction must be 0 (none), 1 (mean) or 2 (sum), got ",
      reduction);
}

void check_dims(const char* op, std::initializer_list<NamedTensor> tensors) {
  for (const auto& [name, t] : tensors) {
    TORCH_CHECK(
        t->dim() <= kMaxDims, op, ": ", name, " has ", t->dim(), " dimensions, but at most ", kMaxDims,
        " are supported");
  }
}

// NumPy broadcasting of the named tensors' shapes; a clear error naming all of them when impossible.
template <typename Int>
Shape<Int> broadcast_shapes(const char* op, std::initializer_list<NamedTensor> tensors) {
  int64_t ndim = 0;
  for (const auto& nt : tensors) ndim = std::max<int64_t>(ndim, nt.second->dim());
  Shape<Int> shape(ndim, Int(1));
  bool ok = true;
  for (const auto& nt : tensors) {
    const auto sizes = Geometry<Int>::sizes(*nt.second);
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
      names << (i == 0 ? "" : (i + 1 == tensors.size() ? " and " : ", ")) << name << " "
            << Geometry<Int>::sizes(*t);
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

template <typename Int>
c10::MemoryFormat result_memory_format_of(
    c10::ArrayRef<Int> shape, std::initializer_list<const at::Tensor*> operands_by_priority) {
  if (shape.size() != 4 && shape.size() != 5) return c10::MemoryFormat::Contiguous;
  for (const auto* t : operands_by_priority) {
    if (Geometry<Int>::sizes(*t) == shape) return t->suggest_memory_format();
  }
  return c10::MemoryFormat::Contiguous;
}

template <typename Int>
struct MemorySpan {
  const void* storage;
  Int begin;  // in bytes, inclusive
  Int end;    // in bytes, exclusive
};

template <typename Int>
MemorySpan<Int> memory_span(const at::Tensor& t) {
  const int64_t item = static_cast<int64_t>(t.element_size());
  const auto sizes = Geometry<Int>::sizes(t);
  const auto strides = Geometry<Int>::strides(t);
  Int extent = 1;
  for (size_t d = 0; d < sizes.size(); ++d) extent += (sizes[d] - 1) * strides[d];
  Int begin = Geometry<Int>::storage_offset(t) * item;
  Int end = begin + extent * item;
  return {t.storage().unsafeGetStorageImpl(), std::move(begin), std::move(end)};
}

template <typename Int>
bool has_internal_overlap(const at::Tensor& t) {
  const auto sizes = Geometry<Int>::sizes(t);
  const auto strides = Geometry<Int>::strides(t);
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] > 1 && strides[d] == 0) return true;
  }
  return false;
}

template <typename Int>
bool is_exact_alias(const at::Tensor& a, const at::Tensor& b) {
  return a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl() &&
      a.element_size() == b.element_size() &&
      Geometry<Int>::storage_offset(a) == Geometry<Int>::storage_offset(b) &&
      Geometry<Int>::sizes(a) == Geometry<Int>::sizes(b) && Geometry<Int>::strides(a) == Geometry<Int>::strides(b);
}

template <typename Int>
bool shares_memory(const at::Tensor& a, const at::Tensor& b) {
  if (!a.has_storage() || !b.has_storage() ||
      a.storage().unsafeGetStorageImpl() != b.storage().unsafeGetStorageImpl()) {
    return false;
  }
  if (Geometry<Int>::numel(a) == 0 || Geometry<Int>::numel(b) == 0) return false;
  const auto sa = memory_span<Int>(a);
  const auto sb = memory_span<Int>(b);
  return sa.begin < sb.end && sb.begin < sa.end;
}

// at::empty and at::empty_strided, in either size type.
at::Tensor empty_of(c10::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::empty(sizes, options);
}

at::Tensor empty_of(c10::SymIntArrayRef sizes, const at::TensorOptions& options) {
  return at::empty_symint(sizes, options);
}

at::Tensor empty_strided_of(c10::IntArrayRef sizes, c10::IntArrayRef strides, const at::TensorOptions& options) {
  return at::empty_strided(sizes, strides, options);
}

at::Tensor empty_strided_of(
    c10::SymIntArrayRef sizes, c10::SymIntArrayRef strides, const at::TensorOptions& options) {
  return at::empty_strided_symint(sizes, strides, options);
}

template <typename Int>
at::Tensor empty_with_format_of(c10::ArrayRef<Int> sizes, const at::TensorOptions& options, c10::MemoryFormat format) {
  switch (format) {
    case c10::MemoryFormat::ChannelsLast:
      return empty_strided_of(sizes, c10::get_channels_last_strides_2d<Int>(sizes), options);
    case c10::MemoryFormat::ChannelsLast3d:
      return empty_strided_of(sizes, c10::get_channels_last_strides_3d<Int>(sizes), options);
    default:
      return empty_of(sizes, options);
  }
}

}  // namespace

void check_common(const char* op, std::initializer_list<NamedTensor> tensors, int64_t reduction) {
  check_defined(op, tensors);
  check_same_device(op, tensors);
  check_dtypes(op, tensors);
  check_reduction(op, reduction);
}

void check_scalar(const char* op, const ScalarArg& arg, double value) {
  // Written so that NaN fails every rule but Any; +inf passes NonNegative and Positive (Huber's delta == inf is
  // 0.5 * d^2 everywhere; a temperature of +inf makes every distribution uniform).
  if (arg.rule == ScalarRule::NonNegative) {
    TORCH_CHECK_VALUE(value >= 0, op, ": ", arg.name, " must be >= 0, got ", value);
  } else if (arg.rule == ScalarRule::Positive) {
    TORCH_CHECK_VALUE(value > 0, op, ": ", arg.name, " must be > 0, got ", value);
  } else if (arg.rule == ScalarRule::UnitInterval) {
    TORCH_CHECK_VALUE(value >= 0 && value <= 1, op, ": ", arg.name, " must be in [0, 1], got ", value);
  }
}

// Each declared scalar of a row loss: a float's rule, and an optional float's where it is given (the other
// kinds have none).
void check_row_scalars(const char* op, const RowArgs& r, const RowScalars& values) {
  for (int i = 0; i < row_scalar_count(r); ++i) {
    const ScalarKind kind = r.scalars[i].kind;
    if (kind == ScalarKind::Float || (kind == ScalarKind::OptionalFloat && !values[i].absent)) {
      check_scalar(op, r.scalars[i], values[i].real);
    }
  }
}

void check_grad_output_rows(const char* op, const at::Tensor& grad_output, int64_t kept) {
  TORCH_CHECK(
      grad_output.size(0) == kept, op, ": grad_output of 'none' must have one row per row its labels keep (", kept,
      "), got ", grad_output.size(0));
}

SupportIds support_ids(const char* op, const RowArgs& r, const RowInputs& inputs, const at::Tensor& keep,
                       int64_t rows, int64_t vocab) {
  const int ids_at = row_input_of(r, InputKind::Ids), mask_at = row_input_of(r, InputKind::Mask);
  TORCH_INTERNAL_ASSERT(ids_at >= 0, op, ": a teacher over a support declares no ids");
  const at::Tensor& ids = inputs[ids_at];
  const int64_t k = ids.size(-1);
  SupportIds out;
  out.ids = ids.reshape({rows, k}).to(at::kLong).contiguous();
  if (mask_at >= 0 && inputs[mask_at].defined()) out.on = inputs[mask_at].reshape({rows, k}).contiguous();
  const at::Tensor host_ids = out.ids.to(at::kCPU);
  const at::Tensor host_on = out.on.defined() ? out.on.to(at::kCPU) : at::Tensor();
  const at::Tensor host_keep = keep.defined() ? keep.reshape(-1).to(at::kCPU, at::kBool).contiguous() : at::Tensor();
  const int64_t* id = host_ids.const_data_ptr<int64_t>();
  const bool* on = host_on.defined() ? host_on.const_data_ptr<bool>() : nullptr;
  const bool* kept = host_keep.defined() ? host_keep.const_data_ptr<bool>() : nullptr;
  const char* ids_name = r.inputs[ids_at].name;
  const char* mask_name = mask_at >= 0 ? r.inputs[mask_at].name : "the mask";
  std::vector<std::pair<int64_t, int64_t>> row_ids;  // (id, entry) of a row's entries on
  for (int64_t row = 0; row < rows; ++row) {
    if (kept && !kept[row]) continue;
    row_ids.clear();
    for (int64_t j = 0; j < k; ++j) {
      if (on && !on[row * k + j]) continue;
      const int64_t v = id[row * k + j];
      TORCH_CHECK_INDEX(
          v >= 0 && v < vocab, op, ": ", ids_name, " must be in [0, ", vocab, ") (the vocabulary of the student's "
          "logits) where ", mask_name, " is true; row ", row, " has ", v, " at entry ", j);
      row_ids.emplace_back(v, j);
    }
    std::sort(row_ids.begin(), row_ids.end());
    for (size_t j = 1; j < row_ids.size(); ++j) {
      TORCH_CHECK_VALUE(
          row_ids[j].first != row_ids[j - 1].first, op, ": ", ids_name, " has the id ", row_ids[j].first,
          " twice in row ", row, " (entries ", row_ids[j - 1].second, " and ", row_ids[j].second, ") where ",
          mask_name, " is true; mask the repeats (the divergence would count the token twice)");
    }
  }
  if (out.on.defined()) out.ids = at::where(out.on, out.ids, 0);
  // A dropped row's ids are not checked: 0 there too, so that no backend's gather reads outside the row.
  if (keep.defined()) out.ids = at::where(keep.reshape({rows, 1}).to(out.ids.device(), at::kBool), out.ids, 0);
  return out;
}

template <typename Int>
BasicResultSpec<Int> forward_spec(
    const char* op, const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  const std::initializer_list<NamedTensor> args = {{"self", &self}, {"target", &target}};
  check_dims(op, args);
  auto b = broadcast_shapes<Int>(op, args);
  Shape<Int> shape = reduction == kNone ? b : Shape<Int>{};
  const auto format = result_memory_format_of<Int>(shape, {&self, &target});
  Int count = numel_of(b);
  return {shape, result_type_of(args), std::move(b), format, std::move(count)};
}

namespace {

// The gradients w.r.t. self: broadcast(grad_output, self, target), in `dtype`.
template <typename Int>
BasicResultSpec<Int> self_gradient_spec(
    const char* op, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
    c10::ScalarType dtype) {
  const std::initializer_list<NamedTensor> args = {
      {"grad_output", &grad_output}, {"self", &self}, {"target", &target}};
  check_dims(op, args);
  auto b = broadcast_shapes<Int>(op, args);
  const auto format = result_memory_format_of<Int>(b, {&self, &target, &grad_output});
  return {b, dtype, b, format};
}

// The gradient w.r.t. target (KL's): target's shape and dtype, with grad_output broadcasting to
// broadcast(self, target) without enlarging it.
template <typename Int>
BasicResultSpec<Int> target_gradient_spec(
    const char* op, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target) {
  const std::initializer_list<NamedTensor> args = {
      {"grad_output", &grad_output}, {"self", &self}, {"target", &target}};
  check_dims(op, args);
  auto b = broadcast_shapes<Int>(op, {{"self", &self}, {"target", &target}});
  auto with_grad = broadcast_shapes<Int>(op, args);
  TORCH_CHECK(
      with_grad == b, op, ": grad_output of shape ", Geometry<Int>::sizes(grad_output),
      " must broadcast to the shape of broadcast(self, target) ", c10::ArrayRef<Int>(b),
      " without enlarging it");
  const auto shape = Geometry<Int>::sizes(target);
  return {Shape<Int>(shape.begin(), shape.end()), target.scalar_type(), b,
          result_memory_format_of<Int>(shape, {&target})};
}

}  // namespace

template <typename Int>
BasicResultSpec<Int> backward_spec(
    const char* op, const LossDecl& decl, const at::Tensor& grad_output, const at::Tensor& self,
    const at::Tensor& target) {
  BasicResultSpec<Int> spec;
  if (decl.grad_of == GradOf::Target) {
    spec = target_gradient_spec<Int>(op, grad_output, self, target);
  } else {
    const c10::ScalarType dtype = decl.grad_dtype == GradDtype::Self
        ? self.scalar_type()
        : (decl.grad_dtype == GradDtype::Target
               ? target.scalar_type()
               : result_type_of({{"grad_output", &grad_output}, {"self", &self}, {"target", &target}}));
    spec = self_gradient_spec<Int>(op, grad_output, self, target, dtype);
  }
  // broadcast_shape is broadcast(grad_output, self, target) for a gradient of self, broadcast(self, target)
  // for one of target.
  spec.mean_count = decl.mean_count == MeanCount::Self ? Geometry<Int>::numel(self) : numel_of(spec.broadcast_shape);
  return spec;
}

bool float64_allowed(const at::Tensor& t) {
  return device_type(t) != c10::DeviceType::PrivateUse1;
}

at::Tensor empty_with_format(c10::IntArrayRef sizes, const at::TensorOptions& options, c10::MemoryFormat format) {
  return empty_with_format_of<int64_t>(sizes, options, format);
}

template <typename Int>
at::Tensor empty_result(const BasicResultSpec<Int>& spec, const at::TensorOptions& options) {
  return empty_with_format_of<Int>(spec.shape, options.dtype(spec.dtype), spec.memory_format);
}

at::Tensor with_memory_format(const at::Tensor& t, c10::MemoryFormat format) {
  // contiguous() also serves symbolic shapes (torch.compile); only the NPU needs the explicit copy.
  if (format == c10::MemoryFormat::Contiguous || t.device().type() != c10::DeviceType::PrivateUse1) {
    return t.contiguous(format);
  }
  return t.is_contiguous(format) ? t : empty_with_format(t.sizes(), t.options(), format).copy_(t);
}

template <typename Int>
void check_out(
    const char* op, const char* name, const at::Tensor& out, const BasicResultSpec<Int>& spec, OutDtype rule,
    std::initializer_list<NamedTensor> inputs) {
  TORCH_CHECK(out.defined(), op, ": ", name, " must be a defined tensor, got an undefined tensor (None)");
  check_same_device(op, name, out, *inputs.begin());
  if (rule == OutDtype::EqualsResult) {
    TORCH_CHECK_TYPE(
        out.scalar_type() == spec.dtype, op, ": ", name, " must have dtype ", dtype_name(spec.dtype),
        " (the result's dtype), got ", dtype_name(out.scalar_type()));
  } else {
    check_dtype(op, name, out);
  }
  const c10::ArrayRef<Int> shape(spec.shape);
  TORCH_CHECK(
      Geometry<Int>::sizes(out) == shape, op, ": ", name, " must have shape ", shape_str(shape),
      " (the result's shape), got ", Geometry<Int>::sizes(out));
  TORCH_CHECK(
      !has_internal_overlap<Int>(out), op, ": ", name,
      " must not overlap itself (expanded or stride-0 outputs are not supported)");
  const bool alias_allowed = spec.shape == spec.broadcast_shape;
  for (const auto& [input_name, input] : inputs) {
    if (!shares_memory<Int>(out, *input)) continue;
    TORCH_CHECK(
        alias_allowed && is_exact_alias<Int>(out, *input), op, ": ", name, " overlaps ", input_name,
        "; it must be a separate tensor",
        alias_allowed ? std::string(" or exactly ") + input_name : std::string(""));
  }
}

// Each declared input of a row loss (RowArgs::inputs): defined unless optional, on the teacher's device, of its
// kind's dtype and the teacher's shape.
template <typename Int>
void check_row_inputs(const char* op, const RowArgs& r, const at::Tensor& teacher, const RowInputs& inputs) {
  for (int i = 0; i < row_input_count(r); ++i) {
    const RowInput& in = r.inputs[i];
    const at::Tensor& t = inputs[i];
    if (!in.optional) check_defined(op, {{in.name, &t}});
    if (!t.defined()) continue;
    check_same_device(op, in.name, t, {r.logits[1], &teacher});
    if (in.kind == InputKind::Ids) {
      TORCH_CHECK_TYPE(
          c10::isIntegralType(t.scalar_type(), /*includeBool=*/false), op, ": ", in.name,
          " must have an integer dtype, got ", dtype_name(t.scalar_type()));
    } else {
      TORCH_CHECK_TYPE(
          t.scalar_type() == at::kBool, op, ": ", in.name, " must be a bool tensor, got ", dtype_name(t.scalar_type()));
    }
    TORCH_CHECK(
        Geometry<Int>::sizes(t) == Geometry<Int>::sizes(teacher), op, ": ", in.name, " must have ", r.logits[1],
        "'s shape ", Geometry<Int>::sizes(teacher), ", got ", Geometry<Int>::sizes(t));
  }
}

template <typename Int>
BasicRowSpec<Int> row_forward_spec(const LossDecl& d, const char* op, const RowCall& c) {
  const RowArgs& r = d.rows;
  const at::Tensor &student = c.student, &teacher = c.teacher;
  const at::Tensor undefined;
  const at::Tensor& l = c.labels.has_value() ? *c.labels : undefined;
  check_defined(op, {{r.logits[0], &student}, {r.logits[1], &teacher}});
  if (l.defined()) {
    check_same_device(op, {{r.logits[0], &student}, {r.logits[1], &teacher}, {r.labels, &l}});
  } else {
    check_same_device(op, {{r.logits[0], &student}, {r.logits[1], &teacher}});
  }
  check_dtypes(op, {{r.logits[0], &student}, {r.logits[1], &teacher}});
  if (l.defined()) {
    TORCH_CHECK_TYPE(
        c10::isIntegralType(l.scalar_type(), /*includeBool=*/false), op, ": ", r.labels,
        " must have an integer dtype, got ", dtype_name(l.scalar_type()));
  }
  check_row_inputs<Int>(op, r, teacher, c.inputs);
  check_reduction(op, c.reduction);
  check_row_scalars(op, r, c.scalars.values);
  check_dims(op, {{r.logits[0], &student}, {r.logits[1], &teacher}});
  TORCH_CHECK(
      student.dim() >= 1, op, ": ", r.logits[0], " must have at least one dimension (the vocabulary), got a 0-dim "
      "tensor");
  const auto shape = Geometry<Int>::sizes(student);
  const auto leading = shape.slice(0, shape.size() - 1);
  const auto teacher_shape = Geometry<Int>::sizes(teacher);
  if (r.teacher == TeacherForm::Logits) {
    TORCH_CHECK(
        shape == teacher_shape, op, ": ", r.logits[0], " and ", r.logits[1],
        " must have the same shape (the same vocabulary too), got ", shape, " and ", teacher_shape);
  } else {
    TORCH_CHECK(
        teacher.dim() == student.dim() && teacher_shape.slice(0, teacher_shape.size() - 1) == leading, op, ": ",
        r.logits[1], " must have ", r.logits[0], "'s leading shape ", leading, " and one last dimension, got ",
        teacher_shape);
    TORCH_CHECK(
        teacher_shape.back() >= 1, op, ": ", r.logits[1], " must have at least one entry per row, got shape ",
        teacher_shape);
  }
  if (l.defined()) {
    TORCH_CHECK(
        Geometry<Int>::sizes(l) == leading, op, ": ", r.labels, " must have the logits' leading shape ",
        leading, ", got ", Geometry<Int>::sizes(l));
  }
  BasicRowSpec<Int> spec;
  spec.dtype = result_type_of({{r.logits[0], &student}, {r.logits[1], &teacher}});
  spec.logits_shape.assign(shape.begin(), shape.end());
  spec.rows = numel_of(leading);
  spec.vocab = shape.back();
  spec.labels = l.defined();
  if (r.teacher == TeacherForm::Logits) {
    spec.entries = spec.vocab;
  } else {
    spec.support = teacher_shape.back();
    spec.entries = spec.support + (c.scalars.tail() ? 1 : 0);
  }
  return spec;
}

template <typename Int>
BasicRowSpec<Int> row_with_grads_spec(const LossDecl& d, const RowCall& c) {
  auto spec = row_forward_spec<Int>(d, d.with_grads, c);
  TORCH_CHECK_VALUE(
      c.reduction != kNone, d.with_grads, ": reduction must be 1 (mean) or 2 (sum), the gradients of a scalar; got 0 "
      "(none)");
  return spec;
}

template <typename Int>
BasicRowSpec<Int> row_backward_spec(const LossDecl& d, const at::Tensor& grad_output, const RowCall& c) {
  const char* op = d.backward;
  check_defined(op, {{"grad_output", &grad_output}});
  auto spec = row_forward_spec<Int>(d, op, c);
  check_same_device(op, "grad_output", grad_output, {d.rows.logits[0], &c.student});
  check_dtype(op, "grad_output", grad_output);
  const auto g = Geometry<Int>::sizes(grad_output);
  if (c.reduction != kNone) {
    TORCH_CHECK(g.empty(), op, ": grad_output of a reduced loss must be 0-dim, got shape ", g);
  } else if (spec.labels) {
    TORCH_CHECK(
        g.size() == 2 && g[1] == spec.entries, op, ": grad_output of 'none' with labels must have the shape "
        "[rows kept, ", spec.entries, "], got ", g);
  } else {
    c10::SmallVector<Int, c10::kDimVectorStaticSize> values(spec.logits_shape.begin(), spec.logits_shape.end());
    values.back() = spec.entries;
    TORCH_CHECK(
        g == c10::ArrayRef<Int>(values), op, ": grad_output of 'none' must have the ",
        d.rows.teacher == TeacherForm::Logits ? "logits'" : "values'", " shape ",
        c10::ArrayRef<Int>(values), ", got ", g);
  }
  return spec;
}

FamilyReduction family_reduction(const char* op, c10::string_view reduction, bool scalar_only) {
  const std::string how(reduction.data(), reduction.size());
  size_t found = kFamilyReductions.size();
  for (size_t i = 0; i < kFamilyReductions.size(); ++i) {
    if (how == kFamilyReductions[i]) found = i;
  }
  const auto r = static_cast<FamilyReduction>(found);
  if (!scalar_only) {
    TORCH_CHECK_VALUE(found < kFamilyReductions.size(), op,
                      ": reduction must be 'batchmean', 'sum', 'mean' or 'none', got '", how, "'");
    return r;
  }
  TORCH_CHECK_VALUE(
      r != FamilyReduction::None, op, ": reduction 'none' is not supported: the gradients are made in the forward, "
      "for a scalar loss ('batchmean', 'sum' or 'mean')");
  TORCH_CHECK_VALUE(found < kFamilyReductions.size(), op, ": reduction must be 'batchmean', 'sum' or 'mean', got '",
                    how, "'");
  return r;
}

RowInputs linear_support_inputs(const RowArgs& r, const LinearCall& c) {
  RowInputs inputs;
  inputs[row_input_of(r, InputKind::Ids)] = *c.weight[1];
  const int mask = row_input_of(r, InputKind::Mask);
  if (mask >= 0 && c.bias[1]->has_value()) inputs[mask] = **c.bias[1];
  return inputs;
}

template <typename Int>
BasicLinearSpec<Int> linear_spec(const LossDecl& d, const char* op, const LinearCall& c) {
  const RowArgs& r = d.rows;
  const LinearForm& f = d.linear;
  const bool support = r.teacher == TeacherForm::Support;
  const int sides = support ? 1 : 2;  // the sides with hidden states and weights
  const at::Tensor undefined;
  const auto present = [&](const std::optional<at::Tensor>& t) -> const at::Tensor& {
    return t.has_value() ? *t : undefined;
  };
  const at::Tensor* const* inputs = c.input;
  const at::Tensor* const* weights = c.weight;
  const at::Tensor* biases[2] = {&present(*c.bias[0]), &present(*c.bias[1])};
  const at::Tensor& l = present(c.labels);
  check_defined(op, {{f.inputs[0], inputs[0]}, {f.weights[0], weights[0]}, {f.inputs[1], inputs[1]},
                     {f.weights[1], weights[1]}});
  const NamedTensor first{f.inputs[0], inputs[0]};
  for (const NamedTensor& t : {NamedTensor{f.weights[0], weights[0]}, NamedTensor{f.inputs[1], inputs[1]},
                               NamedTensor{f.weights[1], weights[1]}, NamedTensor{r.labels, &l},
                               NamedTensor{f.biases[0], biases[0]}, NamedTensor{f.biases[1], biases[1]}}) {
    if (t.second->defined()) check_same_device(op, t.first, *t.second, first);
  }
  if (support) {
    check_dtype(op, f.inputs[1], *inputs[1]);
    check_row_inputs<Int>(op, r, *inputs[1], linear_support_inputs(r, c));
  }
  for (int side = 0; side < sides; ++side) {
    check_dtype(op, f.inputs[side], *inputs[side]);
    for (const NamedTensor& t :
         {NamedTensor{f.weights[side], weights[side]}, NamedTensor{f.biases[side], biases[side]}}) {
      if (!t.second->defined()) continue;
      TORCH_CHECK_TYPE(
          t.second->scalar_type() == inputs[side]->scalar_type(), op, ": ", t.first, " must have ", f.inputs[side],
          "'s dtype ", dtype_name(inputs[side]->scalar_type()), ", got ", dtype_name(t.second->scalar_type()));
    }
  }
  if (l.defined()) {
    TORCH_CHECK_TYPE(
        c10::isIntegralType(l.scalar_type(), /*includeBool=*/false), op, ": ", r.labels,
        " must have an integer dtype, got ", dtype_name(l.scalar_type()));
  }
  const FamilyReduction how = family_reduction(op, c.reduction, /*scalar_only=*/true);
  check_row_scalars(op, r, c.scalars.values);
  check_scalar(op, f.weights_of[0], c.weight_hard);
  check_scalar(op, f.weights_of[1], c.weight_soft);
  TORCH_CHECK_VALUE(
      c.weight_hard == 0 || l.defined(), op, ": ", f.weights_of[0].name, " != 0 needs ", r.labels,
      " (the cross entropy's targets), got None");
  TORCH_CHECK_VALUE(
      !c.chunk_size.has_value() || *c.chunk_size >= 1, op, ": chunk_size must be >= 1 or None, got ",
      c.chunk_size.value_or(0));
  check_dims(op, {{f.inputs[0], inputs[0]}, {f.inputs[1], inputs[1]}});
  for (int side = 0; side < 2; ++side) {
    TORCH_CHECK(
        inputs[side]->dim() >= 1, op, ": ", f.inputs[side], " must have at least one dimension (",
        side == 1 && support ? "the support" : "the hidden size", "), got a 0-dim tensor");
    if (side == 1 && support) continue;
    TORCH_CHECK(
        weights[side]->dim() == 2, op, ": ", f.weights[side], " must be 2-D (vocabulary, hidden size), got shape ",
        Geometry<Int>::sizes(*weights[side]));
  }
  const auto vocab = Geometry<Int>::sizes(*weights[0])[0];
  TORCH_CHECK(
      support || Geometry<Int>::sizes(*weights[1])[0] == vocab, op, ": ", f.weights[1], " must have ", f.weights[0],
      "'s vocabulary ", vocab, " (its first dimension), got shape ", Geometry<Int>::sizes(*weights[1]));
  for (int side = 0; side < sides; ++side) {
    const auto hidden = Geometry<Int>::sizes(*inputs[side]).back();
    TORCH_CHECK(
        Geometry<Int>::sizes(*weights[side])[1] == hidden, op, ": ", f.weights[side], " must be (vocabulary, ",
        hidden, "), the hidden size of ", f.inputs[side], ", got shape ", Geometry<Int>::sizes(*weights[side]));
    if (biases[side]->defined()) {
      TORCH_CHECK(
          Geometry<Int>::sizes(*biases[side]) == c10::ArrayRef<Int>(vocab), op, ": ", f.biases[side],
          " must have the shape [", vocab, "] (the vocabulary), got ", Geometry<Int>::sizes(*biases[side]));
    }
  }
  const auto s_shape = Geometry<Int>::sizes(*inputs[0]);
  const auto t_shape = Geometry<Int>::sizes(*inputs[1]);
  const auto leading = s_shape.slice(0, s_shape.size() - 1);
  TORCH_CHECK(
      t_shape.slice(0, t_shape.size() - 1) == leading, op, ": ", f.inputs[1], " must have ", f.inputs[0],
      "'s leading shape ", leading, " (one row per token), got shape ", t_shape);
  TORCH_CHECK(
      !support || t_shape.back() >= 1, op, ": ", f.inputs[1], " must have at least one entry per row, got shape ",
      t_shape);
  if (l.defined()) {
    TORCH_CHECK(
        Geometry<Int>::sizes(l) == leading, op, ": ", r.labels, " must have the inputs' leading shape ", leading,
        ", got ", Geometry<Int>::sizes(l));
  }
  BasicLinearSpec<Int> spec;
  spec.op = op;
  spec.dtype = result_type_of({{f.inputs[0], inputs[0]}, {f.inputs[1], inputs[1]}});
  spec.leading.assign(leading.begin(), leading.end());
  spec.rows = numel_of(leading);
  spec.vocab = vocab;
  if (support) {
    spec.support = t_shape.back();
    spec.entries = spec.support + (c.scalars.tail() ? 1 : 0);
  } else {
    spec.entries = vocab;
  }
  spec.batch_rows = leading.empty() ? vocab : leading[0];
  spec.labels = l.defined();
  spec.reduction = how;
  return spec;
}

// Every rule in both size types: int64_t for the kernels, c10::SymInt for the Meta kernels.
#define NPU_LOSS_INSTANTIATE_CHECKS(Int)                                                                  \
  template BasicResultSpec<Int> forward_spec<Int>(const char*, const at::Tensor&, const at::Tensor&, int64_t); \
  template BasicResultSpec<Int> backward_spec<Int>(                                                       \
      const char*, const LossDecl&, const at::Tensor&, const at::Tensor&, const at::Tensor&);              \
  template void check_out<Int>(                                                                           \
      const char*, const char*, const at::Tensor&, const BasicResultSpec<Int>&, OutDtype,                 \
      std::initializer_list<NamedTensor>);                                                                \
  template at::Tensor empty_result<Int>(const BasicResultSpec<Int>&, const at::TensorOptions&);          \
  template BasicRowSpec<Int> row_forward_spec<Int>(const LossDecl&, const char*, const RowCall&);          \
  template BasicRowSpec<Int> row_with_grads_spec<Int>(const LossDecl&, const RowCall&);                   \
  template BasicRowSpec<Int> row_backward_spec<Int>(const LossDecl&, const at::Tensor&, const RowCall&);  \
  template BasicLinearSpec<Int> linear_spec<Int>(const LossDecl&, const char*, const LinearCall&);

NPU_LOSS_INSTANTIATE_CHECKS(int64_t)
NPU_LOSS_INSTANTIATE_CHECKS(c10::SymInt)

}  // namespace npu_loss
