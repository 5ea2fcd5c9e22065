// The eight aclnn loss APIs of the host-emulated CANN, chip by chip:
//   aclnnSmoothL1LossBackward, aclnnL1LossBackward, aclnnKlDivTargetBackward, aclnnMseLossBackward,
//   aclnnSmoothL1Loss, aclnnL1Loss, aclnnKlDiv, aclnnMseLoss.
// Kept in their own object file: build.sh links a libopapi.so without it (an older CANN toolkit).
//
// Validation and results follow the CANN documents as summarised in
// docs/aclnn_reference.md; every rule cites its section there ("§1.2 step 3" etc.).
// Chip families (from aclrtGetSocName, see npuemu_soc_family):
//   910, 910B, 910_93, 310P  TBE kernels (the 910-family semantics); 950  regbase kernels;
//   310B  none of the eight APIs.
// Unknown SoC names are treated as the 910 family.

#include <ATen/ExpandUtils.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/log.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <limits>

#include "ops.h"

using emu::T;
using emu::TensorDesc;

namespace {

// ---------------------------------------------------------------------------------------------------------
// Chips and dtype lists.

struct Chip {
  std::string family;
  bool regbase() const { return family == "950"; }                           // Ascend950 (arch35)
  bool dav2201() const { return family == "910B" || family == "910_93"; }    // Atlas A2 / A3
  bool none() const { return family == "310B"; }                              // Atlas 200I/500 A2
  bool bf16() const { return dav2201() || regbase(); }
};

Chip chip() { return Chip{emu::family()}; }

using DtypeList = std::vector<aclDataType>;

// §1.2 step 3, §4 (aclnnSmoothL1Loss), §4 (aclnnKlDiv): fp32/fp16/bf16 on DAV_2201 and regbase, fp32/fp16
// otherwise; nothing on Ascend310B (the documents' product tables leave it out).
DtypeList float_list(const Chip& c) {
  if (c.none()) return {};
  if (c.bf16()) return {ACL_FLOAT, ACL_FLOAT16, ACL_BF16};
  return {ACL_FLOAT, ACL_FLOAT16};
}

// §3.2 step 2: fp32/fp16/bf16 on 910B, 910_93 and regbase; an EMPTY list elsewhere (910, 310P: always 161002).
DtypeList kl_target_list(const Chip& c) {
  if (c.bf16()) return {ACL_FLOAT, ACL_FLOAT16, ACL_BF16};
  return {};
}

bool in_list(aclDataType t, const DtypeList& l) { return std::find(l.begin(), l.end(), t) != l.end(); }

std::string list_str(const DtypeList& l) {
  if (l.empty()) return std::string("[] (the API is not supported on ") + npuemu_soc_name() + ")";
  std::string s = "[";
  for (size_t i = 0; i < l.size(); ++i) s += (i ? ", " : "") + std::string(emu::dtype_name(l[i]));
  return s + "]";
}

// aclnn's PromoteType: by dtype only (no 0-dim rule). False when the pair has no promotion.
bool promote(aclDataType a, aclDataType b, aclDataType* out) {
  if (!emu::has_at(a) || !emu::has_at(b)) return false;
  try {
    *out = emu::to_acl(at::promoteTypes(emu::to_at(a), emu::to_at(b)));
    return *out != ACL_DT_UNDEFINED;
  } catch (...) {
    return false;
  }
}

// CanCast: float -> any float, int -> float allowed; float -> int, complex -> real, x -> bool not.
bool can_cast(aclDataType from, aclDataType to) {
  if (!emu::has_at(from) || !emu::has_at(to)) return false;
  return c10::canCast(emu::to_at(from), emu::to_at(to));
}

bool broadcast(at::IntArrayRef a, at::IntArrayRef b, std::vector<int64_t>* out) {
  if (!emu::broadcastable(a, b)) return false;
  *out = emu::broadcast_shape(a, b);
  return true;
}

bool is_private_format(aclFormat f) {
  switch (f) {
    case ACL_FORMAT_ND:
    case ACL_FORMAT_NCHW:
    case ACL_FORMAT_NHWC:
    case ACL_FORMAT_HWCN:
    case ACL_FORMAT_NDHWC:
    case ACL_FORMAT_NCDHW:
    case ACL_FORMAT_NCL:
      return false;
    default:
      return true;
  }
}

constexpr int64_t kMaxDims = 8;  // MAX_SUPPORT_DIMS_NUMS

#define REJECT(API, WHY) return emu::reject(API, ACLNN_ERR_PARAM_INVALID, WHY)

at::Tensor f32(const TensorDesc& d) { return d.get().to(at::kFloat); }

// Reads as dtype `t` first (the aclnn Cast to the promoted type), then widens to fp32 for the kernel.
at::Tensor f32_via(const TensorDesc& d, at::ScalarType t) { return d.get().to(t).to(at::kFloat); }

float inv_count(int64_t n) { return static_cast<float>(1.0 / static_cast<double>(n)); }

float nanf() { return std::numeric_limits<float>::quiet_NaN(); }

}  // namespace

