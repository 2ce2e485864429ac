// Quantized block layouts (GGUF Q4_0 ... Q6_K, Q8_K) and MLX affine groups:
// scalar reference dequantize and quantize, one row at a time.
//
// These are the in-tree oracle for every fast kernel that reads quantized
// weights. Layouts follow ggml's block structs byte for byte; each has a
// static_assert on its size. `n` is the element count of the row and must be a
// whole number of blocks (CHECKed: callers validate shapes when loading).
#pragma once

#include <cstddef>
#include <cstdint>

#include "lumen/core/dtype.h"

namespace lumen {

// ---------------------------------------------------------------------------
// Block layouts, byte for byte as ggml's block_* structs. Half-precision
// fields are raw IEEE fp16 bits (half.h converts). Data in a file may sit at
// any byte offset, so read blocks through memcpy, not by casting pointers.

inline constexpr int kQK = 32;    // elements per block of the legacy types
inline constexpr int kQKK = 256;  // elements per K-quant super-block

struct BlockQ4_0 {      // w = d * (q - 8), q in 0..15
  uint16_t d;           // f16
  uint8_t qs[kQK / 2];  // element j in low nibble of qs[j], j+16 in high nibble
};
struct BlockQ4_1 {  // w = d * q + m
  uint16_t d, m;    // f16
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {  // w = d * (q - 16), q in 0..31
  uint16_t d;
  uint8_t qh[4];  // bit j (little-endian u32) = 5th bit of element j
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {  // w = d * q + m
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {  // w = d * q
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ8_1 {  // w = d * q; s = d * sum(q) (used by dot products)
  uint16_t d, s;
  int8_t qs[kQK];
};
// K-quants: a 256-element super-block with per-sub-block scales.
struct BlockQ2K {  // 16 sub-blocks of 16: w = d*(sc&15)*q - dmin*(sc>>4), q in 0..3
  uint8_t scales[kQKK / 16];
  uint8_t qs[kQKK / 4];  // element n*128 + 32*j + l: (qs[n*32 + l] >> 2j) & 3
  uint16_t d, dmin;
};
struct BlockQ3K {           // 16 sub-blocks of 16: w = d*(sc-32)*(q-4), q in 0..7
  uint8_t hmask[kQKK / 8];  // element i: bit i/32 of hmask[i%32] = 3rd bit of q
  uint8_t qs[kQKK / 4];     // low 2 bits, packed as in Q2_K
  uint8_t scales[12];       // 16 6-bit scales, see Q3KScale
  uint16_t d;
};
struct BlockQ4K {  // 8 sub-blocks of 32: w = d*sc*q - dmin*m, q in 0..15
  uint16_t d, dmin;
  uint8_t scales[12];    // 8 6-bit scales and 8 6-bit mins, see GetScaleMinK4
  uint8_t qs[kQKK / 2];  // element 64*k + l: low nibble of qs[32k+l]; 64k+32+l: high
};
struct BlockQ5K {  // as Q4_K with a 5th bit: q in 0..31
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[kQKK / 8];  // element i: bit i/32 of qh[i%32]
  uint8_t qs[kQKK / 2];
};
struct BlockQ6K {        // 16 sub-blocks of 16: w = d*sc*(q-32), q in 0..63
  uint8_t ql[kQKK / 2];  // low 4 bits
  uint8_t qh[kQKK / 4];  // high 2 bits
  int8_t scales[kQKK / 16];
  uint16_t d;
};
struct BlockQ8K {  // w = d * q; bsums = sums of 16 consecutive q
  float d;
  int8_t qs[kQKK];
  int16_t bsums[kQKK / 16];
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2K) == 84);
static_assert(sizeof(BlockQ3K) == 110);
static_assert(sizeof(BlockQ4K) == 144);
static_assert(sizeof(BlockQ5K) == 176);
static_assert(sizeof(BlockQ6K) == 210);
static_assert(sizeof(BlockQ8K) == 292);

// Q4_K/Q5_K: scale and min j (0..7), 6 bits each, packed into 12 bytes: j < 4
// in the low 6 bits of bytes j and j+4; j >= 4 in the nibbles of byte j+4 with
// their top 2 bits in the spare top bits of bytes j-4 and j.
inline void GetScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q3_K: 6-bit scale j (0..15, returned as 0..63; the weight uses it minus 32).
// Low 4 bits: nibble j/8 of byte j%8; high 2 bits: bits 2*(j/4) of byte 8+j%4.
inline int Q3KScale(const uint8_t* scales, int j) {
  const int lo = j < 8 ? (scales[j] & 0xF) : (scales[j - 8] >> 4);
  const int hi = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return lo | (hi << 4);
}

// True for the types QuantizeRow can write.
bool CanQuantize(DType t);

// dst[0..n) = dequantized src row. Works for every DType (plain types convert).
void DequantizeRow(DType t, const void* src, float* dst, int64_t n);

// Quantizes src[0..n) into dst (RowBytes(t, n) bytes). Supported for every
// quantized type the reader supports plus F32/F16/BF16 (CanQuantize). Deterministic.
// Legacy types follow ggml's reference quantizers (amax / min-max based);
// K-quants fit each sub-block's scale (and min) by least squares over a few
// candidate scales, then quantize the sub-block scales to 4/6/8 bits.
void QuantizeRow(DType t, const float* src, void* dst, int64_t n);

// One 32-element block by the Q8_0 rule: d = amax / 127, q = round(x / d)
// (ties away from zero, as ggml); returns d (0 for an all-zero block). Also
// how the int8 matmul route quantizes activations (kernels/matmul_q8.h).
float QuantizeBlockQ8(const float* x, int8_t* qs);

// The same block at two int8 levels, how the int8x2 matmul route quantizes
// activations (kernels/matmul_q8.h). Level 1 is QuantizeBlockQ8 (q1, d); the
// residual r = x - d q1 (one rounding: fma) is quantized 256 times finer,
// q2 = round(r * 256 / d) (ties away from zero; 256 / d computed as 256 * (1 / d))
// clamped to [-127, 127], so the block reads back as d2 * (256 q1 + q2) with
// d2 = d / 256, which is returned. q2 = 0 where the residual is NaN (a NaN
// input) and for the whole block when d or 256 / d is not finite.
float QuantizeBlockQ8x2(const float* x, int8_t* q1, int8_t* q2);

// MLX affine quantization: weights packed little-endian into u32 words, `bits`
// (4 or 8) per value, element j of a word in bits [bits*j, bits*(j+1)), groups of `group_size`
// along the row, each with a scale and bias (stored as f16/bf16/f32 by the caller; passed here as
// float):
//   w[i] = scale[i / group_size] * q[i] + bias[i / group_size].
void DequantizeMlxRow(const uint32_t* packed, const float* scales, const float* biases, int bits,
                      int group_size, float* dst, int64_t n);
// Inverse: min/max per group, q = round((w - bias) / scale).
void QuantizeMlxRow(const float* src, int bits, int group_size, uint32_t* packed, float* scales,
                    float* biases, int64_t n);

}  // namespace lumen
