// End-to-end tests of `lumen serve`: each fixture starts the real binary
// (LUMEN_BINARY) on an ephemeral port with the embedded stories260K model and
// talks HTTP to it over loopback: the endpoints, streams against bodies,
// invalid requests, the prompt cache, batching. The limits are in
// server_limits_test.cc, tools and structured output (a `lumen synth
// tiny-qwen3` HF model) in server_tools_test.cc.
#include <ctime>
#include <future>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "serve_http.h"

namespace {

using namespace lumen::testing::http;  // ServerProcess, Request, Post, Chat, ParseSse
                                       // (serve_http.h)

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
  rs.reserve(fs.size());
  for (auto& f : fs) rs.push_back(f.get());
  for (const auto& r : rs) ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(rs[2].Json()["choices"][0]["message"]["content"], want);
  auto st = Request(server.port(), "GET", "/stats").Json();
  EXPECT_GT(st["batching"]["mean_rows_per_step"].get<double>(), 1.0);  // they did share steps
  EXPECT_EQ(server.Stop(), 0);
}

}  // namespace
