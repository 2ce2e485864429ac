#include "lumen/kernels/matmul_q8.h"
#include "lumen/kernels/matmul_q8_avx2.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/core/check.h"
#include "lumen/core/quant.h"
#include "lumen/core/repack.h"
#include "lumen/core/route.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/prefetch.h"
#include "lumen/kernels/q4k_scales_avx512.h"

#include "lumen/kernels/intrinsics_warnings.h"
#include "lumen/kernels/vnni_target.h"

// Layout. vpdpbusd sums 4 adjacent byte products (unsigned weight codes times
// signed activation codes) into each of 16 int32 lanes. The kernels feed it
// *twins*: two 64-byte code vectors whose lanes hold the same block (or
// sub-block, or group), so that the two vpdpbusd of a level accumulate 8
// products of one block per lane, and the lane work after them (the level
// shift, the int-to-float conversion, the scale multiply and the FMA) is paid
// once per 128 weights instead of once per 64 (session 8: 1.15-1.9x decode).
// Q8_0 and the K-quants go further with *columns*: four code vectors whose
// lanes each hold one 16-element slice of one block (sub-block), so the
// lane work is paid once per 256 weights (session 15). Activation rows are
// laid out in the weights' byte order (SourceIndex), one 64-element record
// per code vector, with each lane's block scale (f32).
//   Q4_0, Q4_1, Q5_0, Q5_1 repacked at load (kQ4_0Cols ..., core/repack.h):
//     groups of 16 blocks as four code columns, lane l of column c holding
//     block l's code bytes 4c..4c+3: eight records per group (record j:
//     dword j of every block), every lane one block, so the lane work is
//     paid once per 512 weights, with no shuffles, and the 5th bits are
//     byte masks as stored (session 16). The blocks after the last group
//     are plain quads and pairs, as below.
//   Q4_0, Q4_1, Q5_0, Q5_1 as the file has them: a quad of four blocks,
//     gathered from two 64-byte loads by one vpermt2b into [blk0 qs | blk1
//     qs | blk2 qs | blk3 qs]; its low nibbles are elements 0..15 of each
//     block (block b in lanes 4b..4b+3), its high nibbles elements 16..31
//     (Q5: the 5th bits from two 64-bit lane masks of the four qh words, one
//     masked byte add each). The last 1-3 blocks of a row: a natural pair
//     [blk | blk + 1], a half.
//   Q8_0 repacked at load (kQ8_0Cols): groups of 16 blocks as eight code
//     columns, lane l of column c holding block l's codes 4c..4c+3, flipped
//     to unsigned at load: the eight records of a Q4_0 column group meet
//     the eight columns as they are loaded, so the group's work is eight
//     loads and the dot products (session 21). The blocks after the last
//     group are natural pairs, as below.
//   Q8_0 as the file has it: groups of 8 blocks as four columns, lane l of column c holding
//     block l % 8's codes 16 (l / 8) + 4c .. (one vpermt2d and a blend per
//     column from four pair loads); the blocks after the last group in
//     natural pairs [blk0 e0..31 | blk1 e0..31], an odd last block a half.
//     (Block columns built from the file's quads at run time measured slower
//     on one row than quads, session 15; repacked at load they are faster.)
//   K-quants: a super-block is four columns, one 16-element slice per lane
//     (see SuperColumns).
//   MLX 4-bit: groups of 512 elements as Q4_0 column groups, built at run
//     time: column c's lane l is dword c of activation block l (elements
//     8c..8c+7 of the block's 32; low nibbles the even ones, high the odd),
//     gathered from the group's four vectors by two vpermt2d and a blend, so
//     the lane work is paid once per 512 weights (session 19: batch-4 step
//     1.3x, one row 1.1x). The 128-element runs after the last group are
//     twins: 64 bytes as they are (low nibbles: the even elements of 128,
//     high: the odd; lane l = elements 8l..8l+7, one group). 8-bit: the even
//     and the odd 4-byte words of 128 bytes. A row of 64 x odd elements ends
//     in one 64-element record.
// Q4_0/Q5_0/Q8_0 codes are unsigned (q standing for q - 8, q for q - 16,
// q + 128) against signed activations: sum(w x) = sum(c x) - offset sum(x),
// and Prepare stores each lane's correction (a quad's two records', a Q8_0
// group's four, summed in the first), the dot's starting value (one
// vpdpbusd less per vector than the x + 128 layout of session 6). Products
// fit in int16 and lane sums in int32.
//
// Q4_1 / Q5_1 (w = d q + m) keep their codes unsigned (0..15, 0..31) and the
// activations signed, as the K-quants below: no correction, and the offset m
// multiplies the block's activation sum (one 4-lane FMA per quad and row).
//
// Two levels (int8x2): every activation block carries a second int8 code
// vector q2 for the first level's residual at scale d2 = d / 256
// (QuantizeBlockQ8x2 in core/quant.h), stored right after q1 in the same
// order. Both levels meet the same weight vectors, so per twin and row it is
// two more vpdpbusd, a shift and an add: i = (dot(w, q1) << 8) + dot(w, q2)
// is the lane's sum of w (256 q1 + q2), exact in int32 (at most 16 x 255 x
// 32639 plus Q8_0's correction, below 2^28); as f32 it is exact below 2^24:
// quads of codes below 64 (Q4_x, Q5_x: 8 x 63 x 32639 < 2^24) and K-quant
// columns of codes below 32 (16 x 31 x 32639 < 2^24) stay below it; Q6_K
// and Q8_0 columns (16 products of codes up to 63 / 255) and MLX 8-bit
// twins (8 x 255 x 32639 < 2^26) can pass it, where the conversion rounds
// once (relative 2^-24, inside the oracle bound). It is scaled once
// by d2. The weight unpacking, scales and offsets are shared, and the code is
// the one-level code templated on L.
//
// MLX affine (w = s q + b per group of 32, 64 or 128) is handled like the
// K-quants with o = -b.
//
// K-quants (Q2_K .. Q6_K) have unsigned codes q and an offset per sub-block:
// w = a q - o (Q2_K: a = d (sc & 15), o = dmin (sc >> 4); Q3_K: a = d (sc -
// 32), o = 4 a; Q4_K, Q5_K: a = d sc, o = dmin m; Q6_K: a = d sc, o = 32 a).
// Their activations stay signed (no correction). The offset term
// sum_s o_s dx_s sum(qx over s) is a float dot of the super-block's offsets
// with per-row sums precomputed once per activation row (one FMA per row per
// super-block).

