// Internal to the AVX512-VNNI int8 decode kernels (matmul_q8.h): what the
// activation preparation and dispatch (matmul_q8.cc), the GGUF row kernels
// (matmul_q8_gguf.cc) and the MLX row kernels (matmul_q8_mlx.cc) share: the
// weight formats, the activations' byte orders and prepared rows, the row
// kernels' signature, and the dot-product helpers they all use. Never
// included outside these files.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>

#include "lumen/core/buffer.h"
#include "lumen/core/check.h"
#include "lumen/core/quant.h"
#include "lumen/kernels/matrix.h"
#include "lumen/kernels/prefetch.h"
#include "lumen/kernels/vnni_target.h"

#if defined(__x86_64__)
#include "lumen/kernels/intrinsics_warnings.h"
#endif

namespace lumen::kernels::int8_vnni {

enum class Fmt {
  kQ4_0,
  kQ4_0C,
  kQ4_1C,
  kQ5_0C,
  kQ5_1C,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ8_0,
  kQ2K,
  kQ2KC,
  kQ3K,
  kQ3KC,
  kQ4K,
  kQ5K,
  kQ4KC,
  kQ5KC,
  kQ6K,
  kQ6KC,
  kQ8_0C,
  kMlx4,
  kMlx8
};

// The activations' byte order within a 64-element record (see Layout).
// kBlockColumnsK: Q4_K / Q5_K column groups, as kBlockColumns up to the
// last group, then a last odd super-block as kColumns. kBlockColumnsQ8:
// Q8_0 column groups, as kBlockColumns up to the last group, then natural. kMlxGroups: MLX
// 4-bit, groups of 512 whose record j lane l holds bytes of block l as the
// kernel's column j % 4 reads them (SourceIndex), then kEvenOdd twins.
// kMlx8Groups: MLX 8-bit codes in groups (MlxOrder::kGroups), groups of 512
// as kBlockColumnsQ8, then kWordTwins. kHalfColumns: kColumns with the
// lanes in Q2_K records' and Q3_K planes' order (core/repack.h): lane l
// holds sub-block 2 (l % 8) + l / 8, so lanes 0-7 the first halves of the
// eight 32-element blocks and lanes 8-15 their second halves.
enum class Order {
  kNatural,
  kQuads,
  kBlockColumns,
  kBlockColumnsK,
  kBlockColumnsQ8,
  kPairColumns,
  kColumns,
  kHalfColumns,
  kEvenOdd,
  kWordTwins,
  kMlxGroups,
  kMlx8Groups
};

// kHalfColumns' sub-block in lane l (SourceIndex lays the activations out
// so; the kernel permutes the sub-block scales so).
constexpr int HalfColumnsSubBlock(int l) { return 2 * (l % 8) + l / 8; }

// Orders whose period is one K-quant super-block in four columns, lane l
// one 16-element slice (SuperColumns).
constexpr bool SuperColumnOrder(Order o) {
  return o == Order::kColumns || o == Order::kHalfColumns;
}

// Orders laid out in groups of 16 blocks (512 elements) up to their last
// group: the column groups and the MLX groups.
constexpr bool GroupsOf16(Order o) {
  return o == Order::kBlockColumns || o == Order::kBlockColumnsK || o == Order::kBlockColumnsQ8 ||
         o == Order::kMlxGroups || o == Order::kMlx8Groups;
}

// Orders whose several records of a period accumulate into the same lanes
// (a quad's two, a Q8_0 group's four, a Q4_0 column group's eight): the
// lane corrections of offset formats are summed into the period's first
// record, where the kernel starts from them.
constexpr bool SharesLanes(Order o) {
  return o == Order::kQuads || o == Order::kBlockColumns || o == Order::kBlockColumnsK ||
         o == Order::kBlockColumnsQ8 || o == Order::kPairColumns || SuperColumnOrder(o);
}

struct Geometry {
  Fmt fmt;
  int64_t block_bytes;  // GGUF: bytes per (super-)block; MLX: 0
  // Codes are w + w_offset (Q4_0, Q5_0, Q8_0: unsigned) or w / a + w_offset
  // (Q3_K, Q6_K), the offset in the integer sums (Int8Rows::corr); 0: none.
  int w_offset;
  int64_t sum_group;  // elements per float offset group (Int8Rows::sums; 0: none)
  Order order;
};

// Whether a kernel asks for the decode rows of format f (the plain one a
// repacked format reads as) in L1 rather than L2: where L1PrefetchPays
// (prefetch.h), but for Q8_0's and Q5_K's groups, which decoded 2% slower so
// on Zen 5 (session 52).
inline bool RowsIntoL1(Fmt f) { return f != Fmt::kQ8_0 && f != Fmt::kQ5K && L1PrefetchPays(); }

// Activation rows quantized and laid out for one weight format and level
// count L. Each row is a run of records, one per 64 elements: [L code vectors
// (level 1, then level 2), 64 B each | lane scales, 16 x f32], then for an
// odd last block a half record [L x 32 B | 8 x f32]; then, for the formats
// with float offsets (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K, MLX), the offset sums
// (each group's sum of the activations as the codes read back, f32), and for
// those with integer ones the corrections. One pointer per row and sequential reads (with separate
// arrays the 4-row kernel ran out of registers). The lane scale is d (L = 1) or d2 = d / 256 (L =
// 2).
struct Int8Rows {
  int64_t M = 0, K = 0, stride = 0;  // stride: bytes per row (a multiple of 64)
  int64_t nsum = 0;                  // offset sums per row
  int levels = 1;
  AlignedBuffer buf;
  const uint8_t* row(int64_t m) const { return buf.as<const uint8_t>() + m * stride; }
  // Bytes from a row's start to its offset sums and to its corrections.
  int64_t sums_at() const { return (levels + 1) * K; }
  int64_t corr_at() const { return sums_at() + 4 * nsum; }
  const float* sums(int64_t m) const { return reinterpret_cast<const float*>(row(m) + sums_at()); }
  // Q4_0 / Q5_0 / Q8_0 / Q3_K / Q6_K: per 4-byte lane of the records,
  // -w_offset times the lane's activation codes summed (q1, or 256 q1 + q2),
  // one int32 each (SharesLanes: a period's records summed into its first).
  const int32_t* corr(int64_t m) const {
    return reinterpret_cast<const int32_t*>(row(m) + corr_at());
  }
};

// Activation rows m0 .. m0 + MB - 1 of X: records, and the offset sums and
// corrections at one fixed distance from each row's records, so a kernel
// holds one pointer per row and one index for all of them. (Three pointers
// per row: GCC kept more of them on the stack; the 4-row kernels ran
// 1.02-1.08x slower, session 52.)
template <int MB>
struct RowPtrs {
  const uint8_t* x[MB];
  int64_t sums_at, corr_at;  // Int8Rows' distances
  RowPtrs(const Int8Rows& X, int64_t m0) : sums_at(X.sums_at()), corr_at(X.corr_at()) {
    for (int r = 0; r < MB; ++r) x[r] = X.row(m0 + r);
  }
  // Row r's offset sums from element i, corrections from lane i.
  const float* sums(int r, int64_t i) const {
    return reinterpret_cast<const float*>(x[r] + (sums_at + 4 * i));
  }
  const int32_t* corr(int r, int64_t i) const {
    return reinterpret_cast<const int32_t*>(x[r] + (corr_at + 4 * i));
  }
};

// The part of a row product a kernel call covers: units [u0, u1) of the
// row (128 elements: a legacy format's four blocks, an MLX twin; 256: a
// K-quant super-block). first: the partial sum is stored to Y (else added);
// last: the row's remainder (the blocks after its last whole unit, the
// offset terms that span the row) is included. ahead: the weight prefetch
// distance in bytes.
struct Span {
  int64_t u0, u1;
  bool first, last;
  int64_t ahead;
};

// Bytes of a full record (64 elements) at L levels; its lane scales start at 64 L.
template <int L>
constexpr int64_t kRecord = 64 * L + 64;

// Activation rows per kernel call (MatMulRowsInt8 in matmul_q8.cc: four at
// a time, then the rest).
inline constexpr int kMaxRowsPerCall = 4;

// Q2_K and Q3_K also have kernels of kWideRows rows (GgufWideRowsFor), taken
// while that many rows are left on Intel CPUs: their codes cost the most to
// unpack per super-block, work an eight-row call shares between twice the
// rows (16-row products 1.1-1.4x faster on a Xeon, though the accumulators
// spill; the other formats' eight-row calls ran at 0.65-1.12x their
// four-row ones). On Zen 5 the spills cost more than the shared unpack:
// two four-row calls ran 8- and 16-row products 1.26-1.40x faster (Q3_K,
// Q2_K records; performance.md, session 49), so AMD CPUs take none.
inline constexpr int kWideRows = 8;

// A row kernel: rows [n0, n1) of W against the MB prepared activation rows
// of X from m0 (MB and the level count fixed by the pick), over the spans;
// each output's partial sum stored to Y (a span's first) or added.
using RowsFn = void (*)(const Matrix& W, const Geometry& g, const Int8Rows& X, int64_t m0, float* Y,
                        int64_t ldy, int64_t n0, int64_t n1, std::span<const Span> spans);

// The kernel of a format at mb (1..kMaxRowsPerCall) rows and 1 or 2 levels;
// null where the format is the other file's. x86-64 with VNNI only.
RowsFn GgufRowsFor(Fmt f, int mb, int levels);
RowsFn MlxRowsFor(Fmt f, int mb, int levels);
// The kWideRows-row kernel of f at 1 or 2 levels; null where f has none.
RowsFn GgufWideRowsFor(Fmt f, int levels);

// Kernels::Pick<MB, L>(f) for mb and levels known at run time.
template <class Kernels>
RowsFn PickRows(Fmt f, int mb, int levels) {
  LUMEN_CHECK(mb >= 1 && mb <= kMaxRowsPerCall && (levels == 1 || levels == 2));
  using PickFn = RowsFn (*)(Fmt);
  static constexpr PickFn kPick[2][kMaxRowsPerCall] = {
      {Kernels::template Pick<1, 1>, Kernels::template Pick<2, 1>, Kernels::template Pick<3, 1>,
       Kernels::template Pick<4, 1>},
      {Kernels::template Pick<1, 2>, Kernels::template Pick<2, 2>, Kernels::template Pick<3, 2>,
       Kernels::template Pick<4, 2>}};
  return kPick[levels - 1][mb - 1](f);
}

#if defined(__x86_64__)

LUMEN_INTRINSICS_BEGIN

// acc + the lane sums i (converted) times scale times the record's lane
// scales (dx, after its L levels' codes): every row kernel's step after its
// dot products.
template <int L>
LUMEN_VNNI inline __m512 AddScaledLanes(__m512 acc, __m512i i, __m512 scale, const uint8_t* rec) {
  const __m512 sd =
      _mm512_mul_ps(scale, _mm512_load_ps(reinterpret_cast<const float*>(rec + 64 * L)));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sd, acc);
}

