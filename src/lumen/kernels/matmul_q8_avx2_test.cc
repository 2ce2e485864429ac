// The AVX2 int8 kernels (matmul_q8_avx2.h) against the scalar oracles of the
// int8 routes (matmul_q8_ref.h), called directly so that they are checked on
// every AVX2 CPU, VNNI ones included (where the routes run the VNNI kernels).
//
// Bounds as for the VNNI kernels (matmul_q8_test.cc, matmul_q8x2_test.cc): each
// block's integer sum is exact, so against the oracle |y - y_ref| <= (K/4 + 8)
// u mag (mag = sum (|a| + |o|) |xq|, the oracle's split of the weights); at two
// levels, against the exact f32 product, each activation is off by at most
// 1.001 d2, which one level (d / 2) would break.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lumen/core/half.h"
#include "lumen/core/quant.h"
#include "lumen/core/repack.h"
#include "lumen/core/thread_pool.h"
#include "lumen/kernels/matmul.h"
#include "lumen/kernels/matmul_q8.h"
#include "lumen/kernels/matmul_q8_avx2.h"
#include "lumen/kernels/matmul_q8_ref.h"
#include "lumen/kernels/matmul_ref.h"
#include "lumen/kernels/test_matrix.h"

namespace lumen::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);

constexpr DType kTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0,
                            DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K,
                            // the column groups the loader makes for these kernels
                            DType::kQ4_0Cols, DType::kQ4_1Cols, DType::kQ5_0Cols, DType::kQ5_1Cols,
                            DType::kQ8_0Cols, DType::kQ4_KCols, DType::kQ5_KCols, DType::kQ6_KCols,
                            DType::kQ2_KCols, DType::kQ3_KCols, DType::kQ5_KPlanes};

#define SKIP_WITHOUT_AVX2() \
  if (!CpuHasAvx2()) GTEST_SKIP() << "no AVX2/FMA/F16C on this CPU: the AVX2 kernels cannot run"

OwnedMatrix MakeRoute(DType t, int64_t N, int64_t K, int levels, std::mt19937& rng) {
  Spec s;
  s.dtype = t;
  OwnedMatrix o = Make(s, N, K, rng);
  o.m.route = levels == 2 ? ActRoute::kInt8x2 : ActRoute::kInt8;
  return o;
}

void RunAvx2(const Matrix& W, const float* X, int64_t M, float* Y, ThreadPool* pool = nullptr) {
  const MatMulOut out{&W, Y, W.n};
  MatMulManyInt8Avx2({&out, 1}, X, M, W.k, pool);
}

// Counts the outputs outside the oracle bound (and, at two levels, the
// exact product's), reporting the first few.
int CheckAgainstOracles(const Matrix& W, const float* X, int64_t M, const std::vector<float>& Y,
                        const std::string& what) {
  const int64_t N = W.n, K = W.k;
  const int levels = Int8Levels(W.route);
  std::vector<float> Yq(M * N), Ye(M * N), w(K);
  std::vector<double> mag;
  MatMulInt8LevelsRef(W, X, M, levels, Yq.data(), &mag);
  MatMulRef(W, X, M, Ye.data());
  int bad = 0;
  const int64_t bound_terms = K / 4 + 8;  // K % 32 == 0: exact
  for (int64_t n = 0; n < N; ++n) {
    DequantizeMatrixRow(W, n, w.data());
    for (int64_t m = 0; m < M; ++m) {
      const double y = Y[m * N + n];
      const double b_ref = double(bound_terms) * kU * mag[m * N + n] + 1e-30;
      bool ok = std::fabs(y - Yq[m * N + n]) <= b_ref;
      if (levels == 2) {
        double b_exact = b_ref, abs_wx = 0;
        for (int64_t b = 0; b < K / kQK; ++b) {
          int8_t q1[kQK], q2[kQK];
          const float d2 = QuantizeBlockQ8x2(X + m * K + b * kQK, q1, q2);
          for (int j = 0; j < kQK; ++j) {
            b_exact += 1.001 * d2 * std::fabs(w[b * kQK + j]);
            abs_wx += std::fabs(double(w[b * kQK + j]) * X[m * K + b * kQK + j]);
          }
        }
        b_exact += (K + 2) * kU * abs_wx;
        ok = ok && std::fabs(y - Ye[m * N + n]) <= b_exact;
      }
      if (!ok && ++bad < 4)
        ADD_FAILURE() << what << " n=" << n << " m=" << m << ": y=" << y
                      << " oracle=" << Yq[m * N + n] << " (bound " << b_ref
                      << ") exact=" << Ye[m * N + n];
    }
  }
  return bad;
}

