#include "lumen/kernels/matmul_q8.h"
#include "lumen/kernels/matmul_q8_avx2.h"
#include "lumen/kernels/matmul_q8_internal.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/core/check.h"
#include "lumen/core/quant.h"
#include "lumen/core/repack.h"
#include "lumen/core/route.h"
#include "lumen/kernels/cpu_vendor.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/prefetch.h"

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
//     (see SuperColumns, matmul_q8_gguf.cc); Q2_K and Q3_K repacked at load
//     (kQ2_KCols records, kQ3_KCols planes) the same with their lanes in
//     another order (Order::kHalfColumns), each column a shift and a mask
//     of one or two loads (q23_columns_avx512.h).
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
// columns of codes below 32 (16 x 31 x 32639 < 2^24) stay below it, and so
// do Q6_K's, whose lane sums are of (q - 32) x (its offset starts the sum,
// below: 16 x 32 x 32639 < 2^24); Q8_0 columns (16 products of codes up to
// 255) and MLX 8-bit twins (8 x 255 x 32639 < 2^26) can pass it, where the
// conversion rounds once (relative 2^-24, inside the oracle bound). It is scaled once
// by d2. The weight unpacking, scales and offsets are shared, and the code is
// the one-level code templated on L.
//
// MLX affine (w = s q + b per group of 32, 64 or 128) is handled like the
// K-quants with o = -b.
//
// K-quants (Q2_K .. Q6_K) have unsigned codes q and an offset per sub-block:
// w = a q - o (Q2_K: a = d (sc & 15), o = dmin (sc >> 4); Q3_K: a = d (sc -
// 32), o = 4 a; Q4_K, Q5_K: a = d sc, o = dmin m; Q6_K: a = d sc, o = 32 a).
// Their activations stay signed. The offset term sum_s o_s dx_s sum(qx over
// s) is, for Q2_K, Q4_K and Q5_K, a float dot of the super-block's offsets
// with per-row sums precomputed once per activation row (one FMA per row per
// super-block); Q3_K's and Q6_K's offsets are a fixed multiple c of a, so
// theirs is the integer -c sum(qx) per sub-block (one lane), precomputed as
// Q4_0's corrections are and taken as the lane sums' starting value.

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
              "RouteKl.Int8x2DecodeGateOnEveryWeightType;RouteKl."
              "Int8x2ShortPrefillPassesTheDefaultGate;RouteKl.Int8x2ShortPrefillGateOnMlx",
     .measure = "docs/reference/performance.md#the-int8x2-decode-route-the-default",
     .when = "act=int8x2|int8x2+bf16 cpu=avx512vnni int8=kernel",
     .priority = 20});

