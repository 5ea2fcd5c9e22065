// The CPU kernels' instruction sets and the dense kernel table each one provides (docs/cpu_kernels.md).
//
// csrc/cpu/dense_kernels.h is compiled three times on x86-64, by isa_avx512.cpp, isa_avx2.cpp and
// isa_baseline.cpp, each for its instruction set; elsewhere only the baseline exists. selected_isa() (isa.cpp) picks
// one table for the process: best_isa(), or the one NPU_LOSS_OPS_CPU_ISA names. No torch types
// here: the vector translation units must not include torch headers.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../losses.h"

namespace npu_loss::cpu {

// The one accumulation order of the sums taken outside the vector kernels' own loops (the baseline's and
// float64's loss sums, the strided loop's buffers, the target gradient's rows; docs/cpu_kernels.md, "Sums"):
// element begin + i goes into partial sum i % kSumLanes, and the partials are then added pairwise,
// ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)). Written out so that the compiler's vectorizer, which
// works at some optimization levels and not at others, cannot change it: every -O level, the sanitized
// build and every architecture add in this order. The lanes are independent, so -O3 still vectorizes it.
// Internal linkage: each translation unit, built for its own instruction set, keeps its own copy.
inline constexpr int kSumLanes = 8;

template <class Acc, class ValueAt>
static inline Acc lane_blocked_sum(int64_t begin, int64_t end, const ValueAt& value_at) {
  Acc partial[kSumLanes] = {};
  int64_t i = begin;
  for (; i + kSumLanes <= end; i += kSumLanes) {
    for (int k = 0; k < kSumLanes; ++k) partial[k] += value_at(i + k);
  }
  for (int k = 0; i < end; ++i, ++k) partial[k] += value_at(i);
  for (int width = kSumLanes / 2; width > 0; width /= 2) {
    for (int k = 0; k < width; ++k) partial[k] += partial[k + width];
  }
  return partial[0];
}

enum class Isa : int { Baseline = 0, Avx2 = 1, Avx512 = 2 };


// The storage types of the dense kernels' operands (all operands of one call share it). FloatOfBFloat16 is
// float storage whose values are all bfloat16: the strided loop's buffers for bfloat16 inputs, computed
// as the bfloat16 kernels compute (KL's log of a bfloat16 target), so that both loops give the same bits.
enum class DType : int { Float, BFloat16, Half, Double, FloatOfBFloat16 };

// A call's loss and scalar: the loss's index in AllLosses (losses.h, loss_index), and the value of its one
// scalar argument: a float (smooth L1's beta, Huber's delta) or a bool (KL's log_target).
struct LossParams {
  int loss;
  double float_scalar = 0;
  bool bool_scalar = false;
};

// Kernels over n elements at the same offsets: element i of each operand is at its pointer + i.
struct DenseKernels {
  // out = gradient(g * scale, x, t); g is one element when g_scalar.
  void (*backward)(const LossParams& loss, DType dtype, const void* g, bool g_scalar, const void* x,
                   const void* t, void* out, int64_t n, double scale);
  // out = loss(x, t)
  void (*forward)(const LossParams& loss, DType dtype, const void* x, const void* t, void* out, int64_t n);
  // The sum of loss(x, t), accumulated in the opmath type, lanes in a fixed order.
  double (*sum)(const LossParams& loss, DType dtype, const void* x, const void* t, int64_t n);
  // The float log and exp the KL kernels use, their log of bfloat16 values (x must hold bfloat16 values),
  // and the tanh of the row kernels' softcap, exposed for tests.
  void (*log)(const float* x, float* out, int64_t n);
  void (*exp)(const float* x, float* out, int64_t n);
  void (*log_bf16)(const float* x, float* out, int64_t n);
  void (*tanh)(const float* x, float* out, int64_t n);
};

// The bytes of one element of a storage type.
constexpr int64_t dtype_size(DType dtype) {
  return dtype == DType::Double ? 8 : (dtype == DType::Float || dtype == DType::FloatOfBFloat16) ? 4 : 2;
}

// One call of a row member's CPU kernel (row_kernels.h, and the member's own math, e.g. jsd_kernel.h) over a batch
// of rows: rows of V logits, the student's and the teacher's, and the scalars the declaration names. Offsets and steps count elements; what the call does not want is null.
struct RowBatch {
  DType student_dtype, teacher_dtype;
  DType result_dtype;                    // of the values ('none') and of grad_output
  const void* student;
  const void* teacher;
  const int64_t* student_offsets;        // row r starts at student + student_offsets[r]
  const int64_t* teacher_offsets;
  int64_t student_step, teacher_step;    // from one element of a row to the next
  int64_t vocab;
  const int64_t* kept;                   // row r's index among the rows kept, -1 where its label drops it (null: all)
  RowScalars scalars;                   // the member's declared scalars (losses.h's RowArgs), read by name
  double temperature;                    // the one of them every logit is divided by (ScalarRole::Temperature)
  double logit_scale[2];                 // each side's logits times it first (StudentScale, TeacherScale),
  double logit_softcap[2];               // then c * tanh(x / c) where c != 0 (StudentSoftcap, TeacherSoftcap)
  double* row_sums;                      // kept row k's sum of values at row_sums[k]
  void* values;                          // kept row k's values at values + k * vocab (k * entries: a support's)
  void* grad_student;                    // row r's gradient at + r * vocab, in the logits' dtype; 0 for a dropped row
  void* grad_teacher;
  const void* grad_output;               // kept row k's weights at + k * vocab, as values (the backward of 'none'); null: one
  double grad_scale;                     // every weight's factor
  double teacher_scale;                  // the teacher's gradients' factor on top of it (with row_scale null)
  // Non-null: each kept row's gradients are stored times a power of two 2^j that brings the row's largest
  // within 2^-14 .. 2^14 (float16's range for gradients made before the loss scale reaches them), and
  // row_scale[r] = 2^-j; null: stored as they are.
  float* row_scale;
  // The hard loss (the linear form's cross entropy on the student's transformed, untempered logits, composite/linear.h's
  // RowExtras), where hard_labels is non-null: row r's label at hard_labels[r] (within [0, V) for a kept row);
  // kept row k's -log softmax(student)[label] at hard_sums[k]; and, where the student's gradient is made,
  // hard_weight * (softmax(student) - one_hot(label)) added to it. Only with row_scale null.
  const int64_t* hard_labels;
  double* hard_sums;
  double hard_weight;
  // A teacher over a support (losses.h's TeacherForm::Support), where support > 0: K entries per row, in rows the
  // frame makes contiguous: row r's ids at support_ids + r * K (in [0, V) where on; 0 where off), whether each
  // is on at support_on + r * K (null: all), the teacher's log-probabilities (float64) at support_teacher + r * K;
  // with support_tail, one more entry per row (the tail bucket): the values' and grad_output's rows have K + 1
  // entries. The teacher's gradient, where wanted, goes to support_grad_teacher + r * K (float64, 0 where off
  // or dropped, times row_scale's power where row_scale is set), and grad_teacher is then unused.
  int64_t support;
  bool support_tail;
  const int64_t* support_ids;
  const bool* support_on;
  const double* support_teacher;
  double* support_grad_teacher;
  // Non-null: row r's entropy of the student's distribution, -sum(p * log p) with p = softmax of its
  // transformed logits / T, at entropy[r] for a kept row (composite/linear.h's RowExtras); a dropped row's untouched.
  float* entropy;
};

// Whether a call's operands share one storage type and its rows are contiguous: the kernel then reads and
// writes them as they are; else it converts each row in scratch memory.
inline bool rows_direct(const RowBatch& c) {
  return c.student_dtype == c.teacher_dtype && c.result_dtype == c.student_dtype && c.student_step == 1 &&
      c.teacher_step == 1;
}

// Whether a call computes in double (a float64 operand).
inline bool rows_in_float64(const RowBatch& c) {
  return c.student_dtype == DType::Double || c.teacher_dtype == DType::Double;
}

// The elements of a scratch row that waits between a row kernel's passes (e.g. jsd_kernel.h's RowScratch): the
// vocabulary rounded up to whole vectors of the widest instruction set (AVX-512's 32 floats).
inline int64_t row_cache_floats(int64_t vocab) {
  return (vocab + 31) / 32 * 32;
}

// A row is made in blocks of this many vectors (row_kernels.h: the statistics pass's running maximum, and the
// row sums' order).
constexpr int kRowBlockVectors = 8;

// The most blocks a row of the vocabulary makes (blocks of kRowBlockVectors vectors of one element or more).
inline int64_t row_block_count(int64_t vocab) {
  return vocab / kRowBlockVectors + 1;
}

// A row member's kernel: rows [begin, end) of a call, with the calling thread's scratch memory of
// scratch_bytes(call) bytes.
struct RowKernel {
  void (*run)(const RowBatch& call, int64_t begin, int64_t end, void* scratch);
  int64_t (*scratch_bytes)(const RowBatch& call);
};

// Every row member's kernel, indexed by the declaration (losses.h's row_index<Loss>); row_table.h makes it.
struct RowKernels {
  RowKernel of[kRowLosses];
};

namespace baseline {
extern const DenseKernels kKernels;
extern const RowKernels kRowKernels;
}
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NPU_LOSS_HAVE_X86_KERNELS 1
namespace avx2 {
extern const DenseKernels kKernels;
extern const RowKernels kRowKernels;
}
namespace avx512 {
extern const DenseKernels kKernels;
extern const RowKernels kRowKernels;
}
#endif

// "avx512", "avx2" or "baseline".
const char* isa_name(Isa isa);
// A description for build_info(), e.g. "x86-64-v3 (AVX2, FMA, F16C)".
const char* isa_description(Isa isa);
// The best instruction set this CPU runs and this build has: what runs unless NPU_LOSS_OPS_CPU_ISA says
// otherwise. The AVX-512 kernels have passed the whole suite, the tests over 2^31 elements included, on
// AVX-512 CPUs, and they hold bfloat16 to its roofline where AVX2 does not (docs/cpu_kernels.md).
Isa best_isa();
// best_isa(), or NPU_LOSS_OPS_CPU_ISA's choice; read once. Throws std::invalid_argument for an unknown
// name or an instruction set this CPU or build lacks.
Isa selected_isa();
// Parses a name; throws std::invalid_argument as selected_isa() does.
Isa parse_isa(const char* name, const char* source);
const DenseKernels& kernels_for(Isa isa);

const RowKernels& row_kernels_for(Isa isa);

// The selected instruction set's tables.
inline const DenseKernels& dense_kernels() {
  static const DenseKernels& k = kernels_for(selected_isa());
  return k;
}

inline const RowKernels& row_kernels() {
  static const RowKernels& k = row_kernels_for(selected_isa());
  return k;
}

}  // namespace npu_loss::cpu
