// Tokenizer tests against third-party references: llama.cpp / HF / transformers.js
// test vectors (fixtures/tokenizers/test-vectors) and corpus goldens made by
// tools/reference/js/tokenize_corpus.mjs and tools/reference/spm_goldens.py.
#include "lumen/tokenize/tokenizer.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "lumen/core/buffer.h"
#include "lumen/formats/gguf.h"
#include "lumen/tokenize/bpe.h"
#include "lumen/tokenize/unicode.h"

namespace lumen::tokenize {
namespace {

// The vocabulary index: every piece found, the first id of a repeated piece,
// overrides for the same text (a slot update) and for other text (the side map).
TEST(PieceIndex, FindsEveryPieceFirstDuplicateWinsAndSetOverrides) {
  BpeModel m;
  for (int i = 0; i < 5000; ++i) m.pieces.push_back("p" + std::to_string(i));
  m.pieces.push_back("p7");  // id 5000 repeats id 7
  m.pieces.push_back("");    // an empty piece (gaps in HF vocabularies)
  m.BuildIndex();
  for (int i = 0; i < 5000; ++i) ASSERT_EQ(m.Find("p" + std::to_string(i)), i);
  EXPECT_EQ(m.Find("p7"), 7);
  EXPECT_EQ(m.Find(""), 5001);
  EXPECT_EQ(m.Find("p5000"), std::nullopt);
  EXPECT_EQ(m.Find("q"), std::nullopt);
  m.SetPiece("p7", 5000);  // the same text: the later id now wins
  EXPECT_EQ(m.Find("p7"), 5000);
  m.SetPiece("<extra>", 3);  // text that is not pieces[3]: an override
  EXPECT_EQ(m.Find("<extra>"), 3);
  EXPECT_EQ(m.Find("p3"), 3);
  m.SetPiece("p9", 12);  // also not pieces[12]: overrides p9's own id
  EXPECT_EQ(m.Find("p9"), 12);
  const BpeModel copy = m;  // the index keys on the owner's pieces, so copies work
  EXPECT_EQ(copy.Find("p4999"), 4999);
  EXPECT_EQ(copy.Find("p9"), 12);
}

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string Fixtures() {
  if (const char* e = std::getenv("LUMEN_FIXTURES")) return e;
  return std::string(LUMEN_SOURCE_DIR) + "/../shared/fixtures";
}

const json& Vectors() {
  static const json j = [] {
    auto r = ReadFile(Fixtures() + "/tokenizers/test-vectors/test-vectors.json");
    return r.ok() ? json::parse(*r) : json();
  }();
  return j;
}

// Loads each tokenizer once per process.
const Tokenizer* Load(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second.get();
  std::unique_ptr<Tokenizer> tok;
  std::string fx = Fixtures();
  if (name == "qwen3" || name == "llama3_1" || name == "gemma3") {
    if (fs::exists(fx + "/tokenizers/" + name)) {
      auto r = Tokenizer::FromHf(fx + "/tokenizers/" + name);
      EXPECT_TRUE(r.ok()) << r.status().message();
      if (r.ok()) tok = std::make_unique<Tokenizer>(std::move(*r));
    }
  } else if (name == "llama2") {
    std::string p = fx + "/llama-2-tiny-random-gguf/llama-2-tiny-random.gguf";
    if (fs::exists(p)) {
      auto g = formats::GgufFile::Open(p);
      EXPECT_TRUE(g.ok()) << g.status().message();
      if (g.ok()) {
        auto r = Tokenizer::FromGguf(*g);
        EXPECT_TRUE(r.ok()) << r.status().message();
        if (r.ok()) tok = std::make_unique<Tokenizer>(std::move(*r));
      }
    }
  } else if (name == "tok512") {
    std::string p = fx + "/stories260K/tok512.bin";
    if (fs::exists(p)) {
      auto r = Tokenizer::FromLlama2c(p, 512);
      EXPECT_TRUE(r.ok()) << r.status().message();
      if (r.ok()) tok = std::make_unique<Tokenizer>(std::move(*r));
    }
  }
  return (cache[name] = std::move(tok)).get();
}

std::string Show(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += " " + std::to_string(x);
  return s;
}

struct VectorCase {
  const char* tok;
  const char* key;
};

class TestVectors : public ::testing::TestWithParam<VectorCase> {};

TEST_P(TestVectors, MatchesReferenceIds) {
  const json& v = Vectors();
  if (v.is_null()) GTEST_SKIP() << "fixtures missing: " << Fixtures();
  const Tokenizer* tok = Load(GetParam().tok);
  if (!tok) GTEST_SKIP() << "fixture missing for " << GetParam().tok;
  const json& inputs = v["inputs"];
  const json& expected = v["expected_ids"][GetParam().key];
  ASSERT_EQ(inputs.size(), expected.size());
  int bad = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string text = inputs[i].get<std::string>();
    auto want = expected[i].get<std::vector<int32_t>>();
    auto got = tok->Encode(text, /*add_special=*/false);
    EXPECT_EQ(Show(got), Show(want)) << "case " << i << ": '" << text << "'";
    bad += got != want;
  }
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TestVectors,
                         ::testing::Values(VectorCase{"qwen3", "qwen3"},
                                           VectorCase{"llama3_1", "llama3_1"},
                                           VectorCase{"gemma3", "gemma3"},
                                           VectorCase{"llama2", "llama2-spm"},
                                           VectorCase{"tok512", "tok512-runc"}),
                         [](const auto& info) { return std::string(info.param.tok); });

std::vector<std::string> CorpusCases() {
  auto r = ReadFile(std::string(LUMEN_SOURCE_DIR) + "/tests/goldens/tokenizers/corpus.txt");
  std::vector<std::string> out;
  if (!r.ok()) return out;
  const std::string sep = "\n__lumen_case__\n";
  size_t start = 0;
  for (size_t i; (i = r->find(sep, start)) != std::string::npos; start = i + sep.size()) {
    out.push_back(r->substr(start, i - start));
  }
  if (start < r->size()) out.push_back(r->substr(start));
  return out;
}

std::vector<json> Golden(const std::string& name) {
  auto r = ReadFile(std::string(LUMEN_SOURCE_DIR) + "/tests/goldens/tokenizers/" + name + ".jsonl");
  std::vector<json> out;
  if (!r.ok()) return out;
  size_t start = 0;
  for (size_t i; (i = r->find('\n', start)) != std::string::npos; start = i + 1) {
    out.push_back(json::parse(r->substr(start, i - start)));
  }
  return out;
}

class CorpusGoldens : public ::testing::TestWithParam<const char*> {};

TEST_P(CorpusGoldens, EncodeAndDecodeMatchReference) {
  const Tokenizer* tok = Load(GetParam());
  if (!tok) GTEST_SKIP() << "fixture missing for " << GetParam();
  std::vector<std::string> cases = CorpusCases();
  std::vector<json> gold = Golden(GetParam());
  ASSERT_GT(cases.size(), 50u);
  ASSERT_EQ(gold.size(), cases.size() + 1);  // header line first
  ASSERT_TRUE(gold[0].contains("generated_by"));
  int bad = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& g = gold[i + 1];
    EXPECT_EQ(SanitizeUtf8(cases[i]), g["text"].get<std::string>()) << "case " << i;
    auto want = g["ids"].get<std::vector<int32_t>>();
    // SentencePiece treats "<s>" in text as text; llama.cpp does too when
    // parse_special is off.
    bool parse_special = std::string(GetParam()) != "llama2";
    auto got = tok->Encode(cases[i], /*add_special=*/false, parse_special);
    EXPECT_EQ(Show(got), Show(want)) << "case " << i << ": " << g["text"].dump();
    std::string dec = tok->Decode(want);
    EXPECT_EQ(dec, g["decoded"].get<std::string>()) << "case " << i;
    bad += got != want || dec != g["decoded"].get<std::string>();
    // Streaming decode equals whole decode.
    StreamingDetokenizer sd(*tok);
    std::string streamed;
    for (int32_t id : want) {
      std::string part = sd.Push(id);
      EXPECT_TRUE(IsValidUtf8(part)) << "case " << i;
      streamed += part;
    }
    streamed += sd.Flush();
    EXPECT_EQ(streamed, dec) << "streaming, case " << i;
  }
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(Goldens, CorpusGoldens,
                         ::testing::Values("qwen3", "llama3_1", "gemma3", "llama2", "tok512"));

TEST(Synthetic, RoundTripsAndIsDeterministic) {
  for (SyntheticKind kind : {SyntheticKind::kByteBpe, SyntheticKind::kSpm}) {
    auto a = MakeSyntheticTokenizer(kind, 512, 1);
    ASSERT_TRUE(a.ok()) << a.status().message();
    auto b = MakeSyntheticTokenizer(kind, 512, 1);
    ASSERT_TRUE(b.ok());
    EXPECT_LE(a->vocab_size(), 512);
    EXPECT_GT(a->vocab_size(), 300);
    EXPECT_FALSE(a->chat_template().empty());
    const std::string text =
        "<|im_start|>user\nOnce upon a time, Lily played. 42 \xF0\x9F\x98\x80<|im_end|>";
    auto ids = a->Encode(text, false);
    EXPECT_EQ(ids, b->Encode(text, false));
    EXPECT_LT(ids.size(), text.size() / 2);  // merges were learned
    auto im_end = a->TokenId("<|im_end|>");
    ASSERT_TRUE(im_end);
    EXPECT_EQ(ids.back(), *im_end);
    EXPECT_TRUE(a->IsEog(*im_end));
    std::string dec = a->Decode(ids);
    // llama.cpp SPM semantics: text after a special token gets the dummy-prefix space.
    EXPECT_EQ(
        dec, kind == SyntheticKind::kSpm
                 ? "<|im_start|> user\nOnce upon a time, Lily played. 42 \xF0\x9F\x98\x80<|im_end|>"
                 : text);
  }
}

// Streaming decode of any id sequence (random ids: invalid UTF-8 splits,
// special tokens, clean-up rules) returns valid UTF-8 pieces whose sum is the
// whole decode, for every fixture and synthetic tokenizer and both skip modes.
TEST(StreamingDetokenizer, AnyIdSequenceStreamsToTheWholeDecode) {
  std::vector<const Tokenizer*> toks;
  for (const char* n : {"qwen3", "llama3_1", "gemma3", "llama2", "tok512"})
    if (const Tokenizer* t = Load(n)) toks.push_back(t);
  std::vector<Tokenizer> synth;
  for (SyntheticKind kind : {SyntheticKind::kByteBpe, SyntheticKind::kSpm}) {
    auto t = MakeSyntheticTokenizer(kind, 512, 1);
    ASSERT_TRUE(t.ok());
    synth.push_back(std::move(*t));
  }
  for (const Tokenizer& t : synth) toks.push_back(&t);
  std::mt19937 rng(7);
  for (const Tokenizer* tok : toks) {
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<int32_t> ids(1 + rng() % 40);
      for (auto& id : ids) id = int32_t(rng() % uint32_t(tok->vocab_size()));
      for (bool skip : {false, true}) {
        StreamingDetokenizer sd(*tok, skip);
        std::string streamed;
        for (int32_t id : ids) {
          std::string part = sd.Push(id);
          ASSERT_TRUE(IsValidUtf8(part)) << Show(ids);
          streamed += part;
        }
        streamed += sd.Flush();
        ASSERT_EQ(streamed, tok->Decode(ids, skip)) << Show(ids);
      }
    }
  }
}

