// The int8x2 route (matmul_q8.h: two int8 levels per activation block)
// against its scalar oracle MatMulInt8x2Ref, and its L2 bound against the
// exact product.
//
// Against the oracle: the same error analysis as the one-level route
// (matmul_q8_test.cc), since each lane's integer sum of w (256 q1 + q2) is
// exact and below 2^24 (so exact as f32 too): |y - y_ref| <= (K/4 + 8) u mag.
// Against the exact f32 product: each activation moves by at most d2 = d / 256
// (d2 / 2 plus roundings of order u d, except where the second level clamps,
// see QuantizeBlockQ8x2), so
//   |y - y_exact| <= sum_b 1.001 d2_b sum_j |w_j|   (+ the f32 slack of both),
// which the one-level route (bound d / 2 per element, 128 times larger) would
// break: the test fails if the second level is lost.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "lumen/core/quant.h"
#include "lumen/core/repack.h"
#include "lumen/core/thread_pool.h"
#include "lumen/kernels/cpu_vendor.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_q8.h"
#include "lumen/kernels/matmul_q8_avx2.h"
#include "lumen/kernels/matmul_q8_ref.h"
#include "lumen/kernels/matmul_ref.h"
#include "lumen/kernels/test_matrix.h"

namespace lumen::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);

struct Case {
  DType t;
  int group = 0;  // MLX (t == kU32): group size
  DType scale_type = DType::kBF16;
  int bits = 4;  // MLX: 4 or 8
};
// Every weight type with an int8 kernel (Int8RouteSupports).
constexpr Case kCases[] = {{DType::kQ4_0},
                           {DType::kQ4_0Cols},
                           {DType::kQ4_1Cols},
                           {DType::kQ5_0Cols},
                           {DType::kQ5_1Cols},
                           {DType::kQ4_KCols},
                           {DType::kQ5_KCols},
                           {DType::kQ8_0Cols},
                           {DType::kQ6_KCols},
                           {DType::kQ2_KCols},
                           {DType::kQ3_KCols},
                           {DType::kQ4_1},
                           {DType::kQ5_0},
                           {DType::kQ5_1},
                           {DType::kQ8_0},
                           {DType::kQ2_K},
                           {DType::kQ3_K},
                           {DType::kQ4_K},
                           {DType::kQ5_K},
                           {DType::kQ6_K},
                           {DType::kU32, 32, DType::kF16},
                           {DType::kU32, 64},
                           {DType::kU32, 128, DType::kF16},
                           {DType::kU32, 64, DType::kF32},
                           {DType::kU32, 32, DType::kBF16, 8},
                           {DType::kU32, 64, DType::kF16, 8},
                           {DType::kU32, 128, DType::kF32, 8}};

std::string CaseName(const Case& c) {
  return c.t == DType::kU32 ? "mlx" + std::to_string(c.bits) + "_g" + std::to_string(c.group)
                            : std::string(Name(c.t));
}

// The K granularity of the route: the block, or for MLX the group and a
// whole 64-element vector.
int64_t BlockOf(const Case& c) {
  return c.t == DType::kU32 ? std::max(c.group, 64) : Info(c.t).block_elems;
}

OwnedMatrix MakeX2(const Case& c, int64_t N, int64_t K, std::mt19937& rng) {
  Spec s;
  if (c.t == DType::kU32) {
    s.mlx_bits = c.bits;
    s.mlx_group = c.group;
    s.mlx_scale_type = c.scale_type;
  } else {
    s.dtype = c.t;
  }
  OwnedMatrix o = Make(s, N, K, rng);
  o.m.route = ActRoute::kInt8x2;
  return o;
}

// These tests cover the VNNI kernels (every storage they run, column groups
// and MLX included); matmul_q8_avx2_test.cc covers the AVX2 kernels that run
// the route on other x86 CPUs.
#define SKIP_WITHOUT_VNNI(W)                                                    \
  if (!CpuHasVnni() || !Int8RouteSupports(W))                                   \
  GTEST_SKIP() << "no AVX512-VNNI on this CPU: the int8x2 route runs the AVX2 " \
                  "kernels (matmul_q8_avx2_test.cc) or the exact route"

TEST(QuantizeBlockQ8x2, KnownValues) {
  float x[kQK] = {};
  x[0] = 63.5f;           // amax: d = 0.5, d2 = 1/512; q1 127, no residual
  x[1] = 0.3f;            // q1 = round(0.6) = 1, r = 0.3 - 0.5 = -0.2: q2 = round(-102.4) = -102
  x[2] = 0.2490234375f;   // 0.498 steps: q1 0, r * 512 = 127.5 -> 128, clamped to 127
  x[3] = -0.0009765625f;  // q1 0, r * 512 = -0.5: ties away from zero, -1
  int8_t q1[kQK], q2[kQK];
  const float d2 = QuantizeBlockQ8x2(x, q1, q2);
  EXPECT_EQ(d2, 0.5f / 256);
  EXPECT_EQ(q1[0], 127);
  EXPECT_EQ(q2[0], 0);
  EXPECT_EQ(q1[1], 1);
  EXPECT_EQ(q2[1], -102);
  EXPECT_EQ(q1[2], 0);
  EXPECT_EQ(q2[2], 127);
  EXPECT_EQ(q1[3], 0);
  EXPECT_EQ(q2[3], -1);
  for (int i = 4; i < kQK; ++i) EXPECT_EQ(q1[i] | q2[i], 0) << i;
  // Level 1 is exactly QuantizeBlockQ8.
  int8_t q[kQK];
  EXPECT_EQ(QuantizeBlockQ8(x, q) / 256, d2);
  EXPECT_EQ(0, std::memcmp(q, q1, kQK));
}

