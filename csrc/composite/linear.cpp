// The linear form's chunks (linear.h). docs/semantics.md, "The fused linear JSD", has what each result is.
#include "linear.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "../core/reduction.h"

namespace npu_loss::composite {
namespace {

// The dtype of the sums, the bias gradients and the hard loss's probabilities: float32, or float64 for a
// float64 input.
at::ScalarType accumulate_dtype(c10::ScalarType result) {
  return result == at::kDouble ? at::kDouble : at::kFloat;
}

int64_t itemsize(c10::ScalarType dtype) {
  return static_cast<int64_t>(c10::elementSize(dtype));
}

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

// x @ w.T (+ b) into `out`, through addmm (beta 0 without a bias: out's contents are ignored): on CPU,
// at::mm_out into a buffer with a transposed weight makes a temporary of the buffer's size first (measured,
// bfloat16 and float32), addmm_out does not.
void logits_into(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b) {
  if (b.has_value() && b->defined()) {
    at::addmm_out(out, *b, x, w.t());
  } else {
    at::addmm_out(out, out, x, w.t(), /*beta=*/0);
  }
}

// fn(first, count) over fixed blocks of `block` of [0, size), the blocks shared among the threads, each made by
// one thread (in the caller's dispatch state, below autograd). The blocks do not depend on the thread count, so
// neither do the bits of what each block makes.
template <typename Fn>
void in_fixed_blocks(int64_t size, int64_t block, const Fn& fn) {
  const int64_t blocks = (size + block - 1) / block;
  const at::ThreadLocalState state;
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    at::ThreadLocalStateGuard guard(state);
    for (int64_t i = first; i < last; ++i) fn(i * block, std::min(block, size - i * block));
  });
}

// A CPU product through the BLAS (float32, float64). The BLAS threads one GEMM by itself, and at a chunk's
// hundred-odd rows x @ w.T lost a third of its speed: 128 rows of H = 1,024 or 2,048 at V = 32,768 took 1.3x to
// 1.6x their time per row unchunked with 2 threads, and 1.05x single-threaded. So the threads take blocks of
// the vocabulary here, each block's product made by one thread (each logit is one row of x against one row of w).
constexpr int64_t kVocabBlock = 512;

bool blas_cpu_products(const at::Tensor& x) {
  return x.is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble);
}

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

// fn(first, count) over blocks of a chunk's rows of about kBlockElements elements each: an op of two dtypes
// (a bfloat16 gradient and float32 probabilities) makes a float32 temporary of its operands' size, which a
// block keeps small.
constexpr int64_t kBlockElements = int64_t{1} << 20;

template <typename Fn>
void in_row_blocks(int64_t rows, int64_t vocab, const Fn& fn) {
  const int64_t block = std::max<int64_t>(1, kBlockElements / std::max<int64_t>(vocab, 1));
  for (int64_t first = 0; first < rows; first += block) fn(first, std::min(block, rows - first));
}

// The power of two float16's stored gradients are multiplied by (the node divides it out with grad_output):
// the largest factor a chunk's logits gradient is scaled by, brought to about 1, so that the division of
// 'mean' by K * V does not flush them to zero before grad_output reaches them. 1 for every other dtype.
double stored_scale(double largest_factor, bool half) {
  if (!half || !(largest_factor > 0) || !std::isfinite(largest_factor)) return 1.0;
  int exponent;
  std::frexp(largest_factor, &exponent);  // largest_factor in [2^(exponent - 1), 2^exponent); frexp, not log2,
                                          // keeps the wheel's glibc floor (log2 is versioned 2.29)
  return std::ldexp(1.0, std::clamp(1 - exponent, -60, 60));
}

// Whether a side (0 the student, 1 the teacher) gets any gradient: its input's, weight's or bias's.
bool wants_grads(std::array<bool, 6> mask, int side) {
  return mask[3 * side] || mask[3 * side + 1] || mask[3 * side + 2];
}

}  // namespace

bool teacher_in_halves(const LinearCall& c, std::array<bool, 6> mask, const RowStep& step) {
  const auto torch_products = [](const at::Tensor& x) {
    return !x.is_cpu() || native_cpu_products(x.scalar_type());
  };
  return step.in_place && step.fuses && !wants_grads(mask, 1) && torch_products(*c.input[0]) &&
         torch_products(*c.input[1]);
}

int64_t linear_row_bytes(const LinearSpec& spec, const LinearCall& c, std::array<bool, 6> mask, const RowStep& step) {
  const int64_t s = itemsize(c.input[0]->scalar_type()), t = itemsize(c.input[1]->scalar_type());
  const bool probs = spec.labels && (c.weight_hard != 0 || c.return_parts) && !step.fuses;
  int64_t bytes = s + (teacher_in_halves(c, mask, step) ? t / 2 : t) +
                  (probs ? itemsize(accumulate_dtype(spec.dtype)) : 0) + step.scratch_bytes;
  if (!step.in_place) bytes += (wants_grads(mask, 0) ? s : 0) + (wants_grads(mask, 1) ? t : 0);
  return bytes * std::max<int64_t>(spec.vocab, 1);
}

