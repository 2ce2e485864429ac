// The int8 decode kernels of the GGUF formats on AVX512-VNNI (matmul_q8.h;
// the layout and the arithmetic are described in matmul_q8.cc): Rows, the
// legacy 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) as stored or as
// column groups, and RowsK, the K-quants (Q2_K .. Q6_K, Q4_K / Q5_K column
// groups, Q6_K slices), each against up to four prepared activation rows at
// one or two levels. GgufRowsFor picks one (matmul_q8_internal.h).
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

#include "lumen/core/check.h"
#include "lumen/core/quant.h"
#include "lumen/core/repack.h"
#include "lumen/kernels/matmul_q8_internal.h"

#if defined(__x86_64__)
#include "lumen/kernels/cpu_vendor.h"
#include "lumen/kernels/prefetch.h"
#include "lumen/kernels/q23_columns_avx512.h"
#include "lumen/kernels/q4k_scales_avx512.h"

namespace lumen::kernels::int8_vnni {

LUMEN_INTRINSICS_BEGIN

namespace {

LUMEN_VNNI inline uint32_t LoadU16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// LevelDot (matmul_q8_internal.h) on a half record (32 elements: L x 32 B).
template <int L>
LUMEN_VNNI inline __m256i LevelDotHalf(__m256i init, __m256i w, const uint8_t* rec) {
  auto dot = [&](__m256i acc, const uint8_t* p) LUMEN_VNNI {
    return _mm256_dpbusd_epi32(acc, w, _mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
  };
  if constexpr (L == 1) {
    return dot(init, rec);
  } else {
    return _mm256_add_epi32(_mm256_slli_epi32(dot(_mm256_setzero_si256(), rec), 8),
                            dot(init, rec + 32));
  }
}

// The legacy 32-element formats: where the codes start in a block, where the
// 5th bits start (Q5_*), whether an offset m follows d, and what is
// subtracted from the codes to make them signed (types without m).
constexpr int64_t CodesAt(Fmt f) {
  return f == Fmt::kQ4_1 ? 4 : f == Fmt::kQ5_0 ? 6 : f == Fmt::kQ5_1 ? 8 : 2;
}
constexpr int64_t HighBitsAt(Fmt f) { return f == Fmt::kQ5_0 ? 2 : f == Fmt::kQ5_1 ? 4 : 0; }
constexpr bool HasMin(Fmt f) { return f == Fmt::kQ4_1 || f == Fmt::kQ5_1; }
template <Fmt F>
constexpr DType kPlainDType = F == Fmt::kQ4_0   ? DType::kQ4_0
                              : F == Fmt::kQ4_1 ? DType::kQ4_1
                              : F == Fmt::kQ5_0 ? DType::kQ5_0
                              : F == Fmt::kQ5_1 ? DType::kQ5_1
                                                : DType::kQ8_0;

LUMEN_VNNI inline uint64_t LoadU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

LUMEN_VNNI inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Bytes of one block of a legacy format.
template <Fmt F>
constexpr int kBlockBytes = F == Fmt::kQ4_0   ? sizeof(BlockQ4_0)
                            : F == Fmt::kQ4_1 ? sizeof(BlockQ4_1)
                            : F == Fmt::kQ5_0 ? sizeof(BlockQ5_0)
                                              : sizeof(BlockQ5_1);

// A quad (four consecutive blocks of a 4- or 5-bit format, 72 to 96 bytes)
// is read as two 64-byte tables and every 2-byte field gathered from them
// with one vpermt2b (index 64 + j: byte j of the second table). Where the
// quad lies inside two aligned cache lines (always for Q4_0 rows at 8-byte
// aligned addresses, Q4_1 at 16, Q5_1 at 32), the tables are those two lines and
// the index is the field's place in the quad plus the quad's offset in the
// first line. Otherwise the tables are the 64 bytes at the quad and the 64
// ending where it ends (at kTable1). Why: on Zen 5 the unaligned loads,
// each split over two lines, halved the rate the quads stream from DRAM
// (Q4_0 matrix-vector product, 1 thread: 10-17 -> 20-28 GB/s, session 11).
template <Fmt F>
constexpr int kTable1 = 4 * kBlockBytes<F> - 64;
struct alignas(64) WordIndex {
  int8_t v[64] = {};  // byte indices for vpermt2b (one uop; vpermt2w is three)
  bool ok = true;     // every field inside a table (checked at compile time)
  // Output word i = the 2 bytes at byte p of the quad; table1 < 0: the
  // tables are aligned lines, and the index is p (plus the offset, added at
  // run time).
  constexpr void Set(int i, int p, int table1) {
    const bool first = table1 < 0 || p + 2 <= 64;
    ok = ok && (first || (p >= table1 && p - table1 + 2 <= 64));
    v[2 * i] = static_cast<int8_t>(first ? p : 64 + p - table1);
    v[2 * i + 1] = static_cast<int8_t>(v[2 * i] + 1);
  }
};

// Codes: words 8b..8b+7 are block b's 16 code bytes.
template <Fmt F>
constexpr WordIndex CodeWords(int table1) {
  WordIndex r;
  for (int i = 0; i < 32; ++i) {
    r.Set(i, i / 8 * kBlockBytes<F> + static_cast<int>(CodesAt(F)) + 2 * (i % 8), table1);
  }
  return r;
}
// Scales: words 4b..4b+3 are block b's f16 d (one per lane of the block);
// words 16..19 the four blocks' m (Q4_1, Q5_1).
template <Fmt F>
constexpr WordIndex ScaleWords(int table1) {
  WordIndex r;
  for (int i = 0; i < 20; ++i) {
    const int p = i < 16 ? i / 4 * kBlockBytes<F> : (i - 16) * kBlockBytes<F> + (HasMin(F) ? 2 : 0);
    r.Set(i, p, table1);
  }
  return r;
}
template <Fmt F>
inline constexpr WordIndex kCodeWords = CodeWords<F>(kTable1<F>);
template <Fmt F>
inline constexpr WordIndex kScaleWords = ScaleWords<F>(kTable1<F>);
template <Fmt F>
inline constexpr WordIndex kCodeWordsAt = CodeWords<F>(-1);
template <Fmt F>
inline constexpr WordIndex kScaleWordsAt = ScaleWords<F>(-1);
static_assert(kCodeWords<Fmt::kQ4_0>.ok && kCodeWords<Fmt::kQ4_1>.ok && kCodeWords<Fmt::kQ5_0>.ok &&
              kCodeWords<Fmt::kQ5_1>.ok);
static_assert(kScaleWords<Fmt::kQ4_0>.ok && kScaleWords<Fmt::kQ4_1>.ok &&
              kScaleWords<Fmt::kQ5_0>.ok && kScaleWords<Fmt::kQ5_1>.ok);

LUMEN_VNNI inline __m512i Words(const WordIndex& w) { return _mm512_load_si512(w.v); }

// A quad as the kernel uses it: a = elements 0..15 of the four blocks, b =
// elements 16..31, both unsigned codes with block b in lanes 4b..4b+3 (so
// the two vpdpbusd of a level accumulate 8 products of one block per lane,
// and the lane work after them, the shift, conversion and scaling, is paid
// once per 128 weights, not per 64); d = each lane's block scale; m = the
// four blocks' offsets (Q4_1, Q5_1).
struct Quad {
  __m512i a, b;
  __m512 d;
  __m128 m;
};

// The aligned tables read bytes of the quad's two cache lines outside it,
// which for the first and last quad of a buffer may lie outside the
// allocation (never outside its pages): hidden from ASan.
template <Fmt F>
__attribute__((no_sanitize("address"))) LUMEN_VNNI inline Quad LoadQuad(const uint8_t* blk) {
  const auto o = static_cast<int>(reinterpret_cast<uintptr_t>(blk) & 63);
  __m512i t0, t1, scale_idx, code_idx;
  if (o + 4 * kBlockBytes<F> <= 128) {
    t0 = _mm512_load_si512(blk - o);
    t1 = _mm512_load_si512(blk - o + 64);
    const __m512i at = _mm512_set1_epi8(static_cast<char>(o));
    scale_idx = _mm512_add_epi8(Words(kScaleWordsAt<F>), at);
    code_idx = _mm512_add_epi8(Words(kCodeWordsAt<F>), at);
  } else {
    t0 = _mm512_loadu_si512(blk);
    t1 = _mm512_loadu_si512(blk + kTable1<F>);
    scale_idx = Words(kScaleWords<F>);
    code_idx = Words(kCodeWords<F>);
  }
  const __m512i sw = _mm512_permutex2var_epi8(t0, scale_idx, t1);
  const __m512i y = _mm512_permutex2var_epi8(t0, code_idx, t1);
  Quad q;
  q.d = _mm512_cvtph_ps(_mm512_castsi512_si256(sw));
  q.m = HasMin(F) ? _mm_cvtph_ps(_mm512_extracti32x4_epi32(sw, 2)) : _mm_setzero_ps();
  // Byte j of a block: element j (low nibble), element 16 + j (high).
  const __m512i m = _mm512_set1_epi8(0x0F);
  q.a = _mm512_and_si512(y, m);
  q.b = _mm512_and_si512(_mm512_srli_epi16(y, 4), m);
  if constexpr (HighBitsAt(F) != 0) {  // bit j of a block's qh: its element j
    uint64_t ka = 0, kb = 0;
    for (int i = 0; i < 4; ++i) {
      const uint64_t h = LoadU32(blk + i * kBlockBytes<F> + HighBitsAt(F));
      ka |= (h & 0xFFFF) << (16 * i);
      kb |= (h >> 16) << (16 * i);
    }
    const __m512i v = _mm512_set1_epi8(16);
    q.a = _mm512_mask_add_epi8(q.a, ka, q.a, v);
    q.b = _mm512_mask_add_epi8(q.b, kb, q.b, v);
  }
  return q;
}

// Two f16 values, at p and p + bb, as lanes 0 and 1.
LUMEN_VNNI inline __m128 TwoHalves(const uint8_t* p, int64_t bb) {
  const uint32_t h = LoadU16(p) | (LoadU16(p + bb) << 16);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(h)));
}

// The two adjacent f16 values at p (a K-quant's d and dmin) as lanes 0 and 1:
// one load and one conversion. Two scalar conversions, each a load, a move to
// a vector register, a conversion and a broadcast, held the Q4_K kernel 8%
// (one row) to 19% (four) slower.
LUMEN_VNNI inline __m128 AdjacentHalves(const uint8_t* p) {
  return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(LoadU32(p))));
}

