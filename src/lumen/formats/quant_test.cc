// Lives in formats/ (not beside core/quant.cc) because it also checks the
// error budgets on real GGUF weights, which needs the GGUF reader.
// Quant block tests: hand-built blocks with known values (derived from ggml's
// block definitions, restated in quant.h), an index-formula oracle per
// K-quant, quantize->dequantize error budgets, re-quantization stability, and
// real weights from the fixtures.
#include "lumen/core/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "lumen/core/half.h"
#include "lumen/formats/gguf.h"

namespace lumen {
namespace {

constexpr uint16_t kHalf1 = 0x3c00;     // 1.0
constexpr uint16_t kHalf0_5 = 0x3800;   // 0.5
constexpr uint16_t kHalf0_25 = 0x3400;  // 0.25
constexpr uint16_t kHalf2 = 0x4000;     // 2.0
constexpr uint16_t kHalfM1 = 0xbc00;    // -1.0

template <typename B>
std::vector<float> Dequant(DType t, const B& b) {
  std::vector<float> y(Info(t).block_elems);
  DequantizeRow(t, &b, y.data(), static_cast<int64_t>(y.size()));
  return y;
}

std::vector<float> Gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = static_cast<uint8_t>(rng());
  return v;
}

// ---------------------------------------------------------------------------
// Legacy 32-element blocks: known values.

TEST(QuantKnown, Q4_0) {
  BlockQ4_0 b{};
  b.d = kHalf0_5;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | (((j + 3) & 15) << 4));
  const auto y = Dequant(DType::kQ4_0, b);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 0.5f) << j;
    EXPECT_EQ(y[j + 16], (((j + 3) & 15) - 8) * 0.5f) << j;
  }
  EXPECT_EQ(y[0], -4.0f);
  EXPECT_EQ(y[15], 3.5f);
}

TEST(QuantKnown, Q4_1) {
  BlockQ4_1 b{};
  b.d = kHalf0_25;
  b.m = kHalfM1;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto y = Dequant(DType::kQ4_1, b);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j * 0.25f - 1) << j;
    EXPECT_EQ(y[j + 16], (15 - j) * 0.25f - 1) << j;
  }
}

TEST(QuantKnown, Q5_0) {
  BlockQ5_0 b{};
  b.d = kHalf1;
  // 5th bit set for odd elements: qh = 0xAAAAAAAA little-endian.
  for (int k = 0; k < 4; ++k) b.qh[k] = 0xAA;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto y = Dequant(DType::kQ5_0, b);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j | ((j & 1) << 4)) - 16.0f) << j;
    EXPECT_EQ(y[j + 16], ((15 - j) | ((j & 1) << 4)) - 16.0f) << j;
  }
  EXPECT_EQ(y[0], -16.0f);
  EXPECT_EQ(y[1], 1.0f);  // 1 | 16 = 17 -> 17 - 16
}

TEST(QuantKnown, Q5_1) {
  BlockQ5_1 b{};
  b.d = kHalf0_5;
  b.m = kHalf2;
  b.qh[3] = 0x80;  // element 31 only
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(0xF0 | j);
  const auto y = Dequant(DType::kQ5_1, b);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(y[j], j * 0.5f + 2) << j;
  for (int j = 16; j < 31; ++j) EXPECT_EQ(y[j], 15 * 0.5f + 2) << j;
  EXPECT_EQ(y[31], 31 * 0.5f + 2);
}

TEST(QuantKnown, Q8_0AndQ8_1) {
  BlockQ8_0 b{};
  b.d = 0x3000;  // 0.125
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j * 8 - 128);
  const auto y = Dequant(DType::kQ8_0, b);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], (j * 8 - 128) * 0.125f) << j;
  BlockQ8_1 c{};
  c.d = kHalf2;
  c.s = 0x7bff;  // the sum field does not enter the values
  for (int j = 0; j < 32; ++j) c.qs[j] = static_cast<int8_t>(127 - j);
  const auto z = Dequant(DType::kQ8_1, c);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(z[j], (127 - j) * 2.0f) << j;
}

