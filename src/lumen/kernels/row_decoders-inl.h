// Per-target vector row decoders of the exact f32 product (Highway): one
// decoder per weight storage turns a row into f32 vectors of N consecutive
// elements and hands each to a sink (sink(k, vector, Par<chain>)), so the
// weight bytes go from memory straight into registers. Included by
// matmul.cc and matmul_t.cc inside their HWY_NAMESPACE; never outside
// src/lumen/kernels/.
//
// The contract: every dequantized GGUF value equals the scalar reference's
// (DequantizeMatrixRow) bit for bit; MLX rows differ by one rounding (an FMA
// for scale * q + bias). PathFor picks the decoder of a Matrix on this
// target (kGeneric: the scalar dequantizer into scratch), DecodeStorage runs
// a path's decoder over a row, DecodeColumns over a column range (MLX 4-bit
// decodes even and odd elements of each 2N chunk as two vectors: matmul.cc's
// PreparedX permutes X to match once per call).
#if defined(LUMEN_KERNELS_ROW_DECODERS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LUMEN_KERNELS_ROW_DECODERS_INL_H_
#undef LUMEN_KERNELS_ROW_DECODERS_INL_H_
#else
#define LUMEN_KERNELS_ROW_DECODERS_INL_H_
#endif

#include <cstdint>
#include <cstring>
#include <optional>

#include <hwy/highway.h>

#include "lumen/core/check.h"
#include "lumen/core/half.h"
#include "lumen/core/quant.h"
#include "lumen/core/repack.h"
#include "lumen/kernels/intrinsics_warnings.h"
#include "lumen/kernels/matrix.h"
#include "lumen/kernels/q23_columns_avx512.h"

HWY_BEFORE_NAMESPACE();
namespace lumen::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DI = hn::RebindToSigned<DF>;

// Block scales: one f16 per block, so a branch-free hardware convert matters.
HWY_INLINE float LoadF16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return _cvtsh_ss(h);  // F16C is part of Highway's AVX2 and AVX3 targets
#else
  return F16ToF32(h);
#endif
}

// Accumulator-chain tags: decoders label each vector so sinks can spread
// FMAs over independent chains (FMA latency x throughput needs ~8 in flight).
template <int P>
using Par = std::integral_constant<int, P>;
using P0 = Par<0>;
using P1 = Par<1>;
using P2 = Par<2>;
using P3 = Par<3>;

// block(b, pa, pb) over blocks [0, nb), two chain tags per block: pairs of
// blocks over the four chains (even blocks P0 / P1, odd P2 / P3), a last odd
// block on P0 / P1.
template <class Block>
HWY_INLINE void OnFourChains(int64_t nb, const Block& block) {
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    block(b, P0{}, P1{});
    block(b + 1, P2{}, P3{});
  }
  if (b < nb) block(b, P0{}, P1{});
}

// Unsigned (signed) bytes p[0..N) widened to int32 lanes.
HWY_INLINE hn::Vec<DI> LoadU8(const uint8_t* p) {
  const DI di;
  const hn::Rebind<uint8_t, DI> d8;
  return hn::PromoteTo(di, hn::LoadU(d8, p));
}
HWY_INLINE hn::Vec<DI> LoadI8(const int8_t* p) {
  const DI di;
  const hn::Rebind<int8_t, DI> d8;
  return hn::PromoteTo(di, hn::LoadU(d8, p));
}

template <class Sink>
HWY_INLINE void DecodeF32(const uint8_t* row, int64_t K, Sink& sink) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  const float* p = reinterpret_cast<const float*>(row);
  for (int64_t k = 0; k < K; k += 2 * N) {
    sink(k, hn::LoadU(d, p + k), P0{});
    sink(k + N, hn::LoadU(d, p + k + N), P1{});
  }
}

// F16 or BF16 rows (Half: hwy::float16_t or hwy::bfloat16_t), widened exactly.
template <class Half, class Sink>
HWY_INLINE void DecodeHalf(const uint8_t* row, int64_t K, Sink& sink) {
  const DF d;
  const hn::Rebind<Half, DF> dh;
  const int64_t N = hn::Lanes(d);
  const Half* p = reinterpret_cast<const Half*>(row);
  for (int64_t k = 0; k < K; k += 2 * N) {
    sink(k, hn::PromoteTo(d, hn::LoadU(dh, p + k)), P0{});
    sink(k + N, hn::PromoteTo(d, hn::LoadU(dh, p + k + N)), P1{});
  }
}

template <class Sink>
HWY_INLINE void DecodeQ8_0(const uint8_t* row, int64_t K, Sink& sink) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  auto block = [&](int64_t b, auto pa, auto pb) HWY_ATTR {
    const uint8_t* blk = row + b * sizeof(BlockQ8_0);
    const auto vd = hn::Set(d, LoadF16(blk));
    const int8_t* qs = reinterpret_cast<const int8_t*>(blk + 2);
    for (int64_t i = 0; i < kQK; i += 2 * N) {
      sink(b * kQK + i, hn::Mul(hn::ConvertTo(d, LoadI8(qs + i)), vd), pa);
      sink(b * kQK + i + N, hn::Mul(hn::ConvertTo(d, LoadI8(qs + i + N)), vd), pb);
    }
  };
  OnFourChains(K / kQK, block);
}

// The legacy 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1): element j in the
// low nibble of qs[j], j + 16 in the high one and, where the block has qh
// (kQh), the 5th bit of element j at bit j of the little-endian u32 qh.
// weight(blk, q) turns the block's int32 codes into its weights. Blocks in
// pairs over the four chains.
template <class Block, bool kQh, class Sink, class Weight>
HWY_INLINE void DecodeLegacy(const uint8_t* row, int64_t K, Sink& sink, const Weight& weight) {
  const DF d;
  const DI di;
  const int64_t N = hn::Lanes(d);
  const hn::RebindToUnsigned<DI> du;
  const auto k15 = hn::Set(di, 15), k1 = hn::Set(di, 1), iota = hn::Iota(di, 0);
  auto block = [&](int64_t b, auto pa, auto pb) HWY_ATTR {
    const uint8_t* blk = row + b * sizeof(Block);
    const uint8_t* qs = blk + offsetof(Block, qs);
    uint32_t h = 0;  // HighBits in quant.cc
    if constexpr (kQh) std::memcpy(&h, blk + offsetof(Block, qh), 4);
    for (int64_t i = 0; i < kQK / 2; i += N) {
      const auto q = LoadU8(qs + i);
      auto lo = hn::And(q, k15), hi = hn::ShiftRight<4>(q);
      if constexpr (kQh) {  // bit i + lane of h (then 16 + i + lane), times 16
        const auto s = hn::BitCast(du, hn::Add(iota, hn::Set(di, int32_t(i))));
        const auto vh = hn::Set(du, h);
        lo = hn::Or(lo, hn::ShiftLeft<4>(hn::And(hn::BitCast(di, hn::Shr(vh, s)), k1)));
        hi = hn::Or(hi, hn::ShiftLeft<4>(hn::And(
                            hn::BitCast(di, hn::Shr(vh, hn::Add(s, hn::Set(du, 16u)))), k1)));
      }
      sink(b * kQK + i, weight(blk, lo), pa);
      sink(b * kQK + 16 + i, weight(blk, hi), pb);
    }
  };
  OnFourChains(K / kQK, block);
}

