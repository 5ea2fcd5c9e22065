// The CPU's products and buffers for the linear form's chunks (products.h).
#include "products.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <sys/mman.h>

#include <algorithm>
#include <memory>

namespace npu_loss::cpu {
namespace {

using composite::logits_into;
using composite::ProductKind;
using composite::SideProducts;

// A CPU buffer of its own pages (an anonymous mapping), returned to the system when it is freed; other devices'
// from their allocator. The C library serves requests below its moving mmap threshold (up to 32 MiB) from its
// heap, where a call's chunk buffers, among the allocations around them, left holes that no later request
// filled: the same call peaked at 0.20x or 0.33x one N x V tensor from one process to the next (measured,
// float16 at N = 4,096, V = 32,768).
at::Tensor own_pages(c10::IntArrayRef sizes, const at::TensorOptions& options) {
  const int64_t bytes = c10::multiply_integers(sizes) * static_cast<int64_t>(options.dtype().itemsize());
  if (!options.device().is_cpu() || bytes == 0) return at::empty(sizes, options);
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(data != MAP_FAILED, "npu_loss: could not allocate ", bytes, " bytes for a chunk's buffers");
  return at::from_blob(data, sizes, [bytes](void* p) { munmap(p, bytes); }, options);
}

}  // namespace
}  // namespace npu_loss::cpu

// MKL's per-thread thread count, its C entry (mkl_service.h's mkl_set_num_threads_local; the lower-case symbol
// is the Fortran entry, which takes a pointer): libtorch_cpu exports it where torch's BLAS is MKL (weak: null
// elsewhere).
extern "C" int MKL_Set_Num_Threads_Local(int) __attribute__((weak));

namespace npu_loss::cpu {
namespace {

// MKL held to the calling thread for a scope (torch sets MKL_DYNAMIC false, so MKL threads a product by itself
// even inside the threads' parallel region): a product's sums then do not depend on the thread count. Nothing
// where the BLAS is not MKL.
class OneBlasThread {
 public:
  OneBlasThread() : previous_(MKL_Set_Num_Threads_Local != nullptr ? MKL_Set_Num_Threads_Local(1) : 0) {}
  ~OneBlasThread() {
    if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(previous_);
  }
  OneBlasThread(const OneBlasThread&) = delete;
  OneBlasThread& operator=(const OneBlasThread&) = delete;

 private:
  int previous_;
};

// fn(first, count) over fixed blocks of `block` of [0, size), the blocks shared among the threads, each made by
// one thread with the BLAS single-threaded (in the caller's dispatch state, below autograd). The blocks do not
// depend on the thread count, so neither do the bits of what each block makes.
template <typename Fn>
void in_fixed_blocks(int64_t size, int64_t block, const Fn& fn) {
  const int64_t blocks = (size + block - 1) / block;
  const at::ThreadLocalState state;
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    at::ThreadLocalStateGuard guard(state);
    const OneBlasThread one;
    for (int64_t i = first; i < last; ++i) fn(i * block, std::min(block, size - i * block));
  });
}

// A CPU product through the BLAS (float32, float64). The BLAS threads one GEMM by itself, and at a chunk's
// hundred-odd rows x @ w.T lost a third of its speed: 128 rows of H = 1,024 or 2,048 at V = 32,768 took 1.3x to
// 1.6x their time per row unchunked with 2 threads, and 1.05x single-threaded. So the threads take blocks of
// the vocabulary here, each block's product made by one thread (each logit is one row of x against one row of w).
constexpr int64_t kVocabBlock = 512;

void logits_by_vocab_blocks(at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
                            const std::optional<at::Tensor>& b) {
  const bool bias = b.has_value() && b->defined();
  in_fixed_blocks(w.size(0), kVocabBlock, [&](int64_t v0, int64_t count) {
    at::Tensor o = out.narrow(1, v0, count);
    logits_into(o, x, w.narrow(0, v0, count), bias ? std::optional<at::Tensor>(b->narrow(0, v0, count)) : b);
  });
}

// Whether at::addmm makes a CPU product of this dtype with oneDNN's own kernels: bfloat16 where oneDNN has
// them (AVX-512 or AMX on x86; ONEDNN_MAX_CPU_ISA may lower that), float16 where it has those (AVX-512-FP16,
// AMX). Without them ATen's own GEMM converts an operand to float32 whole first, a temporary of the weight's
// size (measured: 0.64x one N x V tensor of bfloat16 at N = 1,024, H = 256, V = 151,936, and minutes per call);
// the products are then made here in float32 blocks of the vocabulary (below). Asked once, of torch's own
// mkldnn::_is_mkldnn_*_supported ops (a torch without them is taken to have the kernels).
bool mkldnn_has(const char* op) {
  const auto handle = c10::Dispatcher::singleton().findSchema({op, ""});
  return !handle.has_value() || handle->typed<bool()>().call();
}

