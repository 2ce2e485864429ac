// Compatibility with the GGUF files people already have, checked through the
// lumen binary: the two third-party GGUFs in the fixtures, a corpus of
// variants of them with the quirks real converters produce (written here by
// lumen's own GgufWriter), every MODEL verb on those files and on a Hugging
// Face directory written by `lumen convert`, and the llama.cpp conventions of
// the GGUF files lumen writes (docs/reference/formats.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "lumen/formats/gguf.h"
#include "lumen_cli.h"

namespace lumen {
namespace {

namespace fs = std::filesystem;
using formats::GgufFile;
using formats::GgufType;
using formats::GgufValue;
using testing::Count;
using testing::Fixtures;
using testing::RunLumen;
using testing::SlurpFile;

// ---- a GGUF as editable parts -------------------------------------------

struct Parts {
  std::vector<std::pair<std::string, GgufValue>> kv;
  struct Tensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;  // row-major
    std::string data;
  };
  std::vector<Tensor> tensors;

  GgufValue* Find(const std::string& key) {
    for (auto& [k, v] : kv)
      if (k == key) return &v;
    return nullptr;
  }
  void Set(const std::string& key, GgufValue v) {
    if (GgufValue* old = Find(key)) {
      *old = std::move(v);
      return;
    }
    kv.emplace_back(key, std::move(v));
  }
  void Erase(const std::string& key) {
    std::erase_if(kv, [&](const auto& e) { return e.first == key; });
  }
  Tensor* FindTensor(const std::string& name) {
    for (auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

GgufValue U32(uint64_t x) { return GgufValue{GgufType::kU32, x}; }
GgufValue I32(int64_t x) { return GgufValue{GgufType::kI32, x}; }
GgufValue Str(std::string s) { return GgufValue{GgufType::kString, std::move(s)}; }
GgufValue Arr(GgufType t, std::vector<GgufValue> items) {
  GgufValue v{GgufType::kArray, std::move(items)};
  v.array_type = t;
  return v;
}

Parts ReadParts(const std::string& path) {
  Parts p;
  auto g = GgufFile::Open(path);
  EXPECT_TRUE(g.ok()) << g.status().message();
  if (!g.ok()) return p;
  p.kv = g->metadata();
  for (const auto& t : g->tensors()) {
    Parts::Tensor c;
    c.name = t.name;
    c.dtype = t.dtype;
    c.shape.assign(t.view.shape.begin(), t.view.shape.begin() + t.view.ndim);
    c.data.assign(static_cast<const char*>(t.view.data), t.nbytes);
    p.tensors.push_back(std::move(c));
  }
  return p;
}

std::string WriteParts(const Parts& p, const std::string& name, uint32_t alignment = 32) {
  formats::GgufWriter w;
  for (const auto& [k, v] : p.kv) w.SetValue(k, v);
  for (const auto& t : p.tensors) {
    const Status s = w.AddTensor(t.name, t.dtype, t.shape, t.data);
    EXPECT_TRUE(s.ok()) << s.message();
  }
  const std::string path = testing::TempDir("compat") + "/" + name + ".gguf";
  const Status s = w.Write(path, alignment);
  EXPECT_TRUE(s.ok()) << s.message();
  return path;
}

std::string StoriesGguf() { return Fixtures() + "/stories260K-gguf/stories260K.gguf"; }
std::string TinyRandomGguf() {
  return Fixtures() + "/llama-2-tiny-random-gguf/llama-2-tiny-random.gguf";
}
std::string ExpectedText() {
  return SlurpFile(Fixtures() + "/stories260K/expected-greedy-once-upon-a-time.txt");
}

#define SKIP_WITHOUT_FIXTURES()                                    \
  if (!fs::exists(StoriesGguf()) || !fs::exists(TinyRandomGguf())) \
  GTEST_SKIP() << "fixtures absent: " << StoriesGguf() << " / " << TinyRandomGguf()

// The llama2.c reference text for "Once upon a time" (252 greedy tokens).
void ExpectReferenceText(const std::string& model, const std::string& what) {
  testing::CliRun r = RunLumen("generate " + model + " \"Once upon a time\" -n 252 --temp 0");
  ASSERT_EQ(r.code, 0) << what << ": " << r.err;
  EXPECT_EQ(r.out, ExpectedText()) << what;
}

// ---- the third-party files themselves ------------------------------------

// ggml-org's stories260K.gguf (llama.cpp's converter) writes pad and sep as
// 0xFFFFFFFF: one warning each, and the llama2.c reference text.
TEST(Compat, GgmlOrgStoriesGgufGivesLlama2cText) {
  SKIP_WITHOUT_FIXTURES();
  testing::CliRun r =
      RunLumen("generate " + StoriesGguf() + " \"Once upon a time\" -n 252 --temp 0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, ExpectedText());
  EXPECT_EQ(Count(r.err, "tokenizer.ggml.padding_token_id = 4294967295"), 1) << r.err;
  EXPECT_EQ(Count(r.err, "tokenizer.ggml.seperator_token_id = 4294967295"), 1) << r.err;
  EXPECT_EQ(Count(r.err, "warning"), 2) << r.err;
  r = RunLumen("generate " + StoriesGguf() + " -n 128 --temp 0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, SlurpFile(Fixtures() + "/stories260K/expected-greedy-no-prompt-n128.txt"));
}

// ---- the corpus ----------------------------------------------------------

struct IdCase {
  const char* name;
  std::function<void(Parts&)> edit;
  std::vector<std::string> warned;  // keys named by exactly one warning each
};

TEST(Compat, SpecialTokenIdQuirks) {
  SKIP_WITHOUT_FIXTURES();
  const Parts base = ReadParts(StoriesGguf());
  const std::string k = "tokenizer.ggml.";
  const std::vector<IdCase> cases = {
      // -1 written as a signed type: BOS / EOS / UNK fall back to 1 / 2 / 0.
      {"ids_i32_minus_one",
       [&](Parts& p) {
         for (const char* id : {"bos", "eos", "unknown", "padding"})
           p.Set(k + id + "_token_id", I32(-1));
       },
       {k + "bos_token_id", k + "eos_token_id", k + "unknown_token_id", k + "padding_token_id",
        k + "seperator_token_id"}},
      // Absent: SentencePiece defaults, no warning.
      {"ids_absent",
       [&](Parts& p) {
         for (const char* id : {"bos", "eos", "unknown", "padding", "seperator"})
           p.Erase(k + id + "_token_id");
       },
       {}},
      // Ids past the vocabulary, as u32 max or just one past the end.
      {"ids_out_of_range",
       [&](Parts& p) {
         p.Set(k + "eos_token_id", U32(512));
         p.Set(k + "eot_token_id", U32(4294967295u));
         p.Set(k + "mask_token_id", U32(100000));
         p.Set(k + "cls_token_id", I32(-1));
       },
       {k + "eos_token_id", k + "eot_token_id", k + "mask_token_id", k + "cls_token_id",
        k + "padding_token_id", k + "seperator_token_id"}},
  };
  for (const IdCase& c : cases) {
    Parts p = base;
    c.edit(p);
    const std::string path = WriteParts(p, c.name);
    testing::CliRun r = RunLumen("generate " + path + " \"Once upon a time\" -n 252 --temp 0");
    ASSERT_EQ(r.code, 0) << c.name << ": " << r.err;
    EXPECT_EQ(r.out, ExpectedText()) << c.name;
    EXPECT_EQ(Count(r.err, "warning"), int(c.warned.size())) << c.name << ": " << r.err;
    for (const std::string& key : c.warned)
      EXPECT_EQ(Count(r.err, key + " = "), 1) << c.name << ": " << key << "\n" << r.err;
    testing::CliRun t = RunLumen("tokenize " + path + " \"Once upon a time\" --ids");
    EXPECT_EQ(t.out, "1 403 407 261 378\n") << c.name << ": " << t.err;
    testing::CliRun i = RunLumen("inspect " + path + " --no-tensors");
    EXPECT_NE(i.out.find("bos 1, eos 2"), std::string::npos) << c.name << ": " << i.out;
  }
  // The fallback is named in the warning.
  Parts p = base;
  p.Set(k + "bos_token_id", U32(4294967295u));
  testing::CliRun r = RunLumen("inspect " + WriteParts(p, "bos_none") + " --no-tensors");
  EXPECT_NE(r.err.find("tokenizer.ggml.bos_token_id = 4294967295 is not a token id of this "
                       "512-token vocabulary; using id 1 ('<s>') instead"),
            std::string::npos)
      << r.err;
}

// token_type absent: every piece is normal, so "<0x0A>" is no longer a byte
// token; the greedy ids are the same and the text still starts the same way.
// scores absent: SentencePiece has nothing to rank merges by; it still
// tokenizes (into more pieces) and generates.
TEST(Compat, TokenTypeOrScoresAbsent) {
  SKIP_WITHOUT_FIXTURES();
  const Parts base = ReadParts(StoriesGguf());
  Parts p = base;
  p.Erase("tokenizer.ggml.token_type");
  const std::string no_types = WriteParts(p, "no_token_type");
  testing::CliRun r = RunLumen("generate " + no_types + " \"Once upon a time\" -n 40 --temp 0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.substr(0, 60), ExpectedText().substr(0, 60));
  p = base;
  p.Erase("tokenizer.ggml.scores");
  const std::string no_scores = WriteParts(p, "no_scores");
  r = RunLumen("tokenize " + no_scores + " \"Once upon a time\" --ids");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("1 ", 0), 0u) << r.out;
  r = RunLumen("generate " + no_scores + " \"Once upon a time\" -n 8 --temp 0");
  EXPECT_EQ(r.code, 0) << r.err;
  // Present but the wrong length is an error naming the key.
  p = base;
  p.Set("tokenizer.ggml.scores", Arr(GgufType::kF32, {GgufValue{GgufType::kF32, 0.5}}));
  r = RunLumen("inspect " + WriteParts(p, "short_scores"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("tokenizer.ggml.scores"), std::string::npos) << r.err;
  EXPECT_EQ(Count(r.err, "short_scores.gguf"), 1) << r.err;
}

// Keys lumen does not know, of every value type and as arrays of every type
// (nested too), change nothing.
TEST(Compat, UnknownKeysOfEveryType) {
  SKIP_WITHOUT_FIXTURES();
  Parts p = ReadParts(StoriesGguf());
  const std::vector<GgufValue> scalars = {{GgufType::kU8, uint64_t(200)},
                                          {GgufType::kI8, int64_t(-100)},
                                          {GgufType::kU16, uint64_t(60000)},
                                          {GgufType::kI16, int64_t(-30000)},
                                          {GgufType::kU32, uint64_t(4000000000)},
                                          {GgufType::kI32, int64_t(-2000000000)},
                                          {GgufType::kU64, uint64_t(1) << 60},
                                          {GgufType::kI64, -(int64_t(1) << 60)},
                                          {GgufType::kF32, 1.5},
                                          {GgufType::kF64, -2.25},
                                          {GgufType::kBool, true},
                                          Str("x\ty \xe2\x96\x81 z")};
  for (size_t i = 0; i < scalars.size(); ++i) {
    const std::string n = std::to_string(i);
    p.Set("someconverter.scalar." + n, scalars[i]);
    p.Set("llama.unknown_array." + n, Arr(scalars[i].type, {scalars[i], scalars[i]}));
  }
  p.Set("someconverter.nested", Arr(GgufType::kArray, {Arr(GgufType::kU8, {scalars[0]}),
                                                       Arr(GgufType::kString, {scalars[11]})}));
  p.Set("someconverter.empty", Arr(GgufType::kString, {}));
  p.Set("general.file_type", U32(0));
  p.Set("general.quantization_version", U32(2));
  ExpectReferenceText(WriteParts(p, "unknown_keys"), "unknown keys");
}

TEST(Compat, AlignmentsOtherThan32) {
  SKIP_WITHOUT_FIXTURES();
  const Parts p = ReadParts(StoriesGguf());
  for (uint32_t a : {8u, 64u, 4096u}) {
    const std::string path = WriteParts(p, "align" + std::to_string(a), a);
    auto g = GgufFile::Open(path);
    ASSERT_TRUE(g.ok()) << g.status().message();
    EXPECT_EQ(g->alignment(), a);
    EXPECT_EQ(g->data_offset() % a, 0u);
    ExpectReferenceText(path, "alignment " + std::to_string(a));
  }
}

TEST(Compat, ChatTemplateAbsentOrEmpty) {
  SKIP_WITHOUT_FIXTURES();
  Parts p = ReadParts(StoriesGguf());
  ASSERT_EQ(p.Find("tokenizer.chat_template"), nullptr);  // absent in the fixture
  const std::string absent = WriteParts(p, "template_absent");
  p.Set("tokenizer.chat_template", Str(""));
  const std::string empty = WriteParts(p, "template_empty");
  for (const std::string& m : {absent, empty}) {
    testing::CliRun r = RunLumen("chat " + m + " -n 6 --temp 0", "Hello\n");
    EXPECT_EQ(r.code, 0) << m << ": " << r.err;
    EXPECT_NE(r.err.find("no chat template; using the fallback"), std::string::npos) << r.err;
    EXPECT_GT(r.out.size(), 2u) << m;
  }
}

// A tokenizer.ggml.pre lumen does not know falls back to the GPT-2 split with
// one warning naming the value. (Both fixtures are SentencePiece, so the
// byte-level vocabulary comes from `lumen synth`.)
TEST(Compat, UnknownPreTokenizerFallsBack) {
  const std::string dir = testing::TempDir("compat");
  const std::string src = dir + "/qwen3.gguf";
  ASSERT_EQ(RunLumen("synth tiny-qwen3 -o " + src).code, 0);
  const testing::CliRun known = RunLumen("tokenize " + src + " \"Hello world 123\" --ids");
  ASSERT_EQ(known.code, 0) << known.err;
  Parts p = ReadParts(src);
  p.Set("tokenizer.ggml.pre", Str("made-up-pre-2031"));
  const std::string path = WriteParts(p, "unknown_pre");
  testing::CliRun r = RunLumen("tokenize " + path + " \"Hello world 123\" --ids");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(Count(r.err, "tokenizer.ggml.pre = 'made-up-pre-2031'"), 1) << r.err;
  EXPECT_NE(r.err.find("using the GPT-2 split"), std::string::npos) << r.err;
  EXPECT_FALSE(r.out.empty());
  r = RunLumen("generate " + path + " \"Hello\" -n 4 --temp 0");
  EXPECT_EQ(r.code, 0) << r.err;
  p.Erase("tokenizer.ggml.pre");  // absent: llama.cpp's "default" (GPT-2), no warning
  r = RunLumen("tokenize " + WriteParts(p, "no_pre") + " \"Hello world 123\" --ids");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(Count(r.err, "warning"), 0) << r.err;
}

// More tokens than embedding rows (added tokens the converter appended
// without resizing the model): a clear error naming both counts. More rows
// than tokens (a padded embedding, as HF checkpoints have): loads, and the
// padded ids are never produced by the tokenizer.
TEST(Compat, VocabularyAndEmbeddingRowsDisagree) {
  SKIP_WITHOUT_FIXTURES();
  const Parts base = ReadParts(StoriesGguf());
  Parts p = base;
  auto append = [](GgufValue* arr, GgufValue item, int n) {
    auto& items = std::get<std::vector<GgufValue>>(arr->v);
    for (int i = 0; i < n; ++i) items.push_back(item);
  };
  auto& tokens = std::get<std::vector<GgufValue>>(p.Find("tokenizer.ggml.tokens")->v);
  for (int i = 0; i < 4; ++i) tokens.push_back(Str("<|added_" + std::to_string(i) + "|>"));
  append(p.Find("tokenizer.ggml.scores"), GgufValue{GgufType::kF32, 0.0}, 4);
  append(p.Find("tokenizer.ggml.token_type"), GgufValue{GgufType::kI32, int64_t(4)}, 4);
  const std::string added = WriteParts(p, "added_tokens");
  testing::CliRun r = RunLumen("generate " + added + " \"Once upon a time\" -n 8 --temp 0");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.err.find("516"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("512"), std::string::npos) << r.err;
  EXPECT_EQ(Count(r.err, "added_tokens.gguf"), 1) << r.err;

  p = base;  // 8 zero rows appended to the embedding and the head
  for (const char* name : {"token_embd.weight", "output.weight"}) {
    Parts::Tensor* t = p.FindTensor(name);
    ASSERT_NE(t, nullptr);
    t->shape[0] += 8;
    t->data.append(size_t(8 * 64 * 4), '\0');
  }
  p.Set("llama.vocab_size", U32(520));
  ExpectReferenceText(WriteParts(p, "padded_rows"), "padded embedding rows");
}

// The fixture's output.weight equals token_embd.weight, so dropping it (a tied
// head) must give the same text.
TEST(Compat, TiedAndUntiedHeads) {
  SKIP_WITHOUT_FIXTURES();
  Parts p = ReadParts(StoriesGguf());
  std::erase_if(p.tensors, [](const auto& t) { return t.name == "output.weight"; });
  const std::string tied = WriteParts(p, "tied");
  testing::CliRun i = RunLumen("inspect " + tied + " --no-tensors");
  EXPECT_NE(i.out.find("tied embeddings yes"), std::string::npos) << i.out;
  i = RunLumen("inspect " + StoriesGguf() + " --no-tensors");
  EXPECT_NE(i.out.find("tied embeddings no"), std::string::npos) << i.out;
  ExpectReferenceText(tied, "tied head");
}

// ---- every MODEL verb on both third-party files and a converted HF dir ----

struct VerbModel {
  std::string name, path;
  std::string ids;  // expected `tokenize "Once upon a time" --ids`
};

TEST(Compat, EveryModelVerbOnThirdPartyAndConvertedModels) {
  SKIP_WITHOUT_FIXTURES();
  const std::string hf = testing::TempDir("compat") + "/stories_hf";
  testing::CliRun c = RunLumen("convert " + StoriesGguf() + " " + hf + " --to hf --type f32");
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string prompts = testing::TempDir("compat") + "/prompts.txt";
  std::ofstream(prompts) << "Once upon a time\n";
  const std::string story = testing::TempDir("compat") + "/story.txt";
  std::ofstream(story) << ExpectedText();
  const std::vector<VerbModel> models = {
      {"stories260K.gguf", StoriesGguf(), "1 403 407 261 378\n"},
      {"llama-2-tiny-random.gguf", TinyRandomGguf(), "1 9038 2501 263 931\n"},
      {"converted HF dir", hf, "1 403 407 261 378\n"}};
  for (const VerbModel& m : models) {
    SCOPED_TRACE(m.name);
    testing::CliRun r = RunLumen("inspect " + m.path);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("architecture: llama"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("blk.0.attn_q.weight"), std::string::npos) << r.out;
    r = RunLumen("tokenize " + m.path + " \"Once upon a time\" --ids");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, m.ids);
    r = RunLumen("generate " + m.path + " \"Once upon a time\" -n 12 --temp 0");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.rfind("Once upon a time", 0), 0u) << r.out;
    if (m.path != TinyRandomGguf()) {  // random weights: no reference text
      EXPECT_EQ(r.out, ExpectedText().substr(0, r.out.size() - 1) + "\n");
    }
    r = RunLumen("chat " + m.path + " -n 4 --temp 0", "Hello\n");
    EXPECT_EQ(r.code, 0) << r.err;
    r = RunLumen("eval route " + m.path + " --prompts " + prompts + " -n 1 --max-tokens 6");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("mean KL"), std::string::npos) << r.out;
    r = RunLumen("bench " + m.path + " --prompt 8 --gen 4 --repeat 1 --no-membw");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("decode:"), std::string::npos) << r.out;
    r = RunLumen("perplexity " + m.path + " --file " + story + " --ctx 32 --stride 16");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("PPL: "), std::string::npos) << r.out;
    r = RunLumen("fit " + m.path + " --ctx 64 --json");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("\"fits\": true"), std::string::npos) << r.out;
    // A generative model names no pooling: embed says so and how to pool
    // anyway (llama.cpp's --pooling), which then works.
    r = RunLumen("embed " + m.path + " \"Once upon a time\"");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find("is not an embedding model"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--pooling mean|cls|last"), std::string::npos) << r.err;
    r = RunLumen("embed " + m.path + " \"Once upon a time\" --pooling mean --json");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("\"pooling\":\"mean\""), std::string::npos) << r.out;
    const testing::ServeResult s =
        testing::ServeOnce(m.path, "/v1/completions",
                           R"({"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0})");
    ASSERT_TRUE(s.started) << s.log;
    EXPECT_EQ(s.response.rfind("HTTP/1.1 200", 0), 0u) << s.response;
    EXPECT_NE(s.response.find("\"text_completion\""), std::string::npos) << s.response;
    EXPECT_EQ(s.exit_code, 0) << s.log;
  }
}

