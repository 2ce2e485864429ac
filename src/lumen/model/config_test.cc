// ModelConfig from HF config.json and GGUF metadata: the HF class defaults for
// absent keys, the sliding-layer rules and llama.cpp's fallbacks for what GGUF
// does not carry (docs/design/families.md sections 2, 4 and 8).
#include "lumen/model/config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include <unistd.h>

namespace lumen::model {
namespace {

using nlohmann::json;

json Base(const char* type, int layers = 2) {
  return {{"model_type", type},       {"num_hidden_layers", layers}, {"hidden_size", 64},
          {"num_attention_heads", 4}, {"intermediate_size", 96},     {"vocab_size", 320}};
}

ModelConfig MustParse(const json& j) {
  auto c = ConfigFromHf(j);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : ModelConfig{};
}

TEST(ConfigFromHf, Gemma2SoftcapsDefaultTo50And30NullIsOff) {
  ModelConfig c = MustParse(Base("gemma2"));
  EXPECT_EQ(c.attn_softcap, 50.0f);
  EXPECT_EQ(c.final_softcap, 30.0f);
  EXPECT_EQ(c.head_dim, 256);                                    // class default
  EXPECT_FLOAT_EQ(c.attn_scale, 1.0f / 16.0f);                   // query_pre_attn_scalar 256
  EXPECT_EQ(c.sliding_window, 4096);                             // class default
  EXPECT_EQ(c.layer_sliding, (std::vector<bool>{true, false}));  // even layers slide
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_TRUE(c.embed_scale_in_weight_dtype);
  json j = Base("gemma2");
  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = nullptr;
  c = MustParse(j);
  EXPECT_EQ(c.attn_softcap, 0.0f);
  EXPECT_EQ(c.final_softcap, 0.0f);
  c = MustParse(Base("gemma3_text"));
  EXPECT_EQ(c.attn_softcap, 0.0f);
  EXPECT_EQ(c.final_softcap, 0.0f);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_theta_local, 1e4);
}

TEST(ConfigFromHf, MistralWindowDefaults4096NullIsOff) {
  ModelConfig c = MustParse(Base("mistral"));
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.layer_sliding, (std::vector<bool>{true, true}));
  json j = Base("mistral");
  j["sliding_window"] = nullptr;
  c = MustParse(j);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.layer_sliding, (std::vector<bool>{false, false}));
}

TEST(ConfigFromHf, EpsDefaultsPerFamily) {
  EXPECT_EQ(MustParse(Base("llama")).norm_eps, 1e-6f);
  json phi = Base("phi3");
  EXPECT_EQ(MustParse(phi).norm_eps, 1e-5f);
  EXPECT_EQ(MustParse(Base("qwen3")).head_dim, 128);
}

TEST(ConfigFromHf, QwenSlidesOnlyFromMaxWindowLayers) {
  json j = Base("qwen2", 30);
  j["sliding_window"] = 16;
  ModelConfig c = MustParse(j);  // use_sliding_window absent: off
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(std::count(c.layer_sliding.begin(), c.layer_sliding.end(), true), 0);
  j["use_sliding_window"] = true;
  c = MustParse(j);  // max_window_layers default 28: layers 28, 29 slide
  EXPECT_EQ(c.sliding_window, 16);
  for (int i = 0; i < 30; ++i) EXPECT_EQ(c.layer_sliding[i], i >= 28) << i;
  j["layer_types"] = json::array();
  for (int i = 0; i < 30; ++i)
    j["layer_types"].push_back(i == 3 ? "sliding_attention" : "full_attention");
  c = MustParse(j);  // layer_types wins
  for (int i = 0; i < 30; ++i) EXPECT_EQ(c.layer_sliding[i], i == 3) << i;
}

TEST(ConfigFromHf, ErrorsNameTheKey) {
  json j = Base("minicpm");
  j["tie_word_embeddings"] = true;
  auto c = ConfigFromHf(j);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("scale_emb"), std::string::npos) << c.status().message();
  c = ConfigFromHf(Base("falcon"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("falcon"), std::string::npos);
  j = Base("llama");
  j["rope_scaling"] = {{"rope_type", "longrope"}};
  c = ConfigFromHf(j);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("longrope"), std::string::npos);
  j = Base("llama");
  j.erase("hidden_size");
  c = ConfigFromHf(j);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("hidden_size"), std::string::npos);
}

