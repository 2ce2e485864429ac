// Column groups (repack.h): repacking in place keeps every value of Q4_0,
// Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q8_0 and Q6_K rows at any row address, for
// whole rows and any block-aligned range; the codes and masks of rows on
// 32-byte boundaries are whole cache lines; the fields sit where the header
// says.
#include "lumen/core/repack.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "lumen/core/quant.h"

namespace lumen {
namespace {

constexpr DType kLegacy[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1};
constexpr DType kPlain[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                            DType::kQ4_K, DType::kQ5_K, DType::kQ8_0};

// `tries` random parts [k0, k1) (multiples of `block`) of the repacked row
// decode to want's values, and nothing past k1 is written.
void ExpectPartsDecode(DType plain, const uint8_t* row, int64_t K, int64_t block,
                       const std::vector<float>& want, std::mt19937& rng, int tries) {
  for (int i = 0; i < tries; ++i) {
    int64_t k0 = rng() % (K / block + 1) * block, k1 = rng() % (K / block + 1) * block;
    if (k0 > k1) std::swap(k0, k1);
    std::vector<float> part(k1 - k0 + 1, -1.0f);
    DequantizeColumnGroups(plain, row, K, k0, k1, part.data());
    EXPECT_EQ(0, std::memcmp(want.data() + k0, part.data(), (k1 - k0) * 4))
        << "[" << k0 << ", " << k1 << ")";
    EXPECT_EQ(-1.0f, part[k1 - k0]);
  }
}

TEST(ColumnGroups, KeepEveryValueAtEveryAddress) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<DType> forms;  // each plain type's column groups, and Q5_K's planes
  for (DType t : kPlain) forms.push_back(ColumnGroupsOf(t));
  forms.push_back(DType::kQ5_KPlanes);
  for (DType c : forms) {
    const DType t = PlainOf(c);
    EXPECT_NE(t, c);
    EXPECT_TRUE(IsColumnGroups(c));
    const int64_t be = Info(t).block_elems, bb = Info(t).block_bytes;
    const int64_t gb = kColsElems / be * bb;
    // Legacy: no group, one, one with quads after it, several with a pair
    // and a half. K-quants: no group, one, one and a super-block, several.
    const std::vector<int64_t> Ks = be == kQK ? std::vector<int64_t>{96, 512, 544, 1248, 2048, 4160}
                                              : std::vector<int64_t>{256, 512, 768, 2048, 2816};
    for (int64_t K : Ks) {
      std::vector<float> x(K), want(K), got(K);
      for (float& v : x) v = nd(rng);
      const int64_t rb = K / be * bb;
      std::vector<uint8_t> plain(rb);
      QuantizeRow(t, x.data(), plain.data(), K);
      DequantizeRow(t, plain.data(), want.data(), K);
      std::vector<uint8_t> buf(rb + 128);
      const auto mis = static_cast<int64_t>(reinterpret_cast<uintptr_t>(buf.data()) % 64);
      for (int off = 0; off < 64; ++off) {
        SCOPED_TRACE(testing::Message() << Name(c) << " K=" << K << " offset " << off);
        uint8_t* row = buf.data() + (64 - mis) % 64 + off;
        std::memcpy(row, plain.data(), rb);
        RepackColumnGroups(c, row, K);
        const int64_t groups = K / kColsElems;
        if (groups > 0) {
          EXPECT_NE(0, std::memcmp(row, plain.data(), gb));
        }
        // The blocks after the groups are untouched.
        EXPECT_EQ(0, std::memcmp(row + groups * gb, plain.data() + groups * gb, rb - groups * gb));
        for (int64_t g = 0; g < groups; ++g) {
          const uint8_t* p = row + g * gb;
          const ColsFields f = ColsFieldsAt(t, p);
          if (off % 32 == 0) {  // 32-byte aligned rows: the columns and masks are whole lines
            EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(p + f.codes) % 64);
            if (f.high >= 0) {
              EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(p + f.high) % 64);
            }
          }
          std::vector<uint8_t> blocks(gb);
          UnpackColumnGroup(c, p, blocks.data());
          EXPECT_EQ(0, std::memcmp(blocks.data(), plain.data() + g * gb, gb)) << "g=" << g;
        }
        DequantizeRow(c, row, got.data(), K);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), K * 4));
        ExpectPartsDecode(c, row, K, be, want, rng, 8);
      }
    }
  }
}