TEST(QuantizeBlocksQ8x2, SameBitsAsTheScalarBlockQuantizerAndWithinHalfAStep) {
  std::mt19937 rng(19);
  constexpr int64_t nb = 48;
  std::vector<float> x = RandomActivations(1, nb * kQK, rng);
  // Block 0: ties of level 1 at every half step; block 1: zeros (d = 0);
  // block 2: a NaN; block 3: an inf; block 4: tiny values; block 5: so small
  // that 256 / d overflows (q2 = 0); block 6: level-2 ties (r * 512 = k + 1/2).
  for (int j = 0; j < kQK; ++j) x[j] = 0.25f * (static_cast<float>(j) - 16.0f + 0.5f);
  x[31] = 31.75f;
  for (int j = 0; j < kQK; ++j) x[kQK + j] = 0.0f;
  x[2 * kQK + 5] = std::nanf("");
  x[3 * kQK + 9] = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < kQK; ++j) x[4 * kQK + j] = 1e-30f * static_cast<float>(j - 16);
  for (int j = 0; j < kQK; ++j) x[5 * kQK + j] = 1e-42f * static_cast<float>(j - 16);
  x[6 * kQK] = 63.5f;  // d = 0.5
  for (int j = 1; j < kQK; ++j) x[6 * kQK + j] = (static_cast<float>(j) + 0.5f) / 512 - 0.03125f;
  std::vector<int8_t> w1(nb * kQK), w2(nb * kQK);
  std::vector<float> want_d2(nb);
  for (int64_t b = 0; b < nb; ++b)
    want_d2[b] = QuantizeBlockQ8x2(x.data() + b * kQK, w1.data() + b * kQK, w2.data() + b * kQK);
  // The dispatcher (AVX-512, AVX2 or scalar, by CPU) and the AVX2 loop itself where it can run.
  using Fn = void (*)(const float*, int64_t, int8_t*, int8_t*, float*);
  std::vector<std::pair<const char*, Fn>> fns = {{"dispatch", QuantizeBlocksQ8x2}};
  if (CpuHasAvx2()) fns.emplace_back("avx2", QuantizeBlocksQ8x2Avx2);
  for (const auto& [name, fn] : fns) {
    std::vector<int8_t> q1(nb * kQK), q2(nb * kQK);
    std::vector<float> d2(nb);
    fn(x.data(), nb, q1.data(), q2.data(), d2.data());
    EXPECT_EQ(q1, w1) << name;
    EXPECT_EQ(q2, w2) << name;
    for (int64_t b = 0; b < nb; ++b)
      EXPECT_EQ(std::bit_cast<uint32_t>(d2[b]), std::bit_cast<uint32_t>(want_d2[b]))
          << name << " block " << b;
    EXPECT_EQ(d2[1], 0.0f) << name;
    for (int j = 0; j < kQK; ++j)
      EXPECT_EQ(q2[5 * kQK + j], 0) << name << " " << j;  // 256 / d overflows
    EXPECT_EQ(q2[2 * kQK + 5], 0) << name;                // the NaN's residual
    // Finite blocks read back within d2 (d2 / 2 but where the clamp acts), and
    // level 2 is used: the mean error is far below level 1's alone.
    double err2 = 0, err1 = 0;
    int n = 0;
    for (int64_t b : {0, 4, 6, 7, 8, 20, 47})
      for (int j = 0; j < kQK; ++j) {
        const int64_t i = b * kQK + j;
        const double back = double(d2[b]) * (256 * q1[i] + q2[i]);
        const double e = std::fabs(back - x[i]);
        EXPECT_LE(e, 1.001 * d2[b]) << name << " block " << b << " element " << j;
        err2 += e;
        err1 += std::fabs(double(d2[b]) * 256 * q1[i] - x[i]);
        ++n;
      }
    EXPECT_LT(err2, err1 / 50) << name << " mean errors " << err2 / n << " vs level 1 " << err1 / n;
  }
}

// The activation layout's vectorized part (gathers, lane scales, offset
// corrections) has the scalar loop's bytes for every format, both level
// counts, full and partial periods (quads then natural blocks, half
// records, MLX rows of 64 x odd).
TEST(MatMulInt8x2, VectorLayoutHasTheScalarBytes) {
  std::mt19937 rng(31);
  for (const Case& c : kCases)
    for (int64_t K : {32, 64, 96, 160, 192, 224, 256, 352, 448, 768, 1152, 2048})
      for (int64_t M : {1, 3}) {
        if (K % BlockOf(c) != 0) continue;
        OwnedMatrix W = MakeX2(c, 3, K, rng);
        SKIP_WITHOUT_VNNI(W.m);
        const std::vector<float> X = RandomActivations(M, K, rng);
        for (ActRoute r : {ActRoute::kInt8x2, ActRoute::kInt8}) {
          Matrix m = W.m;
          m.route = r;
          EXPECT_TRUE(Int8LayoutMatchesScalar(m, X.data(), M))
              << CaseName(c) << " K=" << K << " M=" << M << " levels=" << Int8Levels(r);
        }
      }
}

