// The AVX2 int8 row kernels for MLX affine 4- and 8-bit rows (matmul_q8_avx2.h):
// runs of blocks transposed in registers, or by the loader (MlxOrder::kRuns,
// core/repack.h), against activations laid out to match (Prepare's
// kMlx4Records / kMlx8Slices), the blocks after the last whole run in natural
// order; the biases one dot per row.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "lumen/core/quant.h"
#include "lumen/kernels/matmul_q8_avx2_internal.h"
#include "lumen/kernels/prefetch.h"

namespace lumen::kernels::int8_avx2 {

#if defined(__x86_64__)

namespace {

// An MLX row's scales or biases (f16, bf16 or f32) as the kernels read them.
struct GroupRow {
  DType t;
  const uint8_t* p;
};

// Group g's value (the blocks after a row's last whole run).
LUMEN_AVX2 inline float GroupValue(const GroupRow& r, int64_t g) {
  if (r.t == DType::kF16) return Half(r.p + 2 * g);
  uint32_t u = 0;
  if (r.t == DType::kF32) {
    std::memcpy(&u, r.p + 4 * g, 4);
  } else {
    std::memcpy(&u, r.p + 2 * g, 2);
    u <<= 16;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A run's kN groups from g0 on (kN = 1, 2, 4 or 8), spread over its lanes:
// lane l gets group g0 + j(l), j(l) = lane_block(l) >> shift (MlxGroups).
// 16-bit values are put in lane order as words (one vpshufb) and then
// converted; f32 ones by a vpermps. Exact-size loads: a run's groups may be
// the last bytes of the tensor. Read a run at a time (with the count known
// at compile time): converting a row's groups into a stack buffer first cost
// an MLX 4-bit row an eighth of its time (92 -> 80.5 ns at K = 2048 on Zen 2),
// and a vpermps after the conversion another 8 ns.
template <int kN>
LUMEN_AVX2 inline __m256 RunGroups(const GroupRow& r, int64_t g0, __m128i words, __m256i lanes) {
  const int64_t w = r.t == DType::kF32 ? 4 : 2;
  const uint8_t* p = r.p + w * g0;
  __m128i v;  // kN values of r.t's width from lane 0 up
  if (w * kN >= 16) {
    v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  } else if (w * kN == 8) {
    v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  } else if (w * kN == 4) {
    int32_t u;
    std::memcpy(&u, p, 4);
    v = _mm_cvtsi32_si128(u);
  } else {
    uint16_t u;
    std::memcpy(&u, p, 2);
    v = _mm_cvtsi32_si128(u);
  }
  if (r.t == DType::kF32) {
    __m256 f = _mm256_castps128_ps256(_mm_castsi128_ps(v));
    if constexpr (kN == 8)
      f = _mm256_insertf128_ps(f, _mm_loadu_ps(reinterpret_cast<const float*>(p) + 4), 1);
    return _mm256_permutevar8x32_ps(f, lanes);
  }
  v = _mm_shuffle_epi8(v, words);
  if (r.t == DType::kF16) return _mm256_cvtph_ps(v);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

// One activation block b of an MLX row (w = s q + o in its group) into acc[r]
// for rows m0 .. m0 + MB - 1, in natural order (the blocks after a row's last
// whole run): its s q part; the o part is the row's BiasDot. 4-bit: byte j
// holds elements 2j (low nibble) and 2j + 1, so the block's 16 bytes'
// nibbles are interleaved back into element order; 8-bit: codes up to 255
// would saturate vpmaddubsw's int16 pairs (2 x 255 x 127), so they go in as q
// - 128 (a signed byte: magnitudes against the activations carrying the
// signs, as Q8_0), and the 128 s goes with the bias.
template <int kBits, int MB, int L>
LUMEN_AVX2 inline void MlxBlock(const uint8_t* row, const Acts& a, int64_t m0, int64_t b, float s,
                                __m256* acc) {
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
    const __m256i i = kBits == 4 ? Dot<L>(codes, xq) : DotSigned<L>(codes, xq);
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(s * a.D(m0 + r)[b]), acc[r]);
  }
}

// An MLX row's group scales and biases and, for a run whose lane l holds
// block lane_block(l) (groups of 32 << kShift elements), the group of each
// lane relative to the run's first: as dwords (lanes) and as the byte
// shuffle that puts 16-bit values in that order (words).
struct MlxGroups {
  GroupRow sc, bias;
  __m128i words;
  __m256i lanes;
};

template <int kShift>
[[gnu::always_inline]] LUMEN_AVX2 inline MlxGroups RowGroups(const Matrix& W, int64_t n,
                                                             int64_t (*lane_block)(int64_t)) {
  MlxGroups g;
  g.sc = {W.scales.dtype, static_cast<const uint8_t*>(W.scales.row(n))};
  g.bias = {W.biases.dtype, static_cast<const uint8_t*>(W.biases.row(n))};
  alignas(32) int32_t lanes[8];
  alignas(16) int8_t words[16];
  for (int l = 0; l < 8; ++l) {
    lanes[l] = static_cast<int32_t>(lane_block(l) >> kShift);
    words[2 * l] = static_cast<int8_t>(2 * lanes[l]);
    words[2 * l + 1] = static_cast<int8_t>(2 * lanes[l] + 1);
  }
  g.lanes = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
  g.words = _mm_load_si128(reinterpret_cast<const __m128i*>(words));
  return g;
}

// A run's four 32-byte vectors (v) as the kernels read them (t): dword c of
// each 16-byte half of t[k] is dword k of v[c]'s, by a 4 x 4 transpose in
// registers, or as they are where the loader stored the run so (kRuns,
// core/repack.h).
template <bool kRuns>
LUMEN_AVX2 inline void RunOrder(const __m256i* v, __m256i* t) {
  if constexpr (kRuns) {
    for (int k = 0; k < 4; ++k) t[k] = v[k];
  } else {
    TransposeDwords(v, t);
  }
}

// Eight groups from g on as floats.
LUMEN_AVX2 inline __m256 Groups8(const GroupRow& r, int64_t g) {
  if (r.t == DType::kF32) return _mm256_loadu_ps(reinterpret_cast<const float*>(r.p) + g);
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r.p + 2 * g));
  if (r.t == DType::kF16) return _mm256_cvtph_ps(v);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

// The bias part of a row, sum over its groups of o_g X_g (X_g: the group's
// activation sum, Acts::GroupSums), o_g = b_g (4-bit) or b_g + 128 s_g
// (8-bit: the codes go in as q - 128), for rows m0 .. m0 + MB - 1 into
// off[r]: one dot per row over the groups in file order, where each run paid a
// load, a conversion, a spread and an FMA per row for its groups' biases (MLX
// 4-bit row 80 -> 75.5 ns, 8-bit 148 -> 136 at K = 2048 on Zen 2).
template <int kBits, int kShift, int MB>
[[gnu::always_inline]] LUMEN_AVX2 inline void BiasDot(const MlxGroups& g, const Acts& a, int64_t m0,
                                                      float* off) {
  const int64_t groups = a.nb >> kShift;
  __m256 acc[MB];
  for (int r = 0; r < MB; ++r) acc[r] = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= groups; j += 8) {
    __m256 o = Groups8(g.bias, j);
    if constexpr (kBits == 8) o = _mm256_fmadd_ps(Groups8(g.sc, j), _mm256_set1_ps(128.0f), o);
    for (int r = 0; r < MB; ++r)
      acc[r] = _mm256_fmadd_ps(o, _mm256_loadu_ps(a.GroupSums(m0 + r, kShift) + j), acc[r]);
  }
  for (int r = 0; r < MB; ++r) off[r] = HSum(acc[r]);
  for (; j < groups; ++j) {
    // fmaf: the same rounding in every instantiation (a row alone and in a batch)
    float o = GroupValue(g.bias, j);
    if constexpr (kBits == 8) o = std::fmaf(128.0f, GroupValue(g.sc, j), o);
    for (int r = 0; r < MB; ++r) off[r] = std::fmaf(o, a.GroupSums(m0 + r, kShift)[j], off[r]);
  }
}

// A row's blocks from b_begin on (after its last whole run) in natural order,
// its bias part, then each activation row's sum into y.
template <int kBits, int kShift, int MB, int L>
[[gnu::always_inline]] LUMEN_AVX2 inline void MlxTail(const uint8_t* row, const Acts& a, int64_t m0,
                                                      const MlxGroups& g, int64_t b_begin,
                                                      __m256* acc, float* y, int64_t ldy) {
  for (int64_t b = b_begin; b < a.nb; ++b)
    MlxBlock<kBits, MB, L>(row, a, m0, b, GroupValue(g.sc, b >> kShift), acc);
  float off[MB];
  BiasDot<kBits, kShift, MB>(g, a, m0, off);
  for (int r = 0; r < MB; ++r) y[r * ldy] = HSum(acc[r]) + off[r];
}

// One row's dot with a run of 8 blocks in record order (t[c]: records c in
// the low nibbles and c + 4 in the high ones; RecordsDot's products and sums,
// the same int16 sums in another order, exact: 8 x 2 x 15 x 127 < 2^15).
// Both levels take a vector's codes as it is unpacked, so 2 of the 8 code
// vectors are live, not all 8: with all 8, the row's float accumulator and
// the level constants were spilled to the stack and the accumulator's chain
// ran through a store and a load every run.
template <int L>
LUMEN_AVX2 inline __m256i NibbleRunDot(const __m256i* t, __m256i m4, const int8_t* x) {
  __m256i sum[L];
  for (int c = 0; c < 4; ++c) {
    const __m256i lo = _mm256_and_si256(t[c], m4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(t[c], 4), m4);
    for (int lv = 0; lv < L; ++lv) {
      const __m256i s =
          _mm256_add_epi16(_mm256_maddubs_epi16(lo, Load32(x + 256 * lv + 32 * c)),
                           _mm256_maddubs_epi16(hi, Load32(x + 256 * lv + 32 * (c + 4))));
      sum[lv] = c == 0 ? s : _mm256_add_epi16(sum[lv], s);
    }
  }
  __m256i i = _mm256_madd_epi16(sum[0], _mm256_set1_epi16(L == 2 ? 256 : 1));
  if constexpr (L == 2) i = _mm256_add_epi32(i, _mm256_madd_epi16(sum[1], _mm256_set1_epi16(1)));
  return i;
}

// MLX 4-bit rows against kMlx4Records activations: each whole run of 8
// blocks (128 code bytes) is transposed in registers, so that lane l of
// vector c is dword c of block MlxLaneBlock(l) (elements 8c .. 8c + 7, the
// even ones in the low nibbles); with the activations deinterleaved and in
// that lane order (Prepare), every product of a lane belongs to one block,
// and the lane work (conversion, scales, FMA) is paid once per 8 blocks, as
// for the column groups; the biases are the row's BiasDot. A run's 4 loads
// and 8 unpacks replace the natural kernel's per-block shuffles and scalar
// scale products (row 161 -> 91 ns at K = 2048 on Zen 2); kRuns: the loader
// stored the run transposed (core/repack.h), so the unpacks go too. The
// blocks after the last whole run take MlxBlock.
template <bool kRuns, int kShift, int MB, int L>
LUMEN_AVX2 void Mlx4RecordsRows(const Matrix& W, int64_t n, const Acts& a, int64_t m0, float* y,
                                int64_t ldy) {
  const uint8_t* row = W.w.row<const uint8_t>(n);
  const MlxGroups g = RowGroups<kShift>(W, n, MlxLaneBlock);
  constexpr int kGroups = std::max(1, 8 >> kShift);  // per run
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc[MB];
  for (int r = 0; r < MB; ++r) acc[r] = _mm256_setzero_ps();
  const int64_t runs = a.nb / 8;
  for (int64_t u = 0; u < runs; ++u) {
    const int64_t b0 = 8 * u;
    const uint8_t* p = row + b0 * (kQK / 2);
    PrefetchAhead(p, 128);
    __m256i v[4], t[4];  // v[k]: blocks 2k and 2k + 1
    for (int k = 0; k < 4; ++k) v[k] = Load32(p + 32 * k);
    RunOrder<kRuns>(v, t);
    __m256i codes[8];  // several rows share the unpacked codes
    if constexpr (MB > 1)
      for (int c = 0; c < 4; ++c) {
        codes[c] = _mm256_and_si256(t[c], m4);
        codes[c + 4] = _mm256_and_si256(_mm256_srli_epi16(t[c], 4), m4);
      }
    const int64_t g0 = b0 >> kShift;
    const __m256 sw = RunGroups<kGroups>(g.sc, g0, g.words, g.lanes);
    for (int r = 0; r < MB; ++r) {
      const int8_t* x = a.Q(m0 + r, b0);
      const __m256i i = MB == 1 ? NibbleRunDot<L>(t, m4, x) : RecordsDot<L, 8>(codes, x);
      const __m256 scale = _mm256_mul_ps(sw, _mm256_loadu_ps(a.D(m0 + r) + b0));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), scale, acc[r]);
    }
  }
  MlxTail<4, kShift, MB, L>(row, a, m0, g, 8 * runs, acc, y, ldy);
}

