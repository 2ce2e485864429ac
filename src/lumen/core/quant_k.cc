// K-quants: 256-element super-blocks with quantized per-sub-block scales.
// Dequantization follows ggml's block definitions exactly (layouts in quant.h).
// Quantization is our own deterministic fit: per sub-block, a least-squares
// (scale, min) or scale over a few candidate grids, then the sub-block scales
// are themselves quantized against the super-block's f16 scale(s).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "lumen/core/half.h"
#include "lumen/core/quant.h"
#include "lumen/core/quant_k.h"

namespace lumen::quant_detail {
namespace {

template <typename T>
T LoadBlock(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Grid of candidate scales tried around the plain max/min fit: +-kSteps steps
// of kStepFrac of the level count.
constexpr int kSteps = 10;
constexpr float kStepFrac = 0.1f;

// Fits x[i] ~= scale * L[i] + min with L in 0..nmax and min <= 0 (the K-quant
// formats store -min as an unsigned 6- or 4-bit multiple of dmin). Returns
// scale >= 0; *min_out <= 0.
float FitAffine(const float* x, int n, int nmax, float* min_out) {
  float mn = x[0], mx = x[0];
  for (int i = 1; i < n; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
  }
  mn = std::min(mn, 0.0f);
  if (!(mx > mn)) {  // constant (<= 0) block, or NaN
    *min_out = std::isfinite(mn) ? mn : 0.0f;
    return 0.0f;
  }
  auto error = [&](float s, float m) {
    double e = 0;
    for (int i = 0; i < n; ++i) {
      const int l = NearestInt((x[i] - m) / s, 0, nmax);
      const double r = double(s) * l + m - x[i];
      e += r * r;
    }
    return e;
  };
  float best_s = (mx - mn) / nmax, best_m = mn;
  double best_e = error(best_s, best_m);
  // Least squares for (s, m) given the levels chosen under one candidate grid.
  auto solve = [&](float s0, float m0, float* s, float* m) {
    double sl = 0, sl2 = 0, sx = 0, sxl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = NearestInt((x[i] - m0) / s0, 0, nmax);
      sl += l;
      sl2 += double(l) * l;
      sx += x[i];
      sxl += double(x[i]) * l;
    }
    const double det = n * sl2 - sl * sl;
    if (det <= 0) return false;
    double ss = (n * sxl - sl * sx) / det;
    double mm = (sl2 * sx - sl * sxl) / det;
    if (mm > 0) {  // the format cannot shift upwards: refit with min = 0
      mm = 0;
      ss = sxl / sl2;
    }
    if (!(ss > 0)) return false;
    *s = static_cast<float>(ss);
    *m = static_cast<float>(mm);
    return true;
  };
  for (int step = -kSteps; step <= kSteps; ++step) {
    const float levels = nmax + kStepFrac * step;
    if (levels <= 0) continue;
    float s, m;
    if (!solve((mx - mn) / levels, mn, &s, &m)) continue;
    const double e = error(s, m);
    if (e < best_e) {
      best_e = e;
      best_s = s;
      best_m = m;
    }
  }
  for (int iter = 0; iter < 3; ++iter) {  // alternate levels <-> (s, m)
    float s, m;
    if (!solve(best_s, best_m, &s, &m)) break;
    const double e = error(s, m);
    if (!(e < best_e)) break;
    best_e = e;
    best_s = s;
    best_m = m;
  }
  *min_out = best_m;
  return best_s;
}

// Fits x[i] ~= scale * L[i] with L in -nmax..nmax-1. The value of largest
// magnitude anchors the grid at -nmax, so the scale carries its sign.
float FitSymmetric(const float* x, int n, int nmax) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (!(amax > 0) || !std::isfinite(amax)) return 0.0f;
  float best_s = max / -nmax;
  double best_e = std::numeric_limits<double>::infinity();
  for (int step = -kSteps; step <= kSteps; ++step) {
    const float iscale = -(nmax + kStepFrac * step) / max;
    double sxl = 0, sl2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = NearestInt(iscale * x[i], -nmax, nmax - 1);
      sxl += double(x[i]) * l;
      sl2 += double(l) * l;
    }
    if (sl2 <= 0) continue;
    const double s = sxl / sl2;
    double e = 0;
    for (int i = 0; i < n; ++i) {
      const int l = NearestInt(static_cast<float>(x[i] / s), -nmax, nmax - 1);
      const double r = s * l - x[i];
      e += r * r;
    }
    if (e < best_e) {
      best_e = e;
      best_s = static_cast<float>(s);
    }
  }
  return best_s;
}

