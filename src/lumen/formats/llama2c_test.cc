#include "lumen/formats/llama2c.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "lumen/formats/gguf.h"

namespace lumen::formats {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string Fixtures() {
  const char* env = std::getenv("LUMEN_FIXTURES");
  return env ? env : std::string(LUMEN_SOURCE_DIR) + "/../shared/fixtures";
}

#define REQUIRE_FIXTURE(path)          \
  if (!fs::exists(path))               \
  GTEST_SKIP() << "fixture " << (path) \
               << " is absent (set "   \
                  "LUMEN_FIXTURES)"

std::string Stories() { return Fixtures() + "/stories260K/stories260K.bin"; }
std::string Tok512() { return Fixtures() + "/stories260K/tok512.bin"; }

float At(const Llama2cModel& m, const std::string& name, int64_t r, int64_t c) {
  const Llama2cTensor* t = m.Find(name);
  EXPECT_NE(t, nullptr) << name;
  return t ? t->view.row<float>(r)[c] : NAN;
}

std::string I32(int32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }

Result<Llama2cModel> FromString(const std::string& bytes) {
  return Llama2cModel::FromBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                 "m.bin");
}

// Header values and weights as the fixture README and an independent numpy
// read of the file give them.
TEST(Llama2c, ImportsStories260K) {
  REQUIRE_FIXTURE(Stories());
  auto m = Llama2cModel::Open(Stories());
  ASSERT_TRUE(m.ok()) << m.status().message();
  const Llama2cConfig& c = m->config();
  EXPECT_EQ(c.version, 0);
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_EQ(c.head_size(), 8);
  EXPECT_EQ(c.kv_dim(), 32);
  EXPECT_EQ(m->parameter_count(), 260032);
  EXPECT_EQ(m->tensors().size(), 1u + 5 * 9 + 1);
  EXPECT_EQ(m->Find("output.weight"), nullptr);
  EXPECT_EQ(m->tensors().front().name, "token_embd.weight");
  EXPECT_EQ(m->tensors().back().name, "output_norm.weight");

  EXPECT_EQ(m->Find("token_embd.weight")->view.ShapeString(), "[512, 64]");
  EXPECT_EQ(m->Find("blk.0.attn_q.weight")->view.ShapeString(), "[64, 64]");
  EXPECT_EQ(m->Find("blk.1.attn_k.weight")->view.ShapeString(), "[32, 64]");
  EXPECT_EQ(m->Find("blk.2.attn_v.weight")->view.ShapeString(), "[32, 64]");
  EXPECT_EQ(m->Find("blk.3.ffn_gate.weight")->view.ShapeString(), "[172, 64]");
  EXPECT_EQ(m->Find("blk.4.ffn_down.weight")->view.ShapeString(), "[64, 172]");
  EXPECT_EQ(m->Find("blk.4.ffn_up.weight")->view.ShapeString(), "[172, 64]");
  EXPECT_EQ(m->Find("output_norm.weight")->view.ShapeString(), "[64]");

  // First values of each array (numpy over the raw file).
  EXPECT_EQ(At(*m, "token_embd.weight", 0, 0), -0.29474878311157227f);
  EXPECT_EQ(At(*m, "token_embd.weight", 0, 1), 0.5618956089019775f);
  EXPECT_EQ(At(*m, "token_embd.weight", 0, 2), 0.1754225343465805f);
  EXPECT_EQ(At(*m, "token_embd.weight", 511, 63), -0.424032598733902f);
  EXPECT_EQ(At(*m, "blk.0.attn_norm.weight", 0, 0), 0.9722429513931274f);
  EXPECT_EQ(At(*m, "blk.4.attn_norm.weight", 0, 63), 1.0649559497833252f);
  EXPECT_EQ(At(*m, "blk.0.attn_q.weight", 0, 0), 0.04439278692007065f);
  EXPECT_EQ(At(*m, "blk.0.attn_k.weight", 0, 0), 0.2161301076412201f);
  EXPECT_EQ(At(*m, "blk.2.attn_k.weight", 0, 0), 0.05322672799229622f);
  EXPECT_EQ(At(*m, "blk.0.attn_v.weight", 0, 0), 0.09112543612718582f);
  EXPECT_EQ(At(*m, "blk.0.attn_output.weight", 0, 0), 0.017344146966934204f);
  EXPECT_EQ(At(*m, "blk.0.ffn_norm.weight", 0, 0), 0.7367770671844482f);
  EXPECT_EQ(At(*m, "blk.0.ffn_gate.weight", 0, 0), 0.21368665993213654f);
  EXPECT_EQ(At(*m, "blk.0.ffn_down.weight", 0, 0), 0.13498419523239136f);
  EXPECT_EQ(At(*m, "blk.4.ffn_down.weight", 63, 171), -0.0035068716388195753f);
  EXPECT_EQ(At(*m, "blk.1.ffn_down.weight", 10, 100), -0.0028175238985568285f);
  EXPECT_EQ(At(*m, "blk.0.ffn_up.weight", 0, 0), 0.07037118822336197f);
  EXPECT_EQ(At(*m, "blk.4.ffn_up.weight", 171, 63), 0.10603193938732147f);
  EXPECT_EQ(At(*m, "output_norm.weight", 0, 0), 2.4583089351654053f);
  EXPECT_EQ(At(*m, "output_norm.weight", 0, 63), 1.7077769041061401f);
}

