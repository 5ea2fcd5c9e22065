// The Python module _C: importing it runs the static op registrations; build_info() says what was built.
#include <torch/extension.h>

#include <string>

namespace {

// The ISA the target_clones kernels run at on this CPU (the resolver picks the same one).
std::string cpu_kernel_isa() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4 (AVX512)";
  if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3 (AVX2)";
  return "x86-64 baseline (SSE2)";
#elif defined(__aarch64__)
  return "aarch64 (NEON)";
#else
  return "generic";
#endif
}

pybind11::dict build_info() {
  pybind11::dict info;
  info["cpu_kernel_isa"] = cpu_kernel_isa();
#if defined(_OPENMP)
  info["openmp"] = true;
#else
  info["openmp"] = false;
#endif
  info["compiler"] = std::string(__VERSION__);
  return info;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "npu_loss_ops: operator registrations and CPU kernels";
  m.def("build_info", &build_info, "What this build of _C contains and which CPU kernels it runs.");
}
