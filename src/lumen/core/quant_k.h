// Internal to quant.cc / quant_k.cc: the K-quant (256-element super-block)
// reference routines and shared rounding helpers. Use quant.h instead.
#pragma once

#include <cmath>
#include <cstdint>

namespace lumen::quant_detail {

// Round to nearest (ties to even) and clamp to [lo, hi]; NaN maps to lo so a
// hostile or broken input cannot reach an out-of-range integer conversion.
inline int NearestInt(float v, int lo, int hi) {
  if (!(v >= static_cast<float>(lo))) return lo;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(std::nearbyint(v));
}

// Each handles `nb` consecutive super-blocks.
void DequantizeQ2K(const uint8_t* src, float* dst, int64_t nb);
void DequantizeQ3K(const uint8_t* src, float* dst, int64_t nb);
void DequantizeQ4K(const uint8_t* src, float* dst, int64_t nb);
void DequantizeQ5K(const uint8_t* src, float* dst, int64_t nb);
void DequantizeQ6K(const uint8_t* src, float* dst, int64_t nb);
void DequantizeQ8K(const uint8_t* src, float* dst, int64_t nb);

void QuantizeQ2K(const float* src, uint8_t* dst, int64_t nb);
void QuantizeQ3K(const float* src, uint8_t* dst, int64_t nb);
void QuantizeQ4K(const float* src, uint8_t* dst, int64_t nb);
void QuantizeQ5K(const float* src, uint8_t* dst, int64_t nb);
void QuantizeQ6K(const float* src, uint8_t* dst, int64_t nb);
void QuantizeQ8K(const float* src, uint8_t* dst, int64_t nb);

}  // namespace lumen::quant_detail
