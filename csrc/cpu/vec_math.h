// log and exp for float that the compiler can vectorize: no branches and no libm calls, only arithmetic,
// bit moves and selects (glibc's vector logf/expf are declared only under -ffast-math, which would change
// NaN and inf semantics everywhere). The classic Cephes polynomials: within 2 ulp of the correctly rounded
// result on normal inputs, with IEEE special cases (log: 0 -> -inf, x < 0 -> NaN, +inf -> +inf, NaN ->
// NaN, denormals handled; exp: overflow -> +inf, underflow -> 0, NaN -> NaN). float64 uses std::log/exp.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace npu_loss::cpu {

#define NPU_LOSS_MATH_INLINE inline __attribute__((always_inline))

NPU_LOSS_MATH_INLINE uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

NPU_LOSS_MATH_INLINE float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

NPU_LOSS_MATH_INLINE float vec_log(float x) {
  // Scale denormals into the normal range first (and remember the exponent shift).
  const bool denormal = x < std::numeric_limits<float>::min();
  const float xs = denormal ? x * 8388608.0f : x;  // 2^23
  const uint32_t bits = float_bits(xs);
  int32_t e = static_cast<int32_t>((bits >> 23) & 0xFF) - 126 - (denormal ? 23 : 0);
  // Mantissa in [0.5, 1).
  float m = bits_float((bits & 0x007FFFFFu) | 0x3F000000u);
  const bool small = m < 0.70710678118654752440f;
  e -= small ? 1 : 0;
  m = small ? m + m - 1.0f : m - 1.0f;
  const float fe = static_cast<float>(e);
  const float z = m * m;
  float p = 7.0376836292e-2f;
  p = p * m - 1.1514610310e-1f;
  p = p * m + 1.1676998740e-1f;
  p = p * m - 1.2420140846e-1f;
  p = p * m + 1.4249322787e-1f;
  p = p * m - 1.6668057665e-1f;
  p = p * m + 2.0000714765e-1f;
  p = p * m - 2.4999993993e-1f;
  p = p * m + 3.3333331174e-1f;
  float y = m * z * p;
  y += -2.12194440e-4f * fe;
  y += -0.5f * z;
  float r = m + y;
  r += 0.693359375f * fe;
  r = x == std::numeric_limits<float>::infinity() ? x : r;
  r = x == 0.0f ? -std::numeric_limits<float>::infinity() : r;
  r = (x < 0.0f || x != x) ? std::numeric_limits<float>::quiet_NaN() : r;
  return r;
}

NPU_LOSS_MATH_INLINE float vec_exp(float x) {
  constexpr float kMax = 88.72283935546875f;  // exp overflows float above this
  constexpr float kMin = -103.97208404541015625f;  // and is 0 below this
  const float xc = (x < kMin ? kMin : (x > kMax ? kMax : x));
  // n = round(x / ln 2) by the 1.5 * 2^23 trick (round to nearest even, no libm call); r = x - n ln 2 in
  // two parts for precision.
  constexpr float kRound = 12582912.0f;
  const float n = (xc * 1.44269504088896341f + kRound) - kRound;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  // 2^n as two normal factors: the clamp keeps n in [-150, 128], and the results below 2^-126 round
  // into float's denormals.
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t half = ni >> 1;  // floor(n / 2): both halves stay normal
  const float scale1 = bits_float(static_cast<uint32_t>(half + 127) << 23);
  const float scale2 = bits_float(static_cast<uint32_t>(ni - half + 127) << 23);
  float result = y * scale1 * scale2;
  result = x > kMax ? std::numeric_limits<float>::infinity() : result;
  result = x < kMin ? 0.0f : result;
  result = x != x ? x : result;
  return result;
}

NPU_LOSS_MATH_INLINE double vec_log(double x) {
  return std::log(x);
}

NPU_LOSS_MATH_INLINE double vec_exp(double x) {
  return std::exp(x);
}

}  // namespace npu_loss::cpu
