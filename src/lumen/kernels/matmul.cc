#include "lumen/kernels/matmul.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/core/cache_size.h"
#include "lumen/core/check.h"
#include "lumen/core/half.h"
#include "lumen/core/quant.h"
#include "lumen/core/repack.h"
#include "lumen/core/route.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_bf16_amx.h"
#include "lumen/kernels/matmul_q8.h"
#include "lumen/kernels/prefetch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lumen/kernels/matmul.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "lumen/kernels/dot-inl.h"
#include "lumen/kernels/gemm-inl.h"
#include "lumen/kernels/intrinsics_warnings.h"
#include "lumen/kernels/row_decoders-inl.h"

// Design: one "row decoder" per storage type (row_decoders-inl.h) turns a
// weight row into f32 vectors of N consecutive elements and hands each to a
// sink, so the weight bytes go from memory straight into registers. Decode (M <= 4) sinks FMA the
// vector into one accumulator per activation row (the dot form); prefill
// (M > 4) sinks store decoded rows that are transposed in registers into
// k-major panels, over which an outer-product GEMM (gemm-inl.h) runs all M
// rows with one FMA chain per output in k order, so a row's bits do not
// depend on M, on its place in the call or on the thread split. Every
// dequantized GGUF value equals the scalar reference's bit for bit (see
// DecodeColumns); MLX rows differ by one rounding (an FMA for scale * q +
// bias), so the only other error is f32 summation order.
//
// MLX 4-bit rows decode even and odd elements of each 2N-element chunk as two
// separate vectors (no in-register interleave); X is permuted to match once
// per call (PreparedX), which costs K floats per activation row. The
// transposed product (MatMulT) is in matmul_t.cc.

HWY_BEFORE_NAMESPACE();
namespace lumen::kernels::HWY_NAMESPACE {
namespace {

// Per-thread state for decoding rows of one matrix.
struct RowDecoder {
  const Matrix& W;
  Path path;
  std::vector<float> scratch;  // generic: one dequantized row; MLX: scales + biases
  std::vector<uint8_t> codes;  // MLX runs: a row's codes in the file's order

  explicit RowDecoder(const Matrix& w) : W(w), path(PathFor(w)) {
    if (path == Path::kGeneric) scratch.resize(W.k);
    if (path == Path::kMlx) scratch.resize(2 * (W.k / W.mlx_group));
  }

  template <class Sink>
  HWY_INLINE void Decode(int64_t r, Sink& sink) {
    const uint8_t* row = W.w.row<const uint8_t>(r);
    switch (path) {
      case Path::kMlx: {
        const int64_t groups = W.k / W.mlx_group;
        DequantizeRow(W.scales.dtype, W.scales.row(r), scratch.data(), groups);
        DequantizeRow(W.biases.dtype, W.biases.row(r), scratch.data() + groups, groups);
        return DecodeMlx(W, MlxCodes(r), scratch.data(), scratch.data() + groups, sink);
      }
      case Path::kGeneric: {
        DequantizeMatrixRow(W, r, scratch.data());
        const DF d;
        const int64_t N = hn::Lanes(d);
        int64_t k = 0;
        for (; k + N <= W.k; k += N) sink(k, hn::LoadU(d, scratch.data() + k), P0{});
        if (k < W.k) {  // tail: zero-padded vector (callers pad X the same way)
          HWY_ALIGN float t[hn::MaxLanes(d)] = {};
          std::memcpy(t, scratch.data() + k, (W.k - k) * sizeof(float));
          sink(k, hn::Load(d, t), P1{});
        }
        return;
      }
      default:
        return DecodeStorage(path, row, W.k, sink);
    }
  }

  const uint8_t* MlxCodes(int64_t r) { return MlxFileCodes(W, r, 0, W.k * W.mlx_bits / 8, &codes); }
};

// X rows as the decoders index them: MLX 4-bit permuted within 2N chunks, and
// every row padded to a whole vector so the generic tail can read past K.
struct PreparedX {
  const float* base;
  int64_t ld;
  std::vector<float> own;

  PreparedX(const Matrix& W, Path path, const float* X, int64_t M, int64_t ldx) {
    const int64_t N = hn::Lanes(DF()), K = W.k;
    const bool permute = path == Path::kMlx && W.mlx_bits == 4;
    const bool pad = path == Path::kGeneric && K % N != 0;
    if (!permute && !pad) {
      base = X;
      ld = ldx;
      return;
    }
    ld = (K + N - 1) / N * N;
    own.assign(M * ld, 0.0f);
    for (int64_t m = 0; m < M; ++m) {
      const float* x = X + m * ldx;
      float* o = own.data() + m * ld;
      if (!permute) {
        std::memcpy(o, x, K * sizeof(float));
        continue;
      }
      for (int64_t c = 0; c < K; c += 2 * N)
        for (int64_t j = 0; j < N; ++j) {
          o[c + j] = x[c + 2 * j];
          o[c + N + j] = x[c + 2 * j + 1];
        }
    }
    base = own.data();
  }
  const float* row(int64_t m) const { return base + m * ld; }
};

// The forward epilogue's operands for one thread's rows [n0, n1) of W: U
// pre-multiplied by the scale, and B's rows, each padded with zeros to rp (a
// whole number of vectors), so the epilogue is rp / Lanes more FMAs into the
// tile's accumulators: the dot product extended from K to K + r terms.
struct LowRankTile {
  std::vector<float> u, b;  // [M, rp], [n1 - n0, rp]
  int64_t r = 0, rp = 0, n0 = 0;