// ggml's reference quantizers reproduce a block from its own values when the
// block uses its extreme code (q = 0 for Q4_0/Q5_0, both ends for Q4_1/Q5_1).
template <typename B>
void ExpectRequantizesToSameBytes(DType t, const B& b) {
  const auto y = Dequant(t, b);
  B again{};
  QuantizeRow(t, y.data(), &again, 32);
  EXPECT_EQ(std::memcmp(&b, &again, sizeof(B)), 0) << Name(t);
}

TEST(QuantKnown, LegacyQuantizersReproduceKnownBlocks) {
  BlockQ4_0 a{};
  a.d = kHalf0_5;
  for (int j = 0; j < 16; ++j) a.qs[j] = static_cast<uint8_t>(j | (((j + 3) & 15) << 4));
  ExpectRequantizesToSameBytes(DType::kQ4_0, a);
  BlockQ4_1 b{};
  b.d = kHalf0_25;
  b.m = kHalfM1;
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  ExpectRequantizesToSameBytes(DType::kQ4_1, b);
  BlockQ5_0 c{};
  c.d = kHalf1;
  for (int k = 0; k < 4; ++k) c.qh[k] = 0xAA;
  for (int j = 0; j < 16; ++j) c.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  ExpectRequantizesToSameBytes(DType::kQ5_0, c);
  BlockQ5_1 e{};
  e.d = kHalf0_5;
  e.m = kHalf2;
  e.qh[3] = 0x80;
  for (int j = 0; j < 16; ++j) e.qs[j] = static_cast<uint8_t>(0xF0 | j);
  ExpectRequantizesToSameBytes(DType::kQ5_1, e);
  BlockQ8_0 g{};
  g.d = kHalf2;
  for (int j = 0; j < 32; ++j) g.qs[j] = static_cast<int8_t>(127 - 5 * j);
  ExpectRequantizesToSameBytes(DType::kQ8_0, g);
}

// ---------------------------------------------------------------------------
// K-quants: hand-computed values, then a per-element index oracle on random
// blocks. The oracles restate ggml's layout as "element i lives at ...".

// ggml's Q3_K scale unpacking via 32-bit words and kmask1/kmask2, written out
// independently of Q3KScale.
void Q3KScalesByKmask(const uint8_t* scales12, int8_t out[16]) {
  uint32_t aux[4];
  std::memcpy(aux, scales12, 12);
  const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  const uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  std::memcpy(out, aux, 16);
}

TEST(QuantKnown, Q3KScaleMatchesKmaskUnpacking) {
  for (uint32_t seed = 0; seed < 200; ++seed) {
    const auto bytes = RandomBytes(12, seed);
    int8_t want[16];
    Q3KScalesByKmask(bytes.data(), want);
    for (int j = 0; j < 16; ++j) ASSERT_EQ(Q3KScale(bytes.data(), j), want[j]) << seed << " " << j;
  }
}

TEST(QuantKnown, ScaleMinK4HandPacked) {
  // ls = {1,2,3,4,17,33,49,63}, lm = {0,5,10,15,20,40,60,63} packed by hand:
  // bytes 0-3: ls[0..3] | top bits of ls[4..7] << 6; bytes 4-7: lm[0..3] | top
  // bits of lm[4..7] << 6; bytes 8-11: low nibbles ls[4..7] | lm[4..7] << 4.
  const uint8_t q[12] = {65, 130, 195, 196, 64, 133, 202, 207, 65, 129, 193, 255};
  const uint8_t ls[8] = {1, 2, 3, 4, 17, 33, 49, 63};
  const uint8_t lm[8] = {0, 5, 10, 15, 20, 40, 60, 63};
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    GetScaleMinK4(j, q, &sc, &m);
    EXPECT_EQ(sc, ls[j]) << j;
    EXPECT_EQ(m, lm[j]) << j;
  }
}