// Q4_0 / Q5_0: float(q - kZero) * d as the scalar code, bit for bit (an fma
// form, fma(q, d, -kZero d), rounds the same but gives +0 where the scalar
// product is -0: d < 0, q = kZero).
template <class Block, bool kQh, int kZero, class Sink>
HWY_INLINE void DecodeSymmetricLegacy(const uint8_t* row, int64_t K, Sink& sink) {
  const DF d;
  const auto zero = hn::Set(DI(), kZero);
  DecodeLegacy<Block, kQh>(row, K, sink, [&](const uint8_t* blk, auto q) HWY_ATTR {
    return hn::Mul(hn::ConvertTo(d, hn::Sub(q, zero)), hn::Set(d, LoadF16(blk)));
  });
}

// Q4_1 / Q5_1: float(q) * d + m. q * d is exact in f32 (at most 5 + 11
// significant bits, and f16 values are never f32 subnormals), so the scalar
// code rounds once, at the add, as fma(q, d, m) does: the same bits.
template <class Block, bool kQh, class Sink>
HWY_INLINE void DecodeAffineLegacy(const uint8_t* row, int64_t K, Sink& sink) {
  const DF d;
  DecodeLegacy<Block, kQh>(row, K, sink, [&](const uint8_t* blk, auto q) HWY_ATTR {
    return hn::MulAdd(hn::ConvertTo(d, q), hn::Set(d, LoadF16(blk)), hn::Set(d, LoadF16(blk + 2)));
  });
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
LUMEN_INTRINSICS_BEGIN
// Four 64-byte columns at cols (lane l of column c: dword c of block l)
// transposed into qs, dword c of block b at qs[b % 4] + 16 (b / 4) + 4 c
// (a 4 x 4 dword transpose per 128-bit block: block b is 128-bit block b / 4
// of column b % 4).
HWY_INLINE void TransposeColumns(const uint8_t* cols, uint8_t (&qs)[4][64]) {
  __m512i c[4];
  for (int j = 0; j < 4; ++j) c[j] = _mm512_loadu_si512(cols + 64 * j);
  const __m512i t0 = _mm512_unpacklo_epi32(c[0], c[1]), t1 = _mm512_unpacklo_epi32(c[2], c[3]);
  const __m512i t2 = _mm512_unpackhi_epi32(c[0], c[1]), t3 = _mm512_unpackhi_epi32(c[2], c[3]);
  _mm512_store_si512(qs[0], _mm512_unpacklo_epi64(t0, t1));
  _mm512_store_si512(qs[1], _mm512_unpackhi_epi64(t0, t1));
  _mm512_store_si512(qs[2], _mm512_unpacklo_epi64(t2, t3));
  _mm512_store_si512(qs[3], _mm512_unpackhi_epi64(t2, t3));
}

// A column group's codes block by block (core/repack.h), for the
// decoders below on 16-lane vectors: the four columns transposed in
// registers (TransposeColumns) and kept on the stack, so that block b is one
// widening load (per-block lambdas over the registers were not inlined, and
// spilled); kHigh: the 5th bits shifted out of the masks lane by lane.
template <bool kHigh>
struct TransposedGroup {
  alignas(64) uint8_t qs[4][64];
  __m512i hb[4];  // lane e of hb[2 s + h]: bits 32 h .. of the mask of element 16 s + e

  HWY_INLINE TransposedGroup(const uint8_t* g, const ColsFields& f) {
    TransposeColumns(g + f.codes, qs);
    if constexpr (kHigh) {
      const __m512i mk = _mm512_loadu_si512(g + f.high);
      const __m512i e4 = _mm512_srli_epi32(Lanes(), 2);
      for (int i = 0; i < 4; ++i)
        hb[i] = _mm512_permutexvar_epi32(
            _mm512_add_epi32(_mm512_slli_epi32(e4, 1), _mm512_set1_epi32(8 * (i / 2) + i % 2)), mk);
    }
  }

  static HWY_INLINE __m512i Lanes() {
    return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  }

  // Block b's codes as int32 lanes: elements 0-15 (lo) and 16-31 (hi),
  // with the 5th bit (bit 4 b + e % 4 of the mask) as DecodeLegacy's 16.
  HWY_INLINE void Codes(int b, hn::Vec<DI>* lo, hn::Vec<DI>* hi) const {
    const DI di;
    const hn::Vec<DI> q{_mm512_cvtepu8_epi32(
        _mm_load_si128(reinterpret_cast<const __m128i*>(qs[b % 4] + 16 * (b / 4))))};
    *lo = hn::And(q, hn::Set(di, 15));
    *hi = hn::ShiftRight<4>(q);
    if constexpr (kHigh) {
      const __m512i sh = _mm512_add_epi32(_mm512_and_si512(Lanes(), _mm512_set1_epi32(3)),
                                          _mm512_set1_epi32(4 * (b % 8)));
      const __m512i one = _mm512_set1_epi32(1);
      const __m512i l5 = _mm512_and_si512(_mm512_srlv_epi32(hb[b / 8], sh), one);
      const __m512i h5 = _mm512_and_si512(_mm512_srlv_epi32(hb[2 + b / 8], sh), one);
      *lo = hn::Or(*lo, hn::Vec<DI>{_mm512_slli_epi32(l5, 4)});
      *hi = hn::Or(*hi, hn::Vec<DI>{_mm512_slli_epi32(h5, 4)});
    }
  }
};
LUMEN_INTRINSICS_END
#endif

// Column groups of the legacy formats (core/repack.h): every value,
// position and chain is the one of the row before it was repacked, so the
// exact products are that row's bits. On 16-lane AVX-512 vectors the codes
// come from a TransposedGroup; otherwise each group is unpacked to its 16
// plain blocks first (stores a 16-byte load cannot forward from: that way
// the 512-token prefill decoded Q4_0 columns 6% slower, Q5_0 40%). K must
// end on a group or at the row's end. Q8_0's eight columns are two sets of
// four: codes 0-15 of each block, then 16-31 (plus 128), as DecodeQ8_0
// feeds its chains.
template <DType kPlain, class Sink>
HWY_INLINE void DecodeColumnGroups(const uint8_t* row, int64_t K, Sink& sink) {
  using Block = std::conditional_t<
      kPlain == DType::kQ4_0, BlockQ4_0,
      std::conditional_t<
          kPlain == DType::kQ4_1, BlockQ4_1,
          std::conditional_t<kPlain == DType::kQ5_0, BlockQ5_0,
                             std::conditional_t<kPlain == DType::kQ5_1, BlockQ5_1, BlockQ8_0>>>>;
  constexpr bool kQ8 = kPlain == DType::kQ8_0;
  constexpr bool kMin = kPlain == DType::kQ4_1 || kPlain == DType::kQ5_1;
  constexpr bool kQh = kPlain == DType::kQ5_0 || kPlain == DType::kQ5_1;
  auto plain = [](const uint8_t* r, int64_t n, auto& s) HWY_ATTR {
    if constexpr (kQ8) {
      DecodeQ8_0(r, n, s);
    } else if constexpr (kMin) {
      DecodeAffineLegacy<Block, kQh>(r, n, s);
    } else {
      DecodeSymmetricLegacy<Block, kQh, kQh ? 16 : 8>(r, n, s);
    }
  };
  int64_t at = 0;
  auto shifted = [&](int64_t k, auto v, auto p) HWY_ATTR { sink(at + k, v, p); };
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  LUMEN_INTRINSICS_BEGIN
  if constexpr (hn::MaxLanes(DF()) == 16) {
    const DF d;
    const DI di;
    const auto zero = hn::Set(di, kQh ? 16 : 8);
    for (; kQ8 && at + kColsElems <= K; at += kColsElems) {
      const uint8_t* g = row + at / kQK * sizeof(Block);
      const ColsFields f = ColsFieldsAt(kPlain, g);
      alignas(64) uint8_t qs[2][4][64];  // codes 0-15, 16-31
      TransposeColumns(g + f.codes, qs[0]);
      TransposeColumns(g + f.codes + 256, qs[1]);
      auto block = [&](int64_t b, auto pa, auto pb) HWY_ATTR {
        const auto s = hn::Set(d, LoadF16(g + f.d + 2 * b));
        for (int h = 0; h < 2; ++h) {  // DecodeQ8_0's arithmetic
          const hn::Vec<DI> q{_mm512_sub_epi32(
              _mm512_cvtepu8_epi32(
                  _mm_load_si128(reinterpret_cast<const __m128i*>(qs[h][b % 4] + 16 * (b / 4)))),
              _mm512_set1_epi32(128))};
          const VF w = hn::Mul(hn::ConvertTo(d, q), s);
          if (h == 0) {
            shifted(kQK * b, w, pa);
          } else {
            shifted(kQK * b + 16, w, pb);
          }
        }
      };
      OnFourChains(16, block);  // DecodeQ8_0's
    }
    for (; !kQ8 && at + kColsElems <= K; at += kColsElems) {
      const uint8_t* g = row + at / kQK * sizeof(Block);
      const ColsFields f = ColsFieldsAt(kPlain, g);
      const TransposedGroup<kQh> group(g, f);
      auto block = [&](int64_t b, auto pa, auto pb) HWY_ATTR {
        const auto s = hn::Set(d, LoadF16(g + f.d + 2 * b));
        hn::Vec<DI> lo, hi;
        group.Codes(b, &lo, &hi);
        VF wl, wh;  // DecodeSymmetricLegacy's and DecodeAffineLegacy's arithmetic
        if constexpr (kMin) {
          const auto m = hn::Set(d, LoadF16(g + f.m + 2 * b));
          wl = hn::MulAdd(hn::ConvertTo(d, lo), s, m);
          wh = hn::MulAdd(hn::ConvertTo(d, hi), s, m);
        } else {
          wl = hn::Mul(hn::ConvertTo(d, hn::Sub(lo, zero)), s);
          wh = hn::Mul(hn::ConvertTo(d, hn::Sub(hi, zero)), s);
        }
        shifted(kQK * b, wl, pa);
        shifted(kQK * b + 16, wh, pb);
      };
      OnFourChains(16, block);  // DecodeLegacy's
    }
  }
  LUMEN_INTRINSICS_END
#endif
  alignas(64) uint8_t blocks[kColsBlocks * sizeof(Block)];
  for (; at + kColsElems <= K; at += kColsElems) {
    UnpackColumnGroup(kPlain, row + at / kQK * sizeof(Block), blocks);
    plain(blocks, kColsElems, shifted);
  }
  plain(row + at / kQK * sizeof(Block), K - at, shifted);
}

// Q4_K / Q5_K (kQ5: the 5th bit of element 64j + l at bit 2j of qh[l], of
// 64j + 32 + l at bit 2j + 1). d * sc and dmin * m are exact (6 + 11 bits),
// so is (d * sc) * q (at most 22 bits): the scalar d1 * q - m1 rounds once,
// at the subtraction, as fma(q, d1, -m1) does: the same bits.
template <bool kQ5, class Sink>
HWY_INLINE void DecodeQ4K5K(const uint8_t* row, int64_t K, Sink& sink) {
  using Block = std::conditional_t<kQ5, BlockQ5K, BlockQ4K>;
  const DF d;
  const DI di;
  const int64_t N = hn::Lanes(d);
  const auto k15 = hn::Set(di, 15), k1 = hn::Set(di, 1);
  for (int64_t b = 0; b < K / kQKK; ++b) {
    const uint8_t* blk = row + b * sizeof(Block);
    const float dd = LoadF16(blk), dmin = LoadF16(blk + 2);
    const uint8_t* sc = blk + offsetof(Block, scales);
    const uint8_t* qs = blk + offsetof(Block, qs);
    auto sub = [&](int j, auto pa, auto pb) HWY_ATTR {
      uint8_t s1, m1, s2, m2;
      GetScaleMinK4(2 * j, sc, &s1, &m1);
      GetScaleMinK4(2 * j + 1, sc, &s2, &m2);
      const auto d1 = hn::Set(d, dd * s1), o1 = hn::Set(d, -(dmin * m1));
      const auto d2 = hn::Set(d, dd * s2), o2 = hn::Set(d, -(dmin * m2));
      const int64_t base = b * kQKK + 64 * j;
      for (int64_t l = 0; l < 32; l += N) {
        const auto q = LoadU8(qs + 32 * j + l);
        auto lo = hn::And(q, k15), hi = hn::ShiftRight<4>(q);
        if constexpr (kQ5) {
          const auto h = LoadU8(blk + offsetof(BlockQ5K, qh) + l);
          lo = hn::Or(lo, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, 2 * j), k1)));
          hi = hn::Or(hi, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, 2 * j + 1), k1)));
        }
        sink(base + l, hn::MulAdd(hn::ConvertTo(d, lo), d1, o1), pa);
        sink(base + 32 + l, hn::MulAdd(hn::ConvertTo(d, hi), d2, o2), pb);
      }
    };
    sub(0, P0{}, P1{});
    sub(1, P2{}, P3{});
    sub(2, P0{}, P1{});
    sub(3, P2{}, P3{});
  }
}