TEST(MatMulInt8Avx2, MatchesOracleAndExactBound) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 rng(41);
  for (DType t : kTypes)
    for (int64_t K : {32, 96, 256, 1152, 2048, 4864})
      for (int levels : {1, 2})
        for (int64_t M = 1; M <= kInt8MaxRows; ++M) {
          if (K % Info(t).block_elems != 0) continue;
          OwnedMatrix W = MakeRoute(t, 19, K, levels, rng);
          ASSERT_TRUE(Avx2Int8Covers(W.m)) << Name(t);
          const std::vector<float> X = RandomActivations(M, K, rng);
          std::vector<float> Y(M * W.m.n, -7.0f);
          RunAvx2(W.m, X.data(), M, Y.data());
          CheckAgainstOracles(W.m, X.data(), M, Y,
                              std::string(Name(t)) + " K=" + std::to_string(K) +
                                  " levels=" + std::to_string(levels) + " M=" + std::to_string(M));
        }
}

// One thread or two, a row alone or in a batch of up to eight (passes of four
// rows and a remainder), one product or several at once with both level
// counts: the same bits. The second level changes the result.
TEST(MatMulInt8Avx2, ThreadsManyAndBatchesAreBitIdentical) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 rng(43);
  ThreadPool pool(2);
  for (DType t : kTypes) {
    const int64_t K = Info(t).block_elems == kQK ? 352 : 512, N = 67, M = 7;
    OwnedMatrix W = MakeRoute(t, N, K, 2, rng);
    Matrix one_level = W.m;
    one_level.route = ActRoute::kInt8;
    OwnedMatrix Q8 = MakeRoute(DType::kQ8_0, 40, K, 2, rng);
    const std::vector<float> X = RandomActivations(M, K, rng);
    std::vector<float> a(M * N), b(M * N), c(M * N), l1(M * N), q8(M * 40), q8_alone(M * 40);
    RunAvx2(W.m, X.data(), M, a.data());
    RunAvx2(W.m, X.data(), M, b.data(), &pool);
    EXPECT_EQ(a, b) << Name(t);
    for (int64_t m = 0; m < M; ++m) {
      std::vector<float> row(N);
      RunAvx2(W.m, X.data() + m * K, 1, row.data());
      EXPECT_EQ(row, std::vector<float>(a.begin() + m * N, a.begin() + (m + 1) * N))
          << Name(t) << " row " << m;
    }
    const MatMulOut outs[] = {
        {&W.m, c.data(), N}, {&one_level, l1.data(), N}, {&Q8.m, q8.data(), 40}};
    MatMulManyInt8Avx2(outs, X.data(), M, K, &pool);
    EXPECT_EQ(a, c) << Name(t);
    RunAvx2(Q8.m, X.data(), M, q8_alone.data());
    EXPECT_EQ(q8, q8_alone) << Name(t);
    std::vector<float> l1_alone(M * N);
    RunAvx2(one_level, X.data(), M, l1_alone.data());
    EXPECT_EQ(l1, l1_alone) << Name(t);
    EXPECT_NE(a, l1) << Name(t);
  }
}

