// A small vector type per instruction set, for the dense kernels (dense_kernels.h). Each isa_*.cpp compiles
// the kernels once, for one instruction set, and this header picks the matching type from the macros that
// translation unit enables: two registers of 16 floats for AVX-512 (x86-64-v4), two of 8 for AVX2
// (x86-64-v3, with FMA and F16C), and one float elsewhere (the baseline: plain C++ that the compiler may
// still vectorize, and the only kernels on non-x86 CPUs). The translation unit says which by defining NPU_LOSS_ISA_AVX512 or
// NPU_LOSS_ISA_AVX2 (GCC's `#pragma GCC target` does not define __AVX2__ and friends in C++). The kernels
// are written once against this interface:
//
//   F (floats), I (int32 lanes), M (lane masks); kLanes; splat, load/store for float, bfloat16 (the store
//   rounds to nearest even) and float16 bits (a bfloat16 vector's lanes are in an order of its own, the
//   same for its load and its store, so only elementwise work may be done on them); + - * / on F,
//   fma(a, b, c) = a * b + c rounded once; comparisons (false on NaN), & | on M, all, select; bit casts,
//   integer + - & and shifts, int -> float; reduce_add (a fixed lane order); and, where
//   NPU_LOSS_HAVE_LOOKUP128 is defined (AVX-512 only), lookup128: a 128-entry float table indexed per lane.
//
// No libm calls and no torch headers (the baseline alone uses c10's float16 conversions): the vector
// translation units are built for instruction sets the CPU may lack, so they must not emit inline functions
// that other code could share (docs/cpu_kernels.md).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(NPU_LOSS_ISA_AVX512) || defined(NPU_LOSS_ISA_AVX2)
#include <immintrin.h>
#else
#include <c10/util/Half.h>
#endif

#define NPU_LOSS_SIMD_INLINE inline __attribute__((always_inline))

namespace npu_loss::cpu::NPU_LOSS_ISA {
namespace {

// One bfloat16 <-> float, on every instruction set: the baseline's vector of one, and the row kernels'
// conversion of a row element by element (row_kernels.h). Rounds to nearest even on the bits, as the vector
// forms do.
NPU_LOSS_SIMD_INLINE float bf16_value(uint16_t b) {
  const uint32_t w = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &w, sizeof(f));
  return f;
}
NPU_LOSS_SIMD_INLINE uint16_t bf16_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

#if defined(NPU_LOSS_ISA_AVX512) || defined(NPU_LOSS_ISA_AVX2)

// One register: F1 (floats), I1 (int32), M1 (a lane mask), and the operations that differ between the two
// instruction sets. F, I and M below are pairs of them.
#if defined(NPU_LOSS_ISA_AVX512)

constexpr int kRegisterLanes = 16;
struct F1 { __m512 v; };
struct I1 { __m512i v; };
struct M1 { __mmask16 v; };

NPU_LOSS_SIMD_INLINE F1 splat1(float a) { return {_mm512_set1_ps(a)}; }
NPU_LOSS_SIMD_INLINE I1 splat1_i(int32_t a) { return {_mm512_set1_epi32(a)}; }
NPU_LOSS_SIMD_INLINE F1 load1(const float* p) { return {_mm512_loadu_ps(p)}; }
NPU_LOSS_SIMD_INLINE void store1(float* p, F1 a) { _mm512_storeu_ps(p, a.v); }
NPU_LOSS_SIMD_INLINE F1 load1_half(const uint16_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
NPU_LOSS_SIMD_INLINE void store1_half(uint16_t* p, F1 a) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
// 2 * 16 bfloat16 as two registers of floats: each 16-bit value becomes the high half of a 32-bit lane,
// interleaved within 128-bit blocks (elements 0-3, 8-11, 16-19, 24-27 in one, the rest in the other);
// store_narrow2 undoes exactly that order.
NPU_LOSS_SIMD_INLINE void load2_bf16(const uint16_t* p, F1& lo, F1& hi) {
  const __m512i w = _mm512_loadu_si512(p);
  const __m512i zero = _mm512_setzero_si512();
  lo.v = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, w));
  hi.v = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, w));
}
// bfloat16 rounding of two registers of float bits, to nearest even, stored in load2_bf16's order: b +
// 0x7FFF, plus 1 where the lowest kept bit (bit 16) is set (a masked add), then one two-source word permute
// takes the high halves. The same integer arithmetic as the AVX2 form, in 7 instructions instead of 11.
NPU_LOSS_SIMD_INLINE __m512i round_bf16_1(__m512i b) {
  const __m512i r = _mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF));
  return _mm512_mask_add_epi32(r, _mm512_test_epi32_mask(b, _mm512_set1_epi32(0x10000)), r, _mm512_set1_epi32(1));
}
NPU_LOSS_SIMD_INLINE void store2_bf16(uint16_t* p, F1 lo, F1 hi) {
  // Output word 8j + i of 128-bit block j: the high word of lo's lane 4j + i (i < 4), else of hi's 4j + i - 4.
  alignas(64) static constexpr uint16_t kHighWords[32] = {
      1, 3, 5, 7, 33, 35, 37, 39, 9, 11, 13, 15, 41, 43, 45, 47,
      17, 19, 21, 23, 49, 51, 53, 55, 25, 27, 29, 31, 57, 59, 61, 63};
  _mm512_storeu_si512(p, _mm512_permutex2var_epi16(round_bf16_1(_mm512_castps_si512(lo.v)),
                                                   _mm512_load_si512(kHighWords),
                                                   round_bf16_1(_mm512_castps_si512(hi.v))));
}

