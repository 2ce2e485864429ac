// The AVX2 int8 row kernels for MLX affine 4- and 8-bit rows (matmul_q8_avx2.h):
// runs of blocks transposed in registers against activations laid out to
// match (Prepare's kMlx4Records / kMlx8Slices), the blocks after the last
// whole run in natural order.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "lumen/core/quant.h"
#include "lumen/kernels/matmul_q8_avx2_internal.h"
#include "lumen/kernels/prefetch.h"

namespace lumen::kernels::int8_avx2 {

#if defined(__x86_64__)

namespace {

// n f16 / bf16 / f32 values at src as floats (an MLX row's scales or
// biases): f16 and bf16 eight at a time, the rest by DequantizeRow (whose
// scalar conversion per value cost a quarter of an MLX row's time).
LUMEN_AVX2 inline void GroupFloats(DType t, const void* src, int64_t n, float* dst) {
  const auto* h = static_cast<const uint8_t*>(src);
  int64_t i = 0;
  if (t != DType::kF32)
    for (; i + 8 <= n; i += 8) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 2 * i));
      _mm256_storeu_ps(dst + i, t == DType::kF16 ? _mm256_cvtph_ps(v)
                                                 : _mm256_castsi256_ps(_mm256_slli_epi32(
                                                       _mm256_cvtepu16_epi32(v), 16)));
    }
  if (i < n) DequantizeRow(t, h + Info(t).block_bytes * i, dst + i, n - i);
}

// One activation block b of an MLX row (w = s q + o in its group) into acc[r]
// and off[r] for rows m0 .. m0 + MB - 1, in natural order (the blocks after a
// row's last whole run). 4-bit: byte j holds elements 2j (low nibble) and 2j +
// 1, so the block's 16 bytes' nibbles are interleaved back into element order;
// 8-bit: codes up to 255 would saturate vpmaddubsw's int16 pairs (2 x 255 x
// 127), so they go in as q - 128 (a signed byte: magnitudes against the
// activations carrying the signs, as Q8_0) and 128 x the activation lane sums
// come back in integers (exact: at most 32 x 128 x 32639 per lane); the bias
// multiplies the activation block sum.
template <int kBits, int MB, int L>
LUMEN_AVX2 inline void MlxBlock(const uint8_t* row, const Acts& a, int64_t m0, int64_t b, float s,
                                float o, __m256* acc, float* off) {
  __m256i codes;
  if constexpr (kBits == 4) {
    const uint8_t* blk = row + b * (kQK / 2);
    if (b % 4 == 0) PrefetchAhead(blk, 64);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk));
    const __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
    codes = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
  } else {
    const uint8_t* blk = row + b * kQK;
    if (b % 2 == 0) PrefetchAhead(blk, 64);
    codes = _mm256_xor_si256(Load32(blk), _mm256_set1_epi8(static_cast<char>(0x80)));
  }
  for (int r = 0; r < MB; ++r) {
    const int8_t* xq = a.Q(m0 + r, b);
    __m256i i;
    if constexpr (kBits == 4) {
      i = Dot<L>(codes, xq);
    } else {
      i = _mm256_add_epi32(DotSigned<L>(codes, xq),
                           _mm256_slli_epi32(Load32(a.Lanes(m0 + r, b)), 7));
    }
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(s * a.D(m0 + r)[b]), acc[r]);
    off[r] += o * a.S32(m0 + r)[b];
  }
}

// An MLX row's group scales and biases as floats (the kernels read eight
// from a run's first group, so eight zeros follow), the block -> group shift,
// and the group of each lane of a run whose lane l holds block lane_block(l),
// relative to the group of the run's first block.
struct MlxGroups {
  int shift;
  __m256i spread;
  float sc[kMlxMaxGroups + 8], bias[kMlxMaxGroups + 8];
};