// ---- failure messages ----------------------------------------------------

// A bad file names the file once, the key, the value, and what to do.
TEST(Compat, FailureMessagesNameFileOnceKeyAndValue) {
  SKIP_WITHOUT_FIXTURES();
  const Parts base = ReadParts(StoriesGguf());
  struct Bad {
    const char* name;
    std::function<void(Parts&)> edit;
    std::vector<std::string> want;
  };
  const std::vector<Bad> cases = {
      {"arch_unknown",
       [](Parts& p) { p.Set("general.architecture", Str("mamba9")); },
       {"general.architecture", "mamba9"}},
      {"block_count_string",
       [](Parts& p) { p.Set("llama.block_count", Str("five")); },
       {"llama.block_count", "string"}},
      {"tokenizer_model_unknown",
       [](Parts& p) { p.Set("tokenizer.ggml.model", Str("wordpiece9")); },
       {"tokenizer.ggml.model", "wordpiece9"}},
      {"no_tokens", [](Parts& p) { p.Erase("tokenizer.ggml.tokens"); }, {"tokenizer.ggml.tokens"}},
  };
  for (const Bad& b : cases) {
    Parts p = base;
    b.edit(p);
    const std::string path = WriteParts(p, b.name);
    testing::CliRun r = RunLumen("generate " + path + " hi -n 2");
    EXPECT_EQ(r.code, 1) << b.name;
    const size_t at = r.err.find("lumen: error: ");
    ASSERT_NE(at, std::string::npos) << b.name << ": " << r.err;
    const std::string line = r.err.substr(at, r.err.find('\n', at) - at);
    EXPECT_EQ(Count(line, std::string(b.name) + ".gguf"), 1) << b.name << ": " << line;
    for (const std::string& w : b.want)
      EXPECT_NE(line.find(w), std::string::npos) << b.name << ": want '" << w << "' in " << line;
  }
}