// Y (M x N, from MatMul of W on X) against the oracle and the exact bound.
void ExpectOracleAndExactBound(const Case& c, const Matrix& W, const std::vector<float>& X,
                               int64_t M, const std::vector<float>& Y) {
  const int64_t K = W.k, N = W.n;
  std::vector<float> Yq(M * N), Ye(M * N);
  std::vector<double> mag;
  MatMulInt8x2Ref(W, X.data(), M, Yq.data(), &mag);
  MatMulRef(W, X.data(), M, Ye.data());
  std::vector<float> w(K);
  int bad = 0;
  for (int64_t n = 0; n < N; ++n) {
    DequantizeMatrixRow(W, n, w.data());
    for (int64_t m = 0; m < M; ++m) {
      const double e_ref = std::fabs(double(Y[m * N + n]) - Yq[m * N + n]);
      const double b_ref = (K / 4 + 8) * kU * mag[m * N + n] + 1e-30;
      double b_exact = 0, abs_wx = 0;
      for (int64_t b = 0; b < K / kQK; ++b) {
        int8_t q1[kQK], q2[kQK];
        const float d2 = QuantizeBlockQ8x2(&X[m * K + b * kQK], q1, q2);
        for (int j = 0; j < kQK; ++j) {
          b_exact += 1.001 * d2 * std::fabs(w[b * kQK + j]);
          abs_wx += std::fabs(double(w[b * kQK + j]) * X[m * K + b * kQK + j]);
        }
      }
      // F16 / BF16: each weight requantized to within amax / 4094 of its unit
      // (matmul_q8x2_gemm.h; a unit below kFloatUnitTiny to zeros), times the
      // (quantized) activation.
      if (c.t == DType::kF16 || c.t == DType::kBF16)
        for (int64_t u = 0; u < K / kQK; ++u) {
          double amax = 0, ax = 0;
          for (int j = 0; j < kQK; ++j) {
            amax = std::max(amax, std::fabs(double(w[u * kQK + j])));
            ax += std::fabs(X[m * K + u * kQK + j]);
          }
          b_exact += amax < kFloatUnitTiny ? amax * ax : 1.001 * amax / (2 * kFloatCodeMax) * ax;
        }
      b_exact += b_ref + (K + 2) * kU * abs_wx;
      const double e_exact = std::fabs(double(Y[m * N + n]) - Ye[m * N + n]);
      if (e_ref > b_ref || e_exact > b_exact) {
        if (++bad < 5)
          ADD_FAILURE() << CaseName(c) << " K=" << K << " M=" << M << " n=" << n << " m=" << m
                        << ": y=" << Y[m * N + n] << " oracle=" << Yq[m * N + n] << " (err "
                        << e_ref << " > " << b_ref << "?) exact=" << Ye[m * N + n] << " (err "
                        << e_exact << " > " << b_exact << "?)";
      }
    }
  }
}

TEST(MatMulInt8x2, MatchesOracleAndExactBound) {
  std::mt19937 rng(23);
  for (const Case& c : kCases)
    for (int64_t K : {32, 96, 160, 192, 224, 256, 1152, 2048, 4160, 4864, 6240})
      for (int64_t M = 1; M <= kInt8MaxRows; ++M) {
        if (K % BlockOf(c) != 0) continue;
        const int64_t N = 21;
        OwnedMatrix W = MakeX2(c, N, K, rng);
        SKIP_WITHOUT_VNNI(W.m);
        ASSERT_TRUE(UsesInt8Route(W.m, M));
        const std::vector<float> X = RandomActivations(M, K, rng);
        std::vector<float> Y(M * N, -7.0f);
        MatMul(W.m, X.data(), M, K, Y.data(), N, nullptr);
        ExpectOracleAndExactBound(c, W.m, X, M, Y);
      }
}

// One thread or two, one product or several at once (mixed formats, and a
// one-level int8 matrix beside the two-level ones): the same bits. Also the
// route's selection: above Int8MaxRows it is the exact route where the GEMM
// does not take the storage, with bf16 prefill (kInt8x2Bf16) it is the same
// decode products, and it differs from the one-level route.
TEST(MatMulInt8x2, ThreadsManyAndSelectionAreBitIdentical) {
  std::mt19937 rng(29);
  ThreadPool pool(2);
  for (const Case& c : kCases)
    for (int64_t M : {1, 2, 5, 8}) {
      const int64_t K = BlockOf(c) == kQK ? 352 : 512, N = 67;  // 352: an odd block count
      OwnedMatrix W = MakeX2(c, N, K, rng);
      SKIP_WITHOUT_VNNI(W.m);
      const std::vector<float> X = RandomActivations(M, K, rng);
      std::vector<float> one(M * N), two(M * N), many(M * N), bf(M * N), i8(M * N);
      MatMul(W.m, X.data(), M, K, one.data(), N, nullptr);
      MatMul(W.m, X.data(), M, K, two.data(), N, &pool);
      EXPECT_EQ(one, two) << CaseName(c) << " M=" << M;

      OwnedMatrix Q8 = MakeX2({DType::kQ8_0}, 40, K, rng);
      Matrix i8_route = W.m;  // the same weights, one level
      i8_route.route = ActRoute::kInt8;
      std::vector<float> y8(M * 40), z8(M * 40);
      MatMul(Q8.m, X.data(), M, K, y8.data(), 40, nullptr);
      const MatMulOut outs[] = {
          {&W.m, many.data(), N}, {&i8_route, i8.data(), N}, {&Q8.m, z8.data(), 40}};
      MatMulMany(outs, X.data(), M, K, &pool);
      EXPECT_EQ(one, many) << CaseName(c) << " M=" << M;
      EXPECT_EQ(y8, z8) << CaseName(c) << " M=" << M;
      std::vector<float> i8_alone(M * N);
      MatMul(i8_route, X.data(), M, K, i8_alone.data(), N, nullptr);
      EXPECT_EQ(i8, i8_alone) << CaseName(c) << " M=" << M;
      EXPECT_NE(one, i8_alone) << CaseName(c) << " M=" << M;  // the second level ran

      Matrix with_bf16 = W.m;
      with_bf16.route = ActRoute::kInt8x2Bf16;
      MatMul(with_bf16, X.data(), M, K, bf.data(), N, nullptr);
      EXPECT_EQ(one, bf) << CaseName(c) << " M=" << M;
    }
  // Above Int8MaxRows the exact route runs where the GEMM does not take the
  // product (F32 weights: Int8x2GemmTakes): bit-identical to kExact. (Every
  // storage with an int8 decode kernel here, MLX included, has the GEMM.)
  OwnedMatrix W = MakeX2({DType::kF32}, 40, 256, rng);
  const int64_t M = Int8MaxRows(W.m) + 1;
  EXPECT_TRUE(Int8x2GemmSupports(MakeX2({DType::kU32, 64}, 40, 256, rng).m));
  EXPECT_FALSE(Int8x2GemmSupports(W.m));
  EXPECT_FALSE(UsesInt8Route(W.m, M));
  const std::vector<float> X = RandomActivations(M, 256, rng);
  std::vector<float> a(M * 40), b(M * 40);
  MatMul(W.m, X.data(), M, 256, a.data(), 40, nullptr);
  Matrix exact = W.m;
  exact.route = ActRoute::kExact;
  MatMul(exact, X.data(), M, 256, b.data(), 40, nullptr);
  EXPECT_EQ(a, b);
}

