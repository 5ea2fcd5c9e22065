// The Python module _C: importing it runs the static op registrations; build_info() says what was built.
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/extension.h>

#include <string>
#include <vector>

#include "autograd/derivatives.h"
#include "core/checks.h"
#include "core/ops.h"
#include "core/schema.h"
#include "enable/aten_kernels.h"
#include "cpu/isa.h"
#include "chips/paths.h"

namespace {

// The instruction sets this CPU and build run, baseline first.
std::vector<std::string> available_isas() {
  std::vector<std::string> names;
  for (int i = 0; i <= static_cast<int>(npu_loss::cpu::best_isa()); ++i) {
    names.emplace_back(npu_loss::cpu::isa_name(static_cast<npu_loss::cpu::Isa>(i)));
  }
  return names;
}

// The KL kernels' float log or exp of a float32 tensor, their log of bfloat16 values ('log_bf16', x
// holding bfloat16 values), or the row kernels' tanh, computed by one instruction set's kernels: lets the
// tests check their accuracy on every instruction set this CPU has.
at::Tensor vec_math(const std::string& fn, const at::Tensor& x, const std::string& isa) {
  TORCH_CHECK(fn == "log" || fn == "exp" || fn == "log_bf16" || fn == "tanh",
              "_vec_math: fn must be 'log', 'exp', 'log_bf16' or 'tanh', got '", fn, "'");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(), "_vec_math: x must be a float32 CPU tensor");
  const auto& kernels = npu_loss::cpu::kernels_for(npu_loss::cpu::parse_isa(isa.c_str(), "isa"));
  const at::Tensor in = x.contiguous();
  TORCH_CHECK(fn != "log_bf16" || in.view(at::kInt).bitwise_and(0xFFFF).eq(0).all().item<bool>(),
              "_vec_math: 'log_bf16' takes bfloat16 values (x's low 16 bits must be zero)");
  at::Tensor out = at::empty_like(in);
  const auto f = fn == "log" ? kernels.log : fn == "exp" ? kernels.exp : fn == "tanh" ? kernels.tanh : kernels.log_bf16;
  f(in.const_data_ptr<float>(), out.mutable_data_ptr<float>(), in.numel());
  return out;
}

// The chip paths of every op, row by row as docs/npu_paths.md writes them (tests compare the two on any
// machine).
pybind11::list chip_paths() {
  pybind11::list rows;
  for (const auto& row : npu_loss::chips::path_table()) {
    pybind11::dict d;
    d["op"] = row.op;
    d["chip"] = row.chip;
    d["dtypes"] = row.dtypes;
    d["beta"] = row.beta;
    d["log_target"] = row.log_target;
    d["transform"] = row.transform;
    d["api"] = row.api;
    d["fixes"] = row.fixes;
    d["why"] = row.why;
    rows.append(d);
  }
  return rows;
}

// The chip paths' class of a smooth L1 beta for a result dtype ("float32", "float16" or "bfloat16"), as the
// table names it ("0", "tiny", "small", "normal", "inf").
std::string npu_beta_class(double beta, const std::string& dtype) {
  using npu_loss::chips::Dtype;
  TORCH_CHECK(
      dtype == "float32" || dtype == "float16" || dtype == "bfloat16",
      "_npu_beta_class: dtype must be 'float32', 'float16' or 'bfloat16', got '", dtype, "'");
  const Dtype d = dtype == "float32" ? Dtype::Float32 : (dtype == "float16" ? Dtype::Float16 : Dtype::BFloat16);
  return npu_loss::chips::beta_class_name(npu_loss::chips::beta_class(beta, d));
}

// Whether enable()'s kernel for an ATen overload would call the npu_loss op for these arguments (given as
// torch.ops.aten's overload takes them), rather than torch's kernel (for tests).
bool aten_route_accepts(const std::string& overload, const pybind11::args& args, const pybind11::kwargs& kwargs) {
  const auto& schema = npu_loss::enable::aten_schema(overload);
  const torch::jit::Stack stack = torch::jit::createStackForSchema(schema, args, kwargs, std::nullopt);
  return npu_loss::enable::accepts(overload, stack);
}

