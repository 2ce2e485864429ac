// Session semantics on the embedded model: chunked appends, truncation and
// KV reuse give the logits of a fresh full prefill.
#include "lumen/engine/session.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "lumen/engine/chat.h"
#include "lumen/engine/default_model.h"
#include "lumen/engine/generate.h"
#include "lumen/engine/scheduler.h"
#include "lumen/kernels/matmul_bf16.h"

namespace lumen::engine {
namespace {

double MaxDiff(std::span<const float> a, std::span<const float> b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::abs(a[i] - b[i])));
  return d;
}

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = LoadDefaultModel();
    ASSERT_TRUE(m.ok()) << m.status().message();
    model_ = std::move(*m);
  }
  std::unique_ptr<Session> NewSession(int64_t ctx = 256) {
    SessionOptions o;
    o.ctx = ctx;
    o.kv_dtype = DType::kF32;
    auto s = Session::Create(*model_, o);
    EXPECT_TRUE(s.ok());
    return std::move(*s);
  }
  std::unique_ptr<Model> model_;
};

TEST_F(SessionTest, PiecewiseAppendEqualsOneAppend) {
  const auto ids = model_->tokenizer().Encode("Once upon a time, there was a little dog.", true);
  auto one = NewSession();
  ASSERT_TRUE(one->Append(ids).ok());
  auto parts = NewSession();
  ASSERT_TRUE(parts->Append(std::span(ids).first(3)).ok());
  for (size_t i = 3; i < ids.size(); ++i) ASSERT_TRUE(parts->Append(std::span(&ids[i], 1)).ok());
  // Same arithmetic per row except the matmul's summation order (the first
  // 3 tokens and the single ones take the dot form, M <= 4; the whole prompt
  // the GEMM, one f32 chain of K terms per output): L2, measured 1.14e-5 on
  // logits near 20, bound 3e-5 (16 ulp).
  EXPECT_LE(MaxDiff(one->logits(), parts->logits()), 3e-5);
}

TEST_F(SessionTest, TruncateAndReappendReusesThePrefix) {
  const auto a = model_->tokenizer().Encode("Once upon a time, there was a cat.", true);
  const auto b = model_->tokenizer().Encode("Once upon a time, there was a big tree.", true);
  size_t common = 0;
  while (a[common] == b[common]) ++common;
  ASSERT_GT(common, 3u);
  auto s = NewSession();
  ASSERT_TRUE(s->Append(a).ok());
  EXPECT_EQ(s->Truncate(common), int64_t(common));
  ASSERT_TRUE(s->Append(std::span(b).subspan(common)).ok());
  auto fresh = NewSession();
  ASSERT_TRUE(fresh->Append(b).ok());
  EXPECT_LE(MaxDiff(s->logits(), fresh->logits()), 1e-5);
  EXPECT_EQ(s->tokens(), fresh->tokens());
}

TEST_F(SessionTest, PromptOverContextIsAnErrorNamingTheSizes) {
  auto s = NewSession(4);
  const auto ids = model_->tokenizer().Encode("Once upon a time, there was", true);
  Status st = s->Append(ids);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("context size 4"), std::string::npos) << st.message();
  EXPECT_TRUE(s->tokens().empty());  // nothing half-appended
}