// Rows wider than one span (matmul_q8.cc, kSpanK = 2048) are summed span by
// span, one activation row spans innermost and several span outermost: a
// row gives the same bits alone as in a batch of any height, with the last
// span holding the row's tail (a pair and a half block, a K-quant's last
// super-block, an MLX row of 64 x odd).
TEST(MatMulInt8x2, ARowGivesTheSameBitsAloneAndInABatchAcrossSpans) {
  std::mt19937 rng(37);
  ThreadPool pool(2);
  for (const Case& c : kCases)
    for (int64_t K : {4160, 4864, 6240}) {
      if (K % BlockOf(c) != 0) continue;
      const int64_t N = 37;
      OwnedMatrix W = MakeX2(c, N, K, rng);
      SKIP_WITHOUT_VNNI(W.m);
      const std::vector<float> X = RandomActivations(kInt8MaxRows, K, rng);
      std::vector<float> alone(kInt8MaxRows * N);
      for (int64_t m = 0; m < kInt8MaxRows; ++m)
        MatMul(W.m, X.data() + m * K, 1, K, alone.data() + m * N, N, nullptr);
      for (int64_t M : {2, 4, 5, 8}) {
        std::vector<float> batch(M * N);
        MatMul(W.m, X.data(), M, K, batch.data(), N, &pool);
        EXPECT_EQ(0, std::memcmp(batch.data(), alone.data(), batch.size() * sizeof(float)))
            << CaseName(c) << " K=" << K << " M=" << M;
      }
    }
}

// Short prompts: up to Int8MaxRows rows (24 to kInt8MaxRowsVnni by storage,
// where the GEMM takes the longer products) stay on the dot kernels, four
// activation rows per pass (Q2_K, Q3_K on Intel CPUs: eight, then the
// rest) over chunks of weight rows sized for L2
// (matmul_q8.cc, kPassBytes; 400 rows of K = 2048 are two chunks or more of
// every storage): within the oracle's bound, each row the bits it has alone,
// on one thread or two. One row more goes to the GEMM, whose bits differ.
TEST(MatMulInt8x2, ShortPromptsStayOnTheDotKernels) {
  std::mt19937 rng(59);
  ThreadPool pool(2);
  for (const Case& c : kCases) {
    const int64_t K = 2048, N = 400;
    OwnedMatrix W = MakeX2(c, N, K, rng);
    SKIP_WITHOUT_VNNI(W.m);
    const int64_t top = Int8MaxRows(W.m);
    ASSERT_TRUE(UsesInt8Route(W.m, top)) << CaseName(c);
    const std::vector<float> X = RandomActivations(top + 1, K, rng);
    for (int64_t M : {top - 3, top}) {  // Q2_K / Q3_K: eight-row calls, then the rest
      std::vector<float> batch(M * N), two(M * N), alone(M * N);
      MatMul(W.m, X.data(), M, K, batch.data(), N, nullptr);
      MatMul(W.m, X.data(), M, K, two.data(), N, &pool);
      for (int64_t m = 0; m < M; ++m)
        MatMul(W.m, X.data() + m * K, 1, K, alone.data() + m * N, N, nullptr);
      EXPECT_EQ(batch, alone) << CaseName(c) << " M=" << M;
      EXPECT_EQ(batch, two) << CaseName(c) << " M=" << M;
      constexpr int64_t kHead = 24;  // the oracle on the first rows (it is slow at this size)
      std::vector<float> head(M * kHead);
      for (int64_t m = 0; m < M; ++m)
        std::copy_n(batch.data() + m * N, kHead, head.data() + m * kHead);
      ExpectOracleAndExactBound(c, W.m.RowSlice(0, kHead), X, M, head);
    }
    ASSERT_TRUE(Int8x2GemmTakes(W.m)) << CaseName(c);
    std::vector<float> batch(top * N), more((top + 1) * N);
    MatMul(W.m, X.data(), top, K, batch.data(), N, nullptr);
    MatMul(W.m, X.data(), top + 1, K, more.data(), N, nullptr);
    EXPECT_FALSE(std::equal(batch.begin(), batch.end(), more.begin()))
        << CaseName(c) << ": the GEMM did not take " << top + 1 << " rows";
  }
}

