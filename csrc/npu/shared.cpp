// _C_npu's own copy of the shared checks and the composite math: the NPU kernels validate exactly as the
// CPU kernels do, and fall back to the same composite. A separate translation unit (rather than listing
// ../checks.cpp twice) keeps the two modules' object files apart; the define leaves the composite
// registrations to _C.
#define NPU_LOSS_NPU_MODULE
#include "../checks.cpp"
#include "../composite.cpp"
