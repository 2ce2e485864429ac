// Branch-free float exp/log and the vector loops the sampler's full-vocabulary
// routes run (max, shift, exp, block sums), written with GCC/Clang vector
// extensions so they compile to SSE2 on any x86-64 (and NEON on arm64) without
// Highway, which DESIGN.md keeps inside kernels/.
//
// Contract: ExpF/LogF give the same bits for a value whether it is processed in
// a vector lane or in the scalar tail (the same operations, no FMA contraction
// in ISO C++ mode), so results never depend on a token's position. ExpF
// returns exactly 0 below -87.3 (and for -inf), and exactly 1 at 0; LogF(1) is
// exactly 0. Accuracy: about 2 ulp over the ranges the sampler uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace lumen::sample::fastmath {

typedef float V4 __attribute__((vector_size(16)));
typedef int32_t V4i __attribute__((vector_size(16)));

inline V4 Splat(float x) { return V4{x, x, x, x}; }
inline V4 Load(const float* p) {
  V4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store(float* p, V4 v) { std::memcpy(p, &v, sizeof(v)); }

// Cephes-style expf: n = round(x / ln2), r = x - n ln2 (two-part ln2),
// e^r by a degree-6 polynomial, times 2^n built in the exponent bits.
template <typename F, typename I>
inline F ExpImpl(F x) {
  const F lo = x < F{} - 87.3f ? F{} + 1.0f : F{};  // 1 where the result must be 0
  x = x < F{} - 87.3f ? F{} - 87.3f : x;
  x = x > F{} + 88.0f ? F{} + 88.0f : x;
  F fx = x * 1.44269504088896341f + 0.5f;
  I t = __builtin_convertvector(fx, I);  // toward zero
  F tf = __builtin_convertvector(t, F);
  tf = tf > fx ? tf - 1.0f : tf;  // floor
  t = __builtin_convertvector(tf, I);
  x = x - tf * 0.693359375f;
  x = x + tf * 2.12194440e-4f;
  const F z = x * x;
  F y = F{} + 1.9875691500e-4f;
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * z + x + 1.0f;
  const I bits = (t + 127) << 23;
  F pow2;
  std::memcpy(&pow2, &bits, sizeof(pow2));
  y = y * pow2;
  return lo > F{} ? F{} : y;
}

// Cephes-style logf for x > 0 (x = +inf gives a large finite value; callers
// never pass 0, negatives or NaN).
template <typename F, typename I>
inline F LogImpl(F x) {
  I bits;
  std::memcpy(&bits, &x, sizeof(bits));
  I e = ((bits >> 23) & 0xff) - 126;
  bits = (bits & 0x007fffff) | 0x3f000000;  // mantissa in [0.5, 1)
  F m;
  std::memcpy(&m, &bits, sizeof(m));
  const I small = m < F{} + 0.707106781186547524f;  // -1 (true) or 0
  e = e + small;                                    // e - 1 where small
  F ef = __builtin_convertvector(e, F);
  I mbits;
  std::memcpy(&mbits, &m, sizeof(mbits));
  const I mbits_small = small & mbits;
  F msmall;
  std::memcpy(&msmall, &mbits_small, sizeof(msmall));
  m = m + msmall - 1.0f;  // 2m - 1 where small, else m - 1
  const F z = m * m;
  F y = F{} + 7.0376836292e-2f;
  y = y * m - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  y = y + ef * -2.12194440e-4f;
  y = y - z * 0.5f;
  return m + y + ef * 0.693359375f;
}

// Scalar versions: one-lane vectors through the same code, so bits match.
typedef float V1 __attribute__((vector_size(4)));
typedef int32_t V1i __attribute__((vector_size(4)));
inline float ExpF(float x) { return ExpImpl<V1, V1i>(V1{x})[0]; }
inline float LogF(float x) { return LogImpl<V1, V1i>(V1{x})[0]; }
inline V4 Exp4(V4 x) { return ExpImpl<V4, V4i>(x); }
inline V4 Log4(V4 x) { return LogImpl<V4, V4i>(x); }

}  // namespace lumen::sample::fastmath
