// End-to-end tests of `lumen serve`: each fixture starts the real binary
// (LUMEN_BINARY) on an ephemeral port with the embedded stories260K model or a
// `lumen synth tiny-qwen3` HF model, and talks HTTP to it over loopback.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "serve_http.h"

namespace {

using namespace lumen::testing::http;  // ServerProcess, Request, Post, ParseSse (serve_http.h)

json Chat(const std::string& text, int max_tokens, json extra = json::object()) {
  json b = {{"messages", {{{"role", "user"}, {"content", text}}}}, {"max_tokens", max_tokens}};
  b.update(extra);
  return b;
}

// More than one prefill chunk (kMaxChunk = 256 tokens) of the embedded
// model's tokens (272): on the default routes the prompt cache keeps whole
// chunks.
std::string LongStory() {
  std::string s;
  for (int i = 0; i < 18; ++i) s += "Once upon a time there was a little dog named Max. ";
  return s;
}

class EmbeddedServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--parallel", "4", "--prompt-cache-mb", "64"});
    ASSERT_GT(server_->port(), 0) << server_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(), 0) << server_->log();
    delete server_;
  }
  int port() const { return server_->port(); }
  static ServerProcess* server_;
};
ServerProcess* EmbeddedServer::server_ = nullptr;

TEST_F(EmbeddedServer, GetEndpoints) {
  auto h = Request(port(), "GET", "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.Json()["status"], "ok");
  auto m = Request(port(), "GET", "/v1/models");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.Json()["data"][0]["id"], "stories260K");
  EXPECT_EQ(m.Json()["object"], "list");
  {
    // created_at is `created` in RFC 3339.
    const json mo = m.Json()["data"][0];
    const auto t = static_cast<std::time_t>(mo["created"].get<int64_t>());
    std::tm tm{};
    gmtime_r(&t, &tm);
    char want[32];
    std::strftime(want, sizeof want, "%Y-%m-%dT%H:%M:%SZ", &tm);
    EXPECT_EQ(mo["created_at"], want);
    EXPECT_GT(mo["created"].get<int64_t>(), 1700000000);
  }
  EXPECT_EQ(Request(port(), "GET", "/v1/models/stories260K").status, 200);
  EXPECT_EQ(Request(port(), "GET", "/v1/models/other").status, 404);
  auto idx = Request(port(), "GET", "/v1");
  ASSERT_EQ(idx.status, 200);
  EXPECT_EQ(idx.Json()["data"].size(), 20u);  // 14 API routes + 6 web app endpoints
  auto st = Request(port(), "GET", "/stats");
  ASSERT_EQ(st.status, 200);
  EXPECT_EQ(st.Json()["parallel"], 4);
  EXPECT_TRUE(st.Json()["prompt_cache"].contains("hits"));
  EXPECT_TRUE(st.Json()["response_store"].contains("entries"));
  ASSERT_EQ(Post(port(), "/v1/chat/completions", Chat("Hi", 3)).status, 200);
  auto mt = Request(port(), "GET", "/metrics");
  ASSERT_EQ(mt.status, 200);
  EXPECT_NE(mt.body.find("lumen_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"}"),
            std::string::npos);
  EXPECT_NE(mt.body.find("# TYPE lumen_time_to_first_token_seconds histogram"), std::string::npos);
  EXPECT_NE(mt.body.find("lumen_time_to_first_token_seconds_bucket{le=\"+Inf\"}"),
            std::string::npos);
  EXPECT_NE(mt.body.find("lumen_queue_depth 0"), std::string::npos);
  auto nf = Request(port(), "GET", "/nope");
  EXPECT_EQ(nf.status, 404);
  EXPECT_TRUE(nf.Json()["error"]["message"].is_string());
}

TEST_F(EmbeddedServer, ChatCompletionAndStreamAgree) {
  const json req = Chat("Once upon a time", 12, {{"seed", 3}, {"temperature", 0.7}});
  auto r = Post(port(), "/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.Json();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  EXPECT_EQ(j["usage"]["total_tokens"].get<int>(), j["usage"]["prompt_tokens"].get<int>() + 12);
  const std::string text = j["choices"][0]["message"]["content"];

  json sreq = req;
  sreq["stream"] = true;
  sreq["stream_options"] = {{"include_usage", true}};
  auto s = Post(port(), "/v1/chat/completions", sreq);
  ASSERT_EQ(s.status, 200);
  EXPECT_NE(s.Header("Content-Type").find("text/event-stream"), std::string::npos);
  auto ev = ParseSse(s.body);
  ASSERT_GE(ev.size(), 4u);
  EXPECT_EQ(ev.back().data, "[DONE]");
  std::string streamed;
  json first = json::parse(ev[0].data);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  json usage_chunk = json::parse(ev[ev.size() - 2].data);
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], 12);
  json finish_chunk = json::parse(ev[ev.size() - 3].data);
  EXPECT_EQ(finish_chunk["choices"][0]["finish_reason"], "length");
  for (size_t i = 0; i + 1 < ev.size(); ++i) {
    json c = json::parse(ev[i].data);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    if (!c["choices"].empty() && c["choices"][0]["delta"].contains("content"))
      streamed += c["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(streamed, text);
}

TEST_F(EmbeddedServer, StopStringsLogprobsAndN) {
  // Find a word the model produces, then stop on it.
  auto r = Post(port(), "/v1/chat/completions", Chat("Once upon a time", 30, {{"temperature", 0}}));
  ASSERT_EQ(r.status, 200);
  const std::string full = r.Json()["choices"][0]["message"]["content"];
  ASSERT_GT(full.size(), 10u);
  const std::string stop = full.substr(full.size() / 2, 3);
  auto s = Post(port(), "/v1/chat/completions",
                Chat("Once upon a time", 30, {{"temperature", 0}, {"stop", stop}}));
  const std::string cut = s.Json()["choices"][0]["message"]["content"];
  EXPECT_EQ(cut, full.substr(0, full.find(stop)));
  EXPECT_EQ(s.Json()["choices"][0]["finish_reason"], "stop");

  auto lp = Post(
      port(), "/v1/chat/completions",
      Chat("Once upon a time", 4,
           {{"logprobs", true}, {"top_logprobs", 3}, {"seed", 1}, {"logit_bias", {{"2", -100}}}}));
  ASSERT_EQ(lp.status, 200) << lp.body;
  const json lpj = lp.Json();
  const json& content = lpj["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u) << lp.body;
  for (const auto& t : content) {
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    EXPECT_EQ(t["top_logprobs"].size(), 3u);
    EXPECT_GE(t["top_logprobs"][0]["logprob"].get<double>(),
              t["top_logprobs"][1]["logprob"].get<double>());
  }

  auto n = Post(port(), "/v1/chat/completions", Chat("Hi", 5, {{"n", 3}, {"seed", 9}}));
  ASSERT_EQ(n.status, 200);
  EXPECT_EQ(n.Json()["choices"].size(), 3u);
  EXPECT_EQ(n.Json()["usage"]["completion_tokens"], 15);
}

TEST_F(EmbeddedServer, Completions) {
  auto r = Post(port(), "/v1/completions",
                {{"prompt", "Once upon"},
                 {"max_tokens", 5},
                 {"echo", true},
                 {"logprobs", 2},
                 {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.Json();
  EXPECT_EQ(j["object"], "text_completion");
  const std::string text = j["choices"][0]["text"];
  EXPECT_EQ(text.rfind("Once upon ", 0), 0u) << text;  // echo, then the continuation's space
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"].size(), 5u);
  EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"][0].size(), 2u);
  // Token ids as the prompt give the same continuation.
  auto ids = Post(port(), "/v1/completions",
                  {{"prompt", {1, 403, 407}}, {"max_tokens", 3}, {"temperature", 0}});
  EXPECT_EQ(ids.status, 200) << ids.body;
  auto s =
      Post(port(), "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 4}, {"stream", true}});
  auto ev = ParseSse(s.body);
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev.back().data, "[DONE]");
  EXPECT_EQ(json::parse(ev[0].data)["object"], "text_completion");
  // Streamed logprobs carry the body's text_offset, echo included.
  json req = {{"prompt", "Once upon"}, {"max_tokens", 5},  {"echo", true},
              {"logprobs", 1},         {"temperature", 0}, {"stream", true}};
  json offsets = json::array();
  for (const auto& e : ParseSse(Post(port(), "/v1/completions", req).body)) {
    if (e.data == "[DONE]") continue;
    const json d = json::parse(e.data);
    const json& lp = d["choices"][0]["logprobs"];
    if (lp.is_object())
      for (const auto& o : lp["text_offset"]) offsets.push_back(o);
  }
  EXPECT_EQ(offsets, j["choices"][0]["logprobs"]["text_offset"]);
}

TEST_F(EmbeddedServer, AnthropicMessages) {
  json req = {
      {"model", "x"},
      {"max_tokens", 6},
      {"system", "Be brief."},
      {"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hello"}}}}}}}};
  auto r = Post(port(), "/v1/messages", req, {"anthropic-version: 2023-06-01"});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.Json();
  EXPECT_EQ(j["type"], "message");
  EXPECT_EQ(j["role"], "assistant");
  EXPECT_EQ(j["content"][0]["type"], "text");
  EXPECT_EQ(j["stop_reason"], "max_tokens");
  EXPECT_EQ(j["usage"]["output_tokens"], 6);

  req["stream"] = true;
  auto s = Post(port(), "/v1/messages", req);
  auto ev = ParseSse(s.body);
  std::vector<std::string> names;
  for (const auto& e : ev) {
    if (names.empty() || names.back() != e.event || e.event != "content_block_delta")
      names.push_back(e.event);
    EXPECT_EQ(json::parse(e.data)["type"], e.event);  // data.type mirrors the event name
  }
  const std::vector<std::string> want = {
      "message_start",      "content_block_start", "ping",        "content_block_delta",
      "content_block_stop", "message_delta",       "message_stop"};
  EXPECT_EQ(names, want);
  json delta = json::parse(ev[ev.size() - 2].data);
  EXPECT_EQ(delta["delta"]["stop_reason"], "max_tokens");
  EXPECT_EQ(delta["usage"]["output_tokens"], 6);
}

