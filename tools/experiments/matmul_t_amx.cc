// tools/experiments/matmul_t_amx.cc: time the AMX-BF16 kernels at the shapes
// of a llama-3.2-1b-shaped step (f16 weights), over M.
//
//   kernels: AmxBf16PanelProduct (the prefill / training forward) and
//     AmxBf16TPanelProduct (the transposed product) alone, one thread, on
//     panels built as their drivers build them (Bf16Panels: 512 KiB of weight
//     rows; MatMulTBf16: 16 groups x 1024 rows), so neither decoding nor
//     packing is timed: GFLOP/s and the share of the tiles' peak
//     (MeasureAmxBf16Flops, one thread).
//   calls [threads]: MatMulBf16 and MatMulTBf16 whole (decode, packing; 2
//     threads unless given) and,
//     with LUMEN_NO_AMX=1 (read once per process), on AVX512-BF16.
//
// Behind kAmxTMinRows, "With AMX tiles in the backward and the head" and "AMX
// kernels blocked for the cache" in docs/experiments/compute-precision.md.
//
//   B=build/dev; g++ -O2 -std=c++20 -Isrc tools/experiments/matmul_t_amx.cc \
//     -o /tmp/matmul_t_amx $B/liblumen_kernels.a $B/liblumen_core.a -lfmt -lhwy -lpthread
//   /tmp/matmul_t_amx [kernels|calls [threads]]; LUMEN_NO_AMX=1 /tmp/matmul_t_amx calls
//
// Not part of the build: the best of 3 runs after a warm-up.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/core/thread_pool.h"
#include "lumen/kernels/matmul.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_bf16_amx.h"
#include "lumen/kernels/matmul_bf16_t.h"
#include "lumen/kernels/matmul_bf16_t_amx.h"
#include "lumen/kernels/roofline.h"
#include "lumen/kernels/test_matrix.h"

using namespace lumen;
using namespace lumen::kernels;

namespace {

struct Shape {
  const char* what;
  int64_t n, k;
};
constexpr Shape kShapes[] = {{"[2048, 2048]", 2048, 2048},
                             {"[8192, 2048]", 8192, 2048},
                             {"[2048, 8192]", 2048, 8192},
                             {"[128256, 2048] head", 128256, 2048}};

template <class F>
double Best(int runs, F&& f) {
  f();
  double best = 1e9;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

uint16_t Bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

// One thread, the kernels alone. The forward sweeps N weight rows in panels
// of P rows (Bf16Panels' size; one panel reused: the data are random bf16
// either way); the transposed sweeps K in 256-column blocks of N rows in
// 1024-row pieces (MatMulTBf16's blocking), accumulating.
void Kernels() {
  const double peak = MeasureAmxBf16Flops(0.3);
  std::printf("tile peak (one thread): %.0f GFLOP/s\n", peak / 1e9);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::printf("%-20s %5s  %12s %7s  %12s %7s\n", "shape [N, K]", "M", "fwd GFLOP/s", "% peak",
              "T GFLOP/s", "% peak");
  for (const Shape& s : kShapes) {
    const int64_t ld = s.k;
    const int64_t P = std::clamp<int64_t>((512 * 1024 / (ld * 2)) / 32 * 32, 32, 128);
    AlignedBuffer panel(P * ld * 2);
    for (int64_t i = 0; i < P * ld; ++i) panel.as<uint16_t>()[i] = Bf16(u(rng));
    // Transposed: one 16-group panel of 1024 rows, pieces over N.
    const int64_t tw = std::min<int64_t>(1024, s.n), groups = 16;
    AlignedBuffer tpanel(AmxTPanelElems(groups, tw) * 2);
    for (int64_t i = 0; i < AmxTPanelElems(groups, tw); ++i)
      tpanel.as<uint16_t>()[i] = Bf16(u(rng));
    for (int64_t M : {16, 128, 512}) {
      const int64_t Mr = (M + 15) / 16 * 16;
      AlignedBuffer xb(Mr * ld * 2), xp(AmxPackedXBytes(M, ld));
      for (int64_t i = 0; i < M * ld; ++i) xb.as<uint16_t>()[i] = Bf16(u(rng));
      AmxPackX(xb.as<uint16_t>(), M, ld, xp.as<uint16_t>());
      std::vector<float> Y(M * s.n);
      const int64_t n_fwd = s.n > 16384 ? 16384 : s.n;  // the head: an eighth, same per-panel work
      const double tf = Best(3, [&] {
        for (int64_t n = 0; n < n_fwd; n += P)
          AmxBf16PanelProduct(panel.as<uint16_t>(), std::min(P, n_fwd - n), xp.as<uint16_t>(), M,
                              ld, Y.data(), s.n, n);
      });
      const double gf = 2.0 * M * n_fwd * s.k / tf;
      // dY [Mr, tw] rows for each piece; dX [M, K].
      AlignedBuffer dy(Mr * tw * 2);
      for (int64_t i = 0; i < M * tw; ++i) dy.as<uint16_t>()[i] = Bf16(u(rng));
      std::vector<float> dX(M * s.k);
      const int64_t k_t = std::min<int64_t>(s.k, 2048), n_t = std::min<int64_t>(s.n, 8192);
      const double tt = Best(3, [&] {
        for (int64_t k0 = 0; k0 < k_t; k0 += 256)
          for (int64_t n0 = 0; n0 < n_t; n0 += tw)
            AmxBf16TPanelProduct(dy.as<uint16_t>(), M, tw, tpanel.as<uint16_t>(), 256, dX.data(),
                                 s.k, k0, true);
      });
      const double gt = 2.0 * M * n_t * k_t / tt;
      std::printf("%-20s %5ld  %12.1f %6.1f%%  %12.1f %6.1f%%\n", s.what, long(M), gf / 1e9,
                  100 * gf / peak, gt / 1e9, 100 * gt / peak);
    }
  }
}

// Whole calls on `threads` threads, f16 weights.
void Calls(int threads) {
  std::mt19937 rng(1);
  ThreadPool pool(threads);
  std::printf("tiles: %s\n", AmxBf16Usable() ? "AMX" : AmxBf16Unusable());
  Spec spec;
  spec.dtype = DType::kF16;
  for (const Shape& s : kShapes) {
    if (s.n > 16384) continue;
    OwnedMatrix o = Make(spec, s.n, s.k, rng);
    for (int64_t M : {16, 128, 512}) {
      const std::vector<float> X = RandomActivations(M, s.k, rng);
      const std::vector<float> dY = RandomActivations(M, s.n, rng);
      std::vector<float> Y(M * s.n), dX(M * s.k, 0.0f);
      const double tf = Best(3, [&] { MatMulBf16(o.m, X.data(), M, s.k, Y.data(), s.n, &pool); });
      const double tt = Best(3, [&] { MatMulTBf16(o.m, dY.data(), M, dX.data(), true, &pool); });
      const double fl = 2.0 * M * s.n * s.k;
      std::printf(
          "%-14s M %4ld: MatMulBf16 %8.3f ms %7.1f GFLOP/s  MatMulTBf16 %8.3f ms %7.1f "
          "GFLOP/s\n",
          s.what, long(M), tf * 1e3, fl / tf / 1e9, tt * 1e3, fl / tt / 1e9);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* what = argc > 1 ? argv[1] : "kernels";
  if (std::strcmp(what, "calls") != 0) {
    if (!AmxBf16Usable()) {
      std::printf("no tiles: %s\n", AmxBf16Unusable());
      return 1;
    }
    Kernels();
  }
  if (std::strcmp(what, "kernels") != 0) Calls(argc > 2 ? std::atoi(argv[2]) : 2);
}
