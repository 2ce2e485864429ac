// Column groups (repack.h): repacking in place keeps every value of Q4_0,
// Q4_1, Q5_0 and Q5_1 rows at any row address, for whole rows and any
// block-aligned range; the codes and masks of rows on 32-byte boundaries are
// whole cache lines; the fields sit where the header says.
#include "lumen/core/repack.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "lumen/core/quant.h"

namespace lumen {
namespace {

constexpr DType kPlain[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1};

TEST(ColumnGroups, KeepEveryValueAtEveryAddress) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (DType t : kPlain) {
    EXPECT_EQ(t, PlainOf(ColumnGroupsOf(t)));
    EXPECT_TRUE(IsColumnGroups(ColumnGroupsOf(t)));
    const int64_t bb = Info(t).block_bytes, gb = kColsBlocks * bb;
    // No group, one, one with quads after it, several with a pair and a half.
    for (int64_t K : {96, 512, 544, 1248, 2048, 4160}) {
      std::vector<float> x(K), want(K), got(K);
      for (float& v : x) v = nd(rng);
      const int64_t rb = K / kQK * bb;
      std::vector<uint8_t> plain(rb);
      QuantizeRow(t, x.data(), plain.data(), K);
      DequantizeRow(t, plain.data(), want.data(), K);
      std::vector<uint8_t> buf(rb + 128);
      const auto mis = static_cast<int64_t>(reinterpret_cast<uintptr_t>(buf.data()) % 64);
      for (int off = 0; off < 64; ++off) {
        SCOPED_TRACE(testing::Message() << Name(t) << " K=" << K << " offset " << off);
        uint8_t* row = buf.data() + (64 - mis) % 64 + off;
        std::memcpy(row, plain.data(), rb);
        RepackColumnGroups(t, row, K);
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
          UnpackColumnGroup(t, p, blocks.data());
          EXPECT_EQ(0, std::memcmp(blocks.data(), plain.data() + g * gb, gb)) << "g=" << g;
        }
        DequantizeRow(ColumnGroupsOf(t), row, got.data(), K);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), K * 4));
        for (int i = 0; i < 8; ++i) {
          int64_t k0 = rng() % (K / kQK + 1) * kQK, k1 = rng() % (K / kQK + 1) * kQK;
          if (k0 > k1) std::swap(k0, k1);
          std::vector<float> part(k1 - k0 + 1, -1.0f);
          DequantizeColumnGroups(t, row, K, k0, k1, part.data());
          EXPECT_EQ(0, std::memcmp(want.data() + k0, part.data(), (k1 - k0) * 4))
              << "[" << k0 << ", " << k1 << ")";
          EXPECT_EQ(-1.0f, part[k1 - k0]);
        }
      }
    }
  }
}

// Byte 4 l + i of column c is byte 4 c + i of block l's codes; bit 4 l + i
// of mask w the 5th bit of element 4 w + i; d (and m) after the columns and
// masks, or d first 32 bytes past a line.
TEST(ColumnGroups, FieldsHoldOneBlockPerLane) {
  alignas(64) uint8_t buf[64 + 16 * sizeof(BlockQ5_1)];
  for (DType t : kPlain)
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

}  // namespace
}  // namespace lumen