TEST(ConfigFromHf, YarnAttentionFactorFromMscale) {
  json j = Base("llama");
  j["max_position_embeddings"] = 4096;
  j["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 1024}};
  ModelConfig c = MustParse(j);
  EXPECT_NEAR(c.rope_scaling.attention_factor, 0.1 * std::log(4.0) + 1.0, 1e-12);
  j["rope_scaling"]["mscale"] = 1.0;
  j["rope_scaling"]["mscale_all_dim"] = 0.5;
  c = MustParse(j);
  EXPECT_NEAR(c.rope_scaling.attention_factor,
              (0.1 * std::log(4.0) + 1.0) / (0.05 * std::log(4.0) + 1.0), 1e-12);
}

// Writes `c` as GGUF metadata (optionally dropping lumen-only keys, as a
// llama.cpp file would lack them) and reads it back.
Result<ModelConfig> ViaGguf(const ModelConfig& c, const std::vector<std::string>& drop = {}) {
  formats::GgufWriter w;
  ConfigToGguf(c, w);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("lumen_config_test_" + std::to_string(::getpid()) + ".gguf"))
                               .string();
  LUMEN_RETURN_IF_ERROR(w.Write(path));
  if (!drop.empty()) {  // rewrite without the dropped keys
    LUMEN_ASSIGN_OR_RETURN(formats::GgufFile g, formats::GgufFile::Open(path));
    formats::GgufWriter w2;
    for (const auto& [key, value] : g.metadata()) {
      bool keep = true;
      for (const auto& d : drop) keep = keep && !key.ends_with("." + d);
      if (keep) w2.SetValue(key, value);
    }
    LUMEN_RETURN_IF_ERROR(w2.Write(path + ".2"));
    std::filesystem::rename(path + ".2", path);
  }
  LUMEN_ASSIGN_OR_RETURN(formats::GgufFile g, formats::GgufFile::Open(path));
  auto r = ConfigFromGguf(g);
  std::filesystem::remove(path);
  return r;
}

TEST(ConfigFromGguf, RoundTripsSlidingLayersAndGemmaKeys) {
  json j = Base("qwen3", 4);
  j["use_sliding_window"] = true;
  j["sliding_window"] = 8;
  j["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
  ModelConfig c = MustParse(j);
  auto r = ViaGguf(c);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->layer_sliding, c.layer_sliding);
  EXPECT_EQ(r->sliding_window, 8);

  json gj = Base("gemma2", 4);
  gj["query_pre_attn_scalar"] = 24;
  gj["attn_logit_softcapping"] = nullptr;
  c = MustParse(gj);
  r = ViaGguf(c);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FLOAT_EQ(r->attn_scale, c.attn_scale);
  EXPECT_EQ(r->attn_softcap, 0.0f);  // written as 0, not defaulted back to 50
  EXPECT_EQ(r->final_softcap, 30.0f);
  EXPECT_EQ(r->layer_sliding, c.layer_sliding);
}

// A llama.cpp Gemma GGUF has no query_pre_attn_scalar and no pattern key:
// 1/sqrt(head_dim), or 1/sqrt(D/H) for the 27B layer counts; pattern 2 / 6.
TEST(ConfigFromGguf, GemmaFallbacksWithoutLumenKeys) {
  json j = Base("gemma3_text", 12);
  j["head_dim"] = 32;
  j["query_pre_attn_scalar"] = 24;
  j["sliding_window"] = 16;
  j["layer_types"] = json::array();
  for (int i = 0; i < 12; ++i)
    j["layer_types"].push_back((i + 1) % 6 ? "sliding_attention" : "full_attention");
  ModelConfig c = MustParse(j);
  c.attn_scale = float(1 / std::sqrt(24.0));
  auto r = ViaGguf(c);  // lumen file: pattern 6 is llama.cpp's own, so no key is written
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FLOAT_EQ(r->attn_scale, c.attn_scale);
  EXPECT_EQ(r->layer_sliding, c.layer_sliding);
  r = ViaGguf(c, {"attention.query_pre_attn_scalar", "attention.sliding_window_pattern"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FLOAT_EQ(r->attn_scale, float(1 / std::sqrt(32.0)));  // 1/sqrt(head_dim)
  EXPECT_EQ(r->layer_sliding, c.layer_sliding);                // pattern 6
  json big = Base("gemma2", 46);
  big["num_attention_heads"] = 2;  // D/H = 32 != head_dim 256
  c = MustParse(big);
  r = ViaGguf(c, {"attention.query_pre_attn_scalar"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FLOAT_EQ(r->attn_scale, float(1 / std::sqrt(32.0)));  // the 27B rule
  for (int i = 0; i < 46; ++i) EXPECT_EQ(r->layer_sliding[i], i % 2 == 0) << i;
}

}  // namespace
}  // namespace lumen::model

namespace lumen::model {
namespace {

// llama.cpp's converter stores minicpm.logit_scale = hidden_size / dim_model_base
// (a divisor); lumen writes and reads the same convention.
TEST(ConfigFromGguf, MiniCpmLogitScaleIsLlamaCppsDivisor) {
  nlohmann::json j = Base("minicpm");
  j["scale_emb"] = 12;
  j["scale_depth"] = 1.4;
  j["dim_model_base"] = 16;
  j["tie_word_embeddings"] = true;
  ModelConfig c = MustParse(j);
  EXPECT_FLOAT_EQ(c.logit_scale, 0.25f);
  formats::GgufWriter w;
  ConfigToGguf(c, w);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("lumen_config_minicpm_" + std::to_string(::getpid()) + ".gguf"))
                               .string();
  ASSERT_TRUE(w.Write(path).ok());
  auto g = formats::GgufFile::Open(path);
  ASSERT_TRUE(g.ok());
  EXPECT_FLOAT_EQ(float(*g->GetFloat("minicpm.logit_scale")), 4.0f);  // 64 / 16
  auto r = ConfigFromGguf(*g);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FLOAT_EQ(r->logit_scale, 0.25f);
  EXPECT_FLOAT_EQ(r->embed_scale, 12.0f);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace lumen::model