namespace lumen::kernels {

LUMEN_ROUTE(
    matmul_int8_decode,
    {.node = "matmul.decode",
     .name = "int8-vnni",
     .tier = Tier::kL3,
     .oracle = "MatMulInt8Ref (same activation quantization, double accumulation); "
               "as a replacement of the exact product: no oracle",
     .bound = "KL(exact || route) at most twice what Q8_0 weights cost",
     .tests = "MatMulInt8.MatchesOracleAndExactBound;MatMulInt8.ManyAndThreadsAreBitIdentical;"
              "QuantTypes.Int8RouteTracksExact;RouteKl.Int8AndBf16RoutesCostAboutWhatQ8WeightsCost",
     .measure = "docs/reference/performance.md#exactness",
     .when = "act=int8|int8+bf16 cpu=avx512vnni int8=kernel",
     .priority = 20});
LUMEN_ROUTE(
    matmul_int8x2_decode,
    {.node = "matmul.decode",
     .name = "int8x2-vnni",
     .tier = Tier::kL2,
     .oracle = "MatMulInt8x2Ref (same two-level activation quantization, double accumulation); "
               "against the exact product: the activation rounding bound",
     .bound = "|y - y_exact| <= sum over blocks of (dx / 256) sum |w| (+ f32 slack); "
              "KL(exact || route) below a quarter of what Q8_0 weights cost",
     .tests = "QuantizeBlocksQ8x2.*;MatMulInt8x2.*;RouteKl.Int8x2DecodePassesTheDefaultGate;"
              "RouteKl.Int8x2DecodeGateOnEveryWeightType",
     .measure = "docs/reference/performance.md#the-int8x2-decode-route-the-default",
     .when = "act=int8x2|int8x2+bf16 cpu=avx512vnni int8=kernel",
     .priority = 20});
namespace {

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
  kQ3K,
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
// as kBlockColumnsQ8, then kWordTwins.
enum class Order {
  kNatural,
  kQuads,
  kBlockColumns,
  kBlockColumnsK,
  kBlockColumnsQ8,
  kPairColumns,
  kColumns,
  kEvenOdd,
  kWordTwins,
  kMlxGroups,
  kMlx8Groups
};

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
         o == Order::kBlockColumnsQ8 || o == Order::kPairColumns;
}

struct Geometry {
  Fmt fmt;
  int64_t block_bytes;  // GGUF: bytes per (super-)block; MLX: 0
  int w_offset;         // Q4_0/Q5_0/Q8_0: codes are w + w_offset (unsigned); 0: none
  int64_t sum_group;    // elements per offset group (0: none)
  Order order;
};

Geometry GeometryFor(const Matrix& W) {
  if (W.mlx_bits == 4) return {Fmt::kMlx4, 0, 0, W.mlx_group, Order::kMlxGroups};
  if (W.mlx_bits == 8)
    return {Fmt::kMlx8, 0, 0, W.mlx_group,
            W.mlx_order == MlxOrder::kGroups ? Order::kMlx8Groups : Order::kWordTwins};
  switch (W.w.dtype) {
    case DType::kQ4_0:
      return {Fmt::kQ4_0, sizeof(BlockQ4_0), 8, 0, Order::kQuads};
    case DType::kQ4_0Cols:
      return {Fmt::kQ4_0C, sizeof(BlockQ4_0), 8, 0, Order::kBlockColumns};
    case DType::kQ4_1Cols:
      return {Fmt::kQ4_1C, sizeof(BlockQ4_1), 0, kQK, Order::kBlockColumns};
    case DType::kQ5_0Cols:
      return {Fmt::kQ5_0C, sizeof(BlockQ5_0), 16, 0, Order::kBlockColumns};
    case DType::kQ5_1Cols:
      return {Fmt::kQ5_1C, sizeof(BlockQ5_1), 0, kQK, Order::kBlockColumns};
    case DType::kQ4_1:
      return {Fmt::kQ4_1, sizeof(BlockQ4_1), 0, kQK, Order::kQuads};
    case DType::kQ5_0:
      return {Fmt::kQ5_0, sizeof(BlockQ5_0), 16, 0, Order::kQuads};
    case DType::kQ5_1:
      return {Fmt::kQ5_1, sizeof(BlockQ5_1), 0, kQK, Order::kQuads};
    case DType::kQ8_0:
      return {Fmt::kQ8_0, sizeof(BlockQ8_0), 128, 0, Order::kPairColumns};
    case DType::kQ8_0Cols:
      return {Fmt::kQ8_0C, sizeof(BlockQ8_0), 128, 0, Order::kBlockColumnsQ8};
    case DType::kQ2_K:
      return {Fmt::kQ2K, sizeof(BlockQ2K), 0, 16, Order::kColumns};
    case DType::kQ3_K:
      return {Fmt::kQ3K, sizeof(BlockQ3K), 0, 16, Order::kColumns};
    case DType::kQ4_K:
      return {Fmt::kQ4K, sizeof(BlockQ4K), 0, 32, Order::kColumns};
    case DType::kQ5_K:
      return {Fmt::kQ5K, sizeof(BlockQ5K), 0, 32, Order::kColumns};
    case DType::kQ4_KCols:
      return {Fmt::kQ4KC, sizeof(BlockQ4K), 0, 32, Order::kBlockColumnsK};
    case DType::kQ5_KCols:
      return {Fmt::kQ5KC, sizeof(BlockQ5K), 0, 32, Order::kBlockColumnsK};
    case DType::kQ6_K:
      return {Fmt::kQ6K, sizeof(BlockQ6K), 0, 16, Order::kColumns};
    case DType::kQ6_KCols:  // the same activation layout: only the weights' bytes move
      return {Fmt::kQ6KC, sizeof(BlockQ6K), 0, 16, Order::kColumns};
    default:  // callers check Int8RouteSupports first
      LUMEN_CHECK(false);
      return {};
  }
}

// Natural element index (within the row) of byte `pos` of the laid-out row.
int64_t SourceIndex(Order order, int64_t nb, int64_t pos) {
  if (order == Order::kMlxGroups) {  // groups of 512 (RowsMlx), then twins
    if (pos >= nb / kColsBlocks * kColsElems) return SourceIndex(Order::kEvenOdd, nb, pos);
    // Record j, lane l, byte i: column j % 4 of block l, its low (j < 4) or high nibbles.
    const int64_t o = pos % kColsElems, j = o / 64, l = o % 64 / 4, i = o % 4;
    return pos - o + kQK * l + 8 * (j % 4) + 2 * i + j / 4;
  }
  if (order == Order::kEvenOdd || order == Order::kWordTwins) {  // MLX, see RowsMlx
    const int64_t K = nb * kQK, base = pos / 128 * 128, o = pos % 128, v = o / 64, b = o % 64;
    if (order == Order::kWordTwins)
      return pos >= K / 128 * 128 ? pos : base + b / 4 * 8 + b % 4 + 4 * v;
    if (pos < K / 128 * 128) return base + 2 * b + v;
    // The last 64 of 64 x odd: the even elements, then the odd ones.
    return base + (b < 32 ? 2 * b : 2 * (b - 32) + 1);
  }
  if (order == Order::kColumns) {  // record j, lane l: elements 16 l + 4 j .. (SuperColumns)
    const int64_t base = pos / kQKK * kQKK, o = pos % kQKK;
    return base + 16 * (o % 64 / 4) + 4 * (o / 64) + o % 4;
  }
  if (order == Order::kBlockColumns || order == Order::kBlockColumnsK ||
      order == Order::kBlockColumnsQ8 || order == Order::kMlx8Groups) {
    // Groups of 16 blocks (core/repack.h), then quads (a super-block's
    // columns; Q8_0: natural pairs; MLX 8-bit: word twins).
    if (pos >= nb / kColsBlocks * kColsElems)
      return order == Order::kBlockColumnsQ8 ? pos
             : order == Order::kMlx8Groups
                 ? SourceIndex(Order::kWordTwins, nb, pos)
                 : SourceIndex(order == Order::kBlockColumns ? Order::kQuads : Order::kColumns, nb,
                               pos);
    const int64_t o = pos % kColsElems,
                  l = o % 64 / 4;  // record o / 64: dword o / 64 of a block
    return pos - o + kQK * l + 4 * (o / 64) + o % 4;
  }
  if (order == Order::kPairColumns) {  // groups of 8 blocks (PairColumns), then natural
    if (pos >= nb / 8 * 8 * kQK) return pos;
    const int64_t o = pos % 256, l = o % 64 / 4;
    return pos - o + 32 * (l % 8) + 16 * (l / 8) + 4 * (o / 64) + o % 4;
  }
  if (order == Order::kNatural || pos >= nb / 4 * 4 * kQK) return pos;
  // A quad of blocks: two records, elements 0..15 of the four blocks, then 16..31.
  const int64_t q = pos / 128, o = pos % 128;
  return (4 * q + (o % 64) / 16) * kQK + o % 16 + 16 * (o / 64);
}

// Activation rows quantized and laid out for one weight format and level
// count L. Each row is a run of records, one per 64 elements: [L code vectors
// (level 1, then level 2), 64 B each | lane scales, 16 x f32], then for an
// odd last block a half record [L x 32 B | 8 x f32]; for K-quants then the
// offset sums (the group's sum of the activations as the codes read back,
// f32). One pointer per row and sequential reads (with separate arrays the
// 4-row kernel ran out of registers). The lane scale is d (L = 1) or d2 =
// d / 256 (L = 2).
struct Int8Rows {
  int64_t M = 0, K = 0, stride = 0;  // stride: bytes per row (a multiple of 64)
  int64_t nsum = 0;                  // offset sums per row
  int levels = 1;
  AlignedBuffer buf;
  const uint8_t* row(int64_t m) const { return buf.as<const uint8_t>() + m * stride; }
  const float* sums(int64_t m) const {
    return reinterpret_cast<const float*>(row(m) + (levels + 1) * K);
  }
  // Q4_0 / Q5_0 / Q8_0: per 4-byte lane of the records, -w_offset times the
  // lane's activation codes summed (q1, or 256 q1 + q2), one int32 each.
  const int32_t* corr(int64_t m) const {
    return reinterpret_cast<const int32_t*>(row(m) + (levels + 1) * K + 4 * nsum);
  }
};

// Activation rows m0 .. m0 + MB - 1 of X: records and offset sums.
template <int MB>
struct RowPtrs {
  const uint8_t* x[MB];
  const float* sums[MB];
  const int32_t* corr[MB];
  RowPtrs(const Int8Rows& X, int64_t m0) {
    for (int r = 0; r < MB; ++r) {
      x[r] = X.row(m0 + r);
      sums[r] = X.sums(m0 + r);
      corr[r] = X.corr(m0 + r);
    }
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

// The record layout repeats every `len` positions (64 natural, 128 quads
// and MLX twins, 256 K-quant twins) up to `end`; tab maps a position of one
// period to its element (SourceIndex). Positions past `end` (the natural
// blocks after the quads, the last 64 of an MLX row of 64 x odd, the half
// record of an odd block count) are mapped one by one.
// For the vector layout, per record j of the period: the byte gather
// indices (within a 128-byte half of the period's codes), which half each
// byte comes from (bit i of upper[j]; only a 256-element period has two),
// and each lane's block relative to the period's first.
struct Period {
  int64_t len = 64, end = 0;
  int32_t tab[kColsElems] = {};  // (kBlockColumns: the vector layout gathers dwords)
  alignas(64) int8_t gather[4][64] = {};
  uint64_t upper[4] = {};
  alignas(64) int32_t lane_block[4][16] = {};
};

Period PeriodOf(const Geometry& g, int64_t K) {
  const int64_t nb = K / kQK;
  Period p;
  const bool columns = g.order == Order::kColumns;
  const bool pairs = g.order == Order::kPairColumns;
  const bool blocks = GroupsOf16(g.order);
  p.len = g.order == Order::kNatural ? 64 : columns || pairs ? kQKK : blocks ? kColsElems : 128;
  p.end = g.order == Order::kNatural ? K / 64 * 64
          : columns                  ? K
          : pairs                    ? nb / 8 * kQKK
          : blocks                   ? nb / kColsBlocks * kColsElems
          : g.order == Order::kQuads ? nb / 4 * 128
                                     : K / 128 * 128;
  for (int64_t o = 0; o < p.len; ++o) p.tab[o] = static_cast<int32_t>(SourceIndex(g.order, nb, o));
  for (int64_t j = 0; j < p.len / 64 && p.len <= kQKK; ++j) {
    for (int i = 0; i < 64; ++i) {
      const int32_t t = p.tab[64 * j + i];
      p.gather[j][i] = static_cast<int8_t>(t & 127);
      if (t >= 128) p.upper[j] |= uint64_t{1} << i;
    }
    for (int l = 0; l < 16; ++l) p.lane_block[j][l] = p.tab[64 * j + 4 * l] / kQK;
  }
  return p;
}

// Records and corrections of positions [0, per.end) of one row, vectorized
// (x86 with VNNI and VBMI; the bytes of the scalar loop in Prepare).
void PrepareRecordsVnni(const Geometry& g, int levels, const Period& per, const int8_t* q1,
                        const int8_t* q2, const float* dn, uint8_t* rec, int32_t* corr);

// vector: lay the periodic part out with PrepareRecordsVnni where the CPU
// has it (false: the scalar loop everywhere, the reference for tests).
void Prepare(const Geometry& g, const float* X, int64_t M, int64_t ldx, int64_t K, int levels,
             Int8Rows* out, bool vector = true) {
  const int64_t nb = K / kQK, nsum = g.sum_group ? K / g.sum_group : 0;
  out->M = M;
  out->K = K;
  out->nsum = nsum;
  out->levels = levels;
  // L bytes and 1/4 f32 scale per element, then the sums, then (offset
  // weights) 1/4 int32 correction per element.
  out->stride = ((levels + 1) * K + 4 * nsum + (g.w_offset ? K : 0) + 63) / 64 * 64;
  out->buf = AlignedBuffer(M * out->stride);
  std::vector<int8_t> q1(K), q2(levels == 2 ? K : 0);
  std::vector<float> dn(nb);
  const Period per = PeriodOf(g, K);
  // Where the scalar loop starts: 0, or the end of the vectorized periods.
  const int64_t start = vector && CpuHasVnni() ? per.end : 0;
  const bool natural = g.order == Order::kNatural;
  // Element of each position the scalar loop lays out, [start, K).
  std::vector<int32_t> src(natural ? 0 : K - start);
  for (int64_t i = start; i < K && !natural; ++i)
    src[i - start] = static_cast<int32_t>(i < per.end ? i - i % per.len + per.tab[i % per.len]
                                                      : SourceIndex(g.order, nb, i));
  for (int64_t m = 0; m < M; ++m) {
    if (levels == 1) {
      QuantizeBlocksQ8(X + m * ldx, nb, q1.data(), dn.data());
    } else {
      QuantizeBlocksQ8x2(X + m * ldx, nb, q1.data(), q2.data(), dn.data());
    }
    const int8_t* const q[2] = {q1.data(), q2.data()};
    uint8_t* rec = out->buf.as<uint8_t>() + m * out->stride;
    int32_t* const corr_row = reinterpret_cast<int32_t*>(out->buf.as<uint8_t>() + m * out->stride +
                                                         (levels + 1) * K + 4 * nsum);
    if (start > 0)
      PrepareRecordsVnni(g, levels, per, q1.data(), q2.data(), dn.data(), rec,
                         g.w_offset ? corr_row : nullptr);
    rec += start / 64 * (levels + 1) * 64;
    for (int64_t pos = start; pos < K;) {
      const int64_t n = std::min<int64_t>(64, K - pos);  // 64, or 32 for the half record
      float* dx = reinterpret_cast<float*>(rec + levels * n);
      for (int l = 0; l < levels; ++l) {
        uint8_t* codes = rec + l * n;
        if (natural) {
          for (int64_t i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(q[l][pos + i]);
        } else {
          for (int64_t i = 0; i < n; ++i)
            codes[i] = static_cast<uint8_t>(q[l][src[pos - start + i]]);
        }
      }
      for (int64_t l = 0; l < n / 4; ++l)
        dx[l] = dn[(natural ? pos + 4 * l : src[pos - start + 4 * l]) / kQK];
      if (g.w_offset) {
        int32_t* corr = reinterpret_cast<int32_t*>(out->buf.as<uint8_t>() + m * out->stride +
                                                   (levels + 1) * K + 4 * nsum) +
                        pos / 4;
        const auto* c1 = reinterpret_cast<const int8_t*>(rec);
        const auto* c2 = reinterpret_cast<const int8_t*>(rec + n);
        for (int64_t l = 0; l < n / 4; ++l) {
          int32_t t = 0;
          for (int64_t i = 4 * l; i < 4 * l + 4; ++i)
            t += levels == 1 ? c1[i] : 256 * c1[i] + c2[i];
          corr[l] = -g.w_offset * t;
        }
      }
      rec += (levels + 1) * n;
      pos += n;
    }
    if (g.w_offset && SharesLanes(g.order)) {
      int32_t* corr = reinterpret_cast<int32_t*>(out->buf.as<uint8_t>() + m * out->stride +
                                                 (levels + 1) * K + 4 * nsum);
      // Positions [from, to) in periods of `records` records.
      auto fold = [&](int64_t from, int64_t to, int64_t records) {
        for (int64_t at = from / 4; at < to / 4; at += 16 * records)
          for (int64_t j = 1; j < records; ++j)
            for (int l = 0; l < 16; ++l) {
              corr[at + l] += corr[at + 16 * j + l];
              corr[at + 16 * j + l] = 0;
            }
      };
      if (start == 0) fold(0, per.end, per.len / 64);  // (the vector path folds its periods)
      // Q4_0 column groups: the quads after the last group.
      if (g.order == Order::kBlockColumns) fold(per.end, nb / 4 * 128, 2);
    }
    float* sums =
        reinterpret_cast<float*>(out->buf.as<uint8_t>() + m * out->stride + (levels + 1) * K);
    // sum over the group of dx * code (code = q1, or 256 q1 + q2); a group is
    // part of one block or whole blocks.
    const int64_t part = std::min<int64_t>(g.sum_group, kQK);
    for (int64_t s = 0; s < nsum; ++s) {
      float acc = 0;
      for (int64_t j = s * g.sum_group; j < (s + 1) * g.sum_group; j += part) {
        int32_t t = 0;
        for (int64_t i = 0; i < part; ++i)
          t += levels == 1 ? q1[j + i] : 256 * q1[j + i] + q2[j + i];
        acc += dn[j / kQK] * static_cast<float>(t);
      }
      sums[s] = acc;
    }
  }
}

#if defined(__x86_64__)

LUMEN_INTRINSICS_BEGIN

}  // namespace

bool CpuHasVnni() {
  static const bool has = [] {  // CPU feature, fixed for the process
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("avx512vbmi");  // vpermt2b gathers the quads
  }();
  return has;
}

namespace {

// The same for Q4_0 column groups: record j of a group is dword j of each
// of its 16 blocks (a dword gather), every record's lane scales are the 16
// blocks' d, and the eight records' corrections sum into the first.
LUMEN_VNNI void PrepareBlockColumnsVnni(const Geometry& g, int levels, const Period& per,
                                        const int8_t* q1, const int8_t* q2, const float* dn,
                                        uint8_t* rec, int32_t* corr) {
  const int8_t* const q[2] = {q1, q2};
  const __m512i ones = _mm512_set1_epi8(1), neg_off = _mm512_set1_epi32(-g.w_offset);
  const __m512i lane8 =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(8));
  // MLX groups: record j lane l is not dword j of block l but its bytes
  // 8 (j % 4) + j / 4 + 2 i (SourceIndex), so each block's bytes are first
  // put in that order (one byte permute per two blocks), then gathered alike.
  const bool mlx = g.order == Order::kMlxGroups;
  alignas(64) int8_t perm_idx[64] = {}, permuted[2][kColsElems];
  for (int b = 0; mlx && b < 64; ++b) {
    const int o = b % kQK, j = o / 4, i = o % 4;
    perm_idx[b] = static_cast<int8_t>(b - o + 8 * (j % 4) + j / 4 + 2 * i);
  }
  const __m512i perm = _mm512_load_si512(perm_idx);
  for (int64_t base = 0; base < per.end; base += kColsElems) {
    const __m512 d = _mm512_loadu_ps(dn + base / kQK);
    const int8_t* src[2] = {q[0] + base, levels == 2 ? q[1] + base : nullptr};
    for (int l = 0; mlx && l < levels; ++l) {
      for (int b = 0; b < kColsElems; b += 64)
        _mm512_store_si512(permuted[l] + b,
                           _mm512_permutexvar_epi8(perm, _mm512_loadu_si512(src[l] + b)));
      src[l] = permuted[l];
    }
    __m512i total = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      const __m512i idx = _mm512_add_epi32(lane8, _mm512_set1_epi32(j));
      __m512i sum = _mm512_setzero_si512();
      for (int l = 0; l < levels; ++l) {
        const __m512i v = _mm512_i32gather_epi32(idx, src[l], 4);
        _mm512_store_si512(rec + 64 * l, v);
        const __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, v);
        sum = l == 0 ? t : _mm512_add_epi32(_mm512_slli_epi32(sum, 8), t);
      }
      _mm512_store_ps(reinterpret_cast<float*>(rec + 64 * levels), d);
      total = _mm512_add_epi32(total, _mm512_mullo_epi32(sum, neg_off));
      rec += (levels + 1) * 64;
    }
    if (!corr) continue;  // (no offset: Q4_1, Q5_1)
    int32_t* out = corr + base / 4;
    _mm512_storeu_si512(out, total);
    for (int j = 1; j < 8; ++j) _mm512_storeu_si512(out + 16 * j, _mm512_setzero_si512());
  }
}

LUMEN_VNNI void PrepareRecordsVnni(const Geometry& g, int levels, const Period& per,
                                   const int8_t* q1, const int8_t* q2, const float* dn,
                                   uint8_t* rec, int32_t* corr) {
  if (GroupsOf16(g.order)) return PrepareBlockColumnsVnni(g, levels, per, q1, q2, dn, rec, corr);
  const int64_t P = per.len, nrec = P / 64;  // records per period: 1, 2 or 4
  __m512i idx[4], lane_blk[4];
  for (int64_t j = 0; j < nrec; ++j) {
    idx[j] = _mm512_load_si512(per.gather[j]);
    lane_blk[j] = _mm512_load_si512(per.lane_block[j]);
  }
  const int8_t* const q[2] = {q1, q2};
  const __m512i ones = _mm512_set1_epi8(1), neg_off = _mm512_set1_epi32(-g.w_offset);
  const __mmask16 dn_lanes = static_cast<__mmask16>((1u << (P / kQK)) - 1);
  const int64_t rec_bytes = (levels + 1) * 64;
  for (int64_t base = 0; base < per.end; base += P) {
    __m512i c[4];
    const __m512 d = _mm512_maskz_loadu_ps(dn_lanes, dn + base / kQK);
    for (int64_t j = 0; j < nrec; ++j) {
      __m512i sum = _mm512_setzero_si512();
      for (int l = 0; l < levels; ++l) {
        const int8_t* src = q[l] + base;
        __m512i v;
        if (P == 64) {
          v = _mm512_loadu_si512(src);
        } else {
          v = _mm512_permutex2var_epi8(_mm512_loadu_si512(src), idx[j],
                                       _mm512_loadu_si512(src + 64));
          if (P == 256)  // bytes from the period's second half
            v = _mm512_mask_mov_epi8(v, per.upper[j],
                                     _mm512_permutex2var_epi8(_mm512_loadu_si512(src + 128), idx[j],
                                                              _mm512_loadu_si512(src + 192)));
        }
        _mm512_store_si512(rec + 64 * l, v);
        if (corr) {  // the lane's codes summed: q1, or 256 q1 + q2
          const __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, v);
          sum = l == 0 ? t : _mm512_add_epi32(_mm512_slli_epi32(sum, 8), t);
        }
      }
      _mm512_store_ps(reinterpret_cast<float*>(rec + 64 * levels),
                      _mm512_permutexvar_ps(lane_blk[j], d));
      c[j] = _mm512_mullo_epi32(sum, neg_off);
      rec += rec_bytes;
    }
    if (corr) {
      int32_t* out = corr + base / 4;
      if (SharesLanes(g.order)) {
        __m512i total = c[0];
        for (int64_t j = 1; j < nrec; ++j) {
          total = _mm512_add_epi32(total, c[j]);
          _mm512_storeu_si512(out + 16 * j, _mm512_setzero_si512());
        }
        _mm512_storeu_si512(out, total);
      } else {
        for (int64_t j = 0; j < nrec; ++j) _mm512_storeu_si512(out + 16 * j, c[j]);
      }
    }
  }
}

