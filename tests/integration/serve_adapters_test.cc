// Adapters at serve time, end to end through `lumen serve` (embedded
// stories260K, random PEFT adapters written by the test): the /v1/adapters
// endpoints, the request "adapter" field in the OpenAI, Anthropic and
// Responses bodies, and mount / replace / unmount while requests run.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "lumen/engine/adapter_test_util.h"
#include "lumen/engine/default_model.h"
#include "lumen_cli.h"
#include "serve_http.h"

namespace {

namespace fs = std::filesystem;
using lumen::testing::http::Post;
using lumen::testing::http::Request;
using lumen::testing::http::ServerProcess;
using json = nlohmann::json;
using lumen::testing_util::RandomAdapterSpec;
using lumen::testing_util::WriteRandomAdapter;
namespace model = lumen::model;

constexpr const char* kPrompt = "Once upon a time";

class AdapterServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("lumen_serve_adapters_" + std::to_string(::getpid())));
    fs::create_directories(*dir_);
    auto m = lumen::engine::LoadDefaultModel();
    ASSERT_TRUE(m.ok()) << m.status().message();
    const model::ModelConfig& c = (*m)->config();
    ASSERT_TRUE(WriteRandomAdapter(
        Dir("a1"), c,
        {{model::kLoraQ, model::kLoraK, model::kLoraV, model::kLoraO}, 4, 8, 0.2f, 1}));
    ASSERT_TRUE(WriteRandomAdapter(
        Dir("a2"), c, {{model::kLoraGate, model::kLoraUp, model::kLoraDown}, 2, 4, 0.2f, 2}));
    model::ModelConfig wide = c;
    wide.dim *= 2;
    ASSERT_TRUE(WriteRandomAdapter(Dir("wide"), wide, {{model::kLoraQ}, 2, 2, 0.1f, 3}));
    server_ = new ServerProcess({"--parallel", "4", "--prompt-cache-mb", "64", "--adapter",
                                 "ref1=" + Dir("a1"), "--adapter", "ref2=" + Dir("a2"), "--adapter",
                                 "a=" + Dir("a1")});
    ASSERT_GT(server_->port(), 0) << server_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(), 0) << server_->log();
    delete server_;
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }
  static std::string Dir(const std::string& name) { return (*dir_ / name).string(); }
  int port() const { return server_->port(); }
  // Greedy text of `path` (chat, completions, messages or responses) with
  // adapter spec `adapter` ("" : the field is left out); "" on failure.
  std::string Greedy(const std::string& adapter, int max_tokens = 16, bool stream = false,
                     int* status = nullptr) {
    json b = {{"prompt", kPrompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
    if (!adapter.empty()) b["adapter"] = adapter;
    if (stream) b["stream"] = true;
    auto r = Post(port(), "/v1/completions", b);
    if (status) *status = r.status;
    if (r.status != 200) return "";
    if (!stream) return r.Json()["choices"][0]["text"].get<std::string>();
    std::string text;
    for (const auto& e : lumen::testing::http::ParseSse(r.body)) {
      if (e.data == "[DONE]") break;
      json c = json::parse(e.data, nullptr, false);
      if (c.is_object() && !c["choices"].empty()) text += c["choices"][0].value("text", "");
    }
    return text;
  }
  static ServerProcess* server_;
  static fs::path* dir_;
};
ServerProcess* AdapterServer::server_ = nullptr;
fs::path* AdapterServer::dir_ = nullptr;

TEST_F(AdapterServer, ListMountReplaceDelete) {
  auto l = Request(port(), "GET", "/v1/adapters");
  ASSERT_EQ(l.status, 200) << l.body;
  json list = l.Json();
  ASSERT_EQ(list["data"].size(), 3u) << l.body;
  EXPECT_EQ(list["data"][0]["id"], "a");
  EXPECT_EQ(list["data"][1]["id"], "ref1");
  EXPECT_EQ(list["data"][2]["id"], "ref2");
  const json& a = list["data"][0];
  EXPECT_EQ(a["object"], "adapter");
  EXPECT_EQ(a["rank"], 4);
  EXPECT_EQ(a["scale"], 2.0);
  EXPECT_EQ(a["layers"], 5);
  EXPECT_EQ(a["targets"], json({"q_proj", "k_proj", "v_proj", "o_proj"}));
  EXPECT_EQ(a["path"], fs::absolute(Dir("a1")).lexically_normal().string());

  auto m = Post(port(), "/v1/adapters", {{"id", "b"}, {"path", Dir("a2")}});
  ASSERT_EQ(m.status, 200) << m.body;
  EXPECT_EQ(m.Json()["rank"], 2);
  auto dup = Post(port(), "/v1/adapters", {{"id", "b"}, {"path", Dir("a1")}});
  EXPECT_EQ(dup.status, 409) << dup.body;
  EXPECT_EQ(dup.Json()["error"]["param"], "id");
  auto rep = Post(port(), "/v1/adapters", {{"id", "b"}, {"path", Dir("a1")}, {"replace", true}});
  ASSERT_EQ(rep.status, 200) << rep.body;
  EXPECT_EQ(rep.Json()["rank"], 4);
  const std::string before = Request(port(), "GET", "/v1/adapters").body;

  // Bad adapters: 400 with the reason, nothing changes.
  const std::pair<json, std::string> bad[] = {
      {{{"id", "b"}, {"path", Dir("wide")}, {"replace", true}}, "this base model needs"},
      {{{"id", "c"}, {"path", Dir("nope")}}, "not a directory"},
      {{{"id", "x+y"}, {"path", Dir("a1")}}, "id: 'x+y'"},
      {{{"id", "c"}}, "path: missing"},
      {{{"id", "c"}, {"path", 3}}, "path: must be a string"},
  };
  for (const auto& [body, why] : bad) {
    auto r = Post(port(), "/v1/adapters", body);
    EXPECT_EQ(r.status, 400) << body.dump() << " " << r.body;
    EXPECT_NE(r.Json()["error"]["message"].get<std::string>().find(why), std::string::npos)
        << r.body;
  }
  EXPECT_EQ(Request(port(), "GET", "/v1/adapters").body, before);

  EXPECT_EQ(Request(port(), "DELETE", "/v1/adapters/b").status, 200);
  auto gone = Request(port(), "DELETE", "/v1/adapters/b");
  EXPECT_EQ(gone.status, 404);
  EXPECT_NE(gone.Json()["error"]["message"].get<std::string>().find("'b'"), std::string::npos);
  EXPECT_EQ(Request(port(), "GET", "/v1/adapters").Json()["data"].size(), 3u);
}

TEST_F(AdapterServer, UnknownAdapterIs400InEachShape) {
  const json chat = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                     {"max_tokens", 4},
                     {"adapter", "ref1+nope"}};
  auto o = Post(port(), "/v1/chat/completions", chat);
  ASSERT_EQ(o.status, 400) << o.body;
  EXPECT_EQ(o.Json()["error"]["type"], "invalid_request_error");
  EXPECT_EQ(o.Json()["error"]["param"], "adapter");
  EXPECT_NE(o.Json()["error"]["message"].get<std::string>().find("no adapter 'nope'"),
            std::string::npos)
      << o.body;
  auto an = Post(port(), "/v1/messages", chat);
  ASSERT_EQ(an.status, 400) << an.body;
  EXPECT_EQ(an.Json()["type"], "error");
  EXPECT_EQ(an.Json()["error"]["type"], "invalid_request_error");
  EXPECT_NE(an.Json()["error"]["message"].get<std::string>().find("'nope'"), std::string::npos);
  auto rs = Post(port(), "/v1/responses", {{"input", "Hi"}, {"adapter", "nope"}});
  EXPECT_EQ(rs.status, 400) << rs.body;
  EXPECT_EQ(rs.Json()["error"]["param"], "adapter");
  auto ty = Post(port(), "/v1/completions", {{"prompt", "Hi"}, {"adapter", 5}});
  EXPECT_EQ(ty.status, 400);
  EXPECT_NE(ty.Json()["error"]["message"].get<std::string>().find("must be a string"),
            std::string::npos);
}

