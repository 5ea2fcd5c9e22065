// The composite (ATen-op) implementation of every loss's functional ops, after the shared checks:
// Composite<Loss>::forward and ::backward. Registered as the CompositeExplicitAutograd fallback in _C
// (registration/composite.cpp), and called by the NPU kernels for calls a chip's aclnn kernel cannot serve
// (compiled into _C_npu too). Each loss's formulas are in math.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

#include "../losses.h"

namespace npu_loss {

template <typename Loss, typename Scalars = ScalarsOf<Loss>>
struct Composite;

template <typename Loss, typename... S>
struct Composite<Loss, std::tuple<S...>> {
  static at::Tensor forward(const at::Tensor& self, const at::Tensor& target, int64_t reduction, S... s);
  static at::Tensor backward(
      const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target, int64_t reduction, S... s);
};

}  // namespace npu_loss
