// The fit arithmetic against byte counts computed by hand for tiny-gemma3
// (3 layers: 0 and 1 slide with window 8, layer 2 is global; Hkv 2 x Dh 32 =
// 64 KV elements per row; D 64, H 4, F 96, V 512), the KvCache's own
// allocation, and the verdicts Fit draws from them.
#include "lumen/engine/fit.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "lumen/engine/synth.h"
#include "lumen/model/kv_cache.h"

namespace lumen::engine {
namespace {

namespace fs = std::filesystem;

model::ModelConfig Tiny(const std::string& name) {
  SynthOptions o;
  o.name = name;
  auto c = SynthConfig(o);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

TEST(Fit, KvBytesSaturateAtTheWindowAndFollowTheKvType) {
  const auto c = Tiny("tiny-gemma3");
  ASSERT_EQ(c.n_layers, 3);
  ASSERT_EQ(c.layer_sliding, (std::vector<bool>{true, true, false}));
  // ctx 512: sliding layers hold min(512, 8 + 256) = 264 rows, the global 512;
  // K and V; an f16 row is 64 * 2 = 128 bytes: 2 * (264 + 264 + 512) * 128.
  static_assert(model::kMaxChunk == 256);
  EXPECT_EQ(KvBytesPerSeq(c, DType::kF16, 512), 266240u);
  EXPECT_EQ(KvBytesPerSeq(c, DType::kF32, 512), 532480u);
  // q8_0: 2 blocks of 34 bytes per row.
  EXPECT_EQ(KvBytesPerSeq(c, DType::kQ8_0, 512), 2u * 1040 * 68);
  // At ctx 256 the rings are not yet smaller than the context: 2 * 768 * 128.
  EXPECT_EQ(KvBytesPerSeq(c, DType::kF16, 256), 196608u);
  // Below the ring size every layer holds ctx rows: 2 * 300 * 128.
  EXPECT_EQ(KvBytesPerSeq(c, DType::kF16, 100), 76800u);
  // The same as the cache lumen allocates.
  for (DType t : {DType::kF16, DType::kF32, DType::kQ8_0})
    for (int64_t ctx : {1, 100, 264, 265, 512}) {
      auto kv = model::KvCache::Create(c, ctx, t);
      ASSERT_TRUE(kv.ok());
      EXPECT_EQ(KvBytesPerSeq(c, t, ctx), kv->bytes()) << Name(t) << " ctx " << ctx;
    }
  // Growth per token: only the global layer, 2 * 128.
  EXPECT_EQ(KvBytesPerToken(c, DType::kF16), 256u);
  EXPECT_EQ(KvBytesPerSeq(c, DType::kF16, 1000) - KvBytesPerSeq(c, DType::kF16, 999), 256u);
  // tiny-llama has no sliding layer: 2 layers * 2 * (2 * 16 * 2 bytes).
  EXPECT_EQ(KvBytesPerToken(Tiny("tiny-llama"), DType::kF16), 256u);
  EXPECT_EQ(KvBytesPerSeq(Tiny("tiny-llama"), DType::kF16, 1000), 256000u);
}

TEST(Fit, KvReadAndTransientBytesByHand) {
  const auto c = Tiny("tiny-gemma3");
  // Position 0 reads one row per layer; position 99 reads 8 + 8 + 100 rows.
  EXPECT_EQ(KvReadBytes(c, DType::kF16, 0), 2u * 3 * 128);
  EXPECT_EQ(KvReadBytes(c, DType::kF16, 99), 2u * 116 * 128);
  // Activations: 256 tokens * 4 bytes * (2 * 64 + max(qkv + att = (128 + 128)
  // + 128, gate + up + out = 2 * 96 + 64)) = 524288 (a decode step's gate and
  // up, 8 * 2 * 96 floats, are less); partials 2 * 128 * 4 = 1024; scratch
  // 2 * (256 * 5 + 128) * 4 = 11264; logits 512 * 4 = 2048.
  // (A fused gate/up matrix writes a [T, 2F] gate: the same work buffer.)
  EXPECT_EQ(TransientBytesPerSeq(c, 2, 256), 538624u);
}

class FitModel : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = fs::temp_directory_path() / ("lumen_fit_" + std::to_string(::getpid()) + ".gguf");
    SynthOptions o;
    o.name = "tiny-gemma3";
    o.out = path_;
    ASSERT_TRUE(Synthesize(o).ok());
    LoadOptions lo;
    lo.threads = 2;
    auto m = Model::Load(path_, lo);
    ASSERT_TRUE(m.ok()) << m.status().message();
    model_ = std::move(m).value();
  }
  void TearDown() override { fs::remove(path_); }
  std::string path_;
  std::unique_ptr<Model> model_;
};

TEST_F(FitModel, FitsAtTheBoundaryAndFindsTheLargestContext) {
  const auto& c = model_->config();
  ASSERT_EQ(c.max_ctx, 256);
  auto big = Fit(*model_, {.ctx = 256, .parallel = 3, .budget_bytes = uint64_t(1) << 40});
  ASSERT_TRUE(big.ok()) << big.status().message();
  const uint64_t per_seq = 196608 + 538624;
  EXPECT_EQ(big->kv_bytes_per_seq, 196608u);
  EXPECT_EQ(big->transient_bytes_per_seq, 538624u);
  EXPECT_EQ(big->total_bytes, model_->weight_bytes() + 3 * per_seq);
  EXPECT_TRUE(big->fits);
  EXPECT_EQ(big->max_ctx, 256);

  // Exactly the total fits; one byte less does not, and the largest context
  // that fits is the one whose total is the last under the budget.
  auto edge = Fit(*model_, {.ctx = 256, .parallel = 3, .budget_bytes = big->total_bytes});
  ASSERT_TRUE(edge.ok());
  EXPECT_TRUE(edge->fits);
  EXPECT_EQ(edge->max_ctx, 256);
  auto under = Fit(*model_, {.ctx = 256, .parallel = 3, .budget_bytes = big->total_bytes - 1});
  ASSERT_TRUE(under.ok());
  EXPECT_FALSE(under->fits);
  EXPECT_EQ(under->max_ctx, 255);
  // A budget of the weights alone leaves no room for any context.
  auto none = Fit(*model_, {.ctx = 16, .budget_bytes = model_->weight_bytes()});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->fits);
  EXPECT_EQ(none->max_ctx, 0);
}