// With a prompt-cache hit the stream's final usage (message_delta, which
// Anthropic's SDKs fold into the message) is the body's: input_tokens
// without the cache reads.
TEST_F(EmbeddedServer, AnthropicStreamUsageIsTheBodysWithACacheHit) {
  json req = {{"max_tokens", 4},
              {"temperature", 0},
              {"messages", {{{"role", "user"}, {"content", LongStory() + " Then?"}}}}};
  ASSERT_EQ(Post(port(), "/v1/messages", req).status, 200);  // fills the cache
  const json body = Post(port(), "/v1/messages", req).Json();
  ASSERT_GT(body["usage"]["cache_read_input_tokens"].get<int>(), 0) << body.dump();
  req["stream"] = true;
  json delta;
  for (const auto& e : ParseSse(Post(port(), "/v1/messages", req).body))
    if (e.event == "message_delta") delta = json::parse(e.data);
  EXPECT_EQ(delta["usage"], body["usage"]);
}

// With tools offered (the text held for call parsing, or streamed as call
// pieces) the stream carries the body's logprobs, each token once.
TEST_F(EmbeddedServer, ChatStreamKeepsLogprobsWithTools) {
  const json tools =
      json::array({{{"type", "function"},
                    {"function", {{"name", "get_w"}, {"parameters", {{"type", "object"}}}}}}});
  for (const char* choice : {"auto", "required"}) {
    json req = {{"messages", {{{"role", "user"}, {"content", "Hello"}}}},
                {"max_tokens", 6},
                {"temperature", 0},
                {"logprobs", true},
                {"tools", tools},
                {"tool_choice", choice}};
    const json body = Post(port(), "/v1/chat/completions", req).Json();
    const json& want = body["choices"][0]["logprobs"]["content"];
    ASSERT_FALSE(want.empty()) << choice << body.dump();
    req["stream"] = true;
    json got = json::array();
    for (const auto& e : ParseSse(Post(port(), "/v1/chat/completions", req).body)) {
      if (e.data == "[DONE]") continue;
      const json d = json::parse(e.data);
      for (const auto& c : d["choices"])
        if (c["logprobs"].is_object())
          for (const auto& t : c["logprobs"]["content"]) got.push_back(t);
    }
    EXPECT_EQ(got, want) << choice;
  }
}

// An empty reply with tools offered: the body holds one empty text block,
// and the stream opens and closes the same block.
TEST_F(EmbeddedServer, AnthropicEmptyReplyWithToolsStreamsItsBlock) {
  json req = {{"max_tokens", 8},
              {"temperature", 0},
              {"stop_sequences", {" "}},
              {"tools", {{{"name", "get_w"}, {"input_schema", {{"type", "object"}}}}}},
              {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}}};
  const json body = Post(port(), "/v1/messages", req).Json();
  ASSERT_EQ(body["content"], json::parse(R"([{"type":"text","text":""}])")) << body.dump();
  req["stream"] = true;
  std::vector<std::string> blocks;
  for (const auto& e : ParseSse(Post(port(), "/v1/messages", req).body))
    if (e.event == "content_block_start")
      blocks.push_back(json::parse(e.data)["content_block"]["type"]);
  EXPECT_EQ(blocks, std::vector<std::string>{"text"});
}

