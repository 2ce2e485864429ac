#include "lumen/core/repack.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "lumen/core/check.h"
#include "lumen/core/quant.h"

namespace lumen {
namespace {

// Where a plain block's fields are (-1: none), its size and elements.
// K-quants: qs and qh of a super-block, m the scales. Q8_0: one code byte
// per element (stored flipped to unsigned, so 8 columns).
struct Plain {
  int64_t bytes, qs, qh, m;
  int64_t elems = kQK;
  bool super() const { return elems == kQKK; }
  int64_t per_group() const { return kColsElems / elems; }  // 16 blocks, 2 super-blocks
  bool one_byte_codes() const { return bytes == sizeof(BlockQ8_0); }
  int64_t columns() const { return one_byte_codes() ? 8 : 4; }
  uint32_t flip() const { return one_byte_codes() ? 0x80808080u : 0; }  // of 4 codes
};
Plain PlainFields(DType t) {
  switch (t) {
    case DType::kQ4_K:
      return {sizeof(BlockQ4K), offsetof(BlockQ4K, qs), -1, offsetof(BlockQ4K, scales), kQKK};
    case DType::kQ5_K:
      return {sizeof(BlockQ5K), offsetof(BlockQ5K, qs), offsetof(BlockQ5K, qh),
              offsetof(BlockQ5K, scales), kQKK};
    case DType::kQ4_0:
      return {sizeof(BlockQ4_0), 2, -1, -1};
    case DType::kQ4_1:
      return {sizeof(BlockQ4_1), 4, -1, 2};
    case DType::kQ5_0:
      return {sizeof(BlockQ5_0), 6, 2, -1};
    case DType::kQ5_1:
      return {sizeof(BlockQ5_1), 8, 4, 2};
    case DType::kQ8_0:
      return {sizeof(BlockQ8_0), 2, -1, -1};
    default:
      LUMEN_CHECK(false && "no column groups for this type");
      return {};
  }
}

uint64_t LoadU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Bit 0 of each of x's four bytes as a nibble (byte i -> bit i): the
// multiply moves byte i's bit to bit 24 + i, with no two terms on one bit.
uint32_t Nibble(uint32_t x) { return (x & 0x01010101u) * 0x01020408u >> 24 & 15; }

// Four code bytes from src to dst, their bits xor flip (Q8_0's sign bits).
void CopyCodes(const uint8_t* src, uint8_t* dst, uint32_t flip) {
  uint32_t v;
  std::memcpy(&v, src, 4);
  v ^= flip;
  std::memcpy(dst, &v, 4);
}

// Sets the 5-bit code q of element e (0..255) of a zeroed Q4_K / Q5_K
// super-block.
void SetSuperCode(const Plain& p, uint8_t* blk, int e, int q) {
  const int j = e / 32, l = e % 32;
  blk[p.qs + 32 * (j / 2) + l] |= static_cast<uint8_t>((q & 15) << (4 * (j % 2)));
  if (p.qh >= 0) blk[p.qh + l] |= static_cast<uint8_t>(((q >> 4) & 1) << j);
}

// Sets the 6-bit code q of element e = 128 h + i (0..255) of a zeroed
// plain Q6_K super-block: low 4 bits nibble i / 64 of ql[64 h + i % 64], top
// 2 bits 2 (i / 32) of qh[32 h + i % 32].
void SetQ6Code(uint8_t* blk, int e, int q) {
  const int h = e / 128, i = e % 128;
  blk[64 * h + i % 64] |= static_cast<uint8_t>((q & 15) << (4 * (i / 64)));
  blk[128 + 32 * h + i % 32] |= static_cast<uint8_t>(((q >> 4) & 3) << (2 * (i / 32)));
}

// Two super-blocks (at sb) as a group at grp (which may be where they were).
// Sub-blocks 2 m and 2 m + 1 share qs[32 m, 32 m + 32) (low, high nibbles),
// so lane l's four code words take their nibbles from the bytes 4 c and
// 16 + 4 c of its pair, four at a time.
void RepackSuperPair(const Plain& p, const uint8_t* sb, uint8_t* grp) {
  uint8_t src[2 * sizeof(BlockQ5K)];
  std::memcpy(src, sb, 2 * p.bytes);
  const ColsFields f = ColsFieldsAt(p.qh >= 0 ? DType::kQ5_K : DType::kQ4_K, grp);
  constexpr uint32_t kLow = 0x0F0F0F0Fu;
  uint64_t masks[8] = {};
  for (int64_t l = 0; l < kColsBlocks; ++l) {
    const uint8_t* blk = src + l / 8 * p.bytes;
    const int s = static_cast<int>(l % 8);
    const uint8_t* qs = blk + p.qs + 32 * (s / 2);
    for (int c = 0; c < 4; ++c) {
      const uint32_t lo = LoadU32(qs + 4 * c), hi = LoadU32(qs + 16 + 4 * c);
      const uint32_t w =
          s % 2 == 0 ? (lo & kLow) | (hi & kLow) << 4 : (lo >> 4 & kLow) | (hi & ~kLow);
      std::memcpy(grp + f.codes + 64 * c + 4 * l, &w, 4);
    }
    if (p.qh < 0) continue;
    for (int w = 0; w < 8; ++w)
      masks[w] |= uint64_t{Nibble(LoadU32(blk + p.qh + 4 * w) >> s)} << (4 * l);
  }
  if (f.high >= 0) std::memcpy(grp + f.high, masks, sizeof(masks));
  for (int s = 0; s < 2; ++s) {
    std::memcpy(grp + f.scales + 12 * s, src + s * p.bytes + p.m, 12);
    std::memcpy(grp + f.d + 4 * s, src + s * p.bytes, 4);  // d, dmin
  }
}

void UnpackSuperPair(const Plain& p, const uint8_t* grp, uint8_t* blocks) {
  const ColsFields f = ColsFieldsAt(p.qh >= 0 ? DType::kQ5_K : DType::kQ4_K, grp);
  std::memset(blocks, 0, 2 * p.bytes);
  for (int s = 0; s < 2; ++s) {
    std::memcpy(blocks + s * p.bytes + p.m, grp + f.scales + 12 * s, 12);
    std::memcpy(blocks + s * p.bytes, grp + f.d + 4 * s, 4);
  }
  for (int64_t l = 0; l < kColsBlocks; ++l)
    for (int j = 0; j < kQK; ++j) {
      const int byte = j % 16;
      int q = (grp[f.codes + 64 * (byte / 4) + 4 * l + byte % 4] >> (4 * (j / 16))) & 15;
      if (f.high >= 0)
        q |= static_cast<int>((LoadU64(grp + f.high + 8 * (j / 4)) >> (4 * l + j % 4)) & 1) << 4;
      SetSuperCode(p, blocks + l / 8 * p.bytes, static_cast<int>(32 * (l % 8) + j), q);
    }
}

}  // namespace

bool HasColumnGroups(DType t) { return ColumnGroupsOf(t) != t; }

DType ColumnGroupsOf(DType t) {
  switch (t) {
    case DType::kQ4_0:
      return DType::kQ4_0Cols;
    case DType::kQ4_1:
      return DType::kQ4_1Cols;
    case DType::kQ5_0:
      return DType::kQ5_0Cols;
    case DType::kQ5_1:
      return DType::kQ5_1Cols;
    case DType::kQ4_K:
      return DType::kQ4_KCols;
    case DType::kQ5_K:
      return DType::kQ5_KCols;
    case DType::kQ8_0:
      return DType::kQ8_0Cols;
    case DType::kQ6_K:
      return DType::kQ6_KCols;
    default:
      return t;
  }
}

DType PlainOf(DType t) {
  switch (t) {
    case DType::kQ4_0Cols:
      return DType::kQ4_0;
    case DType::kQ4_1Cols:
      return DType::kQ4_1;
    case DType::kQ5_0Cols:
      return DType::kQ5_0;
    case DType::kQ5_1Cols:
      return DType::kQ5_1;
    case DType::kQ4_KCols:
      return DType::kQ4_K;
    case DType::kQ5_KCols:
      return DType::kQ5_K;
    case DType::kQ8_0Cols:
      return DType::kQ8_0;
    case DType::kQ6_KCols:
      return DType::kQ6_K;
    default:
      return t;
  }
}

void RepackQ6Slices(const uint8_t* src, uint8_t* dst) {
  uint8_t blk[sizeof(BlockQ6K)];
  std::memcpy(blk, src, sizeof(blk));
  std::memcpy(dst + 192, blk + 192, sizeof(blk) - 192);  // scales, d
  // Slice l, column j: the 4 codes of elements 16 l + 4 j + b (b = 0..3) are
  // 4 consecutive bytes of ql (one nibble) and of qh (one 2-bit field), so
  // each moves as a 32-bit word.
  for (int l = 0; l < 16; ++l) {
    const int h = l / 8, s = l % 8;
    uint32_t low[2] = {}, top = 0;
    for (int j = 0; j < 4; ++j) {
      const int i = 16 * s + 4 * j;  // the element's index in its half
      const uint32_t ql = LoadU32(blk + 64 * h + i % 64), qh = LoadU32(blk + 128 + 32 * h + i % 32);
      low[j % 2] |= (ql >> (4 * (i / 64)) & 0x0F0F0F0Fu) << (4 * (j / 2));
      top |= (qh >> (2 * (i / 32)) & 0x03030303u) << (2 * j);
    }
    std::memcpy(dst + 4 * l, &low[0], 4);
    std::memcpy(dst + 64 + 4 * l, &low[1], 4);
    std::memcpy(dst + 128 + 4 * l, &top, 4);
  }
}

void UnpackQ6Slices(const uint8_t* src, uint8_t* dst) {
  uint8_t g[sizeof(BlockQ6K)];
  std::memcpy(g, src, sizeof(g));
  std::memset(dst, 0, 192);
  std::memcpy(dst + 192, g + 192, sizeof(g) - 192);
  for (int e = 0; e < kQKK; ++e) {
    const int j = e % 16 / 4, byte = 4 * (e / 16) + e % 4;
    const int q =
        ((g[64 * (j % 2) + byte] >> (4 * (j / 2))) & 15) | (((g[128 + byte] >> (2 * j)) & 3) << 4);
    SetQ6Code(dst, e, q);
  }
}

void RepackColumnGroups(DType plain, uint8_t* row, int64_t K) {
  if (plain == DType::kQ6_K) {
    LUMEN_CHECK(K % kQKK == 0);
    for (int64_t b = 0; b < K / kQKK; ++b)
      RepackQ6Slices(row + b * sizeof(BlockQ6K), row + b * sizeof(BlockQ6K));
    return;
  }
  const Plain p = PlainFields(plain);
  LUMEN_CHECK(K % p.elems == 0);
  if (p.super()) {
    for (int64_t g = 0; g < K / kColsElems; ++g)
      RepackSuperPair(p, row + 2 * g * p.bytes, row + 2 * g * p.bytes);
    return;
  }
  uint8_t blocks[kColsBlocks * sizeof(BlockQ8_0)];  // the largest legacy block
  for (int64_t g = 0; g < K / kColsElems; ++g) {
    uint8_t* grp = row + g * kColsBlocks * p.bytes;
    std::memcpy(blocks, grp, kColsBlocks * p.bytes);
    const ColsFields f = ColsFieldsAt(plain, grp);
    uint64_t masks[8] = {};
    for (int64_t l = 0; l < kColsBlocks; ++l) {
      const uint8_t* blk = blocks + l * p.bytes;
      std::memcpy(grp + f.d + 2 * l, blk, 2);
      if (f.m >= 0) std::memcpy(grp + f.m + 2 * l, blk + p.m, 2);
      for (int64_t c = 0; c < p.columns(); ++c)
        CopyCodes(blk + p.qs + 4 * c, grp + f.codes + 64 * c + 4 * l, p.flip());
      if (p.qh < 0) continue;
      const uint32_t h = LoadU32(blk + p.qh);
      for (int w = 0; w < 8; ++w) masks[w] |= uint64_t{h >> (4 * w) & 15} << (4 * l);
    }
    if (f.high >= 0) std::memcpy(grp + f.high, masks, sizeof(masks));
  }
}

void UnpackColumnGroup(DType plain, const uint8_t* g, uint8_t* blocks) {
  if (plain == DType::kQ6_K) {
    for (int s = 0; s < 2; ++s)
      UnpackQ6Slices(g + s * sizeof(BlockQ6K), blocks + s * sizeof(BlockQ6K));
    return;
  }
  const Plain p = PlainFields(plain);
  if (p.super()) return UnpackSuperPair(p, g, blocks);
  const ColsFields f = ColsFieldsAt(plain, g);
  for (int64_t l = 0; l < kColsBlocks; ++l) {
    uint8_t* blk = blocks + l * p.bytes;
    std::memcpy(blk, g + f.d + 2 * l, 2);
    if (f.m >= 0) std::memcpy(blk + p.m, g + f.m + 2 * l, 2);
    for (int64_t c = 0; c < p.columns(); ++c)
      CopyCodes(g + f.codes + 64 * c + 4 * l, blk + p.qs + 4 * c, p.flip());
    if (p.qh < 0) continue;
    uint32_t h = 0;
    for (int j = 0; j < kQK; ++j)
      h |= static_cast<uint32_t>((LoadU64(g + f.high + 8 * (j / 4)) >> (4 * l + j % 4)) & 1) << j;
    std::memcpy(blk + p.qh, &h, 4);
  }
}

void DequantizeColumnGroups(DType plain, const uint8_t* row, int64_t K, int64_t k0, int64_t k1,
                            float* dst) {
  if (plain == DType::kQ6_K) {  // every super-block repacked alone
    LUMEN_CHECK(K % kQKK == 0 && k0 % kQKK == 0 && 0 <= k0 && k0 <= k1 && k1 <= K &&
                (k1 % kQKK == 0 || k1 == K));
    uint8_t blk[sizeof(BlockQ6K)];
    for (int64_t i = k0; i < k1; i += kQKK) {
      UnpackQ6Slices(row + i / kQKK * sizeof(BlockQ6K), blk);
      DequantizeRow(DType::kQ6_K, blk, dst + (i - k0), std::min<int64_t>(kQKK, k1 - i));
    }
    return;
  }
  const Plain p = PlainFields(plain);
  const int64_t be = p.elems, bb = p.bytes;
  LUMEN_CHECK(K % be == 0 && k0 % be == 0 && 0 <= k0 && k0 <= k1 && k1 <= K &&
              (k1 % be == 0 || k1 == K));
  const int64_t end = K / kColsElems * kColsElems;  // where the plain blocks start
  uint8_t blocks[kColsBlocks * sizeof(BlockQ8_0)];  // the largest legacy block
  static_assert(sizeof(blocks) >= 2 * sizeof(BlockQ5K));
  int64_t i = k0;
  while (i < std::min(k1, end)) {
    const int64_t g = i / kColsElems * kColsElems;
    const int64_t e = std::min(k1, g + kColsElems);
    UnpackColumnGroup(plain, row + g / be * bb, blocks);
    DequantizeRow(plain, blocks + (i - g) / be * bb, dst + (i - k0), e - i);
    i = e;
  }
  if (i < k1) DequantizeRow(plain, row + i / be * bb, dst + (i - k0), k1 - i);
}

}  // namespace lumen
