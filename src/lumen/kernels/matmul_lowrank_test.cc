// The fused LoRA epilogue (matmul.h: MatMulLowRank, MatMulTLowRank) and the
// unfused order's second pass (AddLowRank) against their double oracles
// (matmul_ref.h) on every compiled SIMD target and every weight storage, for
// M in {1, 3, 5, 9, 37, 300} (the matvec and small-M dot forms, the GEMM
// with row-tile remainders) and rank r in {1, 8, 16} (less than, equal to and
// a multiple of a vector on some target). The bounds are matmul.h's:
//   forward   (K + r + 3) u (sum |w x| + sum |s u b|)
//   backward  (N + r + 3) u (|dx0| + sum |dy w| + |mask| sum |u a|)
// with u = 2^-24; and the thread split changes no bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <hwy/highway.h>
#include <hwy/targets.h>

#include "lumen/core/quant.h"
#include "lumen/kernels/matmul.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_q8.h"
#include "lumen/kernels/matmul_ref.h"
#include "lumen/kernels/test_matrix.h"

namespace lumen::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);

std::vector<float> Random(size_t n, std::mt19937& rng, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> ud(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = ud(rng);
  return v;
}

// W's rows as f32 (what every route decodes).
std::vector<float> Rows(const Matrix& W) {
  std::vector<float> w(W.n * W.k);
  for (int64_t n = 0; n < W.n; ++n) DequantizeMatrixRow(W, n, w.data() + n * W.k);
  return w;
}

// K per storage: whole blocks (three of them where a block is small), and an
// odd K no vector divides for the plain types.
int64_t KFor(const Spec& s) { return s.block == 1 ? 100 : s.block * (s.block >= 256 ? 1 : 3); }

constexpr int64_t kMs[] = {1, 3, 5, 9, 37, 300};
constexpr int64_t kRanks[] = {1, 8, 16};

TEST(MatMulLowRank, EpilogueWithinBoundOnEveryTargetAndStorage) {
  std::mt19937 rng(29);
  ThreadPool pool(3);
  const float scale = 0.75f;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string tname = hwy::TargetName(target);
    for (const Spec& s : AllSpecs()) {
      const int64_t N = 37, K = KFor(s);
      if (s.mlx_bits == 0 && !RowBytes(s.dtype, K)) continue;
      OwnedMatrix o = Make(s, N, K, rng);
      const std::vector<float> w = Rows(o.m);
      for (int64_t M : kMs)
        for (int64_t r : kRanks) {
          if (M == 300 && r != 8) continue;  // the tall GEMM once per storage
          const std::vector<float> X = Random(M * K, rng, -2, 2), U = Random(M * r, rng),
                                   B = Random(N * r, rng);
          const LowRank lr{.u = U.data(), .v = B.data(), .r = r, .scale = scale};
          const int64_t ldy = N + 3;  // a strided Y: the epilogue writes only [M, N)
          std::vector<float> Y(M * ldy, -9.0f), ref(M * N), two(M * N);
          MatMulLowRank(o.m, X.data(), M, K, lr, Y.data(), ldy, nullptr);
          MatMulLowRankRef(o.m, X.data(), M, U.data(), B.data(), r, scale, ref.data());
          // The unfused order: the product, then the rank-r pass.
          MatMul(o.m, X.data(), M, K, two.data(), N, nullptr);
          AddLowRank(two.data(), N, M, N, lr, nullptr);
          int bad = 0;
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              double terms = 0;
              for (int64_t k = 0; k < K; ++k)
                terms += std::fabs(double(w[n * K + k]) * X[m * K + k]);
              for (int64_t j = 0; j < r; ++j)
                terms += std::fabs(scale * U[m * r + j] * B[n * r + j]);
              const double bound = (K + r + 3) * kU * terms + 1e-30;
              const double want = ref[m * N + n];
              for (float got : {Y[m * ldy + n], two[m * N + n]})
                if (!(std::fabs(got - want) <= bound) && bad++ < 3)
                  ADD_FAILURE() << tname << " " << s.name << " M=" << M << " r=" << r << " m=" << m
                                << " n=" << n << " got " << got << " want " << want << " bound "
                                << bound;
            }
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = N; n < ldy; ++n) EXPECT_EQ(Y[m * ldy + n], -9.0f);
          std::vector<float> Yp(M * ldy, -9.0f);
          MatMulLowRank(o.m, X.data(), M, K, lr, Yp.data(), ldy, &pool);
          EXPECT_EQ(0, std::memcmp(Yp.data(), Y.data(), Y.size() * sizeof(float)))
              << tname << " " << s.name << " M=" << M << " r=" << r << ": threads change bits";
        }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The forward epilogue's r terms continue each output's FMA chain (matmul.h),
// so for M > 4 the rows of a call are bit-identical to the same rows in calls
// of other heights, at other places, on 1 and 2 threads: every target and
// storage, K over several k blocks of the GEMM, N over whole and partial
// panels.
TEST(MatMulLowRank, RowsBitIdenticalWhateverTheCallsRowCount) {
  std::mt19937 rng(41);
  ThreadPool pool(2);
  constexpr int64_t kRows = 40, N = 37, r = 8;
  struct Part {
    int64_t off, m;
  };
  constexpr Part kParts[] = {{0, 5}, {2, 7}, {5, 8}, {11, 9}, {3, 17}, {1, 39}};
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string tname = hwy::TargetName(target);
    for (const Spec& s : AllSpecs()) {
      const int64_t K = s.block == 1 ? 448 : s.block * (s.block >= 256 ? 1 : 12);
      if (s.mlx_bits == 0 && !RowBytes(s.dtype, K)) continue;
      OwnedMatrix o = Make(s, N, K, rng);
      const std::vector<float> X = Random(kRows * K, rng, -2, 2), U = Random(kRows * r, rng),
                               B = Random(N * r, rng);
      std::vector<float> all(kRows * N);
      const LowRank lr{.u = U.data(), .v = B.data(), .r = r, .scale = 0.5f};
      MatMulLowRank(o.m, X.data(), kRows, K, lr, all.data(), N, nullptr);
      for (const Part& p : kParts)
        for (ThreadPool* tp : {(ThreadPool*)nullptr, &pool}) {
          const LowRank lp{.u = U.data() + p.off * r, .v = B.data(), .r = r, .scale = 0.5f};
          std::vector<float> part(p.m * N, -1.0f);
          MatMulLowRank(o.m, X.data() + p.off * K, p.m, K, lp, part.data(), N, tp);
          EXPECT_EQ(0, std::memcmp(part.data(), all.data() + p.off * N, part.size() * 4))
              << tname << " " << s.name << " rows [" << p.off << ", " << p.off + p.m << ") of "
              << kRows << (tp ? " 2 threads" : " 1 thread");
        }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(MatMulTLowRank, EpilogueWithinBoundOnEveryTargetAndStorage) {
  std::mt19937 rng(31);
  ThreadPool pool(3);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string tname = hwy::TargetName(target);
    for (const Spec& s : AllSpecs()) {
      // N = 150 spans two panels of 128 rows (the epilogue follows the last).
      const int64_t N = 150, K = KFor(s);
      if (s.mlx_bits == 0 && !RowBytes(s.dtype, K)) continue;
      OwnedMatrix o = Make(s, N, K, rng);
      const std::vector<float> w = Rows(o.m);
      for (int64_t M : kMs)
        for (int64_t r : kRanks)
          for (bool dropout : {false, true}) {
            if (dropout && r != 8) continue;  // the mask's path, once per shape
            const std::vector<float> dY = Random(M * N, rng), U = Random(M * r, rng),
                                     A = Random(r * K, rng), dX0 = Random(M * K, rng);
            std::vector<float> mask;
            if (dropout) {
              mask.resize(M * K);
              for (size_t i = 0; i < mask.size(); ++i) mask[i] = (rng() % 4 == 0) ? 0.0f : 1.25f;
            }
            const LowRank lr{
                .u = U.data(), .v = A.data(), .r = r, .mask = dropout ? mask.data() : nullptr};
            std::vector<float> dX = dX0, ref = dX0;
            MatMulTLowRank(o.m, dY.data(), M, lr, dX.data(), nullptr);
            MatMulTLowRankRef(o.m, dY.data(), M, U.data(), A.data(), r, lr.mask, ref.data());
            int bad = 0;
            for (int64_t m = 0; m < M; ++m)
              for (int64_t k = 0; k < K; ++k) {
                double terms = std::fabs(dX0[m * K + k]), low = 0;
                for (int64_t n = 0; n < N; ++n)
                  terms += std::fabs(double(dY[m * N + n]) * w[n * K + k]);
                for (int64_t j = 0; j < r; ++j)
                  low += std::fabs(double(U[m * r + j]) * A[j * K + k]);
                terms += (dropout ? mask[m * K + k] : 1.0) * low;
                const double bound = (N + r + 3) * kU * terms + 1e-30;
                const float got = dX[m * K + k], want = ref[m * K + k];
                if (!(std::fabs(got - want) <= bound) && bad++ < 3)
                  ADD_FAILURE() << tname << " " << s.name << " M=" << M << " r=" << r
                                << " dropout=" << dropout << " m=" << m << " k=" << k << " got "
                                << got << " want " << want << " bound " << bound;
              }
            std::vector<float> dXp = dX0;
            MatMulTLowRank(o.m, dY.data(), M, lr, dXp.data(), &pool);
            EXPECT_EQ(0, std::memcmp(dXp.data(), dX.data(), dX.size() * sizeof(float)))
                << tname << " " << s.name << " M=" << M << " r=" << r << ": threads change bits";
          }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Routes whose tiles are not the epilogue's (the int8 activation route, the
// bf16 route of W.route = kBf16) add the rank-r term in a second pass: the
// same bits as their MatMul followed by AddLowRank.
TEST(MatMulLowRank, OtherRoutesAddTheTermInASecondPass) {
  std::mt19937 rng(37);
  ThreadPool pool(2);
  Spec s;
  s.name = "q8_0";
  s.dtype = DType::kQ8_0;
  const int64_t N = 40, K = 256, r = 8;
  OwnedMatrix o = Make(s, N, K, rng);
  int routes = 0;
  for (ActRoute route : {ActRoute::kInt8, ActRoute::kBf16}) {
    o.m.route = route;
    const int64_t M = route == ActRoute::kInt8 ? 3 : 9;
    const bool taken = route == ActRoute::kInt8 ? UsesInt8Route(o.m, M) : CpuHasBf16();
    if (!taken) continue;  // this CPU lacks the route: MatMul takes the exact tiles
    ++routes;
    const std::vector<float> X = Random(M * K, rng), U = Random(M * r, rng), B = Random(N * r, rng);
    const LowRank lr{.u = U.data(), .v = B.data(), .r = r, .scale = 0.5f};
    std::vector<float> fused(M * N), two(M * N);
    MatMulLowRank(o.m, X.data(), M, K, lr, fused.data(), N, &pool);
    MatMul(o.m, X.data(), M, K, two.data(), N, &pool);
    AddLowRank(two.data(), N, M, N, lr, nullptr);
    EXPECT_EQ(fused, two) << kActRouteNames[int(route)];
  }
  if (routes == 0) GTEST_SKIP() << "neither the int8 nor the bf16 route runs on this CPU";
}

}  // namespace
}  // namespace lumen::kernels