// Byte 4 l + i of column c is byte 4 c + i of block l's codes; bit 4 l + i
// of mask w the 5th bit of element 4 w + i; d (and m) after the columns and
// masks, or d first 32 bytes past a line.
TEST(ColumnGroups, FieldsHoldOneBlockPerLane) {
  alignas(64) uint8_t buf[64 + 16 * sizeof(BlockQ5_1)];
  for (DType t : kLegacy)
    for (int off : {0, 32}) {
      SCOPED_TRACE(testing::Message() << Name(t) << " offset " << off);
      const int64_t bb = Info(t).block_bytes;
      const bool min = t == DType::kQ4_1 || t == DType::kQ5_1;
      const bool high = t == DType::kQ5_0 || t == DType::kQ5_1;
      const int64_t qs = bb - 16, qh = min ? 4 : 2;
      uint8_t* row = buf + off;
      for (int64_t l = 0; l < 16; ++l) {
        uint8_t* blk = row + l * bb;
        blk[0] = static_cast<uint8_t>(l);
        blk[1] = 0x3C;
        if (min) {
          blk[2] = static_cast<uint8_t>(100 + l);
          blk[3] = 0x3D;
        }
        if (high) {  // 5th bits: element j of block l set where (j + l) % 3 == 0
          uint32_t h = 0;
          for (int j = 0; j < 32; ++j) h |= uint32_t((j + l) % 3 == 0) << j;
          std::memcpy(blk + qh, &h, 4);
        }
        for (int j = 0; j < 16; ++j) blk[qs + j] = static_cast<uint8_t>(16 * l + j);
      }
      RepackColumnGroups(t, row, kColsElems);
      const ColsFields f = ColsFieldsAt(t, row);
      EXPECT_EQ(off == 32 ? 32 : 0, f.codes);
      EXPECT_EQ(off == 32 ? 0 : 256 + (high ? 64 : 0), f.d);
      EXPECT_EQ(high ? f.codes + 256 : -1, f.high);
      EXPECT_EQ(min ? 288 + (high ? 64 : 0) : -1, f.m);
      for (int64_t l = 0; l < 16; ++l) {
        EXPECT_EQ(l, row[f.d + 2 * l]);
        EXPECT_EQ(0x3C, row[f.d + 2 * l + 1]);
        if (min) {
          EXPECT_EQ(100 + l, row[f.m + 2 * l]);
        }
        for (int c = 0; c < 4; ++c)
          for (int i = 0; i < 4; ++i)
            EXPECT_EQ(16 * l + 4 * c + i, row[f.codes + 64 * c + 4 * l + i]) << l << " " << c;
        for (int j = 0; j < 32 && high; ++j) {
          uint64_t mask;
          std::memcpy(&mask, row + f.high + 8 * (j / 4), 8);
          EXPECT_EQ((j + l) % 3 == 0, (mask >> (4 * l + j % 4)) & 1) << "block " << l << " j " << j;
        }
      }
    }
}

