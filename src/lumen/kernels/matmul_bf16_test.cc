// The bf16 prefill route (matmul_bf16.h) against its oracle MatMulBf16Ref and,
// as an L3 route, against the exact product.
//
// Against the oracle (u = 2^-24, mag = sum_k |wb_k xb_k| over the bf16 values):
// products of two bf16 values are exact in f32, so only the f32 summation
// rounds: |y - y_ref| <= (K + 2) u mag. The route's decoders may produce a
// weight one f32 rounding away from DequantizeMatrixRow (scale * q + offset as
// one FMA), which can move its bf16 rounding by one bf16 ulp (2^-7 relative);
// two such weights per output are allowed: + 2 * 2^-7 * max_k |w_k x_k|.
// Against the exact f32 product: each of w and x moves by at most 2^-9
// relative, so |y - y_exact| <= (2^-8 + 2^-18) sum |w x| + the f32 slack.
#include "lumen/kernels/matmul_bf16.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <hwy/highway.h>
#include <hwy/targets.h>

#include "lumen/core/buffer.h"
#include "lumen/kernels/matmul.h"
#include "lumen/kernels/matmul_bf16_amx.h"
#include "lumen/kernels/matmul_bf16_ref.h"
#include "lumen/kernels/matmul_q8.h"
#include "lumen/kernels/matmul_ref.h"
#include "lumen/kernels/roofline.h"
#include "lumen/kernels/test_matrix.h"

namespace lumen::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);

#define SKIP_WITHOUT_BF16()                                                         \
  if (!CpuHasBf16())                                                                \
  GTEST_SKIP() << "no AVX512-BF16 on this CPU: the bf16 route falls back to exact " \
                  "(MatMulBf16.FallsBackToExactWithoutTheRoute covers that)"

// Runs the route on the current target; checks every output against the
// oracle bound and against the exact product's bound.
void CheckOne(const Matrix& W, int64_t M, ThreadPool* pool, std::mt19937& rng,
              const std::string& what) {
  const int64_t N = W.n, K = W.k;
  const std::vector<float> X = RandomActivations(M, K, rng);
  const int64_t ldy = N + 3;  // strided Y
  std::vector<float> Y(M * ldy, -7.0f), Yref(M * N), Yexact(M * N);
  MatMul(W, X.data(), M, K, Y.data(), ldy, pool);
  MatMulBf16Ref(W, X.data(), M, Yref.data());
  MatMulRef(W, X.data(), M, Yexact.data());
  std::vector<float> w(K);
  int bad = 0;
  for (int64_t n = 0; n < N; ++n) {
    DequantizeMatrixRow(W, n, w.data());
    for (int64_t m = 0; m < M; ++m) {
      double mag = 0, abs_dot = 0, top = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double x = X[m * K + k];
        mag += std::fabs(double(RoundBf16(w[k])) * RoundBf16(float(x)));
        abs_dot += std::fabs(w[k] * x);
        top = std::max(top, std::fabs(w[k] * x));
      }
      const double y = Y[m * ldy + n];
      const double to_ref = std::fabs(y - Yref[m * N + n]);
      const double ref_bound = (K + 2) * kU * mag + 2.0 * std::ldexp(top, -7) * 1.01 + 1e-30;
      const double to_exact = std::fabs(y - Yexact[m * N + n]);
      const double exact_bound =
          (std::ldexp(1.0, -8) + std::ldexp(1.0, -18) + (K + 4) * kU) * abs_dot +
          2.0 * std::ldexp(top, -7) * 1.01 + 1e-30;
      if ((!(to_ref <= ref_bound) || !(to_exact <= exact_bound)) && bad++ < 3)
        ADD_FAILURE() << what << " M=" << M << " K=" << K << " n=" << n << " m=" << m << " got "
                      << y << " oracle " << Yref[m * N + n] << " (err " << to_ref << ", bound "
                      << ref_bound << ") exact " << Yexact[m * N + n] << " (err " << to_exact
                      << ", bound " << exact_bound << ")";
    }
  }
}