TEST(QuantKnown, Q2K) {
  BlockQ2K b{};
  b.d = kHalf2;
  b.dmin = kHalf1;
  b.scales[0] = 0x13;  // scale 3, min 1
  b.scales[2] = 0x21;  // scale 1, min 2
  b.scales[4] = 0x05;
  b.scales[6] = 0xFF;
  b.qs[0] = 0b11100100;  // elements 0, 32, 64, 96 get q = 0, 1, 2, 3
  const auto y = Dequant(DType::kQ2_K, b);
  EXPECT_EQ(y[0], 2 * 3 * 0 - 1 * 1.0f);
  EXPECT_EQ(y[32], 2 * 1 * 1 - 2 * 1.0f);
  EXPECT_EQ(y[64], 2 * 5 * 2 - 0.0f);
  EXPECT_EQ(y[96], 2 * 15 * 3 - 15.0f);
  EXPECT_EQ(y[1], -1.0f);  // q = 0, same sub-block as element 0
  EXPECT_EQ(y[16], 0.0f);  // sub-block 1: scale byte 0
}

TEST(QuantKnown, Q3K) {
  BlockQ3K b{};
  b.d = kHalf0_5;
  for (int k = 8; k < 12; ++k) b.scales[k] = 0xAA;  // every scale's top bits = 2 -> 32 (= 0)
  b.scales[0] |= 8;                                 // scale 0 = 40 -> +8
  b.scales[9] = 0x8A;                               // scale 9 top bits 0 -> 0 (= -32)
  b.qs[0] = 3;
  b.hmask[0] = 0x01;  // element 0: q = 3 + 4 -> 3 after the -4 offset
  // element 1: q low 0, no high bit -> -4
  b.qs[48] = 2;
  b.hmask[16] = 1 << 4;  // element 144 (sub-block 9): q = 2
  const auto y = Dequant(DType::kQ3_K, b);
  EXPECT_EQ(y[0], 0.5f * 8 * 3);
  EXPECT_EQ(y[1], 0.5f * 8 * -4);
  EXPECT_EQ(y[144], 0.5f * -32 * 2);
  EXPECT_EQ(y[20], 0.0f);  // scale 32 -> 0
}

TEST(QuantKnown, Q4K) {
  BlockQ4K b{};
  b.d = kHalf1;
  b.dmin = kHalf0_5;
  const uint8_t q[12] = {65, 130, 195, 196, 64, 133, 202, 207, 65, 129, 193, 255};
  std::memcpy(b.scales, q, 12);
  b.qs[0] = 0x53;   // element 0: 3 (sub-block 0), element 32: 5 (sub-block 1)
  b.qs[32] = 0x0F;  // element 64: 15 (sub-block 2), element 96: 0 (sub-block 3)
  b.qs[96] = 0xA0;  // element 224: 10 (sub-block 7)
  const auto y = Dequant(DType::kQ4_K, b);
  EXPECT_EQ(y[0], 1 * 3 - 0.5f * 0);
  EXPECT_EQ(y[32], 2 * 5 - 0.5f * 5);
  EXPECT_EQ(y[64], 3 * 15 - 0.5f * 10);
  EXPECT_EQ(y[96], 4 * 0 - 0.5f * 15);
  EXPECT_EQ(y[224], 63 * 10 - 0.5f * 63);
}

TEST(QuantKnown, Q5K) {
  BlockQ5K b{};
  b.d = kHalf1;
  b.dmin = kHalf0_5;
  const uint8_t q[12] = {65, 130, 195, 196, 64, 133, 202, 207, 65, 129, 193, 255};
  std::memcpy(b.scales, q, 12);
  b.qs[0] = 0x53;
  b.qh[0] = 0x01 | 0x80;  // 5th bit for element 0 (bit 0) and element 224 (bit 7)
  b.qs[96] = 0xA0;
  const auto y = Dequant(DType::kQ5_K, b);
  EXPECT_EQ(y[0], 1 * (3 + 16) - 0.5f * 0);
  EXPECT_EQ(y[32], 2 * 5 - 0.5f * 5);
  EXPECT_EQ(y[224], 63 * (10 + 16) - 0.5f * 63);
}

