// The glibc floor of the compiled libraries: what lets a wheel built on a newer glibc (Debian 12: 2.36) load
// on glibc 2.28 (manylinux_2_28, torch's own wheels' tag: Kylin V10, openEuler 20.03, EulerOS, RHEL 8).
// Linked into _C and _C_npu (setup.py); docs/usage.md, "Deploying", has the floor and how it is checked
// (scripts/build_wheel.sh).
//
// Two references would otherwise raise it above 2.28:
//
// 1. __libc_single_threaded (GLIBC_2.32). libstdc++'s headers from GCC 11 on (ext/atomicity.h) read it,
//    when compiled against glibc >= 2.32, to skip the atomic instruction of a reference count
//    (std::shared_ptr, std::locale...) while the process has one thread. The definition below, hidden
//    (the linker binds this library's references to it; nothing is exported), is always 0, "maybe
//    multi-threaded": every such count is then atomic, which is always correct and is what libstdc++ does
//    without glibc's variable (torch itself, built on glibc 2.28, never reads it). The cost is an atomic
//    increment where a single-threaded process could have used a plain one.
//
// 2. exp and log (GLIBC_2.29). glibc 2.29 gave them new symbol versions that drop the SVID error wrapper
//    (errno and matherr handling on overflow, underflow and domain errors); the old versions wrap the same
//    implementation. setup.py links with -Wl,--wrap=exp -Wl,--wrap=log, so every call
//    of exp and log in the library reaches __wrap_exp and __wrap_log below, which call the versions every
//    glibc since the architecture's first one provides and give the current versions' results bit for bit
//    (log's one difference, the NaN of x < 0, is handled there); only errno may differ, which nothing here
//    reads (the kernels are built with -fno-math-errno).
//
// Nothing else in the libraries needs a glibc above 2.28, and their libstdc++ versions (GLIBCXX_3.4.21,
// CXXABI_1.3.9 at most with GCC 12) are within manylinux_2_28's; auditwheel checks both at every wheel build.

#if defined(__linux__) && __has_include(<features.h>)
#include <features.h>  // defines __GLIBC__ under glibc
#endif

#if defined(__linux__) && defined(__GLIBC__)

extern "C" {

__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;

// The architecture's first glibc symbol version. setup.py wraps exp and log on these two only; elsewhere
// the library keeps glibc's current versions.
#if defined(__x86_64__) || defined(__aarch64__)
#if defined(__x86_64__)
#define NPU_LOSS_GLIBC_BASE "GLIBC_2.2.5"
#else
#define NPU_LOSS_GLIBC_BASE "GLIBC_2.17"
#endif

// References to these two names become references to exp and log at the base version.
double npu_loss_exp_base(double);
double npu_loss_log_base(double);
__asm__(".symver npu_loss_exp_base, exp@" NPU_LOSS_GLIBC_BASE);
__asm__(".symver npu_loss_log_base, log@" NPU_LOSS_GLIBC_BASE);

__attribute__((visibility("hidden"))) double __wrap_exp(double x) { return npu_loss_exp_base(x); }
// log's base version differs from the current one in one result: for x < 0 its SVID wrapper returns +NaN,
// where glibc 2.29's log returns the invalid operation's NaN, (x - x) / (x - x) (its __math_invalid; negative
// on x86-64). That case is computed here the same way, so every result is the current log's, bit for bit.
__attribute__((visibility("hidden"))) double __wrap_log(double x) {
  if (x < 0) return (x - x) / (x - x);
  return npu_loss_log_base(x);
}
#endif

}  // extern "C"

#endif