TEST(MatMulBf16, EveryTargetDtypeAndShapeWithinBound) {
  SKIP_WITHOUT_BF16();
  std::mt19937 rng(42);
  ThreadPool pool(2);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string tname = hwy::TargetName(target);
    for (const Spec& s : AllSpecs()) {
      // Odd multiples of the block; plain K that 32 does not divide (padding).
      std::vector<int64_t> ks = {s.block * 1, s.block * 3};
      if (s.block == 1) ks = {37, 96, 200};
      for (int64_t K : ks) {
        if (s.mlx_bits == 0 && !RowBytes(s.dtype, K)) continue;
        OwnedMatrix o = Make(s, /*N=*/37, K, rng);  // 37: a last tile of 1 row
        o.m.route = ActRoute::kBf16;
        for (int64_t M : {5, 6, 7, 16})  // every remainder of the 4-row X groups
          CheckOne(o.m, M, M == 7 ? &pool : nullptr, rng, tname + " " + s.name);
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(MatMulBf16, SeveralPanelsAndWideK) {
  SKIP_WITHOUT_BF16();
  std::mt19937 rng(5);
  Spec s;
  s.dtype = DType::kQ4_0;
  // K = 64: 128-row panels, so 301 rows are three panels; K = 4096: 64-row panels.
  for (int64_t K : {64, 4096}) {
    OwnedMatrix o = Make(s, 301, K, rng);
    o.m.route = ActRoute::kBf16;
    CheckOne(o.m, 9, nullptr, rng, "q4_0 panels");
  }
}

TEST(MatMulBf16, RouteSelectionAndThreads) {
  SKIP_WITHOUT_BF16();
  std::mt19937 rng(9);
  Spec s;
  s.dtype = DType::kQ4_0;
  OwnedMatrix o = Make(s, 133, 256, rng);
  const std::vector<float> X = RandomActivations(16, 256, rng);
  ThreadPool pool(2);
  auto run = [&](ActRoute r, int64_t M, ThreadPool* p) {
    o.m.route = r;
    std::vector<float> y(M * 133);
    MatMul(o.m, X.data(), M, 256, y.data(), 133, p);
    return y;
  };
  // M <= 4 is not the bf16 route's: bit-identical to exact.
  EXPECT_EQ(run(ActRoute::kExact, 3, nullptr), run(ActRoute::kBf16, 3, nullptr));
  // M > 4 is: the outputs differ from exact (rounding), and threads change nothing.
  EXPECT_NE(run(ActRoute::kExact, 6, nullptr), run(ActRoute::kBf16, 6, nullptr));
  EXPECT_EQ(run(ActRoute::kBf16, 16, nullptr), run(ActRoute::kBf16, 16, &pool));
  // int8+bf16: int8 for M <= kInt8MaxRows, bf16 above.
  if (Int8RouteSupports(o.m)) {
    EXPECT_EQ(run(ActRoute::kInt8, 6, nullptr), run(ActRoute::kInt8Bf16, 6, nullptr));
    EXPECT_EQ(run(ActRoute::kBf16, 9, nullptr), run(ActRoute::kInt8Bf16, 9, nullptr));
    EXPECT_NE(run(ActRoute::kBf16, 6, nullptr), run(ActRoute::kInt8Bf16, 6, nullptr));
  }
  // MatMulMany through the route equals separate calls.
  o.m.route = ActRoute::kBf16;
  OwnedMatrix o2 = Make(s, 40, 256, rng);
  o2.m.route = ActRoute::kBf16;
  std::vector<float> a(16 * 133), b(16 * 40), ma(16 * 133), mb(16 * 40);
  MatMul(o.m, X.data(), 16, 256, a.data(), 133, nullptr);
  MatMul(o2.m, X.data(), 16, 256, b.data(), 40, nullptr);
  const MatMulOut outs[] = {{&o.m, ma.data(), 133}, {&o2.m, mb.data(), 40}};
  MatMulMany(outs, X.data(), 16, 256, &pool);
  EXPECT_EQ(a, ma);
  EXPECT_EQ(b, mb);
}

// The tiles' peak loop (`lumen bench`, `bench train`) runs exactly where the
// kernels take the tiles, and reports nothing (0) under LUMEN_NO_AMX=1 (the
// MatMulBf16.WithoutAmx variant) or without AMX; where it runs, the tiles
// really executed (a positive rate came back from tdpbf16ps sums).
TEST(MatMulBf16, AmxPeakLoopRunsExactlyWhereTheTilesDo) {
  const double flops = MeasureAmxBf16Flops(0.01);
  EXPECT_EQ(flops > 0, AmxBf16Usable()) << AmxBf16Unusable();
  EXPECT_TRUE(std::isfinite(flops));
}

TEST(MatMulBf16, ToBf16RoundsToNearestEvenAndPads) {
  SKIP_WITHOUT_BF16();
  // 1 + 2^-8 is a tie between bf16 1 and 1 + 2^-7: even is 1. 1 + 3 * 2^-8 ties up to 1 + 2^-6.
  std::vector<float> src = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.5f, 1e-3f, 65504.0f};
  for (int i = 0; i < 20; ++i) src.push_back(0.1f * float(i) - 1.0f);  // crosses a 16-wide step
  const int64_t n = static_cast<int64_t>(src.size()), padded = 32;
  std::vector<uint16_t> dst(padded, 0xffff);
  ToBf16Padded(src.data(), n, padded, dst.data());
  EXPECT_EQ(dst[0], 0x3f80);
  EXPECT_EQ(dst[1], 0x3f82);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(dst[i], F32ToBF16(src[i])) << i;
  for (int64_t i = n; i < padded; ++i) EXPECT_EQ(dst[i], 0) << i;
}

// The AMX variant (matmul_bf16_amx.h): the same oracle and bound as the
// AVX512-BF16 kernel (f32 accumulation of exact bf16 products, K in order).

#define SKIP_WITHOUT_AMX()                                          \
  if (!AmxBf16Usable())                                             \
  GTEST_SKIP() << "AMX-BF16 not usable here (" << AmxBf16Unusable() \
               << "): the bf16 route runs on AVX512-BF16, which MatMulBf16.* covers"

std::vector<uint16_t> RandomBf16(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& b : v) b = F32ToBF16(nd(rng));
  return v;
}

// An aligned copy of v (the kernels want 64-byte aligned operands).
AlignedBuffer Aligned(const std::vector<uint16_t>& v) {
  AlignedBuffer b(v.size() * sizeof(uint16_t));
  std::memcpy(b.data(), v.data(), v.size() * sizeof(uint16_t));
  return b;
}

// Y [M, ldy] from a panel kernel against a double sum of the same bf16
// values: outputs outside [M) x [n0, n0 + rows) keep their sentinel (-7);
// inside, init + the sum within (ld + slack) u of init's and the products'
// magnitudes. `what` names the case in failures.
void ExpectPanelWithinBound(const std::vector<uint16_t>& w, const std::vector<uint16_t>& x,
                            int64_t rows, int64_t M, int64_t ld, const std::vector<float>& Y,
                            int64_t ldy, int64_t n0, double init, int64_t slack,
                            const std::string& what) {
  int bad = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < ldy; ++j) {
      const float y = Y[m * ldy + j];
      const int64_t i = j - n0;
      if (i < 0 || i >= rows) {
        if (y != -7.0f && bad++ < 3)
          ADD_FAILURE() << what << ": wrote outside: m=" << m << " j=" << j;
        continue;
      }
      double ref = init, mag = std::fabs(init);
      for (int64_t k = 0; k < ld; ++k) {
        const double p = double(BF16ToF32(w[i * ld + k])) * BF16ToF32(x[m * ld + k]);
        ref += p;
        mag += std::fabs(p);
      }
      const double bound = (ld + slack) * kU * mag + 1e-30;
      if (!(std::fabs(y - ref) <= bound) && bad++ < 3)
        ADD_FAILURE() << what << " m=" << m << " i=" << i << " got " << y << " want " << ref
                      << " bound " << bound;
    }
}

