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

namespace lumen::formats {

// dst[0..n) = dequantized src row. Works for every DType (plain types convert).
void DequantizeRow(DType t, const void* src, float* dst, int64_t n);

// Quantizes src[0..n) into dst (RowBytes(t, n) bytes). Supported for every
// quantized type the reader supports plus F32/F16/BF16. Deterministic.
void QuantizeRow(DType t, const float* src, void* dst, int64_t n);

// MLX affine quantization: weights packed little-endian into u32 words, `bits`
// (4 or 8) per value, groups of `group_size` along the row, each with a scale
// and bias (stored as f16/bf16/f32 by the caller; passed here as float):
//   w[i] = scale[i / group_size] * q[i] + bias[i / group_size].
void DequantizeMlxRow(const uint32_t* packed, const float* scales, const float* biases,
                      int bits, int group_size, float* dst, int64_t n);
// Inverse: min/max per group, q = round((w - bias) / scale).
void QuantizeMlxRow(const float* src, int bits, int group_size, uint32_t* packed,
                    float* scales, float* biases, int64_t n);

}  // namespace lumen::formats