// Every loss's declaration (losses.h), for Python (the DTensor rules, enable()) and the tests.
pybind11::list losses() {
  using namespace npu_loss;
  pybind11::list rows;
  for_each_loss([&]<typename Loss>() {
    const LossDecl& d = Loss::decl;
    pybind11::dict row;
    row["kind"] = d.kind == LossKind::Rows ? "rows" : "elementwise";
    row["forward"] = d.forward;
    row["backward"] = d.backward;
    row["schemas"] = schemas(d);
    row["autocast_float32"] = d.autocast_float32;
    if constexpr (Loss::decl.kind == LossKind::Rows) {
      const RowArgs& r = d.rows;
      row["with_grads"] = d.with_grads;
      row["logits"] = std::vector<std::string>{r.logits[0], r.logits[1]};
      row["teacher"] = r.teacher == TeacherForm::Logits ? "logits" : "support";
      pybind11::list inputs;
      for (int i = 0; i < row_input_count(r); ++i) {
        pybind11::dict input;
        input["name"] = r.inputs[i].name;
        input["kind"] = r.inputs[i].kind == InputKind::Ids ? "ids" : "mask";
        input["optional"] = r.inputs[i].optional;
        inputs.append(input);
      }
      row["inputs"] = inputs;
      row["labels"] = r.labels;
      std::vector<std::string> scalars;
      for (int i = 0; i < row_scalar_count(r); ++i) scalars.emplace_back(r.scalars[i].name);
      row["scalars"] = scalars;
      // The scalar that adds the tail bucket to a support's entries (ScalarRole::SupportTail), or None.
      const int tail = row_scalar_of(r, ScalarRole::SupportTail);
      row["tail"] = tail >= 0 ? pybind11::object(pybind11::str(r.scalars[tail].name)) : pybind11::none();
      row["index"] = r.index.name;
      // The CPU frame's kernel of this member, in the selected instruction set's table (cpu/row_table.h).
      row["cpu_kernel"] = cpu::row_kernels().of[row_index<Loss>()].run != nullptr;
      const LinearForm& f = d.linear;
      if (f.forward != nullptr) {
        pybind11::dict linear;
        linear["forward"] = f.forward;
        linear["with_grads"] = f.with_grads;
        linear["inputs"] = std::vector<std::string>{f.inputs[0], f.inputs[1]};
        linear["weights"] = std::vector<std::string>{f.weights[0], f.weights[1]};
        linear["biases"] = std::vector<std::string>{f.biases[0], f.biases[1]};
        linear["weights_of"] = std::vector<std::string>{f.weights_of[0].name, f.weights_of[1].name};
        row["linear"] = linear;
      } else {
        row["linear"] = pybind11::none();
      }
      rows.append(row);
      return;
    }
    row["out_overload"] = d.out_overload;
    row["out_arg"] = d.out_arg;
    row["scalar"] = d.scalar.kind == ScalarKind::None ? pybind11::object(pybind11::none())
                                                       : pybind11::object(pybind11::str(d.scalar.name));
    row["grad_of"] = d.grad_of == GradOf::Self ? "self" : "target";
    row["mean_count"] = d.mean_count == MeanCount::Self ? "self"
        : d.mean_count == MeanCount::Broadcast          ? "broadcast"
                                                        : "self_target_broadcast";
    row["grad_dtype"] = d.grad_dtype == GradDtype::Self ? "self" : d.grad_dtype == GradDtype::Target ? "target" : "promoted";
    row["out_dtype"] = d.out_dtype == OutDtype::AnyFloating ? "any_floating" : "equals_result";
    row["aclnn"] = std::vector<std::string>{d.aclnn_forward, d.aclnn_backward};
    rows.append(row);
  });
  return rows;
}

// The row family's reduction `how` names, checked as the linear form's ops check theirs (core/checks.h,
// family_reduction; 'none' allowed): its name, or the ValueError naming `op`.
std::string family_reduction(const std::string& op, const std::string& how) {
  npu_loss::family_reduction(op.c_str(), how, /*scalar_only=*/false);
  return how;
}

// A row loss's scalars from Python values, by their declared kinds (the fake kernels pass the op's own).
npu_loss::RowScalars row_scalars_of(const char* op, const npu_loss::RowArgs& r, const pybind11::sequence& values) {
  using namespace npu_loss;
  const int n = row_scalar_count(r);
  TORCH_CHECK_VALUE(
      static_cast<int>(values.size()) == n, "_row_result_dtype: ", op, " declares ", n, " scalars, got ",
      values.size());
  RowScalars scalars{};
  for (int i = 0; i < n; ++i) {
    const ScalarKind kind = r.scalars[i].kind;
    if (kind == ScalarKind::Float) scalars[i].real = values[i].cast<double>();
    if (kind == ScalarKind::Int) scalars[i].integer = values[i].cast<int64_t>();
    if (kind == ScalarKind::Bool) scalars[i].flag = values[i].cast<bool>();
    if (kind == ScalarKind::OptionalFloat) {
      scalars[i].absent = values[i].is_none();
      if (!scalars[i].absent) scalars[i].real = values[i].cast<double>();
    }
  }
  return scalars;
}