// The kernel alone, against a double sum of the same bf16 values, for every
// remainder of the 16-row tiles in M and in the panel's rows; outputs outside
// [M) x [n0, n0 + rows) keep their sentinel.
TEST(MatMulBf16Amx, KernelWithinBoundOfDoubleSumEveryRemainder) {
  SKIP_WITHOUT_AMX();
  std::mt19937 rng(17);
  for (int64_t ld : {32, 96, 2048})
    for (int64_t rows : {1, 15, 16, 17, 33, 48, 70})
      for (int64_t M : {5, 16, 17, 33, 100}) {
        const int64_t prows = (rows + 15) / 16 * 16, n0 = 2, ldy = n0 + rows + 3;
        const std::vector<uint16_t> w = RandomBf16(prows * ld, rng), x = RandomBf16(M * ld, rng);
        AlignedBuffer wa = Aligned(w), xa = Aligned(x), xp(AmxPackedXBytes(M, ld));
        AmxPackX(xa.as<uint16_t>(), M, ld, xp.as<uint16_t>());
        std::vector<float> Y(M * ldy, -7.0f);
        AmxBf16PanelProduct(wa.as<uint16_t>(), rows, xp.as<uint16_t>(), M, ld, Y.data(), ldy, n0);
        ExpectPanelWithinBound(w, x, rows, M, ld, Y, ldy, n0, 0.0, 2,
                               "ld=" + std::to_string(ld) + " rows=" + std::to_string(rows) +
                                   " M=" + std::to_string(M));
      }
}