TEST(QuantKnown, Q6K) {
  BlockQ6K b{};
  b.d = kHalf1;
  for (auto& s : b.scales) s = 1;
  b.scales[0] = 2;
  b.scales[5] = -3;
  b.ql[0] = 0x21;        // element 0 low 1, element 64 low 2
  b.ql[32] = 0x43;       // element 32 low 3, element 96 low 4
  b.qh[0] = 0b11100100;  // high 2 bits: element 0: 0, 32: 1, 64: 2, 96: 3
  const auto y = Dequant(DType::kQ6_K, b);
  EXPECT_EQ(y[0], 2.0f * (1 - 32));
  EXPECT_EQ(y[32], 1.0f * (3 + 16 - 32));
  EXPECT_EQ(y[64], 1.0f * (2 + 32 - 32));
  EXPECT_EQ(y[96], 1.0f * (4 + 48 - 32));
  EXPECT_EQ(y[80], -3.0f * -32);  // sub-block 5, all-zero bits
}

// Per-element oracles: where element i of a super-block lives.
float OracleQ2K(const BlockQ2K& b, int i) {
  const int q = (b.qs[(i / 128) * 32 + i % 32] >> (2 * ((i % 128) / 32))) & 3;
  const uint8_t s = b.scales[i / 16];
  return F16ToF32(b.d) * (s & 0xF) * q - F16ToF32(b.dmin) * (s >> 4);
}
float OracleQ3K(const BlockQ3K& b, int i) {
  int8_t sc[16];
  Q3KScalesByKmask(b.scales, sc);
  const int lo = (b.qs[(i / 128) * 32 + i % 32] >> (2 * ((i % 128) / 32))) & 3;
  const int hi = (b.hmask[i % 32] >> (i / 32)) & 1;
  return F16ToF32(b.d) * (sc[i / 16] - 32) * (lo + 4 * hi - 4);
}
float OracleQ4K(const BlockQ4K& b, int i) {
  uint8_t sc, m;
  GetScaleMinK4(i / 32, b.scales, &sc, &m);
  const uint8_t byte = b.qs[(i / 64) * 32 + i % 32];
  const int q = (i / 32) % 2 ? byte >> 4 : byte & 0xF;
  return F16ToF32(b.d) * sc * q - F16ToF32(b.dmin) * m;
}
float OracleQ5K(const BlockQ5K& b, int i) {
  uint8_t sc, m;
  GetScaleMinK4(i / 32, b.scales, &sc, &m);
  const uint8_t byte = b.qs[(i / 64) * 32 + i % 32];
  const int q = ((i / 32) % 2 ? byte >> 4 : byte & 0xF) + 16 * ((b.qh[i % 32] >> (i / 32)) & 1);
  return F16ToF32(b.d) * sc * q - F16ToF32(b.dmin) * m;
}
float OracleQ6K(const BlockQ6K& b, int i) {
  const int n = i / 128, quarter = (i % 128) / 32, l = i % 32;
  const uint8_t lbyte = b.ql[n * 64 + l + (quarter % 2) * 32];
  const int lo = quarter >= 2 ? lbyte >> 4 : lbyte & 0xF;
  const int hi = (b.qh[n * 32 + l] >> (2 * quarter)) & 3;
  return F16ToF32(b.d) * b.scales[i / 16] * ((lo | (hi << 4)) - 32);
}
float OracleQ8K(const BlockQ8K& b, int i) { return b.d * b.qs[i]; }

// Random blocks with a finite, modest super-block scale.
template <typename B>
B RandomBlock(uint32_t seed) {
  auto bytes = RandomBytes(sizeof(B), seed);
  B b;
  std::memcpy(&b, bytes.data(), sizeof(B));
  return b;
}