  LowRankTile(const LowRank& lr, int64_t M, int64_t n0_, int64_t n1) : r(lr.r), n0(n0_) {
    const int64_t L = hn::Lanes(DF());
    rp = (lr.r + L - 1) / L * L;
    u.assign(M * rp, 0.0f);
    b.assign((n1 - n0) * rp, 0.0f);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < lr.r; ++j) u[m * rp + j] = lr.scale * lr.u[m * lr.r + j];
    for (int64_t n = n0; n < n1; ++n)
      std::memcpy(&b[(n - n0) * rp], lr.v + n * lr.r, lr.r * sizeof(float));
  }
  const float* urow(int64_t m) const { return u.data() + m * rp; }
  const float* brow(int64_t n) const { return b.data() + (n - n0) * rp; }
};

// The rank-r term of one output as a vector whose lanes sum to it.
HWY_INLINE VF LowRankDot(const float* b, const float* u, int64_t rp, VF acc) {
  const DF d;
  for (int64_t j = 0; j < rp; j += hn::Lanes(d))
    acc = hn::MulAdd(hn::LoadU(d, b + j), hn::LoadU(d, u + j), acc);
  return acc;
}

// Y[m, n0:n1) += scale U B^T as a pass of its own: the routes whose tiles
// are not ours (int8, bf16) and kernels::AddLowRank.
void AddLowRankRows(const LowRankTile& e, int64_t M, float* Y, int64_t ldy, int64_t n0,
                    int64_t n1) {
  const DF d;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n)
      Y[m * ldy + n] +=
          hn::GetLane(hn::SumOfLanes(d, LowRankDot(e.brow(n), e.urow(m), e.rp, hn::Zero(d))));
}

// MLX 4-bit matvec row with plain local accumulators. Through the generic
// sink this decoder's accumulators were kept on the stack by GCC (2x slower
// per call); same arithmetic, so results are unchanged.
HWY_NOINLINE float MlxDot4(const uint8_t* p, const float* ss, const float* bb, int64_t K, int64_t G,
                           const float* x) {
  const DF d;
  const DI di;
  const int64_t N = hn::Lanes(d);
  const auto k15 = hn::Set(di, 15);
  VF a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t g = 0; g < K / G; ++g) {
    const auto sc = hn::Set(d, ss[g]), of = hn::Set(d, bb[g]);
    int64_t i = 0;
    for (; i + 4 * N <= G; i += 4 * N) {
      const int64_t k = g * G + i;
      const auto q = LoadU8(p + k / 2), r = LoadU8(p + k / 2 + N);
      a0 = hn::MulAdd(hn::MulAdd(hn::ConvertTo(d, hn::And(q, k15)), sc, of), hn::LoadU(d, x + k),
                      a0);
      a1 = hn::MulAdd(hn::MulAdd(hn::ConvertTo(d, hn::ShiftRight<4>(q)), sc, of),
                      hn::LoadU(d, x + k + N), a1);
      a2 = hn::MulAdd(hn::MulAdd(hn::ConvertTo(d, hn::And(r, k15)), sc, of),
                      hn::LoadU(d, x + k + 2 * N), a2);
      a3 = hn::MulAdd(hn::MulAdd(hn::ConvertTo(d, hn::ShiftRight<4>(r)), sc, of),
                      hn::LoadU(d, x + k + 3 * N), a3);
    }
    for (; i < G; i += 2 * N) {
      const int64_t k = g * G + i;
      const auto q = LoadU8(p + k / 2);
      a0 = hn::MulAdd(hn::MulAdd(hn::ConvertTo(d, hn::And(q, k15)), sc, of), hn::LoadU(d, x + k),
                      a0);
      a1 = hn::MulAdd(hn::MulAdd(hn::ConvertTo(d, hn::ShiftRight<4>(q)), sc, of),
                      hn::LoadU(d, x + k + N), a1);
    }
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
}

// SmallM's row loop: decode(n, sink) feeds row n's weight vectors to sink.
// Spread: prefetch as the row advances (float rows, below) instead of a
// burst per row.
template <int MB, bool E, bool Spread, class DecodeRow>
HWY_INLINE void SmallMRows(const float* const* x, int64_t m0, float* Y, int64_t ldy, int64_t n0,
                           int64_t n1, const LowRankTile* epi, const TensorView& w, int64_t K,
                           const DecodeRow& decode) {
  const DF d;
  constexpr int kChains = MB == 1 ? 4 : 2;  // independent FMA chains per row
  const int64_t row_bytes = w.row_bytes(), esize = row_bytes / K, step = 2 * hn::Lanes(d) * esize;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w.row<const uint8_t>(n);
    if constexpr (!Spread) PrefetchAhead(row, row_bytes);
    VF acc[kChains][MB];
    for (int c = 0; c < kChains; ++c)
      for (int m = 0; m < MB; ++m) acc[c][m] = hn::Zero(d);
    auto sink = [&](int64_t k, VF w, auto parity) HWY_ATTR {
      constexpr int c = decltype(parity)::value % kChains;
      if constexpr (Spread && decltype(parity)::value == 0) PrefetchAhead(row + k * esize, step);
      for (int m = 0; m < MB; ++m) acc[c][m] = hn::MulAdd(w, hn::LoadU(d, x[m] + k), acc[c][m]);
    };
    decode(n, sink);
    if constexpr (E)
      for (int m = 0; m < MB; ++m)
        acc[0][m] = LowRankDot(epi->brow(n), epi->urow(m0 + m), epi->rp, acc[0][m]);
    for (int m = 0; m < MB; ++m) {
      VF t = acc[0][m];
      for (int c = 1; c < kChains; ++c) t = hn::Add(t, acc[c][m]);
      Y[(m0 + m) * ldy + n] = hn::GetLane(hn::SumOfLanes(d, t));
    }
  }
}