// Codes of one block, natural order, as 32 bytes.
template <Fmt F>
LUMEN_VNNI inline __m256i BlockCodes(const uint8_t* blk) {
  if constexpr (F == Fmt::kQ8_0) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)),
                            _mm256_set1_epi8(char(0x80)));
  } else {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + CodesAt(F)));
    const __m128i m = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(a, m), hi = _mm_and_si128(_mm_srli_epi16(a, 4), m);
    __m256i q = _mm256_inserti128_si256(_mm256_zextsi128_si256(lo), hi, 1);
    if constexpr (HighBitsAt(F) != 0)
      q = _mm256_mask_add_epi8(q, LoadU32(blk + HighBitsAt(F)), q, _mm256_set1_epi8(16));
    return q;
  }
}

LUMEN_VNNI inline float F16Scalar(const uint8_t* p) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(LoadU16(p)))));
}

// The codes of a column group (core/repack.h): column c's low nibbles
// (lo[c], meeting record c) and high nibbles (hi[c], record 4 + c), the 5th
// bits (kHigh) added by the masks as they are.
template <bool kHigh>
[[gnu::always_inline]] LUMEN_VNNI inline void GroupCodes(const uint8_t* grp, const ColsFields& f,
                                                         __m512i (&lo)[4], __m512i (&hi)[4]) {
  const __m512i m = _mm512_set1_epi8(0x0F), v16 = _mm512_set1_epi8(16);
  for (int c = 0; c < 4; ++c) {
    const __m512i y = _mm512_loadu_si512(grp + f.codes + 64 * c);
    lo[c] = _mm512_and_si512(y, m);
    hi[c] = _mm512_and_si512(_mm512_srli_epi16(y, 4), m);
    if constexpr (kHigh) {
      lo[c] = _mm512_mask_add_epi8(lo[c], LoadU64(grp + f.high + 8 * c), lo[c], v16);
      hi[c] = _mm512_mask_add_epi8(hi[c], LoadU64(grp + f.high + 8 * (4 + c)), hi[c], v16);
    }
  }
}

