// The bf16 transposed product (matmul_bf16_t.h) and the bf16 route for every
// row count (MatMulBf16, matmul.h) against their oracles (matmul_bf16_ref.h).
//
// Bound against the oracle (u = 2^-24, mag = sum_n |bf16(dy_n) bf16(w_n)|):
// the products of two bf16 values are exact in f32, so only the f32 sums
// round, at most N + 2 of them on any output (lanes, the 4-way tree, one add
// per N-chunk): |dx - dx_ref| <= (N + 2) u mag. The weights come from the
// scalar decoders (DequantizeMatrixColumns, equal to DequantizeMatrixRow), so
// no decoder slack is needed. With accumulate, the add of the prior dX value
// rounds once more: + u (|dx_prior| + |dx|).
// The AMX kernel (matmul_bf16_t_amx.h) is in the same class: exact bf16
// products, f32 sums, at most N + 2 roundings per output (the tile unit's
// sums in n order, one add per N-chunk), so the same bound holds for it.
// Against the exact f32 product: rounding to bf16 (8 significant bits,
// nearest) moves each of w and dy by at most 2^-8 relative, so
// |dx - dx_exact| <= (2^-7 + 2^-16 + (N + 4) u) sum |w dy|.
#include "lumen/kernels/matmul_bf16_t.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/core/half.h"
#include "lumen/kernels/matmul.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_bf16_amx.h"
#include "lumen/kernels/matmul_bf16_ref.h"
#include "lumen/kernels/matmul_bf16_t_amx.h"
#include "lumen/kernels/matmul_ref.h"
#include "lumen/kernels/test_matrix.h"

namespace lumen::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);

#define SKIP_WITHOUT_BF16() \
  if (!CpuHasBf16()) GTEST_SKIP() << "no AVX512-BF16 on this CPU: the route is refused there"

// Runs MatMulTBf16 (overwrite and accumulate) and checks both bounds.
void CheckTransposed(const Matrix& W, int64_t M, ThreadPool* pool, std::mt19937& rng,
                     const std::string& what) {
  const int64_t N = W.n, K = W.k;
  const std::vector<float> dY = RandomActivations(M, N, rng);
  std::vector<float> dX(M * K, -7.0f), ref(M * K), prior = RandomActivations(M, K, rng);
  std::vector<float> acc = prior;
  MatMulTBf16(W, dY.data(), M, dX.data(), /*accumulate=*/false, pool);
  MatMulTBf16(W, dY.data(), M, acc.data(), /*accumulate=*/true, pool);
  MatMulTBf16Ref(W, dY.data(), M, ref.data());
  std::vector<float> w(K);
  std::vector<double> mag(M * K, 0.0), abs_dot(M * K, 0.0), exact(M * K, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    DequantizeMatrixRow(W, n, w.data());
    for (int64_t m = 0; m < M; ++m) {
      const double g = dY[m * N + n], gb = RoundBf16(dY[m * N + n]);
      for (int64_t k = 0; k < K; ++k) {
        mag[m * K + k] += std::fabs(gb * RoundBf16(w[k]));
        abs_dot[m * K + k] += std::fabs(g * w[k]);
        exact[m * K + k] += g * w[k];
      }
    }
  }
  int bad = 0;
  for (int64_t i = 0; i < M * K; ++i) {
    const double ref_bound = (N + 2) * kU * mag[i] + 1e-30;
    const double exact_bound =
        (std::ldexp(1.0, -7) + std::ldexp(1.0, -16) + (N + 4) * kU) * abs_dot[i] + 1e-30;
    const double acc_bound = ref_bound + kU * (std::fabs(prior[i]) + std::fabs(acc[i]));
    const double e_ref = std::fabs(dX[i] - ref[i]), e_exact = std::fabs(dX[i] - exact[i]);
    const double e_acc = std::fabs(double(acc[i]) - (double(prior[i]) + ref[i]));
    if ((!(e_ref <= ref_bound) || !(e_exact <= exact_bound) || !(e_acc <= acc_bound)) && bad++ < 3)
      ADD_FAILURE() << what << " M=" << M << " N=" << N << " K=" << K << " at m=" << i / K
                    << " k=" << i % K << ": got " << dX[i] << " oracle " << ref[i] << " (err "
                    << e_ref << ", bound " << ref_bound << ") exact " << exact[i] << " (err "
                    << e_exact << ", bound " << exact_bound << ") accumulated " << acc[i]
                    << " (err " << e_acc << ", bound " << acc_bound << ")";
  }
}