LUMEN_AVX2 inline void LoadMlxGroups(const Matrix& W, int64_t n, int64_t (*lane_block)(int64_t),
                                     MlxGroups* g) {
  const int64_t groups = W.k / W.mlx_group;
  g->shift = W.mlx_group == 32 ? 0 : W.mlx_group == 64 ? 1 : 2;
  alignas(32) int32_t spread[8];
  for (int l = 0; l < 8; ++l) spread[l] = static_cast<int32_t>(lane_block(l) >> g->shift);
  g->spread = _mm256_load_si256(reinterpret_cast<const __m256i*>(spread));
  GroupFloats(W.scales.dtype, W.scales.row(n), groups, g->sc);
  GroupFloats(W.biases.dtype, W.biases.row(n), groups, g->bias);
  std::fill_n(g->sc + groups, 8, 0.0f);
  std::fill_n(g->bias + groups, 8, 0.0f);
}

// A row's blocks from b_begin on (after its last whole run) in natural order,
// then each activation row's sum into y.
template <int kBits, int MB, int L>
LUMEN_AVX2 inline void MlxTail(const uint8_t* row, const Acts& a, int64_t m0, const MlxGroups& g,
                               int64_t b_begin, __m256* acc, float* off, float* y, int64_t ldy) {
  for (int64_t b = b_begin; b < a.nb; ++b)
    MlxBlock<kBits, MB, L>(row, a, m0, b, g.sc[b >> g.shift], g.bias[b >> g.shift], acc, off);
  for (int r = 0; r < MB; ++r) y[r * ldy] = HSum(acc[r]) + off[r];
}

// MLX 4-bit rows against kMlx4Records activations: each whole run of 8
// blocks (128 code bytes) is transposed in registers, so that lane l of
// vector c is dword c of block MlxLaneBlock(l) (elements 8c .. 8c + 7, the
// even ones in the low nibbles); with the activations deinterleaved and in
// that lane order (Prepare), every product of a lane belongs to one block,
// and the lane work (conversion, scales, FMA, the biases through the block
// sums) is paid once per 8 blocks, as for the column groups, with no
// load-time rewrite (every other reader sees the file's bytes). A run's 4
// loads and 8 unpacks replace the natural kernel's per-block shuffles and
// scalar scale products (row 161 -> 91 ns at K = 2048 on Zen 2). The blocks
// after the last whole run take MlxBlock.
template <int MB, int L>
LUMEN_AVX2 void Mlx4RecordsRows(const Matrix& W, int64_t n, const Acts& a, int64_t m0, float* y,
                                int64_t ldy) {
  const uint8_t* row = W.w.row<const uint8_t>(n);
  MlxGroups g;
  LoadMlxGroups(W, n, MlxLaneBlock, &g);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc[MB];
  float off[MB] = {};
  for (int r = 0; r < MB; ++r) acc[r] = _mm256_setzero_ps();
  const int64_t runs = a.nb / 8;
  for (int64_t u = 0; u < runs; ++u) {
    const int64_t b0 = 8 * u;
    const uint8_t* p = row + b0 * (kQK / 2);
    PrefetchAhead(p, 128);
    __m256i v[4], t[4];  // v[k]: blocks 2k and 2k + 1
    for (int k = 0; k < 4; ++k) v[k] = Load32(p + 32 * k);
    TransposeDwords(v, t);
    __m256i codes[8];
    for (int c = 0; c < 4; ++c) {
      codes[c] = _mm256_and_si256(t[c], m4);
      codes[c + 4] = _mm256_and_si256(_mm256_srli_epi16(t[c], 4), m4);
    }
    const int64_t g0 = b0 >> g.shift;
    const __m256 sw = _mm256_permutevar8x32_ps(_mm256_loadu_ps(g.sc + g0), g.spread);
    const __m256 ow = _mm256_permutevar8x32_ps(_mm256_loadu_ps(g.bias + g0), g.spread);
    for (int r = 0; r < MB; ++r) {
      const __m256i i = RecordsDot<L, 8>(codes, a.Q(m0 + r, b0));
      const __m256 scale = _mm256_mul_ps(sw, _mm256_loadu_ps(a.D(m0 + r) + b0));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), scale, acc[r]);
      acc[r] = _mm256_fmadd_ps(ow, _mm256_loadu_ps(a.S32(m0 + r) + b0), acc[r]);
    }
  }
  MlxTail<4, MB, L>(row, a, m0, g, 8 * runs, acc, off, y, ldy);
}

// Lane l of a kMlx8Slices chunk holds block l % 4.
constexpr int64_t MlxSliceBlock(int64_t l) { return MlxLaneSlice(l) / 2; }