// The lane sums of four columns u (a K-quant super-block, a Q8_0 group of
// 8 blocks) against their four records at rec, plus init. (Split in two
// chains as GroupDot is, Q2_K and Q6_K lost 4-5%: session 27.)
template <int L>
LUMEN_VNNI inline __m512i ColumnDot(__m512i init, const __m512i (&u)[4], const uint8_t* rec) {
  return Levels<L>(init, [&](__m512i acc, int level) LUMEN_VNNI {
    for (int j = 0; j < 4; ++j)
      acc = _mm512_dpbusd_epi32(acc, u[j], _mm512_load_si512(rec + kRecord<L> * j + 64 * level));
    return acc;
  });
}

// Rows [n0, n1) of W (a legacy 32-block format) against MB prepared
// activation rows starting at m0, over the units (four blocks: a quad, or
// Q8_0's two pairs) of span s: quads (two records each), then with the last
// span the row's last one to three blocks in natural order (a pair record,
// a half record). Two accumulators per row so the FMA latency does not bind.
template <Fmt F, int MB, int L>
LUMEN_VNNI void Rows(const Matrix& W, const Geometry& g, const Int8Rows& X, int64_t m0, float* Y,
                     int64_t ldy, int64_t n0, int64_t n1, std::span<const Span> spans) {
  constexpr int kAcc = 2;
  // Q4_0 column groups: the blocks after the last group are plain Q4_0.
  constexpr Fmt FQ = F == Fmt::kQ4_0C   ? Fmt::kQ4_0
                     : F == Fmt::kQ4_1C ? Fmt::kQ4_1
                     : F == Fmt::kQ5_0C ? Fmt::kQ5_0
                     : F == Fmt::kQ5_1C ? Fmt::kQ5_1
                     : F == Fmt::kQ8_0C ? Fmt::kQ8_0
                                        : F;
  constexpr bool kGroups = FQ != F;
  // Without m (Q4_0, Q5_0, Q8_0) the codes are w + offset, and each row's
  // records carry -offset sum(x) per lane (Prepare), the dot's starting value.
  constexpr bool kMin = HasMin(FQ), kOffset = !kMin;
  // Q8_0 stays in pairs: its quads (136 bytes, four unaligned 64-byte loads
  // and three permutes each) measured 5% slower than pairs on one thread.
  constexpr bool kQuads = FQ != Fmt::kQ8_0;
  const int64_t K = W.k, nb = K / kQK, units = nb / 4, bb = g.block_bytes;
  const RowPtrs<MB> rp(X, m0);
  const bool l1 = RowsIntoL1(FQ);  // the column groups' prefetch
  const auto& x = rp.x;
  for (int64_t n = n0; n < n1; ++n)
    for (const Span& s : spans) {
      const uint8_t* row = W.w.row<const uint8_t>(n);
      __m512 acc[MB][kAcc];
      __m128 off[MB];  // Q4_1 / Q5_1: sum of m dx sum(qx), one lane per block of a quad
      for (int r = 0; r < MB; ++r) {
        for (int a = 0; a < kAcc; ++a) acc[r][a] = _mm512_setzero_ps();
        off[r] = _mm_setzero_ps();
      }
      // One quad into accumulator set A (a compile-time index: a runtime one
      // made GCC keep the accumulators on the stack).
      auto quad = [&]<int A>(int64_t q, std::integral_constant<int, A>) LUMEN_VNNI {
        if constexpr (kQuads) {
          const uint8_t* blk = row + 4 * q * bb;
          PrefetchAheadL1(blk, 4 * bb, s.ahead);
          const Quad w = LoadQuad<FQ>(blk);
          for (int r = 0; r < MB; ++r) {
            const uint8_t* rec = x[r] + kRecord<L> * 2 * q;
            const __m512i init =
                kOffset ? _mm512_loadu_si512(rp.corr(r, 32 * q)) : _mm512_setzero_si512();
            const __m512i i = TwinDot<L>(init, w.a, w.b, rec);
            acc[r][A] = AddScaledLanes<L>(acc[r][A], i, w.d, rec);
          }
          if constexpr (kMin)
            for (int r = 0; r < MB; ++r)
              off[r] = _mm_fmadd_ps(w.m, _mm_loadu_ps(rp.sums(r, 4 * q)), off[r]);
        }
      };
      // Q8_0: a group of 8 blocks (units 2 G, 2 G + 1; records 4 G ..) as
      // four columns into accumulator set A: lane l of column c is block
      // l % 8's codes 16 (l / 8) + 4 c .., so a lane sums 16 products and
      // the level shift, conversion and scaling are paid once per 256
      // weights, not per 64 as with pairs (session 15).
      auto group = [&]<int A>(int64_t G, std::integral_constant<int, A>) LUMEN_VNNI {
        const uint8_t* blk = row + 8 * G * bb;
        PrefetchAhead(blk, 8 * bb, s.ahead);
        __m512i z[4];  // [block 2p codes | block 2p + 1 codes], signed
        for (int p = 0; p < 4; ++p)
          z[p] = _mm512_inserti64x4(
              _mm512_castsi256_si512(
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2 * p * bb + 2))),
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + (2 * p + 1) * bb + 2)), 1);
        __m512i col[4];
        const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
        for (int c = 0; c < 4; ++c) {
          // Lane l: block l % 8 = 2 p + e is dword 8 e + c + 4 (l / 8) of z[p].
          const __m512i idx = LaneValues(
              [c](int l) { return ((l % 8) / 2 % 2) * 16 + 8 * (l % 2) + c + 4 * (l / 8); });
          const __m512i lo = _mm512_permutex2var_epi32(z[0], idx, z[1]);
          const __m512i hi = _mm512_permutex2var_epi32(z[2], idx, z[3]);
          col[c] = _mm512_xor_si512(_mm512_mask_mov_epi32(lo, 0xF0F0, hi), flip);
        }
        // The eight f16 scales in one vector (inserts, not a store and reload).
        auto half = [&](int i) { return static_cast<int16_t>(LoadU16(blk + i * bb)); };
        const __m128i h =
            _mm_setr_epi16(half(0), half(1), half(2), half(3), half(4), half(5), half(6), half(7));
        const __m512 d = _mm512_broadcast_f32x8(_mm256_cvtph_ps(h));  // lane l: block l % 8
        for (int r = 0; r < MB; ++r) {
          const uint8_t* rec = x[r] + kRecord<L> * 4 * G;
          const __m512i init = _mm512_loadu_si512(rp.corr(r, 64 * G));
          const __m512i i = ColumnDot<L>(init, col, rec);
          acc[r][A] = AddScaledLanes<L>(acc[r][A], i, d, rec);
        }
      };
      // Q4_0 column group G (units 4 G .. 4 G + 3, records 8 G ..; core/repack.h)
      // into accumulator set A: column c's low nibbles meet record c, its
      // high nibbles record 4 + c (Q8_0: columns c and 4 + c), and a lane
      // sums one block's 32 products, so the lane work is paid once per 512
      // weights.
      auto cgroup = [&]<int A>(int64_t G, std::integral_constant<int, A>) LUMEN_VNNI {
        const uint8_t* grp = row + G * kColsBlocks * bb;
        PrefetchAheadInto(l1, grp, kColsBlocks * bb, s.ahead);
        const ColsFields f = ColsFieldsAt(kPlainDType<FQ>, grp);
        const __m512 d =
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp + f.d)));
        __m512i lo[4], hi[4];  // Q8_0: columns 0-3 and 4-7 as they are (codes + 128)
        if constexpr (FQ == Fmt::kQ8_0) {
          for (int c = 0; c < 4; ++c) {
            lo[c] = _mm512_loadu_si512(grp + f.codes + 64 * c);
            hi[c] = _mm512_loadu_si512(grp + f.codes + 64 * (4 + c));
          }
        } else {
          GroupCodes<HighBitsAt(FQ) != 0>(grp, f, lo, hi);
        }
        for (int r = 0; r < MB; ++r) {
          const uint8_t* rec = x[r] + kRecord<L> * 8 * G;
          const __m512i init =
              kOffset ? _mm512_loadu_si512(rp.corr(r, 128 * G)) : _mm512_setzero_si512();
          const __m512i i = GroupDot<L>(init, lo, hi, rec);
          acc[r][A] = AddScaledLanes<L>(acc[r][A], i, d, rec);
          if constexpr (kMin)  // m times each block's activation sum, lane by lane
            acc[r][A] = _mm512_fmadd_ps(
                _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp + f.m))),
                _mm512_loadu_ps(rp.sums(r, kColsBlocks * G)), acc[r][A]);
        }
      };
      // A pair record, [block b | block b + 1] in natural order, into
      // accumulator set A.
      auto pair = [&]<int A>(int64_t b, int64_t rec_at, std::integral_constant<int, A>) LUMEN_VNNI {
        const uint8_t* blk = row + b * bb;
        PrefetchAhead(blk, 1, s.ahead);
        const __m512i w = _mm512_inserti64x4(_mm512_zextsi256_si512(BlockCodes<FQ>(blk)),
                                             BlockCodes<FQ>(blk + bb), 1);
        const __m512 s =
            _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                  _mm512_zextps128_ps512(TwoHalves(blk, bb)));
        for (int r = 0; r < MB; ++r) {
          const uint8_t* rec = x[r] + kRecord<L> * rec_at;
          const __m512i init =
              kOffset ? _mm512_loadu_si512(rp.corr(r, 16 * rec_at)) : _mm512_setzero_si512();
          const __m512i i = LevelDot<L>(init, w, rec);
          acc[r][A] = AddScaledLanes<L>(acc[r][A], i, s, rec);
          if constexpr (kMin) {
            const __m128 sums =
                _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rp.sums(r, b))));
            off[r] = _mm_fmadd_ps(TwoHalves(blk + 2, bb), sums, off[r]);
          }
        }
      };
      if constexpr (kGroups) {
        // Spans start on a group (BySpans); the quads after the groups are plain.
        int64_t u = EachGroup(s.u0, std::min(s.u1, nb / kColsBlocks * 4), 4, cgroup);
        for (; u < s.u1; ++u) {
          if constexpr (kQuads) {
            quad(u, std::integral_constant<int, 1>{});
          } else {  // Q8_0: natural pairs
            pair(4 * u, 2 * u, std::integral_constant<int, 0>{});
            pair(4 * u + 2, 2 * u + 1, std::integral_constant<int, 1>{});
          }
        }
      } else if constexpr (kQuads) {
        int64_t q = s.u0;
        for (; q + kAcc <= s.u1; q += kAcc) {
          quad(q, std::integral_constant<int, 0>{});
          quad(q + 1, std::integral_constant<int, 1>{});
        }
        if (q < s.u1) quad(q, std::integral_constant<int, 0>{});
      } else {
        // Spans start on a group (BySpans) and end on one or at the row's end.
        int64_t u = EachGroup(s.u0, std::min(s.u1, nb / 8 * 2), 2, group);
        for (; u < s.u1; ++u) {
          pair(4 * u, 2 * u, std::integral_constant<int, 0>{});
          pair(4 * u + 2, 2 * u + 1, std::integral_constant<int, 1>{});
        }
      }
      int64_t b = 4 * units, rec_at = 2 * units;  // the row's last blocks, their record
      if (s.last && nb - b >= 2) {
        pair(b, rec_at, std::integral_constant<int, 0>{});
        b += 2;
        ++rec_at;
      }
      float tail[MB] = {};
      if (s.last && b < nb) {  // a half record
        const uint8_t* blk = row + b * bb;
        const __m256i w = BlockCodes<FQ>(blk);
        const float s = F16Scalar(blk);
        for (int r = 0; r < MB; ++r) {
          const uint8_t* rec = x[r] + kRecord<L> * rec_at;
          const __m256i init =
              kOffset
                  ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rp.corr(r, 16 * rec_at)))
                  : _mm256_setzero_si256();
          const __m256i i = LevelDotHalf<L>(init, w, rec);
          alignas(32) int32_t v[8];
          _mm256_store_si256(reinterpret_cast<__m256i*>(v), i);
          int32_t sum = 0;
          for (int32_t e : v) sum += e;
          tail[r] = s * reinterpret_cast<const float*>(rec + 32 * L)[0] * static_cast<float>(sum);
          // One explicit rounding: left to -ffp-contract, GCC fused this for
          // some row counts and not others, and a batched row lost the bits
          // it has alone (Q4_1/Q5_1 rows with 1-3 blocks after the quads).
          if constexpr (kMin) tail[r] = std::fma(F16Scalar(blk + 2), *rp.sums(r, b), tail[r]);
        }
      }
      for (int r = 0; r < MB; ++r) {
        const __m512 t = _mm512_add_ps(acc[r][0], acc[r][1]);
        float y = _mm512_reduce_add_ps(t) + tail[r];
        if constexpr (kMin) {
          const __m128 o = _mm_add_ps(off[r], _mm_movehl_ps(off[r], off[r]));
          y += _mm_cvtss_f32(o) + _mm_cvtss_f32(_mm_movehdup_ps(o));
        }
        float& out = Y[(m0 + r) * ldy + n];
        out = s.first ? y : out + y;
      }
    }
}

