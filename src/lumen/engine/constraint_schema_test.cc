#include "lumen/engine/constraint_schema.h"

#include <cmath>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "lumen/engine/constraint.h"

namespace lumen::engine {
namespace {

using ojson = nlohmann::ordered_json;

std::shared_ptr<const SchemaGrammar> MustCompile(const char* schema) {
  auto g = CompileJsonSchema(ojson::parse(schema));
  EXPECT_TRUE(g.ok()) << schema << ": " << g.status().message();
  return g.ok() ? *g : nullptr;
}

std::string CompileError(const char* schema) {
  auto g = CompileJsonSchema(ojson::parse(schema));
  return g.ok() ? std::string("(compiled)") : g.status().message();
}

// Whether `text` is a whole sentence: every byte taken, accepted only at the end.
bool Sentence(const SchemaGrammar& g, std::string_view text) {
  SchemaGrammar::Stacks st = g.Start();
  for (size_t i = 0; i < text.size(); ++i) {
    if (SchemaGrammar::Accepted(st)) return false;
    st = g.Advance(st, static_cast<uint8_t>(text[i]));
    if (st.empty()) return false;
  }
  return SchemaGrammar::Accepted(st);
}

// A random sentence: each step takes a uniformly chosen allowed byte, so
// strings, arrays and numbers end by chance. Empty if it grew past `cap`.
std::string RandomSentence(const SchemaGrammar& g, std::mt19937& rng, size_t cap = 4000) {
  SchemaGrammar::Stacks st = g.Start();
  std::string out;
  while (!SchemaGrammar::Accepted(st)) {
    if (out.size() > cap) return {};
    const SchemaGrammar::ByteSet b = g.NextBytes(st);
    std::vector<int> bytes;
    for (int c = 0; c < 256; ++c)
      if ((b[size_t(c) >> 6] >> (c & 63)) & 1) bytes.push_back(c);
    EXPECT_FALSE(bytes.empty()) << "dead end after " << out;
    if (bytes.empty()) return {};
    // Prefer closing bytes a little so values end at a useful length.
    int c = bytes[std::uniform_int_distribution<size_t>(0, bytes.size() - 1)(rng)];
    for (int closing : {'"', '}', ']'})
      if (std::find(bytes.begin(), bytes.end(), closing) != bytes.end() &&
          std::uniform_int_distribution<int>(0, 3)(rng) == 0)
        c = closing;
    out += static_cast<char>(c);
    st = g.Advance(st, static_cast<uint8_t>(c));
    EXPECT_FALSE(st.empty()) << "NextBytes offered a byte Advance refused after " << out;
    if (st.empty()) return {};
  }
  return out;
}

constexpr const char* kPerson = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991},
    "score": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "kind": {"type": "string", "enum": ["a", "b"]},
    "nick": {"type": "string"},
    "maybe": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    "lit": {"const": "x"},
    "nested": {"type": "object", "properties": {"ok": {"type": "boolean"}},
               "required": ["ok"], "additionalProperties": false}
  },
  "required": ["name", "age", "score", "tags", "kind", "maybe", "lit", "nested"],
  "additionalProperties": false,
  "$schema": "http://json-schema.org/draft-07/schema#"
})";

TEST(SchemaGrammar, AcceptsValidCompactObjects) {
  auto g = MustCompile(kPerson);
  ASSERT_TRUE(g);
  EXPECT_TRUE(Sentence(*g, R"({"name":"Ann","age":-42,"score":3.5e-2,"tags":[],"kind":"a",)"
                           R"("maybe":null,"lit":"x","nested":{"ok":true}})"));
  // The optional "nick" in its place; unicode and escapes in strings.
  EXPECT_TRUE(Sentence(*g,
                       "{\"name\":\"caf\xC3\xA9 \\\"q\\\" \\u00e9\",\"age\":0,\"score\":0,"
                       "\"tags\":[\"x\",\"\"],\"kind\":\"b\",\"nick\":\"n\",\"maybe\":\"s\","
                       "\"lit\":\"x\",\"nested\":{\"ok\":false}}"));
}

