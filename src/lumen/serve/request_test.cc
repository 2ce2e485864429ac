// Protocol parsers: each protocol's body lands in the same GenRequest.
#include "lumen/serve/request.h"

#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "lumen/sample/config.h"
#include "lumen/serve/body.h"
#include "lumen/serve/fuzz_entry.h"
#include "lumen/serve/tool_calls.h"

namespace lumen::serve {
namespace {

using ojson = nlohmann::ordered_json;

TEST(Request, ThreeProtocolsFunnelToOneShape) {
  auto chat = ParseChatCompletions(ojson::parse(R"({"messages":[{"role":"system","content":"S"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
      "max_tokens":7,"stop":"x","temperature":0.5,"hlg":{"width":2}})"));
  ASSERT_TRUE(chat.ok()) << chat.status().message();
  auto msg = ParseMessages(ojson::parse(R"({"system":"S","max_tokens":7,"stop_sequences":["x"],
      "temperature":0.5,"hlg":{"width":2},"messages":[{"role":"user","content":[{"type":"text","text":"ab"}]}]})"));
  ASSERT_TRUE(msg.ok()) << msg.status().message();
  auto resp =
      ParseResponses(ojson::parse(R"({"instructions":"S","max_output_tokens":7,"temperature":0.5,
      "hlg":{"width":2},"input":[{"role":"user","content":[{"type":"input_text","text":"ab"}]}]})"));
  ASSERT_TRUE(resp.ok()) << resp.status().message();
  const ojson want =
      ojson::parse(R"([{"role":"system","content":"S"},{"role":"user","content":"ab"}])");
  for (const GenRequest* r : {&*chat, &*msg, &*resp}) {
    EXPECT_EQ(r->messages, want);
    EXPECT_EQ(r->max_tokens, 7);
    EXPECT_EQ(r->sampler_fields["temperature"], 0.5);
    EXPECT_EQ(r->sampler_fields["hlg"]["width"], 2);
  }
  EXPECT_EQ(chat->stop, std::vector<std::string>{"x"});
  EXPECT_EQ(msg->stop, std::vector<std::string>{"x"});
}

TEST(Request, AnthropicToolBlocksBecomeOpenAIToolMessages) {
  auto r = ParseMessages(ojson::parse(R"({"max_tokens":5,"messages":[
      {"role":"user","content":"w?"},
      {"role":"assistant","content":[{"type":"text","text":"checking"},
         {"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}]})"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->messages.size(), 3u);
  EXPECT_EQ(r->messages[1]["tool_calls"][0]["function"]["arguments"], ojson({{"a", 1}}));
  EXPECT_EQ(r->messages[2], ojson::parse(R"({"role":"tool","tool_call_id":"t1","content":"ok"})"));
}

TEST(Request, ResponsesFunctionItems) {
  auto r = ParseResponses(ojson::parse(R"({"input":[{"role":"user","content":"q"},
      {"type":"function_call","call_id":"c1","name":"f","arguments":"{\"x\":2}"},
      {"type":"function_call_output","call_id":"c1","output":"42"}]})"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->messages.size(), 3u);
  EXPECT_EQ(r->messages[1]["tool_calls"][0]["id"], "c1");
  EXPECT_EQ(r->messages[2]["role"], "tool");
}

// A call cut by max_tokens comes back from lumen with a JSON prefix or "" as
// its arguments; a client that sends that history back is not refused, on
// either API, and the string reaches the template as it is.
TEST(Request, ToolArgumentsThatAreNotJsonStayStrings) {
  auto chat = ParseChatCompletions(ojson::parse(R"({"messages":[{"role":"user","content":"w?"},
      {"role":"assistant","content":null,"tool_calls":[
         {"id":"a","function":{"name":"f","arguments":"{\"city\": \"Par"}},
         {"id":"b","function":{"name":"f","arguments":""}}]},
      {"role":"tool","tool_call_id":"a","content":"ok"}]})"));
  ASSERT_TRUE(chat.ok()) << chat.status().message();
  const ojson& calls = chat->messages[1]["tool_calls"];
  EXPECT_EQ(calls[0]["function"]["arguments"], ojson("{\"city\": \"Par"));
  EXPECT_EQ(calls[1]["function"]["arguments"], ojson(""));
  auto resp = ParseResponses(ojson::parse(R"({"input":[{"role":"user","content":"q"},
      {"type":"function_call","call_id":"c1","name":"f","arguments":""},
      {"type":"function_call_output","call_id":"c1","output":"42"}]})"));
  ASSERT_TRUE(resp.ok()) << resp.status().message();
  EXPECT_EQ(resp->messages[1]["tool_calls"][0]["function"]["arguments"], ojson(""));
  EXPECT_EQ(ToolArgumentsJson(R"({"x":2})"), ojson({{"x", 2}}));
}

TEST(Request, ErrorsNameTheField) {
  struct Case {
    const char* body;
    const char* prefix;
  };
  for (
      const Case& c : std::vector<Case>{
          {R"({"messages":[]})", "messages:"},
          {R"({"messages":[{"role":"user"}]})", "messages[0].content:"},
          {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":-3})", "max_tokens:"},
          {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":3})", "top_logprobs:"},
          {R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":5}}]}]})",
           "messages[0].tool_calls[0].function.arguments:"},
      }) {
    auto r = ParseChatCompletions(ojson::parse(c.body));
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().message().rfind(c.prefix, 0), 0u) << r.status().message();
  }
}

TEST(Request, ToolChoiceAndResponseFormat) {
  const char* tools_oa =
      R"("tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"g"}}])";
  auto named = ParseChatCompletions(
      ojson::parse(std::string(R"({"messages":[{"role":"user","content":"x"}],)") + tools_oa +
                   R"(,"tool_choice":{"type":"function","function":{"name":"g"}}})"));
  ASSERT_TRUE(named.ok()) << named.status().message();
  EXPECT_TRUE(named->tool_choice_named);
  EXPECT_EQ(named->tool_choice, "g");
  auto req = ParseChatCompletions(
      ojson::parse(std::string(R"({"messages":[{"role":"user","content":"x"}],)") + tools_oa +
                   R"(,"tool_choice":"required"})"));
  ASSERT_TRUE(req.ok());
  EXPECT_FALSE(req->tool_choice_named);
  EXPECT_EQ(req->tool_choice, "required");
  auto any =
      ParseMessages(ojson::parse(R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}],
      "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"}})"));
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(any->tool_choice, "required");
  auto tool =
      ParseMessages(ojson::parse(R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}],
      "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f"}})"));
  ASSERT_TRUE(tool.ok());
  EXPECT_TRUE(tool->tool_choice_named);
  auto resp = ParseResponses(ojson::parse(R"({"input":"x","tools":[{"type":"function","name":"f"}],
      "tool_choice":{"type":"function","name":"f"},"text":{"format":{"type":"json_object"}}})"));
  ASSERT_TRUE(resp.ok()) << resp.status().message();
  EXPECT_TRUE(resp->tool_choice_named);
  EXPECT_EQ(resp->response_format, "json_object");
  // Unknown names are 400s naming the field.
  for (
      const char* body : {
          R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"h"}}})",
          R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})",
      }) {
    auto r = ParseChatCompletions(ojson::parse(body));
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().message().rfind("tool_choice", 0), 0u) << r.status().message();
  }
  auto bad_any =
      ParseMessages(ojson::parse(R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}],
      "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"z"}})"));
  ASSERT_FALSE(bad_any.ok());
  EXPECT_EQ(bad_any.status().message().rfind("tool_choice", 0), 0u);
  auto js = ParseChatCompletions(ojson::parse(R"({"messages":[{"role":"user","content":"x"}],
      "response_format":{"type":"json_object"}})"));
  ASSERT_TRUE(js.ok());
  EXPECT_EQ(js->response_format, "json_object");
  auto schema = ParseChatCompletions(ojson::parse(R"({"messages":[{"role":"user","content":"x"}],
      "response_format":{"type":"json_schema","json_schema":{"name":"x","strict":true,
      "schema":{"type":"object","properties":{"a":{"type":"string"}}}}}})"));
  ASSERT_TRUE(schema.ok()) << schema.status().message();
  EXPECT_EQ(schema->response_format, "json_schema");
  EXPECT_EQ(schema->json_schema_name, "x");
  EXPECT_TRUE(schema->json_schema_strict);
  EXPECT_EQ(schema->json_schema["properties"]["a"]["type"], "string");
  EXPECT_EQ(schema->json_schema_field, "response_format.json_schema.schema");
  auto text_schema = ParseResponses(ojson::parse(R"({"input":"x","text":{"format":{
      "type":"json_schema","name":"n","schema":{"type":"object"}}}})"));
  ASSERT_TRUE(text_schema.ok()) << text_schema.status().message();
  EXPECT_EQ(text_schema->json_schema_field, "text.format.schema");
  EXPECT_EQ(text_schema->json_schema["type"], "object");
  const std::pair<const char*, const char*> bad_formats[] = {
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}})",
       "response_format.json_schema: must be an object"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",
        "json_schema":{"name":"x"}}})",
       "response_format.json_schema.schema: missing"},
      {R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}})",
       "response_format.type: unknown type 'xml'"},
  };
  for (const auto& [body, want] : bad_formats) {
    auto r = ParseChatCompletions(ojson::parse(body));
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().message().rfind(want, 0), 0u) << r.status().message();
  }
}