// =========================================================================================================
// aclnnSmoothL1LossBackward(gradOut, self, target, int64_t reduction, float beta, gradInput)

EMU_API aclnnStatus aclnnSmoothL1LossBackwardGetWorkspaceSize(const aclTensor* gradOut, const aclTensor* self,
                                                              const aclTensor* target, int64_t reduction, float beta,
                                                              aclTensor* gradInput, uint64_t* ws,
                                                              aclOpExecutor** ex) {
  const char* api = "aclnnSmoothL1LossBackward";
  // §1.2 step 1: workspaceSize or executor null -> 161001
  if (ws == nullptr || ex == nullptr) return emu::reject(api, ACLNN_ERR_PARAM_NULLPTR, "§1.2 step 1: workspaceSize or executor is null");
  // §1.2 step 2: any tensor null -> 161001
  if (!gradOut || !self || !target || !gradInput)
    return emu::reject(api, ACLNN_ERR_PARAM_NULLPTR, "§1.2 step 2: gradOut, self, target or gradInput is null");
  auto g = T(gradOut), s = T(self), t = T(target), o = T(gradInput);
  Chip c = chip();
  // §1.2 step 3: each of the four dtypes in the SoC's list
  DtypeList list = float_list(c);
  for (auto* d : {&g, &s, &t, &o}) {
    if (!in_list(d->dtype, list))
      REJECT(api, std::string("§1.2 step 3: dtype ") + emu::dtype_name(d->dtype) + " not in " + list_str(list));
  }
  // §1.2 step 4: max rank of gradOut/self/target <= 8 (gradInput's rank is not checked)
  if (std::max({g.dim(), s.dim(), t.dim()}) > kMaxDims) REJECT(api, "§1.2 step 4: more than 8 dimensions");
  // §1.2 step 5: reduction in [0, 2]
  if (reduction < 0 || reduction > 2) REJECT(api, "§1.2 step 5: reduction " + std::to_string(reduction) + " not in [0, 2]");
  // §1.2 step 6: beta >= 0 (NaN fails the test too; +inf passes)
  if (!(beta >= 0)) REJECT(api, "§1.2 step 6: beta must be >= 0, got " + std::to_string(beta));
  // §1.2 step 7: promote(promote(gradOut, self), target) exists, is in the list, casts to gradInput
  aclDataType p1, pt;
  if (!promote(g.dtype, s.dtype, &p1) || !promote(p1, t.dtype, &pt)) REJECT(api, "§1.2 step 7: dtypes do not promote");
  if (!in_list(pt, list)) REJECT(api, std::string("§1.2 step 7: promoted dtype ") + emu::dtype_name(pt) + " not in the list");
  if (!can_cast(pt, o.dtype)) REJECT(api, "§1.2 step 7: promoted dtype cannot be cast to gradInput's dtype");
  // §1.2 step 8: broadcast(broadcast(gradOut, self), target) exists and equals gradInput's view shape
  std::vector<int64_t> b1, B;
  if (!broadcast(g.sizes, s.sizes, &b1) || !broadcast(b1, t.sizes, &B))
    REJECT(api, "§1.2 step 8: gradOut, self and target do not broadcast");
  if (B != o.sizes)
    REJECT(api, "§1.2 step 8: gradInput shape " + emu::shape_str(o.sizes) + " != broadcast shape " + emu::shape_str(B));
  // §1.2 step 9: any input empty -> success, workspace 0, nothing launched
  bool empty = g.numel() == 0 || s.numel() == 0 || t.numel() == 0;

  at::ScalarType promoted = emu::to_at(pt);
  // "mean" divides by numel(self) as passed (aclnn casts but does not broadcast self) — §1.1, both kernels.
  float cof = reduction == 1 ? inv_count(s.numel()) : 1.0f;
  bool scalar_grad = g.numel() == 1;
  return emu::submit(api, ws, ex, [=] {
    at::Tensor x = f32_via(s, promoted) - f32_via(t, promoted);  // fp32 compute (§1.1)
    at::Tensor dout = f32_via(g, promoted);
    at::Tensor zero = at::zeros({}, at::TensorOptions().dtype(at::kFloat));
    at::Tensor factor;
    double b = beta;
    if (c.regbase()) {
      // §1.1 Ascend950: 1/beta is NaN for |beta| < 1e-6; two DAGs chosen by gradOut's element count.
      float inv = std::fabs(beta) < 1e-6f ? nanf() : 1.0f / beta;
      at::Tensor pos, neg, big;
      if (scalar_grad) {  // exactly one element: -1 where x <= -b, +1 where x >= b, x/b where |x| < b
        pos = x >= b; neg = x <= -b; big = x.abs() >= b;
      } else {            // otherwise: -1 where x < -b, +1 where x > b, x/b where |x| <= b
        pos = x > b; neg = x < -b; big = x.abs() > b;
      }
      factor = at::where(pos, 1.0, zero) + at::where(neg, -1.0, zero);
      factor = factor + at::where(big, zero, x * inv);
    } else {
      // §1.1 TBE (910/910B/910_93/310P): (-1 if x <= -b) + (+1 if x >= b) + (x/(b+1e-6) if |x| < b).
      // A NaN x counts as 0 in the three comparisons; the quadratic term keeps the NaN.
      float denom = static_cast<float>(b + 1e-6);
      at::Tensor xc = at::where(at::isnan(x), zero, x);
      factor = at::where(xc <= -b, -1.0, zero) + at::where(xc >= b, 1.0, zero);
      factor = factor + at::where(xc.abs() < b, x / denom, zero);
    }
    at::Tensor res = factor * dout * cof;  // gradOut broadcast by the kernel (§1.2)
    // The kernel's output has the promoted dtype (rounded to nearest), then Cast to gradInput's dtype.
    o.write(res.to(promoted));
  }, empty);
}
ACLNN_RUN(aclnnSmoothL1LossBackward)

