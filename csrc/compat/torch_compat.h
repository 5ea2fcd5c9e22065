// The differences between the torch releases npu_loss_ops builds against, in one place: README,
// "Supported versions" (2.9, 2.13 and 2.14 are built and tested; the releases between them are expected
// to build). Each difference sits behind TORCH_VERSION_* guards with the change it follows; no other C++
// file tests a torch version.
#pragma once

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

}  // namespace npu_loss::compat
