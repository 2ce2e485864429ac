// Perplexity on the embedded stories260K against the float64 numpy reference
// (tests/goldens/perplexity/golden.json, written by
// tools/reference/perplexity_ref.py), for three strides; the window rule's
// invariants; KL to a base (itself: exactly 0 and agreement 1; its Q8_0
// convert: small KL, high agreement); and the errors a user can cause.
#include "lumen/eval/perplexity.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lumen/engine/convert.h"
#include "lumen/engine/default_model.h"

namespace lumen::eval {
namespace {

namespace fs = std::filesystem;

const std::string kGoldenDir = std::string(LUMEN_SOURCE_DIR) + "/tests/goldens/perplexity";

nlohmann::json Golden() {
  std::ifstream f(kGoldenDir + "/golden.json");
  return nlohmann::json::parse(f);
}

std::unique_ptr<engine::Model> Default() {
  auto m = engine::LoadDefaultModel();
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

TEST(Perplexity, MatchesTheNumpyReferenceForEveryStride) {
  auto m = Default();
  ASSERT_TRUE(m);
  const auto g = Golden();
  const auto ids = g["tokens"].get<std::vector<int32_t>>();
  // The golden's ids are what lumen's tokenizer makes of the golden's text.
  std::ifstream tf(kGoldenDir + "/text.txt");
  const std::string text((std::istreambuf_iterator<char>(tf)), std::istreambuf_iterator<char>());
  EXPECT_EQ(m->tokenizer().Encode(text, true), ids);
  ASSERT_EQ(g["cases"].size(), 3u);
  for (const auto& c : g["cases"]) {
    PerplexityOptions o{.ctx = c["ctx"], .stride = c["stride"], .kv_dtype = DType::kF32};
    auto r = Perplexity(*m, ids, o);
    ASSERT_TRUE(r.ok()) << r.status().message();
    SCOPED_TRACE("stride " + std::to_string(o.stride));
    EXPECT_EQ(r->windows, c["windows"].get<int64_t>());
    EXPECT_EQ(r->scored, c["scored"].get<int64_t>());
    // f32 forward vs float64: the mean NLL agrees to about 1e-6.
    EXPECT_NEAR(r->nll, c["nll"].get<double>(), 2e-5);
    EXPECT_NEAR(r->nll_se, c["nll_se"].get<double>(), 2e-5);
    EXPECT_NEAR(r->ppl, c["ppl"].get<double>(), 1e-4 * r->ppl);
    EXPECT_NEAR(r->ppl_se, c["ppl_se"].get<double>(), 1e-4 * r->ppl_se);
  }
}

TEST(Perplexity, StrideChangesContextNotTheTargetsAndBatchChangesNothing) {
  auto m = Default();
  ASSERT_TRUE(m);
  const auto ids = Golden()["tokens"].get<std::vector<int32_t>>();
  const int64_t n = static_cast<int64_t>(ids.size());
  auto half = Perplexity(*m, ids, {.ctx = 64, .kv_dtype = DType::kF32});
  auto disjoint = Perplexity(*m, ids, {.ctx = 64, .stride = 64, .kv_dtype = DType::kF32});
  auto one = Perplexity(*m, ids, {.ctx = 64, .batch = 1, .kv_dtype = DType::kF32});
  auto seven = Perplexity(*m, ids, {.ctx = 64, .batch = 7, .kv_dtype = DType::kF32});
  ASSERT_TRUE(half.ok() && disjoint.ok() && one.ok() && seven.ok());
  EXPECT_EQ(half->stride, 32);  // default: ctx / 2
  EXPECT_EQ(half->scored, n - 1);
  EXPECT_EQ(disjoint->windows, (n + 63) / 64);
  EXPECT_EQ(disjoint->scored, n - disjoint->windows);  // each window's first token is context
  EXPECT_EQ(half->windows, (n - 64 + 31) / 32 + 1);
  // More context per scored token predicts better on a coherent story.
  EXPECT_LT(half->ppl, disjoint->ppl);
  // One token per forward (decode kernels) vs chunks of 7 vs of 128: same numbers (L2).
  EXPECT_NEAR(one->nll, half->nll, 1e-5);
  EXPECT_NEAR(seven->nll, half->nll, 1e-5);
}

TEST(Perplexity, ProgressIsCalledOncePerWindowWithTheRunningResult) {
  auto m = Default();
  ASSERT_TRUE(m);
  const auto ids = Golden()["tokens"].get<std::vector<int32_t>>();
  std::vector<int64_t> done, scored;
  auto r = Perplexity(*m, ids, {.ctx = 128, .stride = 64}, nullptr,
                      [&](int64_t d, int64_t total, const PerplexityResult& run) {
                        EXPECT_EQ(total, 4);
                        done.push_back(d);
                        scored.push_back(run.scored);
                      });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(done, (std::vector<int64_t>{1, 2, 3, 4}));
  // Window 1 scores targets 1..127, then 64 each (128..191, 192..255), then 256..272.
  EXPECT_EQ(scored, (std::vector<int64_t>{127, 191, 255, 272}));
}

TEST(Perplexity, KlToItselfIsZeroAndToItsQ8ConvertSmall) {
  auto m = Default();
  ASSERT_TRUE(m);
  const auto ids = Golden()["tokens"].get<std::vector<int32_t>>();
  auto self = Perplexity(*m, ids, {.ctx = 128}, m.get());
  ASSERT_TRUE(self.ok()) << self.status().message();
  EXPECT_TRUE(self->has_base);
  EXPECT_EQ(self->kl_mean, 0.0);
  EXPECT_EQ(self->kl_max, 0.0);
  EXPECT_EQ(self->top1, 1.0);
  EXPECT_EQ(self->base_ppl, self->ppl);

  const fs::path path =
      fs::temp_directory_path() / ("lumen_ppl_q8_" + std::to_string(::getpid()) + ".gguf");
  ASSERT_TRUE(engine::ConvertModel(*m, engine::OutputFormat::kGguf, path, DType::kQ8_0).ok());
  auto q8 = engine::Model::Load(path);
  ASSERT_TRUE(q8.ok()) << q8.status().message();
  auto r = Perplexity(**q8, ids, {.ctx = 128}, m.get());
  fs::remove(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->base_ppl, self->ppl);  // the base is the f32 model
  EXPECT_GT(r->kl_mean, 0.0);
  EXPECT_LT(r->kl_mean, 2e-3);  // a wrong kernel gives KL of order 1
  EXPECT_LT(r->kl_max, 0.05);
  EXPECT_GE(r->top1, 0.95);
  EXPECT_NEAR(r->ppl, self->ppl, 0.02 * self->ppl);
}

TEST(Perplexity, BadInputGivesClearErrors) {
  auto m = Default();
  ASSERT_TRUE(m);
  const std::vector<int32_t> one = {1};
  auto r = Perplexity(*m, one, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("at least 2"), std::string::npos) << r.status().message();
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5};
  r = Perplexity(*m, ids, {.ctx = 4, .stride = 5});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--stride 5 exceeds --ctx 4"), std::string::npos);
  r = Perplexity(*m, ids, {.ctx = 1});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--ctx must be at least 2"), std::string::npos);
  const std::vector<int32_t> bad = {1, 2, 512};
  r = Perplexity(*m, bad, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("outside the vocabulary of 512"), std::string::npos);
}

}  // namespace
}  // namespace lumen::eval
