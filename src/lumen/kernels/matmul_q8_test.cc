// The int8-activation route (matmul_q8.h) against its scalar oracle
// MatMulInt8Ref, and its L3 error against the exact product.
//
// Against the oracle: both use the same int8 activations and exact integer
// dots per lane; the fast kernel rounds (weight scale x activation scale) and
// its product with the lane sum, sums the lanes in f32, and sums the K-quant
// offset part separately, so per output (u = 2^-24; mag = sum (|a|+|o|)|xq|,
// see matmul_q8_ref.h)
//   |y - y_ref| <= (K/4 + 8) u mag.
// Against the exact f32 product: rounding each activation to the nearest
// multiple of its block's scale dx moves it by at most dx/2, so
//   |y - y_exact| <= sum_b (dx_b / 2) sum_j |w_j|   (+ the f32 slack of both).
#include "lumen/kernels/matmul_q8.h"

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
#include "lumen/kernels/matmul_q8_avx2.h"
#include "lumen/kernels/matmul_q8_ref.h"
#include "lumen/kernels/matmul_q8x2_gemm.h"
#include "lumen/kernels/matmul_ref.h"
#include "lumen/kernels/test_matrix.h"

namespace lumen::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);

// A matrix of type t (or MLX `bits`-bit with group g when t is kU32), marked
// for the int8 route.
OwnedMatrix MakeInt8(DType t, int64_t N, int64_t K, std::mt19937& rng, int g = 64,
                     DType scale_type = DType::kBF16, int bits = 4) {
  Spec s;
  if (t == DType::kU32) {
    s.mlx_bits = bits;
    s.mlx_group = g;
    s.mlx_scale_type = scale_type;
  } else {
    s.dtype = t;
  }
  OwnedMatrix o = Make(s, N, K, rng);
  o.m.route = ActRoute::kInt8;
  return o;
}

// The dispatcher (the AVX-512, AVX2 or scalar loop, by CPU) and, where the
// CPU has AVX2, the AVX2 loop itself (which VNNI CPUs never dispatch to).
TEST(QuantizeBlocksQ8, SameBitsAsTheScalarBlockQuantizer) {
  std::mt19937 rng(17);
  constexpr int64_t nb = 40;
  std::vector<float> x = RandomActivations(1, nb * kQK, rng);
  // Block 0: exact ties at every half step (amax 127 * 0.25: d = 0.25).
  for (int j = 0; j < kQK; ++j) x[j] = 0.25f * (static_cast<float>(j) - 16.0f + 0.5f);
  x[31] = 31.75f;
  // Block 1: zeros (d = 0); block 2: a NaN; block 3: an inf; block 4: tiny
  // values; block 5: so small that 1 / d overflows.
  for (int j = 0; j < kQK; ++j) x[kQK + j] = 0.0f;
  x[2 * kQK + 5] = std::nanf("");
  x[3 * kQK + 9] = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < kQK; ++j) x[4 * kQK + j] = 1e-30f * static_cast<float>(j - 16);
  for (int j = 0; j < kQK; ++j) x[5 * kQK + j] = 1e-42f * static_cast<float>(j - 16);
  std::vector<int8_t> want(nb * kQK);
  std::vector<float> want_d(nb);
  for (int64_t b = 0; b < nb; ++b)
    want_d[b] = QuantizeBlockQ8(x.data() + b * kQK, want.data() + b * kQK);
  using Fn = void (*)(const float*, int64_t, int8_t*, float*);
  std::vector<std::pair<const char*, Fn>> fns = {{"dispatch", QuantizeBlocksQ8}};
  if (CpuHasAvx2()) fns.emplace_back("avx2", QuantizeBlocksQ8Avx2);
  for (const auto& [name, fn] : fns) {
    std::vector<int8_t> q(nb * kQK);
    std::vector<float> d(nb);
    fn(x.data(), nb, q.data(), d.data());
    EXPECT_EQ(q, want) << name;
    for (int64_t b = 0; b < nb; ++b)
      EXPECT_EQ(std::bit_cast<uint32_t>(d[b]), std::bit_cast<uint32_t>(want_d[b]))
          << name << " block " << b;
    // Ties go away from zero: -15.5 -> -16, -14.5 -> -15, 0.5 -> 1; amax -> 127.
    EXPECT_EQ(d[0], 0.25f) << name;
    EXPECT_EQ(q[0], -16) << name;
    EXPECT_EQ(q[1], -15) << name;
    EXPECT_EQ(q[16], 1) << name;
    EXPECT_EQ(q[31], 127) << name;
  }
}