TEST(Export, GgufAndHfRoundTripsEncodeIdentically) {
  const char* names[] = {"qwen3", "llama3_1", "llama2"};
  std::vector<std::string> cases = CorpusCases();
  for (const char* name : names) {
    const Tokenizer* tok = Load(name);
    if (!tok) continue;
    std::string dir = ::testing::TempDir() + "/tok_export_" + name;
    Status s = tok->ExportHf(dir);
    ASSERT_TRUE(s.ok()) << s.message();
    auto hf = Tokenizer::FromHf(dir);
    ASSERT_TRUE(hf.ok()) << hf.status().message();
    formats::GgufWriter w;
    ASSERT_TRUE(tok->ExportGguf(w).ok()) << name;
    std::string path = ::testing::TempDir() + "/tok_export_" + name + ".gguf";
    ASSERT_TRUE(w.Write(path).ok());
    auto g = formats::GgufFile::Open(path);
    ASSERT_TRUE(g.ok()) << g.status().message();
    auto gg = Tokenizer::FromGguf(*g);
    ASSERT_TRUE(gg.ok()) << gg.status().message();
    for (size_t i = 0; i < cases.size(); ++i) {
      auto want = tok->Encode(cases[i], true);
      EXPECT_EQ(Show(hf->Encode(cases[i], true)), Show(want)) << name << " hf case " << i;
      EXPECT_EQ(Show(gg->Encode(cases[i], true)), Show(want)) << name << " gguf case " << i;
    }
  }
}