// =========================================================================================================
// aclnnL1LossBackward(gradOutput, self, target, int64_t reduction, gradInput)

EMU_API aclnnStatus aclnnL1LossBackwardGetWorkspaceSize(const aclTensor* gradOutput, const aclTensor* self,
                                                        const aclTensor* target, int64_t reduction,
                                                        aclTensor* gradInput, uint64_t* ws, aclOpExecutor** ex) {
  const char* api = "aclnnL1LossBackward";
  // §2.2 step 1: workspaceSize/executor null, then any tensor null -> 161001
  if (ws == nullptr || ex == nullptr) return emu::reject(api, ACLNN_ERR_PARAM_NULLPTR, "§2.2 step 1: workspaceSize or executor is null");
  if (!gradOutput || !self || !target || !gradInput)
    return emu::reject(api, ACLNN_ERR_PARAM_NULLPTR, "§2.2 step 1: gradOutput, self, target or gradInput is null");
  auto g = T(gradOutput), s = T(self), t = T(target), o = T(gradInput);
  Chip c = chip();
  // §2.2 step 2: reduction in [0, 2], checked BEFORE dtypes
  if (reduction < 0 || reduction > 2) REJECT(api, "§2.2 step 2: reduction " + std::to_string(reduction) + " not in [0, 2]");
  // §2.2 step 3: promote(gradOutput, self) then with target exists; CanCast(promote -> gradInput); promote in
  // the list (fp32/fp16/bf16 on 910B..910E and 950, fp32/fp16 elsewhere). Individual dtypes are NOT checked.
  aclDataType p1, pt;
  if (!promote(g.dtype, s.dtype, &p1) || !promote(p1, t.dtype, &pt)) REJECT(api, "§2.2 step 3: dtypes do not promote");
  if (!can_cast(pt, o.dtype)) REJECT(api, "§2.2 step 3: promoted dtype cannot be cast to gradInput's dtype");
  DtypeList list = float_list(c);
  if (!in_list(pt, list))
    REJECT(api, std::string("§2.2 step 3: promoted dtype ") + emu::dtype_name(pt) + " not in " + list_str(list));
  // §2.2 step 4: every rank <= 8; self ⊕ gradOutput ⊕ target broadcast; equals gradInput's view shape
  for (auto* d : {&g, &s, &t, &o})
    if (d->dim() > kMaxDims) REJECT(api, "§2.2 step 4: more than 8 dimensions");
  std::vector<int64_t> b1, B;
  if (!broadcast(s.sizes, g.sizes, &b1) || !broadcast(b1, t.sizes, &B))
    REJECT(api, "§2.2 step 4: gradOutput, self and target do not broadcast");
  if (B != o.sizes)
    REJECT(api, "§2.2 step 4: gradInput shape " + emu::shape_str(o.sizes) + " != broadcast shape " + emu::shape_str(B));
  // §2.2 step 5: FRACTAL_NZ storage only logs a warning
  if (s.format == ACL_FORMAT_FRACTAL_NZ) npuemu_log("%s: self has FRACTAL_NZ storage (warning only, §2.2 step 5)", api);
  // §2.2 step 6: any of self/gradOutput/target empty -> success, no work
  bool empty = g.numel() == 0 || s.numel() == 0 || t.numel() == 0;

  at::ScalarType promoted = emu::to_at(pt);
  int64_t n = 1;
  for (auto d : B) n *= d;
  float cof = reduction == 1 ? inv_count(n) : 1.0f;  // mean: 1/numel(broadcast) on both kernels (§2.1)
  return emu::submit(api, ws, ex, [=] {
    // aclnn BroadcastTo + Cast to the promoted dtype, then the kernel in fp32 (§2.2, §2.1)
    at::Tensor p = f32_via(s, promoted).expand(B), l = f32_via(t, promoted).expand(B);
    at::Tensor grad = f32_via(g, promoted).expand(B);
    at::Tensor zero = at::zeros({}, at::TensorOptions().dtype(at::kFloat));
    at::Tensor res;
    if (c.regbase()) {
      // §2.1 Ascend950: -1 if p < l, +1 if p > l, else 0 (NaN -> 0); multiply in fp32
      at::Tensor sign = at::where(p < l, -1.0, at::where(p > l, 1.0, zero));
      res = sign * grad * cof;
    } else {
      // §2.1 TBE: sign = p > l ? 1 : -1, then p != l ? sign : 0 (NaN -> -grad); grads scaled by cof first
      at::Tensor sign = at::where(p > l, 1.0, -1.0 + zero);
      sign = at::where(p != l, sign, zero);
      res = sign * (grad * cof);
    }
    o.write(res.to(promoted));  // kernel output in the promoted dtype, then Cast to gradInput's dtype
  }, empty);
}
ACLNN_RUN(aclnnL1LossBackward)