// llama.cpp's converter turned the same .bin into stories260K.gguf: every
// tensor we import must equal the GGUF's, bit for bit, under the same name
// and shape (GGUF writes the shared classifier out as output.weight).
TEST(Llama2c, MatchesLlamaCppConversion) {
  const std::string gguf_path = Fixtures() + "/stories260K-gguf/stories260K.gguf";
  REQUIRE_FIXTURE(Stories());
  REQUIRE_FIXTURE(gguf_path);
  auto m = Llama2cModel::Open(Stories());
  auto g = GgufFile::Open(gguf_path);
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ(g->tensors().size(), m->tensors().size() + 1);
  for (const Llama2cTensor& t : m->tensors()) {
    const GgufTensorInfo* gt = g->FindTensor(t.name);
    ASSERT_NE(gt, nullptr) << t.name;
    EXPECT_EQ(gt->view.ShapeString(), t.view.ShapeString()) << t.name;
    ASSERT_EQ(gt->view.byte_size(), t.view.byte_size()) << t.name;
    EXPECT_EQ(std::memcmp(gt->view.data, t.view.data, t.view.byte_size()), 0) << t.name;
  }
  const GgufTensorInfo* out = g->FindTensor("output.weight");
  ASSERT_NE(out, nullptr);
  const auto& emb = m->Find("token_embd.weight")->view;
  EXPECT_EQ(std::memcmp(out->view.data, emb.data, emb.byte_size()), 0);
}

// Bytes of an array of the v0 file, by its float offset and count.
std::string Floats(const std::string& file, uint64_t first, uint64_t count) {
  return file.substr(28 + 4 * first, 4 * count);
}