// Y[m, n] for n in [n0, n1) and MB activation rows: each weight vector is
// decoded once and FMA'd into MB pairs of accumulators.
// E: with the epilogue (epi non-null); a template argument so the plain
// product's code is what it was (a runtime branch here made GCC spill).
template <int MB, bool E = false>
void SmallM(RowDecoder& dec, const PreparedX& X, int64_t m0, float* Y, int64_t ldy, int64_t n0,
            int64_t n1, const LowRankTile* epi) {
  const float* x[MB];
  for (int m = 0; m < MB; ++m) x[m] = X.row(m0 + m);
  if (MB == 1 && dec.path == Path::kMlx && dec.W.mlx_bits == 4) {
    const Matrix& W = dec.W;
    const int64_t groups = W.k / W.mlx_group;
    float* ss = dec.scratch.data();
    for (int64_t n = n0; n < n1; ++n) {
      DequantizeRow(W.scales.dtype, W.scales.row(n), ss, groups);
      DequantizeRow(W.biases.dtype, W.biases.row(n), ss + groups, groups);
      float y = MlxDot4(dec.MlxCodes(n), ss, ss + groups, W.k, W.mlx_group, x[0]);
      if constexpr (E)
        y += hn::GetLane(
            hn::SumOfLanes(DF(), LowRankDot(epi->brow(n), epi->urow(m0), epi->rp, hn::Zero(DF()))));
      Y[m0 * ldy + n] = y;
    }
    return;
  }
  // Float rows (f16: 4 KiB at K = 2048) are prefetched into L2 as the decode
  // advances (the lines of each pair of vectors, kAheadBytes on) rather than
  // as one burst of 32-64 prefetches per row, which left F16 decode at 3.7
  // tok/s on one thread where this streams 5.3 (1B, Xeon KVM guest); into L2,
  // not L1: BF16 from DRAM streamed 0.86-0.93 of a plain read against
  // 0.81-0.84 (performance.md, session 43).
  // Each float storage gets a loop of its own: inside the switch over every
  // decoder GCC kept the accumulators on the stack (a store per FMA), which
  // held F16 decode to 13.7 GB/s on Zen 5 where f32 streamed 22.8.
  const TensorView& w = dec.W.w;
  const int64_t K = dec.W.k;
  switch (dec.path) {
    case Path::kF16:
      return SmallMRows<MB, E, true>(x, m0, Y, ldy, n0, n1, epi, w, K,
                                     [&](int64_t n, auto& sink) HWY_ATTR {
                                       DecodeHalf<hwy::float16_t>(w.row<const uint8_t>(n), K, sink);
                                     });
    case Path::kBF16:
      return SmallMRows<MB, E, true>(
          x, m0, Y, ldy, n0, n1, epi, w, K, [&](int64_t n, auto& sink) HWY_ATTR {
            DecodeHalf<hwy::bfloat16_t>(w.row<const uint8_t>(n), K, sink);
          });
    case Path::kF32:
      return SmallMRows<MB, E, true>(x, m0, Y, ldy, n0, n1, epi, w, K,
                                     [&](int64_t n, auto& sink)
                                         HWY_ATTR { DecodeF32(w.row<const uint8_t>(n), K, sink); });
    default:
      return SmallMRows<MB, E, false>(x, m0, Y, ldy, n0, n1, epi, w, K,
                                      [&](int64_t n, auto& sink) HWY_ATTR { dec.Decode(n, sink); });
  }
}

// block(Par<rem>{}, m) for 0 < rem <= R: the rows after the last whole tile
// as one tile of their own height (the same chains, so the same bits).
template <int R, class Block>
HWY_INLINE void GemmRemainder(int rem, int64_t m, Block& block) {
  if constexpr (R >= 1) {
    if (rem == R) return block(Par<R>{}, m);
    GemmRemainder<R - 1>(rem, m, block);
  }
}

// Rows [m0, m1) of X over columns [k0, k1) of one k-major panel that holds
// W's columns from kx on (the panel row of column k is k - kx): kGemmMR rows
// a tile, then the remainder as one shorter tile. n, nr: the panel's first W
// row and its count; bp: B's panel (E).
template <int NV, bool E>
HWY_INLINE void GemmPanel(const float* panel, int64_t kx, int64_t k0, int64_t k1, bool first,
                          bool last, const PreparedX& X, int64_t m0, int64_t m1, float* Y,
                          int64_t ldy, int64_t n, int64_t nr, const float* bp,
                          const LowRankTile* epi) {
  const int64_t r = epi ? epi->r : 0;
  auto block = [&](auto height, int64_t m) HWY_ATTR {
    constexpr int R = decltype(height)::value;
    const float* x[R];
    float* y[R];
    const float* u[R] = {};
    for (int i = 0; i < R; ++i) {
      x[i] = X.row(m + i) + kx;
      y[i] = Y + (m + i) * ldy + n;
      if constexpr (E) u[i] = epi->urow(m + i);
    }
    GemmTile<R, NV, E>(panel, x, k0 - kx, k1 - kx, first, last, y, nr, bp, u, r);
  };
  int64_t m = m0;
  for (; m + kGemmMR <= m1; m += kGemmMR) block(Par<kGemmMR>{}, m);
  GemmRemainder<kGemmMR - 1>(int(m1 - m), m, block);
}

// B's rows [n, n + nr) as a k-major panel bp [r, NR] (zeros past nr).
void PackLowRank(const LowRankTile& epi, int64_t n, int64_t nr, int64_t NR, float* bp) {
  for (int64_t j = 0; j < epi.r; ++j)
    for (int64_t i = 0; i < NR; ++i) bp[j * NR + i] = i < nr ? epi.brow(n + i)[j] : 0.0f;
}