// Where the bf16 panels take the longer prompts (int8x2+bf16 on a CPU with
// AVX512-BF16), the dot kernels keep up to a per-type row count on AMD CPUs
// (PanelsInt8MaxRows in matmul_q8.cc; measured on Zen 5: 16 for Q2_K, Q3_K,
// Q4_K and Q8_0, 12 for Q4_0, Q4_1, Q5_0, Q5_1 and Q5_K, 32 for MLX) and
// kInt8MaxRows elsewhere: those rows each have the bits they have alone, and
// one row more has the panels' bits (MatMulBf16).
TEST(MatMulInt8x2, PanelCpusKeepShortPromptsOnTheDotKernels) {
  if (!CpuHasVnni() || !CpuHasBf16())
    GTEST_SKIP() << "needs AVX512-VNNI and AVX512-BF16: the bf16 panels beside the dot kernels";
  std::mt19937 rng(61);
  const int64_t K = 512, N = 48;
  struct Want {
    Case c;
    int64_t amd;  // the count on AMD CPUs
  };
  const Want cases[] = {{{DType::kQ2_KCols}, 16},
                        {{DType::kQ3_K}, 16},
                        {{DType::kQ3_KCols}, 16},
                        {{DType::kQ4_KCols}, 16},
                        {{DType::kQ4_K}, 16},
                        {{DType::kQ8_0Cols}, 16},
                        {{DType::kQ8_0}, 16},
                        {{DType::kQ5_KCols}, 12},
                        {{DType::kQ5_1Cols}, 12},
                        {{DType::kQ4_1Cols}, 12},
                        {{DType::kQ5_0}, 12},
                        {{DType::kQ4_0Cols}, 12},
                        {{DType::kQ6_KCols}, kInt8MaxRows},
                        {{DType::kU32, 64}, 32},
                        {{DType::kU32, 32, DType::kF16, 8}, 32}};
  for (const Want& w : cases) {
    const Case& c = w.c;
    OwnedMatrix W = MakeX2(c, N, K, rng);
    W.m.route = ActRoute::kInt8x2Bf16;
    ASSERT_FALSE(Int8x2GemmTakes(W.m)) << CaseName(c);
    const int64_t top = Int8MaxRows(W.m);
    EXPECT_EQ(top, CpuIsAmd() ? w.amd : kInt8MaxRows) << CaseName(c);
    const std::vector<float> X = RandomActivations(top + 1, K, rng);
    std::vector<float> batch(top * N), alone(top * N);
    MatMul(W.m, X.data(), top, K, batch.data(), N, nullptr);
    for (int64_t m = 0; m < top; ++m)
      MatMul(W.m, X.data() + m * K, 1, K, alone.data() + m * N, N, nullptr);
    EXPECT_EQ(batch, alone) << CaseName(c) << " M=" << top;
    std::vector<float> more((top + 1) * N), panels((top + 1) * N);
    MatMul(W.m, X.data(), top + 1, K, more.data(), N, nullptr);
    MatMulBf16(W.m, X.data(), top + 1, K, panels.data(), N, nullptr);
    EXPECT_EQ(more, panels) << CaseName(c) << ": the panels did not take " << top + 1 << " rows";
  }
}

// Rows wider than 64 spans of 2048 take longer spans (BySpans): still the
// same bits alone and in a batch, and within the oracle's bound. Q8_0's
// spans of 17 units are rounded up to whole groups of 8 blocks (18), Q4_0
// column groups' to whole groups of 16 blocks (20).
TEST(MatMulInt8x2, RowsPastSixtyFourSpansTakeLongerSpans) {
  std::mt19937 rng(41);
  const int64_t K = 139264, N = 5, M = 4;  // 68 x 2048
  for (const Case& c :
       {Case{DType::kQ4_0}, Case{DType::kQ4_0Cols}, Case{DType::kQ5_1Cols}, Case{DType::kQ8_0},
        Case{DType::kQ4_K}, Case{DType::kQ4_KCols}, Case{DType::kU32, 64}}) {
    OwnedMatrix W = MakeX2(c, N, K, rng);
    SKIP_WITHOUT_VNNI(W.m);
    const std::vector<float> X = RandomActivations(M, K, rng);
    std::vector<float> batch(M * N), alone(M * N), ref(M * N);
    MatMul(W.m, X.data(), M, K, batch.data(), N, nullptr);
    for (int64_t m = 0; m < M; ++m)
      MatMul(W.m, X.data() + m * K, 1, K, alone.data() + m * N, N, nullptr);
    EXPECT_EQ(batch, alone) << CaseName(c);
    std::vector<double> mag;
    MatMulInt8x2Ref(W.m, X.data(), M, ref.data(), &mag);
    for (int64_t i = 0; i < M * N; ++i)
      EXPECT_LE(std::fabs(double(batch[i]) - ref[i]), (K / 4 + 8) * kU * mag[i] + 1e-30)
          << CaseName(c) << " i=" << i;
  }
}

