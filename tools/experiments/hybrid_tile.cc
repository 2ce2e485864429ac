// tools/experiments/hybrid_tile.cc: can an AVX2 prefill tile run products on
// the integer multiply port and the FMA port at once? On Zen 2 vpmaddwd (16
// int16 products) issues on one of the two FMA pipes and vfmadd231ps (8 f32
// products) on either, 2 per cycle together (bench BM_IssueRate), so a tile
// mixing one of each per cycle would make 24 products per cycle where the f32
// tile makes 16. Timed here, one core, every operand in L1 / L2:
//   fma 6x16      the exact GEMM's register tile (gemm-inl.h's shape)
//   int16 RxC     vpmaddwd + vpaddd on int16 pairs, R rows x C vectors
//   hybrid RxF+I  R rows, F f32 vectors by FMA, I int16 vectors (a block
//                 epilogue every 32 k: convert, scale, add into Y)
//   hybrid asm    4 rows x (8 f32 + 16 int16 columns) written out by hand,
//                 the weights as memory operands (the only way it fits 16
//                 registers): 28 loads per 8 FMA + 8 vpmaddwd
// performance.md, "Zen 2 a ninth time", has the numbers and the conclusion.
//
//   g++ -O3 -mavx2 -mfma tools/experiments/hybrid_tile.cc -o /tmp/hybrid_tile && /tmp/hybrid_tile
//
// Not part of the build: an experiment that decided against a mixed tile.
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

__attribute__((noinline)) void FmaTile(const float* x, int xs, const float* w, float* y, int K) {
  __m256 a[6][2];
  for (auto& r : a) r[0] = r[1] = _mm256_setzero_ps();
  for (int k = 0; k < K; ++k) {
    const __m256 w0 = _mm256_loadu_ps(w + 16 * k), w1 = _mm256_loadu_ps(w + 16 * k + 8);
    for (int r = 0; r < 6; ++r) {
      const __m256 b = _mm256_broadcast_ss(x + r * xs + k);
      a[r][0] = _mm256_fmadd_ps(b, w0, a[r][0]);
      a[r][1] = _mm256_fmadd_ps(b, w1, a[r][1]);
    }
  }
  for (int r = 0; r < 6; ++r) {
    _mm256_storeu_ps(y + 16 * r, a[r][0]);
    _mm256_storeu_ps(y + 16 * r + 8, a[r][1]);
  }
}

// R rows; CF f32 vectors by FMA per k, CI int16 vectors by vpmaddwd per k
// pair; the int32 sums converted, scaled and added into y every 32 k.
template <int R, int CF, int CI>
__attribute__((noinline)) void Hybrid(const float* x, const int16_t* xi, int xs, const float* wf,
                                      const int16_t* wi, const float* ws, const float* xsc,
                                      float* y, int K) {
  __m256 f[R][CF > 0 ? CF : 1];
  for (auto& r : f)
    for (auto& v : r) v = _mm256_setzero_ps();
  for (int k0 = 0; k0 < K; k0 += 32) {
    __m256i acc[R][CI];
    for (auto& r : acc)
      for (auto& v : r) v = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int k = k0; k < k0 + 32; k += 2) {
      __m256i v[CI];
      for (int c = 0; c < CI; ++c)
        v[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wi + 8 * CI * k + 16 * c));
      for (int r = 0; r < R; ++r) {
        int32_t pair;
        std::memcpy(&pair, xi + r * xs + k, 4);
        const __m256i b = _mm256_set1_epi32(pair);
        for (int c = 0; c < CI; ++c)
          acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(b, v[c]));
      }
      for (int kk = 0; kk < 2; ++kk)
        for (int r = 0; r < R; ++r) {
          const __m256 b = _mm256_broadcast_ss(x + r * xs + k + kk);
          for (int c = 0; c < CF; ++c)
            f[r][c] = _mm256_fmadd_ps(b, _mm256_loadu_ps(wf + 8 * CF * (k + kk) + 8 * c), f[r][c]);
        }
    }
    for (int c = 0; c < CI; ++c) {
      const __m256 s = _mm256_loadu_ps(ws + 8 * CI * (k0 / 32) + 8 * c);
      for (int r = 0; r < R; ++r) {
        float* yp = y + 64 * r + 8 * c;
        const __m256 scale = _mm256_mul_ps(s, _mm256_broadcast_ss(xsc + r * (K / 32) + k0 / 32));
        _mm256_storeu_ps(
            yp, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][c]), scale, _mm256_loadu_ps(yp)));
      }
    }
    asm volatile("" ::: "memory");  // y's tile stays in memory, not in registers
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < CF; ++c) _mm256_storeu_ps(y + 64 * r + 32 + 8 * c, f[r][c]);
}