// Rows [n0, n1) of W against all M rows of X as an outer-product GEMM
// (gemm-inl.h). W's rows are decoded a vector's worth at a time and
// transposed in registers into k-major panels [K, NR], NR = NV vectors of
// rows; f32 rows are transposed straight from W. Sizes: Blocking().
//
// Where the storage decodes column ranges (f32, f16, bf16 and the
// 32-element blocks Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: DecodeColumns), each panel
// is built KC columns at a time (a slice) and a block of X's rows runs over
// that slice at once; W is decoded once per row block (all M where X
// fits). Other storage (the K-quants, whose 256-element super-blocks do not
// fit every KC, MLX and the column groups) decodes whole panels, in groups
// where X is larger than 512 KiB, and for each block of KC columns every
// panel of the group runs all M rows.
//
// Every output is one FMA chain in k order (then its r epilogue terms), so
// the tile height, the k blocks, the panel layout and the thread split
// change no bit: rows of a call of any M > 4 are bit-identical to the same
// rows in any other call.
template <int NV, bool E>
void GemmRows(RowDecoder& dec, const PreparedX& X, int64_t M, float* Y, int64_t ldy, int64_t n0,
              int64_t n1, const LowRankTile* epi, bool accumulate) {
  const DF d;
  const int64_t L = hn::Lanes(d), NR = NV * L;
  const Matrix& W = dec.W;
  const int64_t K = W.k, kp = (K + L - 1) / L * L;  // panel rows: K padded to whole blocks
  const bool direct = dec.path == Path::kF32;       // f32 rows are the strips' source as they are
  const bool columns = direct || dec.path == Path::kF16 || dec.path == Path::kBF16 ||
                       dec.path == Path::kQ8_0 || dec.path == Path::kQ4_0 ||
                       dec.path == Path::kQ4_1 || dec.path == Path::kQ5_0 ||
                       dec.path == Path::kQ5_1;
  const int64_t r = epi ? epi->r : 0;
  const GemmBlocking sizes = Blocking();
  std::vector<float> bp(r * NR);
  AlignedBuffer zero_buf(kp * sizeof(float));  // rows past n1
  // Packs the NV strips of the NR rows from n (nr of them real; the rest read
  // zeros) over `cols` columns from k0 into out: f32 rows are read in place,
  // the others decoded by decode(row, dst) into scratch rows ld apart.
  auto pack = [&](int64_t n, int64_t nr, int64_t k0, int64_t cols, float* scratch, int64_t ld,
                  float* out, auto&& decode) HWY_ATTR {
    for (int v = 0; v < NV; ++v) {
      const float* src[hn::MaxLanes(d)];
      for (int64_t i = 0; i < L; ++i) {
        const int64_t row = v * L + i;
        if (row >= nr) {
          src[i] = zero_buf.as<float>();
        } else if (direct) {
          src[i] = W.w.row<const float>(n + row) + k0;
        } else {
          float* dst = scratch + i * ld;
          decode(n + row, dst);
          src[i] = dst;
        }
      }
      PackStrip(src, cols, NR, out + v * L);
    }
  };
  if (columns) {
    // KC: a multiple of DecodeColumns' 2 vectors (K is too), at most K's.
    const int64_t KC =
        std::clamp<int64_t>(sizes.slice / (NR * 4) / (2 * L) * (2 * L), 2 * L,
                            std::max<int64_t>(2 * L, (K + 2 * L - 1) / (2 * L) * (2 * L)));
    const int64_t kblocks = std::max<int64_t>(1, (K + KC - 1) / KC);  // K = 0: Y = 0
    AlignedBuffer slice_buf(KC * NR * sizeof(float)), rows_buf(L * KC * sizeof(float));
    float* slice = slice_buf.as<float>();
    const int64_t x_cols = sizes.x_per_slice ? std::min(K, KC) : K;
    const int64_t mc =
        std::max<int64_t>(kGemmMR, sizes.x_rows / (std::max<int64_t>(x_cols, 1) * 4));
    for (int64_t m0 = 0; m0 < M; m0 += mc)
      for (int64_t n = n0; n < n1; n += NR) {
        const int64_t nr = std::min(NR, n1 - n);
        if constexpr (E) PackLowRank(*epi, n, nr, NR, bp.data());
        for (int64_t b = 0; b < kblocks; ++b) {
          const int64_t k0 = b * KC, k1 = std::min(K, k0 + KC);
          pack(n, nr, k0, k1 - k0, rows_buf.as<float>(), KC, slice, [&](int64_t row, float* dst) {
            const bool ok = DecodeColumns(dec.path, W, row, k0, k1 - k0, dst);
            LUMEN_DCHECK(ok);
            (void)ok;
          });
          GemmPanel<NV, E>(slice, k0, k0, k1, b == 0 && !accumulate, b == kblocks - 1, X, m0,
                           std::min(M, m0 + mc), Y, ldy, n, nr, bp.data(), epi);
        }
      }
    return;
  }
  const int64_t panels = (n1 - n0 + NR - 1) / NR;
  const int64_t group = M * K * 4 <= (512 << 10) ? 1 : sizes.group / (kp * NR * 4);
  const int64_t NP = std::min(panels, std::clamp<int64_t>(group, 1, 16));
  const int64_t KC = std::max<int64_t>(L, sizes.panel_slice / (NR * 4) / L * L);
  const int64_t kblocks = std::max<int64_t>(1, (K + KC - 1) / KC);  // K = 0: Y = 0
  AlignedBuffer panel_buf(NP * kp * NR * sizeof(float));
  AlignedBuffer rows_buf(direct ? 0 : L * kp * sizeof(float));  // one strip's decoded rows
  std::vector<float> bpanel(NP * r * NR);
  for (int64_t g = n0; g < n1; g += NP * NR) {
    const int64_t np = std::min(NP, (n1 - g + NR - 1) / NR);
    for (int64_t p = 0; p < np; ++p) {
      const int64_t n = g + p * NR, nr = std::min(NR, n1 - n);
      float* panel = panel_buf.as<float>() + p * kp * NR;
      pack(n, nr, 0, kp, rows_buf.as<float>(), kp, panel, [&](int64_t row, float* dst) HWY_ATTR {
        auto store = [&](int64_t k, VF w, auto) HWY_ATTR { hn::StoreU(w, d, dst + k); };
        dec.Decode(row, store);
      });
      if constexpr (E) PackLowRank(*epi, n, nr, NR, bpanel.data() + p * r * NR);
    }
    for (int64_t b = 0; b < kblocks; ++b) {
      const int64_t k0 = b * KC, k1 = std::min(K, k0 + KC);
      for (int64_t p = 0; p < np; ++p) {
        const int64_t n = g + p * NR, nr = std::min(NR, n1 - n);
        GemmPanel<NV, E>(panel_buf.as<float>() + p * kp * NR, 0, k0, k1, b == 0 && !accumulate,
                         b == kblocks - 1, X, 0, M, Y, ldy, n, nr, bpanel.data() + p * r * NR, epi);
      }
    }
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
LUMEN_INTRINSICS_BEGIN
// Q4_0 column groups straight into a bf16 panel row: a block's sixteen
// possible weights (j - 8) s, j = 0..15, rounded once into a table, and its
// 32 codes looked up by vpermw. The products and the rounding are those of
// the f32 decode and vcvtneps2bf16 (multiplication commutes exactly), so the
// bits are the same, for about two thirds of the operations (session 27).
// The plain blocks after the last group go to `store` (a sink that rounds
// f32 vectors into out) by the plain Q4_0 decoder, as DecodeColumnGroups
// does. Requires AVX512-BF16 (the route's own condition).
template <class Sink>
HWY_INLINE void DecodeQ4_0ColumnsBf16(const uint8_t* row, int64_t K, uint16_t* out, Sink& store) {
  const __m512 j8 = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  // Words 0-15 take a code byte's low nibble (elements 0-15), 16-31 its high.
  const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  const __m512i m15 = _mm512_set1_epi16(15);
  int64_t at = 0;
  for (; at + kColsElems <= K; at += kColsElems) {
    const uint8_t* g = row + at / kQK * sizeof(BlockQ4_0);
    const ColsFields f = ColsFieldsAt(DType::kQ4_0, g);
    const TransposedGroup<false> group(g, f);
    for (int b = 0; b < kColsBlocks; ++b) {
      const __m512 w = _mm512_mul_ps(j8, _mm512_set1_ps(LoadF16(g + f.d + 2 * b)));
      __m256i table;
      asm("vcvtneps2bf16 %1, %0" : "=v"(table) : "v"(w));
      const __m128i q =
          _mm_load_si128(reinterpret_cast<const __m128i*>(group.qs[b % 4] + 16 * (b / 4)));
      const __m512i idx = _mm512_and_si512(
          _mm512_srlv_epi16(_mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(q)), shift), m15);
      _mm512_storeu_si512(out + at + kQK * b,
                          _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(table)));
    }
  }
  auto shifted = [&](int64_t k, VF w, auto p) HWY_ATTR { store(at + k, w, p); };
  DecodeStorage(Path::kQ4_0, row + at / kQK * sizeof(BlockQ4_0), K - at, shifted);
}
LUMEN_INTRINSICS_END
#endif