bool native_cpu_products(c10::ScalarType dtype) {
  if (dtype != at::kBFloat16 && dtype != at::kHalf) return true;
  static const bool bf16 = mkldnn_has("mkldnn::_is_mkldnn_bf16_supported");
  static const bool fp16 = mkldnn_has("mkldnn::_is_mkldnn_fp16_supported");
  return at::globalContext().userEnabledMkldnn() && (dtype == at::kBFloat16 ? bf16 : fp16);
}

// The products in float32 blocks of the vocabulary, for a dtype without native_cpu_products: each block of
// the weight's rows (and of the logits' columns) converted to float32, multiplied, and rounded once into the
// dtype, as oneDNN's kernels round a float32 accumulation. Its float32 buffers are allocated once per call
// and hold about kProductBlockElements floats each (2 MiB), whatever N and V, plus a chunk's rows of H twice.
// The blocks follow one another; each block's products are shared among the threads in fixed tiles of
// kProductTile columns (of the logits, or of H for the gradients), one thread per tile, as the BLAS threads
// one small GEMM poorly (above).
constexpr int64_t kProductBlockElements = int64_t{1} << 19;
constexpr int64_t kProductTile = 128;

class BlockedProducts {
 public:
  BlockedProducts(int64_t rows, const at::Tensor& w)
      : vocab_(w.size(0)),
        hidden_(w.size(1)),
        block_(std::clamp<int64_t>(kProductBlockElements / std::max<int64_t>({rows, hidden_, 1}), 1,
                                   std::max<int64_t>(vocab_, 1))) {
    const auto f32 = w.options().dtype(at::kFloat);
    x_ = own_pages({rows * hidden_}, f32);
    dx_ = own_pages({rows * hidden_}, f32);
    rows_block_ = own_pages({rows * block_}, f32);
    weight_block_ = own_pages({block_ * hidden_}, f32);
    product_block_ = own_pages({block_ * hidden_}, f32);
  }

  // out = x @ w.T (+ b).
  void logits(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b) {
    const int64_t m = x.size(0);
    const at::Tensor xf = view(x_, m, hidden_).copy_(x);
    for (int64_t v0 = 0; v0 < vocab_; v0 += block_) {
      const int64_t count = std::min(block_, vocab_ - v0);
      at::Tensor o = view(rows_block_, m, count);
      const at::Tensor wf = view(weight_block_, count, hidden_).copy_(w.narrow(0, v0, count));
      std::optional<at::Tensor> bf;
      if (b.has_value() && b->defined()) bf = b->narrow(0, v0, count).to(at::kFloat);
      in_fixed_blocks(count, kProductTile, [&](int64_t t0, int64_t tn) {
        at::Tensor tile = o.narrow(1, t0, tn);
        logits_into(tile, xf, wf.narrow(0, t0, tn), bf ? std::optional<at::Tensor>(bf->narrow(0, t0, tn)) : bf);
      });
      out.narrow(1, v0, count).copy_(o);
    }
  }

  // dx = g @ w and dw = g.T @ x (dw += g.T @ x where `accumulate`); each undefined where not wanted.
  void grads(const at::Tensor& g, const at::Tensor& x, const at::Tensor& w, at::Tensor dx, at::Tensor dw,
             bool accumulate) {
    const int64_t m = g.size(0);
    const at::Tensor xf = dw.defined() ? view(x_, m, hidden_).copy_(x) : at::Tensor();
    const at::Tensor dxf = view(dx_, m, hidden_);
    for (int64_t v0 = 0; v0 < vocab_; v0 += block_) {
      const int64_t count = std::min(block_, vocab_ - v0);
      const at::Tensor gf = view(rows_block_, m, count).copy_(g.narrow(1, v0, count));
      const at::Tensor wf = dx.defined() ? view(weight_block_, count, hidden_).copy_(w.narrow(0, v0, count))
                                         : at::Tensor();
      // dw's rows in float32 (an in-place op of two dtypes would make a temporary), the product added in
      // float32, rounded once into the dtype.
      at::Tensor rows, product;
      if (dw.defined()) {
        rows = dw.narrow(0, v0, count);
        product = view(product_block_, count, hidden_);
        if (accumulate) product.copy_(rows);
      }
      in_fixed_blocks(hidden_, kProductTile, [&](int64_t h0, int64_t hn) {
        if (dx.defined()) dxf.narrow(1, h0, hn).addmm_(gf, wf.narrow(1, h0, hn), /*beta=*/v0 == 0 ? 0 : 1);
        if (dw.defined()) {
          at::Tensor tile = product.narrow(1, h0, hn);
          at::addmm_out(tile, tile, gf.t(), xf.narrow(1, h0, hn), /*beta=*/accumulate ? 1 : 0);
        }
      });
      if (dw.defined()) rows.copy_(product);
    }
    if (dx.defined()) dx.copy_(dxf);
  }