// The integer lane sums of L levels, plus init (added once), from dot(acc,
// level) = acc + the level's dot products: one level, dot(init, 0); two,
// (dot(0, 0) << 8) + dot(init, 1).
template <int L, class Dot>
LUMEN_VNNI inline __m512i Levels(__m512i init, Dot dot) {
  if constexpr (L == 1) {
    return dot(init, 0);
  } else {
    return _mm512_add_epi32(_mm512_slli_epi32(dot(_mm512_setzero_si512(), 0), 8), dot(init, 1));
  }
}

// A record's lane sums: unsigned weight codes w against its signed
// activation codes (one vector per level).
template <int L>
LUMEN_VNNI inline __m512i LevelDot(__m512i init, __m512i w, const uint8_t* rec) {
  return Levels<L>(init, [&](__m512i acc, int level) LUMEN_VNNI {
    return _mm512_dpbusd_epi32(acc, w, _mm512_load_si512(rec + 64 * level));
  });
}

// The lane sums of a twin (two code vectors a, b whose lanes hold the same
// blocks) against its two activation records at rec.
template <int L>
LUMEN_VNNI inline __m512i TwinDot(__m512i init, __m512i a, __m512i b, const uint8_t* rec) {
  return Levels<L>(init, [&](__m512i acc, int level) LUMEN_VNNI {
    acc = _mm512_dpbusd_epi32(acc, a, _mm512_load_si512(rec + 64 * level));
    return _mm512_dpbusd_epi32(acc, b, _mm512_load_si512(rec + kRecord<L> + 64 * level));
  });
}