// =========================================================================================================
// aclnnKlDivTargetBackward(gradOutput, self, target, int64_t reduction, bool logTarget, gradTarget)

EMU_API aclnnStatus aclnnKlDivTargetBackwardGetWorkspaceSize(const aclTensor* gradOutput, const aclTensor* self,
                                                             const aclTensor* target, int64_t reduction,
                                                             bool logTarget, aclTensor* gradTarget, uint64_t* ws,
                                                             aclOpExecutor** ex) {
  const char* api = "aclnnKlDivTargetBackward";
  // §3.2 step 1: workspaceSize/executor null, then any tensor null -> 161001
  if (ws == nullptr || ex == nullptr) return emu::reject(api, ACLNN_ERR_PARAM_NULLPTR, "§3.2 step 1: workspaceSize or executor is null");
  if (!gradOutput || !self || !target || !gradTarget)
    return emu::reject(api, ACLNN_ERR_PARAM_NULLPTR, "§3.2 step 1: gradOutput, self, target or gradTarget is null");
  auto g = T(gradOutput), s = T(self), t = T(target), o = T(gradTarget);
  Chip c = chip();
  // §3.2 step 2: CanCast(self -> gradTarget); each dtype in the list (empty on 910, 310P); gradTarget == target
  if (!can_cast(s.dtype, o.dtype)) REJECT(api, "§3.2 step 2: self's dtype cannot be cast to gradTarget's dtype");
  DtypeList list = kl_target_list(c);
  for (auto* d : {&g, &s, &t, &o}) {
    if (!in_list(d->dtype, list))
      REJECT(api, std::string("§3.2 step 2: dtype ") + emu::dtype_name(d->dtype) + " not in " + list_str(list));
  }
  if (o.dtype != t.dtype) REJECT(api, "§3.2 step 2: gradTarget's dtype must equal target's dtype");
  // §3.2 step 3: ranks <= 8; self/target broadcast to B; broadcast(gradOutput, B) == B; target == gradTarget shape
  for (auto* d : {&g, &s, &t, &o})
    if (d->dim() > kMaxDims) REJECT(api, "§3.2 step 3: more than 8 dimensions");
  std::vector<int64_t> B, gB;
  if (!broadcast(s.sizes, t.sizes, &B)) REJECT(api, "§3.2 step 3: self and target do not broadcast");
  if (!broadcast(g.sizes, B, &gB) || gB != B)
    REJECT(api, "§3.2 step 3: gradOutput " + emu::shape_str(g.sizes) + " does not broadcast into " + emu::shape_str(B));
  if (t.sizes != o.sizes) REJECT(api, "§3.2 step 3: gradTarget shape must equal target's shape");
  // §3.2 step 4: any private storage format -> 161002
  for (auto* d : {&g, &s, &t, &o}) {
    if (is_private_format(d->format))
      REJECT(api, "§3.2 step 4: private storage format " + std::to_string(static_cast<int>(d->format)));
  }
  // §3.2 step 5: no reduction range check (any other value behaves like "none")
  // §3.2 step 6: only an empty self returns early; gradTarget is then left unwritten
  bool empty = s.numel() == 0;

  // §3.1 cof: mean -> 1/numel(B) (910B/910_93 host graph) or 1/numel(self) (950 tiling);
  //           batchmean (3) -> 1/B[0] or 1/self.shape[0] (950); 0, 2 and anything else -> 1.
  int64_t nB = 1;
  for (auto d : B) nB *= d;
  float cof = 1.0f;
  if (reduction == 1) {
    cof = inv_count(c.regbase() ? s.numel() : nB);
  } else if (reduction == 3) {
    int64_t n0 = c.regbase() ? (s.dim() > 0 ? s.sizes[0] : 1) : (B.empty() ? 1 : B[0]);
    cof = inv_count(n0);
  }
  bool common = g.dtype == s.dtype && s.dtype == t.dtype;
  at::ScalarType in_type = s.scalar_type();
  std::vector<int64_t> tshape = t.sizes;
  return emu::submit(api, ws, ex, [=] {
    at::Tensor gp = f32(g) * cof;  // the reduction is applied to gradOutput first (§3.1)
    at::Tensor x = f32(s), y = f32(t);
    at::Tensor r;
    if (!logTarget) {
      // §3.1: g'·log(t) − g'·self + (g'·t)/t — NaN where t == 0 (and t < 0), not masked
      r = gp * at::log(y) - gp * x + (gp * y) / y;
    } else {
      // §3.1: g'·e^t·(t + 1 − self)
      r = gp * at::exp(y) * ((y + 1.0) - x);
    }
    r = r.expand(B);
    if (c.regbase() && common) r = r.to(in_type).to(at::kFloat);  // 950: the kernel runs in the inputs' dtype
    // ReduceSum over the broadcast axes, reshaped to target's shape, then Cast to gradTarget's dtype (§3.1)
    o.write(at::sum_to(r, tshape));
  }, empty);
}
ACLNN_RUN(aclnnKlDivTargetBackward)