// The 8 scales and 8 mins of a Q4_K super-block (GetScaleMinK4's 6-bit
// fields, unpacked four at a time from the 12 bytes at `scales` as 32-bit
// words; 16 bytes are read) times d and dmin (the two f16 at dd): lanes 0-7
// d sc_j, lanes 8-15 dmin m_j.
LUMEN_VNNI inline __m512 ScalesMinsQ4K(const uint8_t* scales, const uint8_t* dd_at) {
  // The three words w0, w1, w2 in 32-bit lanes (the load's fourth word is
  // unused), then per lane: sc 0..3 = w0 & k6, sc 4..7 =
  // (w2 & k4) | ((w0 >> 6) & k2) << 4, m 0..3 = w1 & k6, m 4..7 = ((w2 >> 4)
  // & k4) | ((w1 >> 6) & k2) << 4. In vector lanes, not through a stack array,
  // whose four 32-bit stores and 128-bit load could not forward.
  const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));
  const __m128i low = _mm_srlv_epi32(_mm_shuffle_epi32(w, _MM_SHUFFLE(2, 1, 2, 0)),
                                     _mm_set_epi32(4, 0, 0, 0));  // w0, w2, w1, w2 >> 4
  const __m128i lo =
      _mm_and_si128(low, _mm_set_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f));
  const __m128i top =
      _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(w, _MM_SHUFFLE(1, 1, 0, 0)), 6),
                    _mm_set_epi32(0x03030303, 0, 0x03030303, 0));
  const __m128i b = _mm_or_si128(lo, _mm_slli_epi32(top, 4));
  const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
  const __m512 dd =  // lanes 0-7 d, 8-15 dmin
      _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                            _mm512_castps128_ps512(AdjacentHalves(dd_at)));
  return _mm512_mul_ps(f, dd);
}

