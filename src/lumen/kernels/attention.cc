#include "lumen/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "lumen/core/check.h"
#include "lumen/core/half.h"

namespace lumen::kernels {
namespace {

void LoadRow(DType t, const void* base, int64_t row, int64_t n, float* dst) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, static_cast<const float*>(base) + row * n, n * sizeof(float));
      break;
    case DType::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(base) + row * n;
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToF32(p[i]);
      break;
    }
    case DType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(base) + row * n;
      for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToF32(p[i]);
      break;
    }
    default:
      LUMEN_CHECK(false && "unsupported KV dtype");
  }
}

void StoreRow(DType t, void* base, int64_t row, int64_t n, const float* src) {
  switch (t) {
    case DType::kF32:
      std::memcpy(static_cast<float*>(base) + row * n, src, n * sizeof(float));
      break;
    case DType::kF16: {
      uint16_t* p = static_cast<uint16_t*>(base) + row * n;
      for (int64_t i = 0; i < n; ++i) p[i] = F32ToF16(src[i]);
      break;
    }
    case DType::kBF16: {
      uint16_t* p = static_cast<uint16_t*>(base) + row * n;
      for (int64_t i = 0; i < n; ++i) p[i] = F32ToBF16(src[i]);
      break;
    }
    default:
      LUMEN_CHECK(false && "unsupported KV dtype");
  }
}

}  // namespace

void StoreKv(const KvRing& kv, int64_t row_elems, int64_t pos, const float* k, const float* v) {
  const int64_t slot = pos % kv.capacity;
  StoreRow(kv.dtype, const_cast<void*>(kv.k), slot, row_elems, k);
  StoreRow(kv.dtype, const_cast<void*>(kv.v), slot, row_elems, v);
}

void AttendOne(const float* q, const AttentionShape& s, const KvRing& kv, int64_t pos_begin,
               int64_t pos_end, float* out, float* scratch) {
  const int H = s.n_heads, Hkv = s.n_kv_heads, Dh = s.head_dim;
  const int group = H / Hkv;
  const int64_t S = pos_end - pos_begin;
  const int64_t row = int64_t(Hkv) * Dh;
  LUMEN_DCHECK(S > 0 && S <= kv.capacity);
  float* scores = scratch;            // [H, S]
  float* krow = scratch + H * S;      // [Hkv * Dh]
  float* vrow = krow + row;           // [Hkv * Dh]

  for (int64_t j = 0; j < S; ++j) {
    LoadRow(kv.dtype, kv.k, (pos_begin + j) % kv.capacity, row, krow);
    for (int h = 0; h < H; ++h) {
      const float* qh = q + int64_t(h) * Dh;
      const float* kh = krow + int64_t(h / group) * Dh;
      float dot = 0;
      for (int d = 0; d < Dh; ++d) dot += qh[d] * kh[d];
      float sc = dot * s.scale;
      if (s.softcap > 0) sc = s.softcap * std::tanh(sc / s.softcap);
      scores[h * S + j] = sc;
    }
  }
  for (int h = 0; h < H; ++h) {
    float* sh = scores + h * S;
    const float mx = *std::max_element(sh, sh + S);
    double sum = 0;
    for (int64_t j = 0; j < S; ++j) {
      sh[j] = std::exp(sh[j] - mx);
      sum += sh[j];
    }
    const float inv = float(1.0 / sum);
    for (int64_t j = 0; j < S; ++j) sh[j] *= inv;
  }
  std::fill(out, out + int64_t(H) * Dh, 0.0f);
  for (int64_t j = 0; j < S; ++j) {
    LoadRow(kv.dtype, kv.v, (pos_begin + j) % kv.capacity, row, vrow);
    for (int h = 0; h < H; ++h) {
      const float p = scores[h * S + j];
      const float* vh = vrow + int64_t(h / group) * Dh;
      float* oh = out + int64_t(h) * Dh;
      for (int d = 0; d < Dh; ++d) oh[d] += p * vh[d];
    }
  }
}

}  // namespace lumen::kernels