// A .safetensors path whose bytes are neither format says so; GGUF bytes
// under that name still load (the bytes decide).
TEST(Compat, SafetensorsExtensionWithOtherBytes) {
  const std::string dir = testing::TempDir("compat");
  const std::string junk = dir + "/junk.safetensors";
  std::ofstream(junk, std::ios::binary) << "this is not a model file at all";
  testing::CliRun r = RunLumen("inspect " + junk);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("junk.safetensors: not a safetensors file: header length"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("exceeds the file size (31 bytes)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("bad magic"), std::string::npos) << r.err;
  const std::string gguf = dir + "/renamed.safetensors";
  fs::copy_file(std::string(LUMEN_SOURCE_DIR) + "/models/stories260K.gguf", gguf,
                fs::copy_options::overwrite_existing);
  r = RunLumen("tokenize " + gguf + " \"Once upon a time\" --ids");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "1 403 407 261 378\n");
}

// ---- GGUF that lumen writes follows llama.cpp's conventions ----------------

bool IsLlamaCppTensorName(const std::string& n) {
  static const std::vector<std::string> kGlobal = {"token_embd.weight", "output_norm.weight",
                                                   "output.weight", "rope_freqs.weight"};
  static const std::vector<std::string> kLayer = {
      "attn_norm",   "attn_q",       "attn_k",
      "attn_v",      "attn_qkv",     "attn_output",
      "attn_q_norm", "attn_k_norm",  "post_attention_norm",
      "ffn_norm",    "ffn_gate",     "ffn_up",
      "ffn_down",    "post_ffw_norm"};
  if (std::find(kGlobal.begin(), kGlobal.end(), n) != kGlobal.end()) return true;
  int layer = -1, used = 0;
  if (std::sscanf(n.c_str(), "blk.%d.%n", &layer, &used) != 1 || used == 0) return false;
  std::string rest = n.substr(size_t(used));
  for (const char* suffix : {".weight", ".bias"}) {
    if (!rest.ends_with(suffix)) continue;
    rest.resize(rest.size() - std::strlen(suffix));
    return std::find(kLayer.begin(), kLayer.end(), rest) != kLayer.end();
  }
  return false;
}

// Keys and tensors of every family's synth file against llama.cpp's names:
// the arch (Mistral is "llama"), the hyperparameter keys llama.cpp requires,
// rope.scaling.type only with a value llama.cpp knows, a tokenizer model and
// pre-tokenizer it knows, and only tensor names it has.
TEST(WrittenGguf, EveryFamilyUsesLlamaCppKeysAndTensors) {
  const std::string dir = testing::TempDir("written");
  const std::vector<std::pair<std::string, std::string>> families = {
      {"llama", "llama"},   {"mistral", "llama"}, {"qwen2", "qwen2"},     {"qwen3", "qwen3"},
      {"gemma2", "gemma2"}, {"gemma3", "gemma3"}, {"minicpm", "minicpm"}, {"phi3", "phi3"}};
  for (const auto& [family, arch] : families) {
    SCOPED_TRACE(family);
    const std::string path = dir + "/m_" + family + ".gguf";
    testing::CliRun r = RunLumen("synth tiny-" + family + " -o " + path);
    ASSERT_EQ(r.code, 0) << r.err;
    auto g = GgufFile::Open(path);
    ASSERT_TRUE(g.ok()) << g.status().message();
    EXPECT_EQ(*g->GetString("general.architecture"), arch);
    for (const char* k : {"block_count", "embedding_length", "feed_forward_length",
                          "attention.head_count", "attention.head_count_kv", "context_length",
                          "attention.layer_norm_rms_epsilon", "rope.freq_base"})
      EXPECT_NE(g->Find(arch + "." + k), nullptr) << k;
    if (const GgufValue* t = g->Find(arch + ".rope.scaling.type")) {
      ASSERT_NE(t->AsString(), nullptr);
      EXPECT_TRUE(*t->AsString() == "none" || *t->AsString() == "linear" ||
                  *t->AsString() == "yarn" || *t->AsString() == "longrope")
          << *t->AsString();
    }
    const std::string model = *g->GetString("tokenizer.ggml.model");
    EXPECT_TRUE(model == "llama" || model == "gpt2") << model;
    if (model == "gpt2") {
      const std::string pre = *g->GetString("tokenizer.ggml.pre");
      EXPECT_TRUE(pre == "default" || pre == "llama-bpe" || pre == "qwen2") << pre;
      EXPECT_NE(g->Find("tokenizer.ggml.merges"), nullptr);
    } else {
      EXPECT_NE(g->Find("tokenizer.ggml.scores"), nullptr);
    }
    EXPECT_NE(g->Find("tokenizer.ggml.token_type"), nullptr);
    for (const auto& t : g->tensors()) EXPECT_TRUE(IsLlamaCppTensorName(t.name)) << t.name;
  }
}

// Llama 3 rope scaling is written as llama.cpp writes it: no scaling keys, a
// rope_freqs.weight tensor of per-pair divisors (1 in the high band, the
// factor 32 in the low band). Generating from it matches the same synth model
// as a Hugging Face directory, where the scaling is rope_scaling in config.json;
// and `convert` of that directory writes the tensor too.
TEST(WrittenGguf, Llama3RopeScalingIsRopeFreqsTensor) {
  const std::string dir = testing::TempDir("written");
  const std::string shape =
      " --layers 2 --dim 64 --heads 2 --kv-heads 1 --ffn 64 --vocab 512 --ctx 512 --type f32";
  const std::string gguf = dir + "/l3.gguf", hf = dir + "/l3_hf";
  ASSERT_EQ(RunLumen("synth llama-3.2-1b -o " + gguf + shape).code, 0);
  ASSERT_EQ(RunLumen("synth llama-3.2-1b --format hf -o " + hf + shape).code, 0);
  const std::string converted = dir + "/l3_converted.gguf";
  testing::CliRun c = RunLumen("convert " + hf + " " + converted);
  ASSERT_EQ(c.code, 0) << c.err;
  for (const std::string& path : {gguf, converted}) {
    SCOPED_TRACE(path);
    auto g = GgufFile::Open(path);
    ASSERT_TRUE(g.ok()) << g.status().message();
    EXPECT_EQ(g->Find("llama.rope.scaling.type"), nullptr);
    EXPECT_EQ(g->Find("llama.rope.scaling.lumen_type"), nullptr);
    EXPECT_EQ(g->Find("llama.rope.scaling.factor"), nullptr);
    const auto* f = g->FindTensor("rope_freqs.weight");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(f->dtype, DType::kF32);
    ASSERT_EQ(f->view.ShapeString(), "[16]");  // rope dim 32 / 2
    const float* v = static_cast<const float*>(f->view.data);
    EXPECT_EQ(v[0], 1.0f);
    EXPECT_FLOAT_EQ(v[15], 32.0f);
    for (int i = 1; i < 16; ++i) EXPECT_GE(v[i], v[i - 1]) << i;
  }
  testing::CliRun a = RunLumen("generate " + gguf + " \"Once upon a time\" -n 24 --temp 0");
  testing::CliRun b = RunLumen("generate " + hf + " \"Once upon a time\" -n 24 --temp 0");
  testing::CliRun d = RunLumen("generate " + converted + " \"Once upon a time\" -n 24 --temp 0");
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(d.out, b.out);
  // Back to HF: config.json states the llama3 scaling again (the tensor was
  // made from it, recorded under lumen-only keys llama.cpp ignores).
  const std::string back = dir + "/l3_back";
  c = RunLumen("convert " + gguf + " " + back + " --to hf");
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string cfg = SlurpFile(back + "/config.json");
  EXPECT_NE(cfg.find("\"llama3\""), std::string::npos) << cfg;
  EXPECT_EQ(RunLumen("generate " + back + " \"Once upon a time\" -n 24 --temp 0").out, b.out);
}

}  // namespace
}  // namespace lumen
