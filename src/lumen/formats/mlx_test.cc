#include "lumen/formats/mlx.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "lumen/core/half.h"
#include "lumen/core/quant.h"

namespace lumen::formats {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

TEST(MlxQuantization, ParsesConfig) {
  auto none = ParseMlxQuantization(json::parse(R"({"hidden_size": 8})"), "config.json");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());

  auto q = ParseMlxQuantization(json::parse(R"({"quantization": {"group_size": 32, "bits": 8},
                      "quantization_config": {"group_size": 32, "bits": 8}})"),
                                "config.json");
  ASSERT_TRUE(q.ok()) << q.status().message();
  ASSERT_TRUE(q->has_value());
  EXPECT_EQ((*q)->defaults, (MlxQuantParams{32, 8}));
  EXPECT_EQ((*q)->For("model.layers.0.mlp.up_proj"), (MlxQuantParams{32, 8}));

  auto only_config = ParseMlxQuantization(
      json::parse(R"({"quantization_config": {"group_size": 128, "bits": 4, "mode": "affine"}})"),
      "c");
  ASSERT_TRUE(only_config.ok()) << only_config.status().message();
  EXPECT_EQ((*only_config)->defaults, (MlxQuantParams{128, 4}));

  auto mixed = ParseMlxQuantization(json::parse(R"({"quantization": {"group_size": 64, "bits": 4,
      "model.layers.0.mlp.down_proj": {"group_size": 64, "bits": 8},
      "lm_head": false}})"),
                                    "c");
  ASSERT_TRUE(mixed.ok()) << mixed.status().message();
  EXPECT_EQ((*mixed)->For("model.layers.0.mlp.down_proj"), (MlxQuantParams{64, 8}));
  EXPECT_EQ((*mixed)->For("model.layers.1.mlp.down_proj"), (MlxQuantParams{64, 4}));
  EXPECT_FALSE((*mixed)->For("lm_head").has_value());
}

std::string ParseError(const char* text) {
  auto r = ParseMlxQuantization(json::parse(text), "m/config.json");
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : r.status().message();
}

TEST(MlxQuantization, RejectsBadConfig) {
  EXPECT_THAT(ParseError(R"({"quantization": {"group_size": 64, "bits": 3}})"),
              HasSubstr("m/config.json: \"quantization\": bits 3 is not supported (4 or 8)"));
  EXPECT_THAT(ParseError(R"({"quantization": {"group_size": 48, "bits": 4}})"),
              HasSubstr("group_size 48 is not supported"));
  EXPECT_THAT(ParseError(R"({"quantization": {"bits": 4}})"), HasSubstr("missing \"group_size\""));
  EXPECT_THAT(ParseError(R"({"quantization": {"group_size": "64", "bits": 4}})"),
              HasSubstr("\"group_size\" must be an integer"));
  EXPECT_THAT(ParseError(R"({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"}})"),
              HasSubstr("mode \"mxfp4\" is not supported"));
  EXPECT_THAT(ParseError(R"({"quantization_config": {"quant_method": "gptq", "bits": 4}})"),
              HasSubstr("quant_method \"gptq\" is not supported"));
  EXPECT_THAT(ParseError(R"({"quantization": {"group_size": 64, "bits": 4,
                             "model.layers.0.q_proj": {"group_size": 64, "bits": 2}}})"),
              HasSubstr("module 'model.layers.0.q_proj': bits 2 is not supported"));
  EXPECT_THAT(ParseError(R"({"quantization": 4})"), HasSubstr("must be an object"));
}

// Packs q values LSB first into u32 words, independently of quant.h.
std::vector<uint32_t> Pack(const std::vector<uint32_t>& q, int bits) {
  std::vector<uint32_t> out(q.size() * bits / 32, 0);
  for (size_t i = 0; i < q.size(); ++i) out[i * bits / 32] |= q[i] << ((i * bits) % 32);
  return out;
}

uint16_t Encode(DType t, float v) { return t == DType::kF16 ? F32ToF16(v) : F32ToBF16(v); }
float Decode(DType t, uint16_t v) { return t == DType::kF16 ? F16ToF32(v) : BF16ToF32(v); }

