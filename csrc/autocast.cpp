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

template <c10::DeviceType device, c10::DispatchKey key>
struct AutocastLosses {
  static at::Tensor to_float(const at::Tensor& t) {
    return at::autocast::cached_cast(at::kFloat, t, device);
  }

  static at::Tensor smooth_l1_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta) {
    const auto& op = ops::smooth_l1_loss();
    c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
    return op.call(to_float(self), to_float(target), reduction, beta);
  }

  static at::Tensor l1_loss(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
    const auto& op = ops::l1_loss();
    c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
    return op.call(to_float(self), to_float(target), reduction);
  }

  static at::Tensor kl_div(const at::Tensor& self, const at::Tensor& target, int64_t reduction, bool log_target) {
    const auto& op = ops::kl_div();
    c10::impl::ExcludeDispatchKeyGuard no_autocast(key);
    return op.call(to_float(self), to_float(target), reduction, log_target);
  }
};

using CpuAutocast = AutocastLosses<c10::DeviceType::CPU, c10::DispatchKey::AutocastCPU>;
using NpuAutocast = AutocastLosses<c10::DeviceType::PrivateUse1, c10::DispatchKey::AutocastPrivateUse1>;

}  // namespace

TORCH_LIBRARY_IMPL(npu_loss, AutocastCPU, m) {
  m.impl("smooth_l1_loss", &CpuAutocast::smooth_l1_loss);
  m.impl("l1_loss", &CpuAutocast::l1_loss);
  m.impl("kl_div", &CpuAutocast::kl_div);
}

TORCH_LIBRARY_IMPL(npu_loss, AutocastPrivateUse1, m) {
  m.impl("smooth_l1_loss", &NpuAutocast::smooth_l1_loss);
  m.impl("l1_loss", &NpuAutocast::l1_loss);
  m.impl("kl_div", &NpuAutocast::kl_div);
}

}  // namespace npu_loss