// Q8_0: byte 4 l + i of column c (of 8) is code 4 c + i of block l plus
// 128 (the sign bit flipped), d after the 512 code bytes, or first 32
// bytes past a line.
TEST(ColumnGroups, Q8BlocksHoldOneBlockPerLaneFlipped) {
  alignas(64) uint8_t buf[64 + 16 * sizeof(BlockQ8_0)];
  for (int off : {0, 32}) {
    SCOPED_TRACE(testing::Message() << "offset " << off);
    uint8_t* row = buf + off;
    auto code = [](int l, int j) { return static_cast<int8_t>((37 * l + 11 * j) % 256 - 128); };
    for (int l = 0; l < 16; ++l) {
      uint8_t* blk = row + l * sizeof(BlockQ8_0);
      blk[0] = static_cast<uint8_t>(l);
      blk[1] = 0x3C;
      for (int j = 0; j < 32; ++j) blk[2 + j] = static_cast<uint8_t>(code(l, j));
    }
    RepackColumnGroups(DType::kQ8_0, row, kColsElems);
    const ColsFields f = ColsFieldsAt(DType::kQ8_0, row);
    EXPECT_EQ(off == 32 ? 32 : 0, f.codes);
    EXPECT_EQ(off == 32 ? 0 : 512, f.d);
    EXPECT_EQ(-1, f.high);
    EXPECT_EQ(-1, f.m);
    for (int l = 0; l < 16; ++l) {
      EXPECT_EQ(l, row[f.d + 2 * l]);
      EXPECT_EQ(0x3C, row[f.d + 2 * l + 1]);
      for (int c = 0; c < 8; ++c)
        for (int i = 0; i < 4; ++i)
          EXPECT_EQ(code(l, 4 * c + i) + 128, row[f.codes + 64 * c + 4 * l + i]) << l << " " << c;
    }
  }
}

// K-quants: lane l is sub-block l % 8 of super-block l / 8, its codes in
// the legacy columns (low nibble element 4 c + i, high 16 + 4 c + i), the
// 5th bits in the legacy masks (planes: bit w of byte 4 l + i), then [scales 0 | scales 1 | d0
// dmin0 d1 dmin1] (the meta field where a legacy group has d).
TEST(ColumnGroups, SuperBlocksHoldOneSubBlockPerLane) {
  alignas(64) uint8_t buf[64 + 2 * sizeof(BlockQ5K)];
  for (DType c : {DType::kQ4_KCols, DType::kQ5_KCols, DType::kQ5_KPlanes})
    for (int off : {0, 32}) {
      SCOPED_TRACE(testing::Message() << Name(c) << " offset " << off);
      const DType t = PlainOf(c);
      const bool five = t == DType::kQ5_K;
      const int64_t bb = Info(t).block_bytes, qs = five ? 48 : 16;
      // Code of element e of super-block s: (7 e + 3 s) % 16, plus 16 where
      // (e + s) % 5 == 0 (Q5_K).
      auto code = [&](int s, int e) {
        return (7 * e + 3 * s) % 16 + (five && (e + s) % 5 == 0 ? 16 : 0);
      };
      uint8_t* row = buf + off;
      std::memset(row, 0, 2 * bb);
      for (int s = 0; s < 2; ++s) {
        uint8_t* blk = row + s * bb;
        blk[0] = static_cast<uint8_t>(10 + s);  // d
        blk[1] = 0x3C;
        blk[2] = static_cast<uint8_t>(20 + s);  // dmin
        blk[3] = 0x3D;
        for (int i = 0; i < 12; ++i) blk[4 + i] = static_cast<uint8_t>(40 * s + i);
        for (int e = 0; e < 256; ++e) {  // GGUF: element 64 k + 32 h + l, nibble h of qs[32 k + l]
          blk[qs + 32 * (e / 64) + e % 32] |=
              static_cast<uint8_t>((code(s, e) & 15) << (4 * ((e / 32) % 2)));
          if (five) blk[16 + e % 32] |= static_cast<uint8_t>((code(s, e) >> 4) << (e / 32));
        }
      }
      RepackColumnGroups(c, row, kColsElems);
      const ColsFields f = ColsFieldsAt(t, row);
      EXPECT_EQ(off == 32 ? 32 : 0, f.codes);
      EXPECT_EQ(five ? f.codes + 256 : -1, f.high);
      EXPECT_EQ(off == 32 ? 0 : 256 + (five ? 64 : 0), f.scales);
      EXPECT_EQ(f.scales + 24, f.d);
      EXPECT_EQ(-1, f.m);
      for (int s = 0; s < 2; ++s) {
        for (int i = 0; i < 12; ++i) EXPECT_EQ(40 * s + i, row[f.scales + 12 * s + i]);
        EXPECT_EQ(10 + s, row[f.d + 4 * s]);
        EXPECT_EQ(0x3C, row[f.d + 4 * s + 1]);
        EXPECT_EQ(20 + s, row[f.d + 4 * s + 2]);
        EXPECT_EQ(0x3D, row[f.d + 4 * s + 3]);
      }
      for (int l = 0; l < 16; ++l)
        for (int j = 0; j < 32; ++j) {
          const int want = code(l / 8, 32 * (l % 8) + j);
          const uint8_t byte = row[f.codes + 64 * ((j % 16) / 4) + 4 * l + j % 4];
          EXPECT_EQ(want & 15, (byte >> (4 * (j / 16))) & 15) << "lane " << l << " j " << j;
          if (c == DType::kQ5_KPlanes) {  // bit j / 4 of byte 4 l + j % 4
            EXPECT_EQ(want >> 4, (row[f.high + 4 * l + j % 4] >> (j / 4)) & 1)
                << "lane " << l << " j " << j;
          } else if (five) {
            uint64_t mask;
            std::memcpy(&mask, row + f.high + 8 * (j / 4), 8);
            EXPECT_EQ(want >> 4, (mask >> (4 * l + j % 4)) & 1) << "lane " << l << " j " << j;
          }
        }
    }
}

