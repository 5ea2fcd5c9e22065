// Autocast: under torch.autocast a loss whose declaration says so (losses.h, autocast_float32) runs its
// forward in float32, as torch.nn's losses do (PyTorch lists its losses among its float32 ops on CPU and on
// accelerators). torch.library.register_autocast refuses ops
// with keyword-only arguments (kl_div's log_target), so the Autocast kernels are registered here directly,
// for CPU and for PrivateUse1 (the NPU).
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "../core/ops.h"

namespace npu_loss {
namespace {

// A forward loss (self, target, reduction, scalars...) run with self and target cast to float32.
template <c10::DeviceType device, c10::DispatchKey key, typename Loss, typename Scalars = ScalarsOf<Loss>>
struct AutocastLoss;

template <c10::DeviceType device, c10::DispatchKey key, typename Loss, typename... S>
struct AutocastLoss<device, key, Loss, std::tuple<S...>> {
  static at::Tensor call(const at::Tensor& self, const at::Tensor& target, int64_t reduction, S... s) {
    const auto& handle = ops::forward<Loss>();
    c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
    return handle.call(
        at::autocast::cached_cast(at::kFloat, self, device), at::autocast::cached_cast(at::kFloat, target, device),
        reduction, s...);
  }
};

template <c10::DeviceType device, c10::DispatchKey key>
void register_autocast(torch::Library& m) {
  for_each_elementwise_loss([&]<typename Loss>() {
    if constexpr (Loss::decl.autocast_float32) m.impl(Loss::decl.forward, &AutocastLoss<device, key, Loss>::call);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, AutocastCPU, m) {
  register_autocast<c10::DeviceType::CPU, c10::DispatchKey::AutocastCPU>(m);
}

TORCH_LIBRARY_IMPL(npu_loss, AutocastPrivateUse1, m) {
  register_autocast<c10::DeviceType::PrivateUse1, c10::DispatchKey::AutocastPrivateUse1>(m);
}

}  // namespace npu_loss