// =========================================================================================================
// Forwards (§4).

// aclnnSmoothL1Loss(self, target, int64_t reduction, float beta, out)
EMU_API aclnnStatus aclnnSmoothL1LossGetWorkspaceSize(const aclTensor* self, const aclTensor* target,
                                                      int64_t reduction, float beta, aclTensor* out, uint64_t* ws,
                                                      aclOpExecutor** ex) {
  const char* api = "aclnnSmoothL1Loss";
  if (ws == nullptr || ex == nullptr) return emu::reject(api, ACLNN_ERR_PARAM_NULLPTR, "§4: workspaceSize or executor is null");
  // §4: null -> 161001
  if (!self || !target || !out) return emu::reject(api, ACLNN_ERR_PARAM_NULLPTR, "§4: self, target or out is null");
  auto s = T(self), t = T(target), o = T(out);
  Chip c = chip();
  // §4: self and target dtypes in the list (fp32/fp16, + bf16 on 910B and later)
  DtypeList list = float_list(c);
  for (auto* d : {&s, &t})
    if (!in_list(d->dtype, list))
      REJECT(api, std::string("§4: dtype ") + emu::dtype_name(d->dtype) + " not in " + list_str(list));
  // §4: the promoted dtype casts to out
  aclDataType pt;
  if (!promote(s.dtype, t.dtype, &pt) || !can_cast(pt, o.dtype)) REJECT(api, "§4: promoted dtype cannot be cast to out");
  // §4: reduction in [0, 2]
  if (reduction < 0 || reduction > 2) REJECT(api, "§4: reduction " + std::to_string(reduction) + " not in [0, 2]");
  // §4: self and target broadcast; out has the broadcast shape for "none"
  std::vector<int64_t> B;
  if (s.dim() > kMaxDims || t.dim() > kMaxDims) REJECT(api, "§4: more than 8 dimensions");
  if (!broadcast(s.sizes, t.sizes, &B)) REJECT(api, "§4: self and target do not broadcast");
  if (reduction == 0 && B != o.sizes)
    REJECT(api, "§4: out shape " + emu::shape_str(o.sizes) + " != broadcast shape " + emu::shape_str(B));
  // §4: beta >= 0
  if (!(beta >= 0)) REJECT(api, "§4: beta must be >= 0");
  at::ScalarType promoted = emu::to_at(pt);
  bool empty = s.numel() == 0 || t.numel() == 0;
  return emu::submit(api, ws, ex, [=] {
    if (empty) {  // §4: empty input: mean -> NaN, sum -> 0, none -> nothing
      if (reduction == 1) o.write(at::scalar_tensor(nanf()));
      if (reduction == 2) o.write(at::scalar_tensor(0.0));
      return;
    }
    at::Tensor d = f32_via(s, promoted) - f32_via(t, promoted);
    at::Tensor ad = d.abs();
    // §4: 0.5·d²/β where |d| < β, |d| − 0.5β elsewhere
    at::Tensor l = at::where(ad < static_cast<double>(beta), d * d * 0.5 / static_cast<double>(beta),
                             ad - 0.5 * static_cast<double>(beta));
    if (reduction == 1) l = l.mean();
    if (reduction == 2) l = l.sum();
    o.write(l.to(promoted));
  }, empty && reduction == 0);
}
ACLNN_RUN(aclnnSmoothL1Loss)