// One MatMulMany over matrices whose prepared activations differ only in the
// offset group (MLX groups of 32, 64 and 128, Q4_1's per-block sums, Q5_K's
// sub-blocks) gives each product the bits MatMul gives it alone.
TEST(MatMulInt8x2, ManyWithMixedOffsetGroupsMatchesSeparateProducts) {
  std::mt19937 rng(31);
  const int64_t K = 512, M = 3;
  const Case cases[] = {{DType::kU32, 32, DType::kF16},
                        {DType::kU32, 64},
                        {DType::kU32, 128, DType::kF16},
                        {DType::kU32, 32, DType::kF16, 8},
                        {DType::kU32, 128, DType::kF16, 8},
                        {DType::kQ4_1},
                        {DType::kQ5_K},
                        {DType::kQ2_K}};
  std::vector<OwnedMatrix> ws;
  for (const Case& c : cases) ws.push_back(MakeX2(c, 19, K, rng));
  SKIP_WITHOUT_VNNI(ws[0].m);
  const std::vector<float> X = RandomActivations(M, K, rng);
  std::vector<std::vector<float>> alone, many;
  std::vector<MatMulOut> outs;
  for (OwnedMatrix& w : ws) {
    alone.emplace_back(M * 19);
    many.emplace_back(M * 19, -1.0f);
    MatMul(w.m, X.data(), M, K, alone.back().data(), 19, nullptr);
  }
  for (size_t i = 0; i < ws.size(); ++i) outs.push_back({&ws[i].m, many[i].data(), 19});
  ThreadPool pool(2);
  MatMulMany(outs, X.data(), M, K, &pool);
  for (size_t i = 0; i < ws.size(); ++i) EXPECT_EQ(alone[i], many[i]) << CaseName(cases[i]);
}

// The kernels read some weight blocks through the aligned cache lines that
// hold them and others through unaligned loads, by the block's address
// (LoadQuad, matmul_q8_gguf.cc): the same rows copied to every offset within a
// line (contiguous, then with a stride that is not a multiple of 8) give the
// same bits. Column groups are laid out by their address (core/repack.h):
// their rows are unpacked and repacked at the new address.
TEST(MatMulInt8x2, EveryRowAddressGivesTheSameBits) {
  std::mt19937 rng(37);
  for (const Case& c : kCases) {
    if (c.t == DType::kU32) continue;  // MLX rows are read as whole 64-byte vectors
    // Column groups: two groups, a quad, a pair and a half block (legacy),
    // two groups and a super-block (K-quants).
    const bool cols = IsColumnGroups(c.t);
    const int64_t K = cols                ? (BlockOf(c) == kQK ? 1248 : 1280)
                      : BlockOf(c) == kQK ? 352
                                          : 512,
                  N = 9, M = 2;
    OwnedMatrix W = MakeX2(c, N, K, rng);
    SKIP_WITHOUT_VNNI(W.m);
    const std::vector<float> X = RandomActivations(M, K, rng);
    std::vector<float> want(M * N);
    MatMul(W.m, X.data(), M, K, want.data(), N, nullptr);
    const int64_t rb = *RowBytes(c.t, K);
    for (int64_t stride : {rb, rb + 6})
      for (int off = 0; off < 64; ++off) {
        std::vector<uint8_t> buf(N * stride + 128);
        const auto misalign = static_cast<int64_t>(reinterpret_cast<uintptr_t>(buf.data()) % 64);
        uint8_t* base = buf.data() + (64 - misalign) % 64 + off;
        for (int64_t n = 0; n < N; ++n) {
          const uint8_t* from = W.m.w.row<const uint8_t>(n);
          uint8_t* to = base + n * stride;
          std::memcpy(to, from, rb);
          // Q6_K slices, Q2_K records and Q3_K planes do not depend on the
          // address: the copy is the repacked row.
          if (!cols || c.t == DType::kQ6_KCols || c.t == DType::kQ2_KCols ||
              c.t == DType::kQ3_KCols)
            continue;
          const DType plain = PlainOf(c.t);
          const int64_t gb = kColsElems / Info(plain).block_elems * Info(plain).block_bytes;
          for (int64_t g = 0; g < K / kColsElems; ++g)
            UnpackColumnGroup(plain, from + g * gb, to + g * gb);
          RepackColumnGroups(plain, to, K);
        }
        Matrix moved = W.m;
        moved.w = TensorView::Contiguous(base, c.t, {N, K});
        moved.w.stride[0] = stride;
        std::vector<float> got(M * N);
        MatMul(moved, X.data(), M, K, got.data(), N, nullptr);
        ASSERT_EQ(want, got) << CaseName(c) << " offset " << off << " stride " << stride;
      }
  }
}

// The GEMM that takes the int8x2 route's longer products (matmul_q8x2_gemm.h).
#define SKIP_WITHOUT_GEMM(W)                                                          \
  if (!Int8x2GemmSupports(W))                                                         \
  GTEST_SKIP() << "no AVX512-VNNI on this CPU: the int8x2 route's long products are " \
                  "exact (or bf16) here"

// The storages the GEMM reads: every case above (GGUF, and MLX in the
// file's words) and F16 / BF16 (requantized per 32).
std::vector<Case> GemmCases() {
  std::vector<Case> v(std::begin(kCases), std::end(kCases));
  v.push_back({DType::kF16});
  v.push_back({DType::kBF16});
  return v;
}

// Every GGUF storage, as the file has it and as column groups, against the
// oracle (same integer sums, double accumulation) and the exact bound; K
// with odd block counts, a last super-block after the groups, more than one
// k slice; M past one tile and not a multiple of its height; N past one panel
// and not a multiple of its width.
TEST(Int8x2Gemm, MatchesOracleAndExactBound) {
  std::mt19937 rng(41);
  for (const Case& c : GemmCases()) {
    for (int64_t K : {32, 160, 256, 768, 1280, 2080})
      for (int64_t above : {1, 15}) {  // rows past the dot kernels' Int8MaxRows
        if (K % BlockOf(c) != 0) continue;
        const int64_t N = 45;
        OwnedMatrix W = MakeX2(c, N, K, rng);
        SKIP_WITHOUT_GEMM(W.m);
        const int64_t M = Int8MaxRows(W.m) + above;
        ASSERT_TRUE(UsesInt8Route(W.m, M) && Int8x2GemmTakes(W.m)) << CaseName(c);
        const std::vector<float> X = RandomActivations(M, K, rng);
        std::vector<float> Y(M * N, -7.0f);
        MatMul(W.m, X.data(), M, K, Y.data(), N, nullptr);
        ExpectOracleAndExactBound(c, W.m, X, M, Y);
      }
  }
}