LUMEN_VNNI inline uint32_t LoadU16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// QuantizeBlockQ8 on 32 floats, 16 lanes at a time: amax, d = amax / 127,
// round(x / d) half away from zero (trunc, then +-1 where the dropped fraction
// is at least one half: exact, as v - trunc(v) is exact below 2^23), clamped
// to [-127, 127]; as floats, then as bytes.
LUMEN_VNNI inline __m512 RoundHalfAwayF(__m512 v) {
  const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
  const __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  const __m512 step =
      _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(v, _mm512_set1_ps(-0.0f)));  // +-1, v's sign
  const __m512 r = _mm512_mask_add_ps(t, up, t, step);
  return _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
}

LUMEN_VNNI inline __m128i ToBytes(__m512 r) { return _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(r)); }

LUMEN_VNNI inline __m128i RoundHalfAway(__m512 v) { return ToBytes(RoundHalfAwayF(v)); }

LUMEN_VNNI void QuantizeBlocksAvx512(const float* x, int64_t nb, int8_t* q, float* d) {
  for (int64_t b = 0; b < nb; ++b, x += kQK, q += kQK) {
    const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    if (!(amax <= std::numeric_limits<float>::max())) {  // inf or NaN: the scalar rules
      d[b] = QuantizeBlockQ8(x, q);
      continue;
    }
    d[b] = amax / 127;
    const float id = d[b] != 0 ? 1.0f / d[b] : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), RoundHalfAway(_mm512_mul_ps(lo, vid)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), RoundHalfAway(_mm512_mul_ps(hi, vid)));
  }
}