// Elements per sub-block (a lane scale and an offset each).
constexpr int SubBlock(Fmt f) { return f == Fmt::kQ4K || f == Fmt::kQ5K ? 32 : 16; }

// A K-quant super-block's sub-block scales a and offsets o (w = a q - o), one
// per lane (sub-blocks of 32: lanes 0-7). Q3_K and Q6_K leave o alone: their
// offset is a fixed multiple of a, taken in the integer sums (RowsK).
template <Fmt F>
LUMEN_VNNI inline void SubScales(const uint8_t* blk, __m512* a, __m512* o) {
  if constexpr (F == Fmt::kQ4K || F == Fmt::kQ5K) {
    const __m512 sm = ScalesMinsQ4K(blk + 4, blk);
    *a = sm;
    *o = _mm512_shuffle_f32x4(sm, sm, _MM_SHUFFLE(3, 2, 3, 2));  // lanes 8-15 to 0-7
  } else if constexpr (F == Fmt::kQ6K) {
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
    *a = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)),
                       _mm512_set1_ps(F16Scalar(blk + 208)));
  } else if constexpr (F == Fmt::kQ3K) {
    // Q3KScale's 6-bit fields four at a time in 32-bit lanes (as Q4_K's, not
    // through a stack array): lane j = ((w[j % 2] >> 4 (j / 2)) & k4) | (((w2
    // >> 2j) & k2) << 4), the 12 bytes read by a masked load (the block ends
    // 2 bytes after them).
    const __m128i w = _mm_maskz_loadu_epi32(0x7, blk + 96);
    const __m128i low = _mm_and_si128(
        _mm_srlv_epi32(_mm_shuffle_epi32(w, _MM_SHUFFLE(1, 0, 1, 0)), _mm_set_epi32(4, 4, 0, 0)),
        _mm_set1_epi32(0x0f0f0f0f));
    const __m128i high = _mm_and_si128(
        _mm_srlv_epi32(_mm_shuffle_epi32(w, _MM_SHUFFLE(2, 2, 2, 2)), _mm_set_epi32(6, 4, 2, 0)),
        _mm_set1_epi32(0x03030303));
    const __m128i u = _mm_or_si128(low, _mm_slli_epi32(high, 4));
    const __m512i sc = _mm512_sub_epi32(_mm512_cvtepu8_epi32(u), _mm512_set1_epi32(32));
    *a = _mm512_mul_ps(_mm512_cvtepi32_ps(sc), _mm512_set1_ps(F16Scalar(blk + 108)));
  } else {  // Q2_K: byte j = scale j (low nibble) | min j (high nibble)
    const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
    const __m512i k = _mm512_set1_epi32(15);
    const __m512 dm = _mm512_castps128_ps512(AdjacentHalves(blk + 80));  // d, dmin
    *a = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(sc, k)),
                       _mm512_permutexvar_ps(_mm512_setzero_si512(), dm));
    *o = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(sc, 4)),
                       _mm512_permutexvar_ps(_mm512_set1_epi32(1), dm));
  }
}