// Q4_K / Q5_K column groups (core/repack.h): as DecodeColumnGroups, every
// value, position and chain is the one of the row before it was repacked
// (DecodeQ4K5K: sub-block 8 s + t feeds chain P0 / P1 / P2 / P3 for t % 4
// = 0 / 1 / 2 / 3, elements 0-15 then 16-31), so the exact products are that
// row's bits. On 16-lane AVX-512 vectors the codes come from a
// TransposedGroup (a sub-block's bytes are a legacy block's qs); otherwise,
// and for Q5_K's planes (made only where the AVX2 kernels run), each group is
// unpacked to its two super-blocks.
template <bool kQ5, class Sink, bool kPlanes = false>
HWY_INLINE void DecodeSuperColumnGroups(const uint8_t* row, int64_t K, Sink& sink) {
  using Block = std::conditional_t<kQ5, BlockQ5K, BlockQ4K>;
  constexpr DType kPlain = kQ5 ? DType::kQ5_K : DType::kQ4_K;
  int64_t at = 0;
  auto shifted = [&](int64_t k, auto v, auto p) HWY_ATTR { sink(at + k, v, p); };
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  LUMEN_INTRINSICS_BEGIN
  if constexpr (hn::MaxLanes(DF()) == 16 && !kPlanes) {
    const DF d;
    for (; at + kColsElems <= K; at += kColsElems) {
      const uint8_t* g = row + at / kQKK * sizeof(Block);
      const ColsFields f = ColsFieldsAt(kPlain, g);
      const TransposedGroup<kQ5> group(g, f);
      // DecodeQ4K5K's factors, d sc and -(dmin m), per sub-block: the 6-bit
      // fields of both super-blocks unpacked as 32-bit words (ScalesMinsQ4K
      // in matmul_q8_gguf.cc), lanes 0-7 sc, 8-15 m, times d and dmin exactly as
      // the scalar dd * sc.
      alignas(64) float scale[16], offset[16];
      for (int sb = 0; sb < 2; ++sb) {
        const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g + f.scales + 12 * sb));
        const __m128i low = _mm_srlv_epi32(_mm_shuffle_epi32(w, _MM_SHUFFLE(2, 1, 2, 0)),
                                           _mm_set_epi32(4, 0, 0, 0));
        const __m128i lo6 =
            _mm_and_si128(low, _mm_set_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f));
        const __m128i top =
            _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(w, _MM_SHUFFLE(1, 1, 0, 0)), 6),
                          _mm_set_epi32(0x03030303, 0, 0x03030303, 0));
        const __m512 sm =
            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_or_si128(lo6, _mm_slli_epi32(top, 4))));
        const __m256 s8 = _mm512_castps512_ps256(sm), m8 = _mm512_extractf32x8_ps(sm, 1);
        _mm256_store_ps(scale + 8 * sb,
                        _mm256_mul_ps(s8, _mm256_set1_ps(LoadF16(g + f.d + 4 * sb))));
        _mm256_store_ps(
            offset + 8 * sb,
            _mm256_xor_ps(_mm256_mul_ps(m8, _mm256_set1_ps(LoadF16(g + f.d + 4 * sb + 2))),
                          _mm256_set1_ps(-0.0f)));
      }
      auto sub = [&](int b, auto chain) HWY_ATTR {  // sub-block b % 8 of super-block b / 8
        hn::Vec<DI> lo, hi;
        group.Codes(b, &lo, &hi);
        // DecodeQ4K5K's arithmetic: (d sc) q - dmin m, rounded once.
        const auto d1 = hn::Set(d, scale[b]), o1 = hn::Set(d, offset[b]);
        const int64_t k0 = kQK * b;
        shifted(k0, hn::MulAdd(hn::ConvertTo(d, lo), d1, o1), chain);
        shifted(k0 + 16, hn::MulAdd(hn::ConvertTo(d, hi), d1, o1), chain);
      };
      for (int b = 0; b < 16; b += 4) {  // DecodeQ4K5K's chain of sub-block t: t % 4
        sub(b, P0{});
        sub(b + 1, P1{});
        sub(b + 2, P2{});
        sub(b + 3, P3{});
      }
    }
  }
  LUMEN_INTRINSICS_END