template <typename B>
void CheckOracle(DType t, float (*oracle)(const B&, int), void (*fix)(B*)) {
  for (uint32_t seed = 1; seed <= 50; ++seed) {
    B b = RandomBlock<B>(seed);
    fix(&b);
    const auto y = Dequant(t, b);
    for (int i = 0; i < kQKK; ++i)
      ASSERT_EQ(y[i], oracle(b, i)) << Name(t) << " seed " << seed << " i " << i;
  }
}

TEST(QuantKnown, KQuantsMatchIndexOracleOnRandomBlocks) {
  CheckOracle<BlockQ2K>(DType::kQ2_K, OracleQ2K, [](BlockQ2K* b) {
    b->d = 0x3555;
    b->dmin = 0x2e66;
  });
  CheckOracle<BlockQ3K>(DType::kQ3_K, OracleQ3K, [](BlockQ3K* b) { b->d = 0x2c00; });
  CheckOracle<BlockQ4K>(DType::kQ4_K, OracleQ4K, [](BlockQ4K* b) {
    b->d = 0x1f00;
    b->dmin = 0x2100;
  });
  CheckOracle<BlockQ5K>(DType::kQ5_K, OracleQ5K, [](BlockQ5K* b) {
    b->d = 0x1f00;
    b->dmin = 0x2100;
  });
  CheckOracle<BlockQ6K>(DType::kQ6_K, OracleQ6K, [](BlockQ6K* b) { b->d = 0x2400; });
  CheckOracle<BlockQ8K>(DType::kQ8_K, OracleQ8K, [](BlockQ8K* b) { b->d = 0.0123f; });
}

// ---------------------------------------------------------------------------
// Quantize -> dequantize error budgets on N(0, 1) input.
//
// Budgets come from uniform rounding error, step / sqrt(12), with the step the
// format's grid gives for Gaussian blocks: E max|x| of 32 normals ~2.4, of 256
// ~3.0; E range (max - min) of 32 normals ~4.1, of 16 ~3.5. Symmetric types
// anchor the grid at the largest magnitude (step = max|x| / levels on that
// side); affine types spread the levels over the range. Budget = estimate x ~1.2
// for f16-rounded scales and the quantized sub-block scales.
//   Q8_0/Q8_1: 2.4/127/3.46 = 0.0055 -> 0.0066   Q8_K: 3.0/127/3.46 = 0.0068 -> 0.008
//   Q5_0: 2.4/16/3.46 = 0.043 -> 0.052           Q5_1: 4.1/31/3.46 = 0.038 -> 0.046
//   Q4_0: 2.4/8/3.46 = 0.087 -> 0.105            Q4_1: 4.1/15/3.46 = 0.079 -> 0.095
//   Q6_K: 3.5/63/3.46 = 0.016 -> 0.02            Q5_K: 4.1/31/3.46 = 0.038 -> 0.046
//   Q4_K: 4.1/15/3.46 = 0.079 -> 0.095           Q3_K: 3.5/7/3.46 = 0.146 -> 0.17
//   Q2_K: 3.5/3/3.46 = 0.34 -> 0.34 (no headroom: the least-squares fit, which
//     may clip outliers, must beat plain min/max rounding; measured ~0.27)
// Measured values are printed by the test.
struct Budget {
  DType t;
  double rel_rms;
};
constexpr Budget kBudgets[] = {
    {DType::kQ8_0, 0.006}, {DType::kQ8_1, 0.006}, {DType::kQ8_K, 0.008}, {DType::kQ5_0, 0.045},
    {DType::kQ5_1, 0.045}, {DType::kQ4_0, 0.09},  {DType::kQ4_1, 0.09},  {DType::kQ6_K, 0.02},
    {DType::kQ5_K, 0.045}, {DType::kQ4_K, 0.09},  {DType::kQ3_K, 0.15},  {DType::kQ2_K, 0.34},
};

double RelRms(const std::vector<float>& x, const std::vector<float>& y) {
  double e = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e += double(x[i] - y[i]) * (x[i] - y[i]);
    s += double(x[i]) * x[i];
  }
  return std::sqrt(e / s);
}