// A version-1 "ak42" file built here from the v0 bytes, laid out as llama2.c's
// export.py writes it; it must import to the same tensors, byte for byte.
TEST(Llama2c, ImportsVersion1SynthesizedFromVersion0) {
  REQUIRE_FIXTURE(Stories());
  auto v0_bytes = ReadFile(Stories());
  ASSERT_TRUE(v0_bytes.ok());
  const std::string& v0 = *v0_bytes;
  // v0 float offsets (README table): emb 0, rms_att 32768, wq 33088, wk 53568,
  // wv 63808, wo 74048, rms_ffn 94528, w1 94848, w2 149888, w3 204928,
  // rms_final 259968.
  std::string v1;
  v1 += I32(int32_t(kLlama2cMagic)) + I32(1);
  v1 += v0.substr(0, 28);
  v1 += '\x01';
  v1.resize(256, '\0');
  v1 += Floats(v0, 32768, 320) + Floats(v0, 94528, 320) + Floats(v0, 259968, 64) +
        Floats(v0, 0, 32768) + Floats(v0, 33088, 20480) + Floats(v0, 53568, 10240) +
        Floats(v0, 63808, 10240) + Floats(v0, 74048, 20480) + Floats(v0, 94848, 55040) +
        Floats(v0, 149888, 55040) + Floats(v0, 204928, 55040);
  ASSERT_EQ(v1.size(), 1040384u);  // the size of llama2.zig's checkpoint_v1.bin
  auto a = Llama2cModel::Open(Stories());
  auto b = FromString(v1);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().message();
  EXPECT_EQ(b->config().version, 1);
  EXPECT_EQ(b->config().dim, 64);
  EXPECT_EQ(b->config().vocab_size, 512);
  EXPECT_TRUE(b->config().shared_classifier);
  ASSERT_EQ(a->tensors().size(), b->tensors().size());
  for (size_t i = 0; i < a->tensors().size(); ++i) {
    const auto& ta = a->tensors()[i];
    const auto& tb = b->tensors()[i];
    ASSERT_EQ(ta.name, tb.name);
    ASSERT_EQ(ta.view.ShapeString(), tb.view.ShapeString());
    EXPECT_EQ(std::memcmp(ta.view.data, tb.view.data, ta.view.byte_size()), 0) << ta.name;
  }

  // Unshared classifier: flag 0 and wcls appended.
  std::string unshared = v1;
  unshared[36] = 0;
  unshared += Floats(v0, 0, 32768);
  for (size_t i = unshared.size() - 4 * 32768; i < unshared.size(); ++i) unshared[i] ^= 0x40;
  auto u = FromString(unshared);
  ASSERT_TRUE(u.ok()) << u.status().message();
  EXPECT_FALSE(u->config().shared_classifier);
  ASSERT_NE(u->Find("output.weight"), nullptr);
  EXPECT_EQ(u->tensors().back().name, "output.weight");
  EXPECT_EQ(u->Find("output.weight")->view.ShapeString(), "[512, 64]");
  EXPECT_EQ(std::memcmp(u->Find("output.weight")->view.data,
                        unshared.data() + unshared.size() - 4 * 32768, 4 * 32768),
            0);

  // Wrong sizes and versions.
  EXPECT_THAT(FromString(v1.substr(0, v1.size() - 1)).status().message(),
              HasSubstr("m.bin: file is 1040383 bytes but the version 1 header (dim=64, "
                        "hidden_dim=172, n_layers=5, n_heads=8, n_kv_heads=4, vocab_size=512, "
                        "seq_len=512, shared classifier) implies 1040384 bytes"));
  std::string v2 = v1;
  v2[4] = 2;
  EXPECT_THAT(FromString(v2).status().message(),
              HasSubstr("export version 2 is not supported (only 0 and 1; version 2 is int8"));
  std::string bad_flag = v1;
  bad_flag[36] = 7;
  EXPECT_THAT(FromString(bad_flag).status().message(), HasSubstr("shared_classifier byte is 7"));
  EXPECT_THAT(FromString(v1.substr(0, 100)).status().message(),
              HasSubstr("too short for the 256-byte \"ak42\" header"));
}

// A tiny legacy model with an unshared classifier (negative vocab size).
std::string TinyV0(int32_t vocab, bool with_wcls) {
  const int32_t D = 4, F = 6, L = 2, H = 2, KV = 1, S = 3;
  std::string out = I32(D) + I32(F) + I32(L) + I32(H) + I32(KV) + I32(vocab) + I32(S);
  const int32_t V = std::abs(vocab), hs = D / H, kv = KV * hs;
  const int64_t n = int64_t(V) * D + L * D + L * D * D + 2 * L * kv * D + L * D * D + L * D +
                    3 * L * F * D + D + 2 * (S * hs / 2) + (with_wcls ? V * D : 0);
  for (int64_t i = 0; i < n; ++i) {
    const float f = float(i);
    out.append(reinterpret_cast<const char*>(&f), 4);
  }
  return out;
}

