// Tool-call parsing on hand-written replies in each model family's native
// format (the random-weight test models never emit them).
#include "lumen/serve/tool_calls.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace lumen::serve {
namespace {

const std::vector<std::string> kTools = {"get_weather", "search"};

nlohmann::json Args(const ToolCall& c) { return nlohmann::json::parse(c.arguments); }

TEST(ToolCalls, QwenHermes) {
  auto r = ParseToolCalls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": "
      "\"a</b\"}}\n</tool_call>",
      kTools);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.content, "Let me check.");
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(Args(r.calls[0]), nlohmann::json({{"city", "Paris"}}));
  EXPECT_EQ(r.calls[1].name, "search");
  EXPECT_EQ(Args(r.calls[1])["q"], "a</b");
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
  // Unterminated final call (generation stopped at </tool_call> as a stop string).
  auto u = ParseToolCalls("<tool_call>{\"name\": \"search\", \"arguments\": {}}", kTools);
  ASSERT_EQ(u.calls.size(), 1u);
  EXPECT_EQ(u.calls[0].arguments, "{}");
}

TEST(ToolCalls, Llama3Json) {
  auto r = ParseToolCalls(
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"days\": 2}}", kTools);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(Args(r.calls[0]), nlohmann::json({{"city", "Oslo"}, {"days", 2}}));
  auto t = ParseToolCalls(
      "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"x\"}}; "
      "{\"name\": \"get_weather\", \"parameters\": {}}",
      kTools);
  ASSERT_EQ(t.calls.size(), 2u);
  EXPECT_EQ(t.calls[1].name, "get_weather");
}

TEST(ToolCalls, Mistral) {
  auto r = ParseToolCalls(
      "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}, "
      "{\"name\": \"search\", \"arguments\": \"{\\\"q\\\": 1}\"}]",
      kTools);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(Args(r.calls[0])["city"], "Rome");
  EXPECT_EQ(Args(r.calls[1])["q"], 1);  // arguments given as a JSON string
  auto n = ParseToolCalls("[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Bern\"}", kTools);
  ASSERT_EQ(n.calls.size(), 1u);
  EXPECT_EQ(n.calls[0].name, "get_weather");
  EXPECT_EQ(Args(n.calls[0])["city"], "Bern");
}

TEST(ToolCalls, NotACallStaysText) {
  for (const char* text : {
           "Just words.",
           "{\"name\": \"unknown_tool\", \"parameters\": {}}",  // not offered
           "{\"title\": \"a JSON answer\"}",                    // no name
           "<tool_call>{broken json</tool_call>",               // invalid
           "[TOOL_CALLS]not json at all",
           "{\"name\": \"search\", \"parameters\": {}} trailing words",  // not the whole reply
       }) {
    auto r = ParseToolCalls(text, kTools);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
}

TEST(ToolCalls, IdsUsePrefix) {
  auto r = ParseToolCalls("<tool_call>{\"name\": \"search\", \"arguments\": {}}</tool_call>", {},
                          "call_abc_");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].id, "call_abc_0");
}

// Every byte a token: the grammar alone decides what may be generated.
std::shared_ptr<const engine::TokenTable> ByteTable() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
  return engine::TokenTable::FromStrings(bytes);
}

bool Accepts(engine::GrammarConstraint& g, std::string_view text) {
  for (unsigned char b : text)
    if (!g.Accept(b)) return false;
  return true;
}

