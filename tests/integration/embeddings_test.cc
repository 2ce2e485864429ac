// POST /v1/embeddings and `lumen embed` end to end on a synth embedding model
// (`lumen synth tiny-qwen3 --format hf --pooling last`): token-id inputs
// equal the numpy golden (tests/goldens/embed), text inputs equal the CLI's
// vectors bit for bit, base64 decodes to the float vectors, dimensions
// truncate and re-normalize, the instruction prefix is the documented text,
// and bad requests are 400s naming the field.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "lumen_cli.h"
#include "serve_http.h"

namespace lumen::testing {
using namespace http;
namespace {

namespace fs = std::filesystem;

const std::string kGolden = std::string(LUMEN_SOURCE_DIR) + "/tests/goldens/embed/golden.json";

std::vector<uint8_t> Base64Decode(const std::string& s) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  std::vector<uint8_t> out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    const int v = val(c);
    if (v < 0) continue;  // '=' padding
    acc = acc << 6 | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(uint8_t(acc >> bits));
    }
  }
  return out;
}

double Norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s);
}

class Embeddings : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(TempDir("embed_serve") + "/m");
    auto r = RunLumen("synth tiny-qwen3 --format hf --pooling last -o " + *dir_);
    ASSERT_EQ(r.code, 0) << r.err;
    server_ = new ServerProcess({*dir_, "--ctx", "200"});
    ASSERT_GT(server_->port(), 0) << server_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(), 0) << server_->log();
    delete server_;
    fs::remove_all(fs::path(*dir_).parent_path());
    delete dir_;
  }
  static int port() { return server_->port(); }
  static std::vector<float> Vec(const json& item) { return item["embedding"]; }
  static ServerProcess* server_;
  static std::string* dir_;
};
ServerProcess* Embeddings::server_ = nullptr;
std::string* Embeddings::dir_ = nullptr;

TEST_F(Embeddings, TokenInputsMatchTheNumpyGolden) {
  std::ifstream f(kGolden);
  const json g = json::parse(f);
  const json& c = g["cases"][0];
  ASSERT_EQ(c["pooling"], "last");
  auto r = Post(port(), "/v1/embeddings", {{"model", "m"}, {"input", g["inputs"]}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.Json();
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), g["inputs"].size());
  int tokens = 0;
  for (size_t i = 0; i < g["inputs"].size(); ++i) {
    tokens += int(g["inputs"][i].size());
    EXPECT_EQ(j["data"][i]["object"], "embedding");
    EXPECT_EQ(j["data"][i]["index"], i);
    const auto v = Vec(j["data"][i]);
    const auto want = c["embeddings"][i].get<std::vector<double>>();
    ASSERT_EQ(v.size(), want.size());
    for (size_t d = 0; d < v.size(); ++d) EXPECT_NEAR(v[d], want[d], 2e-6) << i << "," << d;
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], tokens);
  EXPECT_EQ(j["usage"]["total_tokens"], tokens);
}

TEST_F(Embeddings, TextBase64DimensionsAndInstruction) {
  const json texts = {"The cat sat on the mat.", "A quick brown fox", "x"};
  auto fl = Post(port(), "/v1/embeddings", {{"input", texts}});
  ASSERT_EQ(fl.status, 200) << fl.body;
  auto b64 = Post(port(), "/v1/embeddings", {{"input", texts}, {"encoding_format", "base64"}});
  ASSERT_EQ(b64.status, 200) << b64.body;
  // The CLI embeds the same texts to the same bits.
  auto cli = RunLumen("embed " + *dir_ + " --json 'The cat sat on the mat.' 'A quick brown fox' x");
  ASSERT_EQ(cli.code, 0) << cli.err;
  const json cj = json::parse(cli.out);
  EXPECT_EQ(cj["pooling"], "last");
  EXPECT_EQ(cj["dimensions"], 64);
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto v = Vec(fl.Json()["data"][i]);
    ASSERT_EQ(v.size(), 64u);
    EXPECT_NEAR(Norm(v), 1.0, 1e-6);
    const auto bytes = Base64Decode(b64.Json()["data"][i]["embedding"]);
    ASSERT_EQ(bytes.size(), v.size() * 4);
    EXPECT_EQ(std::memcmp(bytes.data(), v.data(), bytes.size()), 0) << i;
    EXPECT_EQ(cj["data"][i]["embedding"].get<std::vector<float>>(), v) << i;
  }
  // dimensions: the first 16 components, re-normalized.
  auto d16 = Post(port(), "/v1/embeddings", {{"input", texts[0]}, {"dimensions", 16}});
  ASSERT_EQ(d16.status, 200) << d16.body;
  const auto full = Vec(fl.Json()["data"][0]);
  const auto cut = Vec(d16.Json()["data"][0]);
  ASSERT_EQ(cut.size(), 16u);
  const double n16 = Norm(std::vector<float>(full.begin(), full.begin() + 16));
  for (size_t d = 0; d < 16; ++d) EXPECT_NEAR(cut[d], full[d] / n16, 1e-6);
  // instruction: the Qwen3-Embedding prompt text.
  auto ins = Post(port(), "/v1/embeddings", {{"input", "cats"}, {"instruction", "Find pets"}});
  auto same = Post(port(), "/v1/embeddings", {{"input", "Instruct: Find pets\nQuery:cats"}});
  ASSERT_EQ(ins.status, 200) << ins.body;
  EXPECT_EQ(Vec(ins.Json()["data"][0]), Vec(same.Json()["data"][0]));
  EXPECT_NE(Vec(ins.Json()["data"][0]),
            Vec(Post(port(), "/v1/embeddings", {{"input", "cats"}}).Json()["data"][0]));
}