// Quantizes the affine sub-block fits of one super-block (K-quants with mins):
// `ns` sub-blocks of `len` elements, levels 0..nmax, sub-block scale and min
// as multiples (0..smax) of d and dmin. Writes ls/lm and the final levels L.
void AffineSuperBlock(const float* x, int ns, int len, int nmax, int smax, uint16_t* d_bits,
                      uint16_t* dmin_bits, uint8_t* ls, uint8_t* lm, uint8_t* L) {
  float scale[16], mins[16];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < ns; ++j) {
    float m;
    scale[j] = FitAffine(x + j * len, len, nmax, &m);
    mins[j] = -m;
    max_scale = std::max(max_scale, scale[j]);
    max_min = std::max(max_min, mins[j]);
  }
  *d_bits = F32ToF16(max_scale / smax);
  *dmin_bits = F32ToF16(max_min / smax);
  const float d = F16ToF32(*d_bits), dmin = F16ToF32(*dmin_bits);
  for (int j = 0; j < ns; ++j) {
    ls[j] = static_cast<uint8_t>(d > 0 ? NearestInt(scale[j] / d, 0, smax) : 0);
    lm[j] = static_cast<uint8_t>(dmin > 0 ? NearestInt(mins[j] / dmin, 0, smax) : 0);
    const float dl = d * ls[j], ml = dmin * lm[j];
    for (int i = 0; i < len; ++i) {
      L[j * len + i] =
          static_cast<uint8_t>(dl > 0 ? NearestInt((x[j * len + i] + ml) / dl, 0, nmax) : 0);
    }
  }
}

// Symmetric sub-block fits (Q3_K, Q6_K): 16 sub-blocks of 16, levels
// -nmax..nmax-1, signed sub-block scales -smax..smax-1 times d. Returns the
// stored f16 d; sc[j] are signed scales, L[i] levels offset by +nmax.
uint16_t SymmetricSuperBlock(const float* x, int nmax, int smax, int* sc, uint8_t* L) {
  float scale[16];
  float amax = 0, max = 0;
  for (int j = 0; j < 16; ++j) {
    scale[j] = FitSymmetric(x + 16 * j, 16, nmax);
    if (std::fabs(scale[j]) > amax) {
      amax = std::fabs(scale[j]);
      max = scale[j];
    }
  }
  const uint16_t d_bits = F32ToF16(max / -smax);
  const float d = F16ToF32(d_bits);
  for (int j = 0; j < 16; ++j) {
    sc[j] = d != 0 ? NearestInt(scale[j] / d, -smax, smax - 1) : 0;
    const float dl = d * sc[j];
    for (int i = 0; i < 16; ++i) {
      const int l = dl != 0 ? NearestInt(x[16 * j + i] / dl, -nmax, nmax - 1) : 0;
      L[16 * j + i] = static_cast<uint8_t>(l + nmax);
    }
  }
  return d_bits;
}

// Q4_K/Q5_K scale packing, the inverse of GetScaleMinK4.
void PackScaleMinK4(const uint8_t* ls, const uint8_t* lm, uint8_t* q) {
  std::memset(q, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      q[j] = ls[j];
      q[j + 4] = lm[j];
    } else {
      q[j + 4] = static_cast<uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      q[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
      q[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
    }
  }
}

// 2-bit planes shared by Q2_K and Q3_K: element n*128 + 32*j + l is bits
// 2j..2j+1 of qs[n*32 + l].
void Pack2Bit(const uint8_t* L, uint8_t* qs) {
  for (int n = 0; n < kQKK; n += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[n / 4 + l] = static_cast<uint8_t>((L[n + l] & 3) | ((L[n + l + 32] & 3) << 2) |
                                           ((L[n + l + 64] & 3) << 4) | ((L[n + l + 96] & 3) << 6));
    }
  }
}

}  // namespace

// ---- Q2_K ------------------------------------------------------------------

void DequantizeQ2K(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = LoadBlock<BlockQ2K>(src + i * sizeof(BlockQ2K));
    const float d = F16ToF32(b.d), dmin = F16ToF32(b.dmin);
    const uint8_t* q = b.qs;
    int is = 0;
    for (int n = 0; n < kQKK; n += 128, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int half = 0; half < 2; ++half) {
          const uint8_t sc = b.scales[is++];
          const float dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * ((q[16 * half + l] >> shift) & 3) - ml;
        }
      }
    }
  }
}

void QuantizeQ2K(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    BlockQ2K b{};
    uint8_t ls[16], lm[16], L[kQKK];
    AffineSuperBlock(x, 16, 16, 3, 15, &b.d, &b.dmin, ls, lm, L);
    for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<uint8_t>(ls[j] | (lm[j] << 4));
    Pack2Bit(L, b.qs);
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

// ---- Q3_K ------------------------------------------------------------------

void DequantizeQ3K(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = LoadBlock<BlockQ3K>(src + i * sizeof(BlockQ3K));
    const float d = F16ToF32(b.d);
    const uint8_t* q = b.qs;
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < kQKK; n += 128, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
        for (int half = 0; half < 2; ++half) {
          const float dl = d * (Q3KScale(b.scales, is++) - 32);
          for (int l = 16 * half; l < 16 * half + 16; ++l) {
            const int lo = (q[l] >> shift) & 3;
            *y++ = dl * (lo - ((b.hmask[l] & m) ? 0 : 4));
          }
        }
      }
    }
  }
}