// A forced call in each format is what the existing parser reads as a call
// (the grammar and the format parsers agree), and ScanForcedCall reads every
// prefix of it without error.
TEST(ForcedToolCall, GrammarMatchesEachFormatsParser) {
  struct Case {
    ToolFormat f;
    std::string open, key, close;
  };
  const std::vector<Case> cases = {
      {ToolFormat::kHermes, "<tool_call>\n{\"name\": \"", ", \"arguments\":", "}\n</tool_call>"},
      {ToolFormat::kLlama3, "{\"name\": \"", ", \"parameters\":", "}"},
      {ToolFormat::kMistral, "[TOOL_CALLS] [{\"name\": \"", ", \"arguments\":", "}]"},
  };
  const std::string args = "{\"city\": \"Par\\\"is\", \"n\": [1, {\"x\": null}]}";
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(ToolFormatName(c.f)));
    auto g = engine::GrammarConstraint::Create(ByteTable(), ToolCallGrammar(c.f, kTools));
    ASSERT_TRUE(g.ok()) << g.status().message();
    const std::string text = c.open + "search\"" + c.key + " " + args + c.close;
    ASSERT_TRUE(Accepts(**g, text)) << (*g)->text();
    EXPECT_TRUE((*g)->done());
    // Not an offered name, or a second object, is refused.
    auto g2 = engine::GrammarConstraint::Create(ByteTable(), ToolCallGrammar(c.f, kTools));
    EXPECT_FALSE(Accepts(**g2, c.open + "sear\""));
    auto parsed = ParseToolCalls(text, kTools);
    ASSERT_EQ(parsed.calls.size(), 1u);
    EXPECT_EQ(parsed.calls[0].name, "search");
    EXPECT_EQ(Args(parsed.calls[0]), nlohmann::json::parse(args));
    auto forced = ForcedReply(text, kTools, "call_x_");
    ASSERT_EQ(forced.calls.size(), 1u);
    EXPECT_FALSE(forced.truncated);
    EXPECT_EQ(forced.calls[0].id, "call_x_0");
    EXPECT_EQ(forced.calls[0].name, "search");
    EXPECT_EQ(forced.calls[0].arguments, args);  // as generated
    EXPECT_TRUE(forced.content.empty());
    // Every cut: one call to an offered tool; arguments a prefix of the
    // object, whole only once the object closed.
    std::string streamed;
    bool name_seen = false;
    for (size_t n = 0; n <= text.size(); ++n) {
      const std::string_view cut = std::string_view(text).substr(0, n);
      auto r = ForcedReply(cut, kTools, "c");
      ASSERT_EQ(r.calls.size(), 1u);
      EXPECT_TRUE(r.calls[0].name == "search" || r.calls[0].name == "get_weather");
      EXPECT_TRUE(args.starts_with(r.calls[0].arguments)) << cut;
      EXPECT_EQ(r.truncated, r.calls[0].arguments != args) << cut;
      const ForcedCall fc = ScanForcedCall(cut);
      if (fc.name_done) {
        EXPECT_EQ(fc.name, "search");
        name_seen = true;
      }
      EXPECT_TRUE(fc.args.starts_with(streamed));  // arguments only grow
      streamed = fc.args;
    }
    EXPECT_TRUE(name_seen);
    EXPECT_EQ(streamed, args);
  }
}

TEST(ForcedToolCall, OneNameIsForcedWhole) {
  auto g = engine::GrammarConstraint::Create(ByteTable(),
                                             ToolCallGrammar(ToolFormat::kHermes, {"get_weather"}));
  ASSERT_TRUE(g.ok());
  std::vector<int32_t> forced;
  std::string err;
  std::string text;
  // Opening, then the only name: both forced, no choice left to the model.
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE((*g)->Forced(&forced, &err)) << err;
    for (int32_t id : forced) ASSERT_TRUE((*g)->Accept(id));
  }
  EXPECT_EQ((*g)->text(), "<tool_call>\n{\"name\": \"get_weather\"");
  ASSERT_TRUE((*g)->Forced(&forced, &err));
  for (int32_t id : forced) ASSERT_TRUE((*g)->Accept(id));
  EXPECT_EQ((*g)->text(), "<tool_call>\n{\"name\": \"get_weather\", \"arguments\":");
  ASSERT_TRUE((*g)->Forced(&forced, &err));
  EXPECT_TRUE(forced.empty());  // the arguments are the model's
}

TEST(ForcedToolCall, DetectFormat) {
  EXPECT_EQ(DetectToolFormat("<|im_start|>assistant\n<tool_call>\n{\"name\"", ""),
            ToolFormat::kHermes);
  EXPECT_EQ(DetectToolFormat("[INST]x[/INST][TOOL_CALLS] [{\"name\"", ""), ToolFormat::kMistral);
  EXPECT_EQ(DetectToolFormat("{\"name\": \"lumen_probe\", \"parameters\": {\"x\": 1}}", ""),
            ToolFormat::kLlama3);
  // No call in the rendering: the template source decides, else Hermes.
  EXPECT_EQ(DetectToolFormat("plain", "{%- if x %}<|python_tag|>{% endif %}"), ToolFormat::kLlama3);
  EXPECT_EQ(DetectToolFormat("plain", "{{ '[TOOL_CALLS]' }}"), ToolFormat::kMistral);
  EXPECT_EQ(DetectToolFormat("plain", "no markers"), ToolFormat::kHermes);
}

}  // namespace
}  // namespace lumen::serve