// QuantizeBlockQ8x2 (core/quant.h) likewise: level 1 as above, kept as
// floats for the residual r = x - d q1 (fnmadd: one rounding, as std::fma),
// then q2 = round(r * id2). Blocks the fast path does not reproduce bit for
// bit (a non-finite input or scale) take the scalar definition. Returns d2
// per block.
LUMEN_VNNI void QuantizeBlocksX2Avx512(const float* x, int64_t nb, int8_t* q1, int8_t* q2,
                                       float* d2) {
  for (int64_t b = 0; b < nb; ++b, x += kQK, q1 += kQK, q2 += kQK) {
    const __m512 v[2] = {_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16)};
    const float amax =
        _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f, id2 = d != 0 ? 256.0f * id : 0.0f;
    const __mmask16 finite =
        _mm512_cmp_ps_mask(_mm512_abs_ps(v[0]), _mm512_set1_ps(amax), _CMP_LE_OQ) &
        _mm512_cmp_ps_mask(_mm512_abs_ps(v[1]), _mm512_set1_ps(amax), _CMP_LE_OQ);
    if (!(amax <= std::numeric_limits<float>::max()) ||
        !(id2 <= std::numeric_limits<float>::max()) ||
        finite != 0xFFFF) {  // inf, NaN, or 256 / d overflows: the scalar rules
      d2[b] = QuantizeBlockQ8x2(x, q1, q2);
      continue;
    }
    const __m512 vd = _mm512_set1_ps(d), vid = _mm512_set1_ps(id), vid2 = _mm512_set1_ps(id2);
    for (int h = 0; h < 2; ++h) {
      const __m512 r1 = RoundHalfAwayF(_mm512_mul_ps(v[h], vid));
      const __m512 res = _mm512_fnmadd_ps(vd, r1, v[h]);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q1 + 16 * h), ToBytes(r1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q2 + 16 * h),
                       RoundHalfAway(_mm512_mul_ps(res, vid2)));
    }
    d2[b] = d / 256;
  }
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

// The same on a half record (32 elements: L x 32 B).
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