// The bf16 route's panels (matmul_bf16.h): rows [n0, n1) of W decoded P at a
// time, rounded to bf16, and dotted with the bf16 activation rows xb [M, ld]
// by the AVX512-BF16 kernel, or, given xpacked (AmxPackX of xb), by the AMX
// tiles (matmul_bf16_amx.h). accumulate: Y += the product.
void Bf16Panels(RowDecoder& dec, const uint16_t* xb, const uint16_t* xpacked, int64_t ld, int64_t M,
                float* Y, int64_t ldy, int64_t n0, int64_t n1, bool accumulate,
                AlignedBuffer* scratch = nullptr) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  const int64_t K = dec.W.k, ldp = (K + N - 1) / N * N;
  // Half of L2 for the panel; a multiple of the tile height (4 rows
  // for AVX-512, two 16-row A tiles for AMX).
  const int64_t tile = xpacked ? 2 * kAmxRows : 4;
  const int64_t P = std::clamp<int64_t>((512 * 1024 / (ld * 2)) / tile * tile, tile, 128);
  // Zero-filled when allocated, so rows past np are finite; a reused scratch
  // holds earlier panels' (finite) rows there.
  AlignedBuffer own;
  AlignedBuffer& panel_buf = scratch ? *scratch : own;
  if (panel_buf.size() < size_t(P * ld) * sizeof(uint16_t))
    panel_buf = AlignedBuffer(P * ld * sizeof(uint16_t));
  uint16_t* panel = panel_buf.as<uint16_t>();
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  LUMEN_INTRINSICS_BEGIN
  // Each decoded vector rounded straight into the panel: the instruction
  // ToBf16Padded uses (same bits), without the f32 row's store and reload
  // (a quarter of the panel decode). Inline asm because Highway 1.0's AVX3
  // target does not enable AVX512-BF16; this route runs only where the CPU
  // has it (UsesBf16Route). Decoders cover [0, ldp) with zeros past K.
  uint16_t* dst = nullptr;
  auto store = [&](int64_t k, VF w, auto) HWY_ATTR {
    __m256i h;
    asm("vcvtneps2bf16 %1, %0" : "=v"(h) : "v"(w.raw));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k), h);
  };
  const int64_t row_bytes = dec.W.w.stride[0];
  auto decode_row = [&](int64_t r, uint16_t* out) HWY_ATTR {
    dst = out;
    // The rows a few ahead into L2: the panel decode reads each weight once
    // per chunk, straight from DRAM, and stalled on its lines.
    const uint8_t* row = dec.W.w.row<const uint8_t>(r);
    PrefetchAhead(row, row_bytes);
    if (dec.path == Path::kQ4_0Cols)
      DecodeQ4_0ColumnsBf16(row, K, out, store);
    else
      dec.Decode(r, store);
    std::fill(out + ldp, out + ld, uint16_t{0});
  };
  LUMEN_INTRINSICS_END
#else
  AlignedBuffer row_buf(ldp * sizeof(float));
  float* row = row_buf.as<float>();
  auto store = [&](int64_t k, VF w, auto) HWY_ATTR { hn::Store(w, d, row + k); };
  auto decode_row = [&](int64_t r, uint16_t* out) HWY_ATTR {
    dec.Decode(r, store);
    ToBf16Padded(row, K, ld, out);
  };
#endif
  for (int64_t n = n0; n < n1; n += P) {
    const int64_t np = std::min(P, n1 - n);
    for (int64_t i = 0; i < np; ++i) decode_row(n + i, panel + i * ld);
    if (xpacked) {
      AmxBf16PanelProduct(panel, np, xpacked, M, ld, Y, ldy, n, accumulate);
    } else {
      Bf16PanelProduct(panel, np, xb, M, ld, Y, ldy, n, accumulate);
    }
  }
}

// The AMX variant takes products of at least kAmxMinRows rows where the CPU
// and the kernel allow it; it needs xb packed into its B-tile layout (xp).
bool UseAmx(int64_t M) { return M >= kAmxMinRows && AmxBf16Usable(); }

// Bf16Panels, packing xb for the AMX tiles first when they take the product.
void Bf16PanelsFor(RowDecoder& dec, const uint16_t* xb, int64_t ld, int64_t M, float* Y,
                   int64_t ldy, int64_t n0, int64_t n1, bool accumulate) {
  if (!UseAmx(M)) return Bf16Panels(dec, xb, nullptr, ld, M, Y, ldy, n0, n1, accumulate);
  AlignedBuffer xp(AmxPackedXBytes(M, ld));
  AmxPackX(xb, M, ld, xp.as<uint16_t>());
  Bf16Panels(dec, xb, xp.as<uint16_t>(), ld, M, Y, ldy, n0, n1, accumulate);
}

