// Q4_0 column groups (repack.h): repacking in place keeps every value, at
// any row address, for whole rows and any block-aligned range; the columns
// of rows on 32-byte boundaries are whole cache lines.
#include "lumen/core/repack.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "lumen/core/quant.h"

namespace lumen {
namespace {

TEST(RepackQ4_0Cols, KeepsEveryValueAtEveryAddress) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // No group, one, one with quads after it, several with a pair and a half.
  for (int64_t K : {96, 512, 544, 1248, 2048, 4160}) {
    std::vector<float> x(K), want(K), got(K);
    for (float& v : x) v = nd(rng);
    const int64_t rb = K / kQK * sizeof(BlockQ4_0);
    std::vector<uint8_t> q4(rb);
    QuantizeRow(DType::kQ4_0, x.data(), q4.data(), K);
    DequantizeRow(DType::kQ4_0, q4.data(), want.data(), K);
    std::vector<uint8_t> buf(rb + 128);
    const auto mis = static_cast<int64_t>(reinterpret_cast<uintptr_t>(buf.data()) % 64);
    for (int off = 0; off < 64; ++off) {
      uint8_t* row = buf.data() + (64 - mis) % 64 + off;
      std::memcpy(row, q4.data(), rb);
      RepackQ4_0Cols(row, K);
      const int64_t groups = K / kQ4_0ColsElems;
      if (groups > 0) {
        EXPECT_NE(0, std::memcmp(row, q4.data(), 288)) << "K=" << K << " offset " << off;
      }
      // The blocks after the groups are untouched.
      EXPECT_EQ(0, std::memcmp(row + groups * 288, q4.data() + groups * 288, rb - groups * 288));
      for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* p = row + g * kQ4_0ColsGroupBytes;
        if (off % 32 == 0) {  // 32-byte aligned rows: the columns are whole lines
          EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(p + Q4_0ColsCodesAt(p)) % 64);
        }
        uint8_t blocks[kQ4_0ColsGroupBytes];
        UnpackQ4_0ColsGroup(p, blocks);
        EXPECT_EQ(0, std::memcmp(blocks, q4.data() + g * 288, 288)) << "K=" << K << " g=" << g;
      }
      DequantizeRow(DType::kQ4_0Cols, row, got.data(), K);
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), K * 4)) << "K=" << K << " offset " << off;
      for (int t = 0; t < 8; ++t) {
        int64_t k0 = rng() % (K / kQK + 1) * kQK, k1 = rng() % (K / kQK + 1) * kQK;
        if (k0 > k1) std::swap(k0, k1);
        std::vector<float> part(k1 - k0 + 1, -1.0f);
        DequantizeQ4_0ColsRange(row, K, k0, k1, part.data());
        EXPECT_EQ(0, std::memcmp(want.data() + k0, part.data(), (k1 - k0) * 4))
            << "K=" << K << " [" << k0 << ", " << k1 << ")";
        EXPECT_EQ(-1.0f, part[k1 - k0]);
      }
    }
  }
}

// Byte 4 l + i of column c is byte 4 c + i of block l's codes; the scales sit
// after the columns, or before them 32 bytes past a line.
TEST(RepackQ4_0Cols, ColumnsHoldOneBlockPerLane) {
  alignas(64) uint8_t buf[64 + 2 * kQ4_0ColsGroupBytes];
  for (int off : {0, 32}) {
    uint8_t* row = buf + off;
    for (int64_t l = 0; l < 16; ++l) {
      uint8_t* blk = row + l * sizeof(BlockQ4_0);
      blk[0] = static_cast<uint8_t>(l);
      blk[1] = 0x3C;
      for (int j = 0; j < 16; ++j) blk[2 + j] = static_cast<uint8_t>(16 * l + j);
    }
    RepackQ4_0Cols(row, kQ4_0ColsElems);
    const int64_t codes = off == 32 ? 32 : 0, scales = off == 32 ? 0 : 256;
    EXPECT_EQ(codes, Q4_0ColsCodesAt(row));
    for (int64_t l = 0; l < 16; ++l) {
      EXPECT_EQ(l, row[scales + 2 * l]);
      EXPECT_EQ(0x3C, row[scales + 2 * l + 1]);
      for (int c = 0; c < 4; ++c)
        for (int i = 0; i < 4; ++i)
          EXPECT_EQ(16 * l + 4 * c + i, row[codes + 64 * c + 4 * l + i]) << l << " " << c;
    }
  }
}

}  // namespace
}  // namespace lumen