// aclnnL1Loss(self, target, int64_t reduction, out)
EMU_API aclnnStatus aclnnL1LossGetWorkspaceSize(const aclTensor* self, const aclTensor* target, int64_t reduction,
                                                aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  const char* api = "aclnnL1Loss";
  if (ws == nullptr || ex == nullptr) return emu::reject(api, ACLNN_ERR_PARAM_NULLPTR, "§4: workspaceSize or executor is null");
  if (!self || !target || !out) return emu::reject(api, ACLNN_ERR_PARAM_NULLPTR, "§4: self, target or out is null");
  auto s = T(self), t = T(target), o = T(out);
  Chip c = chip();
  // §4: reduction check first
  if (reduction < 0 || reduction > 2) REJECT(api, "§4: reduction " + std::to_string(reduction) + " not in [0, 2]");
  // §4: the promoted dtype must be in {fp32, fp16, int64 (+bf16)}
  aclDataType pt;
  if (!promote(s.dtype, t.dtype, &pt)) REJECT(api, "§4: dtypes do not promote");
  DtypeList list = float_list(c);
  if (!list.empty()) list.push_back(ACL_INT64);
  if (!in_list(pt, list)) REJECT(api, std::string("§4: promoted dtype ") + emu::dtype_name(pt) + " not in " + list_str(list));
  // §4: "mean" needs at least one floating input
  auto floating = [](aclDataType d) { return d == ACL_FLOAT || d == ACL_FLOAT16 || d == ACL_BF16 || d == ACL_DOUBLE; };
  if (reduction == 1 && !floating(s.dtype) && !floating(t.dtype)) REJECT(api, "§4: mean needs a floating input");
  // §4: none -> out has the broadcast shape; mean/sum -> out is 0-d
  std::vector<int64_t> B;
  if (!broadcast(s.sizes, t.sizes, &B)) REJECT(api, "§4: self and target do not broadcast");
  if (reduction == 0 && B != o.sizes)
    REJECT(api, "§4: out shape " + emu::shape_str(o.sizes) + " != broadcast shape " + emu::shape_str(B));
  if (reduction != 0 && o.dim() != 0) REJECT(api, "§4: out must be 0-d for mean/sum");
  at::ScalarType promoted = emu::to_at(pt);
  bool empty = s.numel() == 0 || t.numel() == 0;
  return emu::submit(api, ws, ex, [=] {
    if (empty) {  // §4: empty: mean -> NaN, sum -> 0
      if (reduction == 1) o.write(at::scalar_tensor(nanf()));
      if (reduction == 2) o.write(at::scalar_tensor(0.0));
      return;
    }
    at::Tensor l;
    if (promoted == at::kLong) {
      l = (s.get().to(at::kLong) - t.get().to(at::kLong)).abs();
    } else {
      l = (f32_via(s, promoted) - f32_via(t, promoted)).abs();
    }
    if (reduction == 1) l = l.mean();
    if (reduction == 2) l = l.sum();
    o.write(l.to(promoted));
  }, empty && reduction == 0);
}
ACLNN_RUN(aclnnL1Loss)

