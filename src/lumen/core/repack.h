// Q4_0 rows repacked at load for the int8 decode kernels (DType::kQ4_0Cols).
//
// A row keeps its Q4_0 size (18 bytes per 32 elements). Its first
// nb / 16 * 16 blocks become groups of 16 blocks (512 elements, 288 bytes);
// the blocks after the last group stay Q4_0, at the same offsets as before.
// A group holds the 16 blocks' f16 scales (32 bytes, block l at 2 l) and
// their codes as four 64-byte columns: byte 4 l + i of column c is byte
// 4 c + i of block l's qs (low nibble: element 4 c + i, high: 16 + 4 c + i).
// So each 32-bit lane of a column holds one block, and the int8 kernel pays
// its per-lane work once per 512 weights with no shuffles
// (kernels/matmul_q8.cc). The codes come first unless the group starts 32
// bytes past a 64-byte line, where the scales come first: in rows on 32-byte
// boundaries (GGUF's default alignment) the columns are whole cache lines.
// The layout depends on the address, so repacked bytes are only valid where
// they were repacked: they are never copied or written to a file.
#pragma once

#include <cstdint>

namespace lumen {

inline constexpr int64_t kQ4_0ColsBlocks = 16;       // blocks per group
inline constexpr int64_t kQ4_0ColsElems = 16 * 32;   // elements per group
inline constexpr int64_t kQ4_0ColsGroupBytes = 288;  // 16 x 18

// Offset of the codes (0 or 32) and of the scales (256 or 0) in the group at g.
inline int64_t Q4_0ColsCodesAt(const void* g) {
  return (reinterpret_cast<uintptr_t>(g) & 63) == 32 ? 32 : 0;
}
inline int64_t Q4_0ColsScalesAt(const void* g) { return Q4_0ColsCodesAt(g) == 32 ? 0 : 256; }

// A Q4_0 row of K elements (K % 32 == 0) rewritten in place as kQ4_0Cols.
void RepackQ4_0Cols(uint8_t* row, int64_t K);

// The 16 Q4_0 blocks (288 bytes) of the group at g.
void UnpackQ4_0ColsGroup(const uint8_t* g, uint8_t* blocks);

// dst[0..k1 - k0) = elements [k0, k1) of the kQ4_0Cols row of K elements at
// row (k0 a multiple of 32; k1 too, or K): the values DequantizeRow(kQ4_0,
// ...) gives for the row before it was repacked, bit for bit.
void DequantizeQ4_0ColsRange(const uint8_t* row, int64_t K, int64_t k0, int64_t k1, float* dst);
// The whole row of n elements at src (DequantizeRow(kQ4_0Cols, ...)).
void DequantizeQ4_0Cols(const uint8_t* src, float* dst, int64_t n);

}  // namespace lumen