TEST(Llama2c, LegacyUnsharedClassifierAndOffsets) {
  const std::string bytes = TinyV0(-10, true);  // views point into it
  auto m = FromString(bytes);
  ASSERT_TRUE(m.ok()) << m.status().message();
  const auto& c = m->config();
  EXPECT_EQ(c.vocab_size, 10);
  EXPECT_FALSE(c.shared_classifier);
  // Element i of the file's float array holds i: check where each tensor starts.
  // emb 40, rms_att 8, wq 32, wk 16, wv 16, wo 32, rms_ffn 8, w1/w2/w3 48 each,
  // rms_final 4, freq 3 + 3, wcls 40.
  EXPECT_EQ(At(*m, "token_embd.weight", 9, 3), 39.0f);
  EXPECT_EQ(At(*m, "blk.0.attn_norm.weight", 0, 0), 40.0f);
  EXPECT_EQ(At(*m, "blk.1.attn_norm.weight", 0, 0), 44.0f);
  EXPECT_EQ(At(*m, "blk.0.attn_q.weight", 0, 0), 48.0f);
  EXPECT_EQ(At(*m, "blk.1.attn_q.weight", 0, 0), 64.0f);
  EXPECT_EQ(At(*m, "blk.0.attn_k.weight", 0, 0), 80.0f);
  EXPECT_EQ(At(*m, "blk.1.attn_k.weight", 1, 3), 95.0f);
  EXPECT_EQ(At(*m, "blk.0.attn_v.weight", 0, 0), 96.0f);
  EXPECT_EQ(At(*m, "blk.0.attn_output.weight", 0, 0), 112.0f);
  EXPECT_EQ(At(*m, "blk.0.ffn_norm.weight", 0, 0), 144.0f);
  EXPECT_EQ(At(*m, "blk.0.ffn_gate.weight", 0, 0), 152.0f);
  EXPECT_EQ(At(*m, "blk.0.ffn_down.weight", 0, 0), 200.0f);
  EXPECT_EQ(At(*m, "blk.1.ffn_down.weight", 3, 5), 247.0f);
  EXPECT_EQ(At(*m, "blk.0.ffn_up.weight", 0, 0), 248.0f);
  EXPECT_EQ(At(*m, "output_norm.weight", 0, 0), 296.0f);
  EXPECT_EQ(At(*m, "output.weight", 0, 0), 306.0f);  // after 2 x 3 freq_cis floats
  EXPECT_EQ(At(*m, "output.weight", 9, 3), 345.0f);
  EXPECT_EQ(m->Find("blk.0.attn_k.weight")->view.ShapeString(), "[2, 4]");

  // Negative vocab promises a wcls that is not there.
  EXPECT_THAT(FromString(TinyV0(-10, false)).status().message(),
              HasSubstr("but the version 0 header (dim=4, hidden_dim=6, n_layers=2, n_heads=2, "
                        "n_kv_heads=1, vocab_size=10, seq_len=3, unshared classifier) implies"));
}

TEST(Llama2c, RejectsBadHeadersAndSizes) {
  const std::string good = TinyV0(10, false);
  ASSERT_TRUE(FromString(good).ok());
  for (size_t n : {size_t(0), size_t(27), size_t(28), good.size() - 1}) {
    auto r = FromString(good.substr(0, n));
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_THAT(r.status().message(), HasSubstr("m.bin: ")) << n;
  }
  EXPECT_THAT(FromString(good.substr(0, 27)).status().message(),
              HasSubstr("too short for the 28-byte llama2.c header"));
  EXPECT_THAT(FromString(good + "x").status().message(),
              HasSubstr(fmt::format("file is {} bytes but", good.size() + 1)));
  EXPECT_THAT(FromString(good + "x").status().message(),
              HasSubstr(fmt::format("implies {} bytes", good.size())));
  auto with = [&](int field, int32_t v) {
    std::string b = good;
    std::memcpy(&b[4 * field], &v, 4);
    return FromString(b).status().message();
  };
  EXPECT_THAT(with(0, 0), HasSubstr("version 0 header: dim = 0 must be positive"));
  EXPECT_THAT(with(3, 3), HasSubstr("dim 4 is not a multiple of n_heads 3"));
  EXPECT_THAT(with(4, 3), HasSubstr("n_heads 2 is not a multiple of n_kv_heads 3"));
  EXPECT_THAT(with(6, -1), HasSubstr("seq_len = -1 must be positive"));
  EXPECT_THAT(with(1, 1 << 30), HasSubstr("hidden_dim = 1073741824 is implausibly large"));
  // Large but allowed values: the size check fails without overflow.
  std::string big = good;
  const int32_t huge[] = {1 << 24, 1 << 24, 1 << 24, 1, 1, 1 << 24, 1 << 24};
  std::memcpy(&big[0], huge, 28);
  EXPECT_THAT(FromString(big).status().message(), HasSubstr("implies"));
  auto missing = Llama2cModel::Open("/nonexistent/model.bin");
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/model.bin: cannot open"));
}

