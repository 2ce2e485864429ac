#include "lumen/core/repack.h"

#include <algorithm>
#include <cstring>

#include "lumen/core/check.h"
#include "lumen/core/quant.h"

namespace lumen {
namespace {

// Where a plain block's fields are (-1: none), and its size.
struct Plain {
  int64_t bytes, qs, qh, m;
};
Plain PlainFields(DType t) {
  switch (t) {
    case DType::kQ4_0:
      return {sizeof(BlockQ4_0), 2, -1, -1};
    case DType::kQ4_1:
      return {sizeof(BlockQ4_1), 4, -1, 2};
    case DType::kQ5_0:
      return {sizeof(BlockQ5_0), 6, 2, -1};
    case DType::kQ5_1:
      return {sizeof(BlockQ5_1), 8, 4, 2};
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

}  // namespace

bool HasColumnGroups(DType t) {
  return t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ5_0 || t == DType::kQ5_1;
}

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
    default:
      return t;
  }
}

ColsFields ColsFieldsAt(DType plain, const void* group) {
  const Plain p = PlainFields(plain);
  const bool d_first = (reinterpret_cast<uintptr_t>(group) & 63) == 32;
  const int64_t high = p.qh >= 0 ? 64 : 0;
  ColsFields f;
  f.codes = d_first ? 32 : 0;
  f.high = high ? f.codes + 256 : -1;
  f.d = d_first ? 0 : 256 + high;
  f.m = p.m >= 0 ? 288 + high : -1;
  return f;
}

void RepackColumnGroups(DType plain, uint8_t* row, int64_t K) {
  LUMEN_CHECK(K % kQK == 0);
  const Plain p = PlainFields(plain);
  uint8_t blocks[kColsBlocks * sizeof(BlockQ5_1)];
  for (int64_t g = 0; g < K / kColsElems; ++g) {
    uint8_t* grp = row + g * kColsBlocks * p.bytes;
    std::memcpy(blocks, grp, kColsBlocks * p.bytes);
    const ColsFields f = ColsFieldsAt(plain, grp);
    uint64_t masks[8] = {};
    for (int64_t l = 0; l < kColsBlocks; ++l) {
      const uint8_t* blk = blocks + l * p.bytes;
      std::memcpy(grp + f.d + 2 * l, blk, 2);
      if (f.m >= 0) std::memcpy(grp + f.m + 2 * l, blk + p.m, 2);
      for (int c = 0; c < 4; ++c)
        std::memcpy(grp + f.codes + 64 * c + 4 * l, blk + p.qs + 4 * c, 4);
      if (p.qh < 0) continue;
      uint32_t h;
      std::memcpy(&h, blk + p.qh, 4);
      for (int j = 0; j < kQK; ++j) masks[j / 4] |= uint64_t{(h >> j) & 1} << (4 * l + j % 4);
    }
    if (f.high >= 0) std::memcpy(grp + f.high, masks, sizeof(masks));
  }
}

void UnpackColumnGroup(DType plain, const uint8_t* g, uint8_t* blocks) {
  const Plain p = PlainFields(plain);
  const ColsFields f = ColsFieldsAt(plain, g);
  for (int64_t l = 0; l < kColsBlocks; ++l) {
    uint8_t* blk = blocks + l * p.bytes;
    std::memcpy(blk, g + f.d + 2 * l, 2);
    if (f.m >= 0) std::memcpy(blk + p.m, g + f.m + 2 * l, 2);
    for (int c = 0; c < 4; ++c) std::memcpy(blk + p.qs + 4 * c, g + f.codes + 64 * c + 4 * l, 4);
    if (p.qh < 0) continue;
    uint32_t h = 0;
    for (int j = 0; j < kQK; ++j)
      h |= static_cast<uint32_t>((LoadU64(g + f.high + 8 * (j / 4)) >> (4 * l + j % 4)) & 1) << j;
    std::memcpy(blk + p.qh, &h, 4);
  }
}

void DequantizeColumnGroups(DType plain, const uint8_t* row, int64_t K, int64_t k0, int64_t k1,
                            float* dst) {
  LUMEN_CHECK(K % kQK == 0 && k0 % kQK == 0 && 0 <= k0 && k0 <= k1 && k1 <= K &&
              (k1 % kQK == 0 || k1 == K));
  const int64_t bb = PlainFields(plain).bytes;
  const int64_t end = K / kColsElems * kColsElems;  // where the plain blocks start
  uint8_t blocks[kColsBlocks * sizeof(BlockQ5_1)];
  int64_t i = k0;
  while (i < std::min(k1, end)) {
    const int64_t g = i / kColsElems * kColsElems;
    const int64_t e = std::min(k1, g + kColsElems);
    UnpackColumnGroup(plain, row + g / kQK * bb, blocks);
    DequantizeRow(plain, blocks + (i - g) / kQK * bb, dst + (i - k0), e - i);
    i = e;
  }
  if (i < k1) DequantizeRow(plain, row + i / kQK * bb, dst + (i - k0), k1 - i);
}

}  // namespace lumen
