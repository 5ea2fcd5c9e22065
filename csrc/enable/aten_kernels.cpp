// The kernels npu_loss_ops.enable() puts on ATen's loss ops: one row per ATen overload, one block per loss.
//
// While a loss is routed, each of its ATen overloads has a kernel of this file at the Autograd keys, at the
// backend keys (so that inference_mode, which skips Autograd, is routed too) and at FuncTorchBatched (vmap),
// for the CPU, the NPU (PrivateUse1) and the other accelerators where the package's ops run their composite
// fallback. The kernel calls the npu_loss overload of the same name and schema with the same arguments when
// the package's own checks (core/checks.h) accept them; otherwise it calls the kernel torch had at that key
// when the routing was switched on, so enabling never breaks code that works. The kernels live in one
// runtime torch::Library; set_routed() deletes it, which restores torch's kernels.
//
// Written in C++ because it runs on every routed call: a Python kernel cost 20 % of a 4K-element step.
#include "aten_kernels.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <array>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "../compat/torch_compat.h"
#include "../core/checks.h"
#include "../core/ops.h"

namespace npu_loss::enable {
namespace {

// ---- accepting a call: the op's own checks, on the stack's arguments -----------------------------------------

template <typename T>
decltype(auto) arg(const c10::IValue& v) {
  if constexpr (std::is_same_v<T, at::Tensor>) {
    return v.toTensor();
  } else {
    return v.to<T>();
  }
}

template <typename Spec, typename... Args, size_t... I>
Spec run_check(Spec (*check)(Args...), const c10::IValue* args, std::index_sequence<I...>) {
  return check(arg<std::decay_t<Args>>(args[I])...);
}

template <typename Spec, typename... Args>
Spec run_check(Spec (*check)(Args...), const c10::IValue* args) {
  return run_check(check, args, std::index_sequence_for<Args...>{});
}

using Accepts = bool (*)(const c10::IValue* args, size_t n);

// Whether the npu_loss op takes these arguments (`n` of them): its checks pass (`Concrete` for real tensors,
// `Symbolic` for tensors with symbolic sizes, as torch.compile traces them), and the dispatcher can reach
// its kernels (strided tensors: the ops have no sparse or nested kernels). For an out= overload (`kOut`), the
// out tensor must also have the result's dtype: ATen casts a result into another dtype's out tensor by its
// own rules, so those calls stay with torch.
template <auto Concrete, auto Symbolic, bool kOut>
bool accepts_with(const c10::IValue* args, size_t n) {
  bool symbolic = false;
  for (size_t i = 0; i < n; ++i) {
    if (args[i].isTensor()) {
      const at::Tensor& t = args[i].toTensor();
      if (!t.defined() || t.layout() != c10::kStrided) {
        return false;
      }
      symbolic = symbolic || t.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
    }
  }
  try {
    const c10::ScalarType dtype = symbolic ? run_check(Symbolic, args).dtype : run_check(Concrete, args).dtype;
    return !kOut || args[n - 1].toTensor().scalar_type() == dtype;
  } catch (const c10::Error&) {
    return false;  // torch's kernel runs, and raises its own error if torch rejects the call too
  }
}

// ---- the routing table: each loss's ATen twins (losses.h, aten_twin) ----------------------------------------

struct Route {
  std::string loss;      // the torch.nn.functional name enable(ops=...) takes: the forward op's name
  std::string overload;  // the ATen overload, and the npu_loss overload of the same schema
  Accepts accepts;
};

template <typename Loss>
void add_routes(std::vector<Route>& routes) {
  constexpr const LossDecl& d = Loss::decl;
  using Concrete = LossChecks<Loss, int64_t>;
  using Symbolic = LossChecks<Loss, c10::SymInt>;
  if constexpr (has_twin(d.aten_twin, AtenTwin::Forward)) {
    routes.push_back({d.forward, d.forward, &accepts_with<&Concrete::forward, &Symbolic::forward, false>});
  }
  if constexpr (has_twin(d.aten_twin, AtenTwin::Backward)) {
    routes.push_back({d.forward, d.backward, &accepts_with<&Concrete::backward, &Symbolic::backward, false>});
  }
  if constexpr (has_twin(d.aten_twin, AtenTwin::BackwardOut)) {
    routes.push_back(
        {d.forward, out_overload_name(d), &accepts_with<&Concrete::backward_out, &Symbolic::backward_out, true>});
  }
}

const std::vector<Route>& all_routes() {
  static const std::vector<Route> routes = [] {
    std::vector<Route> r;
    for_each_elementwise_loss([&]<typename Loss>() { add_routes<Loss>(r); });
    return r;
  }();
  return routes;
}

const Route& find_route(const std::string& overload) {
  for (const Route& route : all_routes()) {
    if (overload == route.overload) {
      return route;
    }
  }
  TORCH_CHECK_VALUE(false, "npu_loss_ops.enable: no routing for ATen overload '", overload, "'");
}

c10::OperatorHandle find_op(const char* ns, const std::string& overload) {
  const auto dot = overload.find('.');
  const std::string name = std::string(ns) + "::" + overload.substr(0, dot);
  return c10::Dispatcher::singleton().findSchemaOrThrow(
      name.c_str(), dot == std::string::npos ? "" : overload.c_str() + dot + 1);
}

// ---- the kernel at one dispatch key -------------------------------------------------------------------------

class RoutingKernel final : public c10::OperatorKernel {
 public:
  RoutingKernel(Accepts accepts, c10::OperatorHandle ours, compat::KernelRef original,
                std::optional<c10::DispatchKeySet> exclude)
      : accepts_(accepts), ours_(std::move(ours)), original_(std::move(original)), exclude_(exclude) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    if (!accepts_(stack->data() + (stack->size() - n), n)) {
      original_.callBoxed(op, keys, stack);
      return;
    }
    // The npu_loss op is called from the top of the dispatcher: its autograd node, vmap rule and kernels.
    if (exclude_.has_value()) {
      c10::impl::ExcludeDispatchKeyGuard guard(*exclude_);
      ours_.callBoxed(stack);
    } else {
      ours_.callBoxed(stack);
    }
  }