#endif
  alignas(64) uint8_t blocks[2 * sizeof(Block)];
  for (; at + kColsElems <= K; at += kColsElems) {
    UnpackColumnGroup(kPlanes ? DType::kQ5_KPlanes : kPlain, row + at / kQKK * sizeof(Block),
                      blocks);
    DecodeQ4K5K<kQ5>(blocks, kColsElems, shifted);
  }
  DecodeQ4K5K<kQ5>(row + at / kQKK * sizeof(Block), K - at, shifted);
}

// Q2_K / Q3_K 2-bit planes: in each 128-element half c of a super-block,
// element 128c + 32j + l is bits 2j of qs[32c + l] (j = 0..3, one chain
// each), in sub-block 8c + 2j + l / 16 of 16 elements. weight(c, j, l, q2)
// turns the vector of 2-bit codes at l into weights.
template <class Sink, class Weight>
HWY_INLINE void DecodePlanes2(const uint8_t* qs, int64_t base, Sink& sink, const Weight& weight) {
  const DI di;
  const int64_t N = hn::Lanes(DF());
  const auto k3 = hn::Set(di, 3);
  for (int c = 0; c < 2; ++c)
    for (int64_t l = 0; l < 32; l += N) {
      const auto q = LoadU8(qs + 32 * c + l);
      const int64_t k = base + 128 * c + l;
      sink(k, weight(c, 0, l, hn::And(q, k3)), P0{});
      sink(k + 32, weight(c, 1, l, hn::And(hn::ShiftRight<2>(q), k3)), P1{});
      sink(k + 64, weight(c, 2, l, hn::And(hn::ShiftRight<4>(q), k3)), P2{});
      sink(k + 96, weight(c, 3, l, hn::ShiftRight<6>(q)), P3{});
    }
}

// Q2_K: dl * q - ml with dl = d * (sc & 15), ml = dmin * (sc >> 4), both
// exact (4 + 11 bits), and dl * q exact: one rounding, as fma(q, dl, -ml).
// The 16 sub-blocks' factors once per super-block (the same products): per
// vector of codes they cost a byte load, two scalar products and two
// broadcasts, most of this decode's time in a Q2_K prefill.
HWY_INLINE void Q2KFactors(const uint8_t* blk, float (&dl)[16], float (&ml)[16]) {
  const uint8_t* sc = blk + offsetof(BlockQ2K, scales);
  const float dd = LoadF16(blk + offsetof(BlockQ2K, d)),
              dmin = LoadF16(blk + offsetof(BlockQ2K, dmin));
  for (int i = 0; i < 16; ++i) {
    dl[i] = dd * float(sc[i] & 0xF);
    ml[i] = -(dmin * float(sc[i] >> 4));
  }
}

template <class Sink>
HWY_INLINE void DecodeQ2K(const uint8_t* row, int64_t K, Sink& sink) {
  const DF d;
  for (int64_t b = 0; b < K / kQKK; ++b) {
    const uint8_t* blk = row + b * sizeof(BlockQ2K);
    float dl[16], ml[16];
    Q2KFactors(blk, dl, ml);
    DecodePlanes2(blk + offsetof(BlockQ2K, qs), b * kQKK, sink,
                  [&](int c, int j, int64_t l, auto q) HWY_ATTR {
                    const int64_t i = 8 * c + 2 * j + l / 16;
                    return hn::MulAdd(hn::ConvertTo(d, q), hn::Set(d, dl[i]), hn::Set(d, ml[i]));
                  });
  }
}