TEST_F(EmbeddedServer, ResponsesWithPreviousResponseId) {
  auto r1 = Post(port(), "/v1/responses", {{"input", LongStory()}, {"max_output_tokens", 5}});
  ASSERT_EQ(r1.status, 200) << r1.body;
  json j1 = r1.Json();
  EXPECT_EQ(j1["instructions"], nullptr);
  EXPECT_EQ(j1["status"], "incomplete");
  EXPECT_EQ(j1["output"][0]["status"], "incomplete");
  EXPECT_EQ(j1["object"], "response");
  EXPECT_EQ(j1["output"][0]["type"], "message");
  EXPECT_EQ(j1["output"][0]["content"][0]["type"], "output_text");
  auto r2 =
      Post(port(), "/v1/responses",
           {{"input", "More."}, {"max_output_tokens", 5}, {"previous_response_id", j1["id"]}});
  ASSERT_EQ(r2.status, 200) << r2.body;
  json j2 = r2.Json();
  EXPECT_EQ(j2["previous_response_id"], j1["id"]);
  // The second prompt holds the first turn, the reply and the new input.
  EXPECT_GT(j2["usage"]["input_tokens"].get<int>(), j1["usage"]["input_tokens"].get<int>() + 3);
  EXPECT_GT(j2["usage"]["input_tokens_details"]["cached_tokens"].get<int>(), 0);
  // instructions are echoed, as OpenAI does (and apply to that response only).
  auto brief = Post(port(), "/v1/responses",
                    {{"input", "Hi"}, {"max_output_tokens", 2}, {"instructions", "Be brief."}});
  EXPECT_EQ(brief.Json()["instructions"], "Be brief.") << brief.body;
  auto missing =
      Post(port(), "/v1/responses", {{"input", "x"}, {"previous_response_id", "resp_nope"}});
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.Json()["error"]["param"], "previous_response_id");

  auto s =
      Post(port(), "/v1/responses", {{"input", "Hi"}, {"max_output_tokens", 4}, {"stream", true}});
  auto ev = ParseSse(s.body);
  ASSERT_GE(ev.size(), 8u);
  EXPECT_EQ(ev[0].event, "response.created");
  EXPECT_EQ(ev[1].event, "response.in_progress");
  EXPECT_EQ(ev[2].event, "response.output_item.added");
  EXPECT_EQ(ev[3].event, "response.content_part.added");
  // Cut by max_output_tokens: OpenAI ends such a stream with
  // response.incomplete, and marks the response and its message item so.
  EXPECT_EQ(ev.back().event, "response.incomplete");
  const json last = json::parse(ev.back().data)["response"];
  EXPECT_EQ(last["status"], "incomplete");
  EXPECT_EQ(last["output"][0]["status"], "incomplete");
  std::string text;
  for (size_t i = 0; i < ev.size(); ++i) {
    json d = json::parse(ev[i].data);
    EXPECT_EQ(d["sequence_number"], i);
    if (ev[i].event == "response.output_text.delta") text += d["delta"].get<std::string>();
  }
  EXPECT_EQ(json::parse(ev.back().data)["response"]["output"][0]["content"][0]["text"], text);
  auto st = Request(port(), "GET", "/stats").Json();
  EXPECT_GE(st["response_store"]["entries"].get<int>(), 2);
}

// item_reference input items resolve lumen's own output-item ids from the
// store: the referenced reply is in the prompt exactly as previous_response_id
// would put it.
TEST_F(EmbeddedServer, ResponsesItemReference) {
  auto r1 = Post(port(), "/v1/responses",
                 {{"input", "Tell me a story."}, {"max_output_tokens", 6}, {"seed", 4}});
  ASSERT_EQ(r1.status, 200) << r1.body;
  const json j1 = r1.Json();
  const std::string msg_id = j1["output"][0]["id"];
  ASSERT_EQ(msg_id.rfind("msg_", 0), 0u) << r1.body;
  const json turn2 = {{"role", "user"}, {"content", "More."}};
  auto by_ref = Post(port(), "/v1/responses",
                     {{"input",
                       {{{"role", "user"}, {"content", "Tell me a story."}},
                        {{"type", "item_reference"}, {"id", msg_id}},
                        turn2}},
                      {"max_output_tokens", 4},
                      {"temperature", 0}});
  auto by_prev = Post(port(), "/v1/responses",
                      {{"input", {turn2}},
                       {"previous_response_id", j1["id"]},
                       {"max_output_tokens", 4},
                       {"temperature", 0}});
  ASSERT_EQ(by_ref.status, 200) << by_ref.body;
  ASSERT_EQ(by_prev.status, 200) << by_prev.body;
  EXPECT_EQ(by_ref.Json()["usage"]["input_tokens"], by_prev.Json()["usage"]["input_tokens"]);
  EXPECT_EQ(by_ref.Json()["output_text"], by_prev.Json()["output_text"]);
  EXPECT_GT(by_ref.Json()["usage"]["input_tokens"].get<int>(),
            j1["usage"]["input_tokens"].get<int>() + 3);
  for (const char* id : {"msg_nope", "fc_nope_0", "rs_1"}) {
    auto bad =
        Post(port(), "/v1/responses",
             {{"input",
               {{{"role", "user"}, {"content", "x"}}, {{"type", "item_reference"}, {"id", id}}}}});
    EXPECT_EQ(bad.status, 404) << bad.body;
    EXPECT_EQ(bad.Json()["error"]["param"], "input[1].id") << bad.body;
    EXPECT_NE(bad.body.find(id), std::string::npos) << bad.body;
  }
  auto no_id = Post(port(), "/v1/responses", {{"input", {{{"type", "item_reference"}}}}});
  EXPECT_EQ(no_id.status, 400) << no_id.body;
  EXPECT_EQ(no_id.Json()["error"]["param"], "input[0].id") << no_id.body;
}