// The AVX512-BF16 kernel alone, against a double sum of the same bf16 values:
// every remainder of the 4-row tiles and 6-row X groups, K within one block,
// over a whole number of K blocks and with a partial last block (2048 + 96),
// plain and accumulating (Y += the sum: the sentinel is added once).
TEST(MatMulBf16, PanelKernelWithinBoundOfDoubleSumEveryBlockAndRemainder) {
  SKIP_WITHOUT_BF16();
  std::mt19937 rng(19);
  for (int64_t ld : {32, 96, 2048, 2144, 4096 + 2048 + 32})
    for (int64_t rows : {1, 3, 4, 5, 9})
      for (int64_t M : {1, 5, 6, 7, 13})
        for (bool acc : {false, true}) {
          const int64_t prows = (rows + 3) / 4 * 4, n0 = 2, ldy = n0 + rows + 3;
          const std::vector<uint16_t> w = RandomBf16(prows * ld, rng), x = RandomBf16(M * ld, rng);
          AlignedBuffer wa = Aligned(w), xa = Aligned(x);
          std::vector<float> Y(M * ldy, -7.0f);
          Bf16PanelProduct(wa.as<uint16_t>(), rows, xa.as<uint16_t>(), M, ld, Y.data(), ldy, n0,
                           acc);
          ExpectPanelWithinBound(w, x, rows, M, ld, Y, ldy, n0, acc ? -7.0 : 0.0, 8,
                                 "ld=" + std::to_string(ld) + " rows=" + std::to_string(rows) +
                                     " M=" + std::to_string(M) + " acc=" + std::to_string(acc));
        }
}

// MatMul through the AMX variant for every weight storage, M at and around
// the tile edges, N and K off the tile sizes; threads 1 and 2.
TEST(MatMulBf16Amx, EveryDtypeAndShapeWithinBound) {
  SKIP_WITHOUT_AMX();
  std::mt19937 rng(43);
  ThreadPool pool(2);
  for (const Spec& s : AllSpecs()) {
    std::vector<int64_t> ks = {s.block * 1, s.block * 3};
    if (s.block == 1) ks = {37, 200};
    for (int64_t K : ks) {
      if (s.mlx_bits == 0 && !RowBytes(s.dtype, K)) continue;
      OwnedMatrix o = Make(s, /*N=*/53, K, rng);  // 53 = 3 tiles of 16 + 5
      o.m.route = ActRoute::kBf16;
      for (int64_t M : {5, 16, 17, 33, 100})
        CheckOne(o.m, M, (M == 17 || M == 100) ? &pool : nullptr, rng, "amx " + s.name);
    }
  }
}

