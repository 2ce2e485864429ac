// The legacy 32-element formats repacked at load for the int8 decode kernels
// (DType::kQ4_0Cols, kQ4_1Cols, kQ5_0Cols, kQ5_1Cols: "column groups").
//
// A row keeps its size. Its first nb / 16 * 16 blocks become groups of 16
// blocks (512 elements, 16 block sizes: 288, 320, 352 or 384 bytes); the
// blocks after the last group stay in the plain format, at the same offsets
// as before. A group holds its 16 blocks' fields as arrays:
//   codes  4 columns of 64 bytes: byte 4 l + i of column c is byte 4 c + i of
//          block l's qs (low nibble: element 4 c + i, high: 16 + 4 c + i);
//   high   (Q5_*) 8 little-endian 64-bit masks: bit 4 l + i of mask w is the
//          5th bit of element 4 w + i of block l (masks 0-3 the low nibbles'
//          elements of columns 0-3, masks 4-7 the high nibbles');
//   d, m   16 f16 each (m: Q4_1, Q5_1), block l at 2 l.
// Each 32-bit lane of a column holds one block, so the int8 kernel pays its
// per-lane work once per 512 weights with no shuffles, and the masks feed
// its masked adds as they are (kernels/matmul_q8.cc). Order: codes, high,
// d, m; but d first where the group starts 32 bytes past a 64-byte line, so
// that in rows on 32-byte boundaries (GGUF's default alignment) the codes
// and masks are whole cache lines. The layout depends on the address:
// repacked bytes are only valid where they were repacked, and are never
// copied or written to a file.
#pragma once

#include <cstdint>

#include "lumen/core/dtype.h"

namespace lumen {

inline constexpr int64_t kColsBlocks = 16;      // blocks per group
inline constexpr int64_t kColsElems = 16 * 32;  // elements per group

// Whether `plain` has a column-group form (Q4_0, Q4_1, Q5_0, Q5_1), and it:
// kQ4_0 -> kQ4_0Cols ... kQ5_1 -> kQ5_1Cols; any other type maps to itself.
bool HasColumnGroups(DType plain);
DType ColumnGroupsOf(DType plain);
// The plain format of a column-group type, else t itself.
DType PlainOf(DType t);
inline bool IsColumnGroups(DType t) { return PlainOf(t) != t; }

// Byte offsets of a group's fields (-1: the format has none).
struct ColsFields {
  int64_t codes, high, d, m;
};
ColsFields ColsFieldsAt(DType plain, const void* group);

// A row of K elements (K % 32 == 0) of `plain` rewritten in place as its
// column groups.
void RepackColumnGroups(DType plain, uint8_t* row, int64_t K);

// The 16 plain blocks of the group at g.
void UnpackColumnGroup(DType plain, const uint8_t* g, uint8_t* blocks);

// dst[0..k1 - k0) = elements [k0, k1) of the column-group row of K elements
// at row (k0 a multiple of 32; k1 too, or K): the values DequantizeRow(plain,
// ...) gives for the row before it was repacked, bit for bit.
void DequantizeColumnGroups(DType plain, const uint8_t* row, int64_t K, int64_t k0, int64_t k1,
                            float* dst);

}  // namespace lumen
