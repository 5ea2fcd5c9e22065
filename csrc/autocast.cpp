// Autocast: under torch.autocast the losses run in float32, as torch.nn's losses do (PyTorch lists
// l1_loss, smooth_l1_loss and kl_div among its float32 ops on CPU and on accelerators).
// torch.library.register_autocast refuses ops with keyword-only arguments (kl_div's log_target), so the
// Autocast kernels are registered here directly, for CPU and for PrivateUse1 (the NPU).
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "ops.h"

namespace npu_loss {
namespace {

// A forward loss (self, target, reduction, scalars...) run with self and target cast to float32.
template <c10::DeviceType device, c10::DispatchKey key, typename Sig, const c10::TypedOperatorHandle<Sig>& (*op)()>
struct AutocastLoss;

template <
    c10::DeviceType device, c10::DispatchKey key, typename... Scalars,
    const c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, Scalars...)>& (*op)()>
struct AutocastLoss<device, key, at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, Scalars...), op> {
  static at::Tensor call(const at::Tensor& self, const at::Tensor& target, int64_t reduction, Scalars... s) {
    const auto& handle = op();
    c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
    return handle.call(
        at::autocast::cached_cast(at::kFloat, self, device), at::autocast::cached_cast(at::kFloat, target, device),
        reduction, s...);
  }
};

template <c10::DeviceType device, c10::DispatchKey key>
void register_autocast(torch::Library& m) {
  m.impl("smooth_l1_loss", &AutocastLoss<device, key, ops::LossSmoothL1, ops::smooth_l1_loss>::call);
  m.impl("l1_loss", &AutocastLoss<device, key, ops::LossL1, ops::l1_loss>::call);
  m.impl("kl_div", &AutocastLoss<device, key, ops::LossKl, ops::kl_div>::call);
  m.impl("huber_loss", &AutocastLoss<device, key, ops::LossHuber, ops::huber_loss>::call);
}

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, AutocastCPU, m) {
  register_autocast<c10::DeviceType::CPU, c10::DispatchKey::AutocastCPU>(m);
}

TORCH_LIBRARY_IMPL(npu_loss, AutocastPrivateUse1, m) {
  register_autocast<c10::DeviceType::PrivateUse1, c10::DispatchKey::AutocastPrivateUse1>(m);
}

}  // namespace npu_loss
