// The bf16 and int8 dot-product peaks (roofline.h). Raw intrinsics behind a
// run-time CPU check: Highway has no portable op for either instruction.
#include <chrono>

#include "lumen/kernels/roofline.h"

#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_q8.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define LUMEN_BF16 __attribute__((target("avx512f,avx512bf16")))
#define LUMEN_VNNI_PEAK __attribute__((target("avx512f,avx512vnni")))
#endif

// GCC 12's AVX-512 reduce intrinsics read an _mm512_undefined_* merge source,
// which -W(maybe-)uninitialized reports at every inlined use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace lumen::kernels {
namespace {

constexpr int kChains = 12;  // covers latency x throughput, as in the FMA loop
constexpr long kIters = 1 << 16;

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

#if defined(__x86_64__)
LUMEN_BF16 double Bf16Loop(double seconds) {
  __m512 v[kChains];
  // Distinct starting values keep the chains from being merged (roofline.cc).
  for (int j = 0; j < kChains; ++j) v[j] = _mm512_set1_ps(1.0f + 0.001f * static_cast<float>(j));
  __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);        // bf16 1.0
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3400);  // bf16 2^-23
  const auto t0 = std::chrono::steady_clock::now();
  double flops = 0, elapsed = 0;
  do {
    for (long i = 0; i < kIters; ++i) {
#pragma GCC unroll 12
      for (int j = 0; j < kChains; ++j) v[j] = _mm512_dpbf16_ps(v[j], a, b);
      __asm__ volatile("" : "+v"(a));  // no hoisting of the loop-invariant products
    }
    flops += double(kChains) * kIters * 16 * 4;
    elapsed = Seconds(t0);
  } while (elapsed < seconds);
  float s = 0;
  for (int j = 0; j < kChains; ++j) s += _mm512_reduce_add_ps(v[j]);
  return s < 0 ? 0 : flops / elapsed;  // the sum is never negative: it only consumes v
}

LUMEN_VNNI_PEAK double Int8Loop(double seconds) {
  __m512i v[kChains];
  for (int j = 0; j < kChains; ++j) v[j] = _mm512_set1_epi32(j);
  __m512i a = _mm512_set1_epi8(1);
  const __m512i b = _mm512_set1_epi8(1);
  const auto t0 = std::chrono::steady_clock::now();
  double ops = 0, elapsed = 0;
  do {
    for (long i = 0; i < kIters; ++i) {
#pragma GCC unroll 12
      for (int j = 0; j < kChains; ++j) v[j] = _mm512_dpbusd_epi32(v[j], a, b);
      __asm__ volatile("" : "+v"(a));
    }
    ops += double(kChains) * kIters * 16 * 8;
    elapsed = Seconds(t0);
  } while (elapsed < seconds);
  long long s = 0;
  for (int j = 0; j < kChains; ++j) s += _mm512_reduce_add_epi32(v[j]);
  return s == -1 ? 0 : ops / elapsed;  // never -1 (lanes only grow): consumes v
}
#endif

}  // namespace

double MeasureBf16DotFlops(double seconds) {
#if defined(__x86_64__)
  if (CpuHasBf16()) return Bf16Loop(seconds);
#endif
  (void)seconds;
  return 0;
}

double MeasureInt8DotOps(double seconds) {
#if defined(__x86_64__)
  if (CpuHasVnni()) return Int8Loop(seconds);
#endif
  (void)seconds;
  return 0;
}

}  // namespace lumen::kernels

#pragma GCC diagnostic pop