TEST_F(Embeddings, BadRequestsNameTheField) {
  struct Case {
    json body;
    std::string param, text;
  };
  const std::vector<Case> cases = {
      {{{"model", "m"}}, "input", "missing"},
      {{{"input", json::array()}}, "input", "empty array"},
      {{{"input", 3}}, "input", "must be a string"},
      {{{"input", {"a", ""}}}, "input[1]", "empty string"},
      {{{"input", "a"}, {"dimensions", 65}}, "dimensions", "65 is more than the model's 64"},
      {{{"input", "a"}, {"dimensions", 0}}, "dimensions", "positive integer"},
      {{{"input", "a"}, {"encoding_format", "hex"}}, "encoding_format", "base64"},
      {{{"input", {1, 99999}}}, "input", "outside the vocabulary"},
      {{{"input", {1, 2}}, {"instruction", "x"}}, "instruction", "text inputs"},
      {{{"input", json(std::vector<int>(201, 5))}}, "input", "201 tokens, more than the context"},
  };
  for (const auto& c : cases) {
    auto r = Post(port(), "/v1/embeddings", c.body);
    ASSERT_EQ(r.status, 400) << c.body.dump() << " " << r.body;
    const json e = r.Json()["error"];
    EXPECT_EQ(e["type"], "invalid_request_error");
    EXPECT_EQ(e["param"], c.param) << r.body;
    EXPECT_NE(e["message"].get<std::string>().find(c.text), std::string::npos) << r.body;
  }
  auto too_long = Post(port(), "/v1/embeddings", {{"input", json(std::vector<int>(201, 5))}});
  EXPECT_EQ(too_long.Json()["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(Request(port(), "GET", "/stats").Json()["admission"]["refused_context"], 2);
}

TEST(EmbeddingsRefused, AModelWithoutPoolingIsA400AndTheCliFails) {
  ServerProcess s({"--ctx", "64"});
  ASSERT_GT(s.port(), 0) << s.log();
  auto r = Post(s.port(), "/v1/embeddings", {{"input", "hello"}});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.Json()["error"]["param"], "model");
  EXPECT_NE(r.body.find("is not an embedding model"), std::string::npos) << r.body;
  EXPECT_EQ(s.Stop(), 0);
  auto cli = RunLumen("embed hello");
  EXPECT_EQ(cli.code, 1);
  EXPECT_NE(cli.err.find("is not an embedding model"), std::string::npos) << cli.err;
}

// serve --pooling (as embed --pooling) makes a generative model embed: the
// served vector is the CLI's, bit for bit.
TEST(EmbeddingsRefused, ServePoolingOverridesAModelWithoutPooling) {
  ServerProcess s({"--ctx", "64", "--pooling", "mean"});
  ASSERT_GT(s.port(), 0) << s.log();
  auto r = Post(s.port(), "/v1/embeddings", {{"input", "hello"}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.Json();
  EXPECT_EQ(s.Stop(), 0);
  auto cli = RunLumen("embed hello --pooling mean --json");
  ASSERT_EQ(cli.code, 0) << cli.err;
  const json c = json::parse(cli.out);
  EXPECT_EQ(c["pooling"], "mean");
  const std::vector<float> served = j["data"][0]["embedding"], printed = c["data"][0]["embedding"];
  ASSERT_FALSE(served.empty());
  EXPECT_EQ(served, printed);
}

}  // namespace
}  // namespace lumen::testing
