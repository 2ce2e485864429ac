// Embeddings on synth embedding models (tiny-qwen3: GQA, q/k norms, a
// sliding-window layer) against the float64 numpy reference
// (tests/goldens/embed/golden.json, tools/reference/embed_ref.py) for last
// and mean pooling; the batched route against one input at a time (L1, bit
// for bit); GGUF pooling_type and HF sentence-transformers recognition; the
// errors a user can cause.
#include "lumen/engine/embed.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "lumen/engine/default_model.h"
#include "lumen/engine/synth.h"

namespace lumen::engine {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<std::vector<int32_t>>;

const std::string kGoldenDir = std::string(LUMEN_SOURCE_DIR) + "/tests/goldens/embed";

fs::path Tmp(const std::string& tag) {
  const fs::path d =
      fs::temp_directory_path() / ("lumen_embed_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

std::unique_ptr<Model> SynthEmbed(const std::string& pooling, OutputFormat format,
                                  const fs::path& out) {
  SynthOptions o;
  o.name = "tiny-qwen3";
  o.out = out.string();
  o.format = format;
  o.pooling = *model::ParsePooling(pooling);
  Status s = Synthesize(o);
  EXPECT_TRUE(s.ok()) << s.message();
  LoadOptions lo;
  lo.threads = 1;
  auto m = Model::Load(out.string(), lo);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

nlohmann::json Golden() {
  std::ifstream f(kGoldenDir + "/golden.json");
  return nlohmann::json::parse(f);
}

std::vector<std::vector<int32_t>> Inputs(const nlohmann::json& g) {
  return g["inputs"].get<std::vector<std::vector<int32_t>>>();
}

TEST(Embed, MatchesTheNumpyReferenceForLastAndMeanPooling) {
  const auto g = Golden();
  const auto inputs = Inputs(g);
  ASSERT_EQ(g["cases"].size(), 2u);
  for (const auto& c : g["cases"]) {
    const std::string pooling = c["pooling"];
    SCOPED_TRACE(pooling);
    const fs::path dir = Tmp(pooling);
    auto m = SynthEmbed(pooling, OutputFormat::kHf, dir);
    ASSERT_TRUE(m);
    EXPECT_EQ(PoolingName(m->config().pooling), pooling);
    auto e = Embedder::Create(*m, m->pool());
    ASSERT_TRUE(e.ok()) << e.status().message();
    auto v = (*e)->Embed(inputs, 512);
    ASSERT_TRUE(v.ok()) << v.status().message();
    ASSERT_EQ(v->size(), inputs.size());
    double worst = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto want = c["embeddings"][i].get<std::vector<double>>();
      ASSERT_EQ((*v)[i].size(), want.size());
      double norm = 0;
      for (size_t d = 0; d < want.size(); ++d) {
        worst = std::max(worst, std::abs(double((*v)[i][d]) - want[d]));
        norm += double((*v)[i][d]) * (*v)[i][d];
      }
      EXPECT_NEAR(norm, 1.0, 1e-6) << "input " << i;
    }
    // f32 forward against float64 on unit vectors of D = 64: observed ~1e-7.
    EXPECT_LT(worst, 2e-6);
    fs::remove_all(dir);
  }
}

TEST(Embed, BatchedEqualsOneAtATimeBitForBit) {
  const fs::path dir = Tmp("batch");
  auto m = SynthEmbed("mean", OutputFormat::kHf, dir);
  ASSERT_TRUE(m);
  auto inputs = Inputs(Golden());
  // More inputs than fit one step, and one long one crossing chunks.
  for (int r = 0; r < 3; ++r)
    for (size_t i = 0; i < 7; ++i) inputs.push_back(inputs[i]);
  for (int threads : {1, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    ThreadPool pool(threads);
    auto e = Embedder::Create(*m, &pool);
    ASSERT_TRUE(e.ok());
    auto batched = (*e)->Embed(inputs, 512, /*batched=*/true);
    auto single = (*e)->Embed(inputs, 512, /*batched=*/false);
    ASSERT_TRUE(batched.ok() && single.ok());
    for (size_t i = 0; i < inputs.size(); ++i)
      ASSERT_EQ(std::memcmp((*batched)[i].data(), (*single)[i].data(),
                            (*single)[i].size() * sizeof(float)),
                0)
          << "input " << i;
    // Repeated inputs give the same vector wherever they sit in the batch.
    EXPECT_EQ((*batched)[0], (*batched)[7]);
  }
  fs::remove_all(dir);
}

TEST(Embed, GgufPoolingTypeIsRecognisedAndAgreesWithHf) {
  const fs::path hf = Tmp("hf"), gguf = Tmp("gguf");
  auto a = SynthEmbed("last", OutputFormat::kHf, hf);
  fs::create_directories(gguf);
  auto b = SynthEmbed("last", OutputFormat::kGguf, gguf / "m.gguf");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(b->config().pooling, model::Pooling::kLast);
  const auto inputs = Inputs(Golden());
  auto ea = Embedder::Create(*a, a->pool());
  auto eb = Embedder::Create(*b, b->pool());
  ASSERT_TRUE(ea.ok() && eb.ok());
  auto va = (*ea)->Embed(inputs, 512), vb = (*eb)->Embed(inputs, 512);
  ASSERT_TRUE(va.ok() && vb.ok());
  for (size_t i = 0; i < inputs.size(); ++i)
    for (size_t d = 0; d < (*va)[i].size(); ++d)
      EXPECT_NEAR((*va)[i][d], (*vb)[i][d], 1e-5) << i << "," << d;
  fs::remove_all(hf);
  fs::remove_all(gguf);
}

TEST(Embed, TruncateNormalizedKeepsAPrefixOfUnitNorm) {
  std::vector<float> v = {3, 4, 12};
  TruncateNormalized(v, 2);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_FLOAT_EQ(v[0], 0.6f);
  EXPECT_FLOAT_EQ(v[1], 0.8f);
}

TEST(Embed, ErrorsNameTheProblem) {
  auto def = LoadDefaultModel();
  ASSERT_TRUE(def.ok());
  auto not_embed = Embedder::Create(**def, (*def)->pool());
  ASSERT_FALSE(not_embed.ok());
  EXPECT_NE(not_embed.status().message().find("is not an embedding model"), std::string::npos);

  const fs::path dir = Tmp("err");
  auto m = SynthEmbed("cls", OutputFormat::kHf, dir);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->config().pooling, model::Pooling::kCls);
  auto e = Embedder::Create(*m, m->pool());
  ASSERT_TRUE(e.ok());
  auto empty = (*e)->Embed(Ids{{1, 2}, {}}, 512);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().message(), "input[1]: no tokens");
  auto longer = (*e)->Embed(Ids{{1, 2, 3, 4}}, 3);
  ASSERT_FALSE(longer.ok());
  EXPECT_NE(longer.status().message().find("input[0]: 4 tokens, more than the context of 3"),
            std::string::npos);
  auto bad = (*e)->Embed(Ids{{1, 9999}}, 512);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("input[0][1]: token id 9999"), std::string::npos);
  // An unsupported sentence-transformers mode is named.
  std::ofstream(dir / "1_Pooling" / "config.json")
      << R"({"pooling_mode_max_tokens": true, "pooling_mode_mean_tokens": false})";
  auto r = ReadSentenceTransformersPooling(dir.string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("pooling_mode_max_tokens is not supported"),
            std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lumen::engine