TEST(SchemaGrammar, RefusesInvalidObjects) {
  auto g = MustCompile(kPerson);
  ASSERT_TRUE(g);
  const std::string ok_tail =
      R"("score":1,"tags":[],"kind":"a","maybe":null,"lit":"x","nested":{"ok":true}})";
  EXPECT_TRUE(Sentence(*g, R"({"name":"A","age":1,)" + ok_tail));
  EXPECT_FALSE(Sentence(*g, R"({"name":"A","age":1.5,)" + ok_tail));      // integer
  EXPECT_FALSE(Sentence(*g, R"({"name":"A","age":01,)" + ok_tail));       // leading zero
  EXPECT_FALSE(Sentence(*g, R"({"name":"A",)" + ok_tail));                // age is required
  EXPECT_FALSE(Sentence(*g, R"({"age":1,"name":"A",)" + ok_tail));        // schema order
  EXPECT_FALSE(Sentence(*g, R"({"name":"A","age":1,"x":1,)" + ok_tail));  // no extra keys
  EXPECT_FALSE(Sentence(*g, R"({"name":"A","age":1,"score":1,"tags":[],"kind":"c",)"
                            R"("maybe":null,"lit":"x","nested":{"ok":true}})"));  // enum
  EXPECT_FALSE(Sentence(*g, R"({"name":"A","age":1,"score":1,"tags":[],"kind":"a",)"
                            R"("maybe":null,"lit":"y","nested":{"ok":true}})"));  // const
  EXPECT_FALSE(Sentence(*g, R"({"name":"A","age":1,"score":1,"tags":[1],"kind":"a",)"
                            R"("maybe":null,"lit":"x","nested":{"ok":true}})"));  // items
  EXPECT_FALSE(Sentence(*g, R"({"name":"A\u","age":1,)" + ok_tail));              // bad escape
  EXPECT_FALSE(Sentence(*g, R"({"name":"\ud800","age":1,)" + ok_tail));           // lone surrogate
  EXPECT_FALSE(Sentence(*g, "{\"name\":\"\xC3\",\"age\":1," + ok_tail));          // cut UTF-8
  EXPECT_FALSE(Sentence(*g, "{\"name\":\"a\nb\",\"age\":1," + ok_tail));          // raw control
  EXPECT_FALSE(Sentence(*g, R"({ "name":"A","age":1,)" + ok_tail));               // compact only
}

// Checks one value against kPerson by hand (an oracle apart from the grammar).
void CheckPerson(const nlohmann::json& v, const std::string& text) {
  ASSERT_TRUE(v.is_object()) << text;
  for (const char* k : {"name", "age", "score", "tags", "kind", "maybe", "lit", "nested"})
    ASSERT_TRUE(v.contains(k)) << k << " missing in " << text;
  for (const auto& [k, x] : v.items())
    EXPECT_TRUE(k == "name" || k == "age" || k == "score" || k == "tags" || k == "kind" ||
                k == "nick" || k == "maybe" || k == "lit" || k == "nested")
        << k << " in " << text;
  EXPECT_TRUE(v["name"].is_string()) << text;
  EXPECT_TRUE(v["age"].is_number_integer()) << text;
  EXPECT_LE(std::fabs(v["age"].get<double>()), 9007199254740991.0) << text;
  EXPECT_TRUE(v["score"].is_number()) << text;
  EXPECT_TRUE(v["tags"].is_array()) << text;
  for (const auto& t : v["tags"]) EXPECT_TRUE(t.is_string()) << text;
  EXPECT_TRUE(v["kind"] == "a" || v["kind"] == "b") << text;
  EXPECT_TRUE(v["maybe"].is_null() || v["maybe"].is_string()) << text;
  EXPECT_EQ(v["lit"], "x") << text;
  ASSERT_TRUE(v["nested"].is_object()) << text;
  EXPECT_EQ(v["nested"].size(), 1u) << text;
  EXPECT_TRUE(v["nested"]["ok"].is_boolean()) << text;
}

TEST(SchemaGrammar, RandomSentencesValidate) {
  auto g = MustCompile(kPerson);
  ASSERT_TRUE(g);
  std::mt19937 rng(7);
  int checked = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string s = RandomSentence(*g, rng);
    if (s.empty()) continue;
    auto v = nlohmann::json::parse(s, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << "not JSON: " << s;
    CheckPerson(v, s);
    ++checked;
  }
  EXPECT_GT(checked, 250);
}

