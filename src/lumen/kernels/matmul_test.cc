// MatMul (every compiled SIMD target, every weight storage) against the scalar
// oracle MatMulRef (reference dequantize + double accumulation).
//
// Error bound (per output, hence also in L2): the fast kernels use the same
// dequantized weights as the reference up to one f32 rounding (scale*q+offset
// fused into one FMA), then sum K products in f32 in some order. With unit
// roundoff u = 2^-24, any summation order of K terms has |error| <=
// (K-1) u sum|w x| (to first order), plus u sum|w x| for the weight rounding and
// u for the final product rounding, so
//   |y - y_ref| <= (K + 2) u sum_k |w_k x_k|      (kMatMulBound below).
// Rows are stored at misaligned byte offsets (row stride = row bytes + 3) so no
// kernel may assume aligned weight rows.
#include "lumen/kernels/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <hwy/highway.h>
#include <hwy/targets.h>

#include "lumen/core/quant.h"
#include "lumen/core/repack.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_bf16_amx.h"
#include "lumen/kernels/matmul_ref.h"
#include "lumen/kernels/test_matrix.h"

namespace lumen::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);
double MatMulBound(int64_t K, double abs_dot) { return (K + 2) * kU * abs_dot + 1e-30; }

// Every target compiled into the kernels that this CPU can run.
std::vector<int64_t> Targets() {
  std::vector<int64_t> out;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) out.push_back(t);
  return out;
}

// Runs MatMul on the current target and checks every output against the bound.
void CheckOne(const Matrix& W, int64_t M, ThreadPool* pool, std::mt19937& rng,
              const std::string& what) {
  const int64_t N = W.n, K = W.k;
  std::uniform_real_distribution<float> ud(-2.0f, 2.0f);
  const int64_t ldx = K + 5, ldy = N + 2;  // strided X and Y
  std::vector<float> X(M * ldx), Xc(M * K), Y(M * ldy, -7.0f), Yref(M * N);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) Xc[m * K + k] = X[m * ldx + k] = ud(rng);
  MatMul(W, X.data(), M, ldx, Y.data(), ldy, pool);
  MatMulRef(W, Xc.data(), M, Yref.data());
  std::vector<float> w(K);
  int bad = 0;
  for (int64_t n = 0; n < N; ++n) {
    DequantizeMatrixRow(W, n, w.data());
    for (int64_t m = 0; m < M; ++m) {
      double abs_dot = 0;
      for (int64_t k = 0; k < K; ++k) abs_dot += std::fabs(double(w[k]) * Xc[m * K + k]);
      const double err = std::fabs(double(Y[m * ldy + n]) - Yref[m * N + n]);
      if (!(err <= MatMulBound(K, abs_dot)) && bad++ < 3)
        ADD_FAILURE() << what << " M=" << M << " K=" << K << " n=" << n << " m=" << m << " got "
                      << Y[m * ldy + n] << " want " << Yref[m * N + n] << " err " << err
                      << " bound " << MatMulBound(K, abs_dot);
    }
  }
}