TEST(MatMulTBf16, EveryDtypeAndOddShapeWithinBound) {
  SKIP_WITHOUT_BF16();
  std::mt19937 rng(7);
  ThreadPool pool(2);
  for (const Spec& s : AllSpecs()) {
    std::vector<int64_t> ks = {s.block * 1, s.block * 3};
    if (s.block == 1) ks = {37, 96, 200};  // 37, 200: not multiples of 32 (or of a 64 block)
    for (int64_t K : ks) {
      if (s.mlx_bits == 0 && !RowBytes(s.dtype, K)) continue;
      for (int64_t N : {37, 70}) {  // not multiples of 32: padded reduction
        OwnedMatrix o = Make(s, N, K, rng);
        for (int64_t M = 1; M <= 7; ++M)
          CheckTransposed(o.m, M, M % 2 ? &pool : nullptr, rng, s.name);
      }
    }
  }
}

// Several N-chunks (a 64-column block takes 4096 rows per chunk, a 256-column
// block 1024) and several column blocks with a short last one; the result
// does not depend on the threads.
TEST(MatMulTBf16, SeveralChunksAndBlocksThreadIndependent) {
  SKIP_WITHOUT_BF16();
  std::mt19937 rng(11);
  ThreadPool pool(2);
  struct Case {
    DType t;
    int64_t n, k;
  };
  for (const Case& c : {Case{DType::kF16, 4133, 200}, Case{DType::kQ4_0, 4133, 224},
                        Case{DType::kQ4_K, 1100, 768}, Case{DType::kQ8_0, 300, 96}}) {
    Spec s;
    s.dtype = c.t;
    s.name = std::string(Name(c.t));
    OwnedMatrix o = Make(s, c.n, c.k, rng);
    CheckTransposed(o.m, 9, &pool, rng, s.name + " chunks");
    const std::vector<float> dY = RandomActivations(6, c.n, rng);
    std::vector<float> a(6 * c.k), b(6 * c.k);
    MatMulTBf16(o.m, dY.data(), 6, a.data(), false, nullptr);
    MatMulTBf16(o.m, dY.data(), 6, b.data(), false, &pool);
    EXPECT_EQ(a, b) << s.name;
  }
}

TEST(MatMulTBf16, EmptyReductionZeroesOrKeeps) {
  SKIP_WITHOUT_BF16();
  std::mt19937 rng(3);
  Spec s;
  OwnedMatrix o = Make(s, 4, 40, rng);
  Matrix empty = o.m.RowSlice(0, 0);
  std::vector<float> dx(3 * 40, 5.0f);
  MatMulTBf16(empty, nullptr, 3, dx.data(), true, nullptr);
  EXPECT_EQ(dx, std::vector<float>(3 * 40, 5.0f));
  MatMulTBf16(empty, nullptr, 3, dx.data(), false, nullptr);
  EXPECT_EQ(dx, std::vector<float>(3 * 40, 0.0f));
}

// The transient bytes the header states (memory_plan.cc counts them) cover
// dY in bf16 and the per-thread panels: with the AMX kernel dY's rows are
// padded to 16, the column blocks are 256 wide and a row pair is decoded.
TEST(MatMulTBf16, TransientBytesAsStated) {
  if (AmxBf16Usable())
    EXPECT_EQ(MatMulTBf16TransientBytes(100, 64, 1, 1),
              size_t(112 * 64 * 2) + size_t(256 * 64 * 2 + 2 * 256 * 4 + 256 * 2));
  else
    EXPECT_EQ(MatMulTBf16TransientBytes(100, 64, 1, 1),
              size_t(100 * 64 * 2) + size_t(64 * 64 * 2 + 64 * 4 + 64 * 2));
  EXPECT_LE(MatMulTBf16TransientBytes(512, 8192, 4), size_t(512 * 8192 * 2) + 4 * (520u << 10));
}

// DequantizeMatrixColumns is DequantizeMatrixRow's slice, for every storage.
TEST(MatrixColumns, EqualTheRowsSlices) {
  std::mt19937 rng(5);
  for (const Spec& s : AllSpecs()) {
    const int64_t K = s.block == 1 ? 100 : s.block * 3;
    if (s.mlx_bits == 0 && !RowBytes(s.dtype, K)) continue;
    OwnedMatrix o = Make(s, 3, K, rng);
    const int64_t a = MatrixColumnAlign(o.m);
    EXPECT_EQ(a, s.block) << s.name;
    std::vector<float> row(K), cols(K);
    for (int64_t r = 0; r < 3; ++r) {
      DequantizeMatrixRow(o.m, r, row.data());
      for (int64_t k0 = 0; k0 < K; k0 += a)
        for (int64_t k1 : {std::min(K, k0 + a), K}) {
          DequantizeMatrixColumns(o.m, r, k0, k1, cols.data());
          for (int64_t k = k0; k < k1; ++k)
            ASSERT_EQ(cols[k - k0], row[k])
                << s.name << " r " << r << " [" << k0 << ", " << k1 << ") k " << k;
        }
    }
  }
}

