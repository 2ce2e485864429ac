// The 4- and 5-bit formats, Q8_0, Q6_K, Q2_K and Q3_K repacked at load for
// the int8 decode kernels (DType::kQ4_0Cols .. kQ5_1Cols, kQ4_KCols,
// kQ5_KCols, kQ8_0Cols, kQ6_KCols, kQ2_KCols, kQ3_KCols, kQ5_KPlanes:
// "column groups").
//
// A row keeps its size. Its first K / 512 * 512 elements become groups of
// 512 (16 legacy blocks, or two K-quant super-blocks: 16 sub-blocks of 32);
// what follows the last group (legacy blocks, one super-block) stays in the
// plain format, at the same offsets as before. A group holds the fields of
// its 16 blocks (sub-blocks) as arrays:
//   codes  4 columns of 64 bytes: byte 4 l + i of column c holds the codes of
//          elements 4 c + i (low nibble) and 16 + 4 c + i (high nibble) of
//          block l (for a legacy block: byte 4 c + i of its qs); Q8_0: 8
//          columns, byte 4 l + i of column c the code of element 4 c + i of
//          block l plus 128 (as an unsigned byte: the sign bit flipped);
//   high   (Q5_*) 8 little-endian 64-bit masks: bit 4 l + i of mask w is the
//          5th bit of element 4 w + i of block l (masks 0-3 the low nibbles'
//          elements of columns 0-3, masks 4-7 the high nibbles'); in
//          kQ5_KPlanes (Q5_K where the AVX2 kernels run) the same bits as
//          planes: bit w of byte 4 l + i is bit 4 l + i of mask w, so the
//          AVX2 kernel's record w of a half group is a shift and a mask of
//          one 32-byte load (from the masks: five instructions per record);
//   legacy: d, m  16 f16 each (m: Q4_1, Q5_1), block l at 2 l;
//   K-quants: meta, 32 bytes: the 12 scale bytes of super-block 0, those of
//          super-block 1, then d0, dmin0, d1, dmin1 (f16): sub-block l is
//          sub-block l % 8 of super-block l / 8.
// Each 32-bit lane of a column holds one block, so the int8 kernel pays its
// per-lane work once per 512 weights with no shuffles (and for Q8_0 no sign
// flips), and the masks feed its masked adds as they are
// (kernels/matmul_q8_gguf.cc). Order: codes, high, then d, m (meta); but d (meta)
// first where the group starts 32 bytes past a 64-byte line, so that in rows
// on 32-byte boundaries (GGUF's default alignment) the codes and masks are
// whole cache lines. The layout depends on the address: repacked bytes are
// only valid where they were repacked, and are never copied or written to a
// file.
//
// Q6_K is repacked one super-block at a time, in place and whatever the
// address (every super-block of the row, 210 bytes each as before): the
// 6-bit code of element 16 l + 4 j + b (16-element slice l = the sub-block,
// column j, byte b) has its low 4 bits in byte 4 l + b of vector j % 2
// (bytes 0-63, 64-127), in the low nibble for j < 2 and the high nibble
// after, and its top 2 bits at bits 2 j of byte 128 + 4 l + b; the scales
// and d stay at 192 and 208. The int8 kernel's four columns (lane l = slice
// l) are then a mask or a shift and a mask of three loads, where the file's
// order needs eight dword permutes and eight variable shifts.
//
// Q2_K and Q3_K are repacked the same way, a super-block at a time
// ("records"): byte 4 l + i of qs half h (the
// 32 bytes at qs + 32 h) holds at bits 2 t the 2-bit code of element 16 h +
// 4 t + i of 32-element block l; the scales and d stay. The AVX2 kernel's
// records (lane l = block l, record r = 4 h + t = elements 4 r .. 4 r + 3 of
// each block) are then a shift and a mask of one load, where the file's order
// needs a 4 x 4 dword transpose per record quad. The VNNI kernel reads the
// 64 bytes as four 16-lane columns (column t = bits 2 t: lane 8 h + l holds
// 16-element sub-block 2 l + h; kernels/q23_columns_avx512.h), a shift and a
// mask each, where the file's order needs a dword permute more per column.
// Q3_K's codes (hmask and qs,
// bytes 0-95) become three planes of 32 bytes instead: lane byte 4 l + i of
// plane k (at 32 k) holds the 3-bit codes (low 2 bits | third bit << 2) of
// records 2 k and 2 k + 1 at bits 0-2 and 3-5, and bits 6-7 of planes 0 and 1
// the low 2 bits of records 6 and 7, bits 6 and 7 of plane 2 their third
// bits: six of the eight records are a mask or a shift and a mask (from a 2-bit
// field and an hmask bit: five instructions each).
#pragma once

#include <cstdint>

#include "lumen/core/dtype.h"