// On a route whose arithmetic depends on a product's row count (bf16 above 4
// rows, the exact dot form at 4 or fewer) a position recomputed alone rounds
// differently from the same position inside a prefill chunk. Keeping whole
// chunks (the prompt cache's rule, RestoreLength) and appending the rest from
// there gives the fresh prefill's logits bit for bit.
TEST_F(SessionTest, WholeChunksGiveTheFreshPrefillBits) {
  // bf16 where the CPU has it, else the exact route, whose products also
  // round by row count (the dot form at 4 rows or fewer, panels above).
  LoadOptions lo;
  lo.act_route = kernels::CpuHasBf16() ? kernels::ActRoute::kBf16 : kernels::ActRoute::kExact;
  auto m = LoadDefaultModel(lo);
  ASSERT_TRUE(m.ok()) << m.status().message();
  std::vector<int32_t> ids;
  while (ids.size() < 300) {
    const auto more = (*m)->tokenizer().Encode(
        "Once upon a time, there was a little dog named Max. He liked to run in the park. ", false);
    ids.insert(ids.end(), more.begin(), more.end());
  }
  ids.resize(300);  // chunks [0, 256), [256, 300)
  auto fresh = [&] {
    SessionOptions o;
    o.ctx = 512;
    o.kv_dtype = DType::kF32;
    auto s = Session::Create(**m, o);
    EXPECT_TRUE(s.ok());
    return std::move(*s);
  };
  auto bytes = [](std::span<const float> v) { return std::vector<float>(v.begin(), v.end()); };
  auto cold = fresh();
  ASSERT_TRUE(cold->Append(ids).ok());
  EXPECT_EQ(cold->whole_chunks(), 256);
  const std::vector<float> want = bytes(cold->logits());

  // The same prompt again: 256 tokens kept, 44 appended as the cold run did.
  auto warm = fresh();
  ASSERT_TRUE(warm->Append(ids).ok());
  const int64_t keep = RestoreLength(300, 300, warm->whole_chunks(), /*row_dependent=*/true);
  ASSERT_EQ(keep, 256);
  EXPECT_EQ(warm->Truncate(keep), 256);
  ASSERT_TRUE(warm->Append(std::span(ids).subspan(256)).ok());
  EXPECT_EQ(warm->whole_chunks(), 256);
  const std::vector<float> got = bytes(warm->logits());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);

  // The exact route's rule (all but the last token) recomputes that token
  // alone, in the dot form: other bits, which is why the rule differs.
  auto naive = fresh();
  ASSERT_TRUE(naive->Append(ids).ok());
  EXPECT_EQ(naive->Truncate(RestoreLength(300, 300, naive->whole_chunks(), false)), 299);
  EXPECT_EQ(naive->whole_chunks(), 256);
  ASSERT_TRUE(naive->Append(std::span(ids).subspan(299)).ok());
  const std::vector<float> other = bytes(naive->logits());
  EXPECT_NE(std::memcmp(other.data(), want.data(), want.size() * sizeof(float)), 0);
  EXPECT_LE(MaxDiff(other, want), 0.1);  // the same distribution, within the route's bound
}

TEST_F(SessionTest, GenerateStopsAtStopStringAndMaxTokens) {
  auto s = NewSession();
  sample::SamplerConfig greedy;
  greedy.temperature = 0;
  auto sampler = sample::Sampler::Create(greedy);
  ASSERT_TRUE(sampler.ok()) << sampler.status().message();
  const auto ids = model_->tokenizer().Encode("Once upon a time", true);
  GenerateOptions g;
  g.max_tokens = 50;
  g.stop = {"Lily"};
  std::string streamed;
  auto r = Generate(*s, *sampler, ids, g, [&](std::string_view t) {
    streamed += t;
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->finish, FinishReason::kStop);
  EXPECT_EQ(streamed, ", there was a little girl named ");
  EXPECT_EQ(r->text, streamed);

  auto s2 = NewSession();
  g.stop.clear();
  g.max_tokens = 7;
  auto r2 = Generate(*s2, *sampler, ids, g, nullptr);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->finish, FinishReason::kLength);
  EXPECT_EQ(r2->tokens.size(), 7u);
}

// The first generated token keeps its leading space ("Once upon a" + " time").
TEST_F(SessionTest, ContinuationKeepsLeadingSpace) {
  auto s = NewSession();
  sample::SamplerConfig greedy;
  greedy.temperature = 0;
  auto sampler = sample::Sampler::Create(greedy);
  ASSERT_TRUE(sampler.ok());
  GenerateOptions g;
  g.max_tokens = 1;
  auto r = Generate(*s, *sampler, model_->tokenizer().Encode("Once upon a", true), g, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->text, " time");
}