// The SentencePiece .model beside a llama2.c model is named for what it is,
// not read as token lengths.
TEST(Tokenizer, ASentencePieceModelIsNotALlama2cTokenizer) {
  const std::string p = Fixtures() + "/stories260K/tok512.model";
  if (!fs::exists(p)) GTEST_SKIP() << "fixtures absent: " << p;
  auto r = Tokenizer::FromLlama2c(p, 512);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("reads as a SentencePiece .model"), std::string::npos)
      << r.status().message();
}

TEST(Tokenizer, AddSpecialFollowsPostProcessor) {
  for (auto [name, bos] :
       {std::pair<const char*, int>{"llama3_1", 128000}, {"gemma3", 2}, {"qwen3", -1}}) {
    const Tokenizer* tok = Load(name);
    if (!tok) GTEST_SKIP() << "fixture missing";
    auto ids = tok->Encode("Hello", true);
    auto plain = tok->Encode("Hello", false);
    if (bos >= 0) {
      ASSERT_EQ(ids.size(), plain.size() + 1) << name;
      EXPECT_EQ(ids[0], bos) << name;
    } else {
      EXPECT_EQ(ids, plain) << name;
    }
  }
}

// A post-processor naming a special token id outside the vocabulary is an
// error naming the field (found by the tokenizer_json fuzzer: the id was used
// to index the vocabulary; the input is in tests/fuzz/corpus/tokenizer_json/).
TEST(Tokenizer, PostProcessorIdOutsideVocabularyIsAnError) {
  const std::string json = R"({"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":[]},
    "post_processor":{"type":"TemplateProcessing",
      "single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
      "special_tokens":{"<s>":{"id":"<s>","ids":[99],"tokens":["<s>"]}}}})";
  auto r = Tokenizer::FromHfJson(json, "", "t.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("post_processor"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("99"), std::string::npos);
  // The same with an id inside the vocabulary loads and prepends it.
  std::string ok = json;
  ok.replace(ok.find("[99]"), 4, "[1]");
  auto t = Tokenizer::FromHfJson(ok, "", "t.json");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->Encode("a", true), (std::vector<int32_t>{1, 0}));
}

TEST(Tokenizer, SpecialTokensParsedOnlyWhenAsked) {
  const Tokenizer* tok = Load("qwen3");
  if (!tok) GTEST_SKIP() << "fixture missing";
  auto ids = tok->Encode("<|im_start|>user", false, true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 151644);
  auto plain = tok->Encode("<|im_start|>user", false, false);
  EXPECT_NE(plain[0], 151644);
  EXPECT_GT(plain.size(), ids.size());
  EXPECT_TRUE(tok->IsEog(151645));  // <|im_end|>
  EXPECT_EQ(tok->Decode(plain), "<|im_start|>user");
}

}  // namespace
}  // namespace lumen::tokenize