NPU_LOSS_SIMD_INLINE F1 operator+(F1 a, F1 b) { return {_mm512_add_ps(a.v, b.v)}; }
NPU_LOSS_SIMD_INLINE F1 operator-(F1 a, F1 b) { return {_mm512_sub_ps(a.v, b.v)}; }
NPU_LOSS_SIMD_INLINE F1 operator*(F1 a, F1 b) { return {_mm512_mul_ps(a.v, b.v)}; }
NPU_LOSS_SIMD_INLINE F1 operator/(F1 a, F1 b) { return {_mm512_div_ps(a.v, b.v)}; }
NPU_LOSS_SIMD_INLINE F1 fma(F1 a, F1 b, F1 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
NPU_LOSS_SIMD_INLINE F1 abs(F1 a) {
  return {_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a.v), _mm512_set1_epi32(0x7FFFFFFF)))};
}
template <int P>
NPU_LOSS_SIMD_INLINE M1 compare(F1 a, F1 b) { return {_mm512_cmp_ps_mask(a.v, b.v, P)}; }
NPU_LOSS_SIMD_INLINE M1 operator&(M1 a, M1 b) { return {static_cast<__mmask16>(a.v & b.v)}; }
NPU_LOSS_SIMD_INLINE M1 operator|(M1 a, M1 b) { return {static_cast<__mmask16>(a.v | b.v)}; }
NPU_LOSS_SIMD_INLINE bool all1(M1 a) { return a.v == 0xFFFF; }
NPU_LOSS_SIMD_INLINE F1 select(M1 m, F1 yes, F1 no) { return {_mm512_mask_blend_ps(m.v, no.v, yes.v)}; }
NPU_LOSS_SIMD_INLINE I1 select(M1 m, I1 yes, I1 no) { return {_mm512_mask_blend_epi32(m.v, no.v, yes.v)}; }
NPU_LOSS_SIMD_INLINE I1 bits(F1 a) { return {_mm512_castps_si512(a.v)}; }
NPU_LOSS_SIMD_INLINE F1 from_bits(I1 a) { return {_mm512_castsi512_ps(a.v)}; }
NPU_LOSS_SIMD_INLINE I1 operator+(I1 a, I1 b) { return {_mm512_add_epi32(a.v, b.v)}; }
NPU_LOSS_SIMD_INLINE I1 operator-(I1 a, I1 b) { return {_mm512_sub_epi32(a.v, b.v)}; }
NPU_LOSS_SIMD_INLINE I1 operator&(I1 a, I1 b) { return {_mm512_and_si512(a.v, b.v)}; }
template <int N> NPU_LOSS_SIMD_INLINE I1 shift_right_arith(I1 a) { return {_mm512_srai_epi32(a.v, N)}; }
template <int N> NPU_LOSS_SIMD_INLINE I1 shift_right(I1 a) { return {_mm512_srli_epi32(a.v, N)}; }
template <int N> NPU_LOSS_SIMD_INLINE I1 shift_left(I1 a) { return {_mm512_slli_epi32(a.v, N)}; }
NPU_LOSS_SIMD_INLINE F1 to_float(I1 a) { return {_mm512_cvtepi32_ps(a.v)}; }
// table[i & 127] per lane, for a 64-byte aligned table of 128 floats: four two-source permutes of 32 entries
// each (the low 5 bits), then two blends by bit 5 and one by bit 6.
#define NPU_LOSS_HAVE_LOOKUP128 1
NPU_LOSS_SIMD_INLINE F1 lookup128(const float* table, I1 i) {
  const auto part = [&](int k) {
    return _mm512_permutex2var_ps(_mm512_load_ps(table + 32 * k), i.v, _mm512_load_ps(table + 32 * k + 16));
  };
  const __mmask16 bit5 = _mm512_test_epi32_mask(i.v, _mm512_set1_epi32(32));
  const __mmask16 bit6 = _mm512_test_epi32_mask(i.v, _mm512_set1_epi32(64));
  const __m512 low = _mm512_mask_blend_ps(bit5, part(0), part(1));
  const __m512 high = _mm512_mask_blend_ps(bit5, part(2), part(3));
  return {_mm512_mask_blend_ps(bit6, low, high)};
}
NPU_LOSS_SIMD_INLINE float reduce_add(F1 a) {
  // Halves added pairwise: 16 -> 8 -> 4 -> 2 -> 1, the same order on every call.
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a.v), _mm512_extractf32x8_ps(a.v, 1));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