// The largest products the byte pairs meet: Q8_0 codes -128 and 127, Q6_K
// codes 63 with scales -128 and 127, 5-bit codes 31 and 4-bit codes 15 (and
// their column groups, whose int16 sums run over 8 or 4 records), against
// activations at +-127 of the weights' sign (row 0) and at +127 (row 1): a
// saturated int16 would be off by thousands of steps, far outside the bound.
TEST(MatMulInt8Avx2, ExtremeCodesDoNotSaturate) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 rng(47);
  const int64_t K = 1024 + 256, N = 4, M = 2;  // two column groups and a plain tail
  std::vector<float> X(M * K);
  for (int64_t i = 0; i < K; ++i) X[i] = i % 2 == 0 ? 3.0f : -3.0f;
  for (int64_t i = K; i < M * K; ++i) X[i] = 0.5f;
  for (DType t : {DType::kQ8_0, DType::kQ6_K, DType::kQ5_0, DType::kQ5_K, DType::kQ4_0,
                  DType::kQ8_0Cols, DType::kQ5_0Cols, DType::kQ5_KCols, DType::kQ4_0Cols,
                  DType::kQ4_KCols, DType::kQ6_KCols, DType::kQ5_KPlanes})
    for (int levels : {1, 2}) {
      const DType plain = PlainOf(t);
      OwnedMatrix W = MakeRoute(plain, N, K, levels, rng);
      for (int64_t n = 0; n < N; ++n) {
        auto* row = const_cast<uint8_t*>(W.m.w.row<const uint8_t>(n));
        if (plain == DType::kQ8_0) {
          for (int64_t b = 0; b < K / kQK; ++b)
            for (int j = 0; j < kQK; ++j)  // row 0's sign pattern, times -1 for odd n
              row[b * sizeof(BlockQ8_0) + 2 + j] =
                  static_cast<uint8_t>((j % 2 == 0) == (n % 2 == 0) ? 127 : -128);
        } else if (plain == DType::kQ6_K) {
          for (int64_t sb = 0; sb < K / kQKK; ++sb) {
            uint8_t* blk = row + sb * sizeof(BlockQ6K);
            std::memset(blk, 0xFF, 192);  // every code 63
            for (int s = 0; s < 16; ++s)
              blk[192 + s] = static_cast<uint8_t>(s % 2 == 0 ? -128 : 127);
          }
        } else if (plain == DType::kQ5_0) {
          for (int64_t b = 0; b < K / kQK; ++b)
            std::memset(row + b * sizeof(BlockQ5_0) + 2, 0xFF, 20);  // qh and qs: codes 31
        } else if (plain == DType::kQ4_0) {
          for (int64_t b = 0; b < K / kQK; ++b)
            std::memset(row + b * sizeof(BlockQ4_0) + 2, 0xFF, 16);  // codes 15
        } else if (plain == DType::kQ4_K) {
          for (int64_t sb = 0; sb < K / kQKK; ++sb)
            std::memset(row + sb * sizeof(BlockQ4K) + 16, 0xFF, 128);
        } else {
          for (int64_t sb = 0; sb < K / kQKK; ++sb)
            std::memset(row + sb * sizeof(BlockQ5K) + 16, 0xFF, 160);  // qh and qs
        }
        if (t != plain) RepackColumnGroups(t, row, K);
      }
      W.m.w.dtype = t;
      std::vector<float> Y(M * N);
      RunAvx2(W.m, X.data(), M, Y.data());
      EXPECT_EQ(CheckAgainstOracles(W.m, X.data(), M, Y,
                                    std::string(Name(t)) + " levels=" + std::to_string(levels)),
                0);
    }
}

