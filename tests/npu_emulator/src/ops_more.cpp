// Emulated aclnn operators, part 2: reductions, shape and indexing operators, data-dependent shapes,
// matrix products, softmax, random numbers.

#include <algorithm>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ExpandUtils.h>
#include <ATen/core/List.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/all.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/amin.h>
#include <ATen/ops/any.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/argmin.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/flip.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/index.h>
#include <ATen/ops/index_put.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/linspace.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/masked_select.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/max.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/min.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mv.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/norm.h>
#include <ATen/ops/prod.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/roll.h>
#include <ATen/ops/scatter.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/std.h>
#include <ATen/ops/std_mean.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/tril.h>
#include <ATen/ops/triu.h>
#include <ATen/ops/var.h>
#include <ATen/ops/var_mean.h>
#include <ATen/ops/zeros.h>

#include "ops.h"

using emu::IA;
using emu::S;
using emu::T;
using emu::TensorDesc;
using emu::any_empty;

namespace {

// Writes a data-dependent result into the front of `o` (allocated at the largest possible size,
// contiguous) and rewrites the caller's aclTensor shape, which torch_npu reads back with aclGetViewShape.
void write_shrunk(const TensorDesc& o, const at::Tensor& result) {
  if (result.numel() > 0) {
    auto opts = at::TensorOptions().dtype(o.scalar_type());
    char* base = static_cast<char*>(o.data) + o.offset * static_cast<int64_t>(c10::elementSize(o.scalar_type()));
    at::from_blob(base, result.sizes(), opts).copy_(result);
  }
  auto* t = const_cast<aclTensor*>(o.src);
  t->view_dims.assign(result.sizes().begin(), result.sizes().end());
  t->strides.assign(result.dim(), 1);
  for (int64_t i = result.dim() - 2; i >= 0; --i) t->strides[i] = t->strides[i + 1] * t->view_dims[i + 1];
}

at::Generator generator(int64_t seed, int64_t offset) {
  // Philox-style (seed, offset) pairs from torch_npu; any fixed mix of both gives reproducible streams.
  uint64_t s = static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ULL ^ (static_cast<uint64_t>(offset) + 0x632BE59BD9B4E019ULL);
  return at::make_generator<at::CPUGeneratorImpl>(s);
}

c10::List<c10::optional<at::Tensor>> index_list(const std::vector<TensorDesc>& idx, at::ScalarType self_type) {
  c10::List<c10::optional<at::Tensor>> out;
  for (const auto& d : idx) {
    // torch_npu passes an empty [0] tensor of self's dtype for "no index on this dim".
    bool placeholder = !d.defined || (d.dim() == 1 && d.sizes[0] == 0 && d.scalar_type() == self_type);
    if (placeholder) {
      out.push_back(c10::nullopt);
    } else {
      out.push_back(d.get());
    }
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Reductions. An empty dim list reduces every dimension.

#define EMU_REDUCE_DTYPE(NAME, FN)                                                                         \
  EMU_API aclnnStatus aclnn##NAME##GetWorkspaceSize(const aclTensor* self, const aclIntArray* dim,          \
                                                    bool keepdim, aclDataType dtype, aclTensor* out,       \
                                                    uint64_t* ws, aclOpExecutor** ex) {                    \
    ACLNN_CHECK_NOTNULL("aclnn" #NAME, self, out);                                                        \
    auto a = T(self), o = T(out);                                                                          \
    auto dims = IA(dim);                                                                                   \
    if (const aclnnStatus st_ = emu::documented("aclnn" #NAME, {&a, &o})) return st_;                      \
    auto st = emu::has_at(dtype) ? emu::to_at(dtype) : o.scalar_type();                                   \
    return emu::submit("aclnn" #NAME, ws, ex, [=] { o.write(at::FN(a.get(), dims, keepdim, st)); },        \
                       o.numel() == 0);                                                                    \
  }                                                                                                        \
  ACLNN_RUN(aclnn##NAME)

EMU_REDUCE_DTYPE(ReduceSum, sum)
EMU_REDUCE_DTYPE(Mean, mean)

#define EMU_REDUCE(NAME, EXPR)                                                                             \
  EMU_API aclnnStatus aclnn##NAME##GetWorkspaceSize(const aclTensor* self, const aclIntArray* dim,          \
                                                    bool keepdim, aclTensor* out, uint64_t* ws,            \
                                                    aclOpExecutor** ex) {                                  \
    ACLNN_CHECK_NOTNULL("aclnn" #NAME, self, out);                                                        \
    auto a = T(self), o = T(out);                                                                          \
    auto dims = IA(dim);                                                                                   \
    return emu::submit("aclnn" #NAME, ws, ex, [=] {                                                        \
      at::Tensor x = a.get();                                                                              \
      o.write(EXPR);                                                                                       \
    }, o.numel() == 0);                                                                                    \
  }                                                                                                        \
  ACLNN_RUN(aclnn##NAME)

EMU_REDUCE(Amax, at::amax(x, dims, keepdim))
EMU_REDUCE(Amin, at::amin(x, dims, keepdim))
EMU_REDUCE(Any, dims.empty() ? (keepdim ? at::any(x).reshape(std::vector<int64_t>(x.dim(), 1)) : at::any(x))
                             : at::any(x, at::IntArrayRef(dims), keepdim))
EMU_REDUCE(All, dims.empty() ? (keepdim ? at::all(x).reshape(std::vector<int64_t>(x.dim(), 1)) : at::all(x))
                             : at::all(x, at::IntArrayRef(dims), keepdim))
EMU_REDUCE(LogSumExp, at::logsumexp(x, dims, keepdim))

// aclnnMax / aclnnMin (self, out): over all elements.
#define EMU_REDUCE_ALL(NAME, FN)                                                                           \
  EMU_API aclnnStatus aclnn##NAME##GetWorkspaceSize(const aclTensor* self, aclTensor* out, uint64_t* ws,    \
                                                    aclOpExecutor** ex) {                                  \
    ACLNN_CHECK_NOTNULL("aclnn" #NAME, self, out);                                                        \
    auto a = T(self), o = T(out);                                                                          \
    return emu::submit("aclnn" #NAME, ws, ex, [=] { o.write(at::FN(a.get())); }, any_empty({&a, &o}));    \
  }                                                                                                        \
  ACLNN_RUN(aclnn##NAME)
EMU_REDUCE_ALL(Max, max)
EMU_REDUCE_ALL(Min, min)

// aclnnMaxDim / aclnnMinDim (self, int64_t dim, bool keepdim, out, indices)
#define EMU_REDUCE_DIM_INDICES(NAME, FN)                                                                   \
  EMU_API aclnnStatus aclnn##NAME##GetWorkspaceSize(const aclTensor* self, int64_t dim, bool keepdim,       \
                                                    aclTensor* out, aclTensor* indices, uint64_t* ws,      \
                                                    aclOpExecutor** ex) {                                  \
    ACLNN_CHECK_NOTNULL("aclnn" #NAME, self, out, indices);                                               \
    auto a = T(self), o = T(out), i = T(indices);                                                          \
    return emu::submit("aclnn" #NAME, ws, ex, [=] {                                                        \
      auto r = at::FN(a.get(), dim, keepdim);                                                              \
      o.write(std::get<0>(r));                                                                             \
      i.write(std::get<1>(r));                                                                             \
    }, any_empty({&a, &o}));                                                                               \
  }                                                                                                        \
  ACLNN_RUN(aclnn##NAME)
EMU_REDUCE_DIM_INDICES(MaxDim, max)
EMU_REDUCE_DIM_INDICES(MinDim, min)

// aclnnArgMax / aclnnArgMin (self, int64_t dim, bool keepdim, out)
#define EMU_ARG(NAME, FN)                                                                                  \
  EMU_API aclnnStatus aclnn##NAME##GetWorkspaceSize(const aclTensor* self, int64_t dim, bool keepdim,       \
                                                    aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {    \
    ACLNN_CHECK_NOTNULL("aclnn" #NAME, self, out);                                                        \
    auto a = T(self), o = T(out);                                                                          \
    return emu::submit("aclnn" #NAME, ws, ex, [=] { o.write(at::FN(a.get(), dim, keepdim)); },            \
                       any_empty({&a, &o}));                                                               \
  }                                                                                                        \
  ACLNN_RUN(aclnn##NAME)
EMU_ARG(ArgMax, argmax)
EMU_ARG(ArgMin, argmin)

// aclnnProd(self, aclDataType dtype, out); aclnnProdDim(self, int64_t dim, bool keepdim, aclDataType, out)
EMU_API aclnnStatus aclnnProdGetWorkspaceSize(const aclTensor* self, aclDataType dtype, aclTensor* out, uint64_t* ws,
                                              aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnProd", self, out);
  auto a = T(self), o = T(out);
  auto st = emu::has_at(dtype) ? emu::to_at(dtype) : o.scalar_type();
  return emu::submit("aclnnProd", ws, ex, [=] { o.write(at::prod(a.get(), st)); }, o.numel() == 0);
}
ACLNN_RUN(aclnnProd)
EMU_API aclnnStatus aclnnProdDimGetWorkspaceSize(const aclTensor* self, int64_t dim, bool keepdim, aclDataType dtype,
                                                 aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnProdDim", self, out);
  auto a = T(self), o = T(out);
  auto st = emu::has_at(dtype) ? emu::to_at(dtype) : o.scalar_type();
  return emu::submit("aclnnProdDim", ws, ex, [=] { o.write(at::prod(a.get(), dim, keepdim, st)); }, o.numel() == 0);
}
ACLNN_RUN(aclnnProdDim)

// aclnnCumsum(self, int64_t dim, aclDataType dtype, out)
EMU_API aclnnStatus aclnnCumsumGetWorkspaceSize(const aclTensor* self, int64_t dim, aclDataType dtype, aclTensor* out,
                                                uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnCumsum", self, out);
  auto a = T(self), o = T(out);
  auto st = emu::has_at(dtype) ? emu::to_at(dtype) : o.scalar_type();
  return emu::submit("aclnnCumsum", ws, ex, [=] { o.write(at::cumsum(a.get(), dim, st)); }, any_empty({&a, &o}));
}
ACLNN_RUN(aclnnCumsum)

// aclnnStd(self, const aclIntArray* dim, int64_t correction, bool keepdim, out); aclnnVar likewise.
#define EMU_STATS(NAME, FN)                                                                                \
  EMU_API aclnnStatus aclnn##NAME##GetWorkspaceSize(const aclTensor* self, const aclIntArray* dim,          \
                                                    int64_t correction, bool keepdim, aclTensor* out,      \
                                                    uint64_t* ws, aclOpExecutor** ex) {                    \
    ACLNN_CHECK_NOTNULL("aclnn" #NAME, self, out);                                                        \
    auto a = T(self), o = T(out);                                                                          \
    auto dims = IA(dim);                                                                                   \
    return emu::submit("aclnn" #NAME, ws, ex, [=] {                                                        \
      at::OptionalIntArrayRef d = dims.empty() ? at::OptionalIntArrayRef() : at::OptionalIntArrayRef(dims); \
      o.write(at::FN(a.get(), d, at::Scalar(correction), keepdim));                                        \
    }, o.numel() == 0);                                                                                    \
  }                                                                                                        \
  ACLNN_RUN(aclnn##NAME)
EMU_STATS(Std, std)
EMU_STATS(Var, var)

// aclnnLinalgVectorNorm(self, const aclScalar* ord, const aclIntArray* dim, bool keepdim, aclDataType, out)
EMU_API aclnnStatus aclnnLinalgVectorNormGetWorkspaceSize(const aclTensor* self, const aclScalar* ord,
                                                          const aclIntArray* dim, bool keepdim, aclDataType dtype,
                                                          aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnLinalgVectorNorm", self, out);
  auto a = T(self), o = T(out);
  auto dims = IA(dim);
  at::Scalar p = ord ? S(ord) : at::Scalar(2.0);
  c10::optional<at::ScalarType> st;
  if (emu::has_at(dtype)) st = emu::to_at(dtype);
  return emu::submit("aclnnLinalgVectorNorm", ws, ex, [=] {
    at::OptionalIntArrayRef d = dims.empty() ? at::OptionalIntArrayRef() : at::OptionalIntArrayRef(dims);
    o.write(at::linalg_vector_norm(a.get(), p, d, keepdim, st));
  }, o.numel() == 0);
}
ACLNN_RUN(aclnnLinalgVectorNorm)

// aclnnNorm(self, const aclScalar* p, const aclIntArray* dim, bool keepdim, out)
EMU_API aclnnStatus aclnnNormGetWorkspaceSize(const aclTensor* self, const aclScalar* pv, const aclIntArray* dim,
                                              bool keepdim, aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnNorm", self, out);
  auto a = T(self), o = T(out);
  auto dims = IA(dim);
  at::Scalar p = pv ? S(pv) : at::Scalar(2.0);
  return emu::submit("aclnnNorm", ws, ex, [=] {
    at::Tensor x = a.get();
    std::vector<int64_t> d = dims;
    if (d.empty()) for (int64_t i = 0; i < x.dim(); ++i) d.push_back(i);
    o.write(at::norm(x, p, d, keepdim));
  }, o.numel() == 0);
}
ACLNN_RUN(aclnnNorm)

// ---------------------------------------------------------------------------------------------------------
// Sorting.

// aclnnSort(self, bool stable, int64_t dim, bool descending, values, indices)
EMU_API aclnnStatus aclnnSortGetWorkspaceSize(const aclTensor* self, bool stable, int64_t dim, bool descending,
                                              aclTensor* values, aclTensor* indices, uint64_t* ws,
                                              aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnSort", self, values, indices);
  auto a = T(self), v = T(values), i = T(indices);
  return emu::submit("aclnnSort", ws, ex, [=] {
    auto r = at::sort(a.get(), stable, dim, descending);
    v.write(std::get<0>(r));
    i.write(std::get<1>(r));
  }, any_empty({&a}));
}
ACLNN_RUN(aclnnSort)

// aclnnTopk(self, int64_t k, int64_t dim, bool largest, bool sorted, values, indices)
EMU_API aclnnStatus aclnnTopkGetWorkspaceSize(const aclTensor* self, int64_t k, int64_t dim, bool largest, bool sorted,
                                              aclTensor* values, aclTensor* indices, uint64_t* ws,
                                              aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnTopk", self, values, indices);
  auto a = T(self), v = T(values), i = T(indices);
  return emu::submit("aclnnTopk", ws, ex, [=] {
    auto r = at::topk(a.get(), k, dim, largest, sorted);
    v.write(std::get<0>(r));
    i.write(std::get<1>(r));
  }, any_empty({&v}));
}
ACLNN_RUN(aclnnTopk)

// ---------------------------------------------------------------------------------------------------------
// Joining, reshaping, indexing.

// aclnnCat(const aclTensorList* tensors, int64_t dim, out); aclnnStack likewise.
EMU_API aclnnStatus aclnnCatGetWorkspaceSize(const aclTensorList* tensors, int64_t dim, aclTensor* out, uint64_t* ws,
                                             aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnCat", tensors, out);
  auto l = emu::TL(tensors);
  auto o = T(out);
  return emu::submit("aclnnCat", ws, ex, [=] {
    std::vector<at::Tensor> ts;
    for (const auto& d : l) {
      // legacy rule: 1-D empty tensors are skipped
      if (d.dim() == 1 && d.sizes[0] == 0) continue;
      ts.push_back(d.get());
    }
    if (!ts.empty()) o.write(at::cat(ts, dim));
  }, o.numel() == 0);
}
ACLNN_RUN(aclnnCat)

EMU_API aclnnStatus aclnnStackGetWorkspaceSize(const aclTensorList* tensors, int64_t dim, aclTensor* out, uint64_t* ws,
                                               aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnStack", tensors, out);
  auto l = emu::TL(tensors);
  auto o = T(out);
  return emu::submit("aclnnStack", ws, ex, [=] { o.write(at::stack(emu::get_all(l), dim)); }, o.numel() == 0);
}
ACLNN_RUN(aclnnStack)

// aclnnFlip(self, const aclIntArray* dims, out)
EMU_API aclnnStatus aclnnFlipGetWorkspaceSize(const aclTensor* self, const aclIntArray* dims, aclTensor* out,
                                              uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnFlip", self, dims, out);
  auto a = T(self), o = T(out);
  auto d = IA(dims);
  return emu::submit("aclnnFlip", ws, ex, [=] { o.write(at::flip(a.get(), d)); }, any_empty({&a, &o}));
}
ACLNN_RUN(aclnnFlip)

// aclnnRoll(self, const aclIntArray* shifts, const aclIntArray* dims, out)
EMU_API aclnnStatus aclnnRollGetWorkspaceSize(const aclTensor* self, const aclIntArray* shifts, const aclIntArray* dims,
                                              aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnRoll", self, shifts, out);
  auto a = T(self), o = T(out);
  auto s = IA(shifts), d = IA(dims);
  return emu::submit("aclnnRoll", ws, ex, [=] { o.write(at::roll(a.get(), s, d)); }, any_empty({&a, &o}));
}
ACLNN_RUN(aclnnRoll)

// aclnnTril / aclnnTriu (self, int64_t diagonal, out)
EMU_API aclnnStatus aclnnTrilGetWorkspaceSize(const aclTensor* self, int64_t diagonal, aclTensor* out, uint64_t* ws,
                                              aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnTril", self, out);
  auto a = T(self), o = T(out);
  return emu::submit("aclnnTril", ws, ex, [=] { o.write(at::tril(a.get(), diagonal)); }, any_empty({&a, &o}));
}
ACLNN_RUN(aclnnTril)
EMU_API aclnnStatus aclnnTriuGetWorkspaceSize(const aclTensor* self, int64_t diagonal, aclTensor* out, uint64_t* ws,
                                              aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnTriu", self, out);
  auto a = T(self), o = T(out);
  return emu::submit("aclnnTriu", ws, ex, [=] { o.write(at::triu(a.get(), diagonal)); }, any_empty({&a, &o}));
}
ACLNN_RUN(aclnnTriu)

// aclnnIndexSelect(self, int64_t dim, index, out); aclnnGather(self, int64_t dim, index, out)
EMU_API aclnnStatus aclnnIndexSelectGetWorkspaceSize(const aclTensor* self, int64_t dim, const aclTensor* index,
                                                     aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnIndexSelect", self, index, out);
  auto a = T(self), i = T(index), o = T(out);
  return emu::submit("aclnnIndexSelect", ws, ex, [=] { o.write(at::index_select(a.get(), dim, i.get())); },
                     o.numel() == 0);
}
ACLNN_RUN(aclnnIndexSelect)
// aclnnGather as ops-nn v9.1.0 documents it (index/gather_elements_v2/docs/aclnnGather.md; docs/aclnn_reference.md,
// section 11): listed on the Atlas A2 and A3 series alone (ops_rows.cpp's table); 161002 for an index other than
// INT32 or INT64, ranks above 8 or unequal, out not of self's dtype and index's shape, dim out of range.
EMU_API aclnnStatus aclnnGatherGetWorkspaceSize(const aclTensor* self, int64_t dim, const aclTensor* index,
                                                aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  const char* api = "aclnnGather";
  ACLNN_CHECK_NOTNULL(api, self, index, out);
  auto a = T(self), i = T(index), o = T(out);
  if (i.dtype != ACL_INT32 && i.dtype != ACL_INT64) return emu::reject(api, ACLNN_ERR_PARAM_INVALID, "index dtype");
  if (a.dim() > 8 || i.dim() != a.dim() || o.sizes != i.sizes || o.dtype != a.dtype ||
      dim < -std::max<int64_t>(a.dim(), 1) || dim >= std::max<int64_t>(a.dim(), 1)) {
    return emu::reject(api, ACLNN_ERR_PARAM_INVALID, "shapes, ranks, dtypes or dim");
  }
  if (const aclnnStatus st = emu::documented(api, {&a, &o})) return st;
  return emu::submit(api, ws, ex, [=] { o.write(at::gather(a.get(), dim, i.get())); }, o.numel() == 0);
}
ACLNN_RUN(aclnnGather)

// aclnnScatter(self, int64_t dim, index, src, int64_t reduction, out): reduction 0 none, 1 add, 2 multiply.
EMU_API aclnnStatus aclnnScatterGetWorkspaceSize(const aclTensor* self, int64_t dim, const aclTensor* index,
                                                 const aclTensor* src, int64_t reduction, aclTensor* out,
                                                 uint64_t* ws, aclOpExecutor** ex) {
  const char* api = "aclnnScatter";
  ACLNN_CHECK_NOTNULL(api, self, index, src, out);
  auto a = T(self), i = T(index), s = T(src), o = T(out);
  // ops-nn v9.1.0 index/scatter_elements_v2/docs/aclnnScatter&aclnnInplaceScatter.md: listed on A2, A3 and 950
  // (ops_rows.cpp's table); 161002 for an index other than INT32 or INT64, ranks above 8 or unequal, self, src
  // and out of different dtypes, out not of self's shape.
  if (i.dtype != ACL_INT32 && i.dtype != ACL_INT64) return emu::reject(api, ACLNN_ERR_PARAM_INVALID, "index dtype");
  if (a.dim() > 8 || i.dim() != a.dim() || s.dim() != a.dim() || o.sizes != a.sizes || s.dtype != a.dtype ||
      o.dtype != a.dtype) {
    return emu::reject(api, ACLNN_ERR_PARAM_INVALID, "shapes, ranks or dtypes");
  }
  if (const aclnnStatus st = emu::documented(api, {&a, &s, &o})) return st;
  return emu::submit(api, ws, ex, [=] {
    at::Tensor x = a.get();
    if (reduction == 1) {
      o.write(at::scatter(x, dim, i.get(), s.get(), "add"));
    } else if (reduction == 2) {
      o.write(at::scatter(x, dim, i.get(), s.get(), "multiply"));
    } else {
      o.write(at::scatter(x, dim, i.get(), s.get()));
    }
  }, o.numel() == 0);
}
ACLNN_RUN(aclnnScatter)

// aclnnIndex(self, const aclTensorList* indices, out)
EMU_API aclnnStatus aclnnIndexGetWorkspaceSize(const aclTensor* self, const aclTensorList* indices, aclTensor* out,
                                               uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnIndex", self, indices, out);
  auto a = T(self), o = T(out);
  auto idx = emu::TL(indices);
  return emu::submit("aclnnIndex", ws, ex, [=] { o.write(at::index(a.get(), index_list(idx, a.scalar_type()))); },
                     o.numel() == 0);
}
ACLNN_RUN(aclnnIndex)

// aclnnIndexPutImpl(aclTensor* selfRef, const aclTensorList* indices, const aclTensor* values, bool accumulate,
//                   bool unsafe)
EMU_API aclnnStatus aclnnIndexPutImplGetWorkspaceSize(aclTensor* self, const aclTensorList* indices,
                                                      const aclTensor* values, bool accumulate, bool unsafe,
                                                      uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnIndexPutImpl", self, indices, values);
  auto a = T(self), v = T(values);
  auto idx = emu::TL(indices);
  (void)unsafe;
  return emu::submit("aclnnIndexPutImpl", ws, ex, [=] {
    a.write(at::index_put(a.get(), index_list(idx, a.scalar_type()), v.get(), accumulate));
  }, a.numel() == 0);
}
ACLNN_RUN(aclnnIndexPutImpl)

// aclnnEmbedding(weight, indices, out)
EMU_API aclnnStatus aclnnEmbeddingGetWorkspaceSize(const aclTensor* weight, const aclTensor* indices, aclTensor* out,
                                                   uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnEmbedding", weight, indices, out);
  auto w = T(weight), i = T(indices), o = T(out);
  return emu::submit("aclnnEmbedding", ws, ex, [=] { o.write(at::embedding(w.get(), i.get())); }, o.numel() == 0);
}
ACLNN_RUN(aclnnEmbedding)

// ---------------------------------------------------------------------------------------------------------
// Data-dependent output shapes: the result goes to the front of `out`, and the aclTensor's shape is
// rewritten (torch_npu reads it back with aclGetViewShape and resizes its tensor).

// aclnnNonzero(self, out): out is [numel, dim] int64; becomes [n, dim].
EMU_API aclnnStatus aclnnNonzeroGetWorkspaceSize(const aclTensor* self, aclTensor* out, uint64_t* ws,
                                                 aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnNonzero", self, out);
  auto a = T(self), o = T(out);
  return emu::submit("aclnnNonzero", ws, ex, [=] { write_shrunk(o, at::nonzero(a.get()).to(o.scalar_type())); });
}
ACLNN_RUN(aclnnNonzero)

// aclnnNonzeroV2(self, out): the transposed form, out is [dim, numel] int64; becomes [dim, n].
EMU_API aclnnStatus aclnnNonzeroV2GetWorkspaceSize(const aclTensor* self, aclTensor* out, uint64_t* ws,
                                                   aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnNonzeroV2", self, out);
  auto a = T(self), o = T(out);
  return emu::submit("aclnnNonzeroV2", ws, ex, [=] {
    write_shrunk(o, at::nonzero(a.get()).t().contiguous().to(o.scalar_type()));
  });
}
ACLNN_RUN(aclnnNonzeroV2)

// aclnnMaskedSelect(self, mask, out): out is [numel(broadcast)]; becomes [n].
EMU_API aclnnStatus aclnnMaskedSelectGetWorkspaceSize(const aclTensor* self, const aclTensor* mask, aclTensor* out,
                                                      uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnMaskedSelect", self, mask, out);
  auto a = T(self), m = T(mask), o = T(out);
  return emu::submit("aclnnMaskedSelect", ws, ex, [=] {
    write_shrunk(o, at::masked_select(a.get(), m.get().to(at::kBool)).to(o.scalar_type()));
  });
}
ACLNN_RUN(aclnnMaskedSelect)

// aclnnEqual(self, other, out): out is a one-element bool tensor.
EMU_API aclnnStatus aclnnEqualGetWorkspaceSize(const aclTensor* self, const aclTensor* other, aclTensor* out,
                                               uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnEqual", self, other, out);
  auto a = T(self), b = T(other), o = T(out);
  return emu::submit("aclnnEqual", ws, ex, [=] {
    at::Tensor x = a.get(), y = b.get();
    bool eq = x.sizes().equals(y.sizes()) &&
              (x.scalar_type() == y.scalar_type() ? at::equal(x, y) : at::equal(x, y.to(x.scalar_type())));
    o.write(at::full({}, eq, at::TensorOptions().dtype(at::kBool)));
  });
}
ACLNN_RUN(aclnnEqual)

// ---------------------------------------------------------------------------------------------------------
// Sequences.

// aclnnArange(const aclScalar* start, const aclScalar* end, const aclScalar* step, out); aclnnRange includes end.
EMU_API aclnnStatus aclnnArangeGetWorkspaceSize(const aclScalar* start, const aclScalar* end, const aclScalar* step,
                                                aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnArange", start, end, step, out);
  auto o = T(out);
  at::Scalar s0 = S(start), s1 = S(end), st = S(step);
  return emu::submit("aclnnArange", ws, ex, [=] {
    auto r = at::arange(s0, s1, st, at::TensorOptions().dtype(at::kDouble));
    o.write(r.narrow(0, 0, std::min<int64_t>(r.numel(), o.numel())));
  }, o.numel() == 0);
}
ACLNN_RUN(aclnnArange)
EMU_API aclnnStatus aclnnRangeGetWorkspaceSize(const aclScalar* start, const aclScalar* end, const aclScalar* step,
                                               aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnRange", start, end, step, out);
  auto o = T(out);
  at::Scalar s0 = S(start), st = S(step);
  return emu::submit("aclnnRange", ws, ex, [=] {
    auto r = at::arange(o.numel(), at::TensorOptions().dtype(at::kDouble)) * st.toDouble() + s0.toDouble();
    o.write(r);
  }, o.numel() == 0);
}
ACLNN_RUN(aclnnRange)

// aclnnLinspace(const aclScalar* start, const aclScalar* end, int64_t steps, out)
EMU_API aclnnStatus aclnnLinspaceGetWorkspaceSize(const aclScalar* start, const aclScalar* end, int64_t steps,
                                                  aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnLinspace", start, end, out);
  auto o = T(out);
  at::Scalar s0 = S(start), s1 = S(end);
  return emu::submit("aclnnLinspace", ws, ex, [=] {
    o.write(at::linspace(s0, s1, steps, at::TensorOptions().dtype(at::kDouble)));
  }, o.numel() == 0);
}
ACLNN_RUN(aclnnLinspace)

// ---------------------------------------------------------------------------------------------------------
// Softmax and matrix products (enough for small training loops).

#define EMU_SOFTMAX(NAME, FN)                                                                              \
  EMU_API aclnnStatus aclnn##NAME##GetWorkspaceSize(const aclTensor* self, int64_t dim, aclTensor* out,     \
                                                    uint64_t* ws, aclOpExecutor** ex) {                    \
    ACLNN_CHECK_NOTNULL("aclnn" #NAME, self, out);                                                        \
    auto a = T(self), o = T(out);                                                                          \
    if (const aclnnStatus st_ = emu::documented("aclnn" #NAME, {&a, &o})) return st_;                      \
    if (dim < -std::max<int64_t>(a.dim(), 1) || dim >= std::max<int64_t>(a.dim(), 1))                      \
      return emu::reject("aclnn" #NAME, ACLNN_ERR_PARAM_INVALID, "dim out of range");                      \
    return emu::submit("aclnn" #NAME, ws, ex, [=] { o.write(at::FN(a.get(), dim, o.scalar_type())); },     \
                       any_empty({&a, &o}));                                                               \
  }                                                                                                        \
  ACLNN_RUN(aclnn##NAME)
EMU_SOFTMAX(Softmax, softmax)
EMU_SOFTMAX(LogSoftmax, log_softmax)

// aclnnSoftmaxBackward(gradOutput, output, int64_t dim, gradInput): g·y − y·sum(g·y)
EMU_API aclnnStatus aclnnSoftmaxBackwardGetWorkspaceSize(const aclTensor* grad, const aclTensor* output, int64_t dim,
                                                         aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnSoftmaxBackward", grad, output, out);
  auto g = T(grad), y = T(output), o = T(out);
  return emu::submit("aclnnSoftmaxBackward", ws, ex, [=] {
    auto gy = g.get().to(at::kFloat) * y.get().to(at::kFloat);
    o.write(gy - y.get().to(at::kFloat) * gy.sum(dim, true));
  }, any_empty({&g, &o}));
}
ACLNN_RUN(aclnnSoftmaxBackward)
// aclnnLogSoftmaxBackward(gradOutput, output, int64_t dim, out): g − exp(y)·sum(g)
EMU_API aclnnStatus aclnnLogSoftmaxBackwardGetWorkspaceSize(const aclTensor* grad, const aclTensor* output,
                                                            int64_t dim, aclTensor* out, uint64_t* ws,
                                                            aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnLogSoftmaxBackward", grad, output, out);
  auto g = T(grad), y = T(output), o = T(out);
  if (const aclnnStatus st_ = emu::documented("aclnnLogSoftmaxBackward", {&g, &y, &o})) return st_;
  // ops-nn's op_api checks dim in [-n, n - 1] (its document writes [-n, n])
  if (dim < -std::max<int64_t>(g.dim(), 1) || dim >= std::max<int64_t>(g.dim(), 1))
    return emu::reject("aclnnLogSoftmaxBackward", ACLNN_ERR_PARAM_INVALID, "dim out of range");
  return emu::submit("aclnnLogSoftmaxBackward", ws, ex, [=] {
    auto gf = g.get().to(at::kFloat);
    o.write(gf - y.get().to(at::kFloat).exp() * gf.sum(dim, true));
  }, any_empty({&g, &o}));
}
ACLNN_RUN(aclnnLogSoftmaxBackward)
// aclnnTanhBackward(gradOutput, output, gradInput): g·(1 − y²)
EMU_API aclnnStatus aclnnTanhBackwardGetWorkspaceSize(const aclTensor* grad, const aclTensor* output, aclTensor* out,
                                                      uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnTanhBackward", grad, output, out);
  auto g = T(grad), y = T(output), o = T(out);
  return emu::submit("aclnnTanhBackward", ws, ex, [=] {
    auto yf = y.get().to(at::kFloat);
    o.write(g.get().to(at::kFloat) * (1 - yf * yf));
  }, any_empty({&g, &o}));
}
ACLNN_RUN(aclnnTanhBackward)
// aclnnForeachAddList(x1, x2, alpha, out): out[i] = x1[i] + alpha·x2[i] (torch.optim's multi-tensor step).
EMU_API aclnnStatus aclnnForeachAddListGetWorkspaceSize(const aclTensorList* x1, const aclTensorList* x2,
                                                        const aclScalar* alpha, const aclTensorList* out,
                                                        uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnForeachAddList", x1, x2, out);
  auto a = emu::TL(x1), b = emu::TL(x2), o = emu::TL(out);
  const at::Scalar s = emu::S(alpha);
  if (a.size() != b.size() || a.size() != o.size()) return 161002;
  return emu::submit("aclnnForeachAddList", ws, ex, [=] {
    for (size_t i = 0; i < a.size(); ++i) o[i].write(at::add(a[i].get(), b[i].get(), s));
  }, a.empty());
}
ACLNN_RUN(aclnnForeachAddList)
// aclnnKlDivBackward(gradOutput, self, target, reduction, logTarget, gradInput): the gradient w.r.t. self,
// -target·g (or -e^target·g), scaled by 1/numel(broadcast) for mean and 1/broadcast[0] for batchmean, summed
// to self's shape (docs/aclnn_reference.md §4). torch.nn.KLDivLoss's backward on the NPU runs it.
EMU_API aclnnStatus aclnnKlDivBackwardGetWorkspaceSize(const aclTensor* gradOutput, const aclTensor* self,
                                                       const aclTensor* target, int64_t reduction, bool logTarget,
                                                       aclTensor* gradInput, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnKlDivBackward", gradOutput, self, target, gradInput);
  auto g = T(gradOutput), x = T(self), t = T(target), o = T(gradInput);
  return emu::submit("aclnnKlDivBackward", ws, ex, [=] {
    auto xf = x.get().to(at::kFloat), tf = t.get().to(at::kFloat), gf = g.get().to(at::kFloat);
    auto shape = at::infer_size(xf.sizes(), tf.sizes());
    auto grad = (logTarget ? -tf.exp() : -tf) * gf;
    grad = grad.expand(shape);
    const int64_t n = c10::multiply_integers(shape);
    if (reduction == 1 && n > 0) grad = grad / static_cast<double>(n);
    if (reduction == 3 && !shape.empty() && shape[0] > 0) grad = grad / static_cast<double>(shape[0]);
    o.write(at::sum_to(grad.contiguous(), xf.sizes()));
  }, o.numel() == 0);
}
ACLNN_RUN(aclnnKlDivBackward)
// aclnnSigmoidBackward(gradOutput, output, gradInput): g·y·(1 − y)
EMU_API aclnnStatus aclnnSigmoidBackwardGetWorkspaceSize(const aclTensor* grad, const aclTensor* output,
                                                         aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnSigmoidBackward", grad, output, out);
  auto g = T(grad), y = T(output), o = T(out);
  return emu::submit("aclnnSigmoidBackward", ws, ex, [=] {
    auto yf = y.get().to(at::kFloat);
    o.write(g.get().to(at::kFloat) * yf * (1 - yf));
  }, any_empty({&g, &o}));
}
ACLNN_RUN(aclnnSigmoidBackward)

// cubeMathType (int8_t) selects reduced-precision modes on the chip; the host computes in the input dtype.
EMU_API aclnnStatus aclnnMmGetWorkspaceSize(const aclTensor* self, const aclTensor* mat2, aclTensor* out,
                                            int8_t cubeMathType, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnMm", self, mat2, out);
  auto a = T(self), b = T(mat2), o = T(out);
  return emu::submit("aclnnMm", ws, ex, [=] { o.write(at::mm(a.get(), b.get())); }, o.numel() == 0);
}
ACLNN_RUN(aclnnMm)
EMU_API aclnnStatus aclnnMatmulGetWorkspaceSize(const aclTensor* self, const aclTensor* mat2, aclTensor* out,
                                                int8_t cubeMathType, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnMatmul", self, mat2, out);
  auto a = T(self), b = T(mat2), o = T(out);
  return emu::submit("aclnnMatmul", ws, ex, [=] { o.write(at::matmul(a.get(), b.get())); }, o.numel() == 0);
}
ACLNN_RUN(aclnnMatmul)
EMU_API aclnnStatus aclnnBatchMatMulGetWorkspaceSize(const aclTensor* self, const aclTensor* mat2, aclTensor* out,
                                                     int8_t cubeMathType, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnBatchMatMul", self, mat2, out);
  auto a = T(self), b = T(mat2), o = T(out);
  return emu::submit("aclnnBatchMatMul", ws, ex, [=] { o.write(at::bmm(a.get(), b.get())); }, o.numel() == 0);
}
ACLNN_RUN(aclnnBatchMatMul)
EMU_API aclnnStatus aclnnMvGetWorkspaceSize(const aclTensor* self, const aclTensor* vec, aclTensor* out,
                                            int8_t cubeMathType, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnMv", self, vec, out);
  auto a = T(self), b = T(vec), o = T(out);
  return emu::submit("aclnnMv", ws, ex, [=] { o.write(at::mv(a.get(), b.get())); }, o.numel() == 0);
}
ACLNN_RUN(aclnnMv)
// aclnnAddmm(self, mat1, mat2, const aclScalar* beta, const aclScalar* alpha, out, int8_t cubeMathType)
EMU_API aclnnStatus aclnnAddmmGetWorkspaceSize(const aclTensor* self, const aclTensor* mat1, const aclTensor* mat2,
                                               const aclScalar* beta, const aclScalar* alpha, aclTensor* out,
                                               int8_t cubeMathType, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnAddmm", self, mat1, mat2, out);
  auto a = T(self), b = T(mat1), c = T(mat2), o = T(out);
  at::Scalar be = beta ? S(beta) : at::Scalar(1), al = alpha ? S(alpha) : at::Scalar(1);
  return emu::submit("aclnnAddmm", ws, ex, [=] { o.write(at::addmm(a.get(), b.get(), c.get(), be, al)); },
                     o.numel() == 0);
}
ACLNN_RUN(aclnnAddmm)
// aclnnInplaceAddmm(selfRef, mat1, mat2, beta, alpha, int8_t cubeMathType): selfRef = beta selfRef + alpha mat1 @ mat2
// (ops-nn matmul/mat_mul_v3/docs/aclnnAddmm&aclnnInplaceAddmm.md). torch_npu's addmm_ and addmm.out with out aliasing
// self reach it on the chips where the op-plugin runs matmuls through aclnn only (Ascend 950).
EMU_API aclnnStatus aclnnInplaceAddmmGetWorkspaceSize(const aclTensor* selfRef, const aclTensor* mat1,
                                                      const aclTensor* mat2, const aclScalar* beta,
                                                      const aclScalar* alpha, int8_t cubeMathType, uint64_t* ws,
                                                      aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnInplaceAddmm", selfRef, mat1, mat2);
  auto a = T(selfRef), b = T(mat1), c = T(mat2);
  at::Scalar be = beta ? S(beta) : at::Scalar(1), al = alpha ? S(alpha) : at::Scalar(1);
  return emu::submit("aclnnInplaceAddmm", ws, ex, [=] { a.write(at::addmm(a.get(), b.get(), c.get(), be, al)); },
                     a.numel() == 0);
}
ACLNN_RUN(aclnnInplaceAddmm)
EMU_API aclnnStatus aclnnBaddbmmGetWorkspaceSize(const aclTensor* self, const aclTensor* b1, const aclTensor* b2,
                                                 const aclScalar* beta, const aclScalar* alpha, aclTensor* out,
                                                 int8_t cubeMathType, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnBaddbmm", self, b1, b2, out);
  auto a = T(self), b = T(b1), c = T(b2), o = T(out);
  at::Scalar be = beta ? S(beta) : at::Scalar(1), al = alpha ? S(alpha) : at::Scalar(1);
  return emu::submit("aclnnBaddbmm", ws, ex, [=] { o.write(at::baddbmm(a.get(), b.get(), c.get(), be, al)); },
                     o.numel() == 0);
}
ACLNN_RUN(aclnnBaddbmm)

// ---------------------------------------------------------------------------------------------------------
// Random numbers: (seed, offset) from torch_npu's generator select a reproducible host stream.

EMU_API aclnnStatus aclnnInplaceNormalGetWorkspaceSize(aclTensor* self, float mean, float std, int64_t seed,
                                                       int64_t offset, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnInplaceNormal", self);
  auto a = T(self);
  return emu::submit("aclnnInplaceNormal", ws, ex, [=] {
    auto g = generator(seed, offset);
    a.write(at::empty(a.sizes, at::TensorOptions().dtype(at::kFloat)).normal_(mean, std, g));
  }, a.numel() == 0);
}
ACLNN_RUN(aclnnInplaceNormal)

EMU_API aclnnStatus aclnnInplaceUniformGetWorkspaceSize(aclTensor* self, double from, double to, int64_t seed,
                                                        int64_t offset, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnInplaceUniform", self);
  auto a = T(self);
  return emu::submit("aclnnInplaceUniform", ws, ex, [=] {
    auto g = generator(seed, offset);
    a.write(at::empty(a.sizes, at::TensorOptions().dtype(at::kDouble)).uniform_(from, to, g));
  }, a.numel() == 0);
}
ACLNN_RUN(aclnnInplaceUniform)

// aclnnInplaceRandom(selfRef, int64_t from, int64_t to, int64_t seed, int64_t offset): integers in [from, to)
EMU_API aclnnStatus aclnnInplaceRandomGetWorkspaceSize(aclTensor* self, int64_t from, int64_t to, int64_t seed,
                                                       int64_t offset, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnInplaceRandom", self);
  auto a = T(self);
  return emu::submit("aclnnInplaceRandom", ws, ex, [=] {
    auto g = generator(seed, offset);
    a.write(at::empty(a.sizes, at::TensorOptions().dtype(at::kLong)).random_(from, to, g));
  }, a.numel() == 0);
}
ACLNN_RUN(aclnnInplaceRandom)

// aclnnInplaceBernoulli(selfRef, const aclScalar* p, int64_t seed, int64_t offset); ...Tensor takes a p tensor.
EMU_API aclnnStatus aclnnInplaceBernoulliGetWorkspaceSize(aclTensor* self, const aclScalar* p, int64_t seed,
                                                          int64_t offset, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnInplaceBernoulli", self, p);
  auto a = T(self);
  double prob = S(p).toDouble();
  return emu::submit("aclnnInplaceBernoulli", ws, ex, [=] {
    auto g = generator(seed, offset);
    a.write(at::empty(a.sizes, at::TensorOptions().dtype(at::kFloat)).bernoulli_(prob, g));
  }, a.numel() == 0);
}
ACLNN_RUN(aclnnInplaceBernoulli)
EMU_API aclnnStatus aclnnInplaceBernoulliTensorGetWorkspaceSize(aclTensor* self, const aclTensor* p, int64_t seed,
                                                                int64_t offset, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnInplaceBernoulliTensor", self, p);
  auto a = T(self), pt = T(p);
  return emu::submit("aclnnInplaceBernoulliTensor", ws, ex, [=] {
    auto g = generator(seed, offset);
    a.write(at::empty(a.sizes, at::TensorOptions().dtype(at::kFloat)).bernoulli_(pt.get().to(at::kFloat), g));
  }, a.numel() == 0);
}
ACLNN_RUN(aclnnInplaceBernoulliTensor)

// aclnnRandperm(int64_t n, int64_t seed, int64_t offset, out)
EMU_API aclnnStatus aclnnRandpermGetWorkspaceSize(int64_t n, int64_t seed, int64_t offset, aclTensor* out,
                                                  uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnRandperm", out);
  auto o = T(out);
  return emu::submit("aclnnRandperm", ws, ex, [=] {
    auto g = generator(seed, offset);
    o.write(at::randperm(n, g, at::TensorOptions().dtype(at::kLong)));
  }, o.numel() == 0);
}
ACLNN_RUN(aclnnRandperm)

// aclnnNormal{Tensor,Float}{Tensor,Float}(mean, std, int64_t seed, int64_t offset, out)
EMU_API aclnnStatus aclnnNormalFloatFloatGetWorkspaceSize(float mean, float std, int64_t seed, int64_t offset,
                                                          aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnNormalFloatFloat", out);
  auto o = T(out);
  return emu::submit("aclnnNormalFloatFloat", ws, ex, [=] {
    auto g = generator(seed, offset);
    o.write(at::empty(o.sizes, at::TensorOptions().dtype(at::kFloat)).normal_(mean, std, g));
  }, o.numel() == 0);
}
ACLNN_RUN(aclnnNormalFloatFloat)
EMU_API aclnnStatus aclnnNormalTensorTensorGetWorkspaceSize(const aclTensor* mean, const aclTensor* std, int64_t seed,
                                                            int64_t offset, aclTensor* out, uint64_t* ws,
                                                            aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnNormalTensorTensor", mean, std, out);
  auto m = T(mean), s = T(std), o = T(out);
  return emu::submit("aclnnNormalTensorTensor", ws, ex, [=] {
    auto g = generator(seed, offset);
    auto z = at::empty(o.sizes, at::TensorOptions().dtype(at::kFloat)).normal_(0, 1, g);
    o.write(z * s.get().to(at::kFloat) + m.get().to(at::kFloat));
  }, o.numel() == 0);
}
ACLNN_RUN(aclnnNormalTensorTensor)
EMU_API aclnnStatus aclnnNormalTensorFloatGetWorkspaceSize(const aclTensor* mean, float std, int64_t seed,
                                                           int64_t offset, aclTensor* out, uint64_t* ws,
                                                           aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnNormalTensorFloat", mean, out);
  auto m = T(mean), o = T(out);
  return emu::submit("aclnnNormalTensorFloat", ws, ex, [=] {
    auto g = generator(seed, offset);
    auto z = at::empty(o.sizes, at::TensorOptions().dtype(at::kFloat)).normal_(0, 1, g);
    o.write(z * std + m.get().to(at::kFloat));
  }, o.numel() == 0);
}
ACLNN_RUN(aclnnNormalTensorFloat)
EMU_API aclnnStatus aclnnNormalFloatTensorGetWorkspaceSize(float mean, const aclTensor* std, int64_t seed,
                                                           int64_t offset, aclTensor* out, uint64_t* ws,
                                                           aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnNormalFloatTensor", std, out);
  auto s = T(std), o = T(out);
  return emu::submit("aclnnNormalFloatTensor", ws, ex, [=] {
    auto g = generator(seed, offset);
    auto z = at::empty(o.sizes, at::TensorOptions().dtype(at::kFloat)).normal_(0, 1, g);
    o.write(z * s.get().to(at::kFloat) + mean);
  }, o.numel() == 0);
}
ACLNN_RUN(aclnnNormalFloatTensor)

// ---------------------------------------------------------------------------------------------------------
// Variance with a correction, repeat, dropout.

EMU_STATS(VarCorrection, var)

#define EMU_STATS_MEAN(NAME, FN)                                                                           \
  EMU_API aclnnStatus aclnn##NAME##GetWorkspaceSize(const aclTensor* self, const aclIntArray* dim,          \
                                                    int64_t correction, bool keepdim, aclTensor* out1,     \
                                                    aclTensor* out2, uint64_t* ws, aclOpExecutor** ex) {   \
    ACLNN_CHECK_NOTNULL("aclnn" #NAME, self, out1, out2);                                                 \
    auto a = T(self), o1 = T(out1), o2 = T(out2);                                                          \
    auto dims = IA(dim);                                                                                   \
    return emu::submit("aclnn" #NAME, ws, ex, [=] {                                                        \
      at::OptionalIntArrayRef d = dims.empty() ? at::OptionalIntArrayRef() : at::OptionalIntArrayRef(dims); \
      auto r = at::FN(a.get(), d, at::Scalar(correction), keepdim);                                        \
      o1.write(std::get<0>(r));                                                                            \
      o2.write(std::get<1>(r));                                                                            \
    }, o1.numel() == 0);                                                                                   \
  }                                                                                                        \
  ACLNN_RUN(aclnn##NAME)
EMU_STATS_MEAN(VarMean, var_mean)
EMU_STATS_MEAN(StdMeanCorrection, std_mean)

// aclnnRepeat(self, const aclIntArray* repeats, out)
EMU_API aclnnStatus aclnnRepeatGetWorkspaceSize(const aclTensor* self, const aclIntArray* repeats, aclTensor* out,
                                                uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnRepeat", self, repeats, out);
  auto a = T(self), o = T(out);
  auto r = IA(repeats);
  return emu::submit("aclnnRepeat", ws, ex, [=] { o.write(a.get().repeat(r)); }, o.numel() == 0);
}
ACLNN_RUN(aclnnRepeat)

// Dropout masks: one bit per element (bit i%8 of byte i/8), 1 = keep, kept with probability 1 - p.
static void gen_mask(const TensorDesc& o, int64_t n, double p, int64_t seed, int64_t offset) {
  auto g = generator(seed, offset);
  auto keep = at::empty({n}, at::TensorOptions().dtype(at::kDouble)).uniform_(0, 1, g).ge(p).to(at::kByte);
  int64_t nbytes = o.numel();
  auto bits = at::zeros({nbytes * 8}, at::TensorOptions().dtype(at::kByte));
  bits.narrow(0, 0, std::min(n, nbytes * 8)).copy_(keep.narrow(0, 0, std::min(n, nbytes * 8)));
  auto weights = at::tensor(std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128}, at::TensorOptions().dtype(at::kLong));
  o.write((bits.reshape({nbytes, 8}).to(at::kLong) * weights).sum(1));
}
EMU_API aclnnStatus aclnnDropoutGenMaskV2GetWorkspaceSize(const aclIntArray* shape, double p, int64_t seed,
                                                          int64_t offset, aclDataType probDataType, aclTensor* out,
                                                          uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnDropoutGenMaskV2", shape, out);
  auto o = T(out);
  int64_t n = 1;
  for (auto d : IA(shape)) n *= d;
  return emu::submit("aclnnDropoutGenMaskV2", ws, ex, [=] { gen_mask(o, n, p, seed, offset); }, o.numel() == 0);
}
ACLNN_RUN(aclnnDropoutGenMaskV2)
EMU_API aclnnStatus aclnnDropoutGenMaskGetWorkspaceSize(const aclIntArray* shape, double p, int64_t seed,
                                                        int64_t offset, aclTensor* out, uint64_t* ws,
                                                        aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnDropoutGenMask", shape, out);
  auto o = T(out);
  int64_t n = 1;
  for (auto d : IA(shape)) n *= d;
  return emu::submit("aclnnDropoutGenMask", ws, ex, [=] { gen_mask(o, n, p, seed, offset); }, o.numel() == 0);
}
ACLNN_RUN(aclnnDropoutGenMask)
// aclnnDropoutDoMask(self, mask, double p, out): self * keep / (1 - p)
EMU_API aclnnStatus aclnnDropoutDoMaskGetWorkspaceSize(const aclTensor* self, const aclTensor* mask, double p,
                                                       aclTensor* out, uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnDropoutDoMask", self, mask, out);
  auto a = T(self), m = T(mask), o = T(out);
  return emu::submit("aclnnDropoutDoMask", ws, ex, [=] {
    at::Tensor x = a.get();
    int64_t n = x.numel();
    auto bytes = m.get().to(at::kLong).reshape({-1, 1});
    auto shifts = at::tensor(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, at::TensorOptions().dtype(at::kLong));
    auto bits = bytes.bitwise_right_shift(shifts).bitwise_and(1).reshape({-1}).narrow(0, 0, n).reshape(x.sizes());
    double scale = p >= 1.0 ? 0.0 : 1.0 / (1.0 - p);
    o.write(x.to(at::kFloat) * bits.to(at::kFloat) * scale);
  }, o.numel() == 0);
}
ACLNN_RUN(aclnnDropoutDoMask)

// aclnnDropoutV3(self, noiseShape (may be null), double p, int64_t seed, int64_t offset, out, mask): the
// form the aclnn-only chips use; same mask convention as aclnnDropoutGenMask.
EMU_API aclnnStatus aclnnDropoutV3GetWorkspaceSize(const aclTensor* self, const aclTensor* noiseShape, double p,
                                                   int64_t seed, int64_t offset, aclTensor* out, aclTensor* mask,
                                                   uint64_t* ws, aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnDropoutV3", self, out, mask);
  auto a = T(self), o = T(out), m = T(mask);
  return emu::submit("aclnnDropoutV3", ws, ex, [=] {
    at::Tensor x = a.get();
    int64_t n = x.numel();
    gen_mask(m, n, p, seed, offset);
    auto bytes = m.get().to(at::kLong).reshape({-1, 1});
    auto shifts = at::tensor(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, at::TensorOptions().dtype(at::kLong));
    auto bits = bytes.bitwise_right_shift(shifts).bitwise_and(1).reshape({-1}).narrow(0, 0, n).reshape(x.sizes());
    double scale = p >= 1.0 ? 0.0 : 1.0 / (1.0 - p);
    o.write(x.to(at::kFloat) * bits.to(at::kFloat) * scale);
  }, a.numel() == 0);
}
ACLNN_RUN(aclnnDropoutV3)

// ---------------------------------------------------------------------------------------------------------
// Private formats. The emulator records the format (aclCreateTensor keeps it, so operators that reject
// private formats can), but keeps the data row-major in the first numel elements of the storage: a format
// cast is a plain copy, and every host operator reads the view shape/strides as usual.

// aclnnNpuFormatCastCalculateSizeAndFormat(src, int dstFormat, int additionalDtype, int64_t** dstStorageShape,
//                                          uint64_t* dstShapeSize, int* actualFormat); caller frees with delete[].
EMU_API aclnnStatus aclnnNpuFormatCastCalculateSizeAndFormat(const aclTensor* src, const int dstFormat,
                                                             const int additionalDtype, int64_t** shape,
                                                             uint64_t* shapeSize, int* actualFormat) {
  const char* api = "aclnnNpuFormatCastCalculateSizeAndFormat";
  if (!src || !shape || !shapeSize || !actualFormat) return emu::reject(api, ACLNN_ERR_PARAM_NULLPTR, "null argument");
  std::vector<int64_t> dims = src->view_dims, out;
  if (dstFormat == ACL_FORMAT_ND) {
    out = dims;
  } else if (dstFormat == ACL_FORMAT_FRACTAL_NZ && dims.size() >= 2) {
    // ND [..., m, n] -> NZ [..., ceil(n / C0), ceil(m / 16), 16, C0], C0 = 32 bytes / element size
    int64_t es = 2;
    switch (static_cast<aclDataType>(additionalDtype)) {
      case ACL_FLOAT: case ACL_INT32: es = 4; break;
      case ACL_INT8: case ACL_UINT8: es = 1; break;
      default: es = 2;
    }
    int64_t c0 = 32 / es, m = dims[dims.size() - 2], n = dims.back();
    out.assign(dims.begin(), dims.end() - 2);
    out.push_back((n + c0 - 1) / c0);
    out.push_back((m + 15) / 16);
    out.push_back(16);
    out.push_back(c0);
  } else {
    return emu::reject(api, ACLNN_ERR_PARAM_INVALID, "unsupported format pair for the emulator");
  }
  *shapeSize = out.size();
  *shape = new int64_t[out.size() + 1];
  for (size_t i = 0; i < out.size(); ++i) (*shape)[i] = out[i];
  *actualFormat = dstFormat;
  return ACLNN_SUCCESS;
}

// aclnnNpuFormatCast(src, dst): the data stays row-major (see above), so this is a copy.
EMU_API aclnnStatus aclnnNpuFormatCastGetWorkspaceSize(const aclTensor* src, aclTensor* dst, uint64_t* ws,
                                                       aclOpExecutor** ex) {
  ACLNN_CHECK_NOTNULL("aclnnNpuFormatCast", src, dst);
  auto a = T(src), o = T(dst);
  return emu::submit("aclnnNpuFormatCast", ws, ex, [=] { o.write(a.get()); }, a.numel() == 0);
}
ACLNN_RUN(aclnnNpuFormatCast)