namespace lumen {

inline constexpr int64_t kColsBlocks = 16;      // blocks (sub-blocks) per group
inline constexpr int64_t kColsElems = 16 * 32;  // elements per group

// Whether `plain` has a column-group form (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
// Q5_K, Q8_0, Q6_K, Q2_K, Q3_K), and it: kQ4_0 -> kQ4_0Cols ... kQ3_K ->
// kQ3_KCols; any other type maps to itself.
bool HasColumnGroups(DType plain);
DType ColumnGroupsOf(DType plain);
// The plain format of a column-group type, else t itself.
DType PlainOf(DType t);
inline bool IsColumnGroups(DType t) { return PlainOf(t) != t; }

// Byte offsets of a group's fields (-1: the format has none). K-quants:
// scales is the meta field, d its d0, dmin0, d1, dmin1.
struct ColsFields {
  int64_t codes, high, d, m, scales;
};
// Inline: the kernels take it per group, and a call there would spill
// every vector register (all are caller-saved).
inline ColsFields ColsFieldsAt(DType plain, const void* group) {
  const bool d_first = (reinterpret_cast<uintptr_t>(group) & 63) == 32;
  const bool super = plain == DType::kQ4_K || plain == DType::kQ5_K;
  const bool high = plain == DType::kQ5_0 || plain == DType::kQ5_1 || plain == DType::kQ5_K;
  const bool min = plain == DType::kQ4_1 || plain == DType::kQ5_1;
  const int64_t h = high ? 64 : 0, codes = plain == DType::kQ8_0 ? 512 : 256;
  ColsFields f;
  f.codes = d_first ? 32 : 0;
  f.high = high ? f.codes + 256 : -1;
  f.d = d_first ? 0 : codes + h;
  f.m = min ? 288 + h : -1;
  f.scales = -1;
  if (super) {  // the meta field where a legacy group has d
    f.scales = f.d;
    f.d += 24;
  }
  return f;
}

// In the three functions below t names the column-group type (kQ5_KPlanes
// or ColumnGroupsOf(plain)); a plain type names its ColumnGroupsOf form.

// A row of K elements (a whole number of blocks) of PlainOf(t) rewritten in
// place as t.
void RepackColumnGroups(DType t, uint8_t* row, int64_t K);

// The plain blocks of the group at g (16 legacy blocks, 2 super-blocks;
// Q6_K, Q2_K, Q3_K: 2 super-blocks, each repacked alone).
void UnpackColumnGroup(DType t, const uint8_t* g, uint8_t* blocks);

// The plain bytes of a whole column-group row of K elements at row (the
// bytes the file had before RepackColumnGroups), into dst (the same size).
void UnpackColumnGroupsRow(DType t, const uint8_t* row, int64_t K, uint8_t* dst);

// Q6_K: the super-block at src in the layout above, into dst (210 bytes
// each; src == dst allowed), and back.
void RepackQ6Slices(const uint8_t* src, uint8_t* dst);
void UnpackQ6Slices(const uint8_t* src, uint8_t* dst);

// Q2_K (three = false, 84 bytes) or Q3_K (110 bytes): the super-block at src
// in the records layout above, into dst (src == dst allowed), and back.
void RepackQ23Records(bool three, const uint8_t* src, uint8_t* dst);
void UnpackQ23Records(bool three, const uint8_t* src, uint8_t* dst);

// dst[0..k1 - k0) = elements [k0, k1) of the column-group row of K elements
// at row (k0 a multiple of the plain block; k1 too, or K): the values
// DequantizeRow(PlainOf(t), ...) gives for the row before it was repacked,
// bit for bit.
void DequantizeColumnGroups(DType t, const uint8_t* row, int64_t K, int64_t k0, int64_t k1,
                            float* dst);

// MLX 4- and 8-bit rows for the AVX2 int8 kernels ("runs",
// kernels::MlxOrder::kRuns; made at load only where those kernels run).
// Each whole kMlxRunBytes of a row's codes (a run: 8 blocks of 32 4-bit codes,
// or 4 of 32 8-bit ones) has its 32 dwords transposed within 16-byte halves:
// the dword at byte 32 k + 16 h + 4 c moves to 32 c + 16 h + 4 k (k, c < 4,
// h < 2), which is what the kernels' 4 x 4 in-register transpose of the run's
// four 32-byte loads gave; the bytes after the last whole run stay. The
// transform is its own inverse: the same call gives the file's bytes back.
inline constexpr int64_t kMlxRunBytes = 128;
void TransposeMlxRuns(uint8_t* codes, int64_t bytes);

// MLX 4- and 8-bit rows for the AVX-512 VNNI int8 kernels ("groups",
// kernels::MlxOrder::kGroups; made at load only where those kernels run).
// Each whole MlxGroupBytes(bits) of a row's codes (512 codes: 16 blocks of
// 32, D = bits dwords each) has its dwords transposed 16 x D: the dword at
// D l + c (block l's c-th) moves to 16 c + l, so dword c of all 16 blocks is
// one 64-byte vector, which the kernels otherwise gathered (4-bit: two
// vpermt2d and a blend per vector; 8-bit: a vpermt2d per vector); the bytes
// after the last whole group stay. UntransposeMlxGroups gives the file's
// bytes back.
constexpr int64_t MlxGroupBytes(int bits) { return 64 * bits; }
void TransposeMlxGroups(uint8_t* codes, int64_t bytes, int bits);
void UntransposeMlxGroups(uint8_t* codes, int64_t bytes, int bits);

}  // namespace lumen