// The bf16 route of MatMulRows (M > 4): W's rows decoded into row-major
// panels, rounded to bf16 with the X rows so each dot instruction does 32
// products. Every thread converts all M rows of X: M K conversions against
// M K (n1 - n0) products. Plain products do not come here: MatMul,
// MatMulMany and MatMulBf16 convert X once per call (Bf16OnPool); this is
// the path of the LoRA epilogue's products (MatMulLowRank).
void LargeMBf16(RowDecoder& dec, const PreparedX& X, int64_t M, float* Y, int64_t ldy, int64_t n0,
                int64_t n1, bool accumulate) {
  const int64_t K = dec.W.k;
  const int64_t ld = (K + kBf16RowAlign - 1) / kBf16RowAlign * kBf16RowAlign;
  AlignedBuffer xb_buf(M * ld * sizeof(uint16_t));
  uint16_t* xb = xb_buf.as<uint16_t>();
  for (int64_t m = 0; m < M; ++m) ToBf16Padded(X.row(m), K, ld, xb + m * ld);
  Bf16PanelsFor(dec, xb, ld, M, Y, ldy, n0, n1, accumulate);
}

}  // namespace

// SmallM over all M rows: 4 at a time, then the remainder.
template <bool E>
void SmallRows(RowDecoder& dec, const PreparedX& x, int64_t M, float* Y, int64_t ldy, int64_t n0,
               int64_t n1, const LowRankTile* epi) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) SmallM<4, E>(dec, x, m, Y, ldy, n0, n1, epi);
  switch (M - m) {
    case 3:
      return SmallM<3, E>(dec, x, m, Y, ldy, n0, n1, epi);
    case 2:
      return SmallM<2, E>(dec, x, m, Y, ldy, n0, n1, epi);
    case 1:
      return SmallM<1, E>(dec, x, m, Y, ldy, n0, n1, epi);
    default:
      return;
  }
}

// Rows [n0, n1) of W against all M rows of X; lr (may be null): the fused
// LoRA epilogue (matmul.h, MatMulLowRank). accumulate: Y += the product, the
// GEMM's chains continued from Y (M > 4 only: MatMulAccumulate).
void MatMulRows(const Matrix& W, const float* X, int64_t M, int64_t ldx, float* Y, int64_t ldy,
                int64_t n0, int64_t n1, const LowRank* lr, bool accumulate) {
  RowDecoder dec(W);
  const PreparedX x(W, dec.path, X, M, ldx);
  std::optional<LowRankTile> tile;
  if (lr) tile.emplace(*lr, M, n0, n1);
  const LowRankTile* epi = tile ? &*tile : nullptr;
  if (UsesBf16Route(W, M)) {
    LargeMBf16(dec, x, M, Y, ldy, n0, n1, accumulate);
    if (epi) AddLowRankRows(*epi, M, Y, ldy, n0, n1);  // the bf16 panels are not our tiles
    return;
  }
  if (M > 4) {  // reads X only up to K
    // One vector of W's rows (LoRA's rank-r factors): one-vector panels, the
    // same chains with no columns of zeros.
    if (n1 - n0 <= int64_t(hn::Lanes(DF())))
      return epi ? GemmRows<1, true>(dec, x, M, Y, ldy, n0, n1, epi, accumulate)
                 : GemmRows<1, false>(dec, x, M, Y, ldy, n0, n1, nullptr, accumulate);
    return epi ? GemmRows<kGemmNV, true>(dec, x, M, Y, ldy, n0, n1, epi, accumulate)
               : GemmRows<kGemmNV, false>(dec, x, M, Y, ldy, n0, n1, nullptr, accumulate);
  }
  LUMEN_CHECK(!accumulate);
  if (epi) return SmallRows<true>(dec, x, M, Y, ldy, n0, n1, epi);
  SmallRows<false>(dec, x, M, Y, ldy, n0, n1, nullptr);
}

// Y[:, n0:n1) += scale U B^T (the second pass; matmul.h AddLowRank).
void AddLowRankCols(const LowRank& lr, int64_t M, float* Y, int64_t ldy, int64_t n0, int64_t n1) {
  const LowRankTile tile(lr, M, n0, n1);
  AddLowRankRows(tile, M, Y, ldy, n0, n1);
}

// MatMulBf16, step 1: rows [m0, m1) of X as the decoders index them (MLX
// 4-bit permuted), rounded to bf16 into xb (stride ld, zero-padded).
void PrepareBf16Rows(const Matrix& W, const float* X, int64_t ldx, int64_t m0, int64_t m1,
                     uint16_t* xb, int64_t ld) {
  const PreparedX x(W, PathFor(W), X + m0 * ldx, m1 - m0, ldx);
  for (int64_t m = m0; m < m1; ++m) ToBf16Padded(x.row(m - m0), W.k, ld, xb + m * ld);
}

// Step 2: rows [n0, n1) of W against the prepared rows (xpacked: their AMX
// tile layout, or null where the AVX512-BF16 kernel takes the product).
void MatMulRowsBf16(const Matrix& W, const uint16_t* xb, const uint16_t* xpacked, int64_t ld,
                    int64_t M, float* Y, int64_t ldy, int64_t n0, int64_t n1, bool accumulate,
                    AlignedBuffer* scratch) {
  RowDecoder dec(W);
  Bf16Panels(dec, xb, xpacked, ld, M, Y, ldy, n0, n1, accumulate, scratch);
}

// 1 when PreparedX reorders X for W (the MLX 4-bit decoder's element order).
int PermutesX(const Matrix& W) { return PathFor(W) == Path::kMlx && W.mlx_bits == 4 ? 1 : 0; }

// 0: generic (scalar dequantize to scratch); 1: fused decoder.
int FusedPath(const Matrix& W) { return PathFor(W) == Path::kGeneric ? 0 : 1; }

}  // namespace lumen::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lumen::kernels {

// Routes (core/route.h). dtype is the weight's storage: "mlx4"/"mlx8" for MLX.
LUMEN_ROUTE(
    matmul_decode_fused,
    {.node = "matmul.decode",
     .name = "simd-fused",
     .tier = Tier::kL2,
     .oracle = "MatMulRef (matmul_ref.h: dequantize, double accumulation)",
     .bound = "relative error per output within the bound of matmul_test.cc",
     .tests = "MatMulTest.EveryTargetDtypeAndShapeWithinBound;MatMulTest."
              "ThreadSplitMatchesSingleThreadBitForBit;MatMulTest."
              "RandomBlocksWithSpecialScalesWithinBound;QuantTypes.QuantizedMatchesDequantized",
     .when = "dtype=f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q2_k|q3_k|q4_k|q5_k|q6_k|mlx4|mlx8",
     .priority = 10});