// Q3_K: dl * (q - 4) with dl = d * (sc - 32) (5 + 11 bits) and the 3rd bit
// of element i at bit i / 32 of hmask[i % 32]: every product is exact, so the
// value is the scalar code's, bit for bit (the int subtraction keeps the sign
// of a zero product).
template <class Sink>
HWY_INLINE void DecodeQ3K(const uint8_t* row, int64_t K, Sink& sink) {
  const DF d;
  const DI di;
  const auto k1 = hn::Set(di, 1), k4 = hn::Set(di, 4);
  for (int64_t b = 0; b < K / kQKK; ++b) {
    const uint8_t* blk = row + b * sizeof(BlockQ3K);
    const uint8_t* hmask = blk + offsetof(BlockQ3K, hmask);
    const uint8_t* sc = blk + offsetof(BlockQ3K, scales);
    const float dd = LoadF16(blk + offsetof(BlockQ3K, d));
    DecodePlanes2(blk + offsetof(BlockQ3K, qs), b * kQKK, sink,
                  [&](int c, int j, int64_t l, auto q) HWY_ATTR {
                    const auto h = hn::And(hn::ShiftRightSame(LoadU8(hmask + l), 4 * c + j), k1);
                    const auto q3 = hn::Sub(hn::Or(q, hn::ShiftLeft<2>(h)), k4);
                    const int s = Q3KScale(sc, 8 * c + 2 * j + int(l / 16)) - 32;
                    return hn::Mul(hn::ConvertTo(d, q3), hn::Set(d, dd * float(s)));
                  });
  }
}

// Q6_K: (d * sc) * (q - 32) in the scalar code's order; both products are
// exact (at most 11 + 7 + 5 significant bits): the same bits.
template <class Sink>
HWY_INLINE void DecodeQ6K(const uint8_t* row, int64_t K, Sink& sink) {
  const DF d;
  const DI di;
  const int64_t N = hn::Lanes(d);
  const auto k15 = hn::Set(di, 15), k3 = hn::Set(di, 3), k32 = hn::Set(di, 32);
  for (int64_t b = 0; b < K / kQKK; ++b) {
    const uint8_t* blk = row + b * sizeof(BlockQ6K);
    const uint8_t* ql = blk;
    const uint8_t* qh = blk + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const float dd = LoadF16(blk + 208);
    for (int half = 0; half < 2; ++half) {
      const int64_t base = b * kQKK + 128 * half;
      for (int64_t l = 0; l < 32; l += N) {
        const int is = static_cast<int>(l / 16);
        const auto a = LoadU8(ql + l), c = LoadU8(ql + l + 32), h = LoadU8(qh + l);
        const auto q1 = hn::Or(hn::And(a, k15), hn::ShiftLeft<4>(hn::And(h, k3)));
        const auto q2 =
            hn::Or(hn::And(c, k15), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<2>(h), k3)));
        const auto q3 =
            hn::Or(hn::ShiftRight<4>(a), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<4>(h), k3)));
        const auto q4 = hn::Or(hn::ShiftRight<4>(c), hn::ShiftLeft<4>(hn::ShiftRight<6>(h)));
        sink(base + l, hn::Mul(hn::ConvertTo(d, hn::Sub(q1, k32)), hn::Set(d, dd * sc[is])), P0{});
        sink(base + l + 32,
             hn::Mul(hn::ConvertTo(d, hn::Sub(q2, k32)), hn::Set(d, dd * sc[is + 2])), P1{});
        sink(base + l + 64,
             hn::Mul(hn::ConvertTo(d, hn::Sub(q3, k32)), hn::Set(d, dd * sc[is + 4])), P2{});
        sink(base + l + 96,
             hn::Mul(hn::ConvertTo(d, hn::Sub(q4, k32)), hn::Set(d, dd * sc[is + 6])), P3{});
      }
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

// Q6_K slices (core/repack.h): every value, position and chain is
// DecodeQ6K's (elements 128 h + l + 32 c, l = 0 and 16, slice 8 h + l / 16
// + 2 c, feed chain c, in that order), so the exact products are the plain
// row's bits. On 16-lane AVX-512 vectors a super-block's four columns are
// rebuilt as the int8 kernel does and turned into slices by a 4x4 dword
// transpose in each 128-bit lane (lane k of r[s] is slice 4 k + s);
// otherwise each super-block is unpacked to its plain bytes.
template <class Sink>
HWY_INLINE void DecodeQ6Slices(const uint8_t* row, int64_t K, Sink& sink) {
  int64_t at = 0;
  auto shifted = [&](int64_t k, auto v, auto p) HWY_ATTR { sink(at + k, v, p); };
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  LUMEN_INTRINSICS_BEGIN
  if constexpr (hn::MaxLanes(DF()) == 16) {
    const DF d;
    const DI di;
    const auto k32 = hn::Set(di, 32);
    const __m512i k4 = _mm512_set1_epi8(0x0F), k30 = _mm512_set1_epi8(0x30);
    alignas(64) uint8_t r[4][64];
    for (; at < K; at += kQKK) {
      const uint8_t* g = row + at / kQKK * sizeof(BlockQ6K);
      const __m512i va = _mm512_loadu_si512(g), vb = _mm512_loadu_si512(g + 64);
      const __m512i h = _mm512_loadu_si512(g + 128);
      // Column j: its low 4 bits | its top 2 bits (bits 2 j of h) at bits 4-5.
      const __m512i u0 =
          _mm512_ternarylogic_epi32(_mm512_and_si512(va, k4), _mm512_slli_epi16(h, 4), k30, 0xF8);
      const __m512i u1 =
          _mm512_ternarylogic_epi32(_mm512_and_si512(vb, k4), _mm512_slli_epi16(h, 2), k30, 0xF8);
      const __m512i u2 =
          _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(va, 4), k4), h, k30, 0xF8);
      const __m512i u3 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(vb, 4), k4),
                                                   _mm512_srli_epi16(h, 2), k30, 0xF8);
      const __m512i t0 = _mm512_unpacklo_epi32(u0, u1), t1 = _mm512_unpackhi_epi32(u0, u1);
      const __m512i t2 = _mm512_unpacklo_epi32(u2, u3), t3 = _mm512_unpackhi_epi32(u2, u3);
      _mm512_store_si512(r[0], _mm512_unpacklo_epi64(t0, t2));
      _mm512_store_si512(r[1], _mm512_unpackhi_epi64(t0, t2));
      _mm512_store_si512(r[2], _mm512_unpacklo_epi64(t1, t3));
      _mm512_store_si512(r[3], _mm512_unpackhi_epi64(t1, t3));
      const int8_t* sc = reinterpret_cast<const int8_t*>(g + 192);
      const float dd = LoadF16(g + 208);
      auto slice = [&](int s, int64_t k, auto chain) HWY_ATTR {
        const auto q = LoadU8(r[s % 4] + 16 * (s / 4));
        shifted(k, hn::Mul(hn::ConvertTo(d, hn::Sub(q, k32)), hn::Set(d, dd * sc[s])), chain);
      };
      for (int half = 0; half < 2; ++half)
        for (int l = 0; l < 32; l += 16) {
          const int s = 8 * half + l / 16;
          const int64_t k = 128 * half + l;
          slice(s, k, P0{});
          slice(s + 2, k + 32, P1{});
          slice(s + 4, k + 64, P2{});
          slice(s + 6, k + 96, P3{});
        }
    }
    return;
  }
  LUMEN_INTRINSICS_END
