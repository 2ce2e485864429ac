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

// Design: one "row decoder" per storage type turns a weight row into f32
// vectors of N consecutive elements and hands each to a sink, so the weight
// bytes go from memory straight into registers. Decode (M <= 4) sinks FMA the
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
// per call (PermuteMlx4), which costs K floats per activation row.

HWY_BEFORE_NAMESPACE();
namespace lumen::kernels::HWY_NAMESPACE {
namespace {

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

// Unsigned bytes p[0..N) widened to int32 lanes.
// Accumulator-chain tags: decoders label each vector so sinks can spread
// FMAs over independent chains (FMA latency x throughput needs ~8 in flight).
template <int P>
using Par = std::integral_constant<int, P>;
using P0 = Par<0>;
using P1 = Par<1>;
using P2 = Par<2>;
using P3 = Par<3>;

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

template <class Sink>
HWY_INLINE void DecodeF16(const uint8_t* row, int64_t K, Sink& sink) {
  const DF d;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const int64_t N = hn::Lanes(d);
  const hwy::float16_t* p = reinterpret_cast<const hwy::float16_t*>(row);
  for (int64_t k = 0; k < K; k += 2 * N) {
    sink(k, hn::PromoteTo(d, hn::LoadU(dh, p + k)), P0{});
    sink(k + N, hn::PromoteTo(d, hn::LoadU(dh, p + k + N)), P1{});
  }
}

template <class Sink>
HWY_INLINE void DecodeBF16(const uint8_t* row, int64_t K, Sink& sink) {
  const DF d;
  const hn::Rebind<hwy::bfloat16_t, DF> dh;
  const int64_t N = hn::Lanes(d);
  const hwy::bfloat16_t* p = reinterpret_cast<const hwy::bfloat16_t*>(row);
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
  const int64_t nb = K / kQK;
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    block(b, P0{}, P1{});
    block(b + 1, P2{}, P3{});
  }
  if (b < nb) block(b, P0{}, P1{});
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
  const int64_t nb = K / kQK;
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    block(b, P0{}, P1{});
    block(b + 1, P2{}, P3{});
  }
  if (b < nb) block(b, P0{}, P1{});
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
      auto block = [&](int b, auto pa, auto pb) HWY_ATTR {
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
      for (int b = 0; b < 16; b += 2) {  // DecodeQ8_0's chains: even blocks P0, P1, odd P2, P3
        block(b, P0{}, P1{});
        block(b + 1, P2{}, P3{});
      }
    }
    for (; !kQ8 && at + kColsElems <= K; at += kColsElems) {
      const uint8_t* g = row + at / kQK * sizeof(Block);
      const ColsFields f = ColsFieldsAt(kPlain, g);
      const TransposedGroup<kQh> group(g, f);
      auto block = [&](int b, auto pa, auto pb) HWY_ATTR {
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
      for (int b = 0; b < 16; b += 2) {  // DecodeLegacy's chains: even blocks P0, P1, odd P2, P3
        block(b, P0{}, P1{});
        block(b + 1, P2{}, P3{});
      }
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
      // in matmul_q8.cc), lanes 0-7 sc, 8-15 m, times d and dmin exactly as
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
template <class Sink>
HWY_INLINE void DecodeQ2K(const uint8_t* row, int64_t K, Sink& sink) {
  const DF d;
  for (int64_t b = 0; b < K / kQKK; ++b) {
    const uint8_t* blk = row + b * sizeof(BlockQ2K);
    const uint8_t* sc = blk + offsetof(BlockQ2K, scales);
    const float dd = LoadF16(blk + offsetof(BlockQ2K, d)),
                dmin = LoadF16(blk + offsetof(BlockQ2K, dmin));
    // The 16 sub-blocks' factors once per super-block (the same products):
    // per vector of codes they cost a byte load, two scalar products and two
    // broadcasts, most of this decode's time in a Q2_K prefill.
    float dl[16], ml[16];
    for (int i = 0; i < 16; ++i) {
      dl[i] = dd * float(sc[i] & 0xF);
      ml[i] = -(dmin * float(sc[i] >> 4));
    }
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
// UnpackQ23Records in registers, for the 8-lane decoders (the loader makes
// records only on CPUs whose int8 kernels are the AVX2 ones): the codes'
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

template <bool kThree, class Sink>
HWY_INLINE void DecodeQ23Records(const uint8_t* row, int64_t K, Sink& sink) {
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
Path PathFor(const Matrix& W) {
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
      return DecodeF16(row, K, sink);
    case Path::kBF16:
      return DecodeBF16(row, K, sink);
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
bool DecodeColumns(Path path, const Matrix& W, int64_t r, int64_t k0, int64_t KW, float* dst) {
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
                                     [&](int64_t n, auto& sink)
                                         HWY_ATTR { DecodeF16(w.row<const uint8_t>(n), K, sink); });
    case Path::kBF16:
      return SmallMRows<MB, E, true>(
          x, m0, Y, ldy, n0, n1, epi, w, K,
          [&](int64_t n, auto& sink) HWY_ATTR { DecodeBF16(w.row<const uint8_t>(n), K, sink); });
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

// The exact products' block sizes, per target as measured there: GemmRows'
// (bytes) and the transposed product's (MatMulTRows, MatMulTRange).
struct GemmBlocking {
  int64_t slice;        // a k block of one panel (KC NR floats), columns path
  int64_t x_rows;       // the X rows of one row block (bytes), columns path:
  bool x_per_slice;     // of one slice's KC columns (else of all K)
  int64_t panel_slice;  // a k block of one panel, panel path
  int64_t group;        // the decoded whole panels of one group, panel path
  int64_t t_cols;       // transposed: columns per block (a multiple of 512)
  int64_t t_rows;       // transposed: the dX rows of one row block (bytes)
};

// AVX-512 (Zen 5, Xeon: sessions 12-28): slices in L1, X blocks and panel
// groups of 1 MiB. AVX2 (Zen 2, a 512 KiB L2: session 35): a slice of a
// quarter of L2 (the whole K of a 2048-wide product) read from L2 keeps the
// FMAs as busy as a 16 KiB one from L1 there, and the work per slice and
// per tile (the decode and transposes once per row block, the Y tile's loads
// and stores) is paid once per panel, not once per 256 columns; X blocks of
// 4 L2 (256 rows at K = 2048) come from L3. The 512-token prefill rose 7-19%
// (performance.md, "Zen 2 a seventh time"). Those blocks are sized by the
// slice, so K = 8192 keeps 256-row blocks (not 64) and decodes each slice
// once per 256 rows, not four times (Q4_0 at M = 256, two threads: 150 ->
// 180-186 GFLOP/s; "Zen 2 a ninth time"); the AVX-512 blocks stay sized by
// K, as measured there (by the slice, their 1 MiB would grow to all of X).
// Transposed: column blocks of 2048 and dX row blocks of 1 MiB on AVX-512;
// on AVX2 a 128-row panel of a quarter of L2 where that is 512 columns or
// more, else 512 (Zen 2: 256 KiB panels, the training step 3-5% faster than
// with 2048), and half of L2.
HWY_INLINE GemmBlocking Blocking() {
#if HWY_TARGET == HWY_AVX2
  const int64_t l2 = L2CacheBytes();
  return {l2 / 4, 4 * l2, true,
          l2 / 4, l2 / 4, std::clamp<int64_t>(l2 / 4 / (128 * 4) / 512 * 512, 512, 2048),
          l2 / 2};
#else
  auto env = [](const char* n, int64_t d) {
    const char* v = getenv(n);
    return v ? (int64_t)atoll(v) : d;
  };
  return {env("G_SLICE", 16 << 10),
          env("G_XROWS", 1 << 20),
          env("G_XPS", 0) != 0,
          24 << 10,
          1 << 20,
          2048,
          1 << 20};
#endif
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

// The backward epilogue's operands at one tile's first row and column: U
// rows (stride r), V = A's columns (row stride ldv), mask (stride K) or null.
struct TransposedEpi {
  const float* u;
  int64_t r;
  const float* v;
  int64_t ldv;
  const float* mask;
};

// dX[M, K] for columns [k0, k1), accumulated into dX (caller zeroes).
// The transposed product's register tile: R rows of dX by V vectors of
// columns stay in registers across a panel of decoded weight rows; each term
// is one FMA, added in ascending n (the order an AXPY per weight row has).
// E: 0 no epilogue, 1 without a mask, 2 with one (compile-time, as Tile's).
template <int R, int V, int E>
HWY_INLINE void TransposedTile(const float* HWY_RESTRICT panel, int64_t ldp, int64_t nb,
                               const float* HWY_RESTRICT dy, int64_t N, float* HWY_RESTRICT dx,
                               int64_t K, const TransposedEpi* epi) {
  const DF d;
  const int64_t L = hn::Lanes(d);
  VF acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = hn::LoadU(d, dx + r * K + v * L);
  for (int64_t n = 0; n < nb; ++n) {
    VF w[V];
    for (int v = 0; v < V; ++v) w[v] = hn::LoadU(d, panel + n * ldp + v * L);
    for (int r = 0; r < R; ++r) {
      const VF a = hn::Set(d, dy[r * N + n]);
      for (int v = 0; v < V; ++v) acc[r][v] = hn::MulAdd(a, w[v], acc[r][v]);
    }
  }
  if constexpr (E == 1) {  // no mask: r more terms of the same sums, U as dy, A as the panel
    for (int64_t j = 0; j < epi->r; ++j) {
      VF w[V];
      for (int v = 0; v < V; ++v) w[v] = hn::LoadU(d, epi->v + j * epi->ldv + v * L);
      for (int r = 0; r < R; ++r) {
        const VF a = hn::Set(d, epi->u[r * epi->r + j]);
        for (int v = 0; v < V; ++v) acc[r][v] = hn::MulAdd(a, w[v], acc[r][v]);
      }
    }
  } else if constexpr (E == 2) {
    // Dropout: the rank-r term is summed apart, then scaled by the mask.
    for (int r = 0; r < R; ++r) {
      VF t[V];
      for (int v = 0; v < V; ++v) t[v] = hn::Zero(d);
      for (int64_t j = 0; j < epi->r; ++j) {
        const VF a = hn::Set(d, epi->u[r * epi->r + j]);
        for (int v = 0; v < V; ++v)
          t[v] = hn::MulAdd(a, hn::LoadU(d, epi->v + j * epi->ldv + v * L), t[v]);
      }
      for (int v = 0; v < V; ++v)
        acc[r][v] = hn::MulAdd(hn::LoadU(d, epi->mask + r * K + v * L), t[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) hn::StoreU(acc[r][v], d, dx + r * K + v * L);
}

// 4 x kTV tiles, with the narrower tiles at the edges.
#if HWY_TARGET <= HWY_AVX3
constexpr int kTV = 4;  // 16 accumulators of the 32 vector registers
#else
constexpr int kTV = 2;
#endif

template <int R, int E>
HWY_INLINE void TransposedTileCols(int vecs, const float* panel, int64_t ldp, int64_t nb,
                                   const float* dy, int64_t N, float* dx, int64_t K,
                                   const TransposedEpi* epi) {
  switch (vecs) {
    case 1:
      return TransposedTile<R, 1, E>(panel, ldp, nb, dy, N, dx, K, epi);
    case 2:
      return TransposedTile<R, 2, E>(panel, ldp, nb, dy, N, dx, K, epi);
    case 3:
      return TransposedTile < R, kTV == 4 ? 3 : 1, E > (panel, ldp, nb, dy, N, dx, K, epi);
    default:
      return TransposedTile<R, kTV, E>(panel, ldp, nb, dy, N, dx, K, epi);
  }
}

// dX[:, k0:k1) (already holding the sum so far) += dY * W[:, k0:k1). W rows
// are decoded kTn at a time into a panel; for each column tile (an L1-sized
// slice of the panel) every 6-row (AVX-512), 4-, 2- or 1-row tile of dX accumulates the
// panel's rows.
// Columns past the last whole vector of [k0, k1) are summed in scalar code
// as mul then add, as the AXPY this replaces did, so the result is the same
// bit for bit.
//
// lr (may be null): the fused LoRA epilogue (matmul.h, MatMulTLowRank), added
// to each tile after the last panel; the scalar tail adds it the same way.
// The panel takes only the range's columns where the storage's blocks allow
// it (DequantizeMatrixColumns gives the same values as the row's slice).
void MatMulTRange(const Matrix& W, const float* dY, int64_t M, float* dX, int64_t k0, int64_t k1,
                  const LowRank* lr) {
  const DF d;
  const int64_t L = hn::Lanes(d), N = W.n, K = W.k, KW = k1 - k0;
  const int64_t kv = KW / L * L;  // whole vectors of the range
  constexpr int64_t kTn = 128;
  const int64_t align = MatrixColumnAlign(W);
  const bool columns = k0 % align == 0 && (k1 % align == 0 || k1 == K);
  // Panel rows one cache line longer than whole lines: at a stride of a
  // multiple of 4 KiB (KW = 1024, 2048) a column tile's 128 rows all fall in
  // the same few L1 sets and the tile is re-read from L2 on every row block.
  const int64_t ldp = (KW + 15) / 16 * 16 + 16;
  std::vector<float> row(columns ? 0 : K), panel(kTn * ldp);
  const Path path = PathFor(W);
  // Rows of dX in blocks whose [rows, KW] slice stays in L2 across all the
  // panels (each panel adds into it: Blocking().t_rows); the panels are
  // decoded again per block. Per element the panels still add in n order:
  // the same bits for any block.
  const int64_t kTm = std::clamp<int64_t>(Blocking().t_rows / (KW * 4) / 4 * 4, 32, 1 << 20);
  for (int64_t mb = 0; mb < M; mb += kTm) {
    const int64_t me = std::min(M, mb + kTm);
    for (int64_t n0 = 0; n0 < N; n0 += kTn) {
      const int64_t nb = std::min(kTn, N - n0);
      const bool last = n0 + nb == N;
      for (int64_t i = 0; i < nb; ++i) {
        if (columns) {
          if (!DecodeColumns(path, W, n0 + i, k0, KW, panel.data() + i * ldp))
            DequantizeMatrixColumns(W, n0 + i, k0, k1, panel.data() + i * ldp);
          continue;
        }
        DequantizeMatrixRow(W, n0 + i, row.data());
        std::memcpy(panel.data() + i * ldp, row.data() + k0, KW * sizeof(float));
      }
      const float* dy0 = dY + n0;
      for (int64_t k = 0; k < kv; k += kTV * L) {
        const int vecs = int(std::min<int64_t>(kTV, (kv - k) / L));
        const float* pk = panel.data() + k;
        auto epi = [&](int64_t m) {
          return TransposedEpi{lr->u + m * lr->r, lr->r, lr->v + k0 + k, K,
                               lr->mask ? lr->mask + m * K + k0 + k : nullptr};
        };
        const int mode = !(lr && last) ? 0 : lr->mask ? 2 : 1;
        auto rows = [&](auto height, int64_t m) HWY_ATTR {
          constexpr int R = decltype(height)::value;
          const float* dym = dy0 + m * N;
          float* dxm = dX + m * K + k0 + k;
          if (mode == 0)
            return TransposedTileCols<R, 0>(vecs, pk, ldp, nb, dym, N, dxm, K, nullptr);
          const TransposedEpi e = epi(m);
          if (mode == 1) return TransposedTileCols<R, 1>(vecs, pk, ldp, nb, dym, N, dxm, K, &e);
          TransposedTileCols<R, 2>(vecs, pk, ldp, nb, dym, N, dxm, K, &e);
        };
        int64_t m = mb;
#if HWY_TARGET <= HWY_AVX2
        // 24 accumulators of 32 registers (AVX-512), 12 of 16 (AVX2)
        for (; m + 6 <= me; m += 6) rows(Par<6>{}, m);
#endif
        for (; m + 4 <= me; m += 4) rows(Par<4>{}, m);
        for (; m + 2 <= me; m += 2) rows(Par<2>{}, m);
        for (; m < me; ++m) rows(Par<1>{}, m);
      }
      for (int64_t m = mb; m < me; ++m)
        for (int64_t c = kv; c < KW; ++c) {
          float y = dX[m * K + k0 + c];
          for (int64_t i = 0; i < nb; ++i) {
            const float t = dy0[m * N + i] * panel[i * ldp + c];
            y += t;
          }
          if (lr && last) {
            float low = 0;
            for (int64_t j = 0; j < lr->r; ++j) low += lr->u[m * lr->r + j] * lr->v[j * K + k0 + c];
            if (lr->mask) low *= lr->mask[m * K + k0 + c];
            y += low;
          }
          dX[m * K + k0 + c] = y;
        }
    }
  }
}

// MatMulTRange over [k0, k1) in column blocks of Blocking().t_cols (at
// most 2048), so a panel of 128 decoded rows stays within L2 whatever K is.
// Block edges are multiples of 512 (whole vectors and storage blocks: every
// MatrixColumnAlign divides it), so every column keeps its place in the
// vector part or the scalar tail and the blocks change no bit.
void MatMulTRows(const Matrix& W, const float* dY, int64_t M, float* dX, int64_t k0, int64_t k1,
                 const LowRank* lr) {
  const int64_t kCols = Blocking().t_cols;
  for (int64_t c0 = k0; c0 < k1;) {
    const int64_t c1 = std::min(k1, (c0 / kCols + 1) * kCols);
    MatMulTRange(W, dY, M, dX, c0, c1, lr);
    c0 = c1;
  }
}

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
LUMEN_ROUTE(
    matmul_transposed,
    {.node = "matmul.backward",
     .name = "simd-transposed",
     .tier = Tier::kL2,
     .oracle = "MatMulRef of the transposed product",
     .bound = "relative error within the bound of matmul_test.cc",
     .tests = "MatMulTest.TransposedWithinBound;MatMulTest.TransposedDecodesColumnsBitForBit;"
              "Types/QuantizedBase.FloatRouteWithinBoundOfDouble/*"});

// The fused LoRA epilogue (matmul.h, MatMulLowRank / MatMulTLowRank).
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
LUMEN_ROUTE(matmul_lora_epilogue_t,
            {.node = "matmul.lora_t",
             .name = "simd-epilogue",
             .tier = Tier::kL2,
             .oracle = "MatMulTLowRankRef (matmul_ref.h: dequantize, double accumulation)",
             .bound = "per output (N + r + 3) 2^-24 (|dx0| + sum |dy w| + |mask| sum |u a|) "
                      "(matmul.h); not bit-identical to the unfused order",
             .tests = "MatMulTLowRank.EpilogueWithinBoundOnEveryTargetAndStorage",
             .priority = 10});

HWY_EXPORT(MatMulRows);
HWY_EXPORT(PrepareBf16Rows);
HWY_EXPORT(MatMulRowsBf16);
HWY_EXPORT(PermutesX);
HWY_EXPORT(MatMulTRows);
HWY_EXPORT(AddLowRankCols);
HWY_EXPORT(FusedPath);

namespace {

// fn over [0, n): split across the pool in multiples of grain by `how`
// (contiguous chunks, first-come units, or chunks with stolen tails) when
// there is a pool and n reaches min_n, else inline on the caller's thread.
using PoolSplit = void (ThreadPool::*)(int64_t, const ThreadPool::Fn&, int64_t);
void Split(ThreadPool* pool, int64_t n, int64_t min_n, int64_t grain, const ThreadPool::Fn& fn,
           PoolSplit how = &ThreadPool::ParallelFor) {
  if (pool && n >= min_n) return (pool->*how)(n, fn, grain);
  fn(0, n, 0);
}

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
  Split(pool, W.n, 32, 16, rows,
        M <= 8 ? &ThreadPool::ParallelForStealing : &ThreadPool::ParallelFor);
}

// dX += dY W (+ the epilogue), K split across threads: each thread
// dequantizes every row but writes only its own column range, so no
// reduction between threads is needed.
void TransposedOnPool(const Matrix& W, const float* dY, int64_t M, float* dX, const LowRank* lr,
                      ThreadPool* pool) {
  Split(pool, W.k, 1, 64, [&](int64_t b, int64_t e, int) {
    HWY_DYNAMIC_DISPATCH(MatMulTRows)(W, dY, M, dX, b, e, lr);
  });
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
      Split(pool, M, 8, 4, [&](int64_t b, int64_t e, int) {
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
  Split(pool, total, 32, kBf16Unit, rows, &ThreadPool::ParallelForDynamic);
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
  Split(pool, total, 32, 16, [&](int64_t b, int64_t e, int) {
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

void MatMulT(const Matrix& W, const float* dY, int64_t M, float* dX, ThreadPool* pool) {
  std::fill(dX, dX + M * W.k, 0.0f);
  TransposedOnPool(W, dY, M, dX, nullptr, pool);
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
  Split(pool, N, 32, 16, [&](int64_t b, int64_t e, int) {
    HWY_DYNAMIC_DISPATCH(AddLowRankCols)(lr, M, Y, ldy, b, e);
  });
}

void MatMulTLowRank(const Matrix& W, const float* dY, int64_t M, const LowRank& lr, float* dX,
                    ThreadPool* pool) {
  LUMEN_CHECK(lr.u && lr.v && lr.r >= 1);
  TransposedOnPool(W, dY, M, dX, &lr, pool);
}

}  // namespace lumen::kernels
#endif  // HWY_ONCE