std::vector<float> RoundTrip(DType t, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(*RowBytes(t, n));
  QuantizeRow(t, x.data(), q.data(), n);
  std::vector<float> y(x.size());
  DequantizeRow(t, q.data(), y.data(), n);
  return y;
}

TEST(QuantRoundTrip, ErrorBudgetsOnGaussian) {
  const auto x = Gaussian(256 * 64, 42, 0.02f);  // weight-like scale
  for (const auto& b : kBudgets) {
    const double err = RelRms(x, RoundTrip(b.t, x));
    EXPECT_LT(err, b.rel_rms) << Name(b.t);
    RecordProperty(std::string(Name(b.t)), std::to_string(err));
    std::printf("  %-5s rel rms %.4f (budget %.3f)\n", std::string(Name(b.t)).c_str(), err,
                b.rel_rms);
  }
}

TEST(QuantRoundTrip, PlainTypes) {
  const auto x = Gaussian(1000, 7);
  EXPECT_EQ(RoundTrip(DType::kF32, x), x);
  const auto h = RoundTrip(DType::kF16, x);
  const auto bf = RoundTrip(DType::kBF16, x);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(h[i], F16ToF32(F32ToF16(x[i])));
    EXPECT_EQ(bf[i], BF16ToF32(F32ToBF16(x[i])));
  }
  // Integer types dequantize by value conversion.
  const int32_t ints[4] = {-5, 0, 7, 1 << 20};
  float out[4];
  DequantizeRow(DType::kI32, ints, out, 4);
  EXPECT_EQ(out[0], -5.0f);
  EXPECT_EQ(out[3], 1048576.0f);
}

// Zero and constant rows must quantize to exact values, never NaN.
TEST(QuantRoundTrip, ZeroAndConstantRows) {
  for (const auto& b : kBudgets) {
    const std::vector<float> zeros(256, 0.0f);
    for (float y : RoundTrip(b.t, zeros)) ASSERT_EQ(y, 0.0f) << Name(b.t);
    const std::vector<float> ones(256, -1.5f);
    for (float y : RoundTrip(b.t, ones)) ASSERT_NEAR(y, -1.5f, 1.5f * 0.01) << Name(b.t);
  }
}

// Non-finite input must not crash (values are unspecified).
TEST(QuantRoundTrip, NonFiniteInputDoesNotCrash) {
  auto x = Gaussian(256, 3);
  x[5] = std::nanf("");
  x[77] = INFINITY;
  x[200] = -INFINITY;
  for (const auto& b : kBudgets) (void)RoundTrip(b.t, x);
}

// Dequantized values of a format are on its grid: quantizing them again must
// reproduce them (exactly for the amax/min-max types, whose grids re-derive
// the same scale; within a small fraction of the first error for K-quants,
// whose sub-block scales are re-fitted).
TEST(QuantRoundTrip, RequantizeIsStable) {
  const auto x = Gaussian(256 * 16, 11);
  for (const auto& b : kBudgets) {
    const auto y1 = RoundTrip(b.t, x);
    const auto y2 = RoundTrip(b.t, y1);
    const bool exact = !IsQuantized(b.t) || Info(b.t).block_elems == 32 || b.t == DType::kQ8_K;
    if (exact) {
      double worst = 0;
      for (size_t i = 0; i < y1.size(); ++i)
        worst = std::max(worst, double(std::fabs(y1[i] - y2[i])));
      // Exact up to the f16 rounding of a re-derived scale: 2^-11 relative.
      EXPECT_LE(worst, 4 * std::ldexp(1.0, -11)) << Name(b.t);
    } else {
      EXPECT_LT(RelRms(y1, y2), 0.5 * RelRms(x, y1)) << Name(b.t);
    }
  }
}

// Real weights: stories260K is F32, llama-2-tiny-random is F16.
std::string FixturesDir() {
  if (const char* env = std::getenv("LUMEN_FIXTURES")) return env;
  return std::string(LUMEN_SOURCE_DIR) + "/../shared/fixtures";
}