// A format repacked a super-block at a time (Q6_K, Q2_K, Q3_K) at rows of
// every length below and at 10 addresses: bytes [codes0, codes1) of each
// super-block change, the rest (scales, d) stay, `unpack` gives the plain
// bytes back, and the whole row and super-block ranges decode to the plain
// values bit for bit.
template <class Unpack>
void ExpectRepackedAloneKeepsEveryValue(DType t, int64_t codes0, int64_t codes1,
                                        const Unpack& unpack, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  EXPECT_EQ(t, PlainOf(ColumnGroupsOf(t)));
  EXPECT_TRUE(IsColumnGroups(ColumnGroupsOf(t)));
  const int64_t bb = Info(t).block_bytes;
  for (int64_t K : {256, 768, 2816}) {
    std::vector<float> x(K), want(K), got(K);
    for (float& v : x) v = nd(rng);
    const int64_t nb = K / kQKK, rb = nb * bb;
    std::vector<uint8_t> plain(rb);
    QuantizeRow(t, x.data(), plain.data(), K);
    DequantizeRow(t, plain.data(), want.data(), K);
    std::vector<uint8_t> buf(rb + 64);
    for (int off = 0; off < 64; off += 7) {
      SCOPED_TRACE(testing::Message() << Name(t) << " K=" << K << " offset " << off);
      uint8_t* row = buf.data() + off;
      std::memcpy(row, plain.data(), rb);
      RepackColumnGroups(t, row, K);
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *p = row + b * bb, *q = plain.data() + b * bb;
        EXPECT_NE(0, std::memcmp(p + codes0, q + codes0, codes1 - codes0)) << "b=" << b;
        EXPECT_EQ(0, std::memcmp(p, q, codes0));
        EXPECT_EQ(0, std::memcmp(p + codes1, q + codes1, bb - codes1));
        uint8_t back[sizeof(BlockQ6K)];
        unpack(p, back);
        EXPECT_EQ(0, std::memcmp(back, q, bb)) << "b=" << b;
      }
      DequantizeRow(ColumnGroupsOf(t), row, got.data(), K);
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), K * 4));
      ExpectPartsDecode(t, row, K, kQKK, want, rng, 4);
    }
  }
}

// Q6_K slices: the codes (bytes 0-191) move, the scales and d stay.
TEST(ColumnGroups, Q6SlicesKeepEveryValueAtEveryAddress) {
  std::mt19937 rng(6);
  EXPECT_EQ(DType::kQ6_KCols, ColumnGroupsOf(DType::kQ6_K));
  ExpectRepackedAloneKeepsEveryValue(DType::kQ6_K, 0, 192, UnpackQ6Slices, rng);
}