// These tests cover the VNNI kernels (every storage they run, column groups
// and MLX included); matmul_q8_avx2_test.cc covers the AVX2 kernels that run
// the route on other x86 CPUs.
#define SKIP_WITHOUT_VNNI(W)                                                  \
  if (!CpuHasVnni() || !Int8RouteSupports(W))                                 \
  GTEST_SKIP() << "no AVX512-VNNI on this CPU: the int8 route runs the AVX2 " \
                  "kernels (matmul_q8_avx2_test.cc) or the exact route"

TEST(QuantizeBlockQ8, KnownValues) {
  float x[kQK] = {};
  x[0] = 63.5f;    // amax: scale 0.5 (every value below is exact in binary)
  x[1] = -31.75f;  // -63.5 steps: ties away from zero, -64
  x[2] = 0.25f;    // 0.5 steps: 1
  x[3] = 0.75f;    // 1.5 steps: 2
  int8_t q[kQK];
  float d = QuantizeBlockQ8(x, q);
  EXPECT_EQ(d, 0.5f);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], -64);
  EXPECT_EQ(q[2], 1);
  EXPECT_EQ(q[3], 2);
  for (int i = 4; i < kQK; ++i) EXPECT_EQ(q[i], 0);
  float z[kQK] = {};
  d = QuantizeBlockQ8(z, q);
  EXPECT_EQ(d, 0.0f);
  for (int8_t v : q) EXPECT_EQ(v, 0);
}

TEST(MatMulInt8, MatchesOracleAndExactBound) {
  std::mt19937 rng(7);
  struct Case {
    DType t;
    int group = 0;  // MLX (t == kU32): group size
    DType scale_type = DType::kBF16;
    int bits = 4;  // MLX: 4 or 8
  };
  const Case cases[] = {{DType::kQ4_0},
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
                        {DType::kU32, 128, DType::kF16, 8}};
  for (const Case& c : cases)
    for (int64_t K : {32, 64, 96, 160, 192, 224, 256, 768, 1152, 2048})
      for (int64_t M : {1, 2, 3, 4, 5, 7, 8}) {
        const DType t = c.t;
        // MLX: whole groups and whole 64-element vectors.
        const int64_t block = t == DType::kU32 ? std::max(c.group, 64) : Info(t).block_elems;
        if (K % block != 0) continue;
        const int64_t N = 37;
        OwnedMatrix W = MakeInt8(t, N, K, rng, c.group, c.scale_type, c.bits);
        SKIP_WITHOUT_VNNI(W.m);
        const std::vector<float> X = RandomActivations(M, K, rng);
        std::vector<float> Y(M * N, -7.0f), Yq(M * N), Ye(M * N);
        MatMul(W.m, X.data(), M, K, Y.data(), N, nullptr);
        std::vector<double> mag;
        MatMulInt8Ref(W.m, X.data(), M, Yq.data(), &mag);
        MatMulRef(W.m, X.data(), M, Ye.data());
        std::vector<float> w(K);
        int bad = 0;
        for (int64_t n = 0; n < N; ++n) {
          DequantizeMatrixRow(W.m, n, w.data());
          for (int64_t m = 0; m < M; ++m) {
            const double e_ref = std::fabs(double(Y[m * N + n]) - Yq[m * N + n]);
            const double b_ref = (K / 4 + 8) * kU * mag[m * N + n] + 1e-30;
            // Activation rounding bound, from the oracle's own block scales.
            double b_exact = 0, abs_wx = 0;
            for (int64_t b = 0; b < K / kQK; ++b) {
              int8_t q[kQK];
              const float dx = QuantizeBlockQ8(&X[m * K + b * kQK], q);
              for (int j = 0; j < kQK; ++j) {
                b_exact += 0.5 * dx * std::fabs(w[b * kQK + j]);
                abs_wx += std::fabs(double(w[b * kQK + j]) * X[m * K + b * kQK + j]);
              }
            }
            b_exact += b_ref + (K + 2) * kU * abs_wx;
            const double e_exact = std::fabs(double(Y[m * N + n]) - Ye[m * N + n]);
            if (e_ref > b_ref || e_exact > b_exact) {
              if (++bad < 5)
                ADD_FAILURE() << (t == DType::kU32 ? "mlx" + std::to_string(c.bits) + "_g" +
                                                         std::to_string(c.group)
                                                   : std::string(Name(t)))
                              << " K=" << K << " M=" << M << " n=" << n << " m=" << m
                              << ": y=" << Y[m * N + n] << " oracle=" << Yq[m * N + n] << " (err "
                              << e_ref << " > " << b_ref << "?) exact=" << Ye[m * N + n] << " (err "
                              << e_exact << " > " << b_exact << "?)";
            }
          }
        }
      }
}

