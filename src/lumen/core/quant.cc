// Plain types, the legacy 32-element block types (Q4_0 ... Q8_1) and MLX
// affine groups. K-quants live in quant_k.cc.
#include "lumen/core/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "lumen/core/check.h"
#include "lumen/core/half.h"
#include "lumen/core/quant_k.h"
#include "lumen/core/repack.h"

namespace lumen {
namespace {

using quant_detail::NearestInt;

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void ConvertPlain(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(Load<T>(src + i * sizeof(T)));
}

// ---- Q4_0 / Q4_1 -----------------------------------------------------------

void DequantizeQ4_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = Load<BlockQ4_0>(src + i * sizeof(BlockQ4_0));
    const float d = F16ToF32(b.d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>((b.qs[j] & 0xF) - 8) * d;
      y[j + kQK / 2] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
    }
  }
}

// ggml's reference: the largest-magnitude value maps to -8, so the full range
// of the signed 4-bit grid is used on that side.
void QuantizeQ4_0(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0, max = 0;
    for (int j = 0; j < kQK; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    BlockQ4_0 b{};
    b.d = F32ToF16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = NearestInt(std::floor(x[j] * id + 8.5f), 0, 15);
      const int q1 = NearestInt(std::floor(x[j + kQK / 2] * id + 8.5f), 0, 15);
      b.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

void DequantizeQ4_1(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = Load<BlockQ4_1>(src + i * sizeof(BlockQ4_1));
    const float d = F16ToF32(b.d), m = F16ToF32(b.m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(b.qs[j] & 0xF) * d + m;
      y[j + kQK / 2] = static_cast<float>(b.qs[j] >> 4) * d + m;
    }
  }
}

void MinMax(const float* x, int n, float* mn, float* mx) {
  *mn = x[0];
  *mx = x[0];
  for (int j = 1; j < n; ++j) {
    *mn = std::min(*mn, x[j]);
    *mx = std::max(*mx, x[j]);
  }
}

void QuantizeQ4_1(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float mn, mx;
    MinMax(x, kQK, &mn, &mx);
    const float d = (mx - mn) / 15;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    BlockQ4_1 b{};
    b.d = F32ToF16(d);
    b.m = F32ToF16(mn);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = NearestInt(std::floor((x[j] - mn) * id + 0.5f), 0, 15);
      const int q1 = NearestInt(std::floor((x[j + kQK / 2] - mn) * id + 0.5f), 0, 15);
      b.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

// ---- Q5_0 / Q5_1 -----------------------------------------------------------

// The 5th bits of the 32 elements form one little-endian u32.
uint32_t HighBits(const uint8_t qh[4]) {
  return uint32_t(qh[0]) | uint32_t(qh[1]) << 8 | uint32_t(qh[2]) << 16 | uint32_t(qh[3]) << 24;
}
void StoreHighBits(uint32_t h, uint8_t qh[4]) {
  for (int k = 0; k < 4; ++k) qh[k] = static_cast<uint8_t>(h >> (8 * k));
}

void DequantizeQ5_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = Load<BlockQ5_0>(src + i * sizeof(BlockQ5_0));
    const float d = F16ToF32(b.d);
    const uint32_t h = HighBits(b.qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = (b.qs[j] & 0xF) | (((h >> j) & 1) << 4);
      const int q1 = (b.qs[j] >> 4) | (((h >> (j + kQK / 2)) & 1) << 4);
      y[j] = static_cast<float>(q0 - 16) * d;
      y[j + kQK / 2] = static_cast<float>(q1 - 16) * d;
    }
  }
}

void QuantizeQ5_0(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0, max = 0;
    for (int j = 0; j < kQK; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -16;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    BlockQ5_0 b{};
    b.d = F32ToF16(d);
    uint32_t h = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = NearestInt(std::floor(x[j] * id + 16.5f), 0, 31);
      const int q1 = NearestInt(std::floor(x[j + kQK / 2] * id + 16.5f), 0, 31);
      b.qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
      h |= uint32_t(q0 >> 4) << j;
      h |= uint32_t(q1 >> 4) << (j + kQK / 2);
    }
    StoreHighBits(h, b.qh);
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

void DequantizeQ5_1(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = Load<BlockQ5_1>(src + i * sizeof(BlockQ5_1));
    const float d = F16ToF32(b.d), m = F16ToF32(b.m);
    const uint32_t h = HighBits(b.qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = (b.qs[j] & 0xF) | (((h >> j) & 1) << 4);
      const int q1 = (b.qs[j] >> 4) | (((h >> (j + kQK / 2)) & 1) << 4);
      y[j] = static_cast<float>(q0) * d + m;
      y[j + kQK / 2] = static_cast<float>(q1) * d + m;
    }
  }
}