TEST(MatMulTest, EveryTargetDtypeAndShapeWithinBound) {
  std::mt19937 rng(42);
  ThreadPool pool(2);
  const auto targets = Targets();
  ASSERT_FALSE(targets.empty());
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string tname = hwy::TargetName(target);
    for (const Spec& s : AllSpecs()) {
      // Odd multiples of the block (and an odd plain K that no vector divides).
      std::vector<int64_t> ks = {s.block * 1, s.block * 3};
      if (s.block == 1) ks = {37, 96, 160};
      if (s.block == 32) ks.push_back(32 * 7);
      for (int64_t K : ks) {
        if (s.mlx_bits == 0 && !RowBytes(s.dtype, K)) continue;
        OwnedMatrix o = Make(s, /*N=*/37, K, rng);
        for (int64_t M : {1, 2, 3, 7, 16})
          CheckOne(o.m, M, M == 3 ? &pool : nullptr, rng, tname + " " + s.name);
        // The GEMM (M > 4) at tile heights with every remainder (8 rows a
        // tile on AVX-512, 6 on AVX2, 4 elsewhere), at the smallest K only.
        if (K == ks[0])
          for (int64_t M : {5, 8, 9, 17, 64, 300})
            CheckOne(o.m, M, M == 9 || M == 300 ? &pool : nullptr, rng, tname + " " + s.name);
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(MatMulTest, ThreadSplitMatchesSingleThreadBitForBit) {
  std::mt19937 rng(7);
  Spec s;
  s.name = "q4_k";
  s.dtype = DType::kQ4_K;
  OwnedMatrix o = Make(s, 301, 512, rng);
  std::vector<float> X(300 * 512);
  for (auto& v : X) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  ThreadPool pool(2);
  for (int64_t M : {1, 5, 300}) {
    std::vector<float> a(M * 301), b(M * 301);
    MatMul(o.m, X.data(), M, 512, a.data(), 301, nullptr);
    MatMul(o.m, X.data(), M, 512, b.data(), 301, &pool);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "M=" << M;
  }
}

TEST(MatMulTest, ManyEqualsOneByOneBitForBit) {
  std::mt19937 rng(13);
  Spec a, b;
  a.dtype = DType::kQ4_0;
  b.dtype = DType::kQ8_0;
  OwnedMatrix wa = Make(a, 70, 256, rng), wb = Make(b, 21, 256, rng);
  ThreadPool pool(2);
  for (int64_t M : {1, 6, 37}) {
    std::vector<float> X(M * 256);
    for (auto& v : X) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    std::vector<float> ya(M * 70), yb(M * 21), ma(M * 70), mb(M * 21);
    MatMul(wa.m, X.data(), M, 256, ya.data(), 70, nullptr);
    MatMul(wb.m, X.data(), M, 256, yb.data(), 21, nullptr);
    const MatMulOut outs[] = {{&wa.m, ma.data(), 70}, {&wb.m, mb.data(), 21}};
    MatMulMany(outs, X.data(), M, 256, &pool);
    EXPECT_EQ(0, std::memcmp(ya.data(), ma.data(), ya.size() * 4)) << "M=" << M;
    EXPECT_EQ(0, std::memcmp(yb.data(), mb.data(), yb.size() * 4)) << "M=" << M;
  }
}

// For M > 4 every output is one f32 FMA chain in k order (matmul.h), so the
// rows of a call are bit-identical to the same rows computed in calls of
// other heights (every tile remainder), at other places in the call, on 1,
// 2 and 3 threads (other N splits) and through MatMulMany: on every target
// and storage, with N spanning whole and partial panels and K spanning
// several k blocks (and K = 100, which no vector divides).
TEST(MatMulTest, RowsBitIdenticalWhateverTheCallsRowCount) {
  std::mt19937 rng(19);
  ThreadPool pool2(2), pool3(3);
  constexpr int64_t kRows = 70, N = 40;
  struct Part {
    int64_t off, m;
  };
  constexpr Part kParts[] = {{0, 5}, {3, 6}, {8, 7}, {9, 8}, {1, 9}, {20, 17}, {6, 64}, {1, 69}};
  for (int64_t target : Targets()) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string tname = hwy::TargetName(target);
    for (const Spec& s : AllSpecs()) {
      std::vector<int64_t> ks = {s.block * (s.block >= 256 ? 1 : 12)};
      if (s.block == 1) ks = {100, 448};
      for (int64_t K : ks) {
        if (s.mlx_bits == 0 && !RowBytes(s.dtype, K)) continue;
        OwnedMatrix o = Make(s, N, K, rng);
        const std::vector<float> X = RandomActivations(kRows, K, rng);
        std::vector<float> all(kRows * N);
        MatMul(o.m, X.data(), kRows, K, all.data(), N, nullptr);
        for (const Part& p : kParts)
          for (ThreadPool* pool : {(ThreadPool*)nullptr, &pool2, &pool3}) {
            std::vector<float> part(p.m * N, -1.0f);
            MatMul(o.m, X.data() + p.off * K, p.m, K, part.data(), N, pool);
            EXPECT_EQ(0, std::memcmp(part.data(), all.data() + p.off * N, part.size() * 4))
                << tname << " " << s.name << " K=" << K << " rows [" << p.off << ", " << p.off + p.m
                << ") of " << kRows << " threads=" << (pool ? pool->size() : 1);
          }
        // MatMulMany splits the rows of both matrices across the threads together.
        std::vector<float> y1(9 * N), y2(9 * N);
        const MatMulOut outs[] = {{&o.m, y1.data(), N}, {&o.m, y2.data(), N}};
        MatMulMany(outs, X.data() + 40 * K, 9, K, &pool3);
        EXPECT_EQ(0, std::memcmp(y1.data(), all.data() + 40 * N, y1.size() * 4))
            << tname << " " << s.name << " K=" << K << " MatMulMany";
        EXPECT_EQ(y1, y2) << tname << " " << s.name;
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The formats repacked into column groups (core/repack.h) decode to the
// same values in the same chains: the exact route gives the plain rows'
// bits, at decode rows and prefill rows, and so does the bf16 route (its
// panels are the same bf16 values; Q4_0 groups go through a table lookup,
// DecodeQ4_0ColumnsBf16 in matmul.cc). Q4_0 scales include +-0, subnormals and
// negatives; K has whole groups and plain blocks after them.
TEST(MatMulTest, ColumnGroupsGiveThePlainBitsOnTheExactAndBf16Routes) {
  std::mt19937 rng(13);
  const uint16_t special[] = {0x0000, 0x8000, 0x0001, 0x83ff, 0x3c00, 0xbc00, 0x7bff, 0x1234};
  std::vector<ActRoute> routes = {ActRoute::kExact};
  if (CpuHasBf16()) routes.push_back(ActRoute::kBf16);
  for (ActRoute route : routes)
    for (DType c : {DType::kQ4_0Cols, DType::kQ4_1Cols, DType::kQ5_0Cols, DType::kQ5_1Cols,
                    DType::kQ4_KCols, DType::kQ5_KCols, DType::kQ8_0Cols, DType::kQ6_KCols,
                    DType::kQ2_KCols, DType::kQ3_KCols, DType::kQ5_KPlanes})
      for (int64_t K : {512, 640, 768, 1120, 2048, 4160, 4352}) {
        const DType t = PlainOf(c);
        if (K % Info(t).block_elems != 0) continue;
        const int64_t N = 19;
        Spec s;
        s.dtype = t;
        OwnedMatrix q = Make(s, N, K, rng);
        q.m.route = route;
        if (t == DType::kQ4_0)
          for (int64_t n = 0; n < N; ++n)
            for (int64_t b = 0; b < K / 32; ++b)
              if (rng() % 3 == 0)
                std::memcpy(
                    const_cast<uint8_t*>(q.m.w.row<const uint8_t>(n)) + b * sizeof(BlockQ4_0),
                    &special[rng() % 8], 2);
        const std::vector<uint8_t> plain = q.bytes;
        for (int64_t M : {1, 3, 8, 40}) {
          Matrix cols = q.m;  // the same bytes, repacked in place after the plain product
          const std::vector<float> X = RandomActivations(M, K, rng);
          std::vector<float> want(M * N), got(M * N);
          MatMul(q.m, X.data(), M, K, want.data(), N, nullptr);
          for (int64_t n = 0; n < N; ++n)
            RepackColumnGroups(c, const_cast<uint8_t*>(q.m.w.row<const uint8_t>(n)), K);
          cols.w.dtype = c;
          MatMul(cols, X.data(), M, K, got.data(), N, nullptr);
          EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4))
              << Name(c) << " K=" << K << " M=" << M << " route " << int(route);
          std::copy(plain.begin(), plain.end(), q.bytes.begin());  // plain rows again
        }
      }
}

// For M > 4 each output of the exact route is one f32 FMA chain over k in
// order from +0 (gemm-inl.h), however the target blocks the product
// (gemm-inl.h Blocking(): k blocks of up to a quarter of L2 on AVX2, 256-384
// columns on AVX-512; row blocks; whole-panel groups): against that chain
// over the reference's weights, bit for bit, for the storages whose decode
// is one rounding of the reference's value, through both GEMM paths (f32,
// f16, bf16, Q8_0, Q4_0 by column ranges; Q8_0 and Q4_0 column groups as
// whole panels). K = 16448 spans two k blocks and a partial one up to a
// 2 MiB L2 (and a row's plain blocks after its last group), with 40 rows
// (three row blocks on AVX-512, whose blocks are sized by K); 262 rows at
// K = 2080 span two row blocks on AVX2 (sized by the slice: 256 rows) and a
// partial k block; N = 37 and 19, whole and partial panels; plain and with
// the LoRA epilogue (MatMulLowRank: its r terms after the last k block).
// Targets without FMA (SSE4, scalar) may round each product first
// (Highway's MulAdd there): the same chain, fused or not.
void ExpectOneFmaChainPerOutput(int64_t N, int64_t K, int64_t M, std::mt19937& rng) {
  constexpr int64_t kR = 5;
  constexpr float kScale = 0.375f;
  const std::vector<float> X = RandomActivations(M, K, rng), U = RandomActivations(M, kR, rng),
                           B = RandomActivations(N, kR, rng);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                  DType::kQ8_0Cols, DType::kQ4_0Cols}) {
    Spec s;
    s.dtype = t;
    const OwnedMatrix o = Make(s, N, K, rng);
    // lora: then the epilogue's r terms of the same chain (scale u_j, b_j).
    auto chains = [&](bool lora, bool fma) {
      std::vector<float> y(M * N), w(K);
      for (int64_t n = 0; n < N; ++n) {
        DequantizeMatrixRow(o.m, n, w.data());
        for (int64_t m = 0; m < M; ++m) {
          float acc = 0.0f;
          auto add = [&](float a, float b) {
            const float p = a * b;
            acc = fma ? std::fma(a, b, acc) : acc + p;
          };
          for (int64_t k = 0; k < K; ++k) add(X[m * K + k], w[k]);
          if (lora)
            for (int64_t j = 0; j < kR; ++j) add(kScale * U[m * kR + j], B[n * kR + j]);
          y[m * N + n] = acc;
        }
      }
      return y;
    };
    for (bool lora : {false, true}) {
      const std::vector<float> want = chains(lora, true), unfused = chains(lora, false);
      const LowRank lr{.u = U.data(), .v = B.data(), .r = kR, .scale = kScale};
      for (int64_t target : Targets()) {
        hwy::SetSupportedTargetsForTest(target);
        ThreadPool pool(2);
        for (ThreadPool* p : {(ThreadPool*)nullptr, &pool}) {
          std::vector<float> got(M * N, -1.0f);
          if (lora)
            MatMulLowRank(o.m, X.data(), M, K, lr, got.data(), N, p);
          else
            MatMul(o.m, X.data(), M, K, got.data(), N, p);
          const bool fused = 0 == std::memcmp(want.data(), got.data(), got.size() * 4);
          const bool chain = fused || 0 == std::memcmp(unfused.data(), got.data(), got.size() * 4);
          EXPECT_TRUE(target <= HWY_AVX2 ? fused : chain)
              << hwy::TargetName(target) << " " << Name(t) << (lora ? " with the epilogue" : "")
              << (p ? " 2 threads" : " 1 thread") << " M=" << M << " K=" << K;
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(MatMulTest, PrefillOutputsAreOneFmaChainInKOrderAcrossBlocks) {
  std::mt19937 rng(29);
  struct Shape {
    int64_t N, K, M;
  };
  for (const Shape& shape : {Shape{37, 16448, 40}, Shape{19, 2080, 262}})
    ExpectOneFmaChainPerOutput(shape.N, shape.K, shape.M, rng);
}

// The transposed product dX = dY W (MatMulT, the backward's) adds each
// output's terms in ascending n as one FMA chain from +0 (panels of 128
// rows, the chain stored to dX and loaded back between them), whatever the
// column blocks (matmul_t.cc MatMulTRows: 512 columns on AVX2 at a 512 KiB L2,
// 2048 on AVX-512), row blocks and thread split; the columns after the last
// whole vector are a product then a sum. Against that chain, bit for bit:
// K = 4164 (a 4-column tail) for f32, 4160 for Q8_0 and its column groups,
// 4096 for Q4_K (two or more column blocks on every target); N = 260 (three
// panels), M = 14 (6-row tiles and a remainder).
TEST(MatMulTest, TransposedOutputsAreOneFmaChainInNOrderAcrossBlocks) {
  std::mt19937 rng(31);
  constexpr int64_t N = 260, M = 14;
  const std::vector<float> dY = RandomActivations(M, N, rng);
  for (DType t : {DType::kF32, DType::kQ8_0, DType::kQ8_0Cols, DType::kQ4_K}) {
    const int64_t K = t == DType::kF32 ? 4164 : t == DType::kQ4_K ? 4096 : 4160;
    Spec s;
    s.dtype = t;
    const OwnedMatrix o = Make(s, N, K, rng);
    std::vector<float> w(N * K);
    for (int64_t n = 0; n < N; ++n) DequantizeMatrixRow(o.m, n, w.data() + n * K);
    // fused_until: columns from here on take a product then a sum.
    auto chains = [&](int64_t fused_until) {
      std::vector<float> dx(M * K);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; ++k) {
          float acc = 0.0f;
          for (int64_t n = 0; n < N; ++n) {
            const float a = dY[m * N + n], b = w[n * K + k], p = a * b;
            acc = k < fused_until ? std::fma(a, b, acc) : acc + p;
          }
          dx[m * K + k] = acc;
        }
      return dx;
    };
    const std::vector<float> fused = chains(K - K % 8), unfused = chains(0);
    for (int64_t target : Targets()) {
      hwy::SetSupportedTargetsForTest(target);
      ThreadPool pool(2);
      for (ThreadPool* p : {(ThreadPool*)nullptr, &pool}) {
        std::vector<float> got(M * K, -1.0f);
        MatMulT(o.m, dY.data(), M, got.data(), p);
        const std::vector<float>& want = target <= HWY_AVX2 ? fused : unfused;
        EXPECT_EQ(0, std::memcmp(want.data(), got.data(), got.size() * 4))
            << hwy::TargetName(target) << " " << Name(t) << (p ? " 2 threads" : " 1 thread");
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// MatMulAccumulate over column slices of W (Matrix::ColSlice) and the
// matching columns of X continues the product: for M > 4 the exact route's
// chains and the AVX512-BF16 route's 2048-column blocks give the unsplit
// product's bits (slices at multiples of 2048 for the latter); M <= 4, the
// int8 routes and the AMX tiles add each slice's sum once: within the f32
// bound of the unsplit product. Every storage, repacked groups and MLX
// included, and a slice that ends in the row's plain tail.
TEST(MatMulTest, AccumulateOverColumnSlicesContinuesTheProduct) {
  std::mt19937 rng(29);
  ThreadPool pool(2);
  constexpr int64_t N = 37, K = 4608;  // 9 groups of 512; slices below
  struct Case {
    ActRoute route;
    std::vector<int64_t> cuts;  // slice boundaries inside (0, K)
    bool exact_bits;            // for M > 4
  };
  std::vector<Case> cases = {{ActRoute::kExact, {2048}, true},
                             {ActRoute::kExact, {512, 3584}, true},
                             {ActRoute::kInt8x2, {2048}, false}};
  if (CpuHasBf16()) cases.push_back({ActRoute::kBf16, {2048, 4096}, !AmxBf16Usable()});
  for (int64_t target : Targets()) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string tname = hwy::TargetName(target);
    for (const Spec& s : AllSpecs()) {
      OwnedMatrix o = Make(s, N, K, rng);
      for (const Case& c : cases) {
        o.m.route = c.route;
        for (int64_t M : {3, 9, 40}) {
          const std::vector<float> X = RandomActivations(M, K, rng);
          std::vector<float> whole(M * N), split(M * N, 0.0f);
          MatMul(o.m, X.data(), M, K, whole.data(), N, &pool);
          std::vector<int64_t> at = {0};
          at.insert(at.end(), c.cuts.begin(), c.cuts.end());
          at.push_back(K);
          for (size_t i = 0; i + 1 < at.size(); ++i) {
            const Matrix part = o.m.ColSlice(at[i], at[i + 1]);
            ASSERT_EQ(part.k, at[i + 1] - at[i]);
            if (i == 0)
              MatMul(part, X.data(), M, K, split.data(), N, &pool);
            else
              MatMulAccumulate(part, X.data() + at[i], M, K, split.data(), N, &pool);
          }
          const std::string what = tname + " " + s.name + " route " +
                                   std::string(kActRouteNames[int(c.route)]) +
                                   " M=" + std::to_string(M);
          if (M > 4 && c.exact_bits) {
            EXPECT_EQ(0, std::memcmp(whole.data(), split.data(), whole.size() * 4)) << what;
            continue;
          }
          std::vector<float> w(K);
          int bad = 0;
          for (int64_t n = 0; n < N; ++n) {
            DequantizeMatrixRow(o.m, n, w.data());
            for (int64_t m = 0; m < M; ++m) {
              double abs_dot = 0;
              for (int64_t k = 0; k < K; ++k) abs_dot += std::fabs(double(w[k]) * X[m * K + k]);
              const double err = std::fabs(double(split[m * N + n]) - whole[m * N + n]);
              if (!(err <= 2 * MatMulBound(K, 1.01 * abs_dot)) && bad++ < 3)
                ADD_FAILURE() << what << " n=" << n << " m=" << m << " split " << split[m * N + n]
                              << " whole " << whole[m * N + n];
            }
          }
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(MatMulTest, FusedRoutesOnTheBestTarget) {
  std::mt19937 rng(3);
  for (const Spec& s : AllSpecs()) {  // every storage has a vector decoder
    OwnedMatrix o = Make(s, 2, 512, rng);
    EXPECT_TRUE(MatMulIsFused(o.m)) << s.name;
  }
}

// f16 bits for a block's scale or min: +-0, subnormals and normals of either
// sign between 2^-14 and 8 (finite, so every product stays finite).
uint16_t SpecialF16(std::mt19937& rng) {
  const uint16_t sign = (rng() & 1) << 15;
  switch (rng() % 4) {
    case 0:
      return sign;
    case 1:
      return uint16_t(sign | (1 + rng() % 1023));  // subnormal
    default:
      return uint16_t(sign | ((1 + rng() % 17) << 10) | (rng() % 1024));
  }
}

// Byte offsets of the f16 fields (scales, mins) in a block of t.
std::vector<size_t> F16Fields(DType t) {
  switch (t) {
    case DType::kQ4_0:
      return {offsetof(BlockQ4_0, d)};
    case DType::kQ4_1:
      return {offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m)};
    case DType::kQ5_0:
      return {offsetof(BlockQ5_0, d)};
    case DType::kQ5_1:
      return {offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m)};
    case DType::kQ8_0:
      return {offsetof(BlockQ8_0, d)};
    case DType::kQ2_K:
      return {offsetof(BlockQ2K, d), offsetof(BlockQ2K, dmin)};
    case DType::kQ3_K:
      return {offsetof(BlockQ3K, d)};
    case DType::kQ4_K:
      return {offsetof(BlockQ4K, d), offsetof(BlockQ4K, dmin)};
    case DType::kQ5_K:
      return {offsetof(BlockQ5K, d), offsetof(BlockQ5K, dmin)};
    case DType::kQ6_K:
      return {offsetof(BlockQ6K, d)};
    default:
      return {};
  }
}

// N x K of block type t with every byte random (all codes, sub-block scales
// and high bits) and the f16 fields from SpecialF16, rows misaligned as Make's.
OwnedMatrix RandomBlocks(DType t, int64_t N, int64_t K, std::mt19937& rng) {
  const size_t rb = *RowBytes(t, K), stride = rb + 3, bb = Info(t).block_bytes;
  OwnedMatrix o;
  o.bytes.assign(N * stride + 8, 0);
  uint8_t* base = o.bytes.data() + 1;
  for (int64_t n = 0; n < N; ++n) {
    uint8_t* row = base + n * stride;
    for (size_t i = 0; i < rb; ++i) row[i] = uint8_t(rng());
    for (size_t b = 0; b < rb; b += bb)
      for (size_t f : F16Fields(t)) {
        const uint16_t h = SpecialF16(rng);
        std::memcpy(row + b + f, &h, 2);
      }
  }
  o.m.w = TensorView::Contiguous(base, t, {N, K});
  o.m.w.stride[0] = static_cast<int64_t>(stride);
  o.m.n = N;
  o.m.k = K;
  return o;
}

// The block types with vector decoders.
constexpr DType kBlockTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                                 DType::kQ8_0, DType::kQ2_K, DType::kQ3_K, DType::kQ4_K,
                                 DType::kQ5_K, DType::kQ6_K};

// Random blocks (every code and sub-block scale, f16 scales and mins +-0,
// subnormal, negative) through the exact route on every target, M = 1 (the
// dot form) and M > 4 (the panels, with a remainder tile and two threads),
// within the bound of the double-precision dot of DequantizeRow's weights.
TEST(MatMulTest, RandomBlocksWithSpecialScalesWithinBound) {
  std::mt19937 rng(29);
  ThreadPool pool(2);
  for (int64_t target : Targets()) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string tname = hwy::TargetName(target);
    for (DType t : kBlockTypes) {
      const int64_t bk = Info(t).block_elems;
      for (int64_t K : {bk, bk * 3, bk == 32 ? bk * 9 : bk * 2}) {
        OwnedMatrix o = RandomBlocks(t, /*N=*/41, K, rng);
        for (int64_t M : {1, 2, 37})
          CheckOne(o.m, M, M == 37 ? &pool : nullptr, rng, tname + " " + std::string(Name(t)));
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The vector decoders give DequantizeMatrixColumns' values bit for bit (the
// contract of DecodeColumns, which the transposed product uses for whole
// column ranges): MatMulT with dY = I gives dX = W exactly (each output is
// 1 * w plus products with 0, so only the sign of a zero weight is lost).
// K spans two 2048-column ranges for the K-quants.
TEST(MatMulTest, TransposedDecodesColumnsBitForBit) {
  std::mt19937 rng(31);
  for (int64_t target : Targets()) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string tname = hwy::TargetName(target);
    for (DType t : kBlockTypes) {
      const int64_t bk = Info(t).block_elems, N = 24;
      for (int64_t K : {bk * 3, bk == 32 ? bk * 7 : bk * 9}) {
        OwnedMatrix o = RandomBlocks(t, N, K, rng);
        std::vector<float> eye(N * N, 0.0f), dX(N * K), w(K);
        for (int64_t n = 0; n < N; ++n) eye[n * N + n] = 1.0f;
        MatMulT(o.m, eye.data(), N, dX.data(), nullptr);
        int bad = 0;
        for (int64_t n = 0; n < N; ++n) {
          DequantizeMatrixColumns(o.m, n, 0, K, w.data());
          for (int64_t k = 0; k < K; ++k)
            if (!(dX[n * K + k] == w[k]) && bad++ < 3)
              ADD_FAILURE() << tname << " " << Name(t) << " K=" << K << " n=" << n << " k=" << k
                            << " got " << dX[n * K + k] << " want " << w[k];
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(MatMulTest, TransposedWithinBound) {
  std::mt19937 rng(11);
  for (const Spec& s : AllSpecs()) {
    const int64_t K = s.block == 1 ? 48 : s.block * 2, N = 9, M = 3;
    if (s.mlx_bits == 0 && !RowBytes(s.dtype, K)) continue;
    OwnedMatrix o = Make(s, N, K, rng);
    std::vector<float> dY(M * N), dX(M * K), ref(M * K);
    for (auto& v : dY) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    ThreadPool pool(2);
    MatMulT(o.m, dY.data(), M, dX.data(), &pool);
    MatMulTRef(o.m, dY.data(), M, ref.data());
    std::vector<float> w(K);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        double abs_dot = 0;
        for (int64_t n = 0; n < N; ++n) {
          DequantizeMatrixRow(o.m, n, w.data());
          abs_dot += std::fabs(double(w[k]) * dY[m * N + n]);
        }
        EXPECT_LE(std::fabs(dX[m * K + k] - ref[m * K + k]), MatMulBound(N, abs_dot))
            << s.name << " m=" << m << " k=" << k;
      }
  }
}

// The tiled transposed product: panels of 128 weight rows (N = 300 spans three,
// the last partial), row tiles of 4 with remainders, column tiles with a
// scalar tail (K = 100 is no multiple of any vector), on every target and
// storage; within the bound of the double oracle, and the same bits on 1, 2
// and 3 threads (each thread owns whole 64-column ranges).
// MatMulT of M random rows through o against MatMulTRef within the bound,
// and bit-identical on each of `threads`.
void CheckTransposed(const OwnedMatrix& o, int64_t M, std::mt19937& rng, const std::string& what,
                     std::initializer_list<int> threads) {
  const int64_t N = o.m.n, K = o.m.k;
  std::vector<float> w(N * K);
  for (int64_t n = 0; n < N; ++n) DequantizeMatrixRow(o.m, n, w.data() + n * K);
  std::vector<float> dY(M * N), dX(M * K, 5.0f), ref(M * K);
  for (auto& v : dY) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  MatMulT(o.m, dY.data(), M, dX.data(), nullptr);
  MatMulTRef(o.m, dY.data(), M, ref.data());
  int bad = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      double abs_dot = 0;
      for (int64_t n = 0; n < N; ++n) abs_dot += std::fabs(double(w[n * K + k]) * dY[m * N + n]);
      if (!(std::fabs(dX[m * K + k] - ref[m * K + k]) <= MatMulBound(N, abs_dot)) && bad++ < 3)
        ADD_FAILURE() << what << " M=" << M << " m=" << m << " k=" << k << " got " << dX[m * K + k]
                      << " want " << ref[m * K + k];
    }
  for (int t : threads) {
    ThreadPool pool(t);
    std::vector<float> p(M * K, -1.0f);
    MatMulT(o.m, dY.data(), M, p.data(), &pool);
    EXPECT_EQ(0, std::memcmp(p.data(), dX.data(), p.size() * sizeof(float)))
        << what << " M=" << M << " threads=" << t;
  }
}

TEST(MatMulTest, TransposedTilesWithinBoundOnEveryTarget) {
  std::mt19937 rng(13);
  for (int64_t target : Targets()) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string tname = hwy::TargetName(target);
    for (const Spec& s : AllSpecs()) {
      const int64_t K = s.block == 1 ? 100 : s.block * 3, N = 300;
      if (s.mlx_bits == 0 && !RowBytes(s.dtype, K)) continue;
      OwnedMatrix o = Make(s, N, K, rng);
      for (int64_t M : {1, 6, 9}) CheckTransposed(o, M, rng, tname + " " + s.name, {2, 3});
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// A wide K makes MatMulT walk dX in several row blocks (its [rows, K] slice
// is kept to about 1 MiB): still within the bound, and the same bits on any
// thread count (threads split K, which changes the blocks).
TEST(MatMulTest, TransposedRowBlocksWithinBound) {
  std::mt19937 rng(17);
  for (const Spec& s : AllSpecs()) {
    if (s.dtype != DType::kF16 && s.dtype != DType::kQ4_0 && s.dtype != DType::kQ4_K &&
        s.mlx_bits != 4)
      continue;
    CheckTransposed(Make(s, /*N=*/40, /*K=*/8192, rng), /*M=*/100, rng, s.name, {2});
  }
}

}  // namespace
}  // namespace lumen::kernels
