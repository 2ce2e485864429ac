// tools/experiments/matmul_gemm.cc: time the exact f32 products on one
// thread, f16 weights, over M and the shapes of a llama-3.2-1b-shaped step,
// as a share of the FMA peak (kernels::MeasureFmaFlops, the figure `lumen
// bench` prints): kernels::MatMul ("fwd": M > 4 is the outer-product GEMM,
// gemm-inl.h) or kernels::MatMulT ("t": dX = dY W). Behind "The f32 route as
// a GEMM" in docs/experiments/compute-precision.md. For an A/B, build it
// against two builds' libraries and run the two binaries alternately.
//
//   B=build/dev; g++ -O2 -std=c++20 -Isrc tools/experiments/matmul_gemm.cc \
//     -o /tmp/matmul_gemm $B/liblumen_kernels.a $B/liblumen_core.a -lfmt -lhwy -lpthread
//   /tmp/matmul_gemm fwd 5; /tmp/matmul_gemm t 5
//
// Not part of the build: the best of `reps` calls after a warm-up.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "lumen/kernels/matmul.h"
#include "lumen/kernels/roofline.h"
#include "lumen/kernels/test_matrix.h"

using namespace lumen;
using namespace lumen::kernels;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "fwd";
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const bool t = mode == "t";
  std::mt19937 rng(1);
  const double peak = MeasureFmaFlops(0.3);
  std::printf("%s, one thread, FMA peak %.1f GFLOP/s\n", t ? "MatMulT" : "MatMul", peak / 1e9);
  struct Shape {
    const char* what;
    int64_t n, k;
  };
  Spec s;
  s.dtype = DType::kF16;
  for (const Shape& sh : {Shape{"[2048, 2048]", 2048, 2048}, Shape{"[8192, 2048]", 8192, 2048},
                          Shape{"[2048, 8192]", 2048, 8192}}) {
    OwnedMatrix o = Make(s, sh.n, sh.k, rng);
    for (int64_t M : {5, 8, 16, 32, 64, 128, 512}) {
      // fwd: X [M, k] -> Y [M, n]; t: dY [M, n] -> dX [M, k].
      const std::vector<float> in = RandomActivations(M, t ? sh.n : sh.k, rng);
      std::vector<float> out(M * (t ? sh.k : sh.n));
      auto run = [&] {
        if (t)
          MatMulT(o.m, in.data(), M, out.data(), nullptr);
        else
          MatMul(o.m, in.data(), M, sh.k, out.data(), sh.n, nullptr);
      };
      run();
      double best = 1e9;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        run();
        best = std::min(
            best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      const double flops = 2.0 * M * sh.n * sh.k / best;
      std::printf("%-13s M %4ld: %9.3f ms %7.1f GFLOP/s %5.1f%%\n", sh.what, long(M), best * 1e3,
                  flops / 1e9, 100 * flops / peak);
    }
  }
}
