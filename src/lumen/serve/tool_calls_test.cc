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

}  // namespace
}  // namespace lumen::serve
