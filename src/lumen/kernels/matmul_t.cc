// The transposed exact product dX = dY W (matmul.h: MatMulT, and with the
// fused LoRA epilogue MatMulTLowRank), per target (Highway): W's rows are
// decoded (row_decoders-inl.h) 128 at a time into a panel, and register
// tiles of dX rows by column vectors run over it, each term one FMA added in
// ascending n, so a column's bits do not depend on the tile, the blocks or
// the thread split (which divides K: no reduction between threads).
#include <algorithm>
#include <cstring>
#include <vector>

#include "lumen/core/check.h"
#include "lumen/core/route.h"
#include "lumen/core/thread_pool.h"
#include "lumen/kernels/matmul.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lumen/kernels/matmul_t.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "lumen/kernels/gemm-inl.h"
#include "lumen/kernels/row_decoders-inl.h"

HWY_BEFORE_NAMESPACE();
namespace lumen::kernels::HWY_NAMESPACE {
namespace {

// The backward epilogue's operands at one tile's first row and column: U
// rows (stride r), V = A's columns (row stride ldv), mask (stride K) or null.
struct TransposedEpi {
  const float* u;
  int64_t r;
  const float* v;
  int64_t ldv;
  const float* mask;
};

// dX[M, K] for columns [k0, k1), accumulated into dX (caller zeroes).
// The transposed product's register tile: R rows of dX by V vectors of
// columns stay in registers across a panel of decoded weight rows; each term
// is one FMA, added in ascending n (the order an AXPY per weight row has).
// E: 0 no epilogue, 1 without a mask, 2 with one (compile-time, as Tile's).
template <int R, int V, int E>
HWY_INLINE void TransposedTile(const float* HWY_RESTRICT panel, int64_t ldp, int64_t nb,
                               const float* HWY_RESTRICT dy, int64_t N, float* HWY_RESTRICT dx,
                               int64_t K, const TransposedEpi* epi) {
  const DF d;
  const int64_t L = hn::Lanes(d);
  VF acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = hn::LoadU(d, dx + r * K + v * L);
  for (int64_t n = 0; n < nb; ++n) {
    VF w[V];
    for (int v = 0; v < V; ++v) w[v] = hn::LoadU(d, panel + n * ldp + v * L);
    for (int r = 0; r < R; ++r) {
      const VF a = hn::Set(d, dy[r * N + n]);
      for (int v = 0; v < V; ++v) acc[r][v] = hn::MulAdd(a, w[v], acc[r][v]);
    }
  }
  if constexpr (E == 1) {  // no mask: r more terms of the same sums, U as dy, A as the panel
    for (int64_t j = 0; j < epi->r; ++j) {
      VF w[V];
      for (int v = 0; v < V; ++v) w[v] = hn::LoadU(d, epi->v + j * epi->ldv + v * L);
      for (int r = 0; r < R; ++r) {
        const VF a = hn::Set(d, epi->u[r * epi->r + j]);
        for (int v = 0; v < V; ++v) acc[r][v] = hn::MulAdd(a, w[v], acc[r][v]);
      }
    }
  } else if constexpr (E == 2) {
    // Dropout: the rank-r term is summed apart, then scaled by the mask.
    for (int r = 0; r < R; ++r) {
      VF t[V];
      for (int v = 0; v < V; ++v) t[v] = hn::Zero(d);
      for (int64_t j = 0; j < epi->r; ++j) {
        const VF a = hn::Set(d, epi->u[r * epi->r + j]);
        for (int v = 0; v < V; ++v)
          t[v] = hn::MulAdd(a, hn::LoadU(d, epi->v + j * epi->ldv + v * L), t[v]);
      }
      for (int v = 0; v < V; ++v)
        acc[r][v] = hn::MulAdd(hn::LoadU(d, epi->mask + r * K + v * L), t[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) hn::StoreU(acc[r][v], d, dx + r * K + v * L);
}

// 4 x kTV tiles, with the narrower tiles at the edges.
#if HWY_TARGET <= HWY_AVX3
constexpr int kTV = 4;  // 16 accumulators of the 32 vector registers
#else
constexpr int kTV = 2;
#endif

template <int R, int E>
HWY_INLINE void TransposedTileCols(int vecs, const float* panel, int64_t ldp, int64_t nb,
                                   const float* dy, int64_t N, float* dx, int64_t K,
                                   const TransposedEpi* epi) {
  switch (vecs) {
    case 1:
      return TransposedTile<R, 1, E>(panel, ldp, nb, dy, N, dx, K, epi);
    case 2:
      return TransposedTile<R, 2, E>(panel, ldp, nb, dy, N, dx, K, epi);
    case 3:
      return TransposedTile < R, kTV == 4 ? 3 : 1, E > (panel, ldp, nb, dy, N, dx, K, epi);
    default:
      return TransposedTile<R, kTV, E>(panel, ldp, nb, dy, N, dx, K, epi);
  }
}

// dX[:, k0:k1) (already holding the sum so far) += dY * W[:, k0:k1). W rows
// are decoded kTn at a time into a panel; for each column tile (an L1-sized
// slice of the panel) every 6-row (AVX-512), 4-, 2- or 1-row tile of dX accumulates the
// panel's rows.
// Columns past the last whole vector of [k0, k1) are summed in scalar code
// as mul then add, as the AXPY this replaces did, so the result is the same
// bit for bit.
//
// lr (may be null): the fused LoRA epilogue (matmul.h, MatMulTLowRank), added
// to each tile after the last panel; the scalar tail adds it the same way.
// The panel takes only the range's columns where the storage's blocks allow
// it (DequantizeMatrixColumns gives the same values as the row's slice).
void MatMulTRange(const Matrix& W, const float* dY, int64_t M, float* dX, int64_t k0, int64_t k1,
                  const LowRank* lr) {
  const DF d;
  const int64_t L = hn::Lanes(d), N = W.n, K = W.k, KW = k1 - k0;
  const int64_t kv = KW / L * L;  // whole vectors of the range
  constexpr int64_t kTn = 128;
  const int64_t align = MatrixColumnAlign(W);
  const bool columns = k0 % align == 0 && (k1 % align == 0 || k1 == K);
  // Panel rows one cache line longer than whole lines: at a stride of a
  // multiple of 4 KiB (KW = 1024, 2048) a column tile's 128 rows all fall in
  // the same few L1 sets and the tile is re-read from L2 on every row block.
  const int64_t ldp = (KW + 15) / 16 * 16 + 16;
  std::vector<float> row(columns ? 0 : K), panel(kTn * ldp);
  const Path path = PathFor(W);
  // Rows of dX in blocks whose [rows, KW] slice stays in L2 across all the
  // panels (each panel adds into it: Blocking().t_rows); the panels are
  // decoded again per block. Per element the panels still add in n order:
  // the same bits for any block.
  const int64_t kTm = std::clamp<int64_t>(Blocking().t_rows / (KW * 4) / 4 * 4, 32, 1 << 20);
  for (int64_t mb = 0; mb < M; mb += kTm) {
    const int64_t me = std::min(M, mb + kTm);
    for (int64_t n0 = 0; n0 < N; n0 += kTn) {
      const int64_t nb = std::min(kTn, N - n0);
      const bool last = n0 + nb == N;
      for (int64_t i = 0; i < nb; ++i) {
        if (columns) {
          if (!DecodeColumns(path, W, n0 + i, k0, KW, panel.data() + i * ldp))
            DequantizeMatrixColumns(W, n0 + i, k0, k1, panel.data() + i * ldp);
          continue;
        }
        DequantizeMatrixRow(W, n0 + i, row.data());
        std::memcpy(panel.data() + i * ldp, row.data() + k0, KW * sizeof(float));
      }
      const float* dy0 = dY + n0;
      for (int64_t k = 0; k < kv; k += kTV * L) {
        const int vecs = int(std::min<int64_t>(kTV, (kv - k) / L));
        const float* pk = panel.data() + k;
        auto epi = [&](int64_t m) {
          return TransposedEpi{lr->u + m * lr->r, lr->r, lr->v + k0 + k, K,
                               lr->mask ? lr->mask + m * K + k0 + k : nullptr};
        };
        const int mode = !(lr && last) ? 0 : lr->mask ? 2 : 1;
        auto rows = [&](auto height, int64_t m) HWY_ATTR {
          constexpr int R = decltype(height)::value;
          const float* dym = dy0 + m * N;
          float* dxm = dX + m * K + k0 + k;
          if (mode == 0)
            return TransposedTileCols<R, 0>(vecs, pk, ldp, nb, dym, N, dxm, K, nullptr);
          const TransposedEpi e = epi(m);
          if (mode == 1) return TransposedTileCols<R, 1>(vecs, pk, ldp, nb, dym, N, dxm, K, &e);
          TransposedTileCols<R, 2>(vecs, pk, ldp, nb, dym, N, dxm, K, &e);
        };
        int64_t m = mb;
#if HWY_TARGET <= HWY_AVX2
        // 24 accumulators of 32 registers (AVX-512), 12 of 16 (AVX2)
        for (; m + 6 <= me; m += 6) rows(Par<6>{}, m);
#endif
        for (; m + 4 <= me; m += 4) rows(Par<4>{}, m);
        for (; m + 2 <= me; m += 2) rows(Par<2>{}, m);
        for (; m < me; ++m) rows(Par<1>{}, m);
      }
      for (int64_t m = mb; m < me; ++m)
        for (int64_t c = kv; c < KW; ++c) {
          float y = dX[m * K + k0 + c];
          for (int64_t i = 0; i < nb; ++i) {
            const float t = dy0[m * N + i] * panel[i * ldp + c];
            y += t;
          }
          if (lr && last) {
            float low = 0;
            for (int64_t j = 0; j < lr->r; ++j) low += lr->u[m * lr->r + j] * lr->v[j * K + k0 + c];
            if (lr->mask) low *= lr->mask[m * K + k0 + c];
            y += low;
          }
          dX[m * K + k0 + c] = y;
        }
    }
  }
}

// MatMulTRange over [k0, k1) in column blocks of Blocking().t_cols (at
// most 2048), so a panel of 128 decoded rows stays within L2 whatever K is.
// Block edges are multiples of 512 (whole vectors and storage blocks: every
// MatrixColumnAlign divides it), so every column keeps its place in the
// vector part or the scalar tail and the blocks change no bit.
void MatMulTRows(const Matrix& W, const float* dY, int64_t M, float* dX, int64_t k0, int64_t k1,
                 const LowRank* lr) {
  const int64_t kCols = Blocking().t_cols;
  for (int64_t c0 = k0; c0 < k1;) {
    const int64_t c1 = std::min(k1, (c0 / kCols + 1) * kCols);
    MatMulTRange(W, dY, M, dX, c0, c1, lr);
    c0 = c1;
  }
}

}  // namespace

}  // namespace lumen::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lumen::kernels {

LUMEN_ROUTE(
    matmul_transposed,
    {.node = "matmul.backward",
     .name = "simd-transposed",
     .tier = Tier::kL2,
     .oracle = "MatMulRef of the transposed product",
     .bound = "relative error within the bound of matmul_test.cc",
     .tests = "MatMulTest.TransposedWithinBound;MatMulTest.TransposedDecodesColumnsBitForBit;"
              "Types/QuantizedBase.FloatRouteWithinBoundOfDouble/*"});

LUMEN_ROUTE(matmul_lora_epilogue_t,
            {.node = "matmul.lora_t",
             .name = "simd-epilogue",
             .tier = Tier::kL2,
             .oracle = "MatMulTLowRankRef (matmul_ref.h: dequantize, double accumulation)",
             .bound = "per output (N + r + 3) 2^-24 (|dx0| + sum |dy w| + |mask| sum |u a|) "
                      "(matmul.h); not bit-identical to the unfused order",
             .tests = "MatMulTLowRank.EpilogueWithinBoundOnEveryTargetAndStorage",
             .priority = 10});

HWY_EXPORT(MatMulTRows);

namespace {

// dX += dY W (+ the epilogue), K split across threads: each thread
// dequantizes every row but writes only its own column range, so no
// reduction between threads is needed.
void TransposedOnPool(const Matrix& W, const float* dY, int64_t M, float* dX, const LowRank* lr,
                      ThreadPool* pool) {
  ParallelOrInline(pool, W.k, 1, 64, [&](int64_t b, int64_t e, int) {
    HWY_DYNAMIC_DISPATCH(MatMulTRows)(W, dY, M, dX, b, e, lr);
  });
}

}  // namespace

void MatMulT(const Matrix& W, const float* dY, int64_t M, float* dX, ThreadPool* pool) {
  std::fill(dX, dX + M * W.k, 0.0f);
  TransposedOnPool(W, dY, M, dX, nullptr, pool);
}

void MatMulTLowRank(const Matrix& W, const float* dY, int64_t M, const LowRank& lr, float* dX,
                    ThreadPool* pool) {
  LUMEN_CHECK(lr.u && lr.v && lr.r >= 1);
  TransposedOnPool(W, dY, M, dX, &lr, pool);
}

}  // namespace lumen::kernels
#endif  // HWY_ONCE