// The lane sums of a twin (two code vectors a, b whose lanes hold the same
// blocks) against its two activation records at rec.
template <int L>
LUMEN_VNNI inline __m512i TwinDot(__m512i init, __m512i a, __m512i b, const uint8_t* rec) {
  return Levels<L>(init, [&](__m512i acc, int level) LUMEN_VNNI {
    acc = _mm512_dpbusd_epi32(acc, a, _mm512_load_si512(rec + 64 * level));
    return _mm512_dpbusd_epi32(acc, b, _mm512_load_si512(rec + kRecord<L> + 64 * level));
  });
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

// Per 32-bit lane l, the value f(l).
template <class Fn>
LUMEN_VNNI inline __m512i LaneValues(Fn f) {
  alignas(64) int32_t v[16];
  for (int l = 0; l < 16; ++l) v[l] = f(l);
  return _mm512_load_si512(v);
}

// Rows [n0, n1) of W (a legacy 32-block format) against MB prepared
// activation rows starting at m0, over the units (four blocks: a quad, or
// Q8_0's two pairs) of span s: quads (two records each), then with the last
// span the row's last one to three blocks in natural order (a pair record,
// a half record). Two accumulators per row so the FMA latency does not bind.
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
                kOffset ? _mm512_loadu_si512(rp.corr[r] + 32 * q) : _mm512_setzero_si512();
            const __m512i i = TwinDot<L>(init, w.a, w.b, rec);
            const __m512 sd =
                _mm512_mul_ps(w.d, _mm512_load_ps(reinterpret_cast<const float*>(rec + 64 * L)));
            acc[r][A] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sd, acc[r][A]);
          }
          if constexpr (kMin)
            for (int r = 0; r < MB; ++r)
              off[r] = _mm_fmadd_ps(w.m, _mm_loadu_ps(rp.sums[r] + 4 * q), off[r]);
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
          const __m512i init = _mm512_loadu_si512(rp.corr[r] + 64 * G);
          const __m512i i = ColumnDot<L>(init, col, rec);
          const __m512 sd =
              _mm512_mul_ps(d, _mm512_load_ps(reinterpret_cast<const float*>(rec + 64 * L)));
          acc[r][A] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sd, acc[r][A]);
        }
      };
      // Q4_0 column group G (units 4 G .. 4 G + 3, records 8 G ..; core/repack.h)
      // into accumulator set A: column c's low nibbles meet record c, its
      // high nibbles record 4 + c (Q8_0: columns c and 4 + c), and a lane
      // sums one block's 32 products, so the lane work is paid once per 512
      // weights.
      auto cgroup = [&]<int A>(int64_t G, std::integral_constant<int, A>) LUMEN_VNNI {
        const uint8_t* grp = row + G * kColsBlocks * bb;
        PrefetchAhead(grp, kColsBlocks * bb, s.ahead);
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
              kOffset ? _mm512_loadu_si512(rp.corr[r] + 128 * G) : _mm512_setzero_si512();
          const __m512i i = GroupDot<L>(init, lo, hi, rec);
          const __m512 sd =
              _mm512_mul_ps(d, _mm512_load_ps(reinterpret_cast<const float*>(rec + 64 * L)));
          acc[r][A] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sd, acc[r][A]);
          if constexpr (kMin)  // m times each block's activation sum, lane by lane
            acc[r][A] = _mm512_fmadd_ps(
                _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp + f.m))),
                _mm512_loadu_ps(rp.sums[r] + kColsBlocks * G), acc[r][A]);
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
              kOffset ? _mm512_loadu_si512(rp.corr[r] + 16 * rec_at) : _mm512_setzero_si512();
          const __m512i i = LevelDot<L>(init, w, rec);
          const __m512 sd =
              _mm512_mul_ps(s, _mm512_load_ps(reinterpret_cast<const float*>(rec + 64 * L)));
          acc[r][A] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sd, acc[r][A]);
          if constexpr (kMin) {
            const __m128 sums =
                _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rp.sums[r] + b)));
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
                  ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rp.corr[r] + 16 * rec_at))
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
          if constexpr (kMin) tail[r] = std::fma(F16Scalar(blk + 2), rp.sums[r][b], tail[r]);
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

// 64 unsigned codes (elements 64j..64j+63 of a Q4_K super-block) from 32 bytes.
LUMEN_VNNI inline __m512i NibblePair(const uint8_t* p) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i m = _mm256_set1_epi8(0x0F);
  const __m256i lo = _mm256_and_si256(q, m), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m);
  return _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1);
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

// acc += cvt(dot(w, codes)) * lanes * dx for every row; A selects the
// accumulator (compile time, see Rows).
template <int MB, int A, int L>
LUMEN_VNNI inline void DotRecords(const uint8_t* const* x, int64_t chunk, __m512i w, __m512 lanes,
                                  __m512 (&acc)[MB][2]) {
  for (int r = 0; r < MB; ++r) {
    const uint8_t* rec = x[r] + kRecord<L> * chunk;
    const __m512i i = LevelDot<L>(_mm512_setzero_si512(), w, rec);
    const __m512 sd =
        _mm512_mul_ps(lanes, _mm512_load_ps(reinterpret_cast<const float*>(rec + 64 * L)));
    acc[r][A] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sd, acc[r][A]);
  }
}

// Elements per sub-block (a lane scale and an offset each).
constexpr int SubBlock(Fmt f) { return f == Fmt::kQ4K || f == Fmt::kQ5K ? 32 : 16; }

// A K-quant super-block's sub-block scales a and offsets o (w = a q - o), one
// per lane (sub-blocks of 32: lanes 0-7).
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
    *o = _mm512_mul_ps(*a, _mm512_set1_ps(32.0f));
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
    *o = _mm512_mul_ps(*a, _mm512_set1_ps(4.0f));
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
  } else if constexpr (F == Fmt::kQ6KC) {
    // Q6_K slices (core/repack.h): column j's low 4 bits are a nibble of
    // vector j % 2, its top 2 bits bits 2 j of the third; moved to bits 4-5
    // and joined by one ternary op (a | (b & 0x30)).
    const __m512i va = _mm512_loadu_si512(blk), vb = _mm512_loadu_si512(blk + 64);
    const __m512i h = _mm512_loadu_si512(blk + 128), k30 = _mm512_set1_epi8(0x30);
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
  // slices: every super-block is Q6_K's but for where its codes lie.
  constexpr Fmt FQ = F == Fmt::kQ4KC   ? Fmt::kQ4K
                     : F == Fmt::kQ5KC ? Fmt::kQ5K
                     : F == Fmt::kQ6KC ? Fmt::kQ6K
                                       : F;
  constexpr bool kGroups = F == Fmt::kQ4KC || F == Fmt::kQ5KC;
  constexpr int kSubs = kQKK / SubBlock(FQ);  // 16 or 8 sub-blocks
  const RowPtrs<MB> rows(X, m0);
  const auto& x = rows.x;
  // Slice l's scale: sub-block l, or (sub-blocks of 32) l / 2.
  const __m512i halves = LaneValues([](int l) { return l / 2; });
  const __mmask16 sums_mask = kSubs == 16 ? 0xFFFF : 0x00FF;
  for (int64_t n = n0; n < n1; ++n)
    for (const Span& s : spans) {
      const uint8_t* row = W.w.row<const uint8_t>(n);
      __m512 acc[MB][2], off[MB];
      for (int r = 0; r < MB; ++r) acc[r][0] = acc[r][1] = off[r] = _mm512_setzero_ps();
      // Super-block sb into accumulator set A (compile time, see Rows).
      auto super = [&]<int A>(int64_t sb, std::integral_constant<int, A>) LUMEN_VNNI {
        const uint8_t* blk = row + sb * g.block_bytes;
        PrefetchAhead(blk, g.block_bytes, s.ahead);
        __m512 a, o;
        SubScales<FQ>(blk, &a, &o);
        if constexpr (kSubs == 8) a = _mm512_permutexvar_ps(halves, a);
        __m512i u[4];
        SuperColumns<F == Fmt::kQ6KC ? F : FQ>(blk, u);
        for (int r = 0; r < MB; ++r) {
          const uint8_t* rec = x[r] + kRecord<L> * 4 * sb;
          const __m512i i = ColumnDot<L>(_mm512_setzero_si512(), u, rec);
          const __m512 sd =
              _mm512_mul_ps(a, _mm512_load_ps(reinterpret_cast<const float*>(rec + 64 * L)));
          acc[r][A] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sd, acc[r][A]);
          off[r] = _mm512_fmadd_ps(o, _mm512_maskz_loadu_ps(sums_mask, rows.sums[r] + kSubs * sb),
                                   off[r]);
        }
      };
      // Column group G (super-blocks 2 G, 2 G + 1, records 8 G ..; core/repack.h)
      // into accumulator set A: lane l is sub-block l, so as in Rows' cgroup
      // column c's low nibbles meet record c, its high nibbles record 4 + c,
      // and the scales, offsets and conversion are paid once per 512 weights.
      auto cgroup = [&]<int A>(int64_t G, std::integral_constant<int, A>) LUMEN_VNNI {
        const uint8_t* grp = row + 2 * G * g.block_bytes;
        PrefetchAhead(grp, 2 * g.block_bytes, s.ahead);
        const ColsFields f = ColsFieldsAt(FQ == Fmt::kQ4K ? DType::kQ4_K : DType::kQ5_K, grp);
        __m512 a, o;
        ScalesMinsQ4KPair(grp + f.scales, &a, &o);
        __m512i lo[4], hi[4];
        GroupCodes<FQ == Fmt::kQ5K>(grp, f, lo, hi);
        for (int r = 0; r < MB; ++r) {
          const uint8_t* rec = x[r] + kRecord<L> * 8 * G;
          const __m512i i = GroupDot<L>(_mm512_setzero_si512(), lo, hi, rec);
          const __m512 sd =
              _mm512_mul_ps(a, _mm512_load_ps(reinterpret_cast<const float*>(rec + 64 * L)));
          acc[r][A] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sd, acc[r][A]);
          off[r] = _mm512_fmadd_ps(o, _mm512_loadu_ps(rows.sums[r] + kColsBlocks * G), off[r]);
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
        const float y = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1])) -
                        _mm512_reduce_add_ps(off[r]);
        float& out = Y[(m0 + r) * ldy + n];
        out = s.first ? y : out + y;
      }
    }
}