// aclnnKlDiv(self, target, int64_t reduction, bool logTarget, out)
EMU_API aclnnStatus aclnnKlDivGetWorkspaceSize(const aclTensor* self, const aclTensor* target, int64_t reduction,
                                               bool logTarget, aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  const char* api = "aclnnKlDiv";
  if (ws == nullptr || ex == nullptr) return emu::reject(api, ACLNN_ERR_PARAM_NULLPTR, "§4: workspaceSize or executor is null");
  if (!self || !target || !out) return emu::reject(api, ACLNN_ERR_PARAM_NULLPTR, "§4: self, target or out is null");
  auto s = T(self), t = T(target), o = T(out);
  Chip c = chip();
  // §4: reduction 0..3 (3 = batchmean)
  if (reduction < 0 || reduction > 3) REJECT(api, "§4: reduction " + std::to_string(reduction) + " not in [0, 3]");
  // §4: dtype list per SoC
  DtypeList list = float_list(c);
  for (auto* d : {&s, &t})
    if (!in_list(d->dtype, list))
      REJECT(api, std::string("§4: dtype ") + emu::dtype_name(d->dtype) + " not in " + list_str(list));
  // §4: the promoted dtype casts to out
  aclDataType pt;
  if (!promote(s.dtype, t.dtype, &pt) || !can_cast(pt, o.dtype)) REJECT(api, "§4: promoted dtype cannot be cast to out");
  // §4: rank <= 8; 0-d inputs are unsqueezed; both broadcast
  if (s.dim() > kMaxDims || t.dim() > kMaxDims) REJECT(api, "§4: more than 8 dimensions");
  std::vector<int64_t> ss = s.sizes.empty() ? std::vector<int64_t>{1} : s.sizes;
  std::vector<int64_t> ts = t.sizes.empty() ? std::vector<int64_t>{1} : t.sizes;
  std::vector<int64_t> B;
  if (!broadcast(ss, ts, &B)) REJECT(api, "§4: self and target do not broadcast");
  at::ScalarType promoted = emu::to_at(pt);
  bool empty = s.numel() == 0 || t.numel() == 0;
  int64_t size0 = ss[0];
  return emu::submit(api, ws, ex, [=] {
    if (empty) {  // §4: empty: mean / batchmean with size(0) == 0 -> NaN, sum -> 0
      if (reduction == 1 || (reduction == 3 && size0 == 0)) o.write(at::scalar_tensor(nanf()));
      if (reduction == 2 || (reduction == 3 && size0 != 0)) o.write(at::scalar_tensor(0.0));
      return;
    }
    at::Tensor x = f32_via(s, promoted).reshape(ss), y = f32_via(t, promoted).reshape(ts);
    at::Tensor l;
    if (logTarget) {
      l = at::exp(y) * (y - x);  // §4: e^t·(t − self)
    } else if (c.regbase()) {
      // §4: the 950 kernel replaces t == 0 by 1 inside the log, so t == 0 contributes 0
      at::Tensor ylog = at::where(y == 0, at::ones({}, y.options()), y);
      l = y * (at::log(ylog) - x);
    } else {
      l = y * (at::log(y) - x);  // §4: t·(log t − self), NaN for t <= 0 as the formula says
    }
    l = l.expand(B);
    if (reduction == 1) l = l.sum() / static_cast<double>(l.numel());
    if (reduction == 2) l = l.sum();
    if (reduction == 3) l = l.sum() / static_cast<double>(size0);  // batchmean: /self.size(0)
    if (reduction == 0) l = l.reshape(o.sizes);
    o.write(l.to(promoted));
  }, empty && reduction == 0);
}
ACLNN_RUN(aclnnKlDiv)

// =========================================================================================================
// aclnnMseLoss(self, target, int64_t reduction, out) and
// aclnnMseLossBackward(gradOutput, self, target, int64_t reduction, gradInput): §9

namespace {
// §9.1: aclnnMseLoss in fp32/fp16 on 910 and 310P, with bf16 on 910B, 910_93 and 950; aclnnMseLossBackward the
// same but not on 910 (no kernel there: every call 161002). Nothing on 310B.
DtypeList mse_list(const Chip& c, bool backward) {
  if (backward && c.family == "910") return {};
  return float_list(c);
}
}  // namespace