void QuantizeQ5_1(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float mn, mx;
    MinMax(x, kQK, &mn, &mx);
    const float d = (mx - mn) / 31;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    BlockQ5_1 b{};
    b.d = F32ToF16(d);
    b.m = F32ToF16(mn);
    uint32_t h = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = NearestInt(std::floor((x[j] - mn) * id + 0.5f), 0, 31);
      const int q1 = NearestInt(std::floor((x[j + kQK / 2] - mn) * id + 0.5f), 0, 31);
      b.qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
      h |= uint32_t(q0 >> 4) << j;
      h |= uint32_t(q1 >> 4) << (j + kQK / 2);
    }
    StoreHighBits(h, b.qh);
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

// ---- Q8_0 / Q8_1 -----------------------------------------------------------

void DequantizeQ8_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = Load<BlockQ8_0>(src + i * sizeof(BlockQ8_0));
    const float d = F16ToF32(b.d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
  }
}

// Symmetric 8-bit: d = amax / 127, q = round(x / d) (ties away from zero, as ggml).
float QuantizeQ8Symmetric(const float* x, int8_t* qs) {
  float amax = 0;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  for (int j = 0; j < kQK; ++j) {
    const float r = std::round(x[j] * id);
    qs[j] = static_cast<int8_t>(NearestInt(r, -127, 127));
  }
  return d;
}

void QuantizeQ8_0(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    BlockQ8_0 b{};
    b.d = F32ToF16(QuantizeQ8Symmetric(x, b.qs));
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

void DequantizeQ8_1(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = Load<BlockQ8_1>(src + i * sizeof(BlockQ8_1));
    const float d = F16ToF32(b.d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
  }
}

void QuantizeQ8_1(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    BlockQ8_1 b{};
    const float d = QuantizeQ8Symmetric(x, b.qs);
    int sum = 0;
    for (int j = 0; j < kQK; ++j) sum += b.qs[j];
    b.d = F32ToF16(d);
    b.s = F32ToF16(static_cast<float>(sum) * d);
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

}  // namespace

float QuantizeBlockQ8(const float* x, int8_t* qs) { return QuantizeQ8Symmetric(x, qs); }

float QuantizeBlockQ8x2(const float* x, int8_t* q1, int8_t* q2) {
  const float d = QuantizeQ8Symmetric(x, q1);
  const float id2 = d != 0 ? 256.0f * (1.0f / d) : 0.0f;
  const bool usable = std::isfinite(d) && std::isfinite(id2);
  for (int j = 0; j < kQK; ++j) {
    // |r| <= d / 2 (up to the rounding of x / d), so |r * id2| <= 128 (+ tiny):
    // the clamp acts only where |r| > 127.5 d2 and leaves an error of at most d2
    // there (d2 / 2 elsewhere).
    const float r = std::fma(-d, static_cast<float>(q1[j]), x[j]);
    const float v = usable && !std::isnan(r) ? std::round(r * id2) : 0.0f;
    q2[j] = static_cast<int8_t>(std::min(std::max(v, -127.0f), 127.0f));
  }
  return d / 256;
}

bool CanQuantize(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ8_0:
    case DType::kQ8_1:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kQ8_K:
      return true;
    default:
      return false;
  }
}

void DequantizeRow(DType t, const void* src_v, float* dst, int64_t n) {
  LUMEN_CHECK(n >= 0 && n % Info(t).block_elems == 0);
  const auto* src = static_cast<const uint8_t*>(src_v);
  const int64_t nb = n / Info(t).block_elems;
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToF32(Load<uint16_t>(src + 2 * i));
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToF32(Load<uint16_t>(src + 2 * i));
      return;
    case DType::kF64:
      ConvertPlain<double>(src, dst, n);
      return;
    case DType::kI8:
      ConvertPlain<int8_t>(src, dst, n);
      return;
    case DType::kU8:
      ConvertPlain<uint8_t>(src, dst, n);
      return;
    case DType::kI16:
      ConvertPlain<int16_t>(src, dst, n);
      return;
    case DType::kU16:
      ConvertPlain<uint16_t>(src, dst, n);
      return;
    case DType::kI32:
      ConvertPlain<int32_t>(src, dst, n);
      return;
    case DType::kU32:
      ConvertPlain<uint32_t>(src, dst, n);
      return;
    case DType::kI64:
      ConvertPlain<int64_t>(src, dst, n);
      return;
    case DType::kBool:
      for (int64_t i = 0; i < n; ++i) dst[i] = src[i] != 0 ? 1.0f : 0.0f;
      return;
    case DType::kQ4_0:
      DequantizeQ4_0(src, dst, nb);
      return;
    case DType::kQ4_1:
      DequantizeQ4_1(src, dst, nb);
      return;
    case DType::kQ5_0:
      DequantizeQ5_0(src, dst, nb);
      return;
    case DType::kQ5_1:
      DequantizeQ5_1(src, dst, nb);
      return;
    case DType::kQ8_0:
      DequantizeQ8_0(src, dst, nb);
      return;
    case DType::kQ8_1:
      DequantizeQ8_1(src, dst, nb);
      return;
    case DType::kQ2_K:
      quant_detail::DequantizeQ2K(src, dst, nb);
      return;
    case DType::kQ3_K:
      quant_detail::DequantizeQ3K(src, dst, nb);
      return;
    case DType::kQ4_K:
      quant_detail::DequantizeQ4K(src, dst, nb);
      return;
    case DType::kQ5_K:
      quant_detail::DequantizeQ5K(src, dst, nb);
      return;
    case DType::kQ6_K:
      quant_detail::DequantizeQ6K(src, dst, nb);
      return;
    case DType::kQ8_K:
      quant_detail::DequantizeQ8K(src, dst, nb);
      return;
    case DType::kQ4_0Cols:
    case DType::kQ4_1Cols:
    case DType::kQ5_0Cols:
    case DType::kQ5_1Cols:
    case DType::kQ4_KCols:
    case DType::kQ5_KCols:
    case DType::kQ8_0Cols:
    case DType::kQ6_KCols:
    case DType::kQ2_KCols:
    case DType::kQ3_KCols:
    case DType::kQ5_KPlanes:  // a whole row (repack.h)
      DequantizeColumnGroups(t, src, n, 0, n, dst);
      return;
  }
  LUMEN_CHECK(false && "unknown dtype");
}