#endif
  alignas(64) uint8_t blk[sizeof(BlockQ6K)];
  for (; at < K; at += kQKK) {
    UnpackQ6Slices(row + at / kQKK * sizeof(BlockQ6K), blk);
    DecodeQ6K(blk, kQKK, shifted);
  }
}

// Q2_K / Q3_K records (core/repack.h): each super-block unpacked to its plain
// bytes, then the plain decoder (the unpack is a few word operations per 16
// codes; the exact panels decode each weight once per call), so the values
// are the plain row's bits.
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
// UnpackQ23Records in registers, for the 8-lane decoders (the 16-lane ones
// read the records as they are, DecodeQ2Records16 and DecodeQ3Planes16): the codes'
// 4 x 4 dword transpose per 128-bit lane is its own inverse (record t, lane
// 4 n + j <-> the plain code vector j's dword t, n in the lane), and hmask's
// bits are a 4 x 8 byte transpose and a movemask per bit: record byte 4 l +
// i bit 4 h + t is plain byte 16 h + 4 t + i bit l. The scalar unpack cost 3%
// of a 512-token Q2_K prefill.
template <bool kThree>
HWY_INLINE void UnpackRecordsAvx2(const uint8_t* src, uint8_t* dst) {
  constexpr int64_t kBytes = kThree ? sizeof(BlockQ3K) : sizeof(BlockQ2K), kQs = kThree ? 32 : 16;
  std::memcpy(dst, src, kBytes);  // scales, d (the codes are rewritten below)
  const __m256i m3 = _mm256_set1_epi8(3);
  auto load = [&](int64_t at) HWY_ATTR {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + at));
  };
  // The records form: qs halves (record 4 h + t at bits 2 t of half h) and,
  // for Q3_K, hmask (record r's third bit at bit r), from Q3_K's planes
  // (core/repack.h) in registers.
  __m256i rec[2], hm = _mm256_setzero_si256();
  if constexpr (kThree) {
    auto bits = [](__m256i v, int m) HWY_ATTR {
      return _mm256_and_si256(v, _mm256_set1_epi8(static_cast<char>(m)));
    };
    const __m256i p0 = load(0), p1 = load(32), p2 = load(64);
    // 16-bit shifts: every field masked to its byte
    hm = _mm256_or_si256(
        _mm256_or_si256(bits(_mm256_srli_epi16(p0, 2), 0x01), bits(_mm256_srli_epi16(p0, 4), 0x02)),
        _mm256_or_si256(_mm256_or_si256(bits(p1, 0x04), bits(_mm256_srli_epi16(p1, 2), 0x08)),
                        _mm256_or_si256(bits(_mm256_slli_epi16(p2, 2), 0x10), bits(p2, 0xE0))));
    rec[0] = _mm256_or_si256(_mm256_or_si256(bits(p0, 0x03), bits(_mm256_srli_epi16(p0, 1), 0x0C)),
                             _mm256_or_si256(bits(_mm256_slli_epi16(p1, 4), 0x30),
                                             bits(_mm256_slli_epi16(p1, 3), 0xC0)));
    rec[1] = _mm256_or_si256(_mm256_or_si256(bits(p2, 0x03), bits(_mm256_srli_epi16(p2, 1), 0x0C)),
                             _mm256_or_si256(bits(_mm256_srli_epi16(p0, 2), 0x30), bits(p1, 0xC0)));
  } else {
    rec[0] = load(kQs);
    rec[1] = load(kQs + 32);
  }
  __m256i q[2];
  for (int h = 0; h < 2; ++h) {
    const __m256i r = rec[h];
    const __m256i c0 = _mm256_and_si256(r, m3), c1 = _mm256_and_si256(_mm256_srli_epi16(r, 2), m3);
    const __m256i c2 = _mm256_and_si256(_mm256_srli_epi16(r, 4), m3);
    const __m256i c3 = _mm256_and_si256(_mm256_srli_epi16(r, 6), m3);
    const __m256i a = _mm256_unpacklo_epi32(c0, c1), b = _mm256_unpackhi_epi32(c0, c1);
    const __m256i c = _mm256_unpacklo_epi32(c2, c3), e = _mm256_unpackhi_epi32(c2, c3);
    // s_j = the plain codes of block 4 n + j (n: the 128-bit lane), at bits 2 j
    const __m256i s0 = _mm256_unpacklo_epi64(a, c), s1 = _mm256_unpackhi_epi64(a, c);
    const __m256i s2 = _mm256_unpacklo_epi64(b, e), s3 = _mm256_unpackhi_epi64(b, e);
    q[h] = _mm256_or_si256(_mm256_or_si256(s0, _mm256_slli_epi16(s1, 2)),
                           _mm256_or_si256(_mm256_slli_epi16(s2, 4), _mm256_slli_epi16(s3, 6)));
  }
  // q[h] lane n = plain qs[32 n + 16 h ..]
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + kQs),
                      _mm256_permute2x128_si256(q[0], q[1], 0x20));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + kQs + 32),
                      _mm256_permute2x128_si256(q[0], q[1], 0x31));
  if constexpr (kThree) {
    // byte 4 l + i -> 8 i + l: a 4 x 4 byte transpose per lane, then dword i
    // of each lane side by side
    const __m128i t4 = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m256i bt =
        _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(hm, _mm256_broadcastsi128_si256(t4)),
                                    _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // bit b = 4 h + t of byte 8 i + l is bit l of plain byte 4 b + i
    const auto store = [&](int b, __m256i v) HWY_ATTR {
      const int32_t m = _mm256_movemask_epi8(v);
      std::memcpy(dst + 4 * b, &m, 4);
    };
    store(0, _mm256_slli_epi16(bt, 7));
    store(1, _mm256_slli_epi16(bt, 6));
    store(2, _mm256_slli_epi16(bt, 5));
    store(3, _mm256_slli_epi16(bt, 4));
    store(4, _mm256_slli_epi16(bt, 3));
    store(5, _mm256_slli_epi16(bt, 2));
    store(6, _mm256_slli_epi16(bt, 1));
    store(7, bt);
  }
}
#endif

