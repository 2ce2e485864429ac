// tools/experiments/matmul_t_amx.cc: time kernels::MatMulTBf16 (the bf16
// transposed product, the training's backward under --compute bf16) at the
// shapes of a llama-3.2-1b-shaped step, f16 weights, over M, on the tiles
// and (with LUMEN_NO_AMX=1, read once per process) on AVX512-BF16. Behind
// kAmxTMinRows and the kernel table of "With AMX tiles in the backward and
// the head" in docs/experiments/compute-precision.md.
//
//   B=build/dev; g++ -O2 -std=c++20 -Isrc tools/experiments/matmul_t_amx.cc \
//     -o /tmp/matmul_t_amx $B/liblumen_kernels.a $B/liblumen_core.a -lfmt -lhwy -lpthread
//   /tmp/matmul_t_amx; LUMEN_NO_AMX=1 /tmp/matmul_t_amx
//
// Not part of the build: the best of 3 calls after a warm-up, 2 threads.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "lumen/core/thread_pool.h"
#include "lumen/kernels/matmul_bf16_amx.h"
#include "lumen/kernels/matmul_bf16_t.h"
#include "lumen/kernels/test_matrix.h"

using namespace lumen;
using namespace lumen::kernels;

int main() {
  std::mt19937 rng(1);
  ThreadPool pool(2);
  std::printf("tiles: %s\n", AmxBf16Usable() ? "AMX" : AmxBf16Unusable());
  struct Shape {
    const char* what;
    int64_t n, k;
  };
  Spec s;
  s.dtype = DType::kF16;
  for (const Shape& sh :
       {Shape{"W_up/W_gate [8192, 2048]", 8192, 2048}, Shape{"W_down [2048, 8192]", 2048, 8192},
        Shape{"W_q [2048, 2048]", 2048, 2048}}) {
    OwnedMatrix o = Make(s, sh.n, sh.k, rng);
    for (int64_t M : {5, 8, 16, 32, 64, 128, 512}) {
      const std::vector<float> dY = RandomActivations(M, sh.n, rng);
      std::vector<float> dX(M * sh.k, 0.0f);
      MatMulTBf16(o.m, dY.data(), M, dX.data(), true, &pool);
      double best = 1e9;
      for (int r = 0; r < 3; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        MatMulTBf16(o.m, dY.data(), M, dX.data(), true, &pool);
        best = std::min(
            best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::printf("%-26s M %4ld: %8.3f ms  %7.1f GFLOP/s\n", sh.what, long(M), best * 1e3,
                  2.0 * M * sh.n * sh.k / best / 1e9);
    }
  }
}