// The field works in every body, changes the output, and a mounted adapter
// gives exactly what `lumen generate --adapter DIR` gives.
TEST_F(AdapterServer, AdapterFieldMatchesGenerate) {
  const std::string base = Greedy(""), tuned = Greedy("ref1"), both = Greedy("ref1+ref2");
  ASSERT_FALSE(base.empty());
  EXPECT_NE(base, tuned);
  EXPECT_NE(tuned, both);
  EXPECT_EQ(Greedy("ref1", 16, /*stream=*/true), tuned);
  auto gen = lumen::testing::RunLumen(std::string("generate \"") + kPrompt +
                                      "\" -n 16 --temp 0 --no-echo --adapter " + Dir("a1"));
  ASSERT_EQ(gen.code, 0) << gen.err;
  auto trim = [](std::string s) {
    s.erase(0, s.find_first_not_of(" \n"));
    s.erase(s.find_last_not_of(" \n") + 1);
    return s;
  };
  EXPECT_EQ(trim(gen.out), trim(tuned));

  const json msgs = {{{"role", "user"}, {"content", "Tell me a story"}}};
  auto chat = [&](const std::string& path, const std::string& adapter) {
    json b = path == "/v1/responses" ? json{{"input", "Tell me a story"}, {"max_output_tokens", 12}}
                                     : json{{"messages", msgs}, {"max_tokens", 12}};
    b["temperature"] = 0;
    if (!adapter.empty()) b["adapter"] = adapter;
    auto r = Post(port(), path, b);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.Json();
  };
  EXPECT_NE(chat("/v1/chat/completions", "ref2")["choices"][0]["message"]["content"],
            chat("/v1/chat/completions", "")["choices"][0]["message"]["content"]);
  EXPECT_NE(chat("/v1/messages", "ref2")["content"][0]["text"],
            chat("/v1/messages", "")["content"][0]["text"]);
  EXPECT_NE(chat("/v1/responses", "ref2")["output"][0]["content"][0]["text"],
            chat("/v1/responses", "")["output"][0]["content"][0]["text"]);
}

