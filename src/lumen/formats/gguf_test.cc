// GGUF reader/writer tests: real fixtures (facts from their READMEs and an
// independent Python parse), exact write->read round trips, and bad input.
#include "lumen/formats/gguf.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "lumen/core/half.h"

namespace lumen::formats {
namespace {

using ::testing::HasSubstr;

std::string FixturesDir() {
  if (const char* env = std::getenv("LUMEN_FIXTURES")) return env;
  return std::string(LUMEN_SOURCE_DIR) + "/../shared/fixtures";
}

std::string FixturePath(const std::string& rel) { return FixturesDir() + "/" + rel; }

#define SKIP_IF_MISSING(path) \
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "fixture not found: " << (path)

float F16At(const TensorView& v, int64_t i) { return F16ToF32(v.as<const uint16_t>()[i]); }
float F32At(const TensorView& v, int64_t i) { return v.as<const float>()[i]; }

TEST(GgufFixture, LlamaTinyRandomF16) {
  const std::string path = FixturePath("llama-2-tiny-random-gguf/llama-2-tiny-random.gguf");
  SKIP_IF_MISSING(path);
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->data_offset(), 724416u);
  EXPECT_EQ(f->metadata().size(), 18u);
  ASSERT_EQ(f->tensors().size(), 12u);

  EXPECT_EQ(*f->GetString("general.architecture"), "llama");
  EXPECT_EQ(*f->GetString("general.name"), "LLaMA v2");
  EXPECT_EQ(*f->GetInt("general.file_type"), 1);
  EXPECT_EQ(*f->GetInt("llama.context_length"), 4096);
  EXPECT_EQ(*f->GetInt("llama.embedding_length"), 8);
  EXPECT_EQ(*f->GetInt("llama.block_count"), 1);
  EXPECT_EQ(*f->GetInt("llama.feed_forward_length"), 32);
  EXPECT_EQ(*f->GetInt("llama.rope.dimension_count"), 4);
  EXPECT_EQ(*f->GetInt("llama.attention.head_count"), 2);
  EXPECT_EQ(*f->GetInt("llama.attention.head_count_kv"), 2);
  EXPECT_FLOAT_EQ(static_cast<float>(*f->GetFloat("llama.attention.layer_norm_rms_epsilon")),
                  1e-5f);
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.unknown_token_id"), 0);
  EXPECT_EQ(*f->GetFloat("llama.rope.freq_base", 10000.0), 10000.0);  // absent -> default
  EXPECT_FALSE(f->GetInt("general.name").ok());                       // wrong type

  const GgufValue* tokens = f->Find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  ASSERT_EQ(tokens->type, GgufType::kArray);
  EXPECT_EQ(tokens->array_type, GgufType::kString);
  ASSERT_EQ(tokens->AsArray()->size(), 32000u);
  EXPECT_EQ(*(*tokens->AsArray())[1].AsString(), "<s>");
  EXPECT_EQ(*tokens->AsArray()->back().AsString(), "\xe7\xbb\x99");  // U+7ED9
  const auto& types = *f->Find("tokenizer.ggml.token_type")->AsArray();
  int counts[7] = {};
  for (const auto& t : types) counts[*t.AsInt()]++;
  EXPECT_EQ(counts[1], 31741);
  EXPECT_EQ(counts[6], 256);
  EXPECT_EQ(counts[3], 2);
  EXPECT_EQ(counts[2], 1);
  EXPECT_EQ(*f->Find("tokenizer.ggml.scores")->AsArray()->back().AsFloat(), -31740.0);

  const GgufTensorInfo* emb = f->FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dtype, DType::kF16);
  EXPECT_EQ(emb->ne, (std::vector<int64_t>{8, 32000}));
  EXPECT_EQ(emb->view.ShapeString(), "[32000, 8]");
  EXPECT_EQ(emb->nbytes, 8u * 32000 * 2);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(F16At(emb->view, i), 0.0f);  // row 0 is all zeros
  EXPECT_EQ(F16At(emb->view, 8), 0.034088134765625f);
  EXPECT_EQ(F16At(emb->view, 9), 0.0158843994140625f);