TEST(MatMulInt8, RouteSelection) {
  std::mt19937 rng(11);
  OwnedMatrix W = MakeInt8(DType::kQ4_0, 40, 256, rng);
  if (!Int8RouteSupports(W.m)) GTEST_SKIP() << "no AVX2 and no AVX512-VNNI: no int8 kernel runs";
  // One level: 8 rows with the VNNI kernels (no GEMM takes one level), 32 for
  // Q4_0 with the AVX2 ones (no bf16 route there).
  EXPECT_EQ(Int8MaxRows(W.m), CpuHasVnni() ? kInt8MaxRows : kInt8MaxRowsAvx2);
  const int64_t M = Int8MaxRows(W.m) + 1, N = 40, K = 256;
  const std::vector<float> X = RandomActivations(M, K, rng);
  // Above Int8MaxRows rows the exact route runs: bit-identical to kExact.
  std::vector<float> a(M * N), b(M * N);
  MatMul(W.m, X.data(), M, K, a.data(), N, nullptr);
  Matrix exact = W.m;
  exact.route = ActRoute::kExact;
  MatMul(exact, X.data(), M, K, b.data(), N, nullptr);
  EXPECT_EQ(a, b);
  // At M = 1 the routes differ (activation rounding), and MatMul is MatMulInt8.
  std::vector<float> c(N), d(N), e(N);
  MatMul(W.m, X.data(), 1, K, c.data(), N, nullptr);
  MatMul(exact, X.data(), 1, K, d.data(), N, nullptr);
  MatMulInt8(W.m, X.data(), 1, K, e.data(), N, nullptr);
  EXPECT_NE(c, d);
  EXPECT_EQ(c, e);
  // At Int8MaxRows rows too (each row as it would be alone).
  const int64_t top = Int8MaxRows(W.m);
  std::vector<float> f(top * N), g(top * N);
  MatMul(W.m, X.data(), top, K, f.data(), N, nullptr);
  MatMulInt8(W.m, X.data(), top, K, g.data(), N, nullptr);
  EXPECT_EQ(f, g);
  EXPECT_TRUE(std::equal(c.begin(), c.end(), f.begin()));
  // Types without an int8 kernel ignore the mark: float weights, and for the
  // VNNI kernels MLX rows that are not whole 64-element vectors (groups of
  // 32, K = 96; the AVX2 kernels take any whole 32-element blocks).
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    OwnedMatrix F = MakeInt8(t, 8, 256, rng);
    EXPECT_FALSE(Int8RouteSupports(F.m)) << Name(t);
    EXPECT_FALSE(UsesInt8Route(F.m, 1)) << Name(t);
  }
  const bool odd_mlx = !CpuHasVnni() && CpuHasAvx2();
  EXPECT_EQ(Int8RouteSupports(MakeInt8(DType::kU32, 8, 96, rng, 32).m), odd_mlx);
  EXPECT_EQ(Int8RouteSupports(MakeInt8(DType::kU32, 8, 96, rng, 32, DType::kF16, 8).m), odd_mlx);
  // With VNNI or AVX2 every quantized type the engine loads has one (on AVX2
  // CPUs the GGUF types as stored, their column groups and MLX).
  for (DType t :
       {DType::kQ4_0,     DType::kQ4_1,     DType::kQ5_0,     DType::kQ5_1,     DType::kQ8_0,
        DType::kQ2_K,     DType::kQ3_K,     DType::kQ4_K,     DType::kQ5_K,     DType::kQ6_K,
        DType::kQ4_0Cols, DType::kQ4_1Cols, DType::kQ5_0Cols, DType::kQ5_1Cols, DType::kQ4_KCols,
        DType::kQ5_KCols, DType::kQ8_0Cols, DType::kQ6_KCols, DType::kQ2_KCols, DType::kQ3_KCols})
    EXPECT_TRUE(Int8RouteSupports(MakeInt8(t, 8, 256, rng).m)) << Name(t);
  for (int bits : {4, 8})
    for (int g : {32, 64, 128})
      EXPECT_EQ(Int8RouteSupports(MakeInt8(DType::kU32, 8, 256, rng, g, DType::kF16, bits).m),
                CpuHasVnni() || CpuHasAvx2())
          << "mlx" << bits << "_g" << g;
}