// n values of type t (f16, bf16 or f32) as f32.
LUMEN_VNNI inline void ToF32(DType t, const uint8_t* p, float* out, int64_t n) {
  int64_t i = 0;
  if (t == DType::kF16) {
    for (; i + 16 <= n; i += 16)
      _mm512_storeu_ps(
          out + i,
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i))));
  } else if (t == DType::kBF16) {
    for (; i + 16 <= n; i += 16) {
      const __m512i w =
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i)));
      _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
  }
  if (i < n) DequantizeRow(t, p + i * Info(t).block_bytes, out + i, n - i);
}

// MLX 4-bit (F = kMlx4) or 8-bit (kMlx8), groups of 32, 64 or 128 (K a
// multiple of 64).
template <Fmt F, int MB, int L>
LUMEN_VNNI void RowsMlx(const Matrix& W, const Int8Rows& X, int64_t m0, float* Y, int64_t ldy,
                        int64_t n0, int64_t n1, std::span<const Span> spans) {
  const int64_t K = W.k, G = W.mlx_group, ng = K / G;
  const RowPtrs<MB> rows(X, m0);
  const auto& x = rows.x;
  // A twin's lane l is group (128 t + 8 l) / G: groups of 32, 4t + l / 4; of 64, 2t + l / 8.
  const __m512i idx_twin = G == 32
                               ? _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0)
                               : _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  // The last record of a row of 64 x odd elements, groups of 32: lanes of groups 2c and 2c + 1.
  const __m512i idx32 = F == Fmt::kMlx4
                            ? _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0)
                            : _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  std::vector<float> sb(2 * ng);     // the row's scales, then biases
  const int64_t per_twin = 128 / G;  // groups per twin (G < 128), hoisted: GCC divided per twin
  const int64_t ss = Info(W.scales.dtype).block_bytes;
  const bool grouped = W.mlx_order == MlxOrder::kGroups;
  const int64_t code_row =
      W.n > 1 ? W.w.row<const uint8_t>(1) - W.w.row<const uint8_t>(0) : K * W.mlx_bits / 8;
  for (int64_t n = n0; n < n1; ++n)
    for (const Span& s : spans) {
      // The scales and biases are two more streams, a line or a few per row:
      // ask for those of the row the codes' prefetch reaches (the hardware
      // prefetchers of the Xeon in prefetch.h do not run ahead of them).
      if (s.first && n + 1 < W.n) {
        const int64_t r = std::min(W.n - 1, n + (s.ahead + code_row - 1) / code_row);
        PrefetchAhead(W.scales.row(r), ng * ss, 0);
        PrefetchAhead(W.biases.row(r), ng * ss, 0);
      }
      // The span's groups (the last span's run to the row's end); the biases
      // are needed by the last span only.
      const int64_t g0 = s.u0 * 128 / G, g1 = s.last ? ng : s.u1 * 128 / G;
      const uint8_t* codes = W.w.row<const uint8_t>(n);
      ToF32(W.scales.dtype, W.scales.row<const uint8_t>(n) + g0 * ss, sb.data() + g0, g1 - g0);
      if (s.last) ToF32(W.biases.dtype, W.biases.row<const uint8_t>(n), sb.data() + ng, ng);
      __m512 acc[MB][2], off[MB];
      for (int r = 0; r < MB; ++r) acc[r][0] = acc[r][1] = off[r] = _mm512_setzero_ps();
      // Twin t (elements 128 t .. 128 t + 127, records 2t and 2t + 1) into
      // accumulator A: lane l of both vectors is elements 8l .. 8l + 7, one
      // group. MLX 4-bit: the 64 bytes' low nibbles (even elements) and high
      // nibbles (odd); 8-bit: the even and the odd 4-byte words of 128 bytes.
      auto twin = [&]<int A>(int64_t t, std::integral_constant<int, A>) LUMEN_VNNI {
        __m512i a, b;
        // Without it the twin's code loads waited on DRAM (Zen 5, one thread:
        // MLX 4-bit decode 19.0 -> 20.2 tok/s, session 11).
        constexpr int kTwinBytes = F == Fmt::kMlx4 ? 64 : 128;
        PrefetchAhead(codes + kTwinBytes * t, kTwinBytes, s.ahead);
        if constexpr (F == Fmt::kMlx4) {
          const __m512i y = _mm512_loadu_si512(codes + 64 * t), m = _mm512_set1_epi8(0x0F);
          a = _mm512_and_si512(y, m);
          b = _mm512_and_si512(_mm512_srli_epi16(y, 4), m);
        } else {
          const __m512i t0 = _mm512_loadu_si512(codes + 128 * t);
          const __m512i t1 = _mm512_loadu_si512(codes + 128 * t + 64);
          const __m512i even =
              _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
          a = _mm512_permutex2var_epi32(t0, even, t1);
          b = _mm512_permutex2var_epi32(t0, _mm512_add_epi32(even, _mm512_set1_epi32(1)), t1);
        }
        const __m512 sc =
            G == 128 ? _mm512_set1_ps(sb[t])
                     : _mm512_permutexvar_ps(
                           idx_twin, _mm512_maskz_loadu_ps(G == 32 ? 0xF : 0x3, &sb[t * per_twin]));
        for (int r = 0; r < MB; ++r) {
          const uint8_t* rec = x[r] + kRecord<L> * 2 * t;
          const __m512i i = TwinDot<L>(_mm512_setzero_si512(), a, b, rec);
          const __m512 sd =
              _mm512_mul_ps(sc, _mm512_load_ps(reinterpret_cast<const float*>(rec + 64 * L)));
          acc[r][A] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sd, acc[r][A]);
        }
      };
      // Group Q (elements 512 Q .. 512 Q + 511, records 8 Q ..) into
      // accumulator A, as a column group: lane l is activation block l (32
      // elements, one dx, one MLX group or half or a quarter of one). MLX
      // 4-bit, as Q4_0's: column c is its dword c (elements 8c .. 8c + 7),
      // whose low nibbles meet record c and high nibbles record 4 + c
      // (SourceIndex); in the file's order the four columns are gathered from
      // the group's four vectors at run time (two vpermt2d and a blend each),
      // in groups (MlxOrder::kGroups, made at load) each is one load. The
      // lane work is paid once per 512 weights, not once per 128 as in a twin.
      // MLX 8-bit (only in groups), as Q8_0's: columns 0-3 meet records 0-3,
      // columns 4-7 records 4-7 (its codes unsigned already).
      auto group = [&]<int A>(int64_t Q, std::integral_constant<int, A>) LUMEN_VNNI {
        constexpr int kGroupBytes = F == Fmt::kMlx4 ? 256 : 512;
        const uint8_t* c0 = codes + kGroupBytes * Q;
        PrefetchAhead(c0, kGroupBytes, s.ahead);
        const __m512i v[4] = {_mm512_loadu_si512(c0), _mm512_loadu_si512(c0 + 64),
                              _mm512_loadu_si512(c0 + 128), _mm512_loadu_si512(c0 + 192)};
        const __m512i k4 = _mm512_set1_epi8(0x0F);
        __m512i lo[4], hi[4];
        for (int c = 0; c < 4; ++c) {
          if constexpr (F == Fmt::kMlx8) {
            lo[c] = v[c];
            hi[c] = _mm512_loadu_si512(c0 + 256 + 64 * c);
          } else {
            // File order: lane l <- dword 4 (l % 8) + c of [v0 | v1] (lanes 0-7) or [v2 | v3].
            const __m512i idx = LaneValues([c](int l) { return 4 * (l % 8) + c; });
            const __m512i col = grouped ? v[c]
                                        : _mm512_mask_blend_epi32(
                                              0xFF00, _mm512_permutex2var_epi32(v[0], idx, v[1]),
                                              _mm512_permutex2var_epi32(v[2], idx, v[3]));
            lo[c] = _mm512_and_si512(col, k4);
            hi[c] = _mm512_and_si512(_mm512_srli_epi16(col, 4), k4);
          }
        }
        const float* sg = &sb[Q * (kColsElems / G)];
        const __m512 sc = G == 32   ? _mm512_loadu_ps(sg)
                          : G == 64 ? _mm512_permutexvar_ps(LaneValues([](int l) { return l / 2; }),
                                                            _mm512_maskz_loadu_ps(0xFF, sg))
                                    : _mm512_permutexvar_ps(LaneValues([](int l) { return l / 4; }),
                                                            _mm512_maskz_loadu_ps(0xF, sg));
        for (int r = 0; r < MB; ++r) {
          const uint8_t* rec = x[r] + kRecord<L> * 8 * Q;
          const __m512i i = GroupDot<L>(_mm512_setzero_si512(), lo, hi, rec);
          const __m512 sd =
              _mm512_mul_ps(sc, _mm512_load_ps(reinterpret_cast<const float*>(rec + 64 * L)));
          acc[r][A] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sd, acc[r][A]);
        }
      };
      int64_t t = s.u0;
      if (F == Fmt::kMlx4 || grouped)  // spans start on a group (BySpans); then twins
        t = EachGroup(t, std::min(s.u1, K / kColsElems * 4), 4, group);
      for (; t + 2 <= s.u1; t += 2) {
        twin(t, std::integral_constant<int, 0>{});
        twin(t + 1, std::integral_constant<int, 1>{});
      }
      if (t < s.u1) twin(t, std::integral_constant<int, 0>{});
      if (s.last && K % 128 != 0) {  // the last 64 elements, one record (see Layout)
        const int64_t c = K / 64 - 1;
        const __m512i w =
            F == Fmt::kMlx4 ? NibblePair(codes + 32 * c) : _mm512_loadu_si512(codes + 64 * c);
        const __m512 sc = G == 32
                              ? _mm512_permutexvar_ps(idx32, _mm512_maskz_loadu_ps(3, &sb[2 * c]))
                              : _mm512_set1_ps(sb[c * 64 / G]);
        DotRecords<MB, 0, L>(x, c, w, sc, acc);
      }
      // Bias term: sum_g b_g * (sum of the group's activations), 16 groups at a time.
      for (int64_t g = 0; s.last && g < ng; g += 16) {
        const __mmask16 k = ng - g >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (ng - g)) - 1);
        const __m512 b = _mm512_maskz_loadu_ps(k, sb.data() + ng + g);
        for (int r = 0; r < MB; ++r)
          off[r] = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(k, rows.sums[r] + g), off[r]);
      }
      for (int r = 0; r < MB; ++r) {
        const float y = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1])) +
                        _mm512_reduce_add_ps(off[r]);
        float& out = Y[(m0 + r) * ldy + n];
        out = s.first ? y : out + y;
      }
    }
}