void QuantizeQ3K(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    BlockQ3K b{};
    int sc[16];
    uint8_t L[kQKK];
    b.d = SymmetricSuperBlock(x, 4, 32, sc, L);
    for (int j = 0; j < 16; ++j) {
      const int l = sc[j] + 32;
      if (j < 8) {
        b.scales[j] |= static_cast<uint8_t>(l & 0xF);
      } else {
        b.scales[j - 8] |= static_cast<uint8_t>((l & 0xF) << 4);
      }
      b.scales[8 + j % 4] |= static_cast<uint8_t>((l >> 4) << (2 * (j / 4)));
    }
    for (int e = 0; e < kQKK; ++e) {
      if (L[e] > 3) {
        b.hmask[e % 32] |= static_cast<uint8_t>(1u << (e / 32));
        L[e] -= 4;
      }
    }
    Pack2Bit(L, b.qs);
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

// ---- Q4_K ------------------------------------------------------------------

void DequantizeQ4K(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = LoadBlock<BlockQ4K>(src + i * sizeof(BlockQ4K));
    const float d = F16ToF32(b.d), dmin = F16ToF32(b.dmin);
    const uint8_t* q = b.qs;
    for (int j = 0; j < 8; j += 2, q += 32) {
      uint8_t sc, m;
      GetScaleMinK4(j, b.scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      GetScaleMinK4(j + 1, b.scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    }
  }
}

void QuantizeQ4K(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    BlockQ4K b{};
    uint8_t ls[8], lm[8], L[kQKK];
    AffineSuperBlock(x, 8, 32, 15, 63, &b.d, &b.dmin, ls, lm, L);
    PackScaleMinK4(ls, lm, b.scales);
    for (int j = 0; j < kQKK; j += 64) {
      for (int l = 0; l < 32; ++l) {
        b.qs[j / 2 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
      }
    }
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

// ---- Q5_K ------------------------------------------------------------------

void DequantizeQ5K(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = LoadBlock<BlockQ5K>(src + i * sizeof(BlockQ5K));
    const float d = F16ToF32(b.d), dmin = F16ToF32(b.dmin);
    const uint8_t* ql = b.qs;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < 8; j += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, m;
      GetScaleMinK4(j, b.scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      GetScaleMinK4(j + 1, b.scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (b.qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (b.qh[l] & u2 ? 16 : 0)) - m2;
    }
  }
}

void QuantizeQ5K(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    BlockQ5K b{};
    uint8_t ls[8], lm[8], L[kQKK];
    AffineSuperBlock(x, 8, 32, 31, 63, &b.d, &b.dmin, ls, lm, L);
    PackScaleMinK4(ls, lm, b.scales);
    for (int e = 0; e < kQKK; ++e) {
      if (L[e] > 15) b.qh[e % 32] |= static_cast<uint8_t>(1u << (e / 32));
    }
    for (int j = 0; j < kQKK; j += 64) {
      for (int l = 0; l < 32; ++l) {
        b.qs[j / 2 + l] = static_cast<uint8_t>((L[j + l] & 0xF) | ((L[j + l + 32] & 0xF) << 4));
      }
    }
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

// ---- Q6_K ------------------------------------------------------------------

void DequantizeQ6K(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = LoadBlock<BlockQ6K>(src + i * sizeof(BlockQ6K));
    const float d = F16ToF32(b.d);
    const uint8_t* ql = b.ql;
    const uint8_t* qh = b.qh;
    const int8_t* sc = b.scales;
    for (int n = 0; n < kQKK; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
    }
  }
}

void QuantizeQ6K(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    BlockQ6K b{};
    int sc[16];
    uint8_t L[kQKK];
    b.d = SymmetricSuperBlock(x, 32, 128, sc, L);
    for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<int8_t>(sc[j]);
    for (int n = 0; n < kQKK; n += 128) {
      uint8_t* ql = b.ql + n / 2;
      uint8_t* qh = b.qh + n / 4;
      for (int l = 0; l < 32; ++l) {
        const uint8_t* e = L + n + l;
        ql[l] = static_cast<uint8_t>((e[0] & 0xF) | ((e[64] & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((e[32] & 0xF) | ((e[96] & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((e[0] >> 4) | ((e[32] >> 4) << 2) | ((e[64] >> 4) << 4) |
                                     ((e[96] >> 4) << 6));
      }
    }
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

// ---- Q8_K ------------------------------------------------------------------

void DequantizeQ8K(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQKK) {
    const auto b = LoadBlock<BlockQ8K>(src + i * sizeof(BlockQ8K));
    for (int j = 0; j < kQKK; ++j) y[j] = b.d * b.qs[j];
  }
}

// As ggml: the largest-magnitude value maps to -127 (q is clamped to <= 127).
void QuantizeQ8K(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQKK) {
    BlockQ8K b{};
    float amax = 0, max = 0;
    for (int j = 0; j < kQKK; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    if (amax > 0 && std::isfinite(amax)) {
      const float iscale = -127.0f / max;
      for (int j = 0; j < kQKK; ++j)
        b.qs[j] = static_cast<int8_t>(NearestInt(iscale * x[j], -128, 127));
      b.d = 1 / iscale;
    }
    for (int j = 0; j < kQKK / 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += b.qs[16 * j + l];
      b.bsums[j] = static_cast<int16_t>(sum);
    }
    std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
  }
}

}  // namespace lumen::quant_detail