EMU_API aclnnStatus aclnnMseLossGetWorkspaceSize(const aclTensor* self, const aclTensor* target, int64_t reduction,
                                                 aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  const char* api = "aclnnMseLoss";
  // §9.2 step 1: null arguments -> 161001
  if (ws == nullptr || ex == nullptr) return emu::reject(api, ACLNN_ERR_PARAM_NULLPTR, "§9.2 step 1: workspaceSize or executor is null");
  if (!self || !target || !out) return emu::reject(api, ACLNN_ERR_PARAM_NULLPTR, "§9.2 step 1: self, target or out is null");
  auto s = T(self), t = T(target), o = T(out);
  const DtypeList list = mse_list(chip(), false);
  // §9.2 step 2: the promoted dtype, self's, target's and out's in the list (out a dtype the promoted one casts to)
  aclDataType pt;
  if (!promote(s.dtype, t.dtype, &pt) || !in_list(pt, list)) REJECT(api, "§9.2 step 2: promoted dtype not in " + list_str(list));
  for (auto* d : {&s, &t, &o})
    if (!in_list(d->dtype, list)) REJECT(api, std::string("§9.2 step 2: dtype ") + emu::dtype_name(d->dtype) + " not in " + list_str(list));
  if (!can_cast(pt, o.dtype)) REJECT(api, "§9.2 step 2: the promoted dtype does not cast to out's");
  // §9.2 steps 3-6: reduction, ranks, broadcast, out's shape
  if (reduction < 0 || reduction > 2) REJECT(api, "§9.2 step 3: reduction " + std::to_string(reduction) + " not in [0, 2]");
  if (s.dim() > kMaxDims || t.dim() > kMaxDims) REJECT(api, "§9.2 step 4: self or target has more than 8 dims");
  std::vector<int64_t> B;
  if (!broadcast(s.sizes, t.sizes, &B)) REJECT(api, "§9.2 step 5: self and target do not broadcast");
  if (reduction == 0 && B != o.sizes)
    REJECT(api, "§9.2 step 6: out shape " + emu::shape_str(o.sizes) + " != broadcast shape " + emu::shape_str(B));
  if (reduction != 0 && o.dim() != 0) REJECT(api, "§9.2 step 6: out must be 0-d for mean/sum");
  const at::ScalarType promoted = emu::to_at(pt);
  const bool empty = s.numel() == 0 || t.numel() == 0;
  return emu::submit(api, ws, ex, [=] {
    if (empty) {  // §9.2: empty: mean -> NaN, sum -> 0
      if (reduction == 1) o.write(at::scalar_tensor(nanf()));
      if (reduction == 2) o.write(at::scalar_tensor(0.0));
      return;
    }
    at::Tensor d = (f32_via(s, promoted) - f32_via(t, promoted)).expand(B);
    at::Tensor l = d * d;
    if (reduction == 1) l = l.sum() / static_cast<double>(l.numel());  // numel of the broadcast
    if (reduction == 2) l = l.sum();
    o.write(l.to(promoted));
  }, empty && reduction == 0);
}
ACLNN_RUN(aclnnMseLoss)

EMU_API aclnnStatus aclnnMseLossBackwardGetWorkspaceSize(const aclTensor* gradOutput, const aclTensor* self,
                                                         const aclTensor* target, int64_t reduction,
                                                         aclTensor* gradInput, uint64_t* ws, aclOpExecutor** ex) {
  const char* api = "aclnnMseLossBackward";
  // §9.3 step 1: null arguments -> 161001
  if (ws == nullptr || ex == nullptr) return emu::reject(api, ACLNN_ERR_PARAM_NULLPTR, "§9.3 step 1: workspaceSize or executor is null");
  if (!gradOutput || !self || !target || !gradInput)
    return emu::reject(api, ACLNN_ERR_PARAM_NULLPTR, "§9.3 step 1: gradOutput, self, target or gradInput is null");
  auto g = T(gradOutput), s = T(self), t = T(target), o = T(gradInput);
  const DtypeList list = mse_list(chip(), true);
  // §9.3 step 2: gradOutput and target in self's dtype; self's and out's dtype in the list (out: self casts to it)
  if (g.dtype != s.dtype || t.dtype != s.dtype) REJECT(api, "§9.3 step 2: gradOutput or target dtype != self dtype");
  if (!in_list(s.dtype, list)) REJECT(api, std::string("§9.3 step 2: self dtype ") + emu::dtype_name(s.dtype) + " not in " + list_str(list));
  if (!in_list(o.dtype, list) || !can_cast(s.dtype, o.dtype))
    REJECT(api, std::string("§9.3 step 2: out dtype ") + emu::dtype_name(o.dtype) + " not in " + list_str(list));
  // §9.3 steps 3-6: reduction, ranks, broadcast, out's shape
  if (reduction < 0 || reduction > 2) REJECT(api, "§9.3 step 3: reduction " + std::to_string(reduction) + " not in [0, 2]");
  if (g.dim() > kMaxDims || s.dim() > kMaxDims || t.dim() > kMaxDims) REJECT(api, "§9.3 step 4: more than 8 dims");
  std::vector<int64_t> st, B;
  if (!broadcast(s.sizes, t.sizes, &st) || !broadcast(g.sizes, st, &B)) REJECT(api, "§9.3 step 5: the inputs do not broadcast");
  if (B != o.sizes) REJECT(api, "§9.3 step 6: out shape " + emu::shape_str(o.sizes) + " != broadcast shape " + emu::shape_str(B));
  // §9.3: any empty input: success, nothing launched
  const bool empty = g.numel() == 0 || s.numel() == 0 || t.numel() == 0;
  const int64_t count = s.numel();
  return emu::submit(api, ws, ex, [=] {
    at::Tensor d = (f32(s) - f32(t)) * 2.0f * f32(g);  // §9.3: grad·(x − y)·2
    if (reduction == 1) d = d * inv_count(count);        // divided by self.numel() as passed
    o.write(d.expand(B));
  }, empty);
}
ACLNN_RUN(aclnnMseLossBackward)