// sub(s, chain) for a super-block's sixteen 16-element sub-blocks in
// DecodePlanes2's order with its chain tags (sub-block s on (s % 8) / 2),
// so a 16-lane decoder's sums keep the plain decoder's bits.
template <class Sub>
HWY_INLINE void EachSubBlockInPlanes2Order(Sub& sub) {
#pragma GCC unroll 4
  for (int h = 0; h < 4; ++h) {  // DecodePlanes2's half c = h / 2, l = 16 (h % 2)
    const int s = 8 * (h / 2) + h % 2;
    sub(s, P0{});
    sub(s + 2, P1{});
    sub(s + 4, P2{});
    sub(s + 6, P3{});
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// Q2_K records read as they are, 16 lanes: sub-block s is the dword at lane
// Q23Lane(s) of the codes (core/repack.h), its element 4 t + i at bits
// 8 i + 2 t, so 16 codes are a broadcast, a shift per lane and a mask (the
// super-block unpacked first cost a 16-token Q2_K prompt 5-8%), in the
// plain decoder's order (EachSubBlockInPlanes2Order).
template <class Sink>
HWY_INLINE void DecodeQ2Records16(const uint8_t* row, int64_t K, Sink& sink) {
  LUMEN_INTRINSICS_BEGIN
  const DF d;
  const __m512i shift =
      _mm512_setr_epi32(0, 8, 16, 24, 2, 10, 18, 26, 4, 12, 20, 28, 6, 14, 22, 30);
  const __m512i k3 = _mm512_set1_epi32(3);
  for (int64_t b = 0; b < K / kQKK; ++b) {
    const uint8_t* blk = row + b * sizeof(BlockQ2K);
    const uint8_t* qs = blk + offsetof(BlockQ2K, qs);
    float dl[16], ml[16];
    Q2KFactors(blk, dl, ml);
    auto sub = [&](int s, auto chain) HWY_ATTR {
      uint32_t w;
      std::memcpy(&w, qs + 4 * Q23Lane(s), 4);
      const hn::Vec<DI> q{_mm512_and_si512(
          _mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int32_t>(w)), shift), k3)};
      sink(b * kQKK + 16 * s, hn::MulAdd(hn::ConvertTo(d, q), hn::Set(d, dl[s]), hn::Set(d, ml[s])),
           chain);
    };
    EachSubBlockInPlanes2Order(sub);
  }
  LUMEN_INTRINSICS_END
}

// Q3_K planes read as they are, 16 lanes: the super-block's columns
// (q23_columns_avx512.h) transposed by lane, so a sub-block's 16 codes are
// one 128-bit lane widened; the plain decoder's arithmetic, in its order.
template <class Sink>
HWY_INLINE void DecodeQ3Planes16(const uint8_t* row, int64_t K, Sink& sink) {
  LUMEN_INTRINSICS_BEGIN
  const DF d;
  const DI di;
  for (int64_t b = 0; b < K / kQKK; ++b) {
    const uint8_t* blk = row + b * sizeof(BlockQ3K);
    __m512i u[4];
    Q3PlaneColumns(blk, u);
    float dl[16];
    const float dd = LoadF16(blk + offsetof(BlockQ3K, d));
    for (int i = 0; i < 16; ++i)
      dl[i] = dd * float(Q3KScale(blk + offsetof(BlockQ3K, scales), i) - 32);
    const SubBlockCodes codes(u);
    auto sub = [&](int s, auto chain) HWY_ATTR {
      const hn::Vec<DI> q{_mm512_cvtepu8_epi32(codes.Sub(s))};
      sink(b * kQKK + 16 * s,
           hn::Mul(hn::ConvertTo(d, hn::Sub(q, hn::Set(di, 4))), hn::Set(d, dl[s])), chain);
    };
    EachSubBlockInPlanes2Order(sub);
  }
  LUMEN_INTRINSICS_END
}
#endif

template <bool kThree, class Sink>
HWY_INLINE void DecodeQ23Records(const uint8_t* row, int64_t K, Sink& sink) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (hn::MaxLanes(DF()) == 16) {
    if constexpr (kThree) return DecodeQ3Planes16(row, K, sink);
    return DecodeQ2Records16(row, K, sink);
  }
#endif
  constexpr int64_t kBytes = kThree ? sizeof(BlockQ3K) : sizeof(BlockQ2K);
  int64_t at = 0;
  auto shifted = [&](int64_t k, auto v, auto p) HWY_ATTR { sink(at + k, v, p); };
  alignas(64) uint8_t blk[kBytes];
  for (; at < K; at += kQKK) {
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
    UnpackRecordsAvx2<kThree>(row + at / kQKK * kBytes, blk);
#else
    UnpackQ23Records(kThree, row + at / kQKK * kBytes, blk);
#endif
    if constexpr (kThree) {
      DecodeQ3K(blk, kQKK, shifted);
    } else {
      DecodeQ2K(blk, kQKK, shifted);
    }
  }
}

// MLX affine rows: p the row's codes in the file's order (MlxFileCodes),
// ss/bb its per-group scales and biases as f32.
template <class Sink>
HWY_INLINE void DecodeMlx(const Matrix& W, const uint8_t* p, const float* ss, const float* bb,
                          Sink& sink) {
  const DF d;
  const DI di;
  const int64_t N = hn::Lanes(d), K = W.k, G = W.mlx_group;
  if (W.mlx_bits == 4) {
    const auto k15 = hn::Set(di, 15);
    for (int64_t g = 0; g < K / G; ++g) {
      const auto s = hn::Set(d, ss[g]), o = hn::Set(d, bb[g]);
      for (int64_t i = 0; i < G; i += 2 * N) {  // bytes [i/2, i/2 + N) hold elements [i, i + 2N)
        const auto q = LoadU8(p + (g * G + i) / 2);
        sink(g * G + i, hn::MulAdd(hn::ConvertTo(d, hn::And(q, k15)), s, o), P0{});
        sink(g * G + i + N, hn::MulAdd(hn::ConvertTo(d, hn::ShiftRight<4>(q)), s, o), P1{});
      }
    }
  } else {  // 8 bits: byte i is element i
    for (int64_t g = 0; g < K / G; ++g) {
      const auto s = hn::Set(d, ss[g]), o = hn::Set(d, bb[g]);
      for (int64_t i = 0; i < G; i += 2 * N) {
        sink(g * G + i, hn::MulAdd(hn::ConvertTo(d, LoadU8(p + g * G + i)), s, o), P0{});
        sink(g * G + i + N, hn::MulAdd(hn::ConvertTo(d, LoadU8(p + g * G + i + N)), s, o), P1{});
      }
    }
  }
}

enum class Path {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ4_0Cols,
  kQ4_1Cols,
  kQ5_0Cols,
  kQ5_1Cols,
  kQ4KCols,
  kQ5KCols,
  kQ5KPlanes,
  kQ8_0Cols,
  kQ6KCols,
  kQ2KCols,
  kQ3KCols,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ2K,
  kQ3K,
  kQ4K,
  kQ5K,
  kQ6K,
  kMlx,
  kGeneric
};