// Calls run(integral_constant<MB>, m) over the rows four at a time, then the rest.
template <class Run>
void ByFours(int64_t M, Run run) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) run(std::integral_constant<int, 4>{}, m);
  switch (M - m) {
    case 3:
      return run(std::integral_constant<int, 3>{}, m);
    case 2:
      return run(std::integral_constant<int, 2>{}, m);
    case 1:
      return run(std::integral_constant<int, 1>{}, m);
    default:
      return;
  }
}

// K-blocking. A row's activation records take (L + 1) bytes per element,
// and Q4_0/Q5_0/Q8_0's lane corrections one more: 32 KB at K = 8192 and two
// levels, 128 KB for four rows, which do not stay in Zen 5's 48 KB L1 beside
// the weights (four rows in cache, Q8_0: 43 GFLOP/s at K = 8192 against 117
// at 2048; Q4_0 92 against 155; docs/reference/performance.md, session 14).
// So each row's sum is taken in spans of kSpanK elements, added up in span
// order. Several activation rows run every weight row over one span, then
// the next, adding to Y (the weights read in row segments, the prefetch
// going to the same segment of a later row); one activation row keeps the
// weights streaming contiguously, spans innermost, which for it measured
// faster (one row from DRAM, Q4_0: 63 GFLOP/s against 54 in segments). Both
// orders add the same partial sums in the same order: a row's result does
// not depend on how many rows share the call.
inline constexpr int64_t kSpanK = 2048;

// Calls run(spans, n0, n1): one activation row takes all the spans of each
// weight row in turn; several take one span of every weight row at a time.
template <class Run>
void BySpans(const Matrix& W, const Geometry& g, int64_t M, int64_t n0, int64_t n1, Run run) {
  constexpr int kMaxSpans = 64;
  const int64_t unit = g.order == Order::kColumns || g.order == Order::kBlockColumnsK ? kQKK : 128;
  const int64_t units = W.k / unit;
  // Rows past kMaxSpans x kSpanK elements take longer spans.
  int64_t per = std::max(kSpanK / unit, (units + kMaxSpans - 1) / kMaxSpans);
  if (g.order == Order::kPairColumns) per += per % 2;  // whole groups of 8 blocks
  if (g.order == Order::kBlockColumns || g.order == Order::kBlockColumnsQ8 ||
      g.order == Order::kMlxGroups || g.order == Order::kMlx8Groups)
    per = (per + 3) / 4 * 4;                             // of 16 blocks
  if (g.order == Order::kBlockColumnsK) per += per % 2;  // of 2 super-blocks
  Span spans[kMaxSpans];
  int count = 0;
  for (int64_t u = 0; u < units || count == 0; u += per) {
    const int64_t e = std::min(units, u + per);
    spans[count++] = Span{u, e, u == 0, e == units, kAheadBytes};
  }
  if (M == 1 || count == 1) return run(std::span<const Span>(spans, count), n0, n1);
  // The weight bytes of one span of a row (MLX: its codes, which the kernel prefetches).
  const int64_t row = W.w.row<const uint8_t>(1) - W.w.row<const uint8_t>(0);
  const int64_t unit_bytes = W.mlx_bits     ? 128 * W.mlx_bits / 8
                             : unit == kQKK ? g.block_bytes
                                            : 4 * g.block_bytes;
  const int64_t seg = per * unit_bytes, rows_ahead = (kAheadBytes + seg - 1) / seg;
  for (int i = 0; i < count; ++i) {
    spans[i].ahead = rows_ahead * row;
    run(std::span<const Span>(spans + i, 1), n0, n1);
  }
}

template <int L>
void MatMulRowsLevels(const Matrix& W, const Int8Rows& X, float* Y, int64_t ldy, int64_t n0,
                      int64_t n1) {
  const Geometry g = GeometryFor(W);
  BySpans(W, g, X.M, n0, n1, [&](std::span<const Span> s, int64_t b, int64_t e) {
    ByFours(X.M, [&](auto mb, int64_t m) {
      constexpr int MB = decltype(mb)::value;
      switch (g.fmt) {
        case Fmt::kQ4_0:
          return Rows<Fmt::kQ4_0, MB, L>(W, g, X, m, Y, ldy, b, e, s);
        case Fmt::kQ4_0C:
          return Rows<Fmt::kQ4_0C, MB, L>(W, g, X, m, Y, ldy, b, e, s);
        case Fmt::kQ4_1C:
          return Rows<Fmt::kQ4_1C, MB, L>(W, g, X, m, Y, ldy, b, e, s);
        case Fmt::kQ5_0C:
          return Rows<Fmt::kQ5_0C, MB, L>(W, g, X, m, Y, ldy, b, e, s);
        case Fmt::kQ5_1C:
          return Rows<Fmt::kQ5_1C, MB, L>(W, g, X, m, Y, ldy, b, e, s);
        case Fmt::kQ4_1:
          return Rows<Fmt::kQ4_1, MB, L>(W, g, X, m, Y, ldy, b, e, s);
        case Fmt::kQ5_0:
          return Rows<Fmt::kQ5_0, MB, L>(W, g, X, m, Y, ldy, b, e, s);
        case Fmt::kQ5_1:
          return Rows<Fmt::kQ5_1, MB, L>(W, g, X, m, Y, ldy, b, e, s);
        case Fmt::kQ8_0:
          return Rows<Fmt::kQ8_0, MB, L>(W, g, X, m, Y, ldy, b, e, s);
        case Fmt::kQ8_0C:
          return Rows<Fmt::kQ8_0C, MB, L>(W, g, X, m, Y, ldy, b, e, s);
        case Fmt::kQ2K:
          return RowsK<Fmt::kQ2K, MB, L>(W, g, X, m, Y, ldy, b, e, s);
        case Fmt::kQ3K:
          return RowsK<Fmt::kQ3K, MB, L>(W, g, X, m, Y, ldy, b, e, s);
        case Fmt::kQ4K:
          return RowsK<Fmt::kQ4K, MB, L>(W, g, X, m, Y, ldy, b, e, s);
        case Fmt::kQ5K:
          return RowsK<Fmt::kQ5K, MB, L>(W, g, X, m, Y, ldy, b, e, s);
        case Fmt::kQ4KC:
          return RowsK<Fmt::kQ4KC, MB, L>(W, g, X, m, Y, ldy, b, e, s);
        case Fmt::kQ5KC:
          return RowsK<Fmt::kQ5KC, MB, L>(W, g, X, m, Y, ldy, b, e, s);
        case Fmt::kQ6K:
          return RowsK<Fmt::kQ6K, MB, L>(W, g, X, m, Y, ldy, b, e, s);
        case Fmt::kQ6KC:
          return RowsK<Fmt::kQ6KC, MB, L>(W, g, X, m, Y, ldy, b, e, s);
        case Fmt::kMlx4:
          return RowsMlx<Fmt::kMlx4, MB, L>(W, X, m, Y, ldy, b, e, s);
        case Fmt::kMlx8:
          return RowsMlx<Fmt::kMlx8, MB, L>(W, X, m, Y, ldy, b, e, s);
      }
    });
  });
}