// MatMulBf16 (the route for every row count): within the prefill oracle's
// bound for M = 1..7, and bit-identical to MatMul's own bf16 route where that
// applies (M > 4), threads or not.
TEST(MatMulBf16Every, AnyRowCountMatchesOracleAndTheRoute) {
  SKIP_WITHOUT_BF16();
  std::mt19937 rng(13);
  ThreadPool pool(2);
  for (const Spec& s : AllSpecs()) {
    const int64_t K = s.block == 1 ? 37 : s.block * 3;
    if (s.mlx_bits == 0 && !RowBytes(s.dtype, K)) continue;
    OwnedMatrix o = Make(s, 37, K, rng);
    for (int64_t M = 1; M <= 7; ++M) {
      const std::vector<float> X = RandomActivations(M, K, rng);
      std::vector<float> y(M * 37), ref(M * 37), route(M * 37);
      MatMulBf16(o.m, X.data(), M, K, y.data(), 37, M % 2 ? &pool : nullptr);
      MatMulBf16Ref(o.m, X.data(), M, ref.data());
      std::vector<float> w(K);
      for (int64_t n = 0; n < 37; ++n) {
        DequantizeMatrixRow(o.m, n, w.data());
        for (int64_t m = 0; m < M; ++m) {
          double mag = 0, top = 0;
          for (int64_t k = 0; k < K; ++k) {
            mag += std::fabs(double(RoundBf16(w[k])) * RoundBf16(X[m * K + k]));
            top = std::max(top, std::fabs(double(w[k]) * X[m * K + k]));
          }
          // The fused decoders may put a weight one f32 rounding away (see
          // matmul_bf16_test.cc): two bf16 ulps of the largest term.
          const double bound = (K + 2) * kU * mag + 2.0 * std::ldexp(top, -7) * 1.01 + 1e-30;
          ASSERT_LE(std::fabs(y[m * 37 + n] - ref[m * 37 + n]), bound)
              << s.name << " M " << M << " n " << n << " m " << m;
        }
      }
      if (M > 4) {
        o.m.route = ActRoute::kBf16;
        MatMul(o.m, X.data(), M, K, route.data(), 37, nullptr);
        o.m.route = ActRoute::kExact;
        EXPECT_EQ(y, route) << s.name << " M " << M;
      }
    }
  }
}

// The AMX kernel of the transposed product (matmul_bf16_t_amx.h).

#define SKIP_WITHOUT_AMX()                                          \
  if (!AmxBf16Usable())                                             \
  GTEST_SKIP() << "AMX-BF16 not usable here (" << AmxBf16Unusable() \
               << "): the transposed product runs on AVX512-BF16, which MatMulTBf16.* covers"