// Q2_K and Q3_K records: the codes (Q2_K qs at 16-79; Q3_K hmask and qs at
// 0-95) move, the scales and d stay.
TEST(ColumnGroups, Q23RecordsKeepEveryValueAtEveryAddress) {
  std::mt19937 rng(7);
  EXPECT_EQ(DType::kQ2_KCols, ColumnGroupsOf(DType::kQ2_K));
  EXPECT_EQ(DType::kQ3_KCols, ColumnGroupsOf(DType::kQ3_K));
  ExpectRepackedAloneKeepsEveryValue(
      DType::kQ2_K, 16, 80, [](const uint8_t* s, uint8_t* d) { UnpackQ23Records(false, s, d); },
      rng);
  ExpectRepackedAloneKeepsEveryValue(
      DType::kQ3_K, 0, 96, [](const uint8_t* s, uint8_t* d) { UnpackQ23Records(true, s, d); }, rng);
}

// Q2_K / Q3_K records: Q2_K's element 16 h + 4 t + i of block l at bits 2 t
// of qs byte 32 h + 4 l + i; Q3_K's element 4 r + i of block l (record r) in
// lane byte 4 l + i of its planes: records 0-5 at bits 3 (r % 2) of plane r /
// 2, records 6 and 7 at bits 6-7 of planes 0 and 1 (low 2 bits) and bits 6
// and 7 of plane 2 (third bit); the scales and d where they were. (GGUF:
// element 128 n + 32 j + e at bits 2 j of qs[32 n + e], its third bit at bit
// (128 n + 32 j + e) / 32 of hmask[e].)
TEST(ColumnGroups, Q23RecordsHoldOneBlockPerLane) {
  for (bool three : {false, true}) {
    SCOPED_TRACE(three ? "q3_k" : "q2_k");
    uint8_t blk[sizeof(BlockQ3K)] = {};
    const int qs = three ? 32 : 16, tail = three ? 96 : 0, tail_n = three ? 14 : 16;
    auto code = [](int e) { return (5 * e + e / 7) % 8; };
    for (int e = 0; e < 256; ++e) {
      const int n = e / 128, j = e % 128 / 32, i = e % 32;
      blk[qs + 32 * n + i] |= static_cast<uint8_t>((code(e) & 3) << (2 * j));
      if (three) blk[i] |= static_cast<uint8_t>((code(e) >> 2) << (e / 32));
    }
    for (int i = 0; i < tail_n; ++i) blk[tail + i] = static_cast<uint8_t>(200 + i);
    if (!three) blk[80] = 11, blk[81] = 22, blk[82] = 33, blk[83] = 44;
    RepackColumnGroups(three ? DType::kQ3_K : DType::kQ2_K, blk, kQKK);
    for (int i = 0; i < tail_n; ++i) EXPECT_EQ(200 + i, blk[tail + i]);
    if (!three) {
      EXPECT_EQ(44, blk[83]);
    }
    for (int e = 0; e < 256; ++e) {
      const int l = e / 32, h = e % 32 / 16, t = e % 16 / 4, i = e % 4, r = 4 * h + t;
      const uint8_t* lane = blk + 4 * l + i;  // Q3_K: byte 4 l + i of plane 0
      if (!three) {
        EXPECT_EQ(code(e) & 3, (blk[qs + 32 * h + 4 * l + i] >> (2 * t)) & 3) << "e=" << e;
      } else if (r < 6) {
        EXPECT_EQ(code(e), (lane[32 * (r / 2)] >> (3 * (r % 2))) & 7) << "e=" << e;
      } else {
        EXPECT_EQ(code(e) & 3, lane[32 * (r - 6)] >> 6) << "e=" << e;
        EXPECT_EQ(code(e) >> 2, (lane[64] >> r) & 1) << "e=" << e;
      }
    }
  }
}

