#include "lumen/core/repack.h"

#include <algorithm>
#include <cstring>

#include "lumen/core/check.h"
#include "lumen/core/quant.h"

namespace lumen {

void RepackQ4_0Cols(uint8_t* row, int64_t K) {
  LUMEN_CHECK(K % kQK == 0);
  uint8_t blocks[kQ4_0ColsGroupBytes];
  for (int64_t g = 0; g < K / kQ4_0ColsElems; ++g) {
    uint8_t* p = row + g * kQ4_0ColsGroupBytes;
    std::memcpy(blocks, p, sizeof(blocks));
    uint8_t* codes = p + Q4_0ColsCodesAt(p);
    uint8_t* scales = p + Q4_0ColsScalesAt(p);
    for (int64_t l = 0; l < kQ4_0ColsBlocks; ++l) {
      const uint8_t* blk = blocks + l * sizeof(BlockQ4_0);
      std::memcpy(scales + 2 * l, blk, 2);
      for (int c = 0; c < 4; ++c) std::memcpy(codes + 64 * c + 4 * l, blk + 2 + 4 * c, 4);
    }
  }
}

void UnpackQ4_0ColsGroup(const uint8_t* g, uint8_t* blocks) {
  const uint8_t* codes = g + Q4_0ColsCodesAt(g);
  const uint8_t* scales = g + Q4_0ColsScalesAt(g);
  for (int64_t l = 0; l < kQ4_0ColsBlocks; ++l) {
    uint8_t* blk = blocks + l * sizeof(BlockQ4_0);
    std::memcpy(blk, scales + 2 * l, 2);
    for (int c = 0; c < 4; ++c) std::memcpy(blk + 2 + 4 * c, codes + 64 * c + 4 * l, 4);
  }
}

void DequantizeQ4_0ColsRange(const uint8_t* row, int64_t K, int64_t k0, int64_t k1, float* dst) {
  LUMEN_CHECK(K % kQK == 0 && k0 % kQK == 0 && 0 <= k0 && k0 <= k1 && k1 <= K &&
              (k1 % kQK == 0 || k1 == K));
  const int64_t end = K / kQ4_0ColsElems * kQ4_0ColsElems;  // where the Q4_0 blocks start
  uint8_t blocks[kQ4_0ColsGroupBytes];
  int64_t i = k0;
  while (i < std::min(k1, end)) {
    const int64_t g = i / kQ4_0ColsElems * kQ4_0ColsElems;
    const int64_t e = std::min(k1, g + kQ4_0ColsElems);
    UnpackQ4_0ColsGroup(row + g / kQK * sizeof(BlockQ4_0), blocks);
    DequantizeRow(DType::kQ4_0, blocks + (i - g) / kQK * sizeof(BlockQ4_0), dst + (i - k0), e - i);
    i = e;
  }
  if (i < k1)
    DequantizeRow(DType::kQ4_0, row + i / kQK * sizeof(BlockQ4_0), dst + (i - k0), k1 - i);
}

void DequantizeQ4_0Cols(const uint8_t* src, float* dst, int64_t n) {
  DequantizeQ4_0ColsRange(src, n, 0, n, dst);
}

}  // namespace lumen