TEST(Llama2cTokenizer, ParsesTok512) {
  REQUIRE_FIXTURE(Tok512());
  auto v = ReadLlama2cTokenizer(Tok512(), 512);
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(v->max_token_length, 7);
  ASSERT_EQ(v->pieces.size(), 512u);
  ASSERT_EQ(v->scores.size(), 512u);
  EXPECT_EQ(v->pieces[0], "<unk>");
  EXPECT_EQ(v->pieces[1], "\n<s>\n");
  EXPECT_EQ(v->pieces[2], "\n</s>\n");
  EXPECT_EQ(v->pieces[3], "<0x00>");
  EXPECT_EQ(v->pieces[258], "<0xFF>");
  EXPECT_EQ(v->pieces[259], " t");
  EXPECT_EQ(v->pieces[260], "he");
  EXPECT_EQ(v->pieces[261], " a");
  EXPECT_EQ(v->pieces[511], "\xe2\x80\x8a");
  EXPECT_EQ(v->scores[0], 0.0f);
  EXPECT_EQ(v->scores[260], -1.0f);
  EXPECT_EQ(v->scores[511], -252.0f);
  for (const auto& p : v->pieces) EXPECT_LE(p.size(), 7u);

  auto more = ReadLlama2cTokenizer(Tok512(), 513);
  EXPECT_THAT(more.status().message(),
              HasSubstr("token 512 at offset 6227: the file ends inside its score and length"));
  auto fewer = ReadLlama2cTokenizer(Tok512(), 511);
  EXPECT_THAT(fewer.status().message(),
              HasSubstr("tok512.bin: 11 bytes follow the 511 tokens the model's vocab size"));
}

std::string Token(float score, int32_t len, const std::string& bytes) {
  return std::string(reinterpret_cast<const char*>(&score), 4) + I32(len) + bytes;
}

Result<Llama2cVocab> ParseTok(const std::string& b, int64_t n) {
  return ParseLlama2cTokenizer(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "t.bin", n);
}

TEST(Llama2cTokenizer, RejectsBadInput) {
  const std::string good = I32(3) + Token(0, 1, "a") + Token(-1, 3, "abc");
  auto ok = ParseTok(good, 2);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->pieces[1], "abc");
  EXPECT_EQ(ok->scores[1], -1.0f);
  for (size_t n = 0; n < good.size(); ++n) EXPECT_FALSE(ParseTok(good.substr(0, n), 2).ok()) << n;
  EXPECT_THAT(ParseTok(good.substr(0, good.size() - 1), 2).status().message(),
              HasSubstr("t.bin: token 1 at offset 13: its 3 bytes run past the end of the file"));
  EXPECT_THAT(ParseTok(I32(3) + Token(0, -5, "") + Token(0, 0, ""), 2).status().message(),
              HasSubstr("token 0 at offset 4: length -5 is negative"));
  EXPECT_THAT(ParseTok(I32(2) + Token(0, 3, "abc") + Token(0, 0, ""), 2).status().message(),
              HasSubstr("length 3 exceeds max_token_length 2"));
  EXPECT_THAT(ParseTok(I32(0) + Token(0, 0, ""), 1).status().message(),
              HasSubstr("max_token_length 0 must be positive"));
  EXPECT_THAT(ParseTok(good, 1000000).status().message(),
              HasSubstr("too short for 1000000 tokens"));
  EXPECT_THAT(ParseTok(good, 0).status().message(), HasSubstr("vocab size 0 is out of range"));
}

}  // namespace
}  // namespace lumen::formats