// MLX 8-bit rows against kMlx8Slices activations: the four blocks of a run
// (128 code bytes) transposed in registers within 128-bit halves, so that
// lane l of vector c is dword c + 4 (l / 4) of block l % 4 (slice
// MlxLaneSlice(l)): a lane's products belong to one half block. The codes go
// in as q - 128, as MlxBlock's (one vpmaddwd per record and level: two
// records' int16 pairs could overflow), and the 128 comes back with the bias:
// w = s (q - 128) + (b + 128 s), the second term through the slices' sums. The
// lane work is paid once per 4 blocks where MlxBlock pays it per block. The
// blocks after the last whole run take MlxBlock.
template <int MB, int L>
LUMEN_AVX2 void Mlx8SlicesRows(const Matrix& W, int64_t n, const Acts& a, int64_t m0, float* y,
                               int64_t ldy) {
  const uint8_t* row = W.w.row<const uint8_t>(n);
  MlxGroups g;
  LoadMlxGroups(W, n, MlxSliceBlock, &g);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 acc[MB];
  float off[MB] = {};
  for (int r = 0; r < MB; ++r) acc[r] = _mm256_setzero_ps();
  const int64_t runs = a.nb / 4;
  for (int64_t u = 0; u < runs; ++u) {
    const int64_t b0 = 4 * u;
    const uint8_t* p = row + b0 * kQK;
    PrefetchAhead(p, 128);
    __m256i v[4], codes[4], mag[4];  // v[k]: block k, as q - 128
    for (int k = 0; k < 4; ++k) v[k] = _mm256_xor_si256(Load32(p + 32 * k), flip);
    TransposeDwords(v, codes);
    for (int c = 0; c < 4; ++c) mag[c] = _mm256_sign_epi8(codes[c], codes[c]);
    const int64_t g0 = b0 >> g.shift;
    const __m256 sw = _mm256_permutevar8x32_ps(_mm256_loadu_ps(g.sc + g0), g.spread);
    const __m256 ow =
        _mm256_fmadd_ps(sw, _mm256_set1_ps(128.0f),
                        _mm256_permutevar8x32_ps(_mm256_loadu_ps(g.bias + g0), g.spread));
    for (int r = 0; r < MB; ++r) {
      const int8_t* x = a.Q(m0 + r, b0);
      __m256i i = _mm256_setzero_si256();
      for (int lv = 0; lv < L; ++lv)
        for (int c = 0; c < 4; ++c) {
          const __m256i xv = _mm256_sign_epi8(Load32(x + 128 * lv + 32 * c), codes[c]);
          i = _mm256_add_epi32(i,
                               _mm256_madd_epi16(_mm256_maddubs_epi16(mag[c], xv),
                                                 _mm256_set1_epi16(L == 2 && lv == 0 ? 256 : 1)));
        }
      const __m256 dx = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(a.D(m0 + r) + b0));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(sw, dx), acc[r]);
      acc[r] = _mm256_fmadd_ps(ow, _mm256_loadu_ps(a.S16(m0 + r) + 2 * b0), acc[r]);
    }
  }
  MlxTail<8, MB, L>(row, a, m0, g, 4 * runs, acc, off, y, ldy);
}

template <int MB, int L>
MlxRowsFn MlxRowsFor(Fmt f) {
  return f == Fmt::kMlx4 ? Mlx4RecordsRows<MB, L> : Mlx8SlicesRows<MB, L>;
}

}  // namespace

MlxRowsFn PickMlxRows(Fmt f, int levels, int mb) {
  switch (mb) {
    case 1:
      return levels == 2 ? MlxRowsFor<1, 2>(f) : MlxRowsFor<1, 1>(f);
    case 2:
      return levels == 2 ? MlxRowsFor<2, 2>(f) : MlxRowsFor<2, 1>(f);
    case 3:
      return levels == 2 ? MlxRowsFor<3, 2>(f) : MlxRowsFor<3, 1>(f);
    default:
      return levels == 2 ? MlxRowsFor<4, 2>(f) : MlxRowsFor<4, 1>(f);
  }
}

#else  // no x86: never covered

MlxRowsFn PickMlxRows(Fmt, int, int) { return nullptr; }

#endif

}  // namespace lumen::kernels::int8_avx2