// Keeps vectors just loaded in registers: where a loaded vector has several
// uses (a mask and a shift), GCC 12 folds the load into each of them, one
// load per use. Q6_K slices' kernel read each of its three vectors two to
// four times (most of them split over two lines: 210-byte super-blocks):
// pinned, 1.37x one row and 1.19-1.36x four (session 51). The count of
// loads was the cost, not the splits: aligned lines shifted by vpermt2b ran
// 0.84-0.95x the pinned loads. tools/kernel_insns.py counts such reloads.
template <class V, class... Rest>
[[gnu::always_inline]] LUMEN_VNNI inline void InRegisters(V& v, Rest&... rest) {
  asm("" : "+v"(v));
  if constexpr (sizeof...(rest) > 0) InRegisters(rest...);
}

// Per 32-bit lane l, the value f(l).
template <class Fn>
LUMEN_VNNI inline __m512i LaneValues(Fn f) {
  alignas(64) int32_t v[16];
  for (int l = 0; l < 16; ++l) v[l] = f(l);
  return _mm512_load_si512(v);
}

// A column group's lane sums (one block each) against its eight records at
// rec, in two accumulator chains per level (low nibbles, high nibbles): with
// one chain of eight a 4-row step waits on vpdpbusd latency (session 27, a
// 4-row weight row in L2: Q4_0 1.16x, Q4_K 1.06x, one row and the other
// formats the same; session 15 had measured only one row).
template <int L>
[[gnu::always_inline]] LUMEN_VNNI inline __m512i GroupDot(__m512i init, const __m512i (&lo)[4],
                                                          const __m512i (&hi)[4],
                                                          const uint8_t* rec) {
  return Levels<L>(init, [&](__m512i a, int level) LUMEN_VNNI {
    __m512i b = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      a = _mm512_dpbusd_epi32(a, lo[c], _mm512_load_si512(rec + kRecord<L> * c + 64 * level));
      b = _mm512_dpbusd_epi32(b, hi[c], _mm512_load_si512(rec + kRecord<L> * (4 + c) + 64 * level));
    }
    return _mm512_add_epi32(a, b);
  });
}

// Calls group(G, integral_constant<A>) for the groups of `per` units from
// unit u (the start of a group) up to `end` (a group boundary), two at a
// time into accumulator sets 0 and 1, a last odd one into set 0. Returns the
// unit after the last group.
template <class Group>
[[gnu::always_inline]] LUMEN_VNNI inline int64_t EachGroup(int64_t u, int64_t end, int64_t per,
                                                           Group group) {
  for (; u + 2 * per <= end; u += 2 * per) {
    group(u / per, std::integral_constant<int, 0>{});
    group(u / per + 1, std::integral_constant<int, 1>{});
  }
  if (u < end) {
    group(u / per, std::integral_constant<int, 0>{});
    u += per;
  }
  return u;
}

LUMEN_INTRINSICS_END

#endif  // __x86_64__

}  // namespace lumen::kernels::int8_vnni