// Every (bits, group size, scale dtype): dequantized rows equal scale * q + bias
// computed here from the stored scales.
TEST(MlxLinear, DequantizesExactly) {
  std::mt19937 rng(7);
  for (int bits : {4, 8}) {
    for (int gs : {32, 64, 128}) {
      for (DType sdt : {DType::kF16, DType::kBF16, DType::kF32}) {
        const int64_t out = 3, in = 256, groups = in / gs;
        std::vector<uint32_t> q(out * in);
        for (auto& v : q) v = rng() & ((1u << bits) - 1);
        std::vector<uint32_t> packed = Pack(q, bits);
        std::vector<float> sf(out * groups), bf(out * groups);
        std::vector<uint16_t> sh(out * groups), bh(out * groups);
        std::uniform_real_distribution<float> u(-1, 1);
        for (int64_t i = 0; i < out * groups; ++i) {
          sf[i] = u(rng) * 0.1f;
          bf[i] = u(rng);
          if (sdt != DType::kF32) {
            sh[i] = Encode(sdt, sf[i]);
            bh[i] = Encode(sdt, bf[i]);
            sf[i] = Decode(sdt, sh[i]);
            bf[i] = Decode(sdt, bh[i]);
          }
        }
        void* sp = sdt == DType::kF32 ? static_cast<void*>(sf.data()) : sh.data();
        void* bp = sdt == DType::kF32 ? static_cast<void*>(bf.data()) : bh.data();
        auto m = MlxLinear::FromViews(
            "lin", TensorView::Contiguous(packed.data(), DType::kU32, {out, in * bits / 32}),
            TensorView::Contiguous(sp, sdt, {out, groups}),
            TensorView::Contiguous(bp, sdt, {out, groups}), MlxQuantParams{gs, bits});
        ASSERT_TRUE(m.ok()) << m.status().message();
        EXPECT_EQ(m->in_features, in);
        EXPECT_EQ(m->out_features, out);
        std::vector<float> row(in);
        for (int64_t r = 0; r < out; ++r) {
          m->DequantizeRow(r, row.data());
          for (int64_t i = 0; i < in; ++i) {
            const int64_t g = r * groups + i / gs;
            ASSERT_EQ(row[i], sf[g] * float(q[r * in + i]) + bf[g])
                << "bits " << bits << " gs " << gs << " " << Name(sdt) << " row " << r << " i "
                << i;
          }
        }
      }
    }
  }
}

TEST(MlxLinear, ShapeErrorsNameTheTensor) {
  std::vector<uint32_t> w(4 * 8);
  std::vector<float> s(4 * 2), s_bad(4 * 3);
  std::vector<int32_t> wi(4 * 8);
  const MlxQuantParams p{32, 4};  // in = 8 words * 8 = 64 -> 2 groups
  auto W = TensorView::Contiguous(w.data(), DType::kU32, {4, 8});
  auto S = TensorView::Contiguous(s.data(), DType::kF32, {4, 2});
  auto bad =
      MlxLinear::FromViews("l", W, TensorView::Contiguous(s_bad.data(), DType::kF32, {4, 3}), S, p);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              HasSubstr("tensor 'l.scales': shape [4, 3] does not match weight 'l.weight' [4, 8] "
                        "with 4 bits and group_size 32 (expected [4, 2])"));
  auto bad_b =
      MlxLinear::FromViews("l", W, S, TensorView::Contiguous(s.data(), DType::kF32, {2, 4}), p);
  EXPECT_THAT(bad_b.status().message(), HasSubstr("tensor 'l.biases': shape [2, 4]"));
  auto bad_w =
      MlxLinear::FromViews("l", TensorView::Contiguous(wi.data(), DType::kI32, {4, 8}), S, S, p);
  EXPECT_THAT(bad_w.status().message(), HasSubstr("tensor 'l.weight': a quantized weight must be "
                                                  "2-D u32, got i32 [4, 8]"));
  auto bad_dt =
      MlxLinear::FromViews("l", W, TensorView::Contiguous(w.data(), DType::kU32, {4, 2}), S, p);
  EXPECT_THAT(bad_dt.status().message(), HasSubstr("tensor 'l.scales': dtype u32 is not f16"));
  auto bad_groups = MlxLinear::FromViews("l", TensorView::Contiguous(w.data(), DType::kU32, {4, 5}),
                                         S, S, p);  // in = 40
  EXPECT_THAT(bad_groups.status().message(),
              HasSubstr("40 packed 4-bit values per row are not a whole number of groups of 32"));
  auto bad_params = MlxLinear::FromViews("l", W, S, S, MlxQuantParams{16, 4});
  EXPECT_THAT(bad_params.status().message(), HasSubstr("group_size 16 is not supported"));
}