TEST(QuantRealData, DequantizeFixtureRowsAndQuantizeRealWeights) {
  const std::string tiny = FixturesDir() + "/llama-2-tiny-random-gguf/llama-2-tiny-random.gguf";
  const std::string stories = FixturesDir() + "/stories260K-gguf/stories260K.gguf";
  if (!std::filesystem::exists(tiny) || !std::filesystem::exists(stories))
    GTEST_SKIP() << "fixtures not found under " << FixturesDir();
  auto t = formats::GgufFile::Open(tiny);
  ASSERT_TRUE(t.ok()) << t.status().message();
  const TensorView& emb = t->FindTensor("token_embd.weight")->view;
  std::vector<float> row(8);
  DequantizeRow(DType::kF16, emb.row(1), row.data(), 8);
  EXPECT_EQ(row[0], 0.034088134765625f);
  EXPECT_EQ(row[1], 0.0158843994140625f);

  auto s = formats::GgufFile::Open(stories);
  ASSERT_TRUE(s.ok()) << s.status().message();
  const TensorView& w = s->FindTensor("blk.0.ffn_gate.weight")->view;  // [172, 64]
  std::vector<float> x(static_cast<size_t>(w.numel()));
  DequantizeRow(DType::kF32, w.data, x.data(), w.numel());
  EXPECT_EQ(x[0], 0.21368665993213654f);
  EXPECT_EQ(x[64], 0.07753561437129974f);
  // 172 * 64 = 11008 = 43 super-blocks: the same budgets hold on trained weights.
  for (const auto& b : kBudgets) {
    EXPECT_LT(RelRms(x, RoundTrip(b.t, x)), b.rel_rms) << Name(b.t);
  }
}

// ---------------------------------------------------------------------------
// MLX affine groups.

TEST(QuantMlx, KnownPacking) {
  // 4 bits: element j of a word is (w >> 4j) & 15.
  const uint32_t packed4[1] = {0x76543210u};
  const float scale[1] = {0.5f}, bias[1] = {-1.0f};
  float y[8];
  DequantizeMlxRow(packed4, scale, bias, 4, 8, y, 8);
  for (int j = 0; j < 8; ++j) EXPECT_EQ(y[j], 0.5f * j - 1.0f) << j;
  const uint32_t packed8[2] = {0x03020100u, 0xff800706u};
  const float scale2[1] = {2.0f}, bias2[1] = {1.0f};
  float z[8];
  DequantizeMlxRow(packed8, scale2, bias2, 8, 8, z, 8);
  const int q8[8] = {0, 1, 2, 3, 6, 7, 128, 255};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(z[j], 2.0f * q8[j] + 1.0f) << j;
}

TEST(QuantMlx, RoundTripBudgets) {
  const auto x = Gaussian(128 * 8, 5);
  for (int bits : {4, 8}) {
    for (int group : {32, 64, 128}) {
      const int64_t n = static_cast<int64_t>(x.size());
      std::vector<uint32_t> packed(n * bits / 32);
      std::vector<float> scales(n / group), biases(n / group), y(x.size());
      QuantizeMlxRow(x.data(), bits, group, packed.data(), scales.data(), biases.data(), n);
      DequantizeMlxRow(packed.data(), scales.data(), biases.data(), bits, group, y.data(), n);
      // Each value is within half a step of the min/max grid.
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_LE(std::fabs(x[i] - y[i]), 0.5f * scales[i / group] * 1.0001f + 1e-6f)
            << bits << " " << group << " " << i;
      }
      // Range of a group of g normals / (2^bits - 1) / sqrt(12), with headroom.
      const double budget = bits == 4 ? (group == 32   ? 0.09
                                         : group == 64 ? 0.1
                                                       : 0.11)
                                      : (group == 32   ? 0.006
                                         : group == 64 ? 0.007
                                                       : 0.008);
      EXPECT_LT(RelRms(x, y), budget) << bits << " " << group;
    }
  }
}

}  // namespace
}  // namespace lumen
