// Scalar reference for AttendOne: f32 rows, double softmax sum. The oracle
// attention_test.cc checks the SIMD kernel against.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lumen/core/half.h"
#include "lumen/core/quant.h"
#include "lumen/kernels/attention.h"

namespace lumen::kernels {

inline float KvElemRef(const KvRing& kv, const void* base, int64_t slot, int64_t row, int64_t i) {
  const int64_t at = slot * row + i;
  switch (kv.dtype) {
    case DType::kQ8_0: {  // blocks of kQK along the row: [f16 d | kQK x int8]
      const uint8_t* blk = static_cast<const uint8_t*>(base) + (at / kQK) * sizeof(BlockQ8_0);
      uint16_t d;
      std::memcpy(&d, blk, 2);
      return F16ToF32(d) * static_cast<float>(static_cast<int8_t>(blk[2 + at % kQK]));
    }
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(base)[at]);
    case DType::kBF16:
      return BF16ToF32(static_cast<const uint16_t*>(base)[at]);
    default:
      return static_cast<const float*>(base)[at];
  }
}

inline void AttendOneRef(const float* q, const AttentionShape& s, const KvRing& kv,
                         int64_t pos_begin, int64_t pos_end, float* out) {
  const int H = s.n_heads, Hkv = s.n_kv_heads, Dh = s.head_dim, group = H / Hkv;
  const int64_t S = pos_end - pos_begin, row = int64_t(Hkv) * Dh;
  std::vector<double> sc(S);
  for (int h = 0; h < H; ++h) {
    const int64_t off = int64_t(h / group) * Dh;
    for (int64_t j = 0; j < S; ++j) {
      const int64_t slot = (pos_begin + j) % kv.capacity;
      double dot = 0;
      for (int d = 0; d < Dh; ++d)
        dot += double(q[h * Dh + d]) * KvElemRef(kv, kv.k, slot, row, off + d);
      double v = dot * s.scale;
      if (s.softcap > 0) v = s.softcap * std::tanh(v / s.softcap);
      sc[j] = v;
    }
    const double mx = *std::max_element(sc.begin(), sc.end());
    double sum = 0;
    for (auto& v : sc) sum += (v = std::exp(v - mx));
    for (int d = 0; d < Dh; ++d) {
      double acc = 0;
      for (int64_t j = 0; j < S; ++j)
        acc += sc[j] * KvElemRef(kv, kv.v, (pos_begin + j) % kv.capacity, row, off + d);
      out[h * Dh + d] = float(acc / sum);
    }
  }
}

}  // namespace lumen::kernels
