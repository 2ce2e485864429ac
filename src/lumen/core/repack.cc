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

// Two super-blocks (at sb) as a group at grp (which may be where they were).
// Sub-blocks 2 m and 2 m + 1 share qs[32 m, 32 m + 32) (low, high nibbles),
// so lane l's four code words take their nibbles from the bytes 4 c and
// 16 + 4 c of its pair, four at a time.
void RepackSuperPair(const Plain& p, const uint8_t* sb, uint8_t* grp, bool planes) {
  uint8_t src[2 * sizeof(BlockQ5K)];
  std::memcpy(src, sb, 2 * p.bytes);
  const ColsFields f = ColsFieldsAt(p.qh >= 0 ? DType::kQ5_K : DType::kQ4_K, grp);
  constexpr uint32_t kLow = 0x0F0F0F0Fu;
  uint64_t masks[8] = {};
  uint32_t plane[kColsBlocks] = {};  // planes: lane l's dword of the high field
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
    for (int w = 0; w < 8; ++w) {
      // qh[4w + i] bit s: the 5th bit of element 4w + i of sub-block s.
      const uint32_t bits = LoadU32(blk + p.qh + 4 * w) >> s;
      if (planes) {
        plane[l] |= (bits & 0x01010101u) << w;
      } else {
        masks[w] |= uint64_t{Nibble(bits)} << (4 * l);
      }
    }
  }
  if (f.high >= 0 && planes) std::memcpy(grp + f.high, plane, sizeof(plane));
  if (f.high >= 0 && !planes) std::memcpy(grp + f.high, masks, sizeof(masks));
  for (int s = 0; s < 2; ++s) {
    std::memcpy(grp + f.scales + 12 * s, src + s * p.bytes + p.m, 12);
    std::memcpy(grp + f.d + 4 * s, src + s * p.bytes, 4);  // d, dmin
  }
}

