// Scalar references for the vecmath span kernels (vecmath.h): the in-tree
// oracle the Highway code is tested against (vecmath_test.cc), and the code the
// vector kernels run on a span's tail.
//
// ExpRef/LogRef are Cephes-style polynomials written as separate float
// multiplies and adds (no FMA; ISO C++ mode does not contract), in exactly the
// order the per-target code uses, so every SIMD target gives the same bits as
// these functions for every element-wise result (tier L1). Only reductions
// (sums) differ, by reassociation (tier L2, bounds in vecmath_test.cc).
// ExpRef returns exactly 0 below -87.3 (and for -inf) and exactly 1 at 0;
// LogRef(1) is exactly 0; LogRef is for x > 0 (+inf gives a large finite value).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "lumen/kernels/vecmath.h"

namespace lumen::kernels::ref {

// A product kept apart from the add that follows it. GCC contracts a*b + c
// into an FMA wherever FMA is enabled (the AVX2/AVX-512 target code), even in
// -std=c++20, which would make the result depend on the target; the empty asm
// makes the rounded product a value the compiler must materialize.
template <class T>
inline T Mul(T a, T b) {
  T r = a * b;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm("" : "+x"(r));
#elif defined(__GNUC__) && defined(__aarch64__)
  asm("" : "+w"(r));
#endif
  return r;
}

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();
inline constexpr float kFloatMax = std::numeric_limits<float>::max();

// NaN counts as -inf, +inf as the largest float.
inline float Clean(float x) {
  if (!(x > kNegInf)) return kNegInf;
  return x > kFloatMax ? kFloatMax : x;
}

inline float ExpRef(float x) {
  const bool zero = x < -87.3f;
  x = std::max(x, -87.3f);
  x = std::min(x, 88.0f);
  const float fx = Mul(x, 1.44269504088896341f) + 0.5f;
  const float tf = std::floor(fx);
  x = x - Mul(tf, 0.693359375f);
  x = x + Mul(tf, 2.12194440e-4f);
  const float z = Mul(x, x);
  float y = 1.9875691500e-4f;
  y = Mul(y, x) + 1.3981999507e-3f;
  y = Mul(y, x) + 8.3334519073e-3f;
  y = Mul(y, x) + 4.1665795894e-2f;
  y = Mul(y, x) + 1.6666665459e-1f;
  y = Mul(y, x) + 5.0000001201e-1f;
  y = Mul(y, z) + x + 1.0f;
  const int32_t bits = (static_cast<int32_t>(tf) + 127) << 23;
  float pow2;
  std::memcpy(&pow2, &bits, sizeof(pow2));
  y = Mul(y, pow2);
  return zero ? 0.0f : y;
}

inline float LogRef(float x) {
  int32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  int32_t e = ((bits >> 23) & 0xff) - 126;
  bits = (bits & 0x007fffff) | 0x3f000000;  // mantissa in [0.5, 1)
  float m;
  std::memcpy(&m, &bits, sizeof(m));
  const bool small = m < 0.707106781186547524f;
  if (small) e = e - 1;
  const float ef = static_cast<float>(e);
  m = m + (small ? m : 0.0f) - 1.0f;  // 2m - 1 where small, else m - 1
  const float z = Mul(m, m);
  float y = 7.0376836292e-2f;
  y = Mul(y, m) - 1.1514610310e-1f;
  y = Mul(y, m) + 1.1676998740e-1f;
  y = Mul(y, m) - 1.2420140846e-1f;
  y = Mul(y, m) + 1.4249322787e-1f;
  y = Mul(y, m) - 1.6668057665e-1f;
  y = Mul(y, m) + 2.0000714765e-1f;
  y = Mul(y, m) - 2.4999993993e-1f;
  y = Mul(y, m) + 3.3333331174e-1f;
  y = Mul(Mul(y, m), z);
  y = y + Mul(ef, -2.12194440e-4f);
  y = y - Mul(z, 0.5f);
  return m + y + Mul(ef, 0.693359375f);
}

// HLG score of one log-prob (see HlgSpan).
inline float HlgScoreRef(float l, const HlgSpan& p) {
  const float z = l - p.mu;
  const float u = std::max(std::fabs(z) - p.width, 0.0f);
  const bool shoulder = z > 0.0f;
  const float b = shoulder ? p.shoulder : p.toe;
  const float ib = shoulder ? p.inv_shoulder : p.inv_toe;
  const float mag = Mul(p.m, u - Mul(b, LogRef(1.0f + Mul(u, ib))));
  const float off = shoulder ? 0.0f - mag : mag;
  return l > kNegInf ? Mul(p.m, l) + off : kNegInf;
}

// PCHIP offset at l (already normalized), as sample::Pchip::Offset.
inline double PchipOffsetRef(double l, const PchipSpan& c) {
  const size_t n = c.n_knots;
  if (l < c.x[0]) return c.v_first + Mul(c.low_slope_off, l - c.x[0]);
  if (l > c.x[n - 1]) return c.v_last + Mul(c.high_slope_off, l - c.x[n - 1]);
  size_t k = 0;
  while (k + 2 < n && l >= c.x[k + 1]) ++k;
  const double t = Mul(l - c.x[k], c.inv_h[k]);
  return c.a[k] + Mul(t, c.b[k] + Mul(t, c.c[k] + Mul(t, c.d[k])));
}

inline float PchipScoreRef(float lp, double log_z, const PchipSpan& c) {
  if (!(lp > kNegInf)) return kNegInf;
  const double off = PchipOffsetRef(static_cast<double>(lp) - log_z, c);
  return static_cast<float>(static_cast<double>(lp) + off);
}

// Span references (sequential double sums).
inline float CleanMaxRef(const float* x, size_t n) {
  float m = kNegInf;
  for (size_t i = 0; i < n; ++i) m = std::max(m, Clean(x[i]));
  return m;
}

inline double ExpShiftSumRef(const float* s, size_t n, float shift, float* e) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = ExpRef(s[i] - shift);
    if (e) e[i] = v;
    sum += v;
  }
  return sum;
}

}  // namespace lumen::kernels::ref
