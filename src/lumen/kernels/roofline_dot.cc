// The bf16 and int8 dot-product peaks (roofline.h). Raw intrinsics behind a
// run-time CPU check: Highway has no portable op for either instruction.
#include <chrono>

#include "lumen/kernels/roofline.h"

#include "lumen/kernels/amx_target.h"
#include "lumen/kernels/intrinsics_warnings.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_bf16_amx.h"
#include "lumen/kernels/matmul_q8.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define LUMEN_BF16 __attribute__((target("avx512f,avx512bf16")))
#define LUMEN_VNNI_PEAK __attribute__((target("avx512f,avx512vnni")))
#endif

LUMEN_INTRINSICS_BEGIN

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

#if defined(LUMEN_AMX_X86)
LUMEN_AMX double AmxLoop(double seconds) {
  // bf16 1.0 in A, 2^-23 in B: the sums grow slowly and stay finite.
  alignas(64) uint16_t a[16 * 32], b[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) a[i] = 0x3f80, b[i] = 0x3400;
  AmxConfigureTiles();
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a, 64);
  _tile_loadd(6, b, 64);
  _tile_loadd(7, b, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  constexpr long kTileIters = 1 << 12;
  const auto t0 = std::chrono::steady_clock::now();
  double flops = 0, elapsed = 0;
  do {
    for (long i = 0; i < kTileIters; ++i) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    flops += 4.0 * kTileIters * 16 * 16 * 32 * 2;
    elapsed = Seconds(t0);
  } while (elapsed < seconds);
  alignas(64) float c[16 * 16];
  _tile_stored(0, c, 64);
  AmxReleaseTiles();
  return c[0] < 0 ? 0 : flops / elapsed;  // never negative: consumes the tiles
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

double MeasureAmxBf16Flops(double seconds) {
#if defined(LUMEN_AMX_X86)
  if (AmxBf16Usable()) return AmxLoop(seconds);
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

LUMEN_INTRINSICS_END