TEST_F(EmbeddedServer, InvalidRequestsNameTheField) {
  struct Case {
    const char* path;
    std::string body;
    int status;
    const char* field;  // expected in error.param (OpenAI) / the message (Anthropic)
  };
  const json msgs = {{{"role", "user"}, {"content", "hi"}}};
  const std::vector<Case> cases = {
      {"/v1/chat/completions", "{", 400, "body"},
      {"/v1/chat/completions", "[1,2]", 400, "body"},
      {"/v1/chat/completions",
       std::string("{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}"), 400, "body"},
      {"/v1/chat/completions", json{{"messages", json::array()}}.dump(), 400, "messages"},
      {"/v1/chat/completions", json{{"messages", "hi"}}.dump(), 400, "messages"},
      {"/v1/chat/completions", json{{"messages", {{{"role", "robot"}, {"content", "x"}}}}}.dump(),
       400, "messages[0].role"},
      {"/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", 5}}}}}.dump(), 400,
       "messages[0].content"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"max_tokens", -1}}.dump(), 400,
       "max_tokens"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"max_tokens", "10"}}.dump(), 400,
       "max_tokens"},
      {"/v1/chat/completions",
       json{{"messages", {{{"role", "user"}, {"content", std::string(3000, 'a')}}}}}.dump(), 400,
       "messages"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"temperature", "hot"}}.dump(), 400,
       "temperature"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"top_p", 1.5}}.dump(), 400, "top_p"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"stream", "yes"}}.dump(), 400, "stream"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"hlg", {{"width", -1}}}}.dump(), 400,
       "hlg.width"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"hlg", {{"bogus", 1}}}}.dump(), 400,
       "hlg.bogus"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"curve", {{"points", "x"}}}}.dump(), 400,
       "curve.points"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"logit_bias", {{"99999", 1}}}}.dump(), 400,
       "logit_bias.99999"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"n", 0}}.dump(), 400, "n"},
      {"/v1/chat/completions", json{{"messages", msgs}, {"stop", {1}}}.dump(), 400, "stop[0]"},
      {"/v1/chat/completions",
       json{{"messages", msgs}, {"response_format", {{"type", "json_schema"}}}}.dump(), 400,
       "response_format.json_schema"},
      {"/v1/chat/completions",
       json{{"messages", msgs},
            {"response_format",
             {{"type", "json_schema"},
              {"json_schema",
               {{"name", "x"},
                {"schema",
                 {{"type", "object"},
                  {"properties", {{"e", {{"type", "string"}, {"format", "email"}}}}}}}}}}}}
           .dump(),
       400, "response_format.json_schema.schema.properties.e.format"},
      {"/v1/chat/completions",
       json{{"messages", msgs},
            {"tools",
             {{{"type", "function"},
               {"function", {{"name", "f"}, {"parameters", {{"type", "array"}}}}}}}}}
           .dump(),
       400, "tools[0].function.parameters.type"},
      {"/v1/chat/completions",
       json{{"messages", msgs},
            {"tools", {{{"type", "function"}, {"function", {{"name", "bad name"}}}}}}}
           .dump(),
       400, "tools[0].function.name"},
      {"/v1/chat/completions",
       json{{"messages", msgs},
            {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}}
           .dump(),
       400, "tool_choice"},
      {"/v1/chat/completions", json{{"messages", {{{"role", "tool"}, {"content", "x"}}}}}.dump(),
       400, "messages[0].tool_call_id"},
      {"/v1/completions", json{{"prompt", 5}}.dump(), 400, "prompt"},
      {"/v1/completions", json{{"prompt", {1, 2, 99999}}}.dump(), 400, "prompt[2]"},
      {"/v1/completions", json{{"prompt", "x"}, {"echo", 1}}.dump(), 400, "echo"},
      {"/v1/responses", json{{"max_output_tokens", 5}}.dump(), 400, "input"},
      {"/v1/responses", json{{"input", {{{"type", "weird"}}}}}.dump(), 400, "input[0].type"},
      {"/v1/responses",
       json{{"input", "x"}, {"text", {{"format", {{"type", "json_schema"}}}}}}.dump(), 400,
       "text.format.schema"},
      {"/v1/responses",
       json{{"input", "x"},
            {"text",
             {{"format",
               {{"type", "json_schema"},
                {"name", "x"},
                {"schema", {{"type", "object"}, {"oneOf", json::array({{{"type", "null"}}})}}}}}}}}
           .dump(),
       400, "text.format.schema.oneOf"},

      {"/v1/responses",
       json{{"input", "x"},
            {"tools", {{{"type", "function"}, {"name", "f"}}}},
            {"tool_choice", {{"type", "function"}, {"name", "g"}}}}
           .dump(),
       400, "tool_choice"},
  };
  for (const auto& c : cases) {
    auto r = Request(port(), "POST", c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.path << " " << c.body << " -> " << r.body;
    json j = r.Json();
    ASSERT_TRUE(j.is_object()) << r.body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << r.body;
    EXPECT_EQ(j["error"]["param"], c.field) << c.body << " -> " << r.body;
    EXPECT_EQ(j["error"]["message"].get<std::string>().rfind(std::string(c.field) + ":", 0), 0u)
        << r.body;
  }
  // Anthropic shape.
  const std::vector<std::pair<json, std::string>> anth = {
      {{{"messages", msgs}}, "max_tokens"},
      {{{"max_tokens", 5}, {"messages", {{{"role", "system"}, {"content", "x"}}}}},
       "messages[0].role"},
      {{{"max_tokens", 5}, {"messages", {{{"role", "user"}, {"content", {{{"type", "image"}}}}}}}},
       "messages[0].content[0].type"},
      {{{"max_tokens", 5}, {"messages", msgs}, {"tools", {{{"name", "f"}}}}},
       "tools[0].input_schema"},
      {{{"max_tokens", 0}, {"messages", msgs}}, "max_tokens"},
      {{{"max_tokens", 5},
        {"messages", msgs},
        {"tools", {{{"name", "f"}, {"input_schema", {{"type", "object"}}}}}},
        {"tool_choice", {{"type", "tool"}, {"name", "g"}}}},
       "tool_choice"},
  };
  for (const auto& [body, field] : anth) {
    auto r = Post(port(), "/v1/messages", body);
    EXPECT_EQ(r.status, 400) << r.body;
    json j = r.Json();
    EXPECT_EQ(j["type"], "error") << r.body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["message"].get<std::string>().rfind(field + ":", 0), 0u) << r.body;
  }
  // The server is still fine.
  EXPECT_EQ(Request(port(), "GET", "/health").status, 200);
}

// Without max_tokens a reply runs until the context is full (finish
// "length"); an explicit max_tokens beyond the room left, or a prompt that
// fills the context, is refused (admission_test.cc has the boundaries).
TEST_F(EmbeddedServer, MaxTokensBeyondTheContextIsRefused) {
  json unset = Chat("Once upon a time", 1, {{"seed", 2}, {"logit_bias", {{"2", -100}}}});
  unset.erase("max_tokens");
  auto r = Post(port(), "/v1/chat/completions", unset);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.Json();
  const int ctx = 512;  // stories260K's context, the default here
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length") << r.body;
  EXPECT_EQ(j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>(),
            ctx)
      << r.body;
  auto over = Post(port(), "/v1/chat/completions", Chat("Once upon a time", 100000));
  EXPECT_EQ(over.status, 400) << over.body;
  EXPECT_EQ(over.Json()["error"]["code"], "context_length_exceeded") << over.body;
  // The Anthropic SDKs' default max_tokens does not fit a 512-token context.
  auto a = Post(port(), "/v1/messages",
                {{"model", "m"},
                 {"max_tokens", 4096},
                 {"messages", {{{"role", "user"}, {"content", "Hello"}}}}});
  EXPECT_EQ(a.status, 400) << a.body;
  EXPECT_EQ(a.Json()["error"]["type"], "invalid_request_error") << a.body;
  auto big = Post(port(), "/v1/messages",
                  {{"model", "m"},
                   {"max_tokens", 10},
                   {"messages", {{{"role", "user"}, {"content", std::string(3000, 'b')}}}}});
  EXPECT_EQ(big.status, 400) << big.body;
  EXPECT_NE(big.body.find("does not leave room in the context"), std::string::npos) << big.body;
}

