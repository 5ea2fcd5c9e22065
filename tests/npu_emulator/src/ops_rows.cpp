// The aclnn APIs of the row members' NPU paths (csrc/losses.h, GeneralizedJsd::aclnn_apis and
// SparseJsd::aclnn_apis), as the CANN documents list them chip by chip (docs/aclnn_reference.md, sections 10
// and 11; ops-nn v9.1.0 index/gather_elements_v2/docs/aclnnGather.md and
// index/scatter_elements_v2/docs/aclnnScatter&aclnnInplaceScatter.md for the sparse JSD's gather and scatter):
//   ops-math v9.1.0: math/log_add_exp/docs/aclnnLogAddExp.md, math/add/docs/aclnnAdd&aclnnInplaceAdd.md,
//     math/add/docs/aclnnAdds.md, math/sub/docs/aclnnSub&aclnnInplaceSub.md, math/mul/docs/aclnnMul&aclnnInplaceMul.md,
//     math/mul/docs/aclnnMuls&aclnnInplaceMuls.md, math/div/docs/aclnnDivs&aclnnInplaceDivs.md,
//     math/exp/docs/aclnnExp&aclnnInplaceExp.md, math/reduce_sum/docs/aclnnReduceSum.md,
//     math/cast/docs/aclnnCast.md, conversion/masked_fill/docs/aclnnInplaceMaskedFillScalar.md,
//     math/tanh/docs/aclnnTanh&aclnnInplaceTanh.md (the logit transform's softcap);
//   ops-nn v9.1.0: activation/log_softmax_v2/docs/aclnnLogSoftmax.md,
//     activation/log_softmax_grad/docs/aclnnLogSoftmaxBackward.md;
//   aclnnExp as ops-math's current document lists it: not on the Atlas training (910) and inference (310P)
//   series since commit 9d65d0d11 (2026-01-22), which the CANN 8.0 to 8.3 API references and ops-math of
//   2025-10-30 still list (docs/aclnn_reference.md, section 10: the documents disagree, the newest one counts).
//
// aclnnLogAddExp is implemented here with its validation. The others are implemented with torch_npu's ordinary
// ops (ops_base.cpp, ops_more.cpp), which torch_npu itself calls on every chip in dtypes the documents do not
// list there (bfloat16 on 910 and 310P, everything on 310B): rejecting those would fail torch_npu's own kernels,
// where a real chip's torch_npu routes such an op through its own fallbacks. So a call outside a document's
// listing is rejected (161002) when the package's own NPU module made it (called_by_package()), as the chip's
// CANN would reject it, and only counted in the trace as "<api>:undocumented" when torch_npu made it
// (documented() below).
#include <map>
#include <string>

#include "ops.h"

using emu::T;
using emu::any_empty;

namespace {

enum Family : unsigned { k910 = 1, k310P = 2, k910B = 4, k950 = 8, k310B = 16 };

unsigned family_bit() {
  const std::string f = emu::family();
  if (f == "910") return k910;
  if (f == "310P") return k310P;
  if (f == "910B" || f == "910_93") return k910B;
  if (f == "950") return k950;
  return k310B;
}

// The families whose documents list an API, and those that list it in bfloat16.
struct Listing {
  unsigned chips, bf16_chips;
};

constexpr unsigned kTrainingAndInference = k910 | k310P | k910B | k950;
constexpr unsigned kBf16 = k910B | k950;

const std::map<std::string, Listing>& listings() {
  static const std::map<std::string, Listing> table = {
      {"aclnnCast", {kTrainingAndInference, kBf16}},
      {"aclnnMuls", {kTrainingAndInference, kBf16}},
      {"aclnnInplaceMuls", {kTrainingAndInference, kBf16}},
      {"aclnnMul", {kTrainingAndInference, kBf16}},
      {"aclnnInplaceMul", {kTrainingAndInference, kBf16}},
      {"aclnnAdds", {kTrainingAndInference, kBf16}},
      {"aclnnAdd", {k910 | k910B | k950, kBf16}},   // aclnnAdd's product table leaves out 310P
      {"aclnnSub", {k910 | k910B | k950, kBf16}},   // as does aclnnSub's (which lists 310B, without bf16)
      {"aclnnDivs", {k910 | k910B | k950, kBf16}},  // and aclnnDivs'
      {"aclnnExp", {k910B | k950, kBf16}},  // the current document leaves out 910 and 310P (9d65d0d11)
      {"aclnnTanh", {k910 | k910B | k950, kBf16}},  // the Atlas inference series (310P) is not supported
      {"aclnnInplaceTanh", {k910 | k910B | k950, kBf16}},
      {"aclnnReduceSum", {kTrainingAndInference, kBf16}},
      {"aclnnInplaceMaskedFillScalar", {kTrainingAndInference, kBf16}},
      {"aclnnLogSoftmax", {kTrainingAndInference, kBf16}},
      {"aclnnLogSoftmaxBackward", {kTrainingAndInference, kBf16}},
      // the sparse JSD's (ops-nn v9.1.0, docs/aclnn_reference.md section 11): the A2 and A3 series alone
      {"aclnnGather", {k910B, k910B}},
      {"aclnnScatter", {k910B | k950, kBf16}},  // A2, A3 and 950
  };
  return table;
}

}  // namespace