TEST(Body, Utf8AndLimits) {
  size_t bad = 0;
  EXPECT_TRUE(ValidUtf8("h\xc3\xa9llo \xf0\x9f\x98\x80", &bad));
  EXPECT_FALSE(ValidUtf8("ab\xc0\xaf", &bad));  // overlong
  EXPECT_EQ(bad, 2u);
  EXPECT_FALSE(ValidUtf8("\xed\xa0\x80", &bad));      // surrogate
  EXPECT_FALSE(ValidUtf8("\xf4\x90\x80\x80", &bad));  // > U+10FFFF
  EXPECT_FALSE(ValidUtf8("x\xe2\x82", &bad));         // truncated
  EXPECT_EQ(bad, 1u);
  ojson out;
  ApiError e;
  EXPECT_FALSE(ParseBody("{\"a\":1}", 3, &out, &e));
  EXPECT_EQ(e.status, 413);
  EXPECT_FALSE(ParseBody("{\"a\":", 100, &out, &e));
  EXPECT_EQ(e.param, "body");
  EXPECT_TRUE(ParseBody("{\"a\":1}", 100, &out, &e));
}

}  // namespace
}  // namespace lumen::serve

namespace lumen::serve {
namespace {

// Replays the fuzz seeds (each must parse, except the ones meant to fail),
// then a fixed set of byte mutations of them: all must return, not crash.
TEST(Request, FuzzCorpusReplayAndMutations) {
  const std::filesystem::path dir =
      std::filesystem::path(LUMEN_SOURCE_DIR) / "tests/fuzz/corpus/request";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no corpus at " << dir;
  std::mt19937_64 rng(7);
  int parsed = 0, files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename() == "README.md") continue;
    std::ifstream f(e.path(), std::ios::binary);
    std::string in((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ++files;
    parsed += ParseAnyRequest(in);
    for (int k = 0; k < 300; ++k) {
      std::string m = in;
      const int edits = 1 + int(rng() % 4);
      for (int i = 0; i < edits && !m.empty(); ++i) {
        const size_t at = rng() % m.size();
        switch (rng() % 4) {
          case 0:
            m[at] = char(rng());
            break;
          case 1:
            m.erase(at, 1 + rng() % 8);
            break;
          case 2:
            m.insert(at, m.substr(rng() % m.size(), 1 + rng() % 16));
            break;
          default:
            m.resize(at);
            break;
        }
      }
      ParseAnyRequest(m);
    }
  }
  EXPECT_GE(files, 7);
  EXPECT_EQ(parsed, 7);  // the seven protocol seeds; the tool-output and bad UTF-8 seeds do not
}

}  // namespace
}  // namespace lumen::serve