TEST_F(FitModel, PredictsDecodeSpeedFromBandwidth) {
  auto r = Fit(*model_, {.ctx = 100, .parallel = 4, .budget_bytes = 1 << 30, .bandwidth = 1e9});
  ASSERT_TRUE(r.ok());
  // f32 tiny model: every matrix once; the tied output is the embedding, so no extra row.
  EXPECT_GT(r->weight_bytes_per_token, 0u);
  const double w = double(r->weight_bytes_per_token);
  EXPECT_DOUBLE_EQ(r->decode_tok_s_start, 1e9 / (w + 768));
  EXPECT_DOUBLE_EQ(r->decode_tok_s_full, 1e9 / (w + 29696));
  EXPECT_DOUBLE_EQ(r->decode_tok_s_batch, 4e9 / (w + 4 * 29696.0));
  auto none = Fit(*model_, {.ctx = 100, .budget_bytes = 1 << 30});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->decode_tok_s_start, 0.0);
}

TEST_F(FitModel, BadInputGivesClearErrors) {
  auto r = Fit(*model_, {.ctx = 257});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--ctx 257 exceeds the model's context of 256"),
            std::string::npos)
      << r.status().message();
  r = Fit(*model_, {.parallel = 0});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--parallel must be at least 1"), std::string::npos);
  r = Fit(*model_, {.kv_dtype = DType::kQ4_0});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--kv-type must be"), std::string::npos);
}

TEST(Fit, BandwidthComesFromTheCacheKeyedByTheCpu) {
  const fs::path dir = fs::temp_directory_path() / ("lumen_fit_xdg_" + std::to_string(::getpid()));
  fs::create_directories(dir / "lumen");
  const char* old = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old ? old : "";
  ::setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  const std::string key = CpuModelName() + " / 3 threads";
  std::ofstream(dir / "lumen" / "membw.json")
      << "{\"" << key << "\": {\"bytes_per_s\": 12345000000.0}}";
  std::string source;
  auto bw = MachineBandwidth(3, /*remeasure=*/false, &source);
  if (old)
    ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  else
    ::unsetenv("XDG_CACHE_HOME");
  fs::remove_all(dir);
  ASSERT_TRUE(bw.ok()) << bw.status().message();
  EXPECT_EQ(*bw, 12345000000.0);
  EXPECT_NE(source.find("cached in " + (dir / "lumen" / "membw.json").string()), std::string::npos)
      << source;
}

}  // namespace
}  // namespace lumen::engine