// The VNNI panel (AmxPackTPair, and AmxPackTPairF16 from f16 storage): pair p of group g holds
// (w[2p][16g + j], w[2p + 1][16g + j]) as bf16 nearest even at 32 p + 2 j (+ 1) of the group;
// columns past kn and a null row are zero.
TEST(MatMulTBf16Amx, PackTPairIsTheVnniLayout) {
  SKIP_WITHOUT_AMX();
  std::mt19937 rng(21);
  const int64_t rows = 64, kn = 37, groups = 3;
  const std::vector<float> a = RandomActivations(1, kn, rng), b = RandomActivations(1, kn, rng);
  std::vector<uint16_t> panel(AmxTPanelElems(groups, rows), 0xffff);
  AmxPackTPair(a.data(), b.data(), kn, groups, rows, 5, panel.data());
  AmxPackTPair(b.data(), nullptr, kn, groups, rows, 31, panel.data());
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t j = 0; j < 16; ++j) {
      const int64_t k = 16 * g + j;
      const uint16_t* p5 = panel.data() + g * 16 * rows + 5 * 32 + 2 * j;
      const uint16_t* p31 = panel.data() + g * 16 * rows + 31 * 32 + 2 * j;
      EXPECT_EQ(p5[0], k < kn ? F32ToBF16(a[k]) : 0) << "g " << g << " j " << j;
      EXPECT_EQ(p5[1], k < kn ? F32ToBF16(b[k]) : 0) << "g " << g << " j " << j;
      EXPECT_EQ(p31[0], k < kn ? F32ToBF16(b[k]) : 0) << "g " << g << " j " << j;
      EXPECT_EQ(p31[1], 0) << "g " << g << " j " << j;
      // Pairs not written keep their contents.
      EXPECT_EQ(panel[g * 16 * rows + 4 * 32 + 2 * j], 0xffff);
    }
  // From f16 storage (unaligned rows): the same panel as from the rows
  // decoded to f32.
  std::vector<uint16_t> h(2 * kn + 1);
  for (int64_t k = 0; k < kn; ++k) {
    h[1 + k] = F32ToF16(a[k]);
    h[1 + kn + k] = F32ToF16(b[k]);
  }
  std::vector<float> fa(kn), fb(kn);
  for (int64_t k = 0; k < kn; ++k) {
    fa[k] = F16ToF32(h[1 + k]);
    fb[k] = F16ToF32(h[1 + kn + k]);
  }
  std::vector<uint16_t> from_f16(panel.size(), 0xffff), from_f32(panel.size(), 0xffff);
  for (int64_t p : {0, 7}) {
    AmxPackTPairF16(h.data() + 1, h.data() + 1 + kn, kn, groups, rows, p, from_f16.data());
    AmxPackTPair(fa.data(), fb.data(), kn, groups, rows, p, from_f32.data());
  }
  AmxPackTPairF16(nullptr, h.data() + 1, kn, groups, rows, 9, from_f16.data());
  AmxPackTPair(nullptr, fa.data(), kn, groups, rows, 9, from_f32.data());
  EXPECT_EQ(from_f16, from_f32);
}

// The kernel alone, against a double sum of the same bf16 values, for every
// remainder of the 16-row tiles in M and of the 16-column groups in kn;
// outputs outside [M) x [k0, k0 + kn) keep their sentinel, accumulate adds.
TEST(MatMulTBf16Amx, KernelWithinBoundOfDoubleSumEveryRemainder) {
  SKIP_WITHOUT_AMX();
  std::mt19937 rng(19);
  for (int64_t ld : {32, 96})
    for (int64_t kn : {1, 15, 16, 17, 33, 48, 70})
      for (int64_t M : {5, 16, 17, 33, 100}) {
        const int64_t groups = (kn + 15) / 16, mr = (M + 15) / 16 * 16, k0 = 2, ldx = k0 + kn + 3;
        const std::vector<float> w = RandomActivations(ld, kn, rng);  // W [ld, kn]
        const std::vector<float> dy = RandomActivations(M, ld, rng);  // dY [M, ld]
        AlignedBuffer panel(AmxTPanelElems(groups, ld) * sizeof(uint16_t));
        for (int64_t p = 0; p < ld / 2; ++p)
          AmxPackTPair(w.data() + 2 * p * kn, w.data() + (2 * p + 1) * kn, kn, groups, ld, p,
                       panel.as<uint16_t>());
        AlignedBuffer dyb(mr * ld * sizeof(uint16_t));  // zero-filled: rows past M
        for (int64_t m = 0; m < M; ++m)
          ToBf16Padded(dy.data() + m * ld, ld, ld, dyb.as<uint16_t>() + m * ld);
        std::vector<float> dX(M * ldx, -7.0f), acc(M * ldx, 0.5f);
        AmxBf16TPanelProduct(dyb.as<uint16_t>(), M, ld, panel.as<uint16_t>(), kn, dX.data(), ldx,
                             k0, false);
        AmxBf16TPanelProduct(dyb.as<uint16_t>(), M, ld, panel.as<uint16_t>(), kn, acc.data(), ldx,
                             k0, true);
        int bad = 0;
        for (int64_t m = 0; m < M; ++m)
          for (int64_t col = 0; col < ldx; ++col) {
            const float got = dX[m * ldx + col], got_acc = acc[m * ldx + col];
            const int64_t j = col - k0;
            if (j < 0 || j >= kn) {
              if ((got != -7.0f || got_acc != 0.5f) && bad++ < 3)
                ADD_FAILURE() << "wrote outside: m=" << m << " col=" << col;
              continue;
            }
            double ref = 0, mag = 0;
            for (int64_t n = 0; n < ld; ++n) {
              const double p = double(RoundBf16(dy[m * ld + n])) * RoundBf16(w[n * kn + j]);
              ref += p;
              mag += std::fabs(p);
            }
            const double bound = (ld + 2) * kU * mag + 1e-30;
            const double acc_bound = bound + kU * (0.5 + std::fabs(got_acc));
            if ((!(std::fabs(got - ref) <= bound) ||
                 !(std::fabs(got_acc - (0.5 + ref)) <= acc_bound)) &&
                bad++ < 3)
              ADD_FAILURE() << "ld=" << ld << " kn=" << kn << " M=" << M << " m=" << m << " j=" << j
                            << " got " << got << " accumulated " << got_acc << " want " << ref
                            << " bound " << bound;
          }
      }
}