TEST(SchemaGrammar, RefsDefsAndRecursion) {
  auto g = MustCompile(R"({
    "$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer", "minimum": 0, "maximum": 100},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
      "required": ["v", "kids"], "additionalProperties": false}},
    "$ref": "#/$defs/node"})");
  ASSERT_TRUE(g);
  EXPECT_TRUE(Sentence(*g, R"({"v":0,"kids":[]})"));
  EXPECT_TRUE(
      Sentence(*g, R"({"v":99,"kids":[{"v":1,"kids":[]},{"v":2,"kids":[{"v":3,"kids":[]}]}]})"));
  EXPECT_FALSE(Sentence(*g, R"({"v":100,"kids":[]})"));  // a digit count inside the range: 0..99
  EXPECT_FALSE(Sentence(*g, R"({"v":-1,"kids":[]})"));   // minimum 0
  EXPECT_FALSE(
      Sentence(*g, R"({"v":1,"kids":[{"v":1,"kids":[]},{"v":1,"kids":[]},{"v":1,"kids":[]}]})"));
  std::mt19937 rng(3);
  for (int i = 0; i < 100; ++i) {
    const std::string s = RandomSentence(*g, rng);
    if (s.empty()) continue;
    ASSERT_FALSE(nlohmann::json::parse(s, nullptr, false).is_discarded()) << s;
  }
  // definitions (draft 7) and the root itself.
  auto list = MustCompile(R"({"definitions": {"s": {"type": "string"}}, "type": "object",
      "properties": {"a": {"$ref": "#/definitions/s"}, "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
      "required": ["a", "next"]})");
  ASSERT_TRUE(list);
  EXPECT_TRUE(Sentence(*list, R"({"a":"x","next":{"a":"y","next":null}})"));
}

TEST(SchemaGrammar, NumberRanges) {
  auto g = MustCompile(R"({"type":"object","properties":{
      "i":{"type":"integer","minimum":-5,"maximum":5},
      "n":{"type":"number","minimum":-10,"maximum":1}},"required":["i","n"]})");
  ASSERT_TRUE(g);
  for (const char* ok :
       {R"({"i":5,"n":0.5})", R"({"i":-5,"n":-9.99})", R"({"i":0,"n":0})", R"({"i":3,"n":-0.25})"})
    EXPECT_TRUE(Sentence(*g, ok)) << ok;
  for (const char* bad :
       {R"({"i":6,"n":0})", R"({"i":-6,"n":0})", R"({"i":10,"n":0})", R"({"i":1,"n":1.5})",
        R"({"i":1,"n":-10.5})", R"({"i":1,"n":1e1})", R"({"i":1.0,"n":0})"})
    EXPECT_FALSE(Sentence(*g, bad)) << bad;
  auto free =
      MustCompile(R"({"type":"object","properties":{"x":{"type":"number"}},"required":["x"]})");
  ASSERT_TRUE(free);
  for (const char* ok : {R"({"x":-0.5})", R"({"x":12.5E+10})", R"({"x":0e0})", R"({"x":-7})"})
    EXPECT_TRUE(Sentence(*free, ok)) << ok;
  for (const char* bad : {R"({"x":-})", R"({"x":1.})", R"({"x":.5})", R"({"x":+1})", R"({"x":1e})"})
    EXPECT_FALSE(Sentence(*free, bad)) << bad;
}

TEST(SchemaGrammar, StringAndArrayBounds) {
  auto g = MustCompile(R"({"type":"object","properties":{
      "s":{"type":"string","minLength":1,"maxLength":3},
      "a":{"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":2},
      "m":{"type":"object","additionalProperties":{"type":"integer"}},
      "t":{"type":["string","null"]}},"required":["s","a","m","t"]})");
  ASSERT_TRUE(g);
  EXPECT_TRUE(Sentence(*g, "{\"s\":\"\xC3\xA9\\n!\",\"a\":[true],\"m\":{},\"t\":null}"));
  EXPECT_TRUE(Sentence(*g, R"({"s":"x","a":[true,false],"m":{"k":1,"j":-2},"t":"u"})"));
  EXPECT_FALSE(Sentence(*g, R"({"s":"","a":[true],"m":{},"t":null})"));
  // Bounded strings keep to the BMP (one code point = one UTF-16 unit).
  EXPECT_FALSE(Sentence(*g, "{\"s\":\"\xF0\x9F\x98\x80\",\"a\":[true],\"m\":{},\"t\":null}"));
  EXPECT_TRUE(Sentence(*g, "{\"s\":\"a\",\"a\":[true],\"m\":{\"\xF0\x9F\x98\x80\":1},\"t\":null}"));
  EXPECT_FALSE(Sentence(*g, R"({"s":"abcd","a":[true],"m":{},"t":null})"));
  EXPECT_FALSE(Sentence(*g, R"({"s":"a","a":[],"m":{},"t":null})"));
  EXPECT_FALSE(Sentence(*g, R"({"s":"a","a":[true,true,true],"m":{},"t":null})"));
  EXPECT_FALSE(Sentence(*g, R"({"s":"a","a":[true],"m":{"k":"v"},"t":null})"));
  EXPECT_FALSE(Sentence(*g, R"({"s":"a","a":[true],"m":{},"t":1})"));
}

