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
using LossHuber = LossSmoothL1;          // delta in beta's place
using BackwardHuber = BackwardSmoothL1;

template <typename Schema>
c10::TypedOperatorHandle<Schema> find(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Schema>();
}

// `name()`: the handle of npu_loss::name, typed by `Schema`, found once.
#define NPU_LOSS_OP(name, Schema)                                         \
  inline const c10::TypedOperatorHandle<Schema>& name() {                 \
    static const auto op = find<Schema>("npu_loss::" #name);              \
    return op;                                                            \
  }

NPU_LOSS_OP(smooth_l1_loss, LossSmoothL1)
NPU_LOSS_OP(l1_loss, LossL1)
NPU_LOSS_OP(kl_div, LossKl)
NPU_LOSS_OP(smooth_l1_loss_backward, BackwardSmoothL1)
NPU_LOSS_OP(l1_loss_backward, BackwardL1)
NPU_LOSS_OP(kl_div_target_backward, BackwardKl)
NPU_LOSS_OP(huber_loss, LossHuber)
NPU_LOSS_OP(huber_loss_backward, BackwardHuber)

#undef NPU_LOSS_OP

}  // namespace npu_loss::ops
