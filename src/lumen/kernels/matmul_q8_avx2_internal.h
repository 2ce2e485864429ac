// Internal to the AVX2 int8 kernels (matmul_q8_avx2.h): what the activation
// preparation and dispatch (matmul_q8_avx2.cc), the GGUF row kernels
// (matmul_q8_avx2_gguf.cc) and the MLX row kernels (matmul_q8_avx2_mlx.cc)
// share: the prepared activations and their byte orders, the weight formats,
// the row kernels' signature and the small vector helpers they all use.
// Never included outside these files.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "lumen/core/dtype.h"
#include "lumen/core/quant.h"
#include "lumen/kernels/matrix.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define LUMEN_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

namespace lumen::kernels::int8_avx2 {

// Activation rows as the kernels read them: per row and 32-element block,
// the levels' codes together (level 1, then level 2), the block's scale, and
// the activation sums the offsets multiply.
struct Acts {
  int levels = 1;
  int order = 0;           // an Order (below; Prepare in matmul_q8_avx2.cc)
  int64_t nb = 0;          // blocks per row
  std::vector<int8_t> q;   // [M][nb][levels][32]
  std::vector<float> d;    // [M][nb]: d (one level) or d2 = d / 256 (two)
  std::vector<float> s16;  // [M][2 nb]: d x sum over each 16-element half of (256 q1 + q2), or q
  std::vector<float> s32;  // [M][nb]: the same over the block
  // [M][nb][8]: the sums of (256 q1 + q2), or q, over each 4 elements: Q4_0 /
  // Q5_0's code shift is subtracted from the dot lanes in integers (exact, as
  // the VNNI kernels do), since d q x and d 8 x nearly cancel.
  std::vector<int32_t> lanes;
  std::vector<int32_t> sums;  // [M][nb]: the same over the block
  // MLX orders only: [M][nb >> s] for s = 0, 1, 2 where nb allows, the s32
  // sums of each 32 << s element group, in the row's order (the MLX kernels'
  // bias terms).
  std::vector<float> gsum[3];
  const int8_t* Q(int64_t m, int64_t b) const { return q.data() + (m * nb + b) * kQK * levels; }
  const float* D(int64_t m) const { return d.data() + m * nb; }
  const float* S16(int64_t m) const { return s16.data() + m * 2 * nb; }
  const float* S32(int64_t m) const { return s32.data() + m * nb; }
  const int32_t* Lanes(int64_t m, int64_t b) const { return lanes.data() + (m * nb + b) * 8; }
  const int32_t* Sums(int64_t m) const { return sums.data() + m * nb; }
  const float* GroupSums(int64_t m, int s) const { return gsum[s].data() + m * (nb >> s); }
};

// The activations' byte order. kRecords: the blocks of the row's whole
// 512-element groups are laid out for the column groups (core/repack.h) in
// chunks of 8 blocks (half a group): [level][record r (0..7)][lane l
// (block)][4 bytes], record r holding elements 4r .. 4r + 3 of each block,
// which is what a column group's column c holds in its low (r = c) or high
// (r = c + 4) nibbles, and Q8_0's column r; the blocks after the last group
// stay natural. kSlices: Q6_K's repacked super-blocks, in chunks of 4 blocks
// (128 elements): [level][record j (0..3)][lane l (16-element slice)][4
// bytes], record j holding elements 4j .. 4j + 3 of each slice. A chunk keeps
// its bytes' place in the row.
// kSuper: kRecords' chunks over the whole row (K-quant rows, whose blocks
// come in super-blocks of 8), for the Q2_K / Q3_K kernels (Q23KRecordsRows),
// which read the loader's records (core/repack.h) or move the file's codes
// into records in registers.
// kMlx4Records: kSuper's chunks over the row's whole runs of 8 blocks, each
// block's elements first deinterleaved (the even ones, then the odd ones),
// for MLX 4-bit rows: record r of a block then holds elements 8 (r % 4) + 2 i
// + r / 4 (i = 0..3), the codes that dword r % 4 of the block's MLX bytes
// holds in its low (r < 4) or high nibbles (Mlx4RecordsRows).
// kMlx8Slices: kSlices' chunks over the row's whole runs of 4 blocks, for MLX
// 8-bit rows (Mlx8SlicesRows), with the lanes in another order (below).
enum Order { kNatural, kRecords, kSlices, kSuper, kMlx4Records, kMlx8Slices, kOrders };

// kMlx4Records' lane l holds block MlxLaneBlock(l) of its run (0, 2, 4, 6, 1,
// 3, 5, 7): the blocks a 4 x 4 dword transpose of four 32-byte loads leaves
// there (Mlx4RecordsRows); the run's d is in the same order.
constexpr int64_t MlxLaneBlock(int64_t l) { return l < 4 ? 2 * l : 2 * (l - 4) + 1; }
// kMlx8Slices' lane l holds 16-element slice MlxLaneSlice(l) of its chunk
// (block l % 4, half l / 4: 0, 2, 4, 6, 1, 3, 5, 7), what the same transpose
// of four blocks' 32 bytes leaves there.
constexpr int64_t MlxLaneSlice(int64_t l) { return 2 * (l % 4) + l / 4; }

enum class Fmt {
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ8_0,
  kQ2K,
  kQ3K,
  kQ4K,
  kQ5K,
  kQ6K,
  // MLX affine 4- and 8-bit (w = s q + b per group of 32, 64 or 128).
  kMlx4,
  kMlx8,
  // Column groups (core/repack.h), made at load where these kernels read them.
  kQ4_0C,
  kQ4_1C,
  kQ5_0C,
  kQ5_1C,
  kQ8_0C,
  kQ4KC,
  kQ5KC,
  kQ6KC,
  kQ2KC,  // Q2_K / Q3_K records: repacked a super-block at a time, as Q6_K
  kQ3KC,
  kQ5KP  // Q5_K column groups with the 5th bits in planes
};

constexpr Order OrderOf(Fmt f) {
  return f == Fmt::kQ2K || f == Fmt::kQ3K || f == Fmt::kQ2KC || f == Fmt::kQ3KC ? kSuper
         : f == Fmt::kQ6KC                                                      ? kSlices
         : f == Fmt::kMlx4                                                      ? kMlx4Records
         : f == Fmt::kMlx8                                                      ? kMlx8Slices
         : f >= Fmt::kQ4_0C                                                     ? kRecords
                                                                                : kNatural;
}

// The plain format of a column-group one.
constexpr Fmt PlainFmt(Fmt f) {
  switch (f) {
    case Fmt::kQ4_0C:
      return Fmt::kQ4_0;
    case Fmt::kQ4_1C:
      return Fmt::kQ4_1;
    case Fmt::kQ5_0C:
      return Fmt::kQ5_0;
    case Fmt::kQ5_1C:
      return Fmt::kQ5_1;
    case Fmt::kQ8_0C:
      return Fmt::kQ8_0;
    case Fmt::kQ4KC:
      return Fmt::kQ4K;
    case Fmt::kQ5KC:
    case Fmt::kQ5KP:
      return Fmt::kQ5K;
    case Fmt::kQ2KC:
      return Fmt::kQ2K;
    case Fmt::kQ3KC:
      return Fmt::kQ3K;
    default:
      return f;
  }
}

// Each storage the kernels read, and its format.
constexpr struct {
  DType type;
  Fmt fmt;
} kStorages[] = {{DType::kQ4_0, Fmt::kQ4_0},      {DType::kQ4_1, Fmt::kQ4_1},
                 {DType::kQ5_0, Fmt::kQ5_0},      {DType::kQ5_1, Fmt::kQ5_1},
                 {DType::kQ8_0, Fmt::kQ8_0},      {DType::kQ2_K, Fmt::kQ2K},
                 {DType::kQ3_K, Fmt::kQ3K},       {DType::kQ4_K, Fmt::kQ4K},
                 {DType::kQ5_K, Fmt::kQ5K},       {DType::kQ6_K, Fmt::kQ6K},
                 {DType::kQ4_0Cols, Fmt::kQ4_0C}, {DType::kQ4_1Cols, Fmt::kQ4_1C},
                 {DType::kQ5_0Cols, Fmt::kQ5_0C}, {DType::kQ5_1Cols, Fmt::kQ5_1C},
                 {DType::kQ8_0Cols, Fmt::kQ8_0C}, {DType::kQ4_KCols, Fmt::kQ4KC},
                 {DType::kQ5_KCols, Fmt::kQ5KC},  {DType::kQ6_KCols, Fmt::kQ6KC},
                 {DType::kQ2_KCols, Fmt::kQ2KC},  {DType::kQ3_KCols, Fmt::kQ3KC},
                 {DType::kQ5_KPlanes, Fmt::kQ5KP}};

constexpr DType TypeOf(Fmt f) {
  for (const auto& s : kStorages)
    if (s.fmt == f) return s.type;
  return DType::kF32;
}

// One weight row against activation rows m0 .. m0 + MB - 1: y[r * ldy].
using RowsFn = void (*)(const uint8_t* w, const Acts& a, int64_t m0, float* y, int64_t ldy);
// The same for MLX rows, which also read their row of W's scales and biases.
using MlxRowsFn = void (*)(const Matrix& W, int64_t n, const Acts& a, int64_t m0, float* y,
                           int64_t ldy);

// The row kernel for format f at `levels` activation levels and mb (1..4)
// activation rows: matmul_q8_avx2_gguf.cc (GGUF storages) and
// matmul_q8_avx2_mlx.cc (MLX, groups of `group` = 32, 64 or 128 elements,
// the codes in runs (MlxOrder::kRuns) or the file's order).
RowsFn PickRows(Fmt f, int levels, int mb);
MlxRowsFn PickMlxRows(Fmt f, int group, bool runs, int levels, int mb);

#if defined(__x86_64__)

LUMEN_AVX2 inline float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

LUMEN_AVX2 inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

LUMEN_AVX2 inline __m256i Load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// Per int32 lane j: the sum over bytes 4j..4j+3 of w (256 q1 + q2), or of
// w q at one level; w unsigned and below 129, so no int16 pair saturates.
template <int L>
LUMEN_AVX2 inline __m256i Dot(__m256i w, const int8_t* xq) {
  const __m256i p1 = _mm256_maddubs_epi16(w, Load32(xq));
  if constexpr (L == 1) {
    return _mm256_madd_epi16(p1, _mm256_set1_epi16(1));
  } else {
    const __m256i p2 = _mm256_maddubs_epi16(w, Load32(xq + kQK));
    return _mm256_add_epi32(_mm256_madd_epi16(p1, _mm256_set1_epi16(256)),
                            _mm256_madd_epi16(p2, _mm256_set1_epi16(1)));
  }
}

// The same for signed weight codes: |w| against x carrying w's sign (the
// activation codes stay within +-127, so negating them is exact; |-128| is
// the unsigned byte 128).
template <int L>
LUMEN_AVX2 inline __m256i DotSigned(__m256i w, const int8_t* xq) {
  const __m256i aw = _mm256_sign_epi8(w, w);
  const __m256i p1 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(Load32(xq), w));
  if constexpr (L == 1) {
    return _mm256_madd_epi16(p1, _mm256_set1_epi16(1));
  } else {
    const __m256i p2 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(Load32(xq + kQK), w));
    return _mm256_add_epi32(_mm256_madd_epi16(p1, _mm256_set1_epi16(256)),
                            _mm256_madd_epi16(p2, _mm256_set1_epi16(1)));
  }
}