 private:
  // A (rows, count) view of a flat buffer: addmm_out writes a contiguous result in place.
  static at::Tensor view(const at::Tensor& flat, int64_t rows, int64_t count) {
    return flat.narrow(0, 0, rows * count).view({rows, count});
  }

  int64_t vocab_, hidden_, block_;
  at::Tensor x_, dx_, rows_block_, weight_block_, product_block_;
};

// The BLAS's products over fixed blocks, each made by one thread, so that no product's sums depend on the
// thread count (MKL's own threading splits a GEMM's sums by it: on AVX-512 machines a 64 x 4,096 by 4,096 x 64
// product differed in its last bits between 1 and 2 threads): the logits over blocks of the vocabulary (above);
// the input gradient's columns over blocks of the hidden size, each g @ w[:, block] written into its columns;
// the weight gradient over blocks of the vocabulary. A hidden block of 256 columns: at a chunk's 256 rows one
// thread made g @ w[:, block] at 154 GFLOP/s against 99 at 128 columns (and 136 as (w[:, block].T @ g.T).T),
// at V 32,768 and 151,936, H 1,024 and 2,048 (AVX-512, float32); 512 columns made 162 but leave an H of 1,024
// two blocks to share among the threads.
constexpr int64_t kHiddenBlock = 256;

class VocabBlockProducts final : public SideProducts {
 public:
  VocabBlockProducts(const at::Tensor& w, const std::optional<at::Tensor>& b) : w_(w), b_(b) {}
  void logits(at::Tensor& out, const at::Tensor& xc) override { logits_by_vocab_blocks(out, xc, w_, b_); }
  void grads(const at::Tensor& g, const at::Tensor& xc, at::Tensor dx, at::Tensor dw, bool first) override {
    if (dx.defined()) {
      in_fixed_blocks(w_.size(1), kHiddenBlock, [&](int64_t h0, int64_t count) {
        at::Tensor part = dx.narrow(1, h0, count);
        at::mm_out(part, g, w_.narrow(1, h0, count));
      });
    }
  if (dw.defined()) {
      in_fixed_blocks(w_.size(0), kVocabBlock, [&](int64_t v0, int64_t count) {
        dw.narrow(0, v0, count).addmm_(g.narrow(1, v0, count).t(), xc, /*beta=*/first ? 0 : 1);
      });
    }
  }

 private:
  const at::Tensor& w_;
  const std::optional<at::Tensor>& b_;
};

// The float32 blocks (above) as a side's products.
class Float32BlockProducts final : public SideProducts {
 public:
  Float32BlockProducts(const at::Tensor& w, const std::optional<at::Tensor>& b, int64_t rows)
      : w_(w), b_(b), blocks_(rows, w) {}
  void logits(at::Tensor& out, const at::Tensor& xc) override { blocks_.logits(out, xc, w_, b_); }
  void grads(const at::Tensor& g, const at::Tensor& xc, at::Tensor dx, at::Tensor dw, bool first) override {
    blocks_.grads(g, xc, w_, dx, dw, /*accumulate=*/!first);
  }

 private:
  const at::Tensor& w_;
  const std::optional<at::Tensor>& b_;
  BlockedProducts blocks_;
};

ProductKind kind_of(const at::Tensor& x) {
  if (!x.is_cpu()) return ProductKind::Aten;
  if (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble) return ProductKind::VocabBlocks;
  return native_cpu_products(x.scalar_type()) ? ProductKind::Aten : ProductKind::Float32Blocks;
}

std::unique_ptr<SideProducts> products_of(
    ProductKind kind, const at::Tensor& w, const std::optional<at::Tensor>& b, int64_t rows) {
  switch (kind) {
    case ProductKind::VocabBlocks:
      return std::make_unique<VocabBlockProducts>(w, b);
    case ProductKind::Float32Blocks:
      return std::make_unique<Float32BlockProducts>(w, b, rows);
    case ProductKind::Aten:
      break;
  }
  return composite::aten_products(w, b);
}

}  // namespace

composite::ChunkResources chunk_resources() {
  return {&kind_of, &products_of, &own_pages};
}

}  // namespace npu_loss::cpu