// A row's bits do not depend on how many rows its call has (above
// Int8MaxRows), on the threads, or on the products beside it in MatMulMany;
// each output continues its chain across column slices (MatMulAccumulate), so
// slice by slice is the whole product bit for bit.
TEST(Int8x2Gemm, RowsThreadsManyAndSlicesAreBitIdentical) {
  std::mt19937 rng(43);
  ThreadPool pool(2);
  for (const Case& c : GemmCases()) {
    const int64_t K = 1536, N = 70;
    OwnedMatrix W = MakeX2(c, N, K, rng);
    SKIP_WITHOUT_GEMM(W.m);
    const int64_t few = Int8MaxRows(W.m) + 1, M = few + 31;
    const std::vector<float> X = RandomActivations(M, K, rng);
    std::vector<float> one(M * N), two(M * N), part(few * N), many(M * N), other(M * 33);
    MatMul(W.m, X.data(), M, K, one.data(), N, nullptr);
    MatMul(W.m, X.data(), M, K, two.data(), N, &pool);
    EXPECT_EQ(one, two) << CaseName(c);
    MatMul(W.m, X.data(), few, K, part.data(), N, nullptr);
    EXPECT_TRUE(std::equal(part.begin(), part.end(), one.begin())) << CaseName(c);
    OwnedMatrix Q8 = MakeX2({DType::kQ8_0}, 33, K, rng);
    const MatMulOut outs[] = {{&Q8.m, other.data(), 33}, {&W.m, many.data(), N}};
    MatMulMany(outs, X.data(), M, K, &pool);
    EXPECT_EQ(one, many) << CaseName(c);

    const int64_t cut = MatrixSliceAlign(W.m) * (K / MatrixSliceAlign(W.m) / 2);
    const Matrix a = W.m.ColSlice(0, cut), b = W.m.ColSlice(cut, K);
    std::vector<float> sliced(M * N);
    MatMul(a, X.data(), M, K, sliced.data(), N, &pool);
    MatMulAccumulate(b, X.data() + cut, M, K, sliced.data(), N, &pool);
    EXPECT_EQ(one, sliced) << CaseName(c) << " cut " << cut;
  }
}

// F16 / BF16 units at the edges of the requantization: a unit holding an inf
// or a NaN makes its outputs NaN (the exact route's are non-finite too), a
// unit below kFloatUnitTiny counts as zeros, an all-zero unit is zero, and a
// unit whose largest weight dwarfs the rest keeps it within amax / 4094. The
// GEMM and the oracle agree on every output (NaN where the other is).
TEST(Int8x2Gemm, FloatUnitsAtTheEdges) {
  std::mt19937 rng(53);
  const int64_t N = 6, K = 256, M = 12;
  for (DType t : {DType::kF16, DType::kBF16}) {
    std::vector<float> w(N * K);
    std::normal_distribution<float> nd(0.0f, 0.05f);
    for (float& v : w) v = nd(rng);
    w[0 * K + 40] = std::numeric_limits<float>::infinity();   // row 0, unit 1
    w[1 * K + 70] = std::numeric_limits<float>::quiet_NaN();  // row 1, unit 2
    for (int j = 0; j < kQK; ++j) {
      w[2 * K + 96 + j] = t == DType::kBF16 ? 1e-37f * float(j + 1) : 0.0f;  // row 2, unit 3
      w[3 * K + 128 + j] = 0.0f;                                             // row 3, unit 4
    }
    w[4 * K + 160] = 1000.0f;  // row 4, unit 5: one weight dwarfs the rest
    OwnedMatrix W;
    const size_t rb = *RowBytes(t, K);
    W.bytes.assign(N * rb, 0);
    for (int64_t n = 0; n < N; ++n) QuantizeRow(t, &w[n * K], W.bytes.data() + n * rb, K);
    W.m.w = TensorView::Contiguous(W.bytes.data(), t, {N, K});
    W.m.n = N;
    W.m.k = K;
    W.m.route = ActRoute::kInt8x2;
    SKIP_WITHOUT_GEMM(W.m);
    ASSERT_TRUE(UsesInt8Route(W.m, M));
    const std::vector<float> X = RandomActivations(M, K, rng);
    std::vector<float> Y(M * N), Yq(M * N), Ye(M * N);
    MatMul(W.m, X.data(), M, K, Y.data(), N, nullptr);
    MatMulInt8x2Ref(W.m, X.data(), M, Yq.data());
    MatMulRef(W.m, X.data(), M, Ye.data());
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < 2; ++n) {
        const float y = Y[m * N + n], q = Yq[m * N + n], e = Ye[m * N + n];
        EXPECT_TRUE(std::isnan(y) && std::isnan(q) && !std::isfinite(e))
            << Name(t) << " n=" << n << ": " << y << " " << q << " " << e;
      }
    // The finite rows by themselves: a row's outputs do not depend on the
    // rows beside it in its panel.
    const Matrix finite = W.m.RowSlice(2, N);
    std::vector<float> Yf(M * (N - 2));
    MatMul(finite, X.data(), M, K, Yf.data(), N - 2, nullptr);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 2; n < N; ++n)
        EXPECT_EQ(Yf[m * (N - 2) + n - 2], Y[m * N + n]) << Name(t) << " n=" << n;
    ExpectOracleAndExactBound({t}, finite, X, M, Yf);
  }
}