TEST(MatMulInt8, ManyAndThreadsAreBitIdentical) {
  std::mt19937 rng(13);
  const int64_t K = 320, M = 3;
  OwnedMatrix q4 = MakeInt8(DType::kQ4_0, 70, K, rng), q8 = MakeInt8(DType::kQ8_0, 50, K, rng),
              f16 = MakeInt8(DType::kF16, 30, K, rng);
  // K-quants need K % 256 == 0: a second X for them below.
  SKIP_WITHOUT_VNNI(q4.m);
  const std::vector<float> X = RandomActivations(M, K, rng);
  ThreadPool pool(3);
  std::vector<float> y4(M * 70), y8(M * 50), y16(M * 30);
  MatMul(q4.m, X.data(), M, K, y4.data(), 70, nullptr);
  MatMul(q8.m, X.data(), M, K, y8.data(), 50, nullptr);
  MatMul(f16.m, X.data(), M, K, y16.data(), 30, nullptr);
  std::vector<float> z4(M * 70), z8(M * 50), z16(M * 30);
  const MatMulOut outs[] = {
      {&q4.m, z4.data(), 70}, {&f16.m, z16.data(), 30}, {&q8.m, z8.data(), 50}};
  MatMulMany(outs, X.data(), M, K, &pool);
  EXPECT_EQ(y4, z4);
  EXPECT_EQ(y8, z8);
  EXPECT_EQ(y16, z16);
}