TEST_F(EmbeddedServer, PromptCacheReusesConversationPrefix) {
  json m1 = {{{"role", "user"}, {"content", LongStory()}}};
  auto r1 = Post(port(), "/v1/chat/completions",
                 {{"messages", m1}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_EQ(r1.status, 200);
  json m2 = m1;
  m2.push_back({{"role", "assistant"}, {"content", r1.Json()["choices"][0]["message"]["content"]}});
  m2.push_back({{"role", "user"}, {"content", "What next?"}});
  const auto before = Request(port(), "GET", "/stats").Json()["prompt_cache"]["hits"].get<int>();
  auto r2 = Post(port(), "/v1/chat/completions",
                 {{"messages", m2}, {"max_tokens", 8}, {"temperature", 0}});
  ASSERT_EQ(r2.status, 200);
  const int cached = r2.Json()["usage"]["prompt_tokens_details"]["cached_tokens"];
  // The default routes (bf16 prefill) keep the whole 256-token chunks of the
  // first prompt (engine/scheduler.h RestoreLength).
  const int p1 = r1.Json()["usage"]["prompt_tokens"].get<int>();
  ASSERT_GE(p1, 256);
  EXPECT_EQ(cached, p1 / 256 * 256);
  EXPECT_LT(cached, r2.Json()["usage"]["prompt_tokens"].get<int>());
  auto st = Request(port(), "GET", "/stats").Json();
  EXPECT_GT(st["prompt_cache"]["hits"].get<int>(), before);
  EXPECT_GT(st["prompt_cache"]["bytes"].get<int64_t>(), 0);
}

// Batching must not change a seeded request's tokens.
TEST(ServerBatching, SameSeedAloneAndBesideOthers) {
  ServerProcess server({"--parallel", "4", "--prompt-cache-mb", "0"});
  ASSERT_GT(server.port(), 0) << server.log();
  const json req = Chat("The little bird", 40, {{"seed", 1234}, {"temperature", 0.9}});
  auto alone = Post(server.port(), "/v1/chat/completions", req);
  ASSERT_EQ(alone.status, 200);
  const std::string want = alone.Json()["choices"][0]["message"]["content"];
  std::vector<std::future<HttpResponse>> fs;
  fs.push_back(std::async(std::launch::async, [&] {
    return Post(server.port(), "/v1/chat/completions", Chat("Lily and Tom", 60, {{"seed", 1}}));
  }));
  fs.push_back(std::async(std::launch::async, [&] {
    return Post(server.port(), "/v1/completions",
                {{"prompt", "One day"}, {"max_tokens", 50}, {"seed", 2}});
  }));
  fs.push_back(std::async(std::launch::async,
                          [&] { return Post(server.port(), "/v1/chat/completions", req); }));
  std::vector<HttpResponse> rs;
  for (auto& f : fs) rs.push_back(f.get());
  for (const auto& r : rs) ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(rs[2].Json()["choices"][0]["message"]["content"], want);
  auto st = Request(server.port(), "GET", "/stats").Json();
  EXPECT_GT(st["batching"]["mean_rows_per_step"].get<double>(), 1.0);  // they did share steps
  EXPECT_EQ(server.Stop(), 0);
}

TEST(ServerLimits, AuthCorsAndBodySize) {
  ServerProcess server(
      {"--api-key", "sekret", "--cors", "http://example.test", "--max-body-mb", "0.001"});
  ASSERT_GT(server.port(), 0) << server.log();
  const int p = server.port();
  EXPECT_EQ(Request(p, "GET", "/health").status, 200);  // open, for load balancers
  auto no = Post(p, "/v1/chat/completions", Chat("hi", 2));
  EXPECT_EQ(no.status, 401);
  EXPECT_EQ(no.Json()["error"]["type"], "authentication_error");
  EXPECT_EQ(Post(p, "/v1/chat/completions", Chat("hi", 2), {"Authorization: Bearer wrong"}).status,
            401);
  EXPECT_EQ(Post(p, "/v1/chat/completions", Chat("hi", 2), {"Authorization: Bearer sekret"}).status,
            200);
  EXPECT_EQ(Post(p, "/v1/chat/completions", Chat("hi", 2), {"x-api-key: sekret"}).status, 200);
  auto an = Post(p, "/v1/messages",
                 {{"max_tokens", 2}, {"messages", {{{"role", "user"}, {"content", "x"}}}}});
  EXPECT_EQ(an.status, 401);
  EXPECT_EQ(an.Json()["type"], "error");
  EXPECT_EQ(an.Json()["error"]["type"], "authentication_error");
  EXPECT_EQ(Request(p, "GET", "/stats").status, 401);
  auto ok = Request(p, "GET", "/v1/models", "", {"x-api-key: sekret"});
  EXPECT_EQ(ok.Header("Access-Control-Allow-Origin"), "http://example.test");
  auto pre = Request(p, "OPTIONS", "/v1/chat/completions", "", {"Origin: http://example.test"});
  EXPECT_EQ(pre.status, 204);
  EXPECT_NE(pre.Header("Access-Control-Allow-Headers").find("x-api-key"), std::string::npos);
  // A browser SDK's preflight is granted the headers it asks for.
  const std::string asked = "x-stainless-os, anthropic-dangerous-direct-browser-access";
  auto sdk = Request(p, "OPTIONS", "/v1/messages", "",
                     {"Origin: http://example.test", "Access-Control-Request-Method: POST",
                      "Access-Control-Request-Headers: " + asked});
  EXPECT_EQ(sdk.status, 204);
  EXPECT_EQ(sdk.Header("Access-Control-Allow-Headers"), asked) << sdk.headers;
  // The auth scheme is case-insensitive (RFC 7235).
  EXPECT_EQ(Post(p, "/v1/chat/completions", Chat("hi", 2), {"Authorization: bearer sekret"}).status,
            200);
  // Another method on a POST endpoint is a 405 naming the method.
  auto get = Request(p, "GET", "/v1/chat/completions", "", {"x-api-key: sekret"});
  EXPECT_EQ(get.status, 405) << get.body;
  EXPECT_EQ(get.Header("Allow"), "POST");
  EXPECT_NE(get.body.find("method not allowed"), std::string::npos) << get.body;
  // 1 KiB limit.
  auto big =
      Post(p, "/v1/chat/completions", Chat(std::string(4000, 'a'), 2), {"x-api-key: sekret"});
  EXPECT_EQ(big.status, 413);
  EXPECT_TRUE(big.Json()["error"]["message"].is_string()) << big.body;
  EXPECT_EQ(server.Stop(), 0);
}

// A streaming request that runs until the context is full.
json Endless(const std::string& path) {
  json b = path == "/v1/messages" ? json{{"max_tokens", 60000},
                                         {"messages", {{{"role", "user"}, {"content", "Once"}}}}}
                                  : Chat("Once", 60000);
  b["stream"] = true;
  b["logit_bias"] = {{"2", -100}};  // no EOS (token 2 in stories260K)
  b["seed"] = 1;
  return b;
}

// Opens a stream and returns the socket after the first bytes of the body.
int OpenStream(int port, const std::string& path, const json& body) {
  int fd = Connect(port);
  const std::string b = body.dump();
  std::string req = "POST " + path +
                    " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(b.size()) + "\r\n\r\n" + b;
  send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  char buf[4096];
  std::string got;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (got.find("data: ") == std::string::npos && Clock::now() < deadline) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, size_t(n));
  }
  return fd;
}