// While clients send requests naming "a" (and none), "a" is replaced back
// and forth between two adapters and another id is mounted and deleted:
// every request succeeds with the output of one of a's two versions (never
// a mixture or an error), and after the churn new requests see the change.
TEST_F(AdapterServer, MountAndUnmountUnderLoad) {
  const std::string out0 = Greedy(""), out1 = Greedy("ref1"), out2 = Greedy("ref2");
  ASSERT_FALSE(out1.empty());
  ASSERT_NE(out1, out2);
  std::atomic<bool> done{false};
  std::mutex mu;
  std::vector<std::string> failures;
  int requests = 0;
  auto client = [&](int k) {
    for (int i = 0; i < 12; ++i) {
      const bool with = (i + k) % 3 != 0;
      int status = 0;
      const std::string got = Greedy(with ? "a" : "", 16, /*stream=*/(i % 2) == 1, &status);
      std::lock_guard<std::mutex> lock(mu);
      ++requests;
      if (status != 200 || (with ? got != out1 && got != out2 : got != out0))
        failures.push_back(std::to_string(status) + " '" + got + "'");
    }
  };
  std::vector<std::thread> clients;
  for (int k = 0; k < 6; ++k) clients.emplace_back(client, k);
  std::thread churn([&] {
    for (int i = 0; !done; ++i) {
      const std::string dir = Dir(i % 2 ? "a1" : "a2");
      auto r = Post(port(), "/v1/adapters", {{"id", "a"}, {"path", dir}, {"replace", true}});
      auto c = Post(port(), "/v1/adapters", {{"id", "c"}, {"path", Dir("a2")}});
      auto d = Request(port(), "DELETE", "/v1/adapters/c");
      if (r.status != 200 || c.status != 200 || d.status != 200) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back("churn: " + r.body + c.body + d.body);
      }
    }
  });
  for (auto& t : clients) t.join();
  done = true;
  churn.join();
  EXPECT_EQ(requests, 72);
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, first: " << failures[0];

  ASSERT_EQ(
      Post(port(), "/v1/adapters", {{"id", "a"}, {"path", Dir("a2")}, {"replace", true}}).status,
      200);
  EXPECT_EQ(Greedy("a"), out2);
  ASSERT_EQ(
      Post(port(), "/v1/adapters", {{"id", "a"}, {"path", Dir("a1")}, {"replace", true}}).status,
      200);
  EXPECT_EQ(Greedy("a"), out1);
  EXPECT_EQ(Request(port(), "DELETE", "/v1/adapters/a").status, 200);
  int status = 0;
  Greedy("a", 16, false, &status);
  EXPECT_EQ(status, 400);
  ASSERT_EQ(Post(port(), "/v1/adapters", {{"id", "a"}, {"path", Dir("a1")}}).status, 200);
}

// serve's --adapter: a bad NAME=DIR stops start-up with the reason; a bare
// DIR still applies to the whole model.
TEST(AdapterServeFlags, BadMountFailsStartAndBareDirAppliesToAll) {
  const fs::path d =
      fs::temp_directory_path() / ("lumen_serve_flags_" + std::to_string(::getpid()));
  auto r = lumen::testing::RunLumen("serve --port 0 --adapter x=" + (d / "nope").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--adapter x="), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("not a directory"), std::string::npos) << r.err;
  r = lumen::testing::RunLumen("serve --port 0 --adapter 'bad+id=" + d.string() + "'");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("the name 'bad+id'"), std::string::npos) << r.err;

  auto m = lumen::engine::LoadDefaultModel();
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(WriteRandomAdapter((d / "w").string(), (*m)->config(),
                                 {{model::kLoraV, model::kLoraDown}, 4, 8, 0.2f, 9}));
  const json body = {{"prompt", kPrompt}, {"max_tokens", 12}, {"temperature", 0}};
  ServerProcess whole({"--adapter", (d / "w").string()});
  ASSERT_GT(whole.port(), 0) << whole.log();
  auto got = Post(whole.port(), "/v1/completions", body);
  ASSERT_EQ(got.status, 200) << got.body;
  ServerProcess none({});
  ASSERT_GT(none.port(), 0) << none.log();
  auto plain = Post(none.port(), "/v1/completions", body);
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_EQ(none.Stop(), 0);
  auto gen =
      lumen::testing::RunLumen(std::string("generate \"") + kPrompt +
                               "\" -n 12 --temp 0 --no-echo --adapter " + (d / "w").string());
  ASSERT_EQ(gen.code, 0);
  const std::string text = got.Json()["choices"][0]["text"];
  EXPECT_NE(plain.Json()["choices"][0]["text"], text);  // the adapter applies
  EXPECT_NE(gen.out.find(text.substr(text.find_first_not_of(' '))), std::string::npos)
      << gen.out << " vs " << text;
  EXPECT_EQ(whole.Stop(), 0);
  std::error_code ec;
  fs::remove_all(d, ec);
}

}  // namespace