// Lane l of a kMlx8Slices chunk holds block l % 4.
constexpr int64_t MlxSliceBlock(int64_t l) { return MlxLaneSlice(l) / 2; }

// MLX 8-bit rows against kMlx8Slices activations: the four blocks of a run
// (128 code bytes) transposed in registers within 128-bit halves, so that
// lane l of vector c is dword c + 4 (l / 4) of block l % 4 (slice
// MlxLaneSlice(l)): a lane's products belong to one half block. The codes go
// in as q - 128, as MlxBlock's (one vpmaddwd per record and level: two
// records' int16 pairs could overflow), and the 128 comes back with the bias:
// w = s (q - 128) + (b + 128 s), the second term the row's BiasDot. The lane
// work is paid once per 4 blocks where MlxBlock pays it per block. kRuns: the
// run stored transposed by the loader (its 8 unpacks cost 11 of the row's 140
// ns at K = 2048 on Zen 2). The blocks after the last whole run take
// MlxBlock.
template <bool kRuns, int kShift, int MB, int L>
LUMEN_AVX2 void Mlx8SlicesRows(const Matrix& W, int64_t n, const Acts& a, int64_t m0, float* y,
                               int64_t ldy) {
  const uint8_t* row = W.w.row<const uint8_t>(n);
  const MlxGroups g = RowGroups<kShift>(W, n, MlxSliceBlock);
  constexpr int kGroups = std::max(1, 4 >> kShift);  // per run
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 acc[MB];
  for (int r = 0; r < MB; ++r) acc[r] = _mm256_setzero_ps();
  const int64_t runs = a.nb / 4;
  for (int64_t u = 0; u < runs; ++u) {
    const int64_t b0 = 4 * u;
    const uint8_t* p = row + b0 * kQK;
    PrefetchAhead(p, 128);
    __m256i v[4], codes[4], mag[4];  // v[k]: block k, as q - 128
    for (int k = 0; k < 4; ++k) v[k] = _mm256_xor_si256(Load32(p + 32 * k), flip);
    RunOrder<kRuns>(v, codes);
    // One row: each vector's magnitudes made as both levels take them (as
    // NibbleRunDot, the float accumulator spilled with all four live).
    if constexpr (MB > 1)
      for (int c = 0; c < 4; ++c) mag[c] = _mm256_sign_epi8(codes[c], codes[c]);
    const int64_t g0 = b0 >> kShift;
    const __m256 sw = RunGroups<kGroups>(g.sc, g0, g.words, g.lanes);
    for (int r = 0; r < MB; ++r) {
      const int8_t* x = a.Q(m0 + r, b0);
      __m256i i = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i m = MB > 1 ? mag[c] : _mm256_sign_epi8(codes[c], codes[c]);
        for (int lv = 0; lv < L; ++lv) {
          const __m256i xv = _mm256_sign_epi8(Load32(x + 128 * lv + 32 * c), codes[c]);
          i = _mm256_add_epi32(i,
                               _mm256_madd_epi16(_mm256_maddubs_epi16(m, xv),
                                                 _mm256_set1_epi16(L == 2 && lv == 0 ? 256 : 1)));
        }
      }
      const __m256 dx = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(a.D(m0 + r) + b0));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(sw, dx), acc[r]);
    }
  }
  MlxTail<8, kShift, MB, L>(row, a, m0, g, 4 * runs, acc, y, ldy);
}