LUMEN_ROUTE(
    matmul_decode_scratch,
    {.node = "matmul.decode",
     .name = "dequant-row",
     .tier = Tier::kL2,
     .oracle = "MatMulRef (matmul_ref.h)",
     .bound = "relative error per output within the bound of matmul_test.cc",
     .tests =
         "MatMulTest.EveryTargetDtypeAndShapeWithinBound;QuantTypes.QuantizedMatchesDequantized",
     .priority = 0});
LUMEN_ROUTE(
    matmul_prefill_fused,
    {.node = "matmul.prefill",
     .name = "simd-panels",
     .tier = Tier::kL2,
     .oracle = "MatMulRef (matmul_ref.h)",
     .bound = "relative error per output within the bound of matmul_test.cc",
     .tests = "MatMulTest.EveryTargetDtypeAndShapeWithinBound;MatMulTest."
              "ManyEqualsOneByOneBitForBit;MatMulTest.FusedRoutesOnTheBestTarget;"
              "MatMulTest.RowsBitIdenticalWhateverTheCallsRowCount;MatMulTest."
              "RandomBlocksWithSpecialScalesWithinBound;MatMulTest."
              "AccumulateOverColumnSlicesContinuesTheProduct;FfnPieces.GiveTheWholeWidthsLogits",
     .when = "dtype=f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q2_k|q3_k|q4_k|q5_k|q6_k|mlx4|mlx8",
     .priority = 10});
LUMEN_ROUTE(matmul_prefill_scratch,
            {.node = "matmul.prefill",
             .name = "dequant-row",
             .tier = Tier::kL2,
             .oracle = "MatMulRef (matmul_ref.h)",
             .bound = "relative error per output within the bound of matmul_test.cc",
             .tests = "MatMulTest.EveryTargetDtypeAndShapeWithinBound",
             .priority = 0});
// The fused LoRA epilogue (matmul.h, MatMulLowRank; MatMulTLowRank: matmul_t.cc).
LUMEN_ROUTE(matmul_lora_epilogue,
            {.node = "matmul.lora",
             .name = "simd-epilogue",
             .tier = Tier::kL2,
             .oracle = "MatMulLowRankRef (matmul_ref.h: dequantize, double accumulation)",
             .bound = "per output (K + r + 3) 2^-24 (sum |w x| + sum |s u b|) (matmul.h); not "
                      "bit-identical to the unfused order",
             .tests = "MatMulLowRank.EpilogueWithinBoundOnEveryTargetAndStorage;MatMulLowRank."
                      "OtherRoutesAddTheTermInASecondPass;MatMulLowRank."
                      "RowsBitIdenticalWhateverTheCallsRowCount",
             .priority = 10});
HWY_EXPORT(MatMulRows);
HWY_EXPORT(PrepareBf16Rows);
HWY_EXPORT(MatMulRowsBf16);
HWY_EXPORT(PermutesX);
HWY_EXPORT(AddLowRankCols);
HWY_EXPORT(FusedPath);

namespace {

// The products' rows laid end to end: fn(i, lo, hi) for each product i
// with rows [lo, hi) inside [b, e).
template <class Fn>
void ForEachSlice(std::span<const MatMulOut> outs, int64_t b, int64_t e, const Fn& fn) {
  int64_t off = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const int64_t n = outs[i].w->n;
    const int64_t lo = std::max<int64_t>(b - off, 0), hi = std::min<int64_t>(e - off, n);
    if (lo < hi) fn(i, lo, hi);
    off += n;
  }
}

// W's rows against X (lr null: the plain product), contiguous row ranges
// per thread (each thread streams its own part of W); grain 16 keeps the
// prefill panels (4 rows) and cache lines whole. Decode-sized products (M
// up to 8) let a thread that is done take rows from the end of another's
// range (ParallelForStealing); larger ones keep one call per thread, as the
// exact route's prefill prepares X per call.
void RowsOnPool(const Matrix& W, const float* X, int64_t M, int64_t ldx, float* Y, int64_t ldy,
                const LowRank* lr, ThreadPool* pool, bool accumulate = false) {
  auto rows = [&](int64_t b, int64_t e, int) {
    HWY_DYNAMIC_DISPATCH(MatMulRows)(W, X, M, ldx, Y, ldy, b, e, lr, accumulate);
  };
  ParallelOrInline(pool, W.n, 32, 16, rows,
                   M <= 8 ? &ThreadPool::ParallelForStealing : &ThreadPool::ParallelFor);
}

// Weight rows per unit of the bf16 route's dynamic split: a multiple of every
// panel tile, small enough for 8+ units per thread in a 2048-row product.
constexpr int64_t kBf16Unit = 128;

// The bf16 route over the pool: X rounded to bf16 and, where the AMX tiles
// take the product, packed into their layout once per call for every thread
// and product, then W's rows in first-come units (below). Each thread used to
// do both for every product it ran (QKV: three times), T times the work on T
// threads; on 2 threads the 512-token prefill did not measurably change (the
// AMX tiles and the panel decode bound it). One copy per X layout among the
// products (MLX 4-bit reorders X).
void Bf16OnPool(std::span<const MatMulOut> outs, const float* X, int64_t M, int64_t ldx,
                ThreadPool* pool, bool accumulate = false) {
  const int64_t K = outs[0].w->k;
  const int64_t ld = (K + kBf16RowAlign - 1) / kBf16RowAlign * kBf16RowAlign;
  const bool amx = M >= kAmxMinRows && AmxBf16Usable();
  struct Copy {
    int layout;
    AlignedBuffer xb, xp;
  };
  std::vector<Copy> copies;
  copies.reserve(2);  // of keeps pointers into it
  std::vector<const Copy*> of(outs.size());
  int64_t total = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const Matrix& W = *outs[i].w;
    LUMEN_CHECK(W.k == K);
    const int layout = HWY_DYNAMIC_DISPATCH(PermutesX)(W);
    auto it = std::find_if(copies.begin(), copies.end(),
                           [&](const Copy& c) { return c.layout == layout; });
    if (it == copies.end()) {
      Copy c{layout, AlignedBuffer(size_t(M) * ld * sizeof(uint16_t)), {}};
      uint16_t* xb = c.xb.as<uint16_t>();
      ParallelOrInline(pool, M, 8, 4, [&](int64_t b, int64_t e, int) {
        HWY_DYNAMIC_DISPATCH(PrepareBf16Rows)(W, X, ldx, b, e, xb, ld);
      });
      if (amx) {
        c.xp = AlignedBuffer(AmxPackedXBytes(M, ld));
        AmxPackX(xb, M, ld, c.xp.as<uint16_t>());
      }
      copies.push_back(std::move(c));
      it = copies.end() - 1;
    }
    of[i] = &*it;
    total += W.n;
  }
  std::vector<AlignedBuffer> panels(pool ? pool->size() : 1);  // each thread's, reused
  auto rows = [&](int64_t b, int64_t e, int thread) {
    ForEachSlice(outs, b, e, [&](size_t i, int64_t lo, int64_t hi) {
      const MatMulOut& o = outs[i];
      const uint16_t* xp = amx ? of[i]->xp.as<uint16_t>() : nullptr;
      HWY_DYNAMIC_DISPATCH(MatMulRowsBf16)
      (*o.w, of[i]->xb.as<uint16_t>(), xp, ld, M, o.y, o.ldy, lo, hi, accumulate, &panels[thread]);
    });
  };
  // Units of kBf16Unit rows taken first come, first served: a row's output
  // does not depend on which thread computes it, and a static half each left
  // the faster thread waiting 9-12% of a two-thread prefill on a KVM guest.
  ParallelOrInline(pool, total, 32, kBf16Unit, rows, &ThreadPool::ParallelForDynamic);
}

}  // namespace

