// One typed dispatcher handle per npu_loss op, looked up once per process. `.call(...)` enters the
// dispatcher at the top (autograd, vmap, autocast all apply); `.redispatch(ks, ...)` continues below the
// keys a kernel has masked off.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

namespace npu_loss::ops {

using LossSmoothL1 = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, double);
using LossL1 = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t);
using LossKl = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, bool);
using BackwardSmoothL1 = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, double);
using BackwardL1 = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t);
using BackwardKl = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, bool);

template <typename Schema>
c10::TypedOperatorHandle<Schema> find(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Schema>();
}

inline const c10::TypedOperatorHandle<LossSmoothL1>& smooth_l1_loss() {
  static const auto op = find<LossSmoothL1>("npu_loss::smooth_l1_loss");
  return op;
}

inline const c10::TypedOperatorHandle<LossL1>& l1_loss() {
  static const auto op = find<LossL1>("npu_loss::l1_loss");
  return op;
}

inline const c10::TypedOperatorHandle<LossKl>& kl_div() {
  static const auto op = find<LossKl>("npu_loss::kl_div");
  return op;
}

inline const c10::TypedOperatorHandle<BackwardSmoothL1>& smooth_l1_loss_backward() {
  static const auto op = find<BackwardSmoothL1>("npu_loss::smooth_l1_loss_backward");
  return op;
}

inline const c10::TypedOperatorHandle<BackwardL1>& l1_loss_backward() {
  static const auto op = find<BackwardL1>("npu_loss::l1_loss_backward");
  return op;
}

inline const c10::TypedOperatorHandle<BackwardKl>& kl_div_target_backward() {
  static const auto op = find<BackwardKl>("npu_loss::kl_div_target_backward");
  return op;
}

}  // namespace npu_loss::ops
