#include "lumen/formats/hf_dir.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace lumen::formats {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

class HfDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           fmt::format("lumen_hf_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void Text(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  // A shard holding f32 tensors whose element i is base + i.
  void Shard(const std::string& file, const std::vector<std::pair<std::string, float>>& tensors) {
    SafetensorsWriter w;
    for (const auto& [name, base] : tensors) {
      float v[6];
      for (int i = 0; i < 6; ++i) v[i] = base + float(i);
      ASSERT_TRUE(
          w.Add(name, DType::kF32, {2, 3}, std::string(reinterpret_cast<char*>(v), 24)).ok());
    }
    ASSERT_TRUE(w.Write((dir_ / file).string()).ok());
  }
  void Config() {
    Text("config.json", R"({"model_type": "llama", "hidden_size": 3, "num_hidden_layers": 2})");
  }
  std::string Error() {
    auto r = HfModelDir::Open(dir_.string());
    EXPECT_FALSE(r.ok());
    return r.ok() ? "" : r.status().message();
  }

  fs::path dir_;
};

float First(const HfTensor& t) { return *t.view.as<float>(); }

TEST_F(HfDirTest, SingleFileWithConfigsAndTokenizer) {
  Config();
  Text("generation_config.json", R"({"bos_token_id": 1, "eos_token_id": [2, 3]})");
  Text("tokenizer.json", "{}");
  Text("tokenizer_config.json", "{}");
  Shard("model.safetensors", {{"model.embed_tokens.weight", 10}, {"lm_head.weight", 20}});
  auto d = HfModelDir::Open(dir_.string());
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->config().at("model_type"), "llama");
  EXPECT_EQ(d->config().at("hidden_size"), 3);
  ASSERT_NE(d->generation_config(), nullptr);
  EXPECT_EQ(d->generation_config()->at("eos_token_id")[1], 3);
  EXPECT_EQ(d->tokenizer_json_path(), (dir_ / "tokenizer.json").string());
  EXPECT_EQ(d->tokenizer_config_path(), (dir_ / "tokenizer_config.json").string());
  EXPECT_FALSE(d->tokenizer_model_path().has_value());
  ASSERT_EQ(d->shard_paths().size(), 1u);
  ASSERT_EQ(d->tensors().size(), 2u);
  const HfTensor* e = d->Find("model.embed_tokens.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(e->view.row<float>(1)[2], 15.0f);
  EXPECT_EQ(First(*d->Find("lm_head.weight")), 20.0f);
  EXPECT_EQ(d->Find("nope"), nullptr);
}

TEST_F(HfDirTest, ShardedWithIndex) {
  Config();
  Shard("model-00001-of-00002.safetensors", {{"a", 1}, {"b", 2}});
  Shard("model-00002-of-00002.safetensors", {{"c", 3}});
  Text("model.safetensors.index.json", R"({"metadata": {"total_size": 72}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors"}})");
  auto d = HfModelDir::Open(dir_.string());
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_FALSE(d->generation_config());
  ASSERT_EQ(d->shard_paths().size(), 2u);
  ASSERT_EQ(d->tensors().size(), 3u);
  EXPECT_EQ(First(*d->Find("a")), 1.0f);
  EXPECT_EQ(First(*d->Find("b")), 2.0f);
  EXPECT_EQ(First(*d->Find("c")), 3.0f);
  EXPECT_EQ(d->shard_paths()[d->Find("c")->shard],
            (dir_ / "model-00002-of-00002.safetensors").string());
  EXPECT_EQ(d->shard(d->Find("a")->shard).Find("a")->view.data, d->Find("a")->view.data);
  // The index wins over a stray model.safetensors.
  Shard("model.safetensors", {{"zzz", 9}});
  auto d2 = HfModelDir::Open(dir_.string());
  ASSERT_TRUE(d2.ok()) << d2.status().message();
  EXPECT_EQ(d2->Find("zzz"), nullptr);
}

TEST_F(HfDirTest, IndexErrorsNameShardAndTensor) {
  Config();
  Shard("s1.safetensors", {{"a", 1}});
  Shard("s2.safetensors", {{"b", 2}});
  Text("model.safetensors.index.json",
       R"({"weight_map": {"a": "s1.safetensors", "x": "s2.safetensors"}})");
  EXPECT_THAT(Error(), HasSubstr("s2.safetensors: tensor 'x' listed in "
                                 "model.safetensors.index.json is missing from the shard"));
  Text("model.safetensors.index.json",
       R"({"weight_map": {"a": "s2.safetensors", "b": "s2.safetensors"}})");
  EXPECT_THAT(Error(), HasSubstr("s2.safetensors: tensor 'a' listed in "
                                 "model.safetensors.index.json is missing from the shard"));
  Text("model.safetensors.index.json",
       R"({"weight_map": {"a": "s1.safetensors", "b": "gone.safetensors"}})");
  EXPECT_THAT(Error(), HasSubstr("gone.safetensors: cannot open"));
  Text("model.safetensors.index.json", R"({"weight_map": {"a": "../s1.safetensors"}})");
  EXPECT_THAT(Error(), HasSubstr("tensor 'a': shard '../s1.safetensors' is not a file name"));
  Text("model.safetensors.index.json", R"({"weight_map": {"a": 3}})");
  EXPECT_THAT(Error(), HasSubstr("weight_map entry for tensor 'a' is not a file name"));
  Text("model.safetensors.index.json", R"({"metadata": {}})");
  EXPECT_THAT(Error(), HasSubstr("missing \"weight_map\""));
  Text("model.safetensors.index.json", R"({"weight_map": {"a": "s1.safetensors",)");
  EXPECT_THAT(Error(), HasSubstr("model.safetensors.index.json: not valid JSON"));
  // A tensor in two shards.
  Shard("s2.safetensors", {{"a", 2}});
  Text("model.safetensors.index.json",
       R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  EXPECT_THAT(Error(), HasSubstr("s2.safetensors: tensor 'a' is also in"));
}

TEST_F(HfDirTest, OtherSafetensorsNames) {
  Config();
  Shard("weights.00.safetensors", {{"a", 1}});
  Shard("weights.01.safetensors", {{"b", 2}});
  auto d = HfModelDir::Open(dir_.string());
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->shard_paths().size(), 2u);
  EXPECT_EQ(First(*d->Find("b")), 2.0f);
  Shard("weights.01.safetensors", {{"a", 2}});
  EXPECT_THAT(Error(), HasSubstr("weights.01.safetensors: tensor 'a' is also in"));
}

TEST_F(HfDirTest, MissingPieces) {
  EXPECT_THAT(Error(), HasSubstr("config.json: cannot open"));
  Text("config.json", "[1, 2]");
  EXPECT_THAT(Error(), HasSubstr("config.json: not a JSON object"));
  Text("config.json", "{\"a\": }");
  EXPECT_THAT(Error(), HasSubstr("config.json: not valid JSON"));
  Config();
  EXPECT_THAT(Error(), HasSubstr("no model.safetensors"));
  Text("generation_config.json", "nope");
  Shard("model.safetensors", {{"a", 1}});
  EXPECT_THAT(Error(), HasSubstr("generation_config.json: not valid JSON"));
  fs::remove(dir_ / "generation_config.json");
  Text("model.safetensors", "garbage");
  EXPECT_THAT(Error(), HasSubstr("model.safetensors: file is 7 bytes"));
  auto r = HfModelDir::Open((dir_ / "nonexistent").string());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("not a directory"));
}

}  // namespace
}  // namespace lumen::formats