// MLX 4- and 8-bit codes rewritten as groups (core/repack.h), as the loader
// does on this CPU (Int8MlxOrder). The int8x2 dot kernels (1-8 rows, one
// thread and three): 4-bit gives the bits it gives on the file's order (the
// same column vectors, loaded instead of gathered); 8-bit sums a group's
// lanes by block, not by twin as in the file's order, so it is held to the
// oracle's bound, with the same bits for a row whatever the rows beside it
// and the threads. The GEMM (48 rows) reads the file's order back: the same
// bits. Read as the file's order, the grouped bytes give other sums (the
// kernels do read them as groups); the oracle reads them as the file
// (MlxCodeByte), and so does
// every other reader: the rows dequantized and a range of their columns, the
// exact route's matvec and panels, the transposed product (the backward's),
// and a column slice from the second group on. Rows with and without codes
// after their last whole group (K 640, 1152: 128 more).
TEST(MatMulInt8, MlxGroupsReadAsTheFile) {
  std::mt19937 rng(41);
  ThreadPool pool(3);
  const int64_t N = 37, kMaxM = 48, group = 512;  // codes per group
  // Every group size with every scale type (the kernels' lane scales read each).
  struct GroupScales {
    int g;
    DType st;
  };
  std::vector<GroupScales> groups;
  for (int g : {32, 64, 128})
    for (DType st : {DType::kF16, DType::kBF16, DType::kF32}) groups.push_back({g, st});
  for (int bits : {4, 8})
    for (const auto& [g, st] : groups)
      for (int64_t K : {640, 1024, 1152, 2048}) {
        if (K % g != 0) continue;
        const std::string what = "mlx" + std::to_string(bits) + "_g" + std::to_string(g) + " " +
                                 std::string(Name(st)) + " scales K=" + std::to_string(K);
        OwnedMatrix W = MakeInt8(DType::kU32, N, K, rng, g, st, bits);
        W.m.route = ActRoute::kInt8x2;
        SKIP_WITHOUT_VNNI(W.m);
        ASSERT_EQ(MlxOrder::kGroups, Int8MlxOrder(W.m)) << what;
        ASSERT_TRUE(Int8x2GemmTakes(W.m)) << what;
        const std::vector<float> X = RandomActivations(kMaxM, K, rng);
        const int64_t Ms[] = {1, 3, 4, 8, kMaxM};
        std::vector<std::vector<float>> file(std::size(Ms));
        for (size_t i = 0; i < std::size(Ms); ++i) {
          file[i].resize(Ms[i] * N);
          MatMul(W.m, X.data(), Ms[i], K, file[i].data(), N, nullptr);
        }
        std::vector<float> rows(N * K), oracle(8 * N), exact(kMaxM * N), exact1(N), dX(kMaxM * K);
        std::vector<double> mag;
        for (int64_t n = 0; n < N; ++n) DequantizeMatrixRow(W.m, n, rows.data() + n * K);
        MatMulInt8x2Ref(W.m, X.data(), 8, oracle.data(), &mag);
        W.m.route = ActRoute::kExact;
        MatMul(W.m, X.data(), kMaxM, K, exact.data(), N, nullptr);
        MatMul(W.m, X.data(), 1, K, exact1.data(), N, nullptr);
        std::vector<float> dY(kMaxM * N);
        for (int64_t i = 0; i < kMaxM * N; ++i) dY[i] = X[i];
        MatMulT(W.m, dY.data(), kMaxM, dX.data(), nullptr);
        W.m.route = ActRoute::kInt8x2;

        for (int64_t n = 0; n < N; ++n)
          TransposeMlxGroups(W.m.w.row<uint8_t>(n), K * bits / 8, bits);
        std::vector<float> got(kMaxM * N), got1(N), r(K);
        MatMul(W.m, X.data(), 1, K, got.data(), N, nullptr);  // still marked as the file's
        EXPECT_NE(0, std::memcmp(got.data(), file[0].data(), N * sizeof(float))) << what;
        W.m.mlx_order = MlxOrder::kGroups;
        EXPECT_EQ(MlxOrder::kFile, Int8MlxOrder(W.m)) << what << ": rearranged once";
        std::vector<float> one(N);  // row 0 alone
        MatMul(W.m, X.data(), 1, K, one.data(), N, nullptr);
        for (size_t i = 0; i < std::size(Ms); ++i) {
          const int64_t M = Ms[i];
          std::vector<float> y(M * N), y3(M * N);
          MatMul(W.m, X.data(), M, K, y.data(), N, nullptr);
          MatMul(W.m, X.data(), M, K, y3.data(), N, &pool);
          EXPECT_EQ(y, y3) << what << " M=" << M << ", three threads";
          if (bits == 4 || M == kMaxM) {
            EXPECT_EQ(file[i], y) << what << " M=" << M;
            continue;
          }
          EXPECT_EQ(0, std::memcmp(one.data(), y.data(), N * sizeof(float))) << what << " M=" << M;
          int bad = 0;
          for (int64_t j = 0; j < M * N; ++j) {
            const double bound = (K / 4 + 8) * kU * mag[j] + 1e-30;
            if (std::fabs(double(y[j]) - oracle[j]) > bound && ++bad < 5)
              ADD_FAILURE() << what << " M=" << M << " output " << j << ": " << y[j] << " oracle "
                            << oracle[j] << " bound " << bound;
          }
        }
        std::vector<float> oracle_groups(8 * N);
        MatMulInt8x2Ref(W.m, X.data(), 8, oracle_groups.data());
        EXPECT_EQ(oracle, oracle_groups) << what << ": the oracle";
        for (int64_t n = 0; n < N; ++n) {
          DequantizeMatrixRow(W.m, n, r.data());
          ASSERT_EQ(0, std::memcmp(r.data(), rows.data() + n * K, K * sizeof(float)))
              << what << " row " << n;
        }
        DequantizeMatrixColumns(W.m, 1, g, K - g, r.data());
        EXPECT_EQ(0, std::memcmp(r.data(), rows.data() + K + g, (K - 2 * g) * sizeof(float)))
            << what << ": columns";
        const Matrix slice = W.m.ColSlice(group, K);
        DequantizeMatrixRow(slice, N - 1, r.data());
        EXPECT_EQ(0, std::memcmp(r.data(), rows.data() + (N - 1) * K + group,
                                 (K - group) * sizeof(float)))
            << what << ": a column slice";
        W.m.route = ActRoute::kExact;
        MatMul(W.m, X.data(), kMaxM, K, got.data(), N, nullptr);
        EXPECT_EQ(exact, got) << what << ": exact panels";
        MatMul(W.m, X.data(), 1, K, got1.data(), N, nullptr);
        EXPECT_EQ(exact1, got1) << what << ": exact matvec";
        std::vector<float> dX_groups(kMaxM * K);
        MatMulT(W.m, dY.data(), kMaxM, dX_groups.data(), nullptr);
        EXPECT_EQ(dX, dX_groups) << what << ": the transposed product";
      }
}

}  // namespace
}  // namespace lumen::kernels
