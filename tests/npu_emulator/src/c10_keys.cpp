// Test harness only (README.md, "torch_npu on a CUDA build of torch"): reads and edits c10's process-wide set of
// allocator-setting keys, whose address c10_keys.py finds in libc10.so. Built by build.sh into
// OUT_DIR/harness/, never into the stand-in CANN libraries, and never part of npu_loss_ops.
//
// The set is c10::CachingAllocator::AcceleratorAllocatorConfig's std::unordered_set<std::string> (c10/core/
// AllocatorConfig.h). This file is compiled with the CXX11 ABI torch was built with, so the type is the same.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <unordered_set>

namespace {
using KeySet = std::unordered_set<std::string>;
}  // namespace

extern "C" {

// Writes the keys, one per line, into buf (at most n bytes with the terminating NUL); returns the size the
// whole list needs, NUL included (call with n = 0 first).
__attribute__((visibility("default"))) size_t npu_emu_c10keys_list(const void* set, char* buf, size_t n) {
  std::string all;
  for (const auto& key : *static_cast<const KeySet*>(set)) {
    all += key;
    all += '\n';
  }
  if (buf != nullptr && n > 0) {
    const size_t m = std::min(n - 1, all.size());
    std::memcpy(buf, all.data(), m);
    buf[m] = '\0';
  }
  return all.size() + 1;
}

// Removes one key; returns how many were removed (0 or 1).
__attribute__((visibility("default"))) int npu_emu_c10keys_erase(void* set, const char* key) {
  return static_cast<int>(static_cast<KeySet*>(set)->erase(key));
}

}  // extern "C"