// The fused path for W on this target, or kGeneric (scalar dequant to scratch).
inline Path PathFor(const Matrix& W) {
  const int64_t N = hn::Lanes(DF());
  if (W.mlx_bits != 0) {
    const bool ok = (W.mlx_bits == 4 || W.mlx_bits == 8) && W.mlx_group % (2 * N) == 0 &&
                    (W.mlx_bits == 8 || 2 * N <= W.mlx_group);
    return ok ? Path::kMlx : Path::kGeneric;
  }
  switch (W.w.dtype) {
    case DType::kF32:
      return W.k % (2 * N) == 0 ? Path::kF32 : Path::kGeneric;
    case DType::kF16:
      return W.k % (2 * N) == 0 ? Path::kF16 : Path::kGeneric;
    case DType::kBF16:
      return W.k % (2 * N) == 0 ? Path::kBF16 : Path::kGeneric;
    case DType::kQ8_0:
      return kQK % (2 * N) == 0 ? Path::kQ8_0 : Path::kGeneric;
    case DType::kQ4_0:
      return 16 % N == 0 ? Path::kQ4_0 : Path::kGeneric;
    case DType::kQ4_0Cols:
      return 16 % N == 0 ? Path::kQ4_0Cols : Path::kGeneric;
    case DType::kQ4_1Cols:
      return 16 % N == 0 ? Path::kQ4_1Cols : Path::kGeneric;
    case DType::kQ5_0Cols:
      return 16 % N == 0 ? Path::kQ5_0Cols : Path::kGeneric;
    case DType::kQ5_1Cols:
      return 16 % N == 0 ? Path::kQ5_1Cols : Path::kGeneric;
    case DType::kQ4_KCols:
      return 32 % N == 0 ? Path::kQ4KCols : Path::kGeneric;
    case DType::kQ5_KCols:
      return 32 % N == 0 ? Path::kQ5KCols : Path::kGeneric;
    case DType::kQ5_KPlanes:
      return 32 % N == 0 ? Path::kQ5KPlanes : Path::kGeneric;
    case DType::kQ8_0Cols:
      return 16 % N == 0 ? Path::kQ8_0Cols : Path::kGeneric;
    case DType::kQ6_KCols:
      return 16 % N == 0 ? Path::kQ6KCols : Path::kGeneric;
    case DType::kQ2_KCols:
      return 16 % N == 0 ? Path::kQ2KCols : Path::kGeneric;
    case DType::kQ3_KCols:
      return 16 % N == 0 ? Path::kQ3KCols : Path::kGeneric;
    case DType::kQ4_1:
      return 16 % N == 0 ? Path::kQ4_1 : Path::kGeneric;
    case DType::kQ5_0:
      return 16 % N == 0 ? Path::kQ5_0 : Path::kGeneric;
    case DType::kQ5_1:
      return 16 % N == 0 ? Path::kQ5_1 : Path::kGeneric;
    case DType::kQ2_K:
      return 16 % N == 0 ? Path::kQ2K : Path::kGeneric;
    case DType::kQ3_K:
      return 16 % N == 0 ? Path::kQ3K : Path::kGeneric;
    case DType::kQ4_K:
      return 32 % N == 0 ? Path::kQ4K : Path::kGeneric;
    case DType::kQ5_K:
      return 32 % N == 0 ? Path::kQ5K : Path::kGeneric;
    case DType::kQ6_K:
      return 16 % N == 0 ? Path::kQ6K : Path::kGeneric;
    default:
      return Path::kGeneric;
  }
}

// The vector decoder of `path` (neither kMlx nor kGeneric) over the first K
// elements of row.
template <class Sink>
HWY_INLINE void DecodeStorage(Path path, const uint8_t* row, int64_t K, Sink& sink) {
  switch (path) {
    case Path::kF32:
      return DecodeF32(row, K, sink);
    case Path::kF16:
      return DecodeHalf<hwy::float16_t>(row, K, sink);
    case Path::kBF16:
      return DecodeHalf<hwy::bfloat16_t>(row, K, sink);
    case Path::kQ8_0:
      return DecodeQ8_0(row, K, sink);
    case Path::kQ4_0:
      return DecodeSymmetricLegacy<BlockQ4_0, false, 8>(row, K, sink);
    case Path::kQ4_0Cols:
      return DecodeColumnGroups<DType::kQ4_0>(row, K, sink);
    case Path::kQ4_1Cols:
      return DecodeColumnGroups<DType::kQ4_1>(row, K, sink);
    case Path::kQ5_0Cols:
      return DecodeColumnGroups<DType::kQ5_0>(row, K, sink);
    case Path::kQ5_1Cols:
      return DecodeColumnGroups<DType::kQ5_1>(row, K, sink);
    case Path::kQ4KCols:
      return DecodeSuperColumnGroups<false>(row, K, sink);
    case Path::kQ5KCols:
      return DecodeSuperColumnGroups<true>(row, K, sink);
    case Path::kQ5KPlanes:
      return DecodeSuperColumnGroups<true, Sink, true>(row, K, sink);
    case Path::kQ8_0Cols:
      return DecodeColumnGroups<DType::kQ8_0>(row, K, sink);
    case Path::kQ6KCols:
      return DecodeQ6Slices(row, K, sink);
    case Path::kQ2KCols:
      return DecodeQ23Records<false>(row, K, sink);
    case Path::kQ3KCols:
      return DecodeQ23Records<true>(row, K, sink);
    case Path::kQ4_1:
      return DecodeAffineLegacy<BlockQ4_1, false>(row, K, sink);
    case Path::kQ5_0:
      return DecodeSymmetricLegacy<BlockQ5_0, true, 16>(row, K, sink);
    case Path::kQ5_1:
      return DecodeAffineLegacy<BlockQ5_1, true>(row, K, sink);
    case Path::kQ2K:
      return DecodeQ2K(row, K, sink);
    case Path::kQ3K:
      return DecodeQ3K(row, K, sink);
    case Path::kQ4K:
      return DecodeQ4K5K<false>(row, K, sink);
    case Path::kQ5K:
      return DecodeQ4K5K<true>(row, K, sink);
    case Path::kQ6K:
      return DecodeQ6K(row, K, sink);
    case Path::kMlx:
    case Path::kGeneric:
      break;
  }
  LUMEN_DCHECK(false && "DecodeStorage: no vector decoder");
}

// Columns [k0, k0 + KW) of W's row r into dst by the fused decoders, over
// whole pairs of vectors and whole blocks, so the choice never depends on
// how threads split K. Every GGUF decoder has the bits of
// DequantizeMatrixColumns: each value is rounded once where the scalar code
// rounds once (f16/bf16 widen exactly; d * q; the K-quants' d * sc, dmin * m
// and (d * sc) * q are exact products of at most 24 significant bits, so the
// scalar code's only rounding is its add, which an fma matches). MLX 4-bit
// decodes in permuted order and MLX / generic rows have no vector decoder
// here: false, the caller decodes.
inline bool DecodeColumns(Path path, const Matrix& W, int64_t r, int64_t k0, int64_t KW,
                          float* dst) {
  const DF d;
  const int64_t N = hn::Lanes(d);
  if (path == Path::kMlx || path == Path::kGeneric) return false;
  if (k0 % (2 * N) != 0 || KW % (2 * N) != 0 || !RowBytes(W.w.dtype, KW)) return false;
  if (IsColumnGroups(W.w.dtype) &&  // whole groups, or through the row's end
      (k0 % kColsElems != 0 || (KW % kColsElems != 0 && k0 + KW != W.k)))
    return false;
  const std::optional<size_t> skip = RowBytes(W.w.dtype, k0);
  if (!skip) return false;
  auto store = [&](int64_t k, VF w, auto) HWY_ATTR { hn::StoreU(w, d, dst + k); };
  DecodeStorage(path, W.w.row<const uint8_t>(r) + *skip, KW, store);
  return true;
}

}  // namespace lumen::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