// A row loss's checks on an op's arguments (core/checks.h, on SymInt sizes: the one rule source of the Python
// fake kernels, npu_loss_ops/_fake.py), and the result's dtype. `op`: the forward's, the forward with
// gradients', or the backward op's name; grad_output only for the backward op; `inputs` and `scalars`: the
// loss's declared inputs without a gradient and scalars (losses.h's RowArgs), in order (None for an absent input).
std::string row_result_dtype(
    const std::string& op, const std::optional<at::Tensor>& grad_output, const at::Tensor& student,
    const at::Tensor& teacher, const std::vector<std::optional<at::Tensor>>& inputs,
    const std::optional<at::Tensor>& labels, int64_t reduction, const pybind11::sequence& scalars) {
  using namespace npu_loss;
  std::optional<c10::ScalarType> dtype;
  for_each_row_loss([&]<typename Loss>() {
    const LossDecl& d = Loss::decl;
    if (op != d.forward && op != d.with_grads && op != d.backward) return;
    const RowScalars values = row_scalars_of(op.c_str(), d.rows, scalars);
    const int n = row_input_count(d.rows);
    TORCH_CHECK_VALUE(
        static_cast<int>(inputs.size()) == n, "_row_result_dtype: ", op, " declares ", n, " inputs, got ",
        inputs.size());
    RowInputs given;
    for (int i = 0; i < n; ++i) given[i] = input_value(inputs[i]);
    // The index is no check's (0).
    const RowCall c = row_call<Loss>(student, teacher, given, labels, reduction, values, 0);
    if (op == d.forward) {
      dtype = row_forward_spec<c10::SymInt>(d, d.forward, c).dtype;
    } else if (op == d.with_grads) {
      dtype = row_with_grads_spec<c10::SymInt>(d, c).dtype;
    } else {
      TORCH_CHECK(grad_output.has_value(), "_row_result_dtype: ", op, " takes grad_output");
      dtype = row_backward_spec<c10::SymInt>(d, *grad_output, c).dtype;
    }
  });
  TORCH_CHECK_VALUE(dtype.has_value(), "_row_result_dtype: no row loss has an op named '", op, "'");
  return std::string(c10::getDtypeNames(*dtype).first);
}

pybind11::dict build_info() {
  pybind11::dict info;
  const auto isa = npu_loss::cpu::selected_isa();
  info["cpu_kernel_isa"] = npu_loss::cpu::isa_description(isa);
  info["cpu_isa"] = npu_loss::cpu::isa_name(isa);
  info["cpu_isas_available"] = available_isas();
#if defined(_OPENMP)
  info["openmp"] = true;
#else
  info["openmp"] = false;
#endif
  info["compiler"] = std::string(__VERSION__);
  // setup.py's optimization level (-O3; -O0 with DEBUG=1; -O1 sanitized) and NPU_LOSS_OPS_SANITIZE.
  info["optimization"] = "-O" + std::to_string(NPU_LOSS_OPS_OPT_LEVEL);
  std::vector<std::string> sanitizers;
#if defined(__SANITIZE_ADDRESS__)
  sanitizers.emplace_back("address");
#endif
#if defined(NPU_LOSS_OPS_UBSAN)
  sanitizers.emplace_back("undefined");
#endif
  info["sanitizers"] = sanitizers;
  return info;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "npu_loss_ops: operator registrations and CPU kernels";
  // Read NPU_LOSS_OPS_CPU_ISA now, so that a bad value fails the import (ImportError) with its message.
  npu_loss::cpu::selected_isa();
  m.def("build_info", &build_info, "What this build of _C contains and which CPU kernels it runs.");
  m.def("_differentiable_ops", &npu_loss::autograd::differentiable_ops,
        "The ops with a derivatives block (csrc/autograd/derivatives.cpp), for tests.");
  m.def("_losses", &losses, "Every loss's declaration (csrc/losses.h): one dict per loss.");
  m.def("_vec_math", &vec_math, "The CPU kernels' float log or exp, on one instruction set (for tests).");
  m.def("_aten_routes", &npu_loss::enable::routes,
        "enable()'s routing table: (torch.nn.functional name, ATen overload) rows (csrc/enable/aten_kernels.cpp).");
  m.def("_set_aten_routes", &npu_loss::enable::set_routed,
        "Make these ATen overloads exactly the ones routed to the npu_loss ops (npu_loss_ops.enable()).");
  m.def("_aten_route_accepts", &aten_route_accepts,
        "Whether enable()'s kernel would call the npu_loss op for these arguments (for tests).");
  m.def("_chip_paths", &chip_paths, "The chip paths of every op on the NPU, row by row (docs/npu_paths.md).");
  m.def("_family_reduction", &family_reduction,
        "Checks a row family's reduction name as the ops do (for the Python functions that take one).");
  m.def(
      "_family_reductions",
      [] { return std::vector<std::string>(npu_loss::kFamilyReductions.begin(), npu_loss::kFamilyReductions.end()); },
      "The row family's reduction names (core/checks.h).");
  m.def("_row_result_dtype", &row_result_dtype,
        "A row loss's checks on an op's arguments and its result's dtype (for the fake kernels).");
  m.def("_npu_beta_class", &npu_beta_class, "The chip paths' class of a smooth L1 beta (for tests).");
}