void MatMul(const Matrix& W, const float* X, int64_t M, int64_t ldx, float* Y, int64_t ldy,
            ThreadPool* pool) {
  if (UsesInt8Route(W, M)) return MatMulInt8(W, X, M, ldx, Y, ldy, pool);
  if (UsesBf16Route(W, M) && W.n > 0) {
    const MatMulOut out{&W, Y, ldy};
    return Bf16OnPool({&out, 1}, X, M, ldx, pool);
  }
  RowsOnPool(W, X, M, ldx, Y, ldy, nullptr, pool);
}

void MatMulMany(std::span<const MatMulOut> outs, const float* X, int64_t M, int64_t ldx,
                ThreadPool* pool) {
  const auto int8 = [M](const MatMulOut& o) { return UsesInt8Route(*o.w, M); };
  if (std::any_of(outs.begin(), outs.end(), int8)) {
    if (std::all_of(outs.begin(), outs.end(), int8)) return MatMulManyInt8(outs, X, M, ldx, pool);
    // Mixed routes (e.g. an F16 v beside Q4_0 q/k): one pass per route.
    std::vector<MatMulOut> a, b;
    for (const MatMulOut& o : outs) (int8(o) ? a : b).push_back(o);
    MatMulManyInt8(a, X, M, ldx, pool);
    return MatMulMany(b, X, M, ldx, pool);
  }
  const auto bf16 = [M](const MatMulOut& o) { return UsesBf16Route(*o.w, M); };
  if (!outs.empty() && std::all_of(outs.begin(), outs.end(), bf16))
    return Bf16OnPool(outs, X, M, ldx, pool);
  int64_t total = 0;
  for (const MatMulOut& o : outs) total += o.w->n;
  ParallelOrInline(pool, total, 32, 16, [&](int64_t b, int64_t e, int) {
    ForEachSlice(outs, b, e, [&](size_t i, int64_t lo, int64_t hi) {
      const MatMulOut& o = outs[i];
      HWY_DYNAMIC_DISPATCH(MatMulRows)(*o.w, X, M, ldx, o.y, o.ldy, lo, hi, nullptr, false);
    });
  });
}

void MatMulAccumulate(const Matrix& W, const float* X, int64_t M, int64_t ldx, float* Y,
                      int64_t ldy, ThreadPool* pool) {
  if (M <= 0 || W.n == 0) return;
  if (M > Int8MaxRows(W) && UsesInt8Route(W, M)) {  // the GEMM continues each chain
    const MatMulOut out{&W, Y, ldy};
    return MatMulManyInt8x2Gemm({&out, 1}, X, M, ldx, pool, true);
  }
  if (M <= 4 || UsesInt8Route(W, M)) {
    // Dot-shaped routes: each output is one sum, so the product goes to
    // scratch and is added (one f32 add per output).
    std::vector<float> t(size_t(M) * W.n);
    MatMul(W, X, M, ldx, t.data(), W.n, pool);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < W.n; ++n) Y[m * ldy + n] += t[m * W.n + n];
    return;
  }
  if (UsesBf16Route(W, M)) {
    const MatMulOut out{&W, Y, ldy};
    return Bf16OnPool({&out, 1}, X, M, ldx, pool, true);
  }
  RowsOnPool(W, X, M, ldx, Y, ldy, nullptr, pool, true);
}

bool MatMulIsFused(const Matrix& W) { return HWY_DYNAMIC_DISPATCH(FusedPath)(W) != 0; }

void MatMulBf16(const Matrix& W, const float* X, int64_t M, int64_t ldx, float* Y, int64_t ldy,
                ThreadPool* pool) {
  LUMEN_CHECK(CpuHasBf16());
  if (M <= 0 || W.n == 0) return;
  const MatMulOut out{&W, Y, ldy};
  Bf16OnPool({&out, 1}, X, M, ldx, pool);
}

void MatMulLowRank(const Matrix& W, const float* X, int64_t M, int64_t ldx, const LowRank& lr,
                   float* Y, int64_t ldy, ThreadPool* pool) {
  LUMEN_CHECK(lr.u && lr.v && lr.r >= 1 && lr.mask == nullptr);
  if (UsesInt8Route(W, M)) {  // the int8 tiles are not ours: a second pass over Y
    MatMulInt8(W, X, M, ldx, Y, ldy, pool);
    return AddLowRank(Y, ldy, M, W.n, lr, pool);
  }
  RowsOnPool(W, X, M, ldx, Y, ldy, &lr, pool);
}

void AddLowRank(float* Y, int64_t ldy, int64_t M, int64_t N, const LowRank& lr, ThreadPool* pool) {
  LUMEN_CHECK(lr.u && lr.v && lr.r >= 1 && lr.mask == nullptr);
  ParallelOrInline(pool, N, 32, 16, [&](int64_t b, int64_t e, int) {
    HWY_DYNAMIC_DISPATCH(AddLowRankCols)(lr, M, Y, ldy, b, e);
  });
}

}  // namespace lumen::kernels
#endif  // HWY_ONCE