// Byte-fallback pieces: an unfinished character is held back, but bytes that
// can never become valid UTF-8 go out at once as U+FFFD.
TEST_F(SessionTest, StreamingDetokenizerHoldsOnlyUnfinishedCharacters) {
  const tokenize::Tokenizer& tok = model_->tokenizer();
  auto byte = [&](int b) {
    auto id = tok.TokenId(fmt::format("<0x{:02X}>", b));
    EXPECT_TRUE(id.has_value());
    return id.value_or(0);
  };
  tokenize::StreamingDetokenizer d(tok);
  EXPECT_EQ(d.Push(byte(0xE2)), "");
  EXPECT_EQ(d.Push(byte(0x82)), "");
  EXPECT_EQ(d.Push(byte(0xAC)), "\xE2\x82\xAC");  // the euro sign, complete
  EXPECT_EQ(d.Push(byte(0x82)), "\xEF\xBF\xBD");  // orphan continuation: final
  EXPECT_EQ(d.Push(byte(0xE2)), "");
  EXPECT_EQ(d.Push(byte(0x41)),
            "\xEF\xBF\xBD"
            "A");  // the lead can no longer complete
  EXPECT_EQ(d.Push(byte(0xF0)), "");
  EXPECT_EQ(d.Flush(), "\xEF\xBF\xBD");
}

TEST_F(SessionTest, FallbackChatTemplateRendersTurns) {
  auto f = ChatFormatter::Create(*model_);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_TRUE(f->is_fallback());
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  msgs.push_back({{"role", "user"}, {"content", "Hi"}});
  auto text = f->Render(msgs, nullptr, true, nlohmann::ordered_json::object());
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text, "<s>user: Hi\nassistant:");
}

// The serve default context: the model's when every slot's KV cache fits in
// a quarter of available memory, else what fits (multiples of 256), with a floor.
TEST(AutoContext, FromTheModelAndMemory) {
  model::ModelConfig c;
  c.n_layers = 16;
  c.n_kv_heads = 8;
  c.head_dim = 64;
  c.max_ctx = 131072;
  const uint64_t per_pos = 2 * 16 * 8 * 64 * 2;  // f16 K and V rows: 32 KiB
  const uint64_t gib = uint64_t(1) << 30;
  // 64 GiB: a quarter is 16 GiB, 4 slots of 4 GiB = 131072 positions each.
  EXPECT_EQ(AutoContext(c, DType::kF16, 4, 64 * gib), 131072);
  // 8 GiB: 512 MiB per slot -> 16384 positions.
  EXPECT_EQ(AutoContext(c, DType::kF16, 4, 8 * gib), int64_t(8 * gib / 4 / 4 / per_pos));
  EXPECT_EQ(AutoContext(c, DType::kF16, 4, 8 * gib), 16384);
  // f32 KV halves it; q8_0 roughly doubles it (34 bytes per 32 values).
  EXPECT_EQ(AutoContext(c, DType::kF32, 4, 8 * gib), 8192);
  EXPECT_EQ(AutoContext(c, DType::kQ8_0, 4, 8 * gib), 30720);
  // Rounded down to 256; never below min(model's, 2048).
  EXPECT_EQ(AutoContext(c, DType::kF16, 1, 40 * per_pos * 1000 + 7) % 256, 0);
  EXPECT_EQ(AutoContext(c, DType::kF16, 16, 64ull << 20), kMinAutoCtx);
  // A small model keeps its own context; unknown memory: at most 8192.
  c.max_ctx = 512;
  EXPECT_EQ(AutoContext(c, DType::kF16, 4, 64ull << 20), 512);
  c.max_ctx = 40960;
  EXPECT_EQ(AutoContext(c, DType::kF16, 4, 0), kUnknownMemCtx);
}

}  // namespace
}  // namespace lumen::engine
