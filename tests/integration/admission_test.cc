// Memory admission in `lumen serve` end to end (server-api.md, "Context and
// admission"): prompt + max_tokens == context is admitted and one more is a
// 400 context_length_exceeded in the OpenAI chat, Anthropic messages and
// Responses shapes; a prompt that fills the context alone is refused; GET /fit
// equals `lumen fit --json` for the same configuration; /stats counts the
// refusals; a configuration over the memory budget does not start.
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "lumen_cli.h"
#include "serve_http.h"

namespace lumen::testing {
using namespace http;
namespace {

constexpr int kCtx = 64;

class Admission : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--ctx", std::to_string(kCtx), "--parallel", "2",
                                 "--memory-budget", "4", "--prompt-cache-mb", "0"});
    ASSERT_GT(server_->port(), 0) << server_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(), 0) << server_->log();
    delete server_;
  }
  static int port() { return server_->port(); }
  static int Refused() {
    return Request(port(), "GET", "/stats").Json()["admission"]["refused_context"].get<int>();
  }
  static ServerProcess* server_;
};
ServerProcess* Admission::server_ = nullptr;

struct Endpoint {
  std::string path;
  std::string max_field;     // max_tokens / max_output_tokens
  std::string prompt_field;  // the param a prompt that fills the context names
  bool anthropic;
};

json Body(const Endpoint& e, const std::string& text, int max) {
  json b = {{"model", "m"}, {"seed", 1}, {e.max_field, max}};
  if (e.path == "/v1/responses")
    b["input"] = text;
  else
    b["messages"] = {{{"role", "user"}, {"content", text}}};
  return b;
}

int PromptTokens(const Endpoint& e, const json& j) {
  if (e.path == "/v1/chat/completions") return j["usage"]["prompt_tokens"];
  return j["usage"]["input_tokens"];
}

TEST_F(Admission, PromptPlusMaxTokensAtTheContextIsAdmittedOneMoreIsRefused) {
  const Endpoint eps[] = {{"/v1/chat/completions", "max_tokens", "messages", false},
                          {"/v1/messages", "max_tokens", "messages", true},
                          {"/v1/responses", "max_output_tokens", "input", false}};
  int refused = Refused();
  for (const auto& e : eps) {
    SCOPED_TRACE(e.path);
    const std::string text = "Once upon a time there was a cat";
    auto probe = Post(port(), e.path, Body(e, text, 1));
    ASSERT_EQ(probe.status, 200) << probe.body;
    const int P = PromptTokens(e, probe.Json());
    ASSERT_GT(P, 5);
    ASSERT_LT(P, kCtx);
    auto at = Post(port(), e.path, Body(e, text, kCtx - P));
    EXPECT_EQ(at.status, 200) << at.body;
    auto over = Post(port(), e.path, Body(e, text, kCtx - P + 1));
    ASSERT_EQ(over.status, 400) << over.body;
    const json j = over.Json();
    const std::string msg = j["error"]["message"];
    EXPECT_NE(msg.find("the prompt (" + std::to_string(P) + " tokens) plus " + e.max_field + " (" +
                       std::to_string(kCtx - P + 1) + ")"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("the context (" + std::to_string(kCtx) + " tokens)"), std::string::npos)
        << msg;
    if (e.anthropic) {
      EXPECT_EQ(j["type"], "error");
      EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    } else {
      EXPECT_EQ(j["error"]["type"], "invalid_request_error");
      EXPECT_EQ(j["error"]["code"], "context_length_exceeded");
      EXPECT_EQ(j["error"]["param"], e.max_field);
    }
    // A prompt that fills the context alone names the prompt field.
    std::string longer;
    for (int i = 0; i < kCtx; ++i) longer += "cat ";
    auto full = Post(port(), e.path, Body(e, longer, 1));
    ASSERT_EQ(full.status, 400) << full.body;
    if (!e.anthropic) {
      EXPECT_EQ(full.Json()["error"]["code"], "context_length_exceeded");
      EXPECT_EQ(full.Json()["error"]["param"], e.prompt_field);
    }
    EXPECT_NE(full.body.find("does not leave room in the context (64 tokens)"), std::string::npos)
        << full.body;
    refused += 2;
  }
  EXPECT_EQ(Refused(), refused);
}

TEST_F(Admission, FitAndStatsReportTheRunningConfiguration) {
  const json fit = Request(port(), "GET", "/fit").Json();
  ::setenv("LUMEN_THREADS", "1", 1);  // the server's transient bytes count its threads
  auto cli = RunLumen("fit --json --no-speed --ctx 64 --parallel 2 --memory-budget 4");
  ASSERT_EQ(cli.code, 0) << cli.err;
  EXPECT_EQ(fit, json::parse(cli.out)) << fit.dump() << "\n" << cli.out;
  EXPECT_EQ(fit["ctx"], kCtx);
  EXPECT_EQ(fit["parallel"], 2);
  EXPECT_EQ(fit["budget_bytes"], 4000000000ull);
  EXPECT_EQ(fit["fits"], true);
  const json a = Request(port(), "GET", "/stats").Json()["admission"];
  EXPECT_EQ(a["safe_context"], kCtx);
  EXPECT_EQ(a["parallel"], 2);
  EXPECT_EQ(a["kv_bytes_per_seq"], fit["kv_bytes_per_seq"]);
  EXPECT_EQ(a["budget_bytes"], fit["budget_bytes"]);
  EXPECT_EQ(a["total_bytes"], fit["total_bytes"]);
}

TEST(AdmissionStart, AConfigurationOverTheBudgetDoesNotStart) {
  // stories260K's weights alone are about 1 MB: 0.0001 GB cannot hold them.
  ServerProcess s({"--memory-budget", "0.0001", "--ctx", "64"});
  EXPECT_EQ(s.port(), 0) << s.log();
  EXPECT_EQ(s.Stop(), 1) << s.log();
  EXPECT_NE(s.log().find("more than the memory budget of 100000 bytes (--memory-budget)"),
            std::string::npos)
      << s.log();
  EXPECT_EQ(s.log().find("listening"), std::string::npos) << s.log();
}

// --clamp-max-tokens: llama-server's rule. The same over-long max_tokens is
// admitted and cut to the room left; the reply stops at the context's end.
TEST(AdmissionClamp, MaxTokensBeyondTheContextIsCutToTheRoomLeft) {
  ServerProcess s({"--ctx", std::to_string(kCtx), "--clamp-max-tokens", "--prompt-cache-mb", "0"});
  ASSERT_GT(s.port(), 0) << s.log();
  const Endpoint e{"/v1/chat/completions", "max_tokens", "messages", false};
  auto r = Post(s.port(), e.path, Body(e, "Once upon a time", 1000));
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.Json();
  const int total =
      j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>();
  if (j["choices"][0]["finish_reason"] == "length")
    EXPECT_EQ(total, kCtx) << r.body;  // ran to the end of the context
  else
    EXPECT_LT(total, kCtx) << r.body;  // the model ended its story first
  // A prompt that fills the context is still refused.
  auto full = Post(s.port(), e.path, Body(e, std::string(400, 'a'), 1));
  EXPECT_EQ(full.status, 400) << full.body;
  EXPECT_EQ(full.Json()["error"]["code"], "context_length_exceeded") << full.body;
  EXPECT_EQ(s.Stop(), 0) << s.log();
}

}  // namespace
}  // namespace lumen::testing