template <bool kRuns, int MB, int L>
MlxRowsFn MlxRowsFor(Fmt f, int group) {
  if (f == Fmt::kMlx4)
    return group == 32   ? Mlx4RecordsRows<kRuns, 0, MB, L>
           : group == 64 ? Mlx4RecordsRows<kRuns, 1, MB, L>
                         : Mlx4RecordsRows<kRuns, 2, MB, L>;
  return group == 32   ? Mlx8SlicesRows<kRuns, 0, MB, L>
         : group == 64 ? Mlx8SlicesRows<kRuns, 1, MB, L>
                       : Mlx8SlicesRows<kRuns, 2, MB, L>;
}

template <bool kRuns>
MlxRowsFn MlxRowsPick(Fmt f, int group, int levels, int mb) {
  switch (mb) {
    case 1:
      return levels == 2 ? MlxRowsFor<kRuns, 1, 2>(f, group) : MlxRowsFor<kRuns, 1, 1>(f, group);
    case 2:
      return levels == 2 ? MlxRowsFor<kRuns, 2, 2>(f, group) : MlxRowsFor<kRuns, 2, 1>(f, group);
    case 3:
      return levels == 2 ? MlxRowsFor<kRuns, 3, 2>(f, group) : MlxRowsFor<kRuns, 3, 1>(f, group);
    default:
      return levels == 2 ? MlxRowsFor<kRuns, 4, 2>(f, group) : MlxRowsFor<kRuns, 4, 1>(f, group);
  }
}

}  // namespace

MlxRowsFn PickMlxRows(Fmt f, int group, bool runs, int levels, int mb) {
  return runs ? MlxRowsPick<true>(f, group, levels, mb) : MlxRowsPick<false>(f, group, levels, mb);
}

#else  // no x86: never covered

MlxRowsFn PickMlxRows(Fmt, int, bool, int, int) { return nullptr; }

#endif

}  // namespace lumen::kernels::int8_avx2