#else  // AVX2

constexpr int kRegisterLanes = 8;
struct F1 { __m256 v; };
struct I1 { __m256i v; };
struct M1 { __m256 v; };  // all-ones lanes where true

NPU_LOSS_SIMD_INLINE F1 splat1(float a) { return {_mm256_set1_ps(a)}; }
NPU_LOSS_SIMD_INLINE I1 splat1_i(int32_t a) { return {_mm256_set1_epi32(a)}; }
NPU_LOSS_SIMD_INLINE F1 load1(const float* p) { return {_mm256_loadu_ps(p)}; }
NPU_LOSS_SIMD_INLINE void store1(float* p, F1 a) { _mm256_storeu_ps(p, a.v); }
NPU_LOSS_SIMD_INLINE F1 load1_half(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
NPU_LOSS_SIMD_INLINE void store1_half(uint16_t* p, F1 a) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
// 2 * 8 bfloat16 as two registers of floats, interleaved within 128-bit blocks (elements 0-3 and 8-11 in
// one, 4-7 and 12-15 in the other); store_narrow2 undoes exactly that order.
NPU_LOSS_SIMD_INLINE void load2_bf16(const uint16_t* p, F1& lo, F1& hi) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i zero = _mm256_setzero_si256();
  lo.v = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, w));
  hi.v = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, w));
}
// bfloat16 rounding of two registers of float bits, to nearest even (b + 0x7FFF + bit 16 of b: the carry
// out of the low half rounds the exponent up correctly, and to inf past the largest bfloat16), stored in
// load2_bf16's order.
NPU_LOSS_SIMD_INLINE __m256i round_bf16_1(__m256i b) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7FFF)), lsb), 16);
}
NPU_LOSS_SIMD_INLINE void store2_bf16(uint16_t* p, F1 lo, F1 hi) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm256_packus_epi32(round_bf16_1(_mm256_castps_si256(lo.v)), round_bf16_1(_mm256_castps_si256(hi.v))));
}