namespace {

using int8_vnni::Fmt;
using int8_vnni::Geometry;
using int8_vnni::GgufRowsFor;
using int8_vnni::GgufWideRowsFor;
using int8_vnni::GroupsOf16;
using int8_vnni::HalfColumnsSubBlock;
using int8_vnni::Int8Rows;
using int8_vnni::kMaxRowsPerCall;
using int8_vnni::kWideRows;
using int8_vnni::MlxRowsFor;
using int8_vnni::Order;
using int8_vnni::RowsFn;
using int8_vnni::SharesLanes;
using int8_vnni::Span;
using int8_vnni::SuperColumnOrder;

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
    case DType::kQ2_KCols:  // records: the same columns, their lanes in another order
      return {Fmt::kQ2KC, sizeof(BlockQ2K), 0, 16, Order::kHalfColumns};
    case DType::kQ3_K:  // w = a (q - 4): the offset in the integer sum (SharesLanes)
      return {Fmt::kQ3K, sizeof(BlockQ3K), 4, 0, Order::kColumns};
    case DType::kQ3_KCols:  // planes: the columns of Q2_K's records
      return {Fmt::kQ3KC, sizeof(BlockQ3K), 4, 0, Order::kHalfColumns};
    case DType::kQ4_K:
      return {Fmt::kQ4K, sizeof(BlockQ4K), 0, 32, Order::kColumns};
    case DType::kQ5_K:
      return {Fmt::kQ5K, sizeof(BlockQ5K), 0, 32, Order::kColumns};
    case DType::kQ4_KCols:
      return {Fmt::kQ4KC, sizeof(BlockQ4K), 0, 32, Order::kBlockColumnsK};
    case DType::kQ5_KCols:
      return {Fmt::kQ5KC, sizeof(BlockQ5K), 0, 32, Order::kBlockColumnsK};
    case DType::kQ6_K:  // w = a (q - 32), as Q3_K
      return {Fmt::kQ6K, sizeof(BlockQ6K), 32, 0, Order::kColumns};
    case DType::kQ6_KCols:  // the same activation layout: only the weights' bytes move
      return {Fmt::kQ6KC, sizeof(BlockQ6K), 32, 0, Order::kColumns};
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
  if (order == Order::kHalfColumns) {  // record j, lane l: sub-block 2 (l % 8) + l / 8
    const int64_t base = pos / kQKK * kQKK, o = pos % kQKK, l = o % 64 / 4;
    return base + 16 * HalfColumnsSubBlock(static_cast<int>(l)) + 4 * (o / 64) + o % 4;
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
  const bool columns = SuperColumnOrder(g.order);
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
  out->stride = (out->corr_at() + (g.w_offset ? K : 0) + 63) / 64 * 64;
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
    int32_t* const corr_row =
        reinterpret_cast<int32_t*>(out->buf.as<uint8_t>() + m * out->stride + out->corr_at());
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
        int32_t* corr = corr_row + pos / 4;
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
      int32_t* corr = corr_row;
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
        reinterpret_cast<float*>(out->buf.as<uint8_t>() + m * out->stride + out->sums_at());
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

// Weight bytes a product of more than kMaxRowsPerCall activation rows reads
// per pass of its row kernels (BySpans): well inside L2.
inline constexpr int64_t kPassBytes = 256 << 10;

// Calls run(spans, n0, n1): one activation row takes all the spans of each
// weight row in turn; several take one span of every weight row at a time,
// and more than one kernel call takes (kMaxRowsPerCall) take it in chunks of
// weight rows of about kPassBytes, which stay in L2 from one call to the next.
template <class Run>
void BySpans(const Matrix& W, const Geometry& g, int64_t M, int64_t n0, int64_t n1, Run run) {
  constexpr int kMaxSpans = 64;
  const int64_t unit = SuperColumnOrder(g.order) || g.order == Order::kBlockColumnsK ? kQKK : 128;
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
  if (M == 1) return run(std::span<const Span>(spans, count), n0, n1);
  // The weight bytes of one span of a row (MLX: its codes, which the kernel prefetches).
  const int64_t unit_bytes = W.mlx_bits     ? 128 * W.mlx_bits / 8
                             : unit == kQKK ? g.block_bytes
                                            : 4 * g.block_bytes;
  const int64_t seg = std::max<int64_t>(1, std::min(per, units) * unit_bytes);
  const int64_t chunk = M > kMaxRowsPerCall ? std::max<int64_t>(16, kPassBytes / seg) : n1 - n0;
  auto in_chunks = [&](std::span<const Span> s) {
    for (int64_t c0 = n0; c0 < n1; c0 += chunk) run(s, c0, std::min(n1, c0 + chunk));
  };
  if (count == 1) return in_chunks(std::span<const Span>(spans, 1));
  const int64_t row = W.w.row<const uint8_t>(1) - W.w.row<const uint8_t>(0);
  const int64_t rows_ahead = (kAheadBytes + seg - 1) / seg;
  for (int i = 0; i < count; ++i) {
    spans[i].ahead = rows_ahead * row;
    in_chunks(std::span<const Span>(spans + i, 1));
  }
}

// Rows [n0, n1) of W against every prepared activation row: each span (or
// all of them) and chunk of rows (BySpans), the activation rows
// kMaxRowsPerCall at a time by the format's kernel (Q2_K / Q3_K on Intel
// CPUs: kWideRows while that many are left).
void MatMulRowsInt8(const Matrix& W, const Int8Rows& X, float* Y, int64_t ldy, int64_t n0,
                    int64_t n1) {
  const Geometry g = GeometryFor(W);
  const bool mlx = g.fmt == Fmt::kMlx4 || g.fmt == Fmt::kMlx8;
  const RowsFn wide = mlx || X.M < kWideRows ? nullptr : GgufWideRowsFor(g.fmt, X.levels);
  BySpans(W, g, X.M, n0, n1, [&](std::span<const Span> s, int64_t b, int64_t e) {
    for (int64_t m = 0; m < X.M;) {
      const bool wide_call = wide != nullptr && X.M - m >= kWideRows;
      const int mb =
          wide_call ? kWideRows : static_cast<int>(std::min<int64_t>(kMaxRowsPerCall, X.M - m));
      const RowsFn rows = wide_call ? wide
                          : mlx     ? MlxRowsFor(g.fmt, mb, X.levels)
                                    : GgufRowsFor(g.fmt, mb, X.levels);
      LUMEN_DCHECK(rows != nullptr);
      rows(W, g, X, m, Y, ldy, b, e, s);
      m += mb;
    }
  });
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

namespace {

// Up to how many rows the VNNI dot kernels keep a two-level product of W
// that the bf16 panels take above (on AMD CPUs with AVX512-BF16, where they
// pay: bf16_prefill_pays.cc). The panels decode every weight once per call
// too; on Zen 5 the dot kernels ran 16-token prompts of Q2_K, Q3_K and Q4_K
// 1.06-1.20x faster than them and lost from about 20 rows (2048 x 2048,
// one thread), MLX prompts (whose panels decode slowest) 1.3-1.9x faster
// up to 24 tokens, 1.03-1.16x at 32, 0.95-0.96x at 48, Q8_0 1.27-1.29x at
// 12 tokens and 1.05-1.07x at 16, Q4_0, Q4_1, Q5_0, Q5_1 and Q5_K
// 1.04-1.19x at 12 (Q4_0 0.92-0.96x at 16, Q5_K even). Q6_K measured
// behind at 12 rows: kInt8MaxRows, as on Intel's AMX panels (unmeasured;
// performance.md, session 49).
int64_t PanelsInt8MaxRows(const Matrix& W) {
  if (Int8Levels(W.route) != 2 || !RouteHasBf16(W.route) || !CpuHasBf16() || !CpuIsAmd())
    return kInt8MaxRows;
  switch (GeometryFor(W).fmt) {
    case Fmt::kQ2K:
    case Fmt::kQ2KC:
    case Fmt::kQ3K:
    case Fmt::kQ3KC:
    case Fmt::kQ4K:
    case Fmt::kQ4KC:
    case Fmt::kQ8_0:
    case Fmt::kQ8_0C:
      return 16;
    case Fmt::kQ4_0:
    case Fmt::kQ4_0C:
    case Fmt::kQ4_1:
    case Fmt::kQ4_1C:
    case Fmt::kQ5_0:
    case Fmt::kQ5_0C:
    case Fmt::kQ5_1:
    case Fmt::kQ5_1C:
    case Fmt::kQ5K:
    case Fmt::kQ5KC:
      return 12;
    case Fmt::kMlx4:
    case Fmt::kMlx8:
      return 32;
    default:  // Q6_K
      return kInt8MaxRows;
  }
}

// Up to how many rows the VNNI dot kernels keep a product of W that the
// int8x2 GEMM would take: the GEMM decodes every weight of W into its panels
// once per call, which a 512-row chunk pays once and a 16-row prompt pays
// for 16 rows; the dot kernels' passes of four (or eight) rows cost the same
// per row at any count. Where the two met on a Xeon (BM_ShortPrompt, and the
// 1B model's prompts of 16-48 tokens; performance.md, "Short prompts on
// VNNI"): Q2_K and Q3_K, whose row steps cost the most, early; Q6_K, whose
// panels cost the most to decode, late. Where the bf16 panels take the
// longer prompts instead, PanelsInt8MaxRows; other products (one level,
// F16 / BF16 storage) keep kInt8MaxRows, unmeasured.
int64_t VnniInt8MaxRows(const Matrix& W) {
  if (!Int8RouteSupports(W)) return kInt8MaxRows;
  if (!Int8x2GemmTakes(W)) return PanelsInt8MaxRows(W);
  switch (GeometryFor(W).fmt) {
    case Fmt::kQ3K:
    case Fmt::kQ3KC:
      return 24;
    case Fmt::kQ2K:
    case Fmt::kQ2KC:
      return 32;
    case Fmt::kQ4_1:
    case Fmt::kQ4_1C:
    case Fmt::kQ5_0:
    case Fmt::kQ5_0C:
      return 48;
    case Fmt::kQ6K:
    case Fmt::kQ6KC:
      return kInt8MaxRowsVnni;
    default:  // Q4_0, Q5_1, Q8_0, Q4_K, Q5_K, MLX
      return 32;
  }
}

}  // namespace

int64_t Int8MaxRows(const Matrix& W) {
  if (CpuHasVnni()) return VnniInt8MaxRows(W);
  if (!CpuHasAvx2()) return kInt8MaxRows;
  // Where the bf16 panels take the longer products (AVX512-BF16 without
  // VBMI: Cooper Lake), they keep them, unmeasured against these kernels.
  if (RouteHasBf16(W.route) && CpuHasBf16()) return kInt8MaxRows;
  return Avx2Int8MaxRows(W);
}

DType Int8ColumnGroupsOf(DType plain) {
  // The VNNI kernels take Q5_K's masks as they are; Q2_K's records save them
  // four dword permutes per super-block, Q3_K's planes eight (one-row
  // products 1.10-1.14x faster on Zen 5, Q3_K's decode 1.11-1.13x; the bf16
  // panels decode the planes as fast as the file's bytes; performance.md,
  // sessions 48-49).
  if (CpuHasVnni()) return ColumnGroupsOf(plain);
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
    case DType::kQ2_KCols:
    case DType::kQ3_KCols:
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
  // Each product where MatMul would take it (the GEMM above its Int8MaxRows),
  // so that its bits do not depend on the products beside it.
  const auto gemm = [M](const MatMulOut& o) { return M > Int8MaxRows(*o.w); };
  if (std::any_of(outs.begin(), outs.end(), gemm)) {
    std::vector<MatMulOut> g, d;
    for (const MatMulOut& o : outs) (gemm(o) ? g : d).push_back(o);
    MatMulManyInt8x2Gemm(g, X, M, ldx, pool, false);
    if (!d.empty()) MatMulManyInt8Dots(d, X, M, ldx, pool);
    return;
  }
  MatMulManyInt8Dots(outs, X, M, ldx, pool);
}

void MatMulManyInt8Dots(std::span<const MatMulOut> outs, const float* X, int64_t M, int64_t ldx,
                        ThreadPool* pool) {
  LUMEN_CHECK(CpuHasVnni());
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