// Word at a time (the prefill's exact decode unpacks every group it reads
// this way on CPUs without 16-lane vectors, where a code at a time cost as
// much as the product): lane l's 16 code bytes are a legacy block's qs
// (element k in the low nibble of byte k, k + 16 in the high), and
// sub-blocks 2m, 2m + 1 of a super-block share qs[32 m ..] as its low and
// high nibbles.
void UnpackSuperPair(const Plain& p, const uint8_t* grp, uint8_t* blocks, bool planes) {
  const ColsFields f = ColsFieldsAt(p.qh >= 0 ? DType::kQ5_K : DType::kQ4_K, grp);
  std::memset(blocks, 0, 2 * p.bytes);
  for (int s = 0; s < 2; ++s) {
    std::memcpy(blocks + s * p.bytes + p.m, grp + f.scales + 12 * s, 12);
    std::memcpy(blocks + s * p.bytes, grp + f.d + 4 * s, 4);
  }
  constexpr uint32_t kLo = 0x0F0F0F0Fu, kOne = 0x01010101u;
  for (int64_t l = 0; l < kColsBlocks; l += 2) {  // sub-blocks l (low nibbles), l + 1 (high)
    uint8_t* qs = blocks + l / 8 * p.bytes + p.qs + 32 * (l % 8 / 2);
    for (int c = 0; c < 4; ++c) {
      const uint32_t a = LoadU32(grp + f.codes + 64 * c + 4 * l);
      const uint32_t b = LoadU32(grp + f.codes + 64 * c + 4 * (l + 1));
      const uint32_t lo = (a & kLo) | ((b & kLo) << 4), hi = ((a >> 4) & kLo) | (b & ~kLo);
      std::memcpy(qs + 4 * c, &lo, 4);
      std::memcpy(qs + 16 + 4 * c, &hi, 4);
    }
  }
  if (f.high < 0) return;
  if (planes) {  // qh[4w + i] bit j: bit w of byte 4 (8s + j) + i of the planes
    for (int s = 0; s < 2; ++s)
      for (int w = 0; w < 8; ++w) {
        uint32_t qh = 0;
        for (int j = 0; j < 8; ++j)
          qh |= (LoadU32(grp + f.high + 4 * (8 * s + j)) >> w & kOne) << j;
        std::memcpy(blocks + s * p.bytes + p.qh + 4 * w, &qh, 4);
      }
    return;
  }
  // qh[e] bit j: the 5th bit of element e of sub-block j, bit 4 (8s + j) + e % 4
  // of mask e / 4: qh[4w .. 4w + 3] of super-block s transpose mask w's nibbles.
  for (int w = 0; w < 8; ++w) {
    const uint64_t mask = LoadU64(grp + f.high + 8 * w);
    for (int s = 0; s < 2; ++s) {
      uint32_t qh = 0;
      for (int j = 0; j < 8; ++j) {
        // Bit i of the nibble to bit 0 of byte i: copies at shifts 0, 7, 14, 21 never overlap.
        const auto nib = static_cast<uint32_t>((mask >> (32 * s + 4 * j)) & 15);
        qh |= ((nib * 0x00204081u) & 0x01010101u) << j;
      }
      std::memcpy(blocks + s * p.bytes + p.qh + 4 * w, &qh, 4);
    }
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
    case DType::kQ2_K:
      return DType::kQ2_KCols;
    case DType::kQ3_K:
      return DType::kQ3_KCols;
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
    case DType::kQ2_KCols:
      return DType::kQ2_K;
    case DType::kQ3_KCols:
      return DType::kQ3_K;
    case DType::kQ5_KPlanes:
      return DType::kQ5_K;
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

// Word at a time, as UnpackSuperPair. Slice s = 8h + t holds elements
// 128h + 16t ..; in the plain block, ql[64h + 16(t % 4) + 4j + b] has slice
// t's code (element 16t + 4j + b of the half) in nibble t / 4, and
// qh[32h + 16(t % 2) + 4j + b] its top bits at bits 2 (t / 2).
void UnpackQ6Slices(const uint8_t* src, uint8_t* dst) {
  uint8_t g[sizeof(BlockQ6K)];
  std::memcpy(g, src, sizeof(g));
  std::memset(dst, 0, 192);
  std::memcpy(dst + 192, g + 192, sizeof(g) - 192);
  constexpr uint32_t kLo = 0x0F0F0F0Fu, kTwo = 0x03030303u;
  for (int s = 0; s < 16; ++s) {
    const int h = s / 8, t = s % 8;
    const uint32_t v0 = LoadU32(g + 4 * s), v1 = LoadU32(g + 64 + 4 * s);
    const uint32_t hb = LoadU32(g + 128 + 4 * s);
    const uint32_t low[4] = {v0 & kLo, v1 & kLo, (v0 >> 4) & kLo, (v1 >> 4) & kLo};
    for (int j = 0; j < 4; ++j) {
      uint8_t* ql = dst + 64 * h + 16 * (t % 4) + 4 * j;
      uint8_t* qh = dst + 128 + 32 * h + 16 * (t % 2) + 4 * j;
      const uint32_t l = LoadU32(ql) | low[j] << (4 * (t / 4));
      const uint32_t top = LoadU32(qh) | ((hb >> (2 * j)) & kTwo) << (2 * (t / 2));
      std::memcpy(ql, &l, 4);
      std::memcpy(qh, &top, 4);
    }
  }
}

namespace {

constexpr uint32_t kOne = 0x01010101u, kTwo = 0x03030303u, kThree = 0x07070707u;

// Q3_K's planes from its records form, a dword (4 lane bytes) at a time: q[h]
// holds record 4 h + t's low 2 bits at bits 2 t, hm record r's third bit at
// bit r; every term is masked to its byte before a shift (a 32-bit shift
// carries the next byte's bits down).
void Q3RecordsToPlanes(const uint32_t* q, uint32_t hm, uint32_t* p) {
  uint32_t c[8];
  for (int r = 0; r < 8; ++r) c[r] = (q[r / 4] >> (2 * (r % 4)) & kTwo) | (hm >> r & kOne) << 2;
  p[0] = c[0] | c[1] << 3 | (c[6] & kTwo) << 6;
  p[1] = c[2] | c[3] << 3 | (c[7] & kTwo) << 6;
  p[2] = c[4] | c[5] << 3 | (c[6] >> 2 & kOne) << 6 | (c[7] >> 2 & kOne) << 7;
}

void Q3PlanesToRecords(const uint32_t* p, uint32_t* q, uint32_t* hm) {
  const uint32_t c[8] = {p[0] & kThree,
                         p[0] >> 3 & kThree,
                         p[1] & kThree,
                         p[1] >> 3 & kThree,
                         p[2] & kThree,
                         p[2] >> 3 & kThree,
                         (p[0] >> 6 & kTwo) | (p[2] >> 6 & kOne) << 2,
                         (p[1] >> 6 & kTwo) | (p[2] >> 7 & kOne) << 2};
  q[0] = q[1] = *hm = 0;
  for (int r = 0; r < 8; ++r) {
    q[r / 4] |= (c[r] & kTwo) << (2 * (r % 4));
    *hm |= (c[r] >> 2 & kOne) << r;
  }
}

}  // namespace

// Q2_K and Q3_K records. Block l = 4 n + j's element e sits at bits 2 j of
// qs[32 n + e] (its third bit at bit l of hmask[e]); for e = 16 h + 4 t + i
// the four codes i = 0..3 are one dword of the plain qs (and hmask), so each
// moves as a 32-bit word. Q3_K's records then become planes, a dword at a
// time.
void RepackQ23Records(bool three, const uint8_t* src, uint8_t* dst) {
  uint8_t blk[sizeof(BlockQ3K)];
  const int64_t bytes = three ? sizeof(BlockQ3K) : sizeof(BlockQ2K);
  const int64_t qs = three ? offsetof(BlockQ3K, qs) : offsetof(BlockQ2K, qs);
  std::memcpy(blk, src, bytes);
  std::memcpy(dst, blk, bytes);  // scales and d (the codes are rewritten below)
  for (int l = 0; l < 8; ++l) {
    const int n = l / 4, j = l % 4;
    uint32_t high = 0, w[2] = {};
    for (int h = 0; h < 2; ++h)
      for (int t = 0; t < 4; ++t) {
        w[h] |= (LoadU32(blk + qs + 32 * n + 16 * h + 4 * t) >> (2 * j) & kTwo) << (2 * t);
        if (three) high |= (LoadU32(blk + 16 * h + 4 * t) >> l & kOne) << (4 * h + t);
      }
    if (!three) {
      for (int h = 0; h < 2; ++h) std::memcpy(dst + qs + 32 * h + 4 * l, &w[h], 4);
      continue;
    }
    uint32_t p[3];
    Q3RecordsToPlanes(w, high, p);
    for (int k = 0; k < 3; ++k) std::memcpy(dst + 32 * k + 4 * l, &p[k], 4);
  }
}

// Each plain dword built in a register (or-ing into the destination a term
// at a time chained store forwards). The 8-lane exact decoders, which unpack
// every super-block they read, have a vector version (UnpackRecordsAvx2 in
// kernels/matmul.cc).
void UnpackQ23Records(bool three, const uint8_t* src, uint8_t* dst) {
  uint8_t g[sizeof(BlockQ3K)];
  const int64_t bytes = three ? sizeof(BlockQ3K) : sizeof(BlockQ2K);
  const int64_t qs = three ? offsetof(BlockQ3K, qs) : offsetof(BlockQ2K, qs);
  std::memcpy(g, src, bytes);
  std::memcpy(dst, g, bytes);
  if (three)  // planes -> records form (hmask at 0, qs halves at 32, 64), in g
    for (int l = 0; l < 8; ++l) {
      const uint32_t p[3] = {LoadU32(g + 4 * l), LoadU32(g + 32 + 4 * l), LoadU32(g + 64 + 4 * l)};
      uint32_t q[2], hm;
      Q3PlanesToRecords(p, q, &hm);
      std::memcpy(g + 4 * l, &hm, 4);
      std::memcpy(g + qs + 4 * l, &q[0], 4);
      std::memcpy(g + qs + 32 + 4 * l, &q[1], 4);
    }
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < 4; ++t) {
      for (int n = 0; n < 2; ++n) {
        uint32_t v = 0;
        for (int j = 0; j < 4; ++j)
          v |= (LoadU32(g + qs + 32 * h + 4 * (4 * n + j)) >> (2 * t) & kTwo) << (2 * j);
        std::memcpy(dst + qs + 32 * n + 16 * h + 4 * t, &v, 4);
      }
      if (!three) continue;
      uint32_t m = 0;
      for (int l = 0; l < 8; ++l) m |= (LoadU32(g + 4 * l) >> (4 * h + t) & kOne) << l;
      std::memcpy(dst + 16 * h + 4 * t, &m, 4);
    }
}

namespace {

// The formats repacked a super-block at a time (Q6_K, Q2_K, Q3_K): the
// super-block's bytes, else 0.
int64_t AloneBytes(DType plain) {
  switch (plain) {
    case DType::kQ6_K:
      return sizeof(BlockQ6K);
    case DType::kQ2_K:
      return sizeof(BlockQ2K);
    case DType::kQ3_K:
      return sizeof(BlockQ3K);
    default:
      return 0;
  }
}

void RepackAlone(DType plain, const uint8_t* src, uint8_t* dst) {
  if (plain == DType::kQ6_K) return RepackQ6Slices(src, dst);
  RepackQ23Records(plain == DType::kQ3_K, src, dst);
}

void UnpackAlone(DType plain, const uint8_t* src, uint8_t* dst) {
  if (plain == DType::kQ6_K) return UnpackQ6Slices(src, dst);
  UnpackQ23Records(plain == DType::kQ3_K, src, dst);
}

}  // namespace

void RepackColumnGroups(DType t, uint8_t* row, int64_t K) {
  const DType plain = PlainOf(t);
  if (const int64_t bytes = AloneBytes(plain)) {
    LUMEN_CHECK(K % kQKK == 0);
    for (int64_t b = 0; b < K / kQKK; ++b) RepackAlone(plain, row + b * bytes, row + b * bytes);
    return;
  }
  const Plain p = PlainFields(plain);
  LUMEN_CHECK(K % p.elems == 0);
  if (p.super()) {
    for (int64_t g = 0; g < K / kColsElems; ++g)
      RepackSuperPair(p, row + 2 * g * p.bytes, row + 2 * g * p.bytes, t == DType::kQ5_KPlanes);
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

void UnpackColumnGroup(DType t, const uint8_t* g, uint8_t* blocks) {
  const DType plain = PlainOf(t);
  if (const int64_t bytes = AloneBytes(plain)) {
    for (int s = 0; s < 2; ++s) UnpackAlone(plain, g + s * bytes, blocks + s * bytes);
    return;
  }
  const Plain p = PlainFields(plain);
  if (p.super()) return UnpackSuperPair(p, g, blocks, t == DType::kQ5_KPlanes);
  const ColsFields f = ColsFieldsAt(plain, g);
  for (int64_t l = 0; l < kColsBlocks; ++l) {
    uint8_t* blk = blocks + l * p.bytes;
    std::memcpy(blk, g + f.d + 2 * l, 2);
    if (f.m >= 0) std::memcpy(blk + p.m, g + f.m + 2 * l, 2);
    for (int64_t c = 0; c < p.columns(); ++c)
      CopyCodes(g + f.codes + 64 * c + 4 * l, blk + p.qs + 4 * c, p.flip());
    if (p.qh < 0) continue;
    uint32_t h = 0;  // bits 4w .. 4w + 3: mask w's nibble l
    for (int w = 0; w < 8; ++w)
      h |= static_cast<uint32_t>((LoadU64(g + f.high + 8 * w) >> (4 * l)) & 15) << (4 * w);
    std::memcpy(blk + p.qh, &h, 4);
  }
}

void UnpackColumnGroupsRow(DType t, const uint8_t* row, int64_t K, uint8_t* dst) {
  const DType plain = PlainOf(t);
  if (const int64_t bytes = AloneBytes(plain)) {  // every super-block repacked alone
    LUMEN_CHECK(K % kQKK == 0);
    for (int64_t b = 0; b < K / kQKK; ++b) UnpackAlone(plain, row + b * bytes, dst + b * bytes);
    return;
  }
  const Plain p = PlainFields(plain);
  LUMEN_CHECK(K % p.elems == 0);
  const int64_t group = kColsElems / p.elems * p.bytes, groups = K / kColsElems;
  for (int64_t g = 0; g < groups; ++g) UnpackColumnGroup(t, row + g * group, dst + g * group);
  std::memcpy(dst + groups * group, row + groups * group, (K / p.elems) * p.bytes - groups * group);
}

void DequantizeColumnGroups(DType t, const uint8_t* row, int64_t K, int64_t k0, int64_t k1,
                            float* dst) {
  const DType plain = PlainOf(t);
  if (const int64_t bytes = AloneBytes(plain)) {  // every super-block repacked alone
    LUMEN_CHECK(K % kQKK == 0 && k0 % kQKK == 0 && 0 <= k0 && k0 <= k1 && k1 <= K &&
                (k1 % kQKK == 0 || k1 == K));
    uint8_t blk[sizeof(BlockQ6K)];
    for (int64_t i = k0; i < k1; i += kQKK) {
      UnpackAlone(plain, row + i / kQKK * bytes, blk);
      DequantizeRow(plain, blk, dst + (i - k0), std::min<int64_t>(kQKK, k1 - i));
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
    UnpackColumnGroup(t, row + g / be * bb, blocks);
    DequantizeRow(plain, blocks + (i - g) / be * bb, dst + (i - k0), e - i);
    i = e;
  }
  if (i < k1) DequantizeRow(plain, row + i / be * bb, dst + (i - k0), k1 - i);
}

void TransposeMlxRuns(uint8_t* codes, int64_t bytes) {
  for (int64_t u = 0; u + kMlxRunBytes <= bytes; u += kMlxRunBytes) {
    uint8_t* run = codes + u;
    uint8_t t[kMlxRunBytes];
    for (int k = 0; k < 4; ++k)
      for (int h = 0; h < 2; ++h)
        for (int c = 0; c < 4; ++c)
          std::memcpy(t + 32 * c + 16 * h + 4 * k, run + 32 * k + 16 * h + 4 * c, 4);
    std::memcpy(run, t, kMlxRunBytes);
  }
}

namespace {

// Each whole group's dwords (D = bits per block): to_groups moves dword
// D l + c to 16 c + l, else back.
void MoveMlxGroups(uint8_t* codes, int64_t bytes, int bits, bool to_groups) {
  const int64_t size = MlxGroupBytes(bits);
  for (int64_t u = 0; u + size <= bytes; u += size) {
    uint8_t* g = codes + u;
    uint8_t t[MlxGroupBytes(8)];
    for (int l = 0; l < 16; ++l)
      for (int c = 0; c < bits; ++c) {
        const int file = 4 * (bits * l + c), moved = 4 * (16 * c + l);
        std::memcpy(t + (to_groups ? moved : file), g + (to_groups ? file : moved), 4);
      }
    std::memcpy(g, t, size);
  }
}

}  // namespace

void TransposeMlxGroups(uint8_t* codes, int64_t bytes, int bits) {
  LUMEN_CHECK(bits == 4 || bits == 8);
  MoveMlxGroups(codes, bytes, bits, true);
}

void UntransposeMlxGroups(uint8_t* codes, int64_t bytes, int bits) {
  LUMEN_CHECK(bits == 4 || bits == 8);
  MoveMlxGroups(codes, bytes, bits, false);
}

}  // namespace lumen