// The codes of a K-quant super-block as four columns: byte 4l + b of u[j] is
// the code of element 16 l + 4 j + b, so lane l of all four holds 16-element
// slice l (a sub-block of Q2_K/Q3_K/Q6_K, half of one of Q4_K/Q5_K) and one
// int32 lane sums the slice's 16 products: the lane work after the dots (the
// level shift, conversion and scaling) is paid once per 256 weights, not
// once per 128 as with twins (session 15). Each column is one dword gather
// of the packed bytes (vpermd / vpermt2d: slice l, column j lie in one
// dword), a per-lane shift to the field and a mask. (SourceIndex lays the
// activations out the same way.)
template <Fmt F>
[[gnu::always_inline]] LUMEN_VNNI inline void SuperColumns(const uint8_t* blk, __m512i (&u)[4]) {
  const __m512i k4 = _mm512_set1_epi8(0x0F), k2 = _mm512_set1_epi8(3);
  if constexpr (F == Fmt::kQ4K || F == Fmt::kQ5K) {
    // Element e: nibble (e / 32) % 2 of qs[32 (e / 64) + e % 32]; slice l's
    // column j is dword 8 (l / 4) + 4 (l % 2) + j, nibble (l / 2) % 2.
    const uint8_t* qs = blk + (F == Fmt::kQ4K ? 16 : 48);
    const __m512i t0 = _mm512_loadu_si512(qs), t1 = _mm512_loadu_si512(qs + 64);
    const __m512i shift = LaneValues([](int l) { return 4 * ((l / 2) % 2); });
    const __m512i at = LaneValues([](int l) { return 8 * (l / 4) + 4 * (l % 2); });
    // Q5_K: element e's 5th bit is bit e / 32 of qh[e % 32]: dword 4 (l % 2) + j, bit l / 2.
    [[maybe_unused]] __m512i qh, hat, hbit;
    if constexpr (F == Fmt::kQ5K) {
      qh = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)));
      hat = LaneValues([](int l) { return 4 * (l % 2); });
      hbit =
          LaneValues([](int l) { return int32_t{0x01010101} << (l / 2); });  // bit l / 2 per byte
    }
    for (int j = 0; j < 4; ++j) {
      const __m512i jj = _mm512_set1_epi32(j);
      const __m512i d = _mm512_permutex2var_epi32(t0, _mm512_add_epi32(at, jj), t1);
      u[j] = _mm512_and_si512(_mm512_srlv_epi32(d, shift), k4);
      if constexpr (F == Fmt::kQ5K) {
        const __m512i h = _mm512_permutexvar_epi32(_mm512_add_epi32(hat, jj), qh);
        u[j] =
            _mm512_mask_add_epi8(u[j], _mm512_test_epi8_mask(h, hbit), u[j], _mm512_set1_epi8(16));
      }
    }
  } else if constexpr (F == Fmt::kQ2K || F == Fmt::kQ3K) {
    // Element e: bits 2 ((e % 128) / 32) of qs[32 (e / 128) + e % 32]; slice
    // l's column j is dword 8 (l / 8) + 4 (l % 2) + j, shift 2 ((l % 8) / 2).
    // Q3_K: + 4 where bit e / 32 of hmask[e % 32] is set (dword 4 (l % 2) + j, bit l / 2).
    const __m512i qs = _mm512_loadu_si512(blk + (F == Fmt::kQ2K ? 16 : 32));
    const __m512i shift = LaneValues([](int l) { return 2 * ((l % 8) / 2); });
    const __m512i at = LaneValues([](int l) { return 8 * (l / 8) + 4 * (l % 2); });
    [[maybe_unused]] __m512i hm, hat, hbit;
    if constexpr (F == Fmt::kQ3K) {
      hm = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
      hat = LaneValues([](int l) { return 4 * (l % 2); });
      hbit =
          LaneValues([](int l) { return int32_t{0x01010101} << (l / 2); });  // bit l / 2 per byte
    }
    for (int j = 0; j < 4; ++j) {
      const __m512i jj = _mm512_set1_epi32(j);
      const __m512i d = _mm512_permutexvar_epi32(_mm512_add_epi32(at, jj), qs);
      u[j] = _mm512_and_si512(_mm512_srlv_epi32(d, shift), k2);
      if constexpr (F == Fmt::kQ3K) {
        const __m512i h = _mm512_permutexvar_epi32(_mm512_add_epi32(hat, jj), hm);
        u[j] =
            _mm512_mask_add_epi8(u[j], _mm512_test_epi8_mask(h, hbit), u[j], _mm512_set1_epi8(4));
      }
    }
  } else if constexpr (F == Fmt::kQ2KC) {  // records (q23_columns_avx512.h)
    Q2RecordColumns(blk + 16, u);
  } else if constexpr (F == Fmt::kQ3KC) {  // planes
    Q3PlaneColumns(blk, u);
  } else if constexpr (F == Fmt::kQ6KC) {
    // Q6_K slices (core/repack.h): column j's low 4 bits are a nibble of
    // vector j % 2, its top 2 bits bits 2 j of the third; moved to bits 4-5
    // and joined by one ternary op (a | (b & 0x30)).
    __m512i va = _mm512_loadu_si512(blk), vb = _mm512_loadu_si512(blk + 64);
    __m512i h = _mm512_loadu_si512(blk + 128);
    InRegisters(va, vb, h);
    const __m512i k30 = _mm512_set1_epi8(0x30);
    u[0] = _mm512_ternarylogic_epi32(_mm512_and_si512(va, k4), _mm512_slli_epi16(h, 4), k30, 0xF8);
    u[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(vb, k4), _mm512_slli_epi16(h, 2), k30, 0xF8);
    u[2] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(va, 4), k4), h, k30, 0xF8);
    u[3] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(vb, 4), k4),
                                     _mm512_srli_epi16(h, 2), k30, 0xF8);
  } else {  // Q6_K: element e = 128 h + i: low 4 bits nibble (i / 64) of
            // ql[64 h + 32 ((i / 32) % 2) + i % 32], high 2 bits 2 (i / 32) of
            // qh[32 h + i % 32]. Slice l: h = l / 8, i / 32 = (l % 8) / 2.
    const __m512i l0 = _mm512_loadu_si512(blk), l1 = _mm512_loadu_si512(blk + 64);
    const __m512i qh = _mm512_loadu_si512(blk + 128);
    const __m512i lat =
        LaneValues([](int l) { return 16 * (l / 8) + 8 * (((l % 8) / 2) % 2) + 4 * (l % 2); });
    const __m512i lshift = LaneValues([](int l) { return 4 * ((l % 8) / 4); });
    const __m512i hat = LaneValues([](int l) { return 8 * (l / 8) + 4 * (l % 2); });
    const __m512i hshift = LaneValues([](int l) { return 2 * ((l % 8) / 2); });
    for (int j = 0; j < 4; ++j) {
      const __m512i jj = _mm512_set1_epi32(j);
      const __m512i lo = _mm512_and_si512(
          _mm512_srlv_epi32(_mm512_permutex2var_epi32(l0, _mm512_add_epi32(lat, jj), l1), lshift),
          k4);
      const __m512i hi = _mm512_and_si512(
          _mm512_srlv_epi32(_mm512_permutexvar_epi32(_mm512_add_epi32(hat, jj), qh), hshift), k2);
      u[j] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 4));
    }
  }
}