// One k pair of a 4-row tile, 8 f32 columns and 16 int16 columns, by hand:
// 8 vpmaddwd, 8 vpaddd, 8 FMAs (two per f32 accumulator), 4 dword and 8 f32
// broadcasts, the 16 weight vectors as memory operands. n iterations.
__attribute__((noinline)) void HybridAsm(const float* p, int64_t n) {
#define LUMEN_ROW(r, ia, ib, fa)                                                \
  "vpbroadcastd " #r                                                            \
  "*4+128(%1), %%ymm12\n"                                                       \
  "vpmaddwd (%1), %%ymm12, %%ymm13\n vpaddd %%ymm13, %%" ia ", %%" ia           \
  "\n"                                                                          \
  "vpmaddwd 32(%1), %%ymm12, %%ymm14\n vpaddd %%ymm14, %%" ib ", %%" ib         \
  "\n"                                                                          \
  "vbroadcastss " #r "*8+160(%1), %%ymm15\n vfmadd231ps 64(%1), %%ymm15, %%" fa \
  "\n"                                                                          \
  "vbroadcastss " #r "*8+164(%1), %%ymm15\n vfmadd231ps 96(%1), %%ymm15, %%" fa "\n"
  asm volatile("1:\n" LUMEN_ROW(0, "ymm0", "ymm1", "ymm8") LUMEN_ROW(1, "ymm2", "ymm3", "ymm9")
                   LUMEN_ROW(2, "ymm4", "ymm5", "ymm10")
                       LUMEN_ROW(3, "ymm6", "ymm7", "ymm11") "dec %0\n jnz 1b\n"
               : "+r"(n)
               : "r"(p)
               : "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7", "ymm8", "ymm9",
                 "ymm10", "ymm11", "ymm12", "ymm13", "ymm14", "ymm15", "memory");
#undef LUMEN_ROW
}

template <class F>
double Best(F&& f) {
  double best = 1e30;
  for (int rep = 0; rep < 20; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s < best) best = s;
  }
  return best;
}

}  // namespace

int main() {
  constexpr int K = 2048, kCalls = 64;
  std::vector<float> x(8 * K, 1e-3f), y(1024), w(16 * K, 0.5f), wf(16 * K, 0.25f),
      ws(16 * (K / 32) * 4, 1.0f), xsc(8 * K / 32, 1.0f);
  std::vector<int16_t> xi(8 * K, 3), wi(32 * K, 2);
  const double fma = 6.0 * 16 * K * kCalls / Best([&] {
                       for (int i = 0; i < kCalls; ++i) FmaTile(x.data(), K, w.data(), y.data(), K);
                     }) /
                     1e9;
  std::printf("fma 6x16          %6.2f G products/s\n", fma);
  auto hybrid = [&](const char* name, auto fn, int R, int CF, int CI) {
    const double g =
        R * 8.0 * (CF + CI) * K * kCalls / Best([&] {
          for (int i = 0; i < kCalls; ++i)
            fn(x.data(), xi.data(), K, wf.data(), wi.data(), ws.data(), xsc.data(), y.data(), K);
        }) /
        1e9;
    std::printf("%-17s %6.2f G products/s  %.2fx the fma tile\n", name, g, g / fma);
  };
  hybrid("int16 4x2", Hybrid<4, 0, 2>, 4, 0, 2);
  hybrid("int16 2x4", Hybrid<2, 0, 4>, 2, 0, 4);
  hybrid("hybrid 2x1+2", Hybrid<2, 1, 2>, 2, 1, 2);
  hybrid("hybrid 3x1+2", Hybrid<3, 1, 2>, 3, 1, 2);
  hybrid("hybrid 4x1+2", Hybrid<4, 1, 2>, 4, 1, 2);
  hybrid("hybrid 6x1+1", Hybrid<6, 1, 1>, 6, 1, 1);
  hybrid("hybrid 2x2+4", Hybrid<2, 2, 4>, 2, 2, 4);
  alignas(64) static float buf[256] = {};
  constexpr int64_t kIters = 1 << 22;
  const double s = Best([&] { HybridAsm(buf, kIters); });
  const double g = 192.0 * kIters / s / 1e9;
  std::printf("hybrid asm 4x1+2  %6.2f G products/s  %.2fx the fma tile (%.2f ns per k pair)\n", g,
              g / fma, s / kIters * 1e9);
}
