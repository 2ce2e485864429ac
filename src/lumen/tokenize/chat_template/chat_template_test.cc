// Chat-template interpreter tests: real fixture templates against Python
// Jinja2 renders (shared/fixtures/tokenizers/test-vectors/chat-templates.json),
// the conversation matrix golden written by
// tools/reference/render_chat_templates.py, and error/limit behaviour.
#include "lumen/tokenize/chat_template/chat_template.h"

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "lumen/tokenize/chat_template/pystr.h"

namespace lumen::tokenize {
namespace {

using nlohmann::ordered_json;
using ::testing::HasSubstr;

std::string SourceDir() {
  const char* env = std::getenv("LUMEN_SOURCE_DIR");
  return env ? env : LUMEN_SOURCE_DIR;
}

std::string FixturesDir() {
  const char* env = std::getenv("LUMEN_FIXTURES");
  return env ? env : SourceDir() + "/../shared/fixtures";
}

bool ReadFile(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return true;
}

void SetSpecials(const ordered_json& specials, ChatRequest& req) {
  auto get = [&](const char* k) -> std::string {
    if (!specials.contains(k)) return "";
    const auto& v = specials[k];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content")) return v["content"].get<std::string>();
    return "";
  };
  req.bos_token = get("bos_token");
  req.eos_token = get("eos_token");
  req.pad_token = get("pad_token");
  req.unk_token = get("unk_token");
}

std::time_t FixedNow() {
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  tm.tm_hour = 9;
  tm.tm_min = 5;
  tm.tm_isdst = -1;
  return std::mktime(&tm);
}

Result<std::string> RenderSource(std::string_view source, const ordered_json& ctx) {
  LUMEN_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Parse(source));
  return t.Render(ctx);
}

std::string RenderOk(std::string_view source, const ordered_json& ctx = ordered_json::object()) {
  auto r = RenderSource(source, ctx);
  EXPECT_TRUE(r.ok()) << r.status().message() << "\nsource: " << source;
  return r.ok() ? *r : std::string("<error>");
}

std::string RenderErr(std::string_view source, const ordered_json& ctx = ordered_json::object()) {
  auto r = RenderSource(source, ctx);
  EXPECT_FALSE(r.ok()) << "rendered: " << (r.ok() ? *r : "") << "\nsource: " << source;
  return r.ok() ? std::string() : r.status().message();
}

TEST(ChatTemplateFixtures, MatchPythonJinjaRenders) {
  std::string vectors;
  const std::string dir = FixturesDir() + "/tokenizers";
  if (!ReadFile(dir + "/test-vectors/chat-templates.json", vectors))
    GTEST_SKIP() << "fixtures not found under " << dir;
  ordered_json all = ordered_json::parse(vectors);
  int checked = 0;
  for (auto it = all.begin(); it != all.end(); ++it) {
    std::string config_text;
    ASSERT_TRUE(ReadFile(dir + "/" + it.key() + "/tokenizer_config.json", config_text));
    ordered_json config = ordered_json::parse(config_text);
    auto tmpl = ChatTemplate::Parse(config["chat_template"].get<std::string>());
    ASSERT_TRUE(tmpl.ok()) << it.key() << ": " << tmpl.status().message();
    for (const auto& c : it.value()) {
      ChatRequest req;
      req.messages = c["messages"];
      req.add_generation_prompt = c["add_generation_prompt"].get<bool>();
      req.kwargs = c["extra_kwargs"];
      SetSpecials(config, req);
      auto r = ApplyChatTemplate(*tmpl, req);
      ASSERT_TRUE(r.ok()) << it.key() << "/" << c["id"] << ": " << r.status().message();
      EXPECT_EQ(*r, c["rendered"].get<std::string>()) << it.key() << "/" << c["id"];
      ++checked;
    }
  }
  EXPECT_EQ(checked, 12);
}

TEST(ChatTemplateMatrix, MatchesPythonJinjaGolden) {
  const std::string golden_dir = SourceDir() + "/tests/goldens/chat_templates";
  std::string text;
  ASSERT_TRUE(ReadFile(golden_dir + "/matrix.json", text)) << golden_dir;
  ordered_json golden = ordered_json::parse(text);
  ASSERT_EQ(golden["generated_by"], "tools/reference/render_chat_templates.py");
  std::map<std::string, ordered_json> convs;
  for (const auto& c : golden["conversations"]) convs[c["id"].get<std::string>()] = c;
  std::map<std::string, ChatTemplate> templates;
  std::map<std::string, ordered_json> specials;
  for (const auto& t : golden["templates"]) {
    std::string name = t["name"].get<std::string>();
    std::string source;
    if (t.contains("file")) {
      ASSERT_TRUE(ReadFile(golden_dir + "/" + t["file"].get<std::string>(), source));
    } else {
      source = t["source"].get<std::string>();
    }
    auto parsed = ChatTemplate::Parse(source);
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status().message();
    templates.emplace(name, std::move(parsed).value());
    specials[name] = t["special_tokens"];
  }
  RenderOptions options;
  options.now = FixedNow();
  int rendered = 0, errors = 0;
  for (const auto& c : golden["cases"]) {
    const std::string name = c["template"].get<std::string>();
    const ordered_json& conv = convs.at(c["conversation"].get<std::string>());
    ChatRequest req;
    req.messages = conv["messages"];
    if (conv.contains("tools")) req.tools = conv["tools"];
    req.add_generation_prompt = conv.value("add_generation_prompt", false);
    req.continue_final_message = conv.value("continue_final_message", false);
    if (conv.contains("kwargs")) req.kwargs = conv["kwargs"];
    SetSpecials(specials[name], req);
    auto r = ApplyChatTemplate(templates.at(name), req, options);
    std::string label = name + " / " + c["conversation"].get<std::string>();
    if (c.contains("error")) {
      ++errors;
      EXPECT_FALSE(r.ok()) << label << " should fail like Jinja: " << c["error"];
      std::string err = c["error"].get<std::string>();
      const std::string kRaise = "TemplateError: ";
      if (!r.ok() && err.rfind(kRaise, 0) == 0) {
        EXPECT_THAT(r.status().message(), HasSubstr(err.substr(kRaise.size()))) << label;
      }
    } else {
      ++rendered;
      ASSERT_TRUE(r.ok()) << label << ": " << r.status().message();
      EXPECT_EQ(*r, c["rendered"].get<std::string>()) << label;
    }
  }
  EXPECT_GT(rendered, 100);
  EXPECT_GT(errors, 5);
}

TEST(ChatTemplateSemantics, WhitespaceControl) {
  EXPECT_EQ(RenderOk("a  {%- if true %} b {% endif -%}  c"), "a b c");
  EXPECT_EQ(RenderOk("{% if true %}\nx\n{% endif %}\ny"), "x\ny");
  EXPECT_EQ(RenderOk("  {% if true %}x{% endif %}"), "x");
  EXPECT_EQ(RenderOk("  {{ 'x' }}"), "  x");
  EXPECT_EQ(RenderOk("a\n  {#- c #}\nb"), "ab");
  EXPECT_EQ(RenderOk("a\n  {# c #}\nb"), "a\nb");
  EXPECT_EQ(RenderOk("line\n"), "line");
  EXPECT_EQ(RenderOk("line\n\n"), "line\n");
  EXPECT_EQ(RenderOk("a\r\nb"), "a\nb");
  EXPECT_EQ(RenderOk("{{ 'x' -}}\u00a0 y"), "xy");
}

TEST(ChatTemplateSemantics, ScopingAndNamespace) {
  EXPECT_EQ(RenderOk("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(RenderOk("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}"), "2");
  EXPECT_EQ(RenderOk("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i "
                     "%}{% endfor %}{{ ns.x }}"),
            "4");
  EXPECT_EQ(RenderOk("{% macro m(a, b=2) %}{{ a }}-{{ b }}-{{ g }}{% endmacro %}{% set g = 'G' "
                     "%}{{ m(1) }} {{ m(b=3, a=0) }}"),
            "1-2-G 0-3-G");
}

TEST(ChatTemplateSemantics, PythonValueFormatting) {
  EXPECT_EQ(pystr::FormatFloat(1.0), "1.0");
  EXPECT_EQ(pystr::FormatFloat(1e16), "1e+16");
  EXPECT_EQ(pystr::FormatFloat(1e-5), "1e-05");
  EXPECT_EQ(pystr::FormatFloat(0.0001), "0.0001");
  EXPECT_EQ(pystr::FormatFloat(-2.5e-300), "-2.5e-300");
  EXPECT_EQ(pystr::FormatFloat(123456789012345.6), "123456789012345.6");
  EXPECT_EQ(RenderOk("{{ [1.0, 'a\\'b', {'k': none}] }}"), "[1.0, \"a'b\", {'k': None}]");
  ordered_json ctx = {{"v", 1.0}, {"w", 3}};
  EXPECT_EQ(RenderOk("{{ v }} {{ w }} {{ v|tojson }}", ctx), "1.0 3 1.0");
}

TEST(ChatTemplateErrors, UnsupportedConstructNamesItAndPosition) {
  std::string e = RenderErr("hello\n  {% include 'other.jinja' %}");
  EXPECT_THAT(e, HasSubstr("include"));
  EXPECT_THAT(e, HasSubstr("2:6"));
  e = RenderErr("{% extends 'base' %}");
  EXPECT_THAT(e, HasSubstr("extends"));
  e = RenderErr("{% for x in y recursive %}{% endfor %}");
  EXPECT_THAT(e, HasSubstr("recursive"));
  e = RenderErr("{{ x|groupby('a') }}");
  EXPECT_THAT(e, HasSubstr("groupby"));
  EXPECT_THAT(e, HasSubstr("1:6"));
}

TEST(ChatTemplateErrors, UnknownFilterAndTest) {
  std::string e = RenderErr("{{ 'a' |\n no_such_filter }}");
  EXPECT_THAT(e, HasSubstr("no filter named 'no_such_filter'"));
  EXPECT_THAT(e, HasSubstr("2:2"));
  e = RenderErr("{{ 1 is frobnicated }}");
  EXPECT_THAT(e, HasSubstr("no test named 'frobnicated'"));
}

TEST(ChatTemplateErrors, SyntaxErrors) {
  EXPECT_THAT(RenderErr("{% if x %}unclosed"), HasSubstr("endif"));
  EXPECT_THAT(RenderErr("{{ 'unterminated }}"), HasSubstr("unterminated string"));
  EXPECT_THAT(RenderErr("{# open comment"), HasSubstr("comment"));
  EXPECT_THAT(RenderErr("{% break %}"), HasSubstr("outside of a loop"));
  EXPECT_THAT(RenderErr("{{ (1 }}"), HasSubstr("1:"));
}

TEST(ChatTemplateErrors, RaiseExceptionCarriesMessage) {
  std::string e = RenderErr("{{ raise_exception('Roles must alternate!') }}");
  EXPECT_THAT(e, HasSubstr("Roles must alternate!"));
}

TEST(ChatTemplateErrors, UndefinedMisuse) {
  EXPECT_EQ(RenderOk("[{{ missing }}][{{ missing|length }}]"), "[][0]");
  EXPECT_THAT(RenderErr("{{ missing.attr }}"), HasSubstr("'missing' is undefined"));
  EXPECT_THAT(RenderErr("{{ missing + 1 }}"), HasSubstr("'missing' is undefined"));
  ordered_json ctx = {{"m", {{"role", "user"}}}};
  EXPECT_THAT(RenderErr("{{ m.content.strip() }}", ctx), HasSubstr("no attribute 'content'"));
}

TEST(ChatTemplateLimits, RecursionIsBounded) {
  std::string e = RenderErr("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_THAT(e, HasSubstr("recursion"));
  e = RenderErr("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}");
  EXPECT_THAT(e, HasSubstr("nested deeper"));
  std::string chain = "{{ 1";
  for (int i = 0; i < 5000; ++i) chain += " + 1";
  e = RenderErr(chain + " }}");
  EXPECT_THAT(e, HasSubstr("nested deeper"));
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
  EXPECT_THAT(RenderErr(ifs), HasSubstr("nested deeper"));
}

TEST(ChatTemplateLimits, OutputAndWorkAreBounded) {
  std::string e = RenderErr("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}");
  EXPECT_THAT(e, HasSubstr("limit"));
  e = RenderErr("{{ 'x' * 100000000 }}");
  EXPECT_THAT(e, HasSubstr("limit"));
  e = RenderErr("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}");
  EXPECT_THAT(e, HasSubstr("step limit"));
  e = RenderErr("{{ range(1000000)|list|length }}");
  EXPECT_THAT(e, HasSubstr("MAX_RANGE"));
  e = RenderErr(
      "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
      "{% endfor %}");
  EXPECT_THAT(e, HasSubstr("nesting"));
}

TEST(ChatTemplateApply, ContinueFinalMessageAndConflicts) {
  auto t = ChatTemplate::Parse(
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}");
  ASSERT_TRUE(t.ok());
  ChatRequest req;
  req.messages = ordered_json::parse(
      R"([{"role":"user","content":"Hi"},{"role":"assistant","content":"Hel"}])");
  req.continue_final_message = true;
  auto r = ApplyChatTemplate(*t, req);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, "<user>Hi</user><assistant>Hel");
  req.add_generation_prompt = true;
  EXPECT_FALSE(ApplyChatTemplate(*t, req).ok());
}

}  // namespace
}  // namespace lumen::tokenize
