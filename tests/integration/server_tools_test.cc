// End-to-end tests of `lumen serve`'s tools and structured output on a
// `lumen synth tiny-qwen3` HF model with a Hermes-style tool template: tool
// calls and tool messages round trip, tool_choice binds (OpenAI, Anthropic,
// Responses), response_format json_object / json_schema.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "serve_http.h"

namespace {

using namespace lumen::testing::http;  // ServerProcess, Request, Post, Chat, ParseSse
                                       // (serve_http.h)

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
