// log and exp on the vector type of simd.h, for the KL kernels. Only arithmetic, bit moves and selects: no
// libm (glibc's vector logf/expf exist only under -ffast-math, which would change NaN and inf handling).
//
// Each has a fast path for the inputs that matter (log: positive normal floats; exp: |x| <= 86, where the
// result is a normal float) and, only when some lane of a vector is outside it, a slow path that also
// handles zero, negatives, denormals, infinities, NaN and the overflow/underflow of exp. On the lanes the
// fast path covers, the slow path computes the same bits, so an element's result never depends on its
// neighbours. Accuracy (tests/test_vec_math.py checks it against float64 over the whole float range):
// within 2 ulp of the correctly rounded result, denormal results included. float64 uses std::log/exp
// (dense_kernels.h).
#pragma once

#include "simd.h"

namespace npu_loss::cpu::NPU_LOSS_ISA {
namespace {

constexpr float kInf = __builtin_inff();
constexpr float kNaN = __builtin_nanf("");
constexpr float kFloatMin = 1.17549435082228750797e-38f;  // the smallest normal float, 2^-126
constexpr float kFloatMax = 3.40282346638528859812e+38f;

// log(x) for positive normal x: x = 2^k * m with m in [sqrt(1/2), sqrt(2)), found by subtracting the bits
// of sqrt(1/2) so that one arithmetic shift gives k; then log(x) = k ln 2 + log1p(f), f = m - 1 in
// [-0.29, 0.41], with Cephes' logf polynomial (ln 2 in two parts so that k ln 2 adds no error).
// The slow path passes the denormals it has scaled by 2^23 with Scaled = true and `scaled` true on their
// lanes, and 23 is subtracted from their k (k - 0 = k exactly on the other lanes, so they get the fast
// path's bits).
template <bool Scaled>
NPU_LOSS_SIMD_INLINE F log_normal(F x, M scaled) {
  const I ix = bits(x);
  const I k = shift_right_arith<23>(ix - splat_i(0x3F3504F3));
  const F f = from_bits(ix - shift_left<23>(k)) - splat(1.0f);
  F e = to_float(k);
  if constexpr (Scaled) e = e - select(scaled, splat(23.0f), splat(0.0f));
  // log1p(f) = f - f^2 / 2 + f^3 P(f), P of degree 8 evaluated by Estrin's scheme (a dependency chain of
  // four multiply-adds instead of eight), and the small terms summed before f.
  const F f2 = f * f;
  const F f4 = f2 * f2;
  const F p01 = fma(splat(-2.4999993993e-1f), f, splat(3.3333331174e-1f));
  const F p23 = fma(splat(-1.6668057665e-1f), f, splat(2.0000714765e-1f));
  const F p45 = fma(splat(-1.2420140846e-1f), f, splat(1.4249322787e-1f));
  const F p67 = fma(splat(-1.1514610310e-1f), f, splat(1.1676998740e-1f));
  const F p03 = fma(p23, f2, p01);
  const F p47 = fma(p67, f2, p45);
  const F p = fma(fma(splat(7.0376836292e-2f), f4, p47), f4, p03);
  const F small = fma(f2, splat(-0.5f), e * splat(-2.12194440e-4f));
  const F r = f + fma(f * f2, p, small);
  return fma(e, splat(0.693359375f), r);
}

// log(x) with IEEE special cases: 0 -> -inf, x < 0 -> NaN, +inf -> +inf, NaN -> NaN, denormals exact to
// 2 ulp. `special` says whether any lane needed the slow path (callers use it to skip their own fix-ups).
// The lanes log's fast path covers: positive normal floats (false on NaN).
NPU_LOSS_SIMD_INLINE M positive_normal(F x) { return (x >= splat(kFloatMin)) & (x <= splat(kFloatMax)); }

NPU_LOSS_SIMD_INLINE F log(F x, bool& special) {
  const M normal = positive_normal(x);
  special = !kVector || !all(normal);
  if (!special) return log_normal<false>(x, M{});
  const M denormal = x < splat(kFloatMin);
  F r = log_normal<true>(select(denormal, x * splat(8388608.0f), x), denormal);  // 2^23
  r = select(x == splat(kInf), splat(kInf), r);
  r = select(x == splat(0.0f), splat(-kInf), r);
  return select((x < splat(0.0f)) | is_nan(x), splat(kNaN), r);
}

NPU_LOSS_SIMD_INLINE F log(F x) {
  bool special;
  return log(x, special);
}

// log of a bfloat16 value (a float whose low 16 bits are zero): 2^k * m with m = (1 + j/128) or half of it, in
// [sqrt(1/2), sqrt(2)) as above, so log(x) = k ln 2 + kLogMantissa[j], j the 7 mantissa bits. The 128 entries
// are log(m) rounded to float (computed in float64): every bfloat16 gets its log within 2 ulp from one lookup
// (four permutes and three blends) and two multiply-adds, in place of the degree-8 polynomial
// (docs/cpu_kernels.md). Where simd.h has no 128-entry lookup it is log itself. Special values and denormals
// take log's slow path, lane by lane: a normal lane's bits never depend on its neighbours.
#ifdef NPU_LOSS_HAVE_LOOKUP128
alignas(64) constexpr float kLogMantissa[128] = {
    0.0f, 0x1.fe02a6p-8f, 0x1.fc0a8cp-7f, 0x1.7b91b0p-6f,
    0x1.f829b0p-6f, 0x1.39e87cp-5f, 0x1.774590p-5f, 0x1.b42dd8p-5f,
    0x1.f0a30cp-5f, 0x1.16536ep-4f, 0x1.341d7ap-4f, 0x1.51b074p-4f,
    0x1.6f0d28p-4f, 0x1.8c345ep-4f, 0x1.a926d4p-4f, 0x1.c5e548p-4f,
    0x1.e27076p-4f, 0x1.fec914p-4f, 0x1.0d77e8p-3f, 0x1.1b72aep-3f,
    0x1.295530p-3f, 0x1.371fc2p-3f, 0x1.44d2b6p-3f, 0x1.526e5ep-3f,
    0x1.5ff308p-3f, 0x1.6d60fep-3f, 0x1.7ab890p-3f, 0x1.87fa06p-3f,
    0x1.9525aap-3f, 0x1.a23bc2p-3f, 0x1.af3c94p-3f, 0x1.bc2868p-3f,
    0x1.c8ff7cp-3f, 0x1.d5c216p-3f, 0x1.e27076p-3f, 0x1.ef0adcp-3f,
    0x1.fb9186p-3f, 0x1.04025ap-2f, 0x1.0a324ep-2f, 0x1.1058c0p-2f,
    0x1.1675cap-2f, 0x1.1c898cp-2f, 0x1.229420p-2f, 0x1.2895a2p-2f,
    0x1.2e8e2cp-2f, 0x1.347ddap-2f, 0x1.3a64c6p-2f, 0x1.404308p-2f,
    0x1.4618bcp-2f, 0x1.4be5fap-2f, 0x1.51aad8p-2f, 0x1.576772p-2f,
    0x1.5d1bdcp-2f, 0x1.62c830p-2f, -0x1.5d5bdep-2f, -0x1.57bf76p-2f,
    -0x1.522ae0p-2f, -0x1.4c9e0ap-2f, -0x1.4718dcp-2f, -0x1.419b42p-2f,
    -0x1.3c2528p-2f, -0x1.36b678p-2f, -0x1.314f1ep-2f, -0x1.2bef08p-2f,
    -0x1.269622p-2f, -0x1.214456p-2f, -0x1.1bf996p-2f, -0x1.16b5ccp-2f,
    -0x1.1178e8p-2f, -0x1.0c42d6p-2f, -0x1.071386p-2f, -0x1.01eae6p-2f,
    -0x1.f991c6p-3f, -0x1.ef5adep-3f, -0x1.e530f0p-3f, -0x1.db13dcp-3f,
    -0x1.d10380p-3f, -0x1.c6ffbcp-3f, -0x1.bd0874p-3f, -0x1.b31d86p-3f,
    -0x1.a93ed4p-3f, -0x1.9f6c40p-3f, -0x1.95a5aep-3f, -0x1.8beafep-3f,
    -0x1.823c16p-3f, -0x1.7898d8p-3f, -0x1.6f0128p-3f, -0x1.6574ecp-3f,
    -0x1.5bf406p-3f, -0x1.527e5ep-3f, -0x1.4913d8p-3f, -0x1.3fb45ap-3f,
    -0x1.365fccp-3f, -0x1.2d1610p-3f, -0x1.23d712p-3f, -0x1.1aa2b8p-3f,
    -0x1.1178e8p-3f, -0x1.08598cp-3f, -0x1.fe8914p-4f, -0x1.ec7398p-4f,
    -0x1.da7276p-4f, -0x1.c88580p-4f, -0x1.b6ac88p-4f, -0x1.a4e764p-4f,
    -0x1.9335e6p-4f, -0x1.8197e2p-4f, -0x1.700d30p-4f, -0x1.5e95a4p-4f,
    -0x1.4d3116p-4f, -0x1.3bdf5ap-4f, -0x1.2aa04ap-4f, -0x1.1973bep-4f,
    -0x1.08598cp-4f, -0x1.eea31cp-5f, -0x1.ccb73cp-5f, -0x1.aaef2ep-5f,
    -0x1.894aa2p-5f, -0x1.67c950p-5f, -0x1.466aeep-5f, -0x1.252f32p-5f,
    -0x1.0415d8p-5f, -0x1.c63d2ep-6f, -0x1.849252p-6f, -0x1.432a92p-6f,
    -0x1.020566p-6f, -0x1.82448ap-7f, -0x1.010158p-7f, -0x1.008056p-8f,
};

NPU_LOSS_SIMD_INLINE F log_bf16(F x, bool& special) {
  const M normal = positive_normal(x);
  const I ix = bits(x);
  const F e = to_float(shift_right_arith<23>(ix - splat_i(0x3F3504F3)));
  const F tab = lookup128(kLogMantissa, shift_right<16>(ix));
  const F r = fma(e, splat(0.693359375f), fma(e, splat(-2.12194440e-4f), tab));
  special = !all(normal);
  if (!special) return r;
  bool unused;
  return select(normal, r, log(x, unused));
}
#else
NPU_LOSS_SIMD_INLINE F log_bf16(F x, bool& special) { return log(x, special); }
#endif

NPU_LOSS_SIMD_INLINE F log_bf16(F x) {
  bool special;
  return log_bf16(x, special);
}

// exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln 2 / 2, ln 2 / 2] (ln 2 in two parts),
// exp(r) by Cephes' expf polynomial. n comes out of the rounding trick's bits: x / ln 2 + 1.5 * 2^23 has
// ulp 1, so its low bits hold n.
NPU_LOSS_SIMD_INLINE F exp(F x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  constexpr float kMax = 88.72283935546875f;  // exp overflows float above this
  constexpr float kMin = -103.97208404541015625f;  // and is 0 below this
  const M fast = abs(x) <= splat(86.0f);  // n in [-125, 125]: 2^n exp(r) is normal (false on NaN)
  const bool special = !kVector || !all(fast);
  // Clamped only on the slow path (it leaves every fast lane unchanged).
  const F xc = special ? select(x < splat(kMin), splat(kMin), select(x > splat(kMax), splat(kMax), x)) : x;
  const F shifted = fma(xc, splat(1.44269504088896341f), splat(kRound));
  const F n = shifted - splat(kRound);
  F r = fma(n, splat(-0.693359375f), xc);
  r = fma(n, splat(2.12194440e-4f), r);
  // exp(r) = 1 + r + r^2 P(r), P of degree 5 by Estrin's scheme.
  const F r2 = r * r;
  const F p01 = fma(splat(1.6666665459e-1f), r, splat(5.0000001201e-1f));
  const F p23 = fma(splat(8.3334519073e-3f), r, splat(4.1665795894e-2f));
  const F p45 = fma(splat(1.9875691500e-4f), r, splat(1.3981999507e-3f));
  const F p = fma(fma(p45, r2, p23), r2, p01);
  const F y = fma(p, r2, r) + splat(1.0f);
  const I ni = bits(shifted) - bits(splat(kRound));
  if (!special) return from_bits(bits(y) + shift_left<23>(ni));
  // 2^n as two normal factors (n in [-150, 128] after the clamp): results below 2^-126 round once, into
  // float's denormals; on the fast lanes both products are exact, so the bits equal the fast path's.
  const I half = shift_right_arith<1>(ni);
  const F scale1 = from_bits(shift_left<23>(half + splat_i(127)));
  const F scale2 = from_bits(shift_left<23>(ni - half + splat_i(127)));
  F result = y * scale1 * scale2;
  result = select(x > splat(kMax), splat(kInf), result);
  result = select(x < splat(kMin), splat(0.0f), result);
  return select(is_nan(x), x, result);
}

// tanh(x): x (1 + x^2 P(x^2)) below 0.625 in magnitude (Cephes' tanhf polynomial, degree 4), else
// 1 - 2 / (exp(2|x|) + 1) with x's sign, |x| clamped to 10 first (tanh rounds to 1 past 9.01, and exp stays
// on its fast path). A vector whose lanes are all small takes the polynomial alone; any other computes both
// and selects per lane, so a lane's bits never depend on its neighbours: +-inf give +-1, NaN gives NaN (exp's
// slow path, for that vector only), -0 gives -0. The logit transform's softcap (jsd_kernel.h), where logits
// over their softcap are mostly small; within 2 ulp like log and exp (tests/test_vec_math.py).
NPU_LOSS_SIMD_INLINE F tanh(F x) {
  const F x2 = x * x;
  const F p01 = fma(splat(-5.70498872745e-3f), x2, splat(2.06390887954e-2f));
  const F p23 = fma(splat(1.33314422036e-1f), x2, splat(-3.33332819422e-1f));
  const F x4 = x2 * x2;
  const F poly = fma(fma(p01, x2, splat(-5.37397155531e-2f)), x4, p23);
  const F small = fma(x2, poly, splat(1.0f)) * x;  // -0 stays -0
  const M is_small = x2 < splat(0.390625f);  // |x| < 0.625 (0.625^2 exactly; false on NaN)
  if (all(is_small)) return small;
  const F ax = abs(x);
  const F e = exp(select(ax > splat(10.0f), splat(20.0f), ax + ax));
  const F big = splat(1.0f) - splat(2.0f) / (e + splat(1.0f));
  const F large = select(x < splat(0.0f), splat(0.0f) - big, big);
  return select(is_small, small, large);
}

}  // namespace
}  // namespace npu_loss::cpu::NPU_LOSS_ISA