// W (file order, Y its kernel's output for X) rewritten as runs
// (core/repack.h), as the loader does: the kernel gives the same bits (the
// same sums; only where the transpose happens moves) within the oracle's
// bound by its own reading of runs, and every other reader sees the file's
// values: the rows dequantized and a range of their columns, the exact route's matvec and
// panels and the transposed product (the backward's) bit for bit, and a column
// slice from the second run on.
void ExpectRunsReadAsTheFile(OwnedMatrix& W, const std::vector<float>& X, int64_t M,
                             const std::vector<float>& Y, const std::string& what) {
  const int64_t N = W.m.n, K = W.m.k, run = kMlxRunBytes * 8 / W.m.mlx_bits;
  const ActRoute route = W.m.route;
  std::vector<float> rows(N * K), exact(M * N), exact1(N);
  for (int64_t n = 0; n < N; ++n) DequantizeMatrixRow(W.m, n, rows.data() + n * K);
  W.m.route = ActRoute::kExact;
  MatMul(W.m, X.data(), M, K, exact.data(), N, nullptr);
  MatMul(W.m, X.data(), 1, K, exact1.data(), N, nullptr);
  std::vector<float> dY(M * N), dX(M * K), dX_runs(M * K);  // the backward's product
  for (int64_t i = 0; i < M * N; ++i) dY[i] = X[i % (M * K)];
  MatMulT(W.m, dY.data(), M, dX.data(), nullptr);
  for (int64_t n = 0; n < N; ++n) TransposeMlxRuns(W.m.w.row<uint8_t>(n), K * W.m.mlx_bits / 8);
  W.m.mlx_order = MlxOrder::kRuns;
  if (K >= run) {  // otherwise nothing moved
    std::vector<float> file_order(M * N);
    W.m.mlx_order = MlxOrder::kFile;
    RunAvx2(W.m, X.data(), M, file_order.data());
    W.m.mlx_order = MlxOrder::kRuns;
    EXPECT_NE(file_order, Y) << what << ": the runs not read as runs";
  }
  std::vector<float> got(M * N), got1(N), r(K);
  for (int64_t n = 0; n < N; ++n) {
    DequantizeMatrixRow(W.m, n, r.data());
    EXPECT_EQ(0, std::memcmp(r.data(), rows.data() + n * K, K * sizeof(float)))
        << what << " row " << n;
  }
  MatMul(W.m, X.data(), M, K, got.data(), N, nullptr);
  EXPECT_EQ(exact, got) << what << ": exact panels";
  MatMul(W.m, X.data(), 1, K, got1.data(), N, nullptr);
  EXPECT_EQ(exact1, got1) << what << ": exact matvec";
  MatMulT(W.m, dY.data(), M, dX_runs.data(), nullptr);
  EXPECT_EQ(dX, dX_runs) << what << ": the transposed product";
  const int64_t G = W.m.mlx_group;
  if (K >= 3 * G) {  // columns from inside a run
    DequantizeMatrixColumns(W.m, 0, G, K - G, r.data());
    EXPECT_EQ(0, std::memcmp(r.data(), rows.data() + G, (K - 2 * G) * sizeof(float)))
        << what << ": columns";
  }
  if (K > run) {
    const Matrix s = W.m.ColSlice(run, K);
    DequantizeMatrixRow(s, N - 1, r.data());
    EXPECT_EQ(0, std::memcmp(r.data(), rows.data() + (N - 1) * K + run, (K - run) * sizeof(float)))
        << what << ": a column slice";
  }
  W.m.route = route;
  RunAvx2(W.m, X.data(), M, got.data());
  EXPECT_EQ(Y, got) << what << ": runs";
  EXPECT_EQ(CheckAgainstOracles(W.m, X.data(), M, got, what + " runs"), 0);
}

OwnedMatrix MakeMlx(int bits, int group, DType scale_type, int64_t N, int64_t K, int levels,
                    std::mt19937& rng) {
  Spec s;
  s.mlx_bits = bits;
  s.mlx_group = group;
  s.mlx_scale_type = scale_type;
  OwnedMatrix o = Make(s, N, K, rng);
  o.m.route = levels == 2 ? ActRoute::kInt8x2 : ActRoute::kInt8;
  return o;
}