 private:
  Accepts accepts_;
  c10::OperatorHandle ours_;
  compat::KernelRef original_;
  // The device's Autocast key, where the npu_loss op has an Autocast kernel and torch's op has none (or a
  // fallthrough): torch computes in the inputs' dtype there, so the npu_loss op must not cast to float32.
  std::optional<c10::DispatchKeySet> exclude_;
};

struct DeviceKeys {
  c10::DispatchKey backend, autograd, autocast;
};

// The CPU, the NPU (PrivateUse1) and the accelerators where the npu_loss ops run their composite fallback.
// Other keys (Meta, XLA, sparse and nested tensors' ...) keep torch's kernels.
constexpr std::array kDevices = {
    DeviceKeys{c10::DispatchKey::CPU, c10::DispatchKey::AutogradCPU, c10::DispatchKey::AutocastCPU},
    DeviceKeys{c10::DispatchKey::PrivateUse1, c10::DispatchKey::AutogradPrivateUse1,
               c10::DispatchKey::AutocastPrivateUse1},
    DeviceKeys{c10::DispatchKey::CUDA, c10::DispatchKey::AutogradCUDA, c10::DispatchKey::AutocastCUDA},
    DeviceKeys{c10::DispatchKey::XPU, c10::DispatchKey::AutogradXPU, c10::DispatchKey::AutocastXPU},
    DeviceKeys{c10::DispatchKey::MPS, c10::DispatchKey::AutogradMPS, c10::DispatchKey::AutocastMPS},
    DeviceKeys{c10::DispatchKey::HPU, c10::DispatchKey::AutogradHPU, c10::DispatchKey::AutocastHPU},
};

std::optional<c10::DispatchKeySet> autocast_exclusion(
    const c10::OperatorHandle& aten, const c10::OperatorHandle& ours, std::optional<c10::DispatchKey> autocast) {
  if (!autocast.has_value() || !ours.hasKernelForDispatchKey(*autocast)) {
    return std::nullopt;
  }
  const bool aten_casts = aten.hasKernelForDispatchKey(*autocast) && !aten.isKernelFallthroughKernel(*autocast);
  return aten_casts ? std::nullopt : std::optional<c10::DispatchKeySet>(c10::DispatchKeySet(*autocast));
}

// Registering over ATen's kernels makes torch warn (once per process) that a kernel is overridden: that is
// the point here, so nothing is printed while the routing kernels are registered.
class Quiet final : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

void register_route(torch::Library& library, const Route& route) {
  const c10::OperatorHandle aten = find_op("aten", route.overload);
  const c10::OperatorHandle ours = find_op("npu_loss", route.overload);
  struct Original {
    c10::DispatchKey key;
    std::optional<c10::DispatchKey> autocast;
    compat::KernelRef kernel;
  };
  // torch's kernels, all read before the first registration: one at a backend key changes what a
  // CompositeImplicitAutograd op (l1_loss, kl_div) computes at its Autograd key.
  std::vector<Original> originals;
  auto read = [&](c10::DispatchKey key, std::optional<c10::DispatchKey> autocast) {
    if (!aten.hasComputedKernelForDispatchKey(key)) {
      return;  // torch has no kernel there (PrivateUse1 without torch_npu, ...): leave its error alone
    }
    originals.push_back(Original{key, autocast, compat::computed_kernel(aten, key)});
  };
  read(c10::DispatchKey::FuncTorchBatched, std::nullopt);
  for (const DeviceKeys& device : kDevices) {
    read(device.backend, device.autocast);
    read(device.autograd, device.autocast);
  }
  for (Original& original : originals) {
    auto kernel = std::make_unique<RoutingKernel>(
        route.accepts, ours, std::move(original.kernel), autocast_exclusion(aten, ours, original.autocast));
    library.impl(route.overload.c_str(),
                 torch::dispatch(original.key, torch::CppFunction::makeFromBoxedFunctor(std::move(kernel))));
  }
}

// The routing kernels now registered. Never destroyed at exit: deregistering while the dispatcher itself is
// being destroyed is not safe, and the process is ending anyway.
torch::Library* g_library = nullptr;

}  // namespace