void MatMulRowsInt8(const Matrix& W, const Int8Rows& X, float* Y, int64_t ldy, int64_t n0,
                    int64_t n1) {
  if (X.levels == 2) return MatMulRowsLevels<2>(W, X, Y, ldy, n0, n1);
  MatMulRowsLevels<1>(W, X, Y, ldy, n0, n1);
}

LUMEN_INTRINSICS_END

#else  // no x86: the route is never supported, so these are never called

}  // namespace
bool CpuHasVnni() { return false; }
namespace {
void PrepareRecordsVnni(const Geometry&, int, const Period&, const int8_t*, const int8_t*,
                        const float*, uint8_t*, int32_t*) {
  LUMEN_CHECK(false);
}
void QuantizeBlocksAvx512(const float*, int64_t, int8_t*, float*) { LUMEN_CHECK(false); }
void QuantizeBlocksX2Avx512(const float*, int64_t, int8_t*, int8_t*, float*) { LUMEN_CHECK(false); }
void MatMulRowsInt8(const Matrix&, const Int8Rows&, float*, int64_t, int64_t, int64_t) {
  LUMEN_CHECK(false);
}

#endif

}  // namespace

void QuantizeBlocksQ8(const float* x, int64_t nb, int8_t* q, float* d) {
  if (CpuHasVnni()) return QuantizeBlocksAvx512(x, nb, q, d);
  if (CpuHasAvx2()) return QuantizeBlocksQ8Avx2(x, nb, q, d);
  for (int64_t b = 0; b < nb; ++b) d[b] = QuantizeBlockQ8(x + b * kQK, q + b * kQK);
}

void QuantizeBlocksQ8x2(const float* x, int64_t nb, int8_t* q1, int8_t* q2, float* d2) {
  if (CpuHasVnni()) return QuantizeBlocksX2Avx512(x, nb, q1, q2, d2);
  if (CpuHasAvx2()) return QuantizeBlocksQ8x2Avx2(x, nb, q1, q2, d2);
  for (int64_t b = 0; b < nb; ++b)
    d2[b] = QuantizeBlockQ8x2(x + b * kQK, q1 + b * kQK, q2 + b * kQK);
}

int64_t Int8MaxRows(const Matrix& W) {
  if (CpuHasVnni() || !CpuHasAvx2()) return kInt8MaxRows;
  // Where the bf16 panels take the longer products (AVX512-BF16 without
  // VBMI: Cooper Lake), they keep them, unmeasured against these kernels.
  if (RouteHasBf16(W.route) && CpuHasBf16()) return kInt8MaxRows;
  return Avx2Int8MaxRows(W);
}

DType Int8ColumnGroupsOf(DType plain) {
  // The VNNI kernels decode Q2_K / Q3_K in the file's order (unmeasured
  // against records) and take Q5_K's masks as they are.
  if (CpuHasVnni())
    return plain == DType::kQ2_K || plain == DType::kQ3_K ? plain : ColumnGroupsOf(plain);
  if (!CpuHasAvx2()) return plain;
  return plain == DType::kQ5_K ? DType::kQ5_KPlanes : ColumnGroupsOf(plain);
}

MlxOrder Int8MlxOrder(const Matrix& W) {
  if (W.mlx_bits == 0 || W.mlx_order != MlxOrder::kFile || !Int8RouteSupports(W))
    return MlxOrder::kFile;
  return CpuHasVnni() ? MlxOrder::kGroups : MlxOrder::kRuns;  // else the AVX2 kernels
}

bool Int8RouteSupports(const Matrix& W) {
  if (!CpuHasVnni()) return CpuHasAvx2() && Avx2Int8Covers(W);
  if (W.mlx_order == MlxOrder::kRuns) return false;  // the AVX2 kernels' order, made where they run
  if (W.mlx_bits != 0) {
    const DType st = W.scales.dtype, bt = W.biases.dtype;
    auto flt = [](DType t) { return t == DType::kF16 || t == DType::kBF16 || t == DType::kF32; };
    const int64_t G = W.mlx_group;
    return (W.mlx_bits == 4 || W.mlx_bits == 8) && (G == 32 || G == 64 || G == 128) &&
           W.k % G == 0 && W.k % 64 == 0 && flt(st) && flt(bt);
  }
  switch (W.w.dtype) {
    case DType::kQ4_0:
    case DType::kQ4_0Cols:
    case DType::kQ4_1Cols:
    case DType::kQ5_0Cols:
    case DType::kQ5_1Cols:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ8_0:
    case DType::kQ8_0Cols:
      return W.k % kQK == 0;
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kQ4_KCols:
    case DType::kQ5_KCols:
    case DType::kQ6_KCols:
      return W.k % kQKK == 0;
    default:
      return false;
  }
}

bool Int8LayoutMatchesScalar(const Matrix& W, const float* X, int64_t M) {
  LUMEN_CHECK(Int8RouteSupports(W));
  const Geometry g = GeometryFor(W);
  Int8Rows vec, ref;
  Prepare(g, X, M, W.k, W.k, Int8Levels(W.route), &vec, true);
  Prepare(g, X, M, W.k, W.k, Int8Levels(W.route), &ref, false);
  return vec.buf.size() == ref.buf.size() &&
         std::memcmp(vec.buf.data(), ref.buf.data(), vec.buf.size()) == 0;
}

void MatMulInt8(const Matrix& W, const float* X, int64_t M, int64_t ldx, float* Y, int64_t ldy,
                ThreadPool* pool) {
  const MatMulOut out{&W, Y, ldy};
  MatMulManyInt8({&out, 1}, X, M, ldx, pool);
}

void MatMulManyInt8(std::span<const MatMulOut> outs, const float* X, int64_t M, int64_t ldx,
                    ThreadPool* pool) {
  if (!CpuHasVnni()) return MatMulManyInt8Avx2(outs, X, M, ldx, pool);
  if (M > kInt8MaxRows) return MatMulManyInt8x2Gemm(outs, X, M, ldx, pool, false);
  // One prepared copy of X per activation layout present (q/k/v may differ):
  // byte order, sign, offset group and level count (formats that agree on
  // all four, e.g. Q4_K and Q5_K, share one).
  struct Prepared {
    Geometry g;
    int levels;
    Int8Rows rows;
    bool Fits(const Geometry& o, int l) const {
      return g.order == o.order && g.w_offset == o.w_offset && g.sum_group == o.sum_group &&
             levels == l;
    }
  };
  std::vector<Prepared> prepared;
  prepared.reserve(outs.size());  // rows_of keeps pointers into it
  std::vector<const Int8Rows*> rows_of(outs.size());
  int64_t total = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const Matrix& w = *outs[i].w;
    LUMEN_CHECK(Int8RouteSupports(w));
    const Geometry g = GeometryFor(w);
    const int levels = Int8Levels(w.route);
    auto it = std::find_if(prepared.begin(), prepared.end(),
                           [&](const Prepared& p) { return p.Fits(g, levels); });
    if (it == prepared.end()) {
      prepared.push_back({g, levels, {}});
      it = prepared.end() - 1;
      Prepare(g, X, M, ldx, w.k, levels, &it->rows);
    }
    rows_of[i] = &it->rows;
    total += w.n;
  }
  auto fn = [&](int64_t b, int64_t e, int) {
    int64_t off = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
      const MatMulOut& o = outs[i];
      const int64_t lo = std::max<int64_t>(b - off, 0), hi = std::min<int64_t>(e - off, o.w->n);
      if (lo < hi) MatMulRowsInt8(*o.w, *rows_of[i], o.y, o.ldy, lo, hi);
      off += o.w->n;
    }
  };
  if (pool && total >= 32) {
    // Each thread streams its own range of the weights from its front; one
    // that is done takes 16-row units from the end of another's (a thread
    // of this guest can fall behind for a while).
    pool->ParallelForStealing(total, fn, 16);
  } else {
    fn(0, total, 0);
  }
}

}  // namespace lumen::kernels