// The requantization of F16 / BF16 rows, sixteen units at a time by
// vectors, against the oracle's arithmetic unit by unit (matmul_q8_ref.h):
// every code and scale bit for bit, over whole sixteens and a remainder, with
// units holding an inf, a -inf, a NaN, zeros, values below kFloatUnitTiny,
// F16 subnormals and F16's largest value.
TEST(Int8x2Gemm, FloatRequantizationMatchesTheScalarLoop) {
  if (!CpuHasVnni()) GTEST_SKIP() << "no AVX512-VNNI on this CPU: the GEMM does not run here";
  std::mt19937 rng(61);
  for (DType t : {DType::kF16, DType::kBF16})
    for (int64_t K : {32, 160, 512, 1184}) {  // 1, 5, 16 and 37 units
      const int64_t units = K / kQK;
      std::vector<float> w(K);
      std::normal_distribution<float> nd(0.0f, 0.05f);
      for (float& v : w) v = nd(rng) * std::exp2(float(rng() % 9) - 4);
      const auto at = [&](int64_t u, int j) -> float& { return w[(u % units) * kQK + j]; };
      if (units > 1) at(1, 7) = std::numeric_limits<float>::infinity();
      if (units > 2) at(2, 31) = -std::numeric_limits<float>::infinity();
      if (units > 3) at(3, 0) = std::numeric_limits<float>::quiet_NaN();
      for (int j = 0; j < kQK; ++j) {
        if (units > 4) at(4, j) = 0.0f;
        if (units > 17) at(17, j) = t == DType::kBF16 ? 3e-31f * float(j - 16) : 0.0f;
        if (units > 18) at(18, j) = 6e-8f * float(j % 5);  // F16 subnormals
      }
      if (units > 20) at(20, 3) = t == DType::kF16 ? 65504.0f : 3e38f;
      if (units > 33) at(33, 9) = std::numeric_limits<float>::quiet_NaN();
      std::vector<uint8_t> row(*RowBytes(t, K));
      QuantizeRow(t, w.data(), row.data(), K);
      std::vector<float> back(K);
      DequantizeRow(t, row.data(), back.data(), K);
      std::vector<int16_t> codes(K, 77);
      std::vector<float> scale(units, 77.0f);
      RequantizeFloatRow(t, row.data(), K, codes.data(), scale.data());
      for (int64_t u = 0; u < units; ++u) {
        float amax = 0;
        bool finite = true;
        for (int j = 0; j < kQK; ++j) {
          finite = finite && std::isfinite(back[u * kQK + j]);
          amax = std::max(amax, std::fabs(back[u * kQK + j]));
        }
        const bool zero = !finite || amax < kFloatUnitTiny;
        const float inv = zero ? 0.0f : kFloatCodeMax / amax;
        const float want = !finite ? std::numeric_limits<float>::quiet_NaN()
                           : zero  ? 0.0f
                                   : amax / kFloatCodeMax;
        if (std::isnan(want))
          EXPECT_TRUE(std::isnan(scale[u])) << Name(t) << " K " << K << " unit " << u;
        else
          EXPECT_EQ(std::bit_cast<uint32_t>(want), std::bit_cast<uint32_t>(scale[u]))
              << Name(t) << " K " << K << " unit " << u << ": " << want << " " << scale[u];
        for (int j = 0; j < kQK; ++j) {
          const int16_t q = zero ? 0 : int16_t(std::nearbyint(back[u * kQK + j] * inv));
          ASSERT_EQ(q, codes[u * kQK + j]) << Name(t) << " K " << K << " unit " << u << " j " << j;
        }
      }
    }
}

// Which route takes a product of more than Int8MaxRows rows: the GEMM for
// int8x2, and for int8x2+bf16 where the CPU has no bf16 route; bf16 where it
// has; the exact panels for one level. The GEMM's results differ from the
// exact route's (the activations were quantized).
TEST(Int8x2Gemm, SelectionByRouteAndCpu) {
  std::mt19937 rng(47);
  OwnedMatrix W = MakeX2({DType::kQ4_0}, 40, 512, rng);
  SKIP_WITHOUT_GEMM(W.m);
  const int64_t M = Int8MaxRows(W.m) + 1;
  EXPECT_TRUE(Int8x2GemmTakes(W.m));
  Matrix with_bf16 = W.m, one_level = W.m, exact = W.m;
  with_bf16.route = ActRoute::kInt8x2Bf16;
  one_level.route = ActRoute::kInt8;
  exact.route = ActRoute::kExact;
  EXPECT_EQ(Int8x2GemmTakes(with_bf16), !CpuHasBf16());
  EXPECT_FALSE(Int8x2GemmTakes(one_level));
  EXPECT_FALSE(UsesInt8Route(one_level, M));
  EXPECT_FALSE(Int8x2GemmTakes(exact));
  const std::vector<float> X = RandomActivations(M, 512, rng);
  std::vector<float> g(M * 40), e(M * 40), o(M * 40);
  MatMul(W.m, X.data(), M, 512, g.data(), 40, nullptr);
  MatMul(exact, X.data(), M, 512, e.data(), 40, nullptr);
  MatMul(one_level, X.data(), M, 512, o.data(), 40, nullptr);
  EXPECT_NE(g, e);
  EXPECT_EQ(o, e);  // one level: the exact panels above Int8MaxRows
}

}  // namespace
}  // namespace lumen::kernels