  const GgufTensorInfo* down = f->FindTensor("blk.0.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->ne, (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(down->view.ShapeString(), "[8, 32]");
  EXPECT_EQ(down->offset, 513536u);
  EXPECT_EQ(F16At(down->view, 0), 0.0207366943359375f);
  EXPECT_EQ(F16At(down->view, 32), -0.002490997314453125f);  // row 1

  const GgufTensorInfo* q = f->FindTensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(F16At(q->view, 0), 0.024261474609375f);
  EXPECT_EQ(F16At(q->view, 2), -0.0509033203125f);

  const GgufTensorInfo* norm = f->FindTensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->dtype, DType::kF32);
  EXPECT_EQ(norm->view.ndim, 1);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(F32At(norm->view, i), 1.0f);

  const GgufTensorInfo* out = f->FindTensor("output.weight");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->offset, 514144u);
  EXPECT_EQ(F16At(out->view, 1), 0.03363037109375f);
  EXPECT_EQ(f->tensors().back().name, "output.weight");
}

TEST(GgufFixture, Stories260KF32) {
  const std::string path = FixturePath("stories260K-gguf/stories260K.gguf");
  SKIP_IF_MISSING(path);
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->data_offset(), 14176u);
  EXPECT_EQ(f->metadata().size(), 19u);
  ASSERT_EQ(f->tensors().size(), 48u);
  EXPECT_EQ(f->metadata().front().first, "tokenizer.ggml.tokens");  // file order kept
  EXPECT_EQ(f->metadata().back().first, "llama.attention.layer_norm_rms_epsilon");
  EXPECT_EQ(*f->GetString("general.name"), "llama");
  EXPECT_EQ(*f->GetInt("llama.embedding_length"), 64);
  EXPECT_EQ(*f->GetInt("llama.feed_forward_length"), 172);
  EXPECT_EQ(*f->GetInt("llama.attention.head_count"), 8);
  EXPECT_EQ(*f->GetInt("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(*f->GetInt("llama.block_count"), 5);
  EXPECT_EQ(*f->GetInt("llama.context_length"), 2048);
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.padding_token_id"), 4294967295);
  EXPECT_EQ(f->Find("tokenizer.ggml.padding_token_id")->type, GgufType::kU32);
  EXPECT_EQ(f->Find("tokenizer.ggml.tokens")->AsArray()->size(), 512u);
  EXPECT_EQ(*f->Find("tokenizer.ggml.tokens")->AsArray()->back().AsString(), "\xe2\x80\x8a");
  EXPECT_EQ(*f->Find("tokenizer.ggml.scores")->AsArray()->back().AsFloat(), -252.0);

  for (const auto& t : f->tensors()) EXPECT_EQ(t.dtype, DType::kF32) << t.name;
  const GgufTensorInfo* emb = f->FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->view.ShapeString(), "[512, 64]");
  EXPECT_EQ(F32At(emb->view, 0), -0.29474878311157227f);
  EXPECT_EQ(F32At(emb->view, 1), 0.5618956089019775f);
  EXPECT_EQ(F32At(emb->view, 64), -0.12708568572998047f);
  // output.weight is a bit-identical copy of the embedding (shared classifier).
  const GgufTensorInfo* out = f->FindTensor("output.weight");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(std::memcmp(out->view.data, emb->view.data, emb->nbytes), 0);

  const GgufTensorInfo* down = f->FindTensor("blk.4.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->ne, (std::vector<int64_t>{172, 64}));
  EXPECT_EQ(down->view.ShapeString(), "[64, 172]");
  EXPECT_EQ(down->offset, 1082880u);
  EXPECT_EQ(F32At(down->view, 0), -0.04791264981031418f);
  EXPECT_EQ(F32At(down->view, 172), 0.15593937039375305f);
  const GgufTensorInfo* k = f->FindTensor("blk.0.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->view.ShapeString(), "[32, 64]");
  EXPECT_EQ(F32At(k->view, 2), -0.21698929369449615f);
  const GgufTensorInfo* last = &f->tensors().back();
  EXPECT_EQ(last->name, "blk.4.ffn_norm.weight");
  EXPECT_EQ(f->data_offset() + last->offset + last->nbytes, 1185376u);  // ends at EOF
}

}  // namespace
}  // namespace lumen::formats