// Rows [n0, n1) of W (a K-quant) against MB prepared activation rows at m0.
template <Fmt F, int MB, int L>
LUMEN_VNNI void RowsK(const Matrix& W, const Geometry& g, const Int8Rows& X, int64_t m0, float* Y,
                      int64_t ldy, int64_t n0, int64_t n1, std::span<const Span> spans) {
  // Q4_K / Q5_K column groups: a last odd super-block is plain. Q6_K
  // slices, Q2_K records: every super-block is the format's but for where
  // its codes lie (Q2_K's lanes: Order::kHalfColumns).
  constexpr Fmt FQ = F == Fmt::kQ4KC   ? Fmt::kQ4K
                     : F == Fmt::kQ5KC ? Fmt::kQ5K
                     : F == Fmt::kQ6KC ? Fmt::kQ6K
                     : F == Fmt::kQ2KC ? Fmt::kQ2K
                     : F == Fmt::kQ3KC ? Fmt::kQ3K
                                       : F;
  constexpr bool kGroups = F == Fmt::kQ4KC || F == Fmt::kQ5KC;
  constexpr int kSubs = kQKK / SubBlock(FQ);  // 16 or 8 sub-blocks
  // Q3_K and Q6_K: o = c a, so the offset term is the integer -c sum(qx)
  // per lane (Prepare's corrections, one lane per sub-block), the dot's
  // starting value: no float offset work per row and super-block.
  constexpr bool kIntOffset = FQ == Fmt::kQ3K || FQ == Fmt::kQ6K;
  const RowPtrs<MB> rows(X, m0);
  const auto& x = rows.x;
  // Slice l's scale: sub-block l, or (sub-blocks of 32) l / 2.
  const __m512i halves = LaneValues([](int l) { return l / 2; });
  // Q2_K records, Q3_K planes: lane l's sub-block (Q2_K's offsets o stay in
  // sub-block order, as the activations' sums are).
  const __m512i record_lanes = LaneValues(HalfColumnsSubBlock);
  const __mmask16 sums_mask = kSubs == 16 ? 0xFFFF : 0x00FF;
  // Q6_K's 210-byte super-blocks straddle cache lines (three unaligned
  // 64-byte loads each): L1 first paid there (session 47).
  const bool l1 = RowsIntoL1(FQ);
  for (int64_t n = n0; n < n1; ++n)
    for (const Span& s : spans) {
      const uint8_t* row = W.w.row<const uint8_t>(n);
      __m512 acc[MB][2], off[MB];
      for (int r = 0; r < MB; ++r) acc[r][0] = acc[r][1] = off[r] = _mm512_setzero_ps();
      // Super-block sb into accumulator set A (compile time, see Rows).
      auto super = [&]<int A>(int64_t sb, std::integral_constant<int, A>) LUMEN_VNNI {
        const uint8_t* blk = row + sb * g.block_bytes;
        PrefetchAheadInto(l1, blk, g.block_bytes, s.ahead);
        __m512 a, o = _mm512_setzero_ps();
        SubScales<FQ>(blk, &a, &o);
        if constexpr (kSubs == 8) a = _mm512_permutexvar_ps(halves, a);
        constexpr bool kHalves = F == Fmt::kQ2KC || F == Fmt::kQ3KC;  // Order::kHalfColumns
        if constexpr (kHalves) a = _mm512_permutexvar_ps(record_lanes, a);
        __m512i u[4];
        SuperColumns<F == Fmt::kQ6KC || kHalves ? F : FQ>(blk, u);
        for (int r = 0; r < MB; ++r) {
          const uint8_t* rec = x[r] + kRecord<L> * 4 * sb;
          const __m512i init =
              kIntOffset ? _mm512_loadu_si512(rows.corr(r, kQKK / 4 * sb)) : _mm512_setzero_si512();
          const __m512i i = ColumnDot<L>(init, u, rec);
          acc[r][A] = AddScaledLanes<L>(acc[r][A], i, a, rec);
          if constexpr (!kIntOffset)
            off[r] = _mm512_fmadd_ps(o, _mm512_maskz_loadu_ps(sums_mask, rows.sums(r, kSubs * sb)),
                                     off[r]);
        }
      };
      // Column group G (super-blocks 2 G, 2 G + 1, records 8 G ..; core/repack.h)
      // into accumulator set A: lane l is sub-block l, so as in Rows' cgroup
      // column c's low nibbles meet record c, its high nibbles record 4 + c,
      // and the scales, offsets and conversion are paid once per 512 weights.
      auto cgroup = [&]<int A>(int64_t G, std::integral_constant<int, A>) LUMEN_VNNI {
        const uint8_t* grp = row + 2 * G * g.block_bytes;
        PrefetchAheadInto(l1, grp, 2 * g.block_bytes, s.ahead);
        const ColsFields f = ColsFieldsAt(FQ == Fmt::kQ4K ? DType::kQ4_K : DType::kQ5_K, grp);
        __m512 a, o;
        ScalesMinsQ4KPair(grp + f.scales, &a, &o);
        __m512i lo[4], hi[4];
        GroupCodes<FQ == Fmt::kQ5K>(grp, f, lo, hi);
        for (int r = 0; r < MB; ++r) {
          const uint8_t* rec = x[r] + kRecord<L> * 8 * G;
          const __m512i i = GroupDot<L>(_mm512_setzero_si512(), lo, hi, rec);
          acc[r][A] = AddScaledLanes<L>(acc[r][A], i, a, rec);
          off[r] = _mm512_fmadd_ps(o, _mm512_loadu_ps(rows.sums(r, kColsBlocks * G)), off[r]);
        }
      };
      int64_t sb = s.u0;
      if constexpr (kGroups)  // spans start on a group (BySpans); a last odd super-block is plain
        sb = EachGroup(sb, std::min(s.u1, W.k / kColsElems * 2), 2, cgroup);
      for (; sb + 2 <= s.u1; sb += 2) {
        super(sb, std::integral_constant<int, 0>{});
        super(sb + 1, std::integral_constant<int, 1>{});
      }
      if (sb < s.u1) super(sb, std::integral_constant<int, 0>{});
      for (int r = 0; r < MB; ++r) {
        // One horizontal sum per row, the offsets in it.
        __m512 t = _mm512_add_ps(acc[r][0], acc[r][1]);
        if constexpr (!kIntOffset) t = _mm512_sub_ps(t, off[r]);
        const float y = _mm512_reduce_add_ps(t);
        float& out = Y[(m0 + r) * ldy + n];
        out = s.first ? y : out + y;
      }
    }
}