// MLX affine rows: every bit width, group and scale type within the oracle
// bound (and at two levels the exact product's), with and without blocks
// after the last whole run (4-bit runs of 8 blocks, 8-bit of 4: K = 160, 384
// and 448 leave 1-6, K = 128 is a tail alone for 4-bit; and rows of over
// 1024 groups); a row alone, in a
// batch and on two threads the same bits; 8-bit codes 255 and 0 (bytes that
// would saturate vpmaddubsw's int16 pairs unshifted: 2 x 255 x 127) against
// +-127 activations within the bound.
TEST(MatMulInt8Avx2, MlxRowsWithinBoundBitIdenticalAndUnsaturated) {
  SKIP_WITHOUT_AVX2();
  std::mt19937 rng(59);
  ThreadPool pool(2);
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (DType st : {DType::kF16, DType::kBF16, DType::kF32})
        for (int64_t K : {128, 160, 384, 448, 2048})
          for (int levels : {1, 2}) {
            if (K % group != 0) continue;
            const std::string what = "mlx" + std::to_string(bits) + " g" + std::to_string(group) +
                                     " " + std::string(Name(st)) + " K=" + std::to_string(K) +
                                     " levels=" + std::to_string(levels);
            const int64_t N = 21, M = 6;
            OwnedMatrix W = MakeMlx(bits, group, st, N, K, levels, rng);
            ASSERT_TRUE(Avx2Int8Covers(W.m)) << what;
            const std::vector<float> X = RandomActivations(M, K, rng);
            std::vector<float> Y(M * N), Y2(M * N);
            RunAvx2(W.m, X.data(), M, Y.data());
            EXPECT_EQ(CheckAgainstOracles(W.m, X.data(), M, Y, what), 0);
            RunAvx2(W.m, X.data(), M, Y2.data(), &pool);
            EXPECT_EQ(Y, Y2) << what;
            std::vector<float> row(N);
            RunAvx2(W.m, X.data() + 5 * K, 1, row.data());
            EXPECT_EQ(row, std::vector<float>(Y.begin() + 5 * N, Y.end())) << what;
            ExpectRunsReadAsTheFile(W, X, M, Y, what);
          }
  // Rows of any length: the groups are read a run at a time (the kernels
  // once converted a row's groups into stack arrays of 1024).
  for (int bits : {4, 8}) {
    const int64_t K = 32 * 1025 + 32 * 3, N = 3, M = 2;
    OwnedMatrix W = MakeMlx(bits, 32, DType::kBF16, N, K, 2, rng);
    ASSERT_TRUE(Avx2Int8Covers(W.m));
    const std::vector<float> X = RandomActivations(M, K, rng);
    std::vector<float> Y(M * N);
    RunAvx2(W.m, X.data(), M, Y.data());
    EXPECT_EQ(CheckAgainstOracles(W.m, X.data(), M, Y, "mlx long row"), 0);
  }
  for (int levels : {1, 2}) {
    const int64_t K = 256, N = 2, M = 2;
    OwnedMatrix W = MakeMlx(8, 32, DType::kF16, N, K, levels, rng);
    std::memset(W.m.w.row<uint8_t>(0), 0xFF, K);  // codes 255
    std::memset(W.m.w.row<uint8_t>(1), 0x00, K);  // codes 0
    std::vector<float> X(M * K);
    for (int64_t i = 0; i < K; ++i) {
      X[i] = 1.0f;                           // +127 after quantization
      X[K + i] = i % 2 == 0 ? 1.0f : -1.0f;  // +-127
    }
    std::vector<float> Y(M * N);
    RunAvx2(W.m, X.data(), M, Y.data());
    EXPECT_EQ(CheckAgainstOracles(W.m, X.data(), M, Y, "mlx8 extremes"), 0);
  }
}

// The route selects these kernels exactly where the CPU has AVX2 but no VNNI:
// MatMul on an int8x2 matrix then gives their bits.
TEST(MatMulInt8Avx2, TheRouteRunsThemWithoutVnni) {
  SKIP_WITHOUT_AVX2();
  if (CpuHasVnni()) GTEST_SKIP() << "AVX512-VNNI present: the route runs the VNNI kernels";
  std::mt19937 rng(53);
  for (DType t : kTypes) {
    OwnedMatrix W = MakeRoute(t, 33, 512, 2, rng);
    ASSERT_TRUE(UsesInt8Route(W.m, 3)) << Name(t);
    const std::vector<float> X = RandomActivations(3, 512, rng);
    std::vector<float> a(3 * 33), b(3 * 33);
    MatMul(W.m, X.data(), 3, 512, a.data(), 33, nullptr);
    RunAvx2(W.m, X.data(), 3, b.data());
    EXPECT_EQ(a, b) << Name(t);
  }
  OwnedMatrix W = MakeMlx(4, 64, DType::kBF16, 33, 512, 2, rng);
  ASSERT_TRUE(UsesInt8Route(W.m, 3)) << "mlx4";
  const std::vector<float> X = RandomActivations(3, 512, rng);
  std::vector<float> a(3 * 33), b(3 * 33);
  MatMul(W.m, X.data(), 3, 512, a.data(), 33, nullptr);
  RunAvx2(W.m, X.data(), 3, b.data());
  EXPECT_EQ(a, b) << "mlx4";
}

}  // namespace
}  // namespace lumen::kernels
