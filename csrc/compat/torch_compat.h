// The differences between the torch releases npu_loss_ops builds against, in one place: README,
// "Supported versions" (build_config.py's table, 2.6 to 2.15). Each difference sits behind TORCH_VERSION_*
// guards with the change it follows; no other C++ file tests a torch version.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/function.h>
#include <torch/version.h>

#include <memory>
#include <type_traits>

#define NPU_LOSS_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace npu_loss::compat {

// ---- who owns an autograd graph node ----
// torch 2.9 holds a torch::autograd::Node in a std::shared_ptr (Node derives from
// std::enable_shared_from_this; generated nodes are made with `new` and torch::autograd::deleteNode, and
// set_history takes a shared_ptr). pytorch/pytorch#181782 ("Convert shared_ptr<Node> to intrusive_ptr<Node>",
// April 2026) made Node a c10::intrusive_ptr_target made with c10::make_intrusive; 2.13 and 2.14 have it.
// Which of 2.10-2.12 has it is read from Node itself, so those untested releases build either way; on the
// tested ones the guard and the type must agree.
inline constexpr bool kIntrusiveNodes = std::is_base_of_v<c10::intrusive_ptr_target, torch::autograd::Node>;
#if NPU_LOSS_TORCH_AT_LEAST(2, 13)
static_assert(kIntrusiveNodes, "torch >= 2.13 holds autograd nodes in c10::intrusive_ptr (pytorch#181782)");
#elif !NPU_LOSS_TORCH_AT_LEAST(2, 10)
static_assert(!kIntrusiveNodes, "torch <= 2.9 holds autograd nodes in std::shared_ptr");
#endif

template <class T>
using NodePtr = std::conditional_t<kIntrusiveNodes, c10::intrusive_ptr<T>, std::shared_ptr<T>>;

// A new node of type T, owned the way this torch owns nodes.
template <class T>
NodePtr<T> make_node() {
  if constexpr (kIntrusiveNodes) {
    return c10::make_intrusive<T>();
  } else {
    // torch::autograd::deleteNode releases a long chain of nodes iteratively instead of recursing, as
    // generated code does. Called unqualified on a T*, it is found (by argument-dependent lookup) only when
    // this branch is instantiated: releases with intrusive nodes no longer have it (2.14).
    return std::shared_ptr<T>(new T(), [](T* node) { deleteNode(node); });
  }
}

// ---- the kernel an operator has at one dispatch key ----
// enable() keeps the kernel torch had at a key before it registers its own there, to call it for the calls
// the package's checks reject. torch 2.9 added OperatorHandle::getComputedKernelForDispatchKey, which
// returns a SafeKernelFunction (it also notices a kernel whose library was deregistered since). torch 2.6
// to 2.8 have no public getter: the computed dispatch table entry is read through the handle's private
// OperatorDef, named in an explicit instantiation (where C++ does not check access, [temp.spec.general]),
// and copied as a c10::KernelFunction (which holds its boxed functor by reference count). Both are called
// with callBoxed(op, keys, stack).
#if NPU_LOSS_TORCH_AT_LEAST(2, 9)
using KernelRef = c10::SafeKernelFunction;

inline KernelRef computed_kernel(const c10::OperatorHandle& op, c10::DispatchKey key) {
  return op.getComputedKernelForDispatchKey(key);
}
#else
using KernelRef = c10::KernelFunction;

namespace detail {
struct OperatorDefOf {
  friend constexpr auto operator_def_member(OperatorDefOf);
};
template <auto Member>
struct Expose {
  friend constexpr auto operator_def_member(OperatorDefOf) { return Member; }
};
template struct Expose<&c10::OperatorHandle::operatorDef_>;
}  // namespace detail

inline KernelRef computed_kernel(const c10::OperatorHandle& op, c10::DispatchKey key) {
  const auto def = op.*operator_def_member(detail::OperatorDefOf{});
  return def->op.lookup(c10::DispatchKeySet(key));
}
#endif

}  // namespace npu_loss::compat