// This file's kernel for a format at MB rows and L levels (null: the other
// file's format).
struct GgufKernels {
  template <int MB, int L>
  static RowsFn Pick(Fmt f) {
    switch (f) {
      case Fmt::kQ4_0:
        return &Rows<Fmt::kQ4_0, MB, L>;
      case Fmt::kQ4_0C:
        return &Rows<Fmt::kQ4_0C, MB, L>;
      case Fmt::kQ4_1C:
        return &Rows<Fmt::kQ4_1C, MB, L>;
      case Fmt::kQ5_0C:
        return &Rows<Fmt::kQ5_0C, MB, L>;
      case Fmt::kQ5_1C:
        return &Rows<Fmt::kQ5_1C, MB, L>;
      case Fmt::kQ4_1:
        return &Rows<Fmt::kQ4_1, MB, L>;
      case Fmt::kQ5_0:
        return &Rows<Fmt::kQ5_0, MB, L>;
      case Fmt::kQ5_1:
        return &Rows<Fmt::kQ5_1, MB, L>;
      case Fmt::kQ8_0:
        return &Rows<Fmt::kQ8_0, MB, L>;
      case Fmt::kQ8_0C:
        return &Rows<Fmt::kQ8_0C, MB, L>;
      case Fmt::kQ2K:
        return &RowsK<Fmt::kQ2K, MB, L>;
      case Fmt::kQ2KC:
        return &RowsK<Fmt::kQ2KC, MB, L>;
      case Fmt::kQ3KC:
        return &RowsK<Fmt::kQ3KC, MB, L>;
      case Fmt::kQ3K:
        return &RowsK<Fmt::kQ3K, MB, L>;
      case Fmt::kQ4K:
        return &RowsK<Fmt::kQ4K, MB, L>;
      case Fmt::kQ5K:
        return &RowsK<Fmt::kQ5K, MB, L>;
      case Fmt::kQ4KC:
        return &RowsK<Fmt::kQ4KC, MB, L>;
      case Fmt::kQ5KC:
        return &RowsK<Fmt::kQ5KC, MB, L>;
      case Fmt::kQ6K:
        return &RowsK<Fmt::kQ6K, MB, L>;
      case Fmt::kQ6KC:
        return &RowsK<Fmt::kQ6KC, MB, L>;
      case Fmt::kMlx4:
      case Fmt::kMlx8:
        break;
    }
    return nullptr;
  }
};

}  // namespace

RowsFn GgufRowsFor(Fmt f, int mb, int levels) { return PickRows<GgufKernels>(f, mb, levels); }

RowsFn GgufWideRowsFor(Fmt f, int levels) {
  LUMEN_CHECK(levels == 1 || levels == 2);
  if (CpuIsAmd()) return nullptr;  // (kWideRows)
  auto wide = [levels]<Fmt F>(std::integral_constant<Fmt, F>) -> RowsFn {
    return levels == 1 ? &RowsK<F, kWideRows, 1> : &RowsK<F, kWideRows, 2>;
  };
  switch (f) {
    case Fmt::kQ2K:
      return wide(std::integral_constant<Fmt, Fmt::kQ2K>{});
    case Fmt::kQ2KC:
      return wide(std::integral_constant<Fmt, Fmt::kQ2KC>{});
    case Fmt::kQ3K:
      return wide(std::integral_constant<Fmt, Fmt::kQ3K>{});
    case Fmt::kQ3KC:
      return wide(std::integral_constant<Fmt, Fmt::kQ3KC>{});
    default:
      return nullptr;
  }
}

LUMEN_INTRINSICS_END

}  // namespace lumen::kernels::int8_vnni

#endif  // __x86_64__