TEST(ServerLimits, QueueOverflowAndDisconnect) {
  ServerProcess server({"--parallel", "1", "--queue", "0", "--ctx", "65536"});
  ASSERT_GT(server.port(), 0) << server.log();
  const int p = server.port();
  int fd = OpenStream(p, "/v1/chat/completions", Endless("/v1/chat/completions"));
  ASSERT_GE(fd, 0);
  auto busy = Post(p, "/v1/chat/completions", Chat("hi", 2));
  EXPECT_EQ(busy.status, 429) << busy.body;
  EXPECT_EQ(busy.Header("Retry-After"), "1");
  EXPECT_EQ(busy.Json()["error"]["type"], "rate_limit_error");
  auto abusy = Post(p, "/v1/messages",
                    {{"max_tokens", 2}, {"messages", {{{"role", "user"}, {"content", "x"}}}}});
  EXPECT_EQ(abusy.status, 529) << abusy.body;
  EXPECT_EQ(abusy.Json()["error"]["type"], "overloaded_error");
  {
    const json st0 = Request(p, "GET", "/stats").Json();  // running, or about to be admitted
    EXPECT_EQ(st0["active_slots"].get<int>() + st0["queue_depth"].get<int>(), 1);
  }

  // Hang up mid-stream: the slot is freed and the job counted as cancelled.
  close(fd);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  json st;
  while (Clock::now() < deadline) {
    st = Request(p, "GET", "/stats").Json();
    if (st["active_slots"] == 0 && st["queue_depth"] == 0 && st["jobs"]["cancelled"] == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(st["active_slots"], 0);
  EXPECT_EQ(st["jobs"]["cancelled"], 1);
  EXPECT_EQ(Post(p, "/v1/chat/completions", Chat("hi", 2)).status, 200);

  // More choices than the slots and the queue hold can never run: a 400 on
  // n, not a 429 that an SDK would retry.
  json two = Chat("hi", 2);
  two["n"] = 2;
  auto never = Post(p, "/v1/chat/completions", two);
  EXPECT_EQ(never.status, 400) << never.body;
  EXPECT_EQ(never.Json()["error"]["param"], "n");

  // A non-streaming request whose client hangs up frees its slot too. (The
  // last request's slot is released just after its answer: wait for it, or
  // this one could find the one slot taken and get a 429.)
  for (auto until = Clock::now() + std::chrono::seconds(10); Clock::now() < until;) {
    if (Request(p, "GET", "/stats").Json()["active_slots"] == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  json quiet = Endless("/v1/chat/completions");
  quiet["stream"] = false;
  const int q = Connect(p);
  const std::string qb = quiet.dump();
  const std::string qr =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
      "application/json\r\nContent-Length: " +
      std::to_string(qb.size()) + "\r\n\r\n" + qb;
  ASSERT_EQ(send(q, qr.data(), qr.size(), MSG_NOSIGNAL), ssize_t(qr.size()));
  for (auto until = Clock::now() + std::chrono::seconds(10); Clock::now() < until;) {
    if (Request(p, "GET", "/stats").Json()["active_slots"] == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  close(q);
  for (auto until = Clock::now() + std::chrono::seconds(10); Clock::now() < until;) {
    st = Request(p, "GET", "/stats").Json();
    if (st["active_slots"] == 0 && st["jobs"]["cancelled"] == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(st["active_slots"], 0);
  EXPECT_EQ(st["jobs"]["cancelled"], 2);
  EXPECT_EQ(Post(p, "/v1/chat/completions", Chat("hi", 2)).status, 200);
  EXPECT_EQ(server.Stop(), 0);
}

TEST(ServerLimits, GracefulShutdownEndsStreams) {
  ServerProcess server({"--parallel", "2", "--ctx", "65536"});
  ASSERT_GT(server.port(), 0) << server.log();
  auto f = std::async(std::launch::async, [&] {
    return Post(server.port(), "/v1/chat/completions", Endless("/v1/chat/completions"));
  });
  // Wait until it is generating.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline &&
         Request(server.port(), "GET", "/stats").Json()["active_slots"] != 1)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(server.Stop(), 0) << server.log();
  HttpResponse r = f.get();
  EXPECT_EQ(r.status, 200);
  auto ev = ParseSse(r.body);
  ASSERT_FALSE(ev.empty()) << r.body;
  EXPECT_EQ(ev.back().data, "[DONE]");
}

// A model with a ChatML template (tiny-qwen3, random weights) and a
// Hermes-style tool template given with --chat-template.
class SynthServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(std::filesystem::temp_directory_path() /
                           ("lumen_serve_tq3_" + std::to_string(getpid())));
    const std::string cmd =
        std::string(LUMEN_BINARY) + " synth tiny-qwen3 --format hf -o " + *dir_ + " 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    tmpl_ = new std::string(*dir_ + "/tools.jinja");
    FILE* f = std::fopen(tmpl_->c_str(), "w");
    std::fputs(
        "{% if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t.function | tojson }}\n"
        "{% endfor %}<|im_end|>\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>\n{\"name\": \"{{ "
        "c.function.name }}\", "
        "\"arguments\": {{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        f);
    std::fclose(f);
    server_ = new ServerProcess({*dir_, "--chat-template", *tmpl_, "--ctx", "2048"});
    ASSERT_GT(server_->port(), 0) << server_->log();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(), 0);
    delete server_;
    std::filesystem::remove_all(*dir_);
    delete dir_;
    delete tmpl_;
  }
  static ServerProcess* server_;
  static std::string *dir_, *tmpl_;
};
ServerProcess* SynthServer::server_ = nullptr;
std::string* SynthServer::dir_ = nullptr;
std::string* SynthServer::tmpl_ = nullptr;

TEST_F(SynthServer, ToolsAndToolMessagesRoundTrip) {
  const int p = server_->port();
  const json tools = {{{"type", "function"},
                       {"function",
                        {{"name", "get_weather"},
                         {"description", "Weather for a city"},
                         {"parameters",
                          {{"type", "object"},
                           {"properties", {{"city", {{"type", "string"}}}}},
                           {"required", {"city"}}}}}}}};
  json msgs = {{{"role", "user"}, {"content", "Weather in Paris?"}}};
  auto plain = Post(p, "/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 4}});
  ASSERT_EQ(plain.status, 200) << plain.body;
  auto with_tools =
      Post(p, "/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 4}, {"tools", tools}});
  ASSERT_EQ(with_tools.status, 200) << with_tools.body;
  // The template rendered the tool list into the prompt.
  EXPECT_GT(with_tools.Json()["usage"]["prompt_tokens"].get<int>(),
            plain.Json()["usage"]["prompt_tokens"].get<int>() + 10);
  // An assistant tool call and the tool's answer are accepted and rendered.
  json round = msgs;
  round.push_back(
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls",
        {{{"id", "call_1"},
          {"type", "function"},
          {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}}}}});
  round.push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny, 21 C"}});
  auto r =
      Post(p, "/v1/chat/completions", {{"messages", round}, {"max_tokens", 4}, {"tools", tools}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_GT(r.Json()["usage"]["prompt_tokens"].get<int>(),
            with_tools.Json()["usage"]["prompt_tokens"].get<int>() + 10);
  // The same through the Anthropic shapes.
  json am = {
      {"max_tokens", 4},
      {"tools", {{{"name", "get_weather"}, {"input_schema", {{"type", "object"}}}}}},
      {"messages",
       {{{"role", "user"}, {"content", "Weather?"}},
        {{"role", "assistant"},
         {"content",
          {{{"type", "tool_use"},
            {"id", "t1"},
            {"name", "get_weather"},
            {"input", {{"city", "Paris"}}}}}}},
        {{"role", "user"},
         {"content", {{{"type", "tool_result"}, {"tool_use_id", "t1"}, {"content", "sunny"}}}}}}}};
  auto a = Post(p, "/v1/messages", am);
  EXPECT_EQ(a.status, 200) << a.body;
  // Streaming with tools: text is held and sent whole at the end.
  auto s = Post(p, "/v1/chat/completions",
                {{"messages", msgs}, {"max_tokens", 6}, {"tools", tools}, {"stream", true}});
  auto ev = ParseSse(s.body);
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev.back().data, "[DONE]");
  // chat_template_kwargs reach the template (an unknown one is harmless).
  EXPECT_EQ(Post(p, "/v1/chat/completions",
                 {{"messages", msgs},
                  {"max_tokens", 2},
                  {"chat_template_kwargs", {{"enable_thinking", false}}}})
                .status,
            200);
}

// tool_choice binds: required / any / a named tool always give exactly one
// call to an offered tool whose arguments are a JSON object (or are cut by
// max_tokens, finish "length"); "none" never gives a call. The model has
// random weights, so only the structure is checked.
const json kTwoTools = {
    {{"type", "function"},
     {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}},
    {{"type", "function"},
     {"function", {{"name", "search"}, {"parameters", {{"type", "object"}}}}}}};

bool IsObjectText(const std::string& s) {
  json j = json::parse(s, nullptr, false);
  return !j.is_discarded() && j.is_object();
}

// Checks one OpenAI chat choice that must be one call; returns it.
json CheckForcedChatChoice(const json& choice, const std::vector<std::string>& names) {
  const json& m = choice["message"];
  EXPECT_TRUE(m["content"].is_null()) << choice.dump();
  EXPECT_EQ(m["tool_calls"].size(), 1u) << choice.dump();
  if (m["tool_calls"].size() != 1) return json();
  const json& call = m["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_TRUE(call["id"].is_string());
  const std::string name = call["function"]["name"];
  EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  const std::string args = call["function"]["arguments"];
  if (choice["finish_reason"] == "tool_calls") {
    EXPECT_TRUE(IsObjectText(args)) << args;
  } else {
    EXPECT_EQ(choice["finish_reason"], "length") << choice.dump();
    EXPECT_FALSE(IsObjectText(args)) << args;
  }
  return call;
}

TEST_F(SynthServer, ToolChoiceRequiredAndNamedAreBinding) {
  const int p = server_->port();
  const json msgs = {{{"role", "user"}, {"content", "Weather in Paris?"}}};
  int complete = 0;
  for (int seed = 1; seed <= 6; ++seed) {
    auto r = Post(p, "/v1/chat/completions",
                  {{"messages", msgs},
                   {"max_tokens", 120},
                   {"tools", kTwoTools},
                   {"tool_choice", "required"},
                   {"seed", seed}});
    ASSERT_EQ(r.status, 200) << r.body;
    CheckForcedChatChoice(r.Json()["choices"][0], {"get_weather", "search"});
    complete += r.Json()["choices"][0]["finish_reason"] == "tool_calls";
    auto n = Post(p, "/v1/chat/completions",
                  {{"messages", msgs},
                   {"max_tokens", 120},
                   {"tools", kTwoTools},
                   {"tool_choice", {{"type", "function"}, {"function", {{"name", "search"}}}}},
                   {"seed", seed}});
    ASSERT_EQ(n.status, 200) << n.body;
    CheckForcedChatChoice(n.Json()["choices"][0], {"search"});
    // "none": the same request never calls.
    auto none = Post(p, "/v1/chat/completions",
                     {{"messages", msgs},
                      {"max_tokens", 20},
                      {"tools", kTwoTools},
                      {"tool_choice", "none"},
                      {"seed", seed}});
    ASSERT_EQ(none.status, 200) << none.body;
    EXPECT_FALSE(none.Json()["choices"][0]["message"].contains("tool_calls")) << none.body;
    EXPECT_NE(none.Json()["choices"][0]["finish_reason"], "tool_calls");
  }
  EXPECT_GT(complete, 0);  // the random model does close objects within 120 tokens
  // One tool and "required" is that tool, named.
  auto one = Post(p, "/v1/chat/completions",
                  {{"messages", msgs},
                   {"max_tokens", 120},
                   {"tools", {kTwoTools[0]}},
                   {"tool_choice", "required"},
                   {"n", 2}});
  ASSERT_EQ(one.status, 200) << one.body;
  for (const auto& c : one.Json()["choices"]) CheckForcedChatChoice(c, {"get_weather"});
  // Cut by max_tokens inside the opening: still the call, finish length.
  auto cut = Post(p, "/v1/chat/completions",
                  {{"messages", msgs},
                   {"max_tokens", 3},
                   {"tools", kTwoTools},
                   {"tool_choice", {{"type", "function"}, {"function", {{"name", "search"}}}}}});
  ASSERT_EQ(cut.status, 200) << cut.body;
  EXPECT_EQ(cut.Json()["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(CheckForcedChatChoice(cut.Json()["choices"][0], {"search"})["function"]["arguments"],
            "");
}

TEST_F(SynthServer, ForcedToolCallStreamsTheSameCall) {
  const int p = server_->port();
  const json body = {{"messages", json::array({{{"role", "user"}, {"content", "Find cats"}}})},
                     {"max_tokens", 120},
                     {"tools", kTwoTools},
                     {"tool_choice", "required"},
                     {"seed", 11}};
  auto whole = Post(p, "/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json want = whole.Json()["choices"][0];
  json sb = body;
  sb["stream"] = true;
  auto s = Post(p, "/v1/chat/completions", sb);
  ASSERT_EQ(s.status, 200);
  std::string name, args, id, finish;
  int name_deltas = 0;
  for (const auto& e : ParseSse(s.body)) {
    if (e.data == "[DONE]") continue;
    json j = json::parse(e.data);
    const json& ch = j["choices"][0];
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    if (!ch["delta"].contains("tool_calls")) {
      EXPECT_TRUE(!ch["delta"].contains("content") || ch["delta"]["content"] == "") << e.data;
      continue;
    }
    const json& tc = ch["delta"]["tool_calls"][0];
    EXPECT_EQ(tc["index"], 0);
    if (tc.contains("id")) {
      ++name_deltas;
      id = tc["id"];
      name = tc["function"]["name"];
      EXPECT_EQ(tc["type"], "function");
    }
    args += tc["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(name_deltas, 1);  // the id and name come once, first
  EXPECT_FALSE(id.empty());
  EXPECT_EQ(finish, want["finish_reason"]);
  EXPECT_EQ(name, want["message"]["tool_calls"][0]["function"]["name"]);
  EXPECT_EQ(args, want["message"]["tool_calls"][0]["function"]["arguments"]);
}

TEST_F(SynthServer, AnthropicAndResponsesToolChoiceBind) {
  const int p = server_->port();
  const json atools = {{{"name", "get_weather"}, {"input_schema", {{"type", "object"}}}},
                       {{"name", "search"}, {"input_schema", {{"type", "object"}}}}};
  const json msgs = {{{"role", "user"}, {"content", "Weather?"}}};
  for (const json& choice : {json{{"type", "any"}}, json{{"type", "tool"}, {"name", "search"}}}) {
    for (int seed = 1; seed <= 3; ++seed) {
      auto r = Post(p, "/v1/messages",
                    {{"max_tokens", 120},
                     {"messages", msgs},
                     {"tools", atools},
                     {"tool_choice", choice},
                     {"seed", seed}});
      ASSERT_EQ(r.status, 200) << r.body;
      json j = r.Json();
      ASSERT_EQ(j["content"].size(), 1u) << r.body;
      const json& block = j["content"][0];
      EXPECT_EQ(block["type"], "tool_use") << r.body;
      EXPECT_TRUE(block["input"].is_object());
      if (choice["type"] == "tool") {
        EXPECT_EQ(block["name"], "search");
      }
      EXPECT_TRUE(block["name"] == "search" || block["name"] == "get_weather");
      EXPECT_TRUE(j["stop_reason"] == "tool_use" || j["stop_reason"] == "max_tokens") << r.body;
    }
    // Streaming: one tool_use block whose input_json_delta pieces make the input.
    auto s = Post(p, "/v1/messages",
                  {{"max_tokens", 120},
                   {"messages", msgs},
                   {"tools", atools},
                   {"tool_choice", choice},
                   {"seed", 4},
                   {"stream", true}});
    std::string partial, stop;
    int blocks = 0;
    for (const auto& e : ParseSse(s.body)) {
      json d = json::parse(e.data, nullptr, false);
      if (e.event == "content_block_start") {
        ++blocks;
        EXPECT_EQ(d["content_block"]["type"], "tool_use") << e.data;
      }
      if (e.event == "content_block_delta") {
        EXPECT_EQ(d["delta"]["type"], "input_json_delta") << e.data;
        partial += d["delta"]["partial_json"].get<std::string>();
      }
      if (e.event == "message_delta") stop = d["delta"]["stop_reason"];
    }
    EXPECT_EQ(blocks, 1) << s.body;
    if (stop == "tool_use") {
      EXPECT_TRUE(IsObjectText(partial)) << partial;
    } else {
      EXPECT_EQ(stop, "max_tokens");
    }
  }
  // Responses: required and named give one function_call item.
  const json rtools = {{{"type", "function"}, {"name", "get_weather"}},
                       {{"type", "function"}, {"name", "search"}}};
  for (const json& choice : {json("required"), json{{"type", "function"}, {"name", "search"}}}) {
    auto r = Post(p, "/v1/responses",
                  {{"input", "Weather?"},
                   {"max_output_tokens", 120},
                   {"tools", rtools},
                   {"tool_choice", choice},
                   {"seed", 2}});
    ASSERT_EQ(r.status, 200) << r.body;
    json j = r.Json();
    ASSERT_EQ(j["output"].size(), 1u) << r.body;
    const json& item = j["output"][0];
    EXPECT_EQ(item["type"], "function_call");
    if (choice.is_object()) {
      EXPECT_EQ(item["name"], "search");
    }
    if (j["status"] == "completed") {
      EXPECT_EQ(item["status"], "completed");
      EXPECT_TRUE(IsObjectText(item["arguments"])) << r.body;
    } else {
      EXPECT_EQ(j["status"], "incomplete") << r.body;
    }
    EXPECT_EQ(j["tool_choice"], choice);
  }
}

TEST_F(SynthServer, ResponseFormatJsonObject) {
  const int p = server_->port();
  int complete = 0;
  for (int seed = 1; seed <= 6; ++seed) {
    auto r = Post(p, "/v1/chat/completions",
                  {{"messages", json::array({{{"role", "user"}, {"content", "Give JSON"}}})},
                   {"max_tokens", 80},
                   {"response_format", {{"type", "json_object"}}},
                   {"seed", seed}});
    ASSERT_EQ(r.status, 200) << r.body;
    const json c = r.Json()["choices"][0];
    const std::string text = c["message"]["content"];
    if (c["finish_reason"] == "stop") {
      ++complete;
      EXPECT_TRUE(IsObjectText(text)) << text;
    } else {
      EXPECT_EQ(c["finish_reason"], "length");
      EXPECT_FALSE(IsObjectText(text)) << text;
    }
  }
  EXPECT_GT(complete, 0);
  auto resp = Post(p, "/v1/responses",
                   {{"input", "Give JSON"},
                    {"max_output_tokens", 80},
                    {"text", {{"format", {{"type", "json_object"}}}}},
                    {"seed", 1}});
  ASSERT_EQ(resp.status, 200) << resp.body;
  json j = resp.Json();
  EXPECT_EQ(j["text"]["format"]["type"], "json_object");
  if (j["status"] == "completed") {
    EXPECT_TRUE(IsObjectText(j["output_text"])) << resp.body;
  }
}

// response_format json_schema: every finished reply validates (checked here
// field by field; tests/clients checks with ajv), on chat and Responses.
TEST_F(SynthServer, ResponseFormatJsonSchema) {
  const int p = server_->port();
  const json schema = json::parse(R"({
    "type": "object",
    "properties": {
      "city": {"type": "string", "maxLength": 6},
      "sunny": {"type": "boolean"},
      "temp": {"type": "integer", "minimum": -50, "maximum": 60},
      "kind": {"enum": ["rain", "snow", null]},
      "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "maxItems": 2}
    },
    "required": ["city", "sunny", "temp", "kind", "tags"],
    "additionalProperties": false,
    "$defs": {"tag": {"type": "string", "maxLength": 3}}
  })");
  const auto check = [](const std::string& text) {
    const json v = json::parse(text, nullptr, false);
    ASSERT_TRUE(v.is_object()) << text;
    EXPECT_EQ(v.size(), 5u) << text;
    EXPECT_TRUE(v["city"].is_string()) << text;
    EXPECT_TRUE(v["sunny"].is_boolean()) << text;
    ASSERT_TRUE(v["temp"].is_number_integer()) << text;
    EXPECT_GE(v["temp"].get<int>(), -50) << text;
    EXPECT_LE(v["temp"].get<int>(), 60) << text;
    EXPECT_TRUE(v["kind"] == "rain" || v["kind"] == "snow" || v["kind"].is_null()) << text;
    ASSERT_TRUE(v["tags"].is_array()) << text;
    EXPECT_LE(v["tags"].size(), 2u) << text;
  };
  int complete = 0;
  for (int seed = 1; seed <= 4; ++seed) {
    auto r = Post(p, "/v1/chat/completions",
                  {{"messages", json::array({{{"role", "user"}, {"content", "Weather?"}}})},
                   {"max_tokens", 120},
                   {"seed", seed},
                   {"response_format",
                    {{"type", "json_schema"},
                     {"json_schema", {{"name", "w"}, {"strict", true}, {"schema", schema}}}}}});
    ASSERT_EQ(r.status, 200) << r.body;
    const json c = r.Json()["choices"][0];
    if (c["finish_reason"] != "stop") continue;
    ++complete;
    check(c["message"]["content"]);
  }
  EXPECT_GE(complete, 3);
  auto resp =
      Post(p, "/v1/responses",
           {{"input", "Weather?"},
            {"max_output_tokens", 120},
            {"seed", 9},
            {"text", {{"format", {{"type", "json_schema"}, {"name", "w"}, {"schema", schema}}}}}});
  ASSERT_EQ(resp.status, 200) << resp.body;
  const json j = resp.Json();
  EXPECT_EQ(j["text"]["format"]["type"], "json_schema");
  EXPECT_EQ(j["text"]["format"]["name"], "w");
  EXPECT_EQ(j["text"]["format"]["schema"], schema);
  ASSERT_EQ(j["status"], "completed") << resp.body;
  check(j["output_text"]);
}

}  // namespace
