// IEEE fp16 and bfloat16 <-> fp32 conversions, scalar and exact.
// fp16->fp32 is exact; fp32->fp16/bf16 rounds to nearest even, keeps NaN a NaN.
#pragma once

#include <cstdint>
#include <cstring>

namespace lumen {

inline float BitsToF32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t F32ToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float F16ToF32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0x1f) return BitsToF32(sign | 0x7f800000u | (mant << 13));  // inf/nan
  if (exp != 0) return BitsToF32(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return BitsToF32(sign);
  // Subnormal: normalize.
  int e = -1;
  do {
    mant <<= 1;
    ++e;
  } while ((mant & 0x400) == 0);
  return BitsToF32(sign | uint32_t(112 - e) << 23 | ((mant & 0x3ff) << 13));
}

inline uint16_t F32ToF16(float f) {
  const uint32_t x = F32ToBits(f);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return uint16_t(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // rounds to >= 65520: inf
  if (ax < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    // Adding 0.5f aligns the half-subnormal grid with float's mantissa LSBs.
    const float r = BitsToF32(ax) + 0.5f;
    return uint16_t(sign | (F32ToBits(r) - 0x3f000000u));
  }
  const uint32_t mant_odd = (ax >> 13) & 1;
  const uint32_t rounded = ax + 0xc8000fffu + mant_odd;  // rebias (-112<<23) + round
  return uint16_t(sign | (rounded >> 13));
}

inline float BF16ToF32(uint16_t b) { return BitsToF32(uint32_t(b) << 16); }

inline uint16_t F32ToBF16(float f) {
  uint32_t x = F32ToBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1);
  return uint16_t(x >> 16);
}

}  // namespace lumen