// Q6_K slices: element 16 l + 4 j + b's low 4 bits in byte 4 l + b of
// vector j % 2 (nibble j / 2), its top 2 bits at bits 2 j of byte 128 + 4 l
// + b; the scales and d where they were.
TEST(ColumnGroups, Q6SlicesHoldOneSubBlockPerLane) {
  uint8_t blk[sizeof(BlockQ6K)] = {};
  auto code = [](int e) { return (7 * e + 3) % 64; };
  for (int e = 0; e < 256; ++e) {        // GGUF: e = 128 h + i; ql[64 h + i % 64] nibble i / 64,
    const int h = e / 128, i = e % 128;  // qh[32 h + i % 32] bits 2 (i / 32)
    blk[64 * h + i % 64] |= static_cast<uint8_t>((code(e) & 15) << (4 * (i / 64)));
    blk[128 + 32 * h + i % 32] |= static_cast<uint8_t>((code(e) >> 4) << (2 * (i / 32)));
  }
  for (int i = 0; i < 18; ++i) blk[192 + i] = static_cast<uint8_t>(200 + i);
  RepackColumnGroups(DType::kQ6_K, blk, kQKK);
  for (int i = 0; i < 18; ++i) EXPECT_EQ(200 + i, blk[192 + i]);
  for (int e = 0; e < 256; ++e) {
    const int l = e / 16, j = e % 16 / 4, b = e % 4;
    EXPECT_EQ(code(e) & 15, (blk[64 * (j % 2) + 4 * l + b] >> (4 * (j / 2))) & 15) << "e=" << e;
    EXPECT_EQ(code(e) >> 4, (blk[128 + 4 * l + b] >> (2 * j)) & 3) << "e=" << e;
  }
}

// MLX runs (repack.h): dword 4 c + ... by the header's own formula, a
// known pattern: every byte names its source position; the bytes after the
// last whole run stay; a second call gives the file's bytes back.
TEST(MlxRuns, TransposeDwordsWithinHalvesAndUndoThemselves) {
  for (int64_t bytes : {0, 64, 128, 200, 384, 1152}) {
    std::vector<uint8_t> row(bytes);
    for (int64_t i = 0; i < bytes; ++i) row[i] = static_cast<uint8_t>(i * 7 + 3);
    const std::vector<uint8_t> file = row;
    TransposeMlxRuns(row.data(), bytes);
    for (int64_t u = 0; u + kMlxRunBytes <= bytes; u += kMlxRunBytes)
      for (int k = 0; k < 4; ++k)
        for (int h = 0; h < 2; ++h)
          for (int c = 0; c < 4; ++c)
            for (int b = 0; b < 4; ++b)
              ASSERT_EQ(row[u + 32 * c + 16 * h + 4 * k + b], file[u + 32 * k + 16 * h + 4 * c + b])
                  << "bytes " << bytes << " run at " << u << " k " << k << " h " << h << " c " << c;
    for (int64_t i = bytes / kMlxRunBytes * kMlxRunBytes; i < bytes; ++i)
      EXPECT_EQ(row[i], file[i]);
    if (bytes >= kMlxRunBytes) {
      EXPECT_NE(row, file);
    }
    TransposeMlxRuns(row.data(), bytes);
    EXPECT_EQ(row, file) << bytes;
  }
}

// MLX groups (repack.h): dword D l + c to 16 c + l (D = bits) by the
// header's own formula, a known pattern: every byte names its source
// position; the bytes after the last whole group stay; UntransposeMlxGroups
// gives the file back.
TEST(MlxGroups, TransposeDwordsSixteenByBitsAndUndo) {
  for (int bits : {4, 8})
    for (int64_t bytes : {0, 128, 256, 320, 512, 1152, 1536}) {
      const int64_t size = MlxGroupBytes(bits);
      std::vector<uint8_t> row(bytes);
      for (int64_t i = 0; i < bytes; ++i) row[i] = static_cast<uint8_t>(i * 7 + 3);
      const std::vector<uint8_t> file = row;
      TransposeMlxGroups(row.data(), bytes, bits);
      for (int64_t u = 0; u + size <= bytes; u += size)
        for (int l = 0; l < 16; ++l)
          for (int c = 0; c < bits; ++c)
            for (int b = 0; b < 4; ++b)
              ASSERT_EQ(row[u + 4 * (16 * c + l) + b], file[u + 4 * (bits * l + c) + b])
                  << bits << "-bit, bytes " << bytes << " group at " << u << " l " << l << " c "
                  << c;
      for (int64_t i = bytes / size * size; i < bytes; ++i) EXPECT_EQ(row[i], file[i]);
      if (bytes >= size) {
        EXPECT_NE(row, file);
      }
      UntransposeMlxGroups(row.data(), bytes, bits);
      EXPECT_EQ(row, file) << bits << "-bit, " << bytes;
    }
}

}  // namespace
}  // namespace lumen