TEST(MatMulBf16Amx, SeveralPanelsAndWideK) {
  SKIP_WITHOUT_AMX();
  std::mt19937 rng(6);
  Spec s;
  s.dtype = DType::kQ4_0;
  ThreadPool pool(2);
  // K = 64: 128-row panels, so 301 rows are three panels; K = 4096: 64-row panels.
  for (int64_t K : {64, 4096}) {
    OwnedMatrix o = Make(s, 301, K, rng);
    o.m.route = ActRoute::kBf16;
    CheckOne(o.m, 33, nullptr, rng, "q4_0 amx panels");
    CheckOne(o.m, 40, &pool, rng, "q4_0 amx panels, 2 threads");
  }
}

// From kAmxMinRows rows (every product the bf16 route takes) MatMul's bf16
// route is the AMX kernel, bit for bit, whatever the threads and panels, and
// so is MatMulBf16 (the training's forward); below 5 rows the exact route
// runs (MatMulBf16.RouteSelectionAndThreads). bf16 weights decode exactly, so
// the test builds the same operands directly.
// Also on weights whose decoded values round (F32, Q4_0, Q4_K, F16 scaled):
// the route rounds each decoded vector to bf16 on its way into the panel,
// which must give ToBf16Padded's bits.
TEST(MatMulBf16Amx, TakenFromMinRowsBitForBitAnyThreads) {
  SKIP_WITHOUT_AMX();
  std::mt19937 rng(8);
  for (DType t : {DType::kBF16, DType::kF32, DType::kQ4_0, DType::kQ4_K}) {
    Spec s;
    s.dtype = t;
    const int64_t N = 53, K = t == DType::kBF16 ? 200 : 512, ld = (K + 31) / 32 * 32, Mmax = 40;
    OwnedMatrix o = Make(s, N, K, rng);
    o.m.route = ActRoute::kBf16;
    const std::vector<float> X = RandomActivations(Mmax, K, rng);
    AlignedBuffer panel(64 * ld * sizeof(uint16_t)), xb(Mmax * ld * sizeof(uint16_t));
    std::vector<float> row(K);
    for (int64_t n = 0; n < N; ++n) {
      DequantizeMatrixRow(o.m, n, row.data());
      ToBf16Padded(row.data(), K, ld, panel.as<uint16_t>() + n * ld);
    }
    for (int64_t m = 0; m < Mmax; ++m)
      ToBf16Padded(X.data() + m * K, K, ld, xb.as<uint16_t>() + m * ld);
    ThreadPool pool(2);
    for (int64_t M : {5, 6, 15, 16, 33, 40}) {
      std::vector<float> want(M * N), one(M * N), two(M * N), bf16(M * N);
      if (M >= kAmxMinRows) {
        AlignedBuffer xp(AmxPackedXBytes(M, ld));
        AmxPackX(xb.as<uint16_t>(), M, ld, xp.as<uint16_t>());
        AmxBf16PanelProduct(panel.as<uint16_t>(), N, xp.as<uint16_t>(), M, ld, want.data(), N, 0);
      } else {
        Bf16PanelProduct(panel.as<uint16_t>(), N, xb.as<uint16_t>(), M, ld, want.data(), N, 0);
      }
      MatMul(o.m, X.data(), M, K, one.data(), N, nullptr);
      MatMul(o.m, X.data(), M, K, two.data(), N, &pool);
      MatMulBf16(o.m, X.data(), M, K, bf16.data(), N, &pool);
      EXPECT_EQ(one, want) << Name(t) << " M=" << M;
      EXPECT_EQ(two, want) << Name(t) << " M=" << M;
      EXPECT_EQ(bf16, want) << Name(t) << " M=" << M;
    }
  }
}

}  // namespace
}  // namespace lumen::kernels