namespace emu {

aclnnStatus documented(const char* api, std::initializer_list<const TensorDesc*> tensors) {
  const auto& table = listings();
  const auto it = table.find(api);
  if (it == table.end()) return ACLNN_SUCCESS;
  const unsigned here = family_bit();
  bool listed = (it->second.chips & here) != 0;
  for (const TensorDesc* t : tensors) {
    if (t->defined && t->dtype == ACL_BF16 && (it->second.bf16_chips & here) == 0) listed = false;
  }
  if (listed) return ACLNN_SUCCESS;
  if (called_by_package()) {
    return reject(api, ACLNN_ERR_PARAM_INVALID, "not listed for this chip (or its dtype) in the current documents");
  }
  npuemu_trace_add((std::string(api) + ":undocumented").c_str(), 1);
  return ACLNN_SUCCESS;
}

}  // namespace emu

// aclnnLogAddExp(self, other, out): log(e^self + e^other), ops-math math/log_add_exp/docs/aclnnLogAddExp.md
// (v9.1.0; 950 from v9.1.0 on, CANN 8.0.RC3's reference lists 310P, 910 and A2).
EMU_API aclnnStatus aclnnLogAddExpGetWorkspaceSize(const aclTensor* self, const aclTensor* other, aclTensor* out,
                                                   uint64_t* ws, aclOpExecutor** ex) {
  const char* api = "aclnnLogAddExp";
  // 161001: self, other or out null
  ACLNN_CHECK_NOTNULL(api, self, other, out);
  auto a = T(self), b = T(other), o = T(out);
  const unsigned here = family_bit();
  if ((here & kTrainingAndInference) == 0) {
    return emu::reject(api, ACLNN_ERR_PARAM_INVALID, "not listed for this chip (Ascend 310B)");
  }
  // 161002: self/other: FLOAT16, FLOAT, DOUBLE, the integer types, BOOL (and BFLOAT16 on A2/A3/950); out: FLOAT,
  // FLOAT16 (and BFLOAT16 on A2/A3/950); self and other castable to out
  const bool bf16 = (here & kBf16) != 0;
  for (const emu::TensorDesc* t : {&a, &b}) {
    const bool ok = t->dtype == ACL_FLOAT || t->dtype == ACL_FLOAT16 || t->dtype == ACL_DOUBLE ||
        t->dtype == ACL_UINT8 || t->dtype == ACL_INT8 || t->dtype == ACL_UINT16 || t->dtype == ACL_INT16 ||
        t->dtype == ACL_UINT32 || t->dtype == ACL_INT32 || t->dtype == ACL_UINT64 || t->dtype == ACL_INT64 ||
        t->dtype == ACL_BOOL || (bf16 && t->dtype == ACL_BF16);
    if (!ok) return emu::reject(api, ACLNN_ERR_PARAM_INVALID, std::string("input dtype ") + emu::dtype_name(t->dtype));
  }
  if (!(o.dtype == ACL_FLOAT || o.dtype == ACL_FLOAT16 || (bf16 && o.dtype == ACL_BF16))) {
    return emu::reject(api, ACLNN_ERR_PARAM_INVALID, std::string("out dtype ") + emu::dtype_name(o.dtype));
  }
  for (const emu::TensorDesc* t : {&a, &b}) {
    if (!c10::canCast(t->scalar_type(), o.scalar_type())) {
      return emu::reject(api, ACLNN_ERR_PARAM_INVALID, "an input cannot be cast to out's dtype");
    }
  }
  // 161002: at most 8 dims; self and other broadcast; out's shape is the broadcast shape
  if (a.dim() > 8 || b.dim() > 8 || o.dim() > 8) return emu::reject(api, ACLNN_ERR_PARAM_INVALID, "more than 8 dims");
  if (!emu::broadcastable(a.sizes, b.sizes)) {
    return emu::reject(api, ACLNN_ERR_PARAM_INVALID, "self and other do not broadcast");
  }
  if (emu::broadcast_shape(a.sizes, b.sizes) != o.sizes) {
    return emu::reject(api, ACLNN_ERR_PARAM_INVALID, "out's shape is not the broadcast shape");
  }
  return emu::submit(api, ws, ex, [=] {
    o.write(at::logaddexp(a.get().to(at::kFloat), b.get().to(at::kFloat)));
  }, any_empty({&a, &b, &o}));
}
ACLNN_RUN(aclnnLogAddExp)
