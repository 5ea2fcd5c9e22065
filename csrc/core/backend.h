// What every backend's kernels share: the functional and out= kernels of a loss's backward op, made once
// from the op's checks and the backend's `into` kernel, and the registration of a loss's three ops.
//
// A backend writes, per loss, its forward kernel and an into kernel that writes the backward's result into
// a tensor of the result's shape:
//
//   void into(at::Tensor& out, const ResultSpec& spec, const at::Tensor& grad_output, const at::Tensor& self,
//             const at::Tensor& target, <the op's scalar arguments>...);
//
// BackendKernels<&into>::functional<&check> checks, allocates the result (empty_result) and calls into;
// BackendKernels<&into>::out<&check_out> runs the out= checks and calls into on out. impl_loss registers a
// loss's forward kernel and those two, so a backend file holds its kernels and one registration per loss.
#pragma once

#include <ATen/DeviceGuard.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <tuple>
#include <utility>

#include "checks.h"

namespace npu_loss {

// The device guard a backend's kernels run under: none on CPU and in the composite, self's device on the NPU.
struct NoDeviceGuard {
  explicit NoDeviceGuard(const at::Tensor&) {}
};

struct SelfDeviceGuard {
  explicit SelfDeviceGuard(const at::Tensor& self) : guard(at::device_of(self)) {}
  c10::OptionalDeviceGuard guard;
};

namespace detail {

// check(args...) with the leading arguments check takes: an op's checks take the tensors and the scalars
// that decide the result (KL's take no log_target).
template <typename Spec, typename... Params, typename... Args>
Spec check_leading(Spec (*check)(Params...), const Args&... args) {
  const auto all = std::tie(args...);
  return [&]<size_t... I>(std::index_sequence<I...>) {
    return check(std::get<I>(all)...);
  }(std::index_sequence_for<Params...>{});
}

// check_out(args..., out) with the leading arguments check_out takes before out.
template <typename Spec, typename... Params, typename... Args>
Spec check_leading_and_out(Spec (*check_out)(Params...), const at::Tensor& out, const Args&... args) {
  const auto all = std::tie(args...);
  return [&]<size_t... I>(std::index_sequence<I...>) {
    return check_out(std::get<I>(all)..., out);
  }(std::make_index_sequence<sizeof...(Params) - 1>{});
}

}  // namespace detail

template <auto into, typename Guard = NoDeviceGuard, typename Into = decltype(into)>
struct BackendKernels;

template <auto into, typename Guard, typename... Scalars>
struct BackendKernels<
    into, Guard,
    void (*)(at::Tensor&, const ResultSpec&, const at::Tensor&, const at::Tensor&, const at::Tensor&, Scalars...)> {
  template <auto check>
  static at::Tensor functional(
      const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, Scalars... scalars) {
    const Guard guard(self);
    const ResultSpec spec = detail::check_leading(check, grad_output, self, target, scalars...);
    at::Tensor result = empty_result(spec, self.options());
    into(result, spec, grad_output, self, target, scalars...);
    return result;
  }

  template <auto check_out>
  static at::Tensor& out(
      const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, Scalars... scalars,
      at::Tensor& result) {
    const Guard guard(self);
    const ResultSpec spec = detail::check_leading_and_out(check_out, result, grad_output, self, target, scalars...);
    into(result, spec, grad_output, self, target, scalars...);
    return result;
  }
};

// The into kernels of a result summed to a smaller shape (KL's target gradient) start here: true when no
// kernel is needed, because out is empty or the broadcast shape is (then out is zero-filled: the sum over
// nothing is 0; aclnn would leave it unwritten).
inline bool empty_sum_into(at::Tensor& out, const ResultSpec& spec) {
  if (out.numel() == 0) return true;
  if (numel_of(spec.broadcast_shape) != 0) return false;
  out.zero_();
  return true;
}

// A loss's ops: the forward, the backward and the backward's out= overload, and the checks of the last two.
template <auto check_backward, auto check_backward_out>
struct LossOps {
  static constexpr auto check = check_backward;
  static constexpr auto check_out = check_backward_out;
  const char* forward;
  const char* backward;
  const char* backward_out;
  const char* out_arg;  // the out= tensor's name in the schema
  OutDtype out_dtype;   // what its dtype may be (core/checks.h)
};

inline constexpr LossOps<&check_smooth_l1_loss_backward<int64_t>, &check_smooth_l1_loss_backward_out<int64_t>> kSmoothL1Loss{
    "smooth_l1_loss", "smooth_l1_loss_backward", "smooth_l1_loss_backward.grad_input", "grad_input",
    OutDtype::AnyFloating};
inline constexpr LossOps<&check_huber_loss_backward<int64_t>, &check_huber_loss_backward_out<int64_t>> kHuberLoss{
    "huber_loss", "huber_loss_backward", "huber_loss_backward.out", "grad_input", OutDtype::AnyFloating};
inline constexpr LossOps<&check_l1_loss_backward<int64_t>, &check_l1_loss_backward_out<int64_t>> kL1Loss{
    "l1_loss", "l1_loss_backward", "l1_loss_backward.grad_input", "grad_input", OutDtype::AnyFloating};
inline constexpr LossOps<&check_kl_div_target_backward<int64_t>, &check_kl_div_target_backward_out<int64_t>> kKlDiv{
    "kl_div", "kl_div_target_backward", "kl_div_target_backward.grad_target", "grad_target",
    OutDtype::EqualsResult};

// Registers a backend's kernels for `loss`: `forward`, and the backward's functional and out= kernels made
// from `into`.
template <const auto& loss, auto forward, auto into, typename Guard = NoDeviceGuard>
void impl_loss(torch::Library& m) {
  using Ops = std::remove_cvref_t<decltype(loss)>;
  using Kernels = BackendKernels<into, Guard>;
  m.impl(loss.forward, forward);
  m.impl(loss.backward, &Kernels::template functional<Ops::check>);
  m.impl(loss.backward_out, &Kernels::template out<Ops::check_out>);
}

}  // namespace npu_loss