std::vector<std::pair<std::string, std::string>> routes() {
  std::vector<std::pair<std::string, std::string>> rows;
  for (const Route& route : all_routes()) {
    rows.emplace_back(route.loss, route.overload);
  }
  return rows;
}

void set_routed(const std::vector<std::string>& overloads) {
  std::vector<const Route*> selected;
  for (const std::string& overload : overloads) {
    selected.push_back(&find_route(overload));  // before any change, so that a bad name changes nothing
  }
  delete g_library;
  g_library = nullptr;
  if (selected.empty()) {
    return;
  }
  auto library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", std::nullopt, __FILE__, __LINE__);
  Quiet quiet;
  c10::WarningUtils::WarningHandlerGuard silence(&quiet);
  for (const Route* route : selected) {
    register_route(*library, *route);  // on an exception, `library` is destroyed: nothing stays routed
  }
  g_library = library.release();
}

const c10::FunctionSchema& aten_schema(const std::string& overload) {
  find_route(overload);  // a name enable() does not route is a ValueError, as everywhere here
  return find_op("aten", overload).schema();
}

bool accepts(const std::string& overload, const std::vector<c10::IValue>& args) {
  const Route& route = find_route(overload);
  const size_t n = find_op("aten", overload).schema().arguments().size();
  TORCH_CHECK_VALUE(args.size() == n, "accepts: ", overload, " takes ", n, " arguments, got ", args.size());
  return route.accepts(args.data(), args.size());
}

}  // namespace npu_loss::enable