// MatMulTBf16 on the tiles for every weight storage, M at and around the
// tile edges, N and K off the tile sizes (K past one 256-column block where
// the storage allows), against the oracle; threads 1 and 2 bit-identical.
TEST(MatMulTBf16Amx, EveryDtypeAndShapeWithinBoundThreadIndependent) {
  SKIP_WITHOUT_AMX();
  std::mt19937 rng(23);
  ThreadPool pool(2);
  for (const Spec& s : AllSpecs()) {
    std::vector<int64_t> ks = {s.block * 1, s.block * 3};
    if (s.block == 1) ks = {37, 300};  // 300: a full 256-column block and a 44-column one
    for (int64_t K : ks) {
      if (s.mlx_bits == 0 && !RowBytes(s.dtype, K)) continue;
      for (int64_t N : {37, 70}) {
        OwnedMatrix o = Make(s, N, K, rng);
        for (int64_t M : {5, 16, 17, 33, 100}) {
          CheckTransposed(o.m, M, M % 2 ? &pool : nullptr, rng, "amx " + s.name);
          const std::vector<float> dY = RandomActivations(M, N, rng);
          std::vector<float> one(M * K), two(M * K);
          MatMulTBf16(o.m, dY.data(), M, one.data(), false, nullptr);
          MatMulTBf16(o.m, dY.data(), M, two.data(), false, &pool);
          EXPECT_EQ(one, two) << s.name << " M " << M << " N " << N << " K " << K;
        }
      }
    }
  }
}

// From kAmxTMinRows rows MatMulTBf16 is the AMX kernel, bit for bit, with or
// without threads: bf16 weights decode exactly, so the test builds the one
// panel (one column block, one N-chunk) and dY's rows directly.
TEST(MatMulTBf16Amx, TakenFromMinRowsBitForBitAnyThreads) {
  SKIP_WITHOUT_AMX();
  std::mt19937 rng(9);
  Spec s;
  s.dtype = DType::kBF16;
  const int64_t N = 53, K = 200, ld = 64, groups = (K + 15) / 16;
  OwnedMatrix o = Make(s, N, K, rng);
  AlignedBuffer panel(AmxTPanelElems(groups, ld) * sizeof(uint16_t));
  std::vector<float> r0(K), r1(K);
  for (int64_t p = 0; p < ld / 2; ++p) {
    if (2 * p < N) DequantizeMatrixRow(o.m, 2 * p, r0.data());
    if (2 * p + 1 < N) DequantizeMatrixRow(o.m, 2 * p + 1, r1.data());
    AmxPackTPair(2 * p < N ? r0.data() : nullptr, 2 * p + 1 < N ? r1.data() : nullptr, K, groups,
                 ld, p, panel.as<uint16_t>());
  }
  ThreadPool pool(2);
  for (int64_t M : {kAmxTMinRows, int64_t(6), int64_t(16), int64_t(33), int64_t(40)}) {
    const std::vector<float> dY = RandomActivations(M, N, rng);
    AlignedBuffer dyb((M + 15) / 16 * 16 * ld * sizeof(uint16_t));
    for (int64_t m = 0; m < M; ++m)
      ToBf16Padded(dY.data() + m * N, N, ld, dyb.as<uint16_t>() + m * ld);
    std::vector<float> want(M * K), one(M * K), two(M * K);
    AmxBf16TPanelProduct(dyb.as<uint16_t>(), M, ld, panel.as<uint16_t>(), K, want.data(), K, 0,
                         false);
    MatMulTBf16(o.m, dY.data(), M, one.data(), false, nullptr);
    MatMulTBf16(o.m, dY.data(), M, two.data(), false, &pool);
    EXPECT_EQ(one, want) << "M=" << M;
    EXPECT_EQ(two, want) << "M=" << M;
  }
}

}  // namespace
}  // namespace lumen::kernels