// A 4 x 4 dword transpose within each 128-bit half: dword k of t[c]'s half
// is dword c of v[k]'s.
LUMEN_AVX2 inline void TransposeDwords(const __m256i* v, __m256i* t) {
  const __m256i lo01 = _mm256_unpacklo_epi32(v[0], v[1]), hi01 = _mm256_unpackhi_epi32(v[0], v[1]);
  const __m256i lo23 = _mm256_unpacklo_epi32(v[2], v[3]), hi23 = _mm256_unpackhi_epi32(v[2], v[3]);
  t[0] = _mm256_unpacklo_epi64(lo01, lo23);
  t[1] = _mm256_unpackhi_epi64(lo01, lo23);
  t[2] = _mm256_unpacklo_epi64(hi01, hi23);
  t[3] = _mm256_unpackhi_epi64(hi01, hi23);
}

// Byte j = `value` where bit j of bits is set, else 0.
LUMEN_AVX2 inline __m256i BitBytes(uint32_t bits, char value) {
  // Byte j of each 64-bit quarter q reads byte q of bits; the mask picks its bit j % 8.
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i mask = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
  return _mm256_and_si256(set, _mm256_set1_epi8(value));
}

// Byte l = `value` where bit j of bytes[l] is set, else 0.
LUMEN_AVX2 inline __m256i BitOfBytes(__m256i bytes, int j, char value) {
  const __m256i mask = _mm256_set1_epi8(static_cast<char>(1 << j));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, mask), mask);
  return _mm256_and_si256(set, _mm256_set1_epi8(value));
}

// The 8 lanes' dot products of 8 records of unsigned codes (below 16 where
// kRun is 8: 8 x 2 x 15 x 127 < 2^15) against the activation records at x
// (Prepare's [level][record][lane]): kRun records' int16 products summed
// before one vpmaddwd per level.
template <int L, int kRun>
LUMEN_AVX2 inline __m256i RecordsDot(const __m256i* codes, const int8_t* x) {
  __m256i i = _mm256_setzero_si256();
  for (int lv = 0; lv < L; ++lv) {
    const __m256i k = _mm256_set1_epi16(L == 2 && lv == 0 ? 256 : 1);
    for (int q0 = 0; q0 < 8; q0 += kRun) {
      __m256i sum = _mm256_maddubs_epi16(codes[q0], Load32(x + 256 * lv + 32 * q0));
      for (int q = q0 + 1; q < q0 + kRun; ++q)
        sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(codes[q], Load32(x + 256 * lv + 32 * q)));
      i = _mm256_add_epi32(i, _mm256_madd_epi16(sum, k));
    }
  }
  return i;
}

#endif  // __x86_64__

}  // namespace lumen::kernels::int8_avx2