int64_t linear_chunk_rows(const LinearSpec& spec, const LinearCall& c, std::array<bool, 6> mask, const RowStep& step) {
  if (c.chunk_size > 0) return std::max<int64_t>(1, std::min(c.chunk_size, spec.rows));
  const int64_t share = spec.rows * std::max<int64_t>(spec.vocab, 1) * itemsize(spec.dtype) *
                        (teacher_in_halves(c, mask, step) ? kLinearHalvesShare : kLinearChunkShare) / 16;
  const int64_t budget = std::min(share, kLinearChunkMaxBytes);
  return std::clamp<int64_t>(budget / linear_row_bytes(spec, c, mask, step), 1, std::max<int64_t>(spec.rows, 1));
}

LinearResults linear_with_grads(
    const LossDecl& d, const LinearSpec& spec, const LinearCall& c, std::array<bool, 6> mask, const RowStep& step) {
  const int64_t n = spec.rows, vocab = spec.vocab;
  const at::Tensor xs = c.input[0]->reshape({n, c.input[0]->size(-1)});
  const at::Tensor xt = c.input[1]->reshape({n, c.input[1]->size(-1)});
  const at::Tensor* x[2] = {&xs, &xt};
  const auto device = xs.options();
  const auto acc = accumulate_dtype(spec.dtype);
  // Sums on the host's float64 where the device has it (CPU), else in the accumulation dtype.
  const auto sum_dtype = xs.device().is_cpu() ? at::kDouble : acc;
  const bool side_grads[2] = {wants_grads(mask, 0), wants_grads(mask, 1)};

  // The rows kept, their count K and the labels' range where the cross entropy reads them, from one copy of the
  // labels to the host.
  std::optional<at::Tensor> labels;
  at::Tensor keep;
  int64_t kept = n;
  const bool hard = spec.labels && (c.weight_hard != 0 || c.return_parts);
  const bool hard_grad = hard && c.weight_hard != 0 && side_grads[0];
  const bool fuse = step.fuses;
  if (spec.labels) {
    labels = c.labels->reshape({n}).to(at::kLong);
    keep = *labels != c.ignore_index;
    const at::Tensor host = labels->to(at::kCPU).contiguous();
    const int64_t* p = host.const_data_ptr<int64_t>();
    kept = 0;
    for (int64_t r = 0; r < n; ++r) {
      if (p[r] == c.ignore_index) continue;
      ++kept;
      TORCH_CHECK_VALUE(
          !hard || (p[r] >= 0 && p[r] < vocab), spec.op, ": with the hard loss, every kept label must be "
          "in [0, ", vocab, ") (the vocabulary), got ", p[r]);
    }
  }

  // What the soft (row loss) and hard (cross entropy) sums are divided by.
  const double kept_rows = static_cast<double>(std::max<int64_t>(kept, 1));
  double soft_div = 1, hard_div = 1;
  if (spec.reduction == LinearReduction::BatchMean) {
    soft_div = spec.labels ? kept_rows : static_cast<double>(std::max<int64_t>(spec.batch_rows, 1));
    hard_div = kept_rows;
  } else if (spec.reduction == LinearReduction::Mean) {
    soft_div = static_cast<double>(kept) * static_cast<double>(vocab);
    hard_div = kept_rows;
  }
  const double soft_factor = c.weight_soft / std::max(soft_div, 1.0);
  const double hard_factor = c.weight_hard / hard_div;
  // Per side: the student's logits gradient carries the hard loss's factor too.
  const double scales[2] = {
      stored_scale(std::max(soft_factor, hard_grad ? hard_factor : 0.0), xs.scalar_type() == at::kHalf),
      stored_scale(soft_factor, xt.scalar_type() == at::kHalf)};

  // The gradients: the inputs' written chunk by chunk, the weights' summed over the chunks (in their dtype:
  // at::addmm rounds once per chunk), the biases' in the accumulation dtype.
  std::array<at::Tensor, 6> grads;
  at::Tensor bias_sum[2];
  for (int side = 0; side < 2; ++side) {
    const at::Tensor& w = *c.weight[side];
    const std::optional<at::Tensor>& b = *c.bias[side];
    grads[3 * side] = at::empty(mask[3 * side] ? x[side]->sizes() : c10::IntArrayRef{0}, x[side]->options());
    // Written by the first chunk (beta 0): zeros only where there is no chunk.
    grads[3 * side + 1] = mask[3 * side + 1] ? (n > 0 ? at::empty_like(w) : at::zeros_like(w))
                                             : at::empty({0}, w.options());
    const bool bias_grad = mask[3 * side + 2] && b.has_value() && b->defined();
    if (bias_grad) bias_sum[side] = at::zeros({vocab}, w.options().dtype(acc));
  }

  at::Tensor soft_sum = at::zeros({}, device.dtype(sum_dtype));
  at::Tensor hard_sum = at::zeros({}, device.dtype(sum_dtype));
  const int64_t chunk = linear_chunk_rows(spec, c, mask, step);
  const int64_t rows = std::min(chunk, n);
  // The teacher's logits whole, or in halves of the chunk's rows (linear.h), each part's step run as it is made.
  const bool halves = teacher_in_halves(c, mask, step);
  const int64_t teacher_rows = halves ? (rows + 1) / 2 : rows;
  // The chunk's buffers, allocated once per call (a new one per chunk leaves the C library's heap holding the
  // freed ones).
  at::Tensor logits[2] = {own_pages({rows, vocab}, xs.options()), own_pages({teacher_rows, vocab}, xt.options())};
  at::Tensor probs = hard && !fuse ? own_pages({rows, vocab}, xs.options().dtype(acc)) : at::Tensor();
  std::optional<BlockedProducts> products[2];
  for (int side = 0; side < 2; ++side) {
    if (x[side]->is_cpu() && !native_cpu_products(x[side]->scalar_type())) {
      products[side].emplace(rows, *c.weight[side]);
    }
  }
  // Where the BLAS makes the products (float32, float64 on the CPU): the logits in vocabulary blocks, and the
  // input gradient's rows transposed into a buffer of their own (below).
  const bool blas[2] = {!products[0] && blas_cpu_products(xs), !products[1] && blas_cpu_products(xt)};
  at::Tensor rows_transposed[2];
  for (int side = 0; side < 2; ++side) {
    if (blas[side] && mask[3 * side]) rows_transposed[side] = at::empty({x[side]->size(1), rows}, x[side]->options());
  }
  const std::array<bool, 2> row_mask{side_grads[0], side_grads[1]};
  // A side's gradients of the chunk's rows `xc` (from `start`, m of them) from their logits' gradient g.
  const auto chunk_grads = [&](int side, const at::Tensor& g, const at::Tensor& xc, int64_t start, int64_t m) {
    const at::Tensor& w = *c.weight[side];
    at::Tensor rows_out = mask[3 * side] ? grads[3 * side].narrow(0, start, m) : at::Tensor();
    if (products[side]) {
      products[side]->grads(g, xc, w, rows_out, mask[3 * side + 1] ? grads[3 * side + 1] : at::Tensor(), start > 0);
    } else {
      if (rows_out.defined() && blas[side]) {
        // (w.T @ g.T).T: the BLAS threads this form better at a chunk's rows (128 rows, 2 threads: 1.2x its
        // time per row unchunked, against 1.4x for g @ w).
        at::Tensor into = rows_transposed[side].narrow(1, 0, m);
        at::mm_out(into, w.t(), g.t());
        rows_out.copy_(into.t());
      } else if (rows_out.defined()) {
        at::mm_out(rows_out, g, w);
      }
      if (mask[3 * side + 1]) grads[3 * side + 1].addmm_(g.t(), xc, /*beta=*/start == 0 ? 0 : 1);
    }
    if (bias_sum[side].defined()) {
      in_row_blocks(m, vocab, [&](int64_t first, int64_t count) {
        bias_sum[side].add_(g.narrow(0, first, count).sum({0}, false, acc));
      });
    }
  };
  // A side's logits of the rows `xc` into `out`.
  const auto make_logits = [&](int side, at::Tensor& out, const at::Tensor& xc) {
    if (products[side]) {
      products[side]->logits(out, xc, *c.weight[side], *c.bias[side]);
    } else if (blas[side]) {
      logits_by_vocab_blocks(out, xc, *c.weight[side], *c.bias[side]);
    } else {
      logits_into(out, xc, *c.weight[side], *c.bias[side]);
    }
  };
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t m = std::min(chunk, n - start);
    at::Tensor z[2], xc[2] = {x[0]->narrow(0, start, m), x[1]->narrow(0, start, m)};
    z[0] = logits[0].narrow(0, 0, m);
    make_logits(0, z[0], xc[0]);
    const std::optional<at::Tensor> lab =
        labels ? std::optional<at::Tensor>(labels->narrow(0, start, m)) : std::nullopt;
    at::Tensor h, chunk_keep, target;
    if (hard && !fuse) {
      // The cross entropy's sum over the kept rows, and (weighted in) its gradient softmax - one_hot, times
      // hard_factor * scale on the kept rows, before the row loss may write over the student's logits.
      chunk_keep = keep.narrow(0, start, m);
      target = at::where(chunk_keep, *lab, 0).unsqueeze(-1);
      h = probs.narrow(0, 0, m);
      h.copy_(z[0]);
      const at::Tensor at_label = h.gather(-1, target);
      const at::Tensor top = std::get<0>(h.max(-1, true));
      h.sub_(top).exp_();
      const at::Tensor total = h.sum({-1}, true);
      const at::Tensor picked = (at_label - top - total.log()).squeeze(-1);  // the log-softmax at the label
      hard_sum.sub_(at::where(chunk_keep, picked, 0).sum().to(sum_dtype));
      if (hard_grad) {
        h.div_(total);
        // softmax - one_hot, through index_put_ (torch_npu runs scatter through an aclop kernel)
        const at::Tensor rows_index = at::arange(m, target.options());
        h.index_put_({rows_index, target.squeeze(-1)}, at::full({m}, -1.0, h.options()), /*accumulate=*/true);
        h.mul_((chunk_keep.to(acc) * (hard_factor * scales[0])).unsqueeze(-1));
      }
    }
    // Fused: the soft factor times the stored scales, and the hard loss, in the step's passes.
    RowExtras extras{soft_factor * scales[0], scales[1] / scales[0], hard, hard_grad ? hard_factor * scales[0] : 0.0};
    // The teacher's logits and the step, over the whole chunk or (halves) over each half of its rows in turn:
    // then the step writes each half's student gradient over its logits, and the chunk's products below take
    // the whole chunk.
    at::Tensor g[2], row_scale;
    for (int64_t first = 0; first < m; first += teacher_rows) {
      const int64_t k = std::min(teacher_rows, m - first);
      z[1] = logits[1].narrow(0, 0, k);
      make_logits(1, z[1], xc[1].narrow(0, first, k));
      const std::optional<at::Tensor> part_labels =
          lab ? std::optional<at::Tensor>(lab->narrow(0, first, k)) : std::nullopt;
      auto [value, gs, gt, scale] = step.run(z[0].narrow(0, first, k), z[1], part_labels, c.beta, c.temperature,
                                             c.ignore_index, row_mask, fuse ? &extras : nullptr);
      soft_sum.add_(value.to(sum_dtype));
      if (fuse && hard) hard_sum.add_(extras.hard_sum);
      g[0] = halves ? z[0] : gs;
      g[1] = gt;
      row_scale = scale;
    }
    const bool row_scaled = scales_rows(z[0], z[1], row_mask);
    for (int side = 0; side < 2; ++side) {
      if (!side_grads[side]) continue;
      if (!fuse) {
        // The logits' gradient of the loss: the row loss's (times its row scales for float16, which need not
        // be representable in float16 themselves) times the soft factor, plus the hard loss's, all times the
        // stored scale.
        if (row_scaled) {
          in_row_blocks(m, vocab, [&](int64_t first, int64_t count) {
            const at::Tensor factor = row_scale.narrow(0, first, count).to(acc) * (soft_factor * scales[side]);
            g[side].narrow(0, first, count).mul_(factor.unsqueeze(-1));
          });
        } else {
          g[side].mul_(soft_factor * scales[side]);
        }
        if (side == 0 && hard_grad) {
          if (g[0].scalar_type() == h.scalar_type()) {
            g[0].add_(h);
          } else {
            in_row_blocks(m, vocab, [&](int64_t first, int64_t count) {
              at::Tensor into = h.narrow(0, first, count);
              g[0].narrow(0, first, count).copy_(into.add_(g[0].narrow(0, first, count)));
            });
          }
        }
      }
      chunk_grads(side, g[side], xc[side], start, m);
    }
  }

  // The results: the parts divided, the loss weighted, each rounded once to the result's dtype.
  const auto result = device.dtype(spec.dtype);
  at::Tensor soft = soft_sum / soft_div;
  if (spec.reduction == LinearReduction::Mean && kept == 0) {
    soft = at::full({}, std::numeric_limits<double>::quiet_NaN(), soft.options());
  }
  const at::Tensor hard_value = hard_sum / hard_div;
  const at::Tensor loss = soft * c.weight_soft + hard_value * c.weight_hard;
  for (int side = 0; side < 2; ++side) {
    at::Tensor& out = grads[3 * side + 2];
    out = bias_sum[side].defined() ? bias_sum[side].to(c.bias[side]->value().scalar_type())
                                    : at::empty({0}, x[side]->options());
    if (mask[3 * side]) grads[3 * side] = grads[3 * side].view(c.input[side]->sizes());
  }
  return {loss.to(result.dtype()), soft.to(result.dtype()), hard_value.to(result.dtype()), grads[0], grads[1],
          grads[2], grads[3], grads[4], grads[5],
          at::tensor({static_cast<float>(1.0 / scales[0]), static_cast<float>(1.0 / scales[1])}, at::kFloat)
              .to(xs.device())};
}

}  // namespace npu_loss::composite