TEST(SchemaGrammar, UnsupportedKeywordsNameThemselves) {
  EXPECT_EQ(
      CompileError(R"({"type":"object","properties":{"e":{"type":"string","format":"email"}}})")
          .rfind("properties.e.format: keyword 'format' is not supported", 0),
      0u);
  EXPECT_EQ(CompileError(R"({"type":"object","properties":{"e":{"type":"string","pattern":"^a"}}})")
                .rfind("properties.e.pattern: keyword 'pattern'", 0),
            0u);
  EXPECT_EQ(CompileError(R"({"oneOf":[{"type":"string"}]})").rfind("oneOf: keyword 'oneOf'", 0),
            0u);
  EXPECT_EQ(CompileError(R"({"type":"object","properties":{"a":{"$ref":"#/$defs/missing"}}})")
                .rfind("properties.a.$ref: '#/$defs/missing' does not resolve", 0),
            0u);
  EXPECT_EQ(CompileError(R"({"$ref":"http://example.com/s.json"})").rfind("$ref: ", 0), 0u);
  EXPECT_EQ(CompileError(R"({"type":"number"})").rfind("type: a number at the top level", 0), 0u);
  EXPECT_EQ(CompileError(R"({"type":"objekt"})").rfind("type: unknown type \"objekt\"", 0), 0u);
  EXPECT_EQ(CompileError(R"({"type":"integer","minimum":1})").rfind("type:", 0), 0u);
  EXPECT_EQ(CompileError(R"({"type":"object","properties":{"n":{"type":"integer","minimum":1}}})")
                .rfind("properties.n.minimum: a minimum above 0", 0),
            0u);
  EXPECT_EQ(CompileError(R"({"type":"object","required":["z"],"additionalProperties":false})")
                .rfind("required: 'z' is required but not among properties", 0),
            0u);
  EXPECT_EQ(CompileError(R"({"type":"array","items":[{"type":"string"}]})").rfind("items: ", 0),
            0u);
  EXPECT_EQ(
      CompileError(R"({"type":"array","maxItems":100000})").rfind("maxItems: 100000 is above", 0),
      0u);
  EXPECT_EQ(CompileError(R"(false)").rfind("schema: the schema false", 0), 0u);
  EXPECT_EQ(CompileError(R"({"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/a"}}})"),
            "schema: admits no value");
}

TEST(SchemaGrammar, HostileSchemasAreBounded) {
  // Deep nesting: an error, not a stack overflow.
  ojson deep = {{"type", "string"}};
  for (int i = 0; i < 10000; ++i)
    deep = {{"type", "object"}, {"properties", {{"a", std::move(deep)}}}};
  auto d = CompileJsonSchema(deep);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("nests deeper than 64 levels"), std::string::npos)
      << d.status().message();
  // A huge grammar: an error, not unbounded memory.
  ojson wide = {{"type", "object"}, {"properties", ojson::object()}};
  for (int i = 0; i < 200; ++i)
    wide["properties"]["p" + std::to_string(i)] = {{"type", "string"}, {"maxLength", 4096}};
  auto w = CompileJsonSchema(wide);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().message(), "schema: too large to enforce");
  // Many live branches: the parse keeps a bounded set and stays valid.
  ojson branches = ojson::array();
  for (int i = 0; i < 40; ++i)
    branches.push_back(
        {{"type", "object"},
         {"properties",
          {{"k", {{"anyOf", ojson::array({{{"type", "string"}}, {{"const", "x"}}})}}},
           {"n" + std::to_string(i), {{"type", "null"}}}}},
         {"required", {"k"}}});
  auto b = CompileJsonSchema(
      {{"type", "object"}, {"properties", {{"v", {{"anyOf", branches}}}}}, {"required", {"v"}}});
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_TRUE(Sentence(**b, R"({"v":{"k":"x","n7":null}})"));
}

TEST(SchemaGrammar, RootsOtherThanObjects) {
  auto s = MustCompile(R"({"type":"string","enum":["yes","no"]})");
  ASSERT_TRUE(s);
  EXPECT_TRUE(Sentence(*s, "\"yes\""));
  EXPECT_FALSE(Sentence(*s, "\"maybe\""));
  auto any = MustCompile("{}");
  ASSERT_TRUE(any);
  EXPECT_TRUE(Sentence(*any, R"({"a":[1,{"b":null}],"c":"d"})"));
  EXPECT_TRUE(Sentence(*any, R"([true,false])"));
}

// Through GrammarConstraint: required keys are forced, the first-byte filter
// and the free-string fast path agree with walking every token.
TEST(SchemaGrammar, ConstraintForcesKeysAndMasksTokens) {
  auto g = MustCompile(R"({"type":"object","properties":{"city":{"type":"string"},
      "n":{"type":"integer"},"ok":{"type":"boolean"}},"required":["city","n","ok"],
      "additionalProperties":false})");
  ASSERT_TRUE(g);
  std::vector<std::string> vocab = {
      "{",   "}",  "\"", "city",  "\":", ",",   "\"n\":", "1",        "23",    "Paris", " Rome",
      "\"}", "tr", "ue", "false", "a\"", "\\n", "x",      ",\"ok\":", "<eos>", "{\"",   "\\u"};
  std::vector<bool> special(vocab.size());
  special[19] = true;
  auto table = TokenTable::FromStrings(vocab, special);
  auto c = GrammarConstraint::Create(table, {GrammarSegment::Schema(g)});
  ASSERT_TRUE(c.ok()) << c.status().message();
  GrammarConstraint& gc = **c;
  std::vector<int32_t> forced;
  std::string err;
  ASSERT_TRUE(gc.Forced(&forced, &err)) << err;
  std::string text;
  for (int32_t id : forced) text += vocab[size_t(id)];
  EXPECT_EQ(text, "{\"city\":\"");
  for (int32_t id : forced) ASSERT_TRUE(gc.Accept(id));
  // Inside the free string: every token the walk allows, Mask allows, and
  // the reverse.
  const auto agree = [&] {
    std::vector<float> logits(vocab.size(), 0.0f);
    gc.Mask(logits);
    for (size_t id = 0; id < vocab.size(); ++id)
      EXPECT_EQ(std::isinf(logits[id]), special[id] || !gc.Allows(vocab[id]))
          << "token '" << vocab[id] << "' after '" << gc.text() << "'";
  };
  agree();
  ASSERT_TRUE(gc.Accept(9));   // Paris
  ASSERT_TRUE(gc.Accept(16));  // \n
  agree();
  ASSERT_TRUE(gc.Accept(2));  // closing quote
  ASSERT_TRUE(gc.Forced(&forced, &err)) << err;
  text.clear();
  for (int32_t id : forced) text += vocab[size_t(id)];
  EXPECT_EQ(text, ",\"n\":");
  for (int32_t id : forced) ASSERT_TRUE(gc.Accept(id));
  agree();
  ASSERT_TRUE(gc.Accept(8));  // 23
  agree();
  ASSERT_TRUE(gc.Accept(18));  // ,"ok":
  agree();
  ASSERT_TRUE(gc.Accept(14));  // false
  EXPECT_FALSE(gc.done());
  ASSERT_TRUE(gc.Forced(&forced, &err)) << err;
  ASSERT_EQ(forced, std::vector<int32_t>{1});
  ASSERT_TRUE(gc.Accept(1));
  EXPECT_TRUE(gc.done());
  EXPECT_EQ(gc.text(), R"({"city":"Paris\n","n":23,"ok":false})");
}

}  // namespace
}  // namespace lumen::engine
