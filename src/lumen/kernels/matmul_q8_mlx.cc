// The int8 decode kernels of MLX affine 4- and 8-bit weights (groups of 32,
// 64 or 128) on AVX512-VNNI (matmul_q8.h; the layout in matmul_q8.cc):
// RowsMlx against up to four prepared activation rows at one or two
// levels, codes in groups of 512 elements where the loader or the run-time
// gather made them, in twins of 128 after. MlxRowsFor picks one
// (matmul_q8_internal.h).
#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>

#include "lumen/core/check.h"
#include "lumen/core/quant.h"
#include "lumen/core/repack.h"
#include "lumen/kernels/matmul_q8_internal.h"

#if defined(__x86_64__)
#include "lumen/kernels/prefetch.h"

namespace lumen::kernels::int8_vnni {

LUMEN_INTRINSICS_BEGIN

namespace {

// 64 unsigned codes (elements 64j..64j+63 of a Q4_K super-block) from 32 bytes.
LUMEN_VNNI inline __m512i NibblePair(const uint8_t* p) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i m = _mm256_set1_epi8(0x0F);
  const __m256i lo = _mm256_and_si256(q, m), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m);
  return _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1);
}

// acc += cvt(dot(w, codes)) * lanes * dx for every row; A selects the
// accumulator (compile time, see Rows).
template <int MB, int A, int L>
LUMEN_VNNI inline void DotRecords(const uint8_t* const* x, int64_t chunk, __m512i w, __m512 lanes,
                                  __m512 (&acc)[MB][2]) {
  for (int r = 0; r < MB; ++r) {
    const uint8_t* rec = x[r] + kRecord<L> * chunk;
    const __m512i i = LevelDot<L>(_mm512_setzero_si512(), w, rec);
    acc[r][A] = AddScaledLanes<L>(acc[r][A], i, lanes, rec);
  }
}

// The first n (1..16) of the f16, bf16 or f32 values at p as f32 in lanes
// 0..n-1 (the rest zero; the masked load reads nothing past them): the
// scales of twins and of a row's last record, and the biases, converted
// where they are used rather than into a buffer per row first.
LUMEN_VNNI inline __m512 ScalesAsF32(DType t, const uint8_t* p, int64_t n) {
  const auto k = static_cast<__mmask16>((1u << n) - 1);
  if (t == DType::kF32) return _mm512_maskz_loadu_ps(k, p);
  const __m256i h = _mm256_maskz_loadu_epi16(k, p);
  if (t == DType::kF16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));  // bf16
}

// A 512-element group's scales (512 / G values, f16, bf16 or f32) as its
// lane scales (lane l: 32 elements, scale 32 l / G) in two instructions: a
// masked load and a word permute that puts each bf16 in the high half of
// its lane (f16: a third, the conversion; f32: a dword permute). Why: with
// constant scales the one-row MLX 4-bit kernel ran 1.15x faster than with
// the row's scales converted into a buffer and each group's permuted from
// it; this way it runs 1.12x (K = 2048) and 1.15x (K = 8192) faster
// (Zen 5, session 53; tools/kernel_pairs.sh on BM_MatMul/19/1/1/K/3).
struct GroupScales {
  DType t;
  __mmask16 k;  // the group's values
  // bf16: word 2 l + 1 <- value 32 l / G (even words zeroed); f16: word l
  // (of 16); f32: dword l. One vector, so the kernel holds one.
  __m512i idx;
  LUMEN_VNNI GroupScales(DType type, int64_t G) : t(type) {
    k = static_cast<__mmask16>((1u << (kColsElems / G)) - 1);
    alignas(64) int16_t w[32] = {};
    alignas(64) int32_t d[16];
    for (int l = 0; l < 16; ++l) {
      const auto v = static_cast<int16_t>(32 * l / G);
      if (t == DType::kBF16) {
        w[2 * l + 1] = v;
      } else {
        w[l] = v;
      }
      d[l] = v;
    }
    idx = t == DType::kF32 ? _mm512_load_si512(d) : _mm512_load_si512(w);
  }
  LUMEN_VNNI __m512 At(const uint8_t* p) const {
    if (t == DType::kF32) return _mm512_permutexvar_ps(idx, _mm512_maskz_loadu_ps(k, p));
    const __m256i h = _mm256_maskz_loadu_epi16(k, p);
    if (t == DType::kF16)
      return _mm512_cvtph_ps(_mm256_permutexvar_epi16(_mm512_castsi512_si256(idx), h));
    return _mm512_castsi512_ps(  // bf16
        _mm512_maskz_permutexvar_epi16(0xAAAAAAAA, idx, _mm512_castsi256_si512(h)));
  }
};