void QuantizeRow(DType t, const float* src, void* dst_v, int64_t n) {
  LUMEN_CHECK(CanQuantize(t));
  LUMEN_CHECK(n >= 0 && n % Info(t).block_elems == 0);
  auto* dst = static_cast<uint8_t*>(dst_v);
  const int64_t nb = n / Info(t).block_elems;
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = F32ToF16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = F32ToBF16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case DType::kQ4_0:
      QuantizeQ4_0(src, dst, nb);
      return;
    case DType::kQ4_1:
      QuantizeQ4_1(src, dst, nb);
      return;
    case DType::kQ5_0:
      QuantizeQ5_0(src, dst, nb);
      return;
    case DType::kQ5_1:
      QuantizeQ5_1(src, dst, nb);
      return;
    case DType::kQ8_0:
      QuantizeQ8_0(src, dst, nb);
      return;
    case DType::kQ8_1:
      QuantizeQ8_1(src, dst, nb);
      return;
    case DType::kQ2_K:
      quant_detail::QuantizeQ2K(src, dst, nb);
      return;
    case DType::kQ3_K:
      quant_detail::QuantizeQ3K(src, dst, nb);
      return;
    case DType::kQ4_K:
      quant_detail::QuantizeQ4K(src, dst, nb);
      return;
    case DType::kQ5_K:
      quant_detail::QuantizeQ5K(src, dst, nb);
      return;
    case DType::kQ6_K:
      quant_detail::QuantizeQ6K(src, dst, nb);
      return;
    case DType::kQ8_K:
      quant_detail::QuantizeQ8K(src, dst, nb);
      return;
    default:
      break;
  }
  LUMEN_CHECK(false && "QuantizeRow: unsupported dtype");
}

// ---- MLX affine ------------------------------------------------------------

void DequantizeMlxRow(const uint32_t* packed, const float* scales, const float* biases, int bits,
                      int group_size, float* dst, int64_t n) {
  LUMEN_CHECK((bits == 4 || bits == 8) && group_size > 0 && n % group_size == 0);
  const int per_word = 32 / bits;
  LUMEN_CHECK(n % per_word == 0);
  const uint32_t mask = (1u << bits) - 1;
  // Safetensors data need not be 4-byte aligned: read each word with memcpy.
  const auto* bytes = reinterpret_cast<const unsigned char*>(packed);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t word;
    std::memcpy(&word, bytes + 4 * (i / per_word), sizeof word);
    const uint32_t q = (word >> (bits * (i % per_word))) & mask;
    const int64_t g = i / group_size;
    dst[i] = scales[g] * static_cast<float>(q) + biases[g];
  }
}

void QuantizeMlxRow(const float* src, int bits, int group_size, uint32_t* packed, float* scales,
                    float* biases, int64_t n) {
  LUMEN_CHECK((bits == 4 || bits == 8) && group_size > 0 && n % group_size == 0);
  const int per_word = 32 / bits;
  LUMEN_CHECK(n % per_word == 0);
  const int qmax = (1 << bits) - 1;
  std::fill(packed, packed + n / per_word, 0u);
  for (int64_t g = 0; g < n / group_size; ++g) {
    const float* x = src + g * group_size;
    float mn, mx;
    MinMax(x, group_size, &mn, &mx);
    const float scale = (mx - mn) / static_cast<float>(qmax);
    const float inv = scale != 0 ? 1.0f / scale : 0.0f;
    scales[g] = scale;
    biases[g] = mn;
    for (int j = 0; j < group_size; ++j) {
      const int64_t i = g * group_size + j;
      const uint32_t q = static_cast<uint32_t>(NearestInt((x[j] - mn) * inv, 0, qmax));
      packed[i / per_word] |= q << (bits * (i % per_word));
    }
  }
}

}  // namespace lumen