NPU_LOSS_SIMD_INLINE F1 operator+(F1 a, F1 b) { return {_mm256_add_ps(a.v, b.v)}; }
NPU_LOSS_SIMD_INLINE F1 operator-(F1 a, F1 b) { return {_mm256_sub_ps(a.v, b.v)}; }
NPU_LOSS_SIMD_INLINE F1 operator*(F1 a, F1 b) { return {_mm256_mul_ps(a.v, b.v)}; }
NPU_LOSS_SIMD_INLINE F1 operator/(F1 a, F1 b) { return {_mm256_div_ps(a.v, b.v)}; }
NPU_LOSS_SIMD_INLINE F1 fma(F1 a, F1 b, F1 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
NPU_LOSS_SIMD_INLINE F1 abs(F1 a) {
  return {_mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(a.v), _mm256_set1_epi32(0x7FFFFFFF)))};
}
template <int P>
NPU_LOSS_SIMD_INLINE M1 compare(F1 a, F1 b) { return {_mm256_cmp_ps(a.v, b.v, P)}; }
NPU_LOSS_SIMD_INLINE M1 operator&(M1 a, M1 b) { return {_mm256_and_ps(a.v, b.v)}; }
NPU_LOSS_SIMD_INLINE M1 operator|(M1 a, M1 b) { return {_mm256_or_ps(a.v, b.v)}; }
NPU_LOSS_SIMD_INLINE bool all1(M1 a) { return _mm256_movemask_ps(a.v) == 0xFF; }
NPU_LOSS_SIMD_INLINE F1 select(M1 m, F1 yes, F1 no) { return {_mm256_blendv_ps(no.v, yes.v, m.v)}; }
NPU_LOSS_SIMD_INLINE I1 select(M1 m, I1 yes, I1 no) {
  return {_mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(no.v), _mm256_castsi256_ps(yes.v), m.v))};
}
NPU_LOSS_SIMD_INLINE I1 bits(F1 a) { return {_mm256_castps_si256(a.v)}; }
NPU_LOSS_SIMD_INLINE F1 from_bits(I1 a) { return {_mm256_castsi256_ps(a.v)}; }
NPU_LOSS_SIMD_INLINE I1 operator+(I1 a, I1 b) { return {_mm256_add_epi32(a.v, b.v)}; }
NPU_LOSS_SIMD_INLINE I1 operator-(I1 a, I1 b) { return {_mm256_sub_epi32(a.v, b.v)}; }
NPU_LOSS_SIMD_INLINE I1 operator&(I1 a, I1 b) { return {_mm256_and_si256(a.v, b.v)}; }
template <int N> NPU_LOSS_SIMD_INLINE I1 shift_right_arith(I1 a) { return {_mm256_srai_epi32(a.v, N)}; }
template <int N> NPU_LOSS_SIMD_INLINE I1 shift_right(I1 a) { return {_mm256_srli_epi32(a.v, N)}; }
template <int N> NPU_LOSS_SIMD_INLINE I1 shift_left(I1 a) { return {_mm256_slli_epi32(a.v, N)}; }
NPU_LOSS_SIMD_INLINE F1 to_float(I1 a) { return {_mm256_cvtepi32_ps(a.v)}; }
// No 128-entry lookup (NPU_LOSS_HAVE_LOOKUP128): AVX2 permutes 8 entries at a time, and its gather was no
// faster than log's polynomial (docs/cpu_kernels.md).
NPU_LOSS_SIMD_INLINE float reduce_add(F1 a) {
  // Halves added pairwise: 8 -> 4 -> 2 -> 1, the same order on every call.
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

#endif

// The kernels' types: two registers, so that every operation is issued twice on independent data. The
// long dependency chains of log and exp then overlap even where the out-of-order window is small (an
// 8-lane AVX2 log alone is latency-bound).
constexpr int kLanes = 2 * kRegisterLanes;
constexpr bool kVector = true;
struct F { F1 a, b; };
struct I { I1 a, b; };
struct M { M1 a, b; };

NPU_LOSS_SIMD_INLINE F splat(float v) { return {splat1(v), splat1(v)}; }
NPU_LOSS_SIMD_INLINE I splat_i(int32_t v) { return {splat1_i(v), splat1_i(v)}; }
NPU_LOSS_SIMD_INLINE F load(const float* p) { return {load1(p), load1(p + kRegisterLanes)}; }
NPU_LOSS_SIMD_INLINE void store(float* p, F v) {
  store1(p, v.a);
  store1(p + kRegisterLanes, v.b);
}
// bfloat16 lanes come in load2_bf16's order; store_bf16 rounds and stores from the same order.
NPU_LOSS_SIMD_INLINE F load_bf16(const uint16_t* p) {
  F v;
  load2_bf16(p, v.a, v.b);
  return v;
}
NPU_LOSS_SIMD_INLINE void store_bf16(uint16_t* p, F v) { store2_bf16(p, v.a, v.b); }
#ifdef NPU_LOSS_HAVE_LOOKUP128
NPU_LOSS_SIMD_INLINE F lookup128(const float* table, I i) { return {lookup128(table, i.a), lookup128(table, i.b)}; }
#endif
NPU_LOSS_SIMD_INLINE F load_half(const uint16_t* p) { return {load1_half(p), load1_half(p + kRegisterLanes)}; }
NPU_LOSS_SIMD_INLINE void store_half(uint16_t* p, F v) {
  store1_half(p, v.a);
  store1_half(p + kRegisterLanes, v.b);
}

NPU_LOSS_SIMD_INLINE F operator+(F x, F y) { return {x.a + y.a, x.b + y.b}; }
NPU_LOSS_SIMD_INLINE F operator-(F x, F y) { return {x.a - y.a, x.b - y.b}; }
NPU_LOSS_SIMD_INLINE F operator*(F x, F y) { return {x.a * y.a, x.b * y.b}; }
NPU_LOSS_SIMD_INLINE F operator/(F x, F y) { return {x.a / y.a, x.b / y.b}; }
NPU_LOSS_SIMD_INLINE F fma(F x, F y, F z) { return {fma(x.a, y.a, z.a), fma(x.b, y.b, z.b)}; }
NPU_LOSS_SIMD_INLINE F abs(F x) { return {abs(x.a), abs(x.b)}; }
NPU_LOSS_SIMD_INLINE M operator<(F x, F y) { return {compare<_CMP_LT_OQ>(x.a, y.a), compare<_CMP_LT_OQ>(x.b, y.b)}; }
NPU_LOSS_SIMD_INLINE M operator<=(F x, F y) { return {compare<_CMP_LE_OQ>(x.a, y.a), compare<_CMP_LE_OQ>(x.b, y.b)}; }
NPU_LOSS_SIMD_INLINE M operator>(F x, F y) { return {compare<_CMP_GT_OQ>(x.a, y.a), compare<_CMP_GT_OQ>(x.b, y.b)}; }
NPU_LOSS_SIMD_INLINE M operator>=(F x, F y) { return {compare<_CMP_GE_OQ>(x.a, y.a), compare<_CMP_GE_OQ>(x.b, y.b)}; }
NPU_LOSS_SIMD_INLINE M operator==(F x, F y) { return {compare<_CMP_EQ_OQ>(x.a, y.a), compare<_CMP_EQ_OQ>(x.b, y.b)}; }
NPU_LOSS_SIMD_INLINE M is_nan(F x) { return {compare<_CMP_UNORD_Q>(x.a, x.a), compare<_CMP_UNORD_Q>(x.b, x.b)}; }
NPU_LOSS_SIMD_INLINE M operator&(M x, M y) { return {x.a & y.a, x.b & y.b}; }
NPU_LOSS_SIMD_INLINE M operator|(M x, M y) { return {x.a | y.a, x.b | y.b}; }
NPU_LOSS_SIMD_INLINE bool all(M x) { return all1(x.a & x.b); }
NPU_LOSS_SIMD_INLINE F select(M m, F yes, F no) { return {select(m.a, yes.a, no.a), select(m.b, yes.b, no.b)}; }
NPU_LOSS_SIMD_INLINE I select(M m, I yes, I no) { return {select(m.a, yes.a, no.a), select(m.b, yes.b, no.b)}; }
NPU_LOSS_SIMD_INLINE I bits(F x) { return {bits(x.a), bits(x.b)}; }
NPU_LOSS_SIMD_INLINE F from_bits(I x) { return {from_bits(x.a), from_bits(x.b)}; }
NPU_LOSS_SIMD_INLINE I operator+(I x, I y) { return {x.a + y.a, x.b + y.b}; }
NPU_LOSS_SIMD_INLINE I operator-(I x, I y) { return {x.a - y.a, x.b - y.b}; }
NPU_LOSS_SIMD_INLINE I operator&(I x, I y) { return {x.a & y.a, x.b & y.b}; }
template <int N> NPU_LOSS_SIMD_INLINE I shift_right_arith(I x) { return {shift_right_arith<N>(x.a), shift_right_arith<N>(x.b)}; }
template <int N> NPU_LOSS_SIMD_INLINE I shift_right(I x) { return {shift_right<N>(x.a), shift_right<N>(x.b)}; }
template <int N> NPU_LOSS_SIMD_INLINE I shift_left(I x) { return {shift_left<N>(x.a), shift_left<N>(x.b)}; }
NPU_LOSS_SIMD_INLINE F to_float(I x) { return {to_float(x.a), to_float(x.b)}; }
NPU_LOSS_SIMD_INLINE float reduce_add(F x) { return reduce_add(x.a + x.b); }

#else  // the baseline: one lane, plain C++

constexpr int kLanes = 1;
// Branch-free kernels: the compiler can vectorize a loop over one lane only when no lane takes a branch.
constexpr bool kVector = false;
struct F { float v; };
struct I { int32_t v; };
struct M { bool v; };

NPU_LOSS_SIMD_INLINE F splat(float a) { return {a}; }
NPU_LOSS_SIMD_INLINE I splat_i(int32_t a) { return {a}; }
NPU_LOSS_SIMD_INLINE F load(const float* p) { return {*p}; }
NPU_LOSS_SIMD_INLINE void store(float* p, F a) { *p = a.v; }
NPU_LOSS_SIMD_INLINE F load_bf16(const uint16_t* p) { return {bf16_value(*p)}; }
NPU_LOSS_SIMD_INLINE void store_bf16(uint16_t* p, F a) { *p = bf16_of(a.v); }
// float16 <-> float with c10's exact conversions (this translation unit is built for the baseline ISA).
NPU_LOSS_SIMD_INLINE F load_half(const uint16_t* p) { return {c10::detail::fp16_ieee_to_fp32_value(*p)}; }
NPU_LOSS_SIMD_INLINE void store_half(uint16_t* p, F a) { *p = c10::detail::fp16_ieee_from_fp32_value(a.v); }

NPU_LOSS_SIMD_INLINE F operator+(F a, F b) { return {a.v + b.v}; }
NPU_LOSS_SIMD_INLINE F operator-(F a, F b) { return {a.v - b.v}; }
NPU_LOSS_SIMD_INLINE F operator*(F a, F b) { return {a.v * b.v}; }
NPU_LOSS_SIMD_INLINE F operator/(F a, F b) { return {a.v / b.v}; }
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
NPU_LOSS_SIMD_INLINE F fma(F a, F b, F c) { return {__builtin_fmaf(a.v, b.v, c.v)}; }
#else
// No fused multiply-add in the baseline ISA: two roundings (a libm call per term would be far slower).
NPU_LOSS_SIMD_INLINE F fma(F a, F b, F c) { return {a.v * b.v + c.v}; }
#endif
NPU_LOSS_SIMD_INLINE F abs(F a) { return {__builtin_fabsf(a.v)}; }

NPU_LOSS_SIMD_INLINE M operator<(F a, F b) { return {a.v < b.v}; }
NPU_LOSS_SIMD_INLINE M operator<=(F a, F b) { return {a.v <= b.v}; }
NPU_LOSS_SIMD_INLINE M operator>(F a, F b) { return {a.v > b.v}; }
NPU_LOSS_SIMD_INLINE M operator>=(F a, F b) { return {a.v >= b.v}; }
NPU_LOSS_SIMD_INLINE M operator==(F a, F b) { return {a.v == b.v}; }
NPU_LOSS_SIMD_INLINE M is_nan(F a) { return {a.v != a.v}; }
NPU_LOSS_SIMD_INLINE M operator&(M a, M b) { return {a.v && b.v}; }
NPU_LOSS_SIMD_INLINE M operator|(M a, M b) { return {a.v || b.v}; }
NPU_LOSS_SIMD_INLINE bool all(M a) { return a.v; }
NPU_LOSS_SIMD_INLINE F select(M m, F yes, F no) { return {m.v ? yes.v : no.v}; }
NPU_LOSS_SIMD_INLINE I select(M m, I yes, I no) { return {m.v ? yes.v : no.v}; }

NPU_LOSS_SIMD_INLINE I bits(F a) {
  int32_t i;
  std::memcpy(&i, &a.v, sizeof(i));
  return {i};
}
NPU_LOSS_SIMD_INLINE F from_bits(I a) {
  float f;
  std::memcpy(&f, &a.v, sizeof(f));
  return {f};
}
NPU_LOSS_SIMD_INLINE I operator+(I a, I b) {
  return {static_cast<int32_t>(static_cast<uint32_t>(a.v) + static_cast<uint32_t>(b.v))};
}
NPU_LOSS_SIMD_INLINE I operator-(I a, I b) {
  return {static_cast<int32_t>(static_cast<uint32_t>(a.v) - static_cast<uint32_t>(b.v))};
}
NPU_LOSS_SIMD_INLINE I operator&(I a, I b) { return {a.v & b.v}; }
template <int N> NPU_LOSS_SIMD_INLINE I shift_right_arith(I a) { return {a.v >> N}; }
template <int N> NPU_LOSS_SIMD_INLINE I shift_right(I a) {
  return {static_cast<int32_t>(static_cast<uint32_t>(a.v) >> N)};
}
template <int N> NPU_LOSS_SIMD_INLINE I shift_left(I a) {
  return {static_cast<int32_t>(static_cast<uint32_t>(a.v) << N)};
}
NPU_LOSS_SIMD_INLINE F to_float(I a) { return {static_cast<float>(a.v)}; }
NPU_LOSS_SIMD_INLINE float reduce_add(F a) { return a.v; }

#endif

}  // namespace
}  // namespace npu_loss::cpu::NPU_LOSS_ISA