// MLX 4-bit (F = kMlx4) or 8-bit (kMlx8), groups of 32, 64 or 128 (K a
// multiple of 64).
template <Fmt F, int MB, int L>
LUMEN_VNNI void RowsMlx(const Matrix& W, const Geometry&, const Int8Rows& X, int64_t m0, float* Y,
                        int64_t ldy, int64_t n0, int64_t n1, std::span<const Span> spans) {
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
  const int64_t per_twin = 128 / G;  // groups per twin (G < 128), hoisted: GCC divided per twin
  const DType st = W.scales.dtype, bt = W.biases.dtype;
  const int64_t ss = Info(st).block_bytes, bs = Info(bt).block_bytes;
  const GroupScales group_scales(st, G);
  const bool grouped = W.mlx_order == MlxOrder::kGroups;
  const bool l1 = RowsIntoL1(F);  // the codes' prefetch
  const int64_t code_row =
      W.n > 1 ? W.w.row<const uint8_t>(1) - W.w.row<const uint8_t>(0) : K * W.mlx_bits / 8;
  // The rows the codes' prefetch runs ahead (the first span's distance),
  // divided once per call, not once per row.
  int64_t lead = 0;
  for (const Span& s : spans)
    if (s.first) lead = (s.ahead + code_row - 1) / code_row;
  for (int64_t n = n0; n < n1; ++n)
    for (const Span& s : spans) {
      // The scales and biases are two more streams, a line or a few per row:
      // ask for those of the row the codes' prefetch reaches (the hardware
      // prefetchers of the Xeon in prefetch.h do not run ahead of them).
      if (s.first && n + 1 < W.n) {
        const int64_t r = std::min(W.n - 1, n + lead);
        PrefetchAhead(W.scales.row(r), ng * ss, 0);
        PrefetchAhead(W.biases.row(r), ng * bs, 0);
      }
      const uint8_t* codes = W.w.row<const uint8_t>(n);
      // The row's scales and biases are read where they are used, converted
      // in registers (GroupScales, ScalesAsF32).
      const uint8_t* srow = W.scales.row<const uint8_t>(n);
      const uint8_t* brow = W.biases.row<const uint8_t>(n);
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
        PrefetchAheadInto(l1, codes + kTwinBytes * t, kTwinBytes, s.ahead);
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
            G == 128
                ? _mm512_permutexvar_ps(_mm512_setzero_si512(), ScalesAsF32(st, srow + t * ss, 1))
                : _mm512_permutexvar_ps(idx_twin,
                                        ScalesAsF32(st, srow + t * per_twin * ss, per_twin));
        for (int r = 0; r < MB; ++r) {
          const uint8_t* rec = x[r] + kRecord<L> * 2 * t;
          const __m512i i = TwinDot<L>(_mm512_setzero_si512(), a, b, rec);
          acc[r][A] = AddScaledLanes<L>(acc[r][A], i, sc, rec);
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
        PrefetchAheadInto(l1, c0, kGroupBytes, s.ahead);
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
        const __m512 sc = group_scales.At(srow + Q * (kColsElems / G) * ss);
        for (int r = 0; r < MB; ++r) {
          const uint8_t* rec = x[r] + kRecord<L> * 8 * Q;
          const __m512i i = GroupDot<L>(_mm512_setzero_si512(), lo, hi, rec);
          acc[r][A] = AddScaledLanes<L>(acc[r][A], i, sc, rec);
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
                              ? _mm512_permutexvar_ps(idx32, ScalesAsF32(st, srow + 2 * c * ss, 2))
                              : _mm512_permutexvar_ps(_mm512_setzero_si512(),
                                                      ScalesAsF32(st, srow + c * 64 / G * ss, 1));
        DotRecords<MB, 0, L>(x, c, w, sc, acc);
      }
      // Bias term: sum_g b_g * (sum of the group's activations), 16 groups at a time.
      for (int64_t g = 0; s.last && g < ng; g += 16) {
        const __mmask16 k = ng - g >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (ng - g)) - 1);
        const __m512 b = ScalesAsF32(bt, brow + g * bs, std::min<int64_t>(16, ng - g));
        for (int r = 0; r < MB; ++r)
          off[r] = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(k, rows.sums(r, g)), off[r]);
      }
      for (int r = 0; r < MB; ++r) {
        // One horizontal sum per row, the offsets in it.
        const float y =
            _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), off[r]));
        float& out = Y[(m0 + r) * ldy + n];
        out = s.first ? y : out + y;
      }
    }
}

// This file's kernel for a format at MB rows and L levels (null: the other
// file's format).
struct MlxKernels {
  template <int MB, int L>
  static RowsFn Pick(Fmt f) {
    if (f == Fmt::kMlx4) return &RowsMlx<Fmt::kMlx4, MB, L>;
    if (f == Fmt::kMlx8) return &RowsMlx<Fmt::kMlx8, MB, L>;
    return nullptr;
  }
};

}  // namespace

RowsFn MlxRowsFor(Fmt f, int mb, int levels) { return PickRows<MlxKernels>(f, mb, levels); }

LUMEN_INTRINSICS_END

}  // namespace lumen::kernels::int8_vnni

#endif  // __x86_64__