// An MLX model directory as mlx-lm lays it out, quantized with quant.h's
// QuantizeMlxRow: bind by module name and dequantize back within half a step.
TEST(MlxLinear, ModelDirectoryRoundTrip) {
  const fs::path dir = fs::path(::testing::TempDir()) / fmt::format("lumen_mlx_{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "config.json")
      << R"({"model_type": "llama", "quantization": {"group_size": 64, "bits": 4},
            "quantization_config": {"group_size": 64, "bits": 4}})";
  const int64_t out = 5, in = 192, gs = 64, bits = 4, groups = in / gs;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 0.05f);
  std::vector<float> w(out * in);
  for (auto& v : w) v = nd(rng);
  std::vector<uint32_t> packed(out * in * bits / 32);
  std::vector<float> scales(out * groups), biases(out * groups);
  for (int64_t r = 0; r < out; ++r)
    QuantizeMlxRow(&w[r * in], bits, gs, &packed[r * in * bits / 32], &scales[r * groups],
                   &biases[r * groups], in);
  std::vector<uint16_t> sh(scales.size()), bh(biases.size());
  for (size_t i = 0; i < scales.size(); ++i) {
    sh[i] = F32ToBF16(scales[i]);
    bh[i] = F32ToBF16(biases[i]);
  }
  SafetensorsWriter wr;
  const std::string m = "model.layers.0.mlp.up_proj";
  ASSERT_TRUE(wr.AddBorrowed(m + ".weight", DType::kU32, {out, in * bits / 32}, packed.data(),
                             packed.size() * 4)
                  .ok());
  ASSERT_TRUE(
      wr.AddBorrowed(m + ".scales", DType::kBF16, {out, groups}, sh.data(), sh.size() * 2).ok());
  ASSERT_TRUE(
      wr.AddBorrowed(m + ".biases", DType::kBF16, {out, groups}, bh.data(), bh.size() * 2).ok());
  ASSERT_TRUE(wr.Write((dir / "model.safetensors").string()).ok());

  auto d = HfModelDir::Open(dir.string());
  ASSERT_TRUE(d.ok()) << d.status().message();
  auto q = ParseMlxQuantization(d->config(), "config.json");
  ASSERT_TRUE(q.ok() && q->has_value()) << q.status().message();
  auto lin = MlxLinear::Bind(*d, m, *(*q)->For(m));
  ASSERT_TRUE(lin.ok()) << lin.status().message();
  EXPECT_EQ(lin->in_features, in);
  std::vector<float> row(in);
  for (int64_t r = 0; r < out; ++r) {
    lin->DequantizeRow(r, row.data());
    for (int64_t i = 0; i < in; ++i) {
      const int64_t g = r * groups + i / gs;
      const uint32_t qv = (packed[(r * in + i) / 8] >> (4 * ((r * in + i) % 8))) & 15;
      EXPECT_EQ(row[i], BF16ToF32(sh[g]) * float(qv) + BF16ToF32(bh[g]));
      // Quantization error: half a step, plus the bf16 rounding of scale and
      // bias (relative 2^-8 each, times at most 15 steps).
      const float step = scales[g];
      const float tol = 0.5f * step + std::ldexp(1.0f, -8) * (15 * step + std::fabs(biases[g]));
      EXPECT_NEAR(row[i], w[r * in + i], tol) << r << " " << i;
    }
  }
  auto missing = MlxLinear::Bind(*d, "model.layers.0.mlp.down_proj", {64, 4});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(),
              HasSubstr("tensor 'model.layers.0.mlp.down_proj.weight' is missing"));
  auto wrong_bits = MlxLinear::Bind(*d, m, {32, 4});
  EXPECT_THAT(wrong_bits.status().message(), HasSubstr("tensor '" + m + ".scales': shape [5, 3]"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lumen::formats
