// End to end on the embedded stories260K: KL(base || base) is 0, KL grows
// away from T = 1, diversity rises with temperature, and matching the entropy
// of a plain temperature recovers that temperature.
#include "lumen/eval/sampling_eval.h"

#include <gtest/gtest.h>

#include "lumen/engine/default_model.h"

namespace lumen::eval {
namespace {

class SamplingEval : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = engine::LoadDefaultModel();
    ASSERT_TRUE(m.ok()) << m.status().message();
    model_ = m->release();
    const std::vector<std::string> text = {"Once upon a time", "Lily saw a big dog",
                                           "The sun was hot and"};
    auto p = EncodePrompts(*model_, text);
    ASSERT_TRUE(p.ok());
    prompts_ = new std::vector<Seq>(*p);
  }
  static void TearDownTestSuite() {
    delete model_;
    delete prompts_;
  }
  static engine::Model* model_;
  static std::vector<Seq>* prompts_;
};
engine::Model* SamplingEval::model_ = nullptr;
std::vector<Seq>* SamplingEval::prompts_ = nullptr;

TEST_F(SamplingEval, KlOfBaseIsZeroAndGrowsAwayFromT1) {
  EvalOptions o;
  o.samples = 3;
  o.max_tokens = 16;
  auto rows = BaseForcedRows(*model_, *prompts_, o);
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  ASSERT_GT(rows->next.size(), 20u);
  sample::SamplerConfig base;
  auto f = Forced(*rows, base);
  ASSERT_TRUE(f.ok());
  // Only the float rounding of the two probability computations differs.
  EXPECT_LT(std::fabs(f->kl), 1e-6);
  EXPECT_EQ(f->inf_positions, 0);
  EXPECT_NEAR(f->entropy, f->base_entropy, 1e-5);
  sample::SamplerConfig cold;
  cold.temperature = 0.5;
  auto fc = Forced(*rows, cold);
  ASSERT_TRUE(fc.ok());
  EXPECT_GT(fc->kl, 0.01);
  EXPECT_LT(fc->entropy, f->entropy);
  sample::SamplerConfig topk;
  topk.top_k = 1;
  auto fk = Forced(*rows, topk);
  ASSERT_TRUE(fk.ok());
  EXPECT_EQ(fk->inf_positions, fk->tokens);  // top-1 drops mass the base gives
  // Matching a plain temperature's entropy finds that temperature.
  sample::SamplerConfig t08;
  t08.temperature = 0.8;
  auto m = MatchTemperature(*rows, t08);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_NEAR(m->temperature, 0.8, 5e-3);
}

TEST_F(SamplingEval, DiversityRisesWithTemperature) {
  EvalOptions o;
  o.samples = 6;
  o.max_tokens = 24;
  sample::SamplerConfig lo, hi;
  lo.temperature = 0.3;
  hi.temperature = 1.5;
  auto a = Diversity(*model_, *prompts_, lo, o);
  auto b = Diversity(*model_, *prompts_, hi, o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GT(b->distinct2, a->distinct2);
  EXPECT_GT(b->distinct1, a->distinct1);
  EXPECT_LT(b->self_bleu, a->self_bleu);
  EXPECT_GT(b->entropy, a->entropy);
  EXPECT_GT(b->nll, a->nll);  // hotter samples are less likely under the base model
  ASSERT_EQ(a->samples.size(), prompts_->size());
  ASSERT_EQ(a->samples[0].size(), 6u);
  // Same seed, same samples.
  auto a2 = Diversity(*model_, *prompts_, lo, o);
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ(a->samples, a2->samples);
  EXPECT_EQ(a->nll, a2->nll);
}

TEST(SamplingEvalErrors, BadPromptFile) {
  auto r = ReadPrompts("/nonexistent/prompts.txt");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/nonexistent/prompts.txt"), std::string::npos);
}

}  // namespace
}  // namespace lumen::eval
