#include "lumen/engine/constraint.h"

#include <cmath>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace lumen::engine {
namespace {

// Feeds `s` whole; returns the byte index of the first refusal, or -1.
int FirstRefusal(std::string_view s, bool* complete = nullptr) {
  JsonAcceptor a;
  for (size_t i = 0; i < s.size(); ++i)
    if (!a.Feed(static_cast<uint8_t>(s[i]))) return static_cast<int>(i);
  if (complete) *complete = a.complete();
  return -1;
}

// The oracle: nlohmann's parser, root must be an object.
bool OracleObject(std::string_view s) {
  auto j = nlohmann::json::parse(s, nullptr, false);
  return !j.is_discarded() && j.is_object();
}

TEST(JsonAcceptor, ValidObjectsAndEveryPrefix) {
  const std::vector<std::string> docs = {
      "{}",
      " {\"a\":1}",
      "{\"a\": [1, -2.5e+3, 0, -0.0, 1E9, true, false, null], \"b\": {\"c\": {}}}",
      "{\"s\": \"tab\\t quote\\\" slash\\/ back\\\\ u\\u00e9 pair\\ud83d\\ude00\"}",
      "{\"raw\": \"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"}",
      "{\n  \"nested\": [[[]], [{}], {\"x\": []}]\n}",
      "{\"\": \"\", \"k\": -123456789012345678901234567890}",
  };
  for (const auto& d : docs) {
    ASSERT_TRUE(OracleObject(d)) << d;
    JsonAcceptor a;
    for (size_t i = 0; i < d.size(); ++i) {
      EXPECT_FALSE(a.complete()) << d << " complete early at " << i;
      ASSERT_TRUE(a.Feed(static_cast<uint8_t>(d[i]))) << d << " refused at byte " << i;
    }
    EXPECT_TRUE(a.complete()) << d;
    // Nothing may follow the object.
    EXPECT_FALSE(a.Feed(' '));
  }
}

TEST(JsonAcceptor, RefusesAtTheFirstBadByte) {
  struct Case {
    std::string text;
    int at;
  };
  const std::vector<Case> cases = {
      {"[1]", 0},                                // root must be an object
      {"\"s\"", 0},                              //
      {"{a", 1},                                 // keys are strings
      {"{\"a\" 1", 5},                           // missing colon
      {"{\"a\":01", 6},                          // leading zero
      {"{\"a\":1.}", 7},                         // digit after the dot
      {"{\"a\":.5}", 5},                         //
      {"{\"a\":-}", 6},                          //
      {"{\"a\":1e}", 7},                         //
      {"{\"a\":1e+}", 8},                        //
      {"{\"a\":tru}", 8},                        //
      {"{\"a\":nul1}", 8},                       //
      {"{\"a\":1,}", 7},                         // trailing comma
      {"{\"a\":[1,]}", 8},                       //
      {"{\"a\":[1}", 7},                         // mismatched close
      {"{\"a\":{]}", 6},                         //
      {"{\"a\":\"\\x\"}", 7},                    // bad escape
      {"{\"a\":\"\\u12g\"}", 10},                // bad hex
      {"{\"a\":\"\\udc00\"}", 9},                // lone low surrogate (decided at its 2nd digit)
      {"{\"a\":\"\\ud800x\"}", 12},              // high surrogate without its low half
      {"{\"a\":\"\\ud800\\u0041\"}", 14},        // ... followed by a non-low escape
      {std::string("{\"a\":\"x\ny\"}"), 7},      // raw control byte in a string
      {std::string("{\"a\":\"\xC0\x80\"}"), 6},  // overlong lead byte
      {std::string("{\"a\":\"\xE0\x80\x80\"}"), 7},  // overlong 3-byte form
      {std::string("{\"a\":\"\xED\xA0\x80\"}"), 7},  // UTF-8 encoded surrogate
      {std::string("{\"a\":\"\xC3x\"}"), 7},         // missing continuation
  };
  for (const auto& c : cases) {
    EXPECT_EQ(FirstRefusal(c.text), c.at) << c.text;
    EXPECT_FALSE(OracleObject(c.text)) << c.text;
  }
  // By design nothing follows the root, not even blanks (the grammar's next
  // segment starts right there); parsers accept trailing blanks.
  EXPECT_EQ(FirstRefusal("{} "), 2);
}

TEST(JsonAcceptor, WhitespaceRunAndDepthAreCapped) {
  std::string ws(JsonAcceptor::kMaxWhitespaceRun, ' ');
  EXPECT_EQ(FirstRefusal("{" + ws + "}"), -1);
  EXPECT_EQ(FirstRefusal("{" + ws + " }"), JsonAcceptor::kMaxWhitespaceRun + 1);
  // Spaces inside strings do not count.
  EXPECT_EQ(FirstRefusal("{\"a\":\"" + ws + ws + "\"}"), -1);
  std::string deep = "{\"a\":";
  for (int i = 1; i < JsonAcceptor::kMaxDepth; ++i) deep += "[";
  EXPECT_EQ(FirstRefusal(deep), -1);
  EXPECT_EQ(FirstRefusal(deep + "["), static_cast<int>(deep.size()));
}

// Random texts over JSON's alphabet: whenever the acceptor takes a text whole
// and calls it complete, the oracle must parse it as an object, and every
// object the oracle accepts without trailing blanks the acceptor takes (runs
// of blanks stay short: at most 14 bytes are drawn).
TEST(JsonAcceptor, AgreesWithNlohmannOnRandomTexts) {
  const std::string alphabet = "{}[]:,\"\\ 01-.eE+tuflsnabr\xC3\xA9";
  std::mt19937 rng(12345);
  int complete_count = 0;
  for (int iter = 0; iter < 200000; ++iter) {
    // Grow from a valid start so that many samples get far.
    std::string s = "{";
    const int len = 1 + int(rng() % 14);
    for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
    bool complete = false;
    const bool taken = FirstRefusal(s, &complete) < 0;
    if (taken && complete) {
      ++complete_count;
      EXPECT_TRUE(OracleObject(s)) << s;
    }
    if (OracleObject(s) && s.back() != ' ') {
      EXPECT_TRUE(taken && complete) << s;
    }
  }
  EXPECT_GT(complete_count, 20);
}

// A toy vocabulary with tokens that cross segment boundaries.
std::shared_ptr<const TokenTable> ToyTable() {
  return TokenTable::FromStrings(
      {"get", "_",      "weather", "time",  "\"",    "\",",         " \"arguments\":",
       "se",  "arch\"", "x",       "<eos>", "get_w", "g",           "{",
       "}",   "\"a\"",  ":",       " ",     "1",     "}\n",         "</tool_call>",
       "\"",  "{\"",    ", ",      "\xC3",  "\xA9",  "caf\xC3\xA9", "\\u00",
       "e9"},
      {false, false, false, false, false, false, false, false, false, false, true});
}

std::vector<std::string> AllowedTexts(const GrammarConstraint& c, const TokenTable& t) {
  std::vector<float> logits(size_t(t.size()), 0.0f);
  const size_t n = c.Mask(logits);
  std::vector<std::string> out;
  for (int32_t id = 0; id < t.size(); ++id)
    if (logits[size_t(id)] == 0.0f) out.emplace_back(t.text(id));
  EXPECT_EQ(n, out.size());
  return out;
}

int32_t Id(const TokenTable& t, std::string_view s) {
  for (int32_t id = 0; id < t.size(); ++id)
    if (t.text(id) == s) return id;
  return -1;
}

TEST(GrammarConstraint, NameTrieAllowsOnlyPrefixesOfOfferedNames) {
  auto t = ToyTable();
  auto c = GrammarConstraint::Create(
      t, {GrammarSegment::OneOf({"get_weather\"", "get_time\"", "search\""}),
          GrammarSegment::Literal(", \"arguments\":"), GrammarSegment::JsonObject(),
          GrammarSegment::Literal("}\n</tool_call>")});
  ASSERT_TRUE(c.ok()) << c.status().message();
  GrammarConstraint& g = **c;
  std::vector<int32_t> forced;
  std::string err;
  ASSERT_TRUE(g.Forced(&forced, &err));
  EXPECT_TRUE(forced.empty());  // three names possible: the model chooses
  using V = std::vector<std::string>;
  EXPECT_EQ(AllowedTexts(g, *t), (V{"get", "se", "get_w", "g"}));
  ASSERT_TRUE(g.Accept(Id(*t, "get")));
  EXPECT_EQ(AllowedTexts(g, *t), (V{"_"}));
  EXPECT_FALSE(g.Accept(Id(*t, "x")));  // refused, state unchanged
  ASSERT_TRUE(g.Accept(Id(*t, "_")));
  EXPECT_EQ(AllowedTexts(g, *t), (V{"weather", "time"}));
  ASSERT_TRUE(g.Accept(Id(*t, "time")));
  // The closing quote alone, or crossing into the next literal.
  EXPECT_EQ(AllowedTexts(g, *t), (V{"\"", "\",", "\""}));
  ASSERT_TRUE(g.Accept(Id(*t, "\",")));
  // The rest of the literal is forced.
  ASSERT_TRUE(g.Forced(&forced, &err));
  ASSERT_EQ(forced.size(), 1u);
  EXPECT_EQ(t->text(forced[0]), " \"arguments\":");
  ASSERT_TRUE(g.Accept(forced[0]));
  // JSON: leading space or '{' or '{"'; never the special token.
  EXPECT_EQ(AllowedTexts(g, *t), (V{"{", " ", "{\""}));
  for (const char* s : {" ", "{", "\"a\"", ":", "1", "}"}) ASSERT_TRUE(g.Accept(Id(*t, s))) << s;
  EXPECT_FALSE(g.done());
  ASSERT_TRUE(g.Forced(&forced, &err));
  std::string rest;
  for (int32_t id : forced) rest += t->text(id);
  EXPECT_EQ(rest, "}\n</tool_call>");
  for (int32_t id : forced) ASSERT_TRUE(g.Accept(id));
  EXPECT_TRUE(g.done());
  EXPECT_EQ(g.text(), "get_time\", \"arguments\": {\"a\":1}}\n</tool_call>");
  EXPECT_EQ(AllowedTexts(g, *t), V{});
}

TEST(GrammarConstraint, SingleRemainingNameIsForced) {
  auto t = ToyTable();
  auto c = GrammarConstraint::Create(t, {GrammarSegment::OneOf({"get_weather\"", "search\""})});
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Accept(Id(*t, "se")));
  std::vector<int32_t> forced;
  std::string err;
  ASSERT_TRUE((*c)->Forced(&forced, &err));
  ASSERT_EQ(forced.size(), 1u);
  EXPECT_EQ(t->text(forced[0]), "arch\"");
}

TEST(GrammarConstraint, StringTokensWithEscapesAndUtf8) {
  auto t = ToyTable();
  auto c = GrammarConstraint::Create(t, {GrammarSegment::JsonObject()});
  ASSERT_TRUE(c.ok());
  GrammarConstraint& g = **c;
  for (const char* s : {"{\"", "x", "\"", ":", " ", "\""}) ASSERT_TRUE(g.Accept(Id(*t, s))) << s;
  // Inside a string: plain tokens, the quote, the escape start; not the lone
  // continuation byte, not the special token.
  auto in_string = AllowedTexts(g, *t);
  EXPECT_NE(std::find(in_string.begin(), in_string.end(), "caf\xC3\xA9"), in_string.end());
  EXPECT_NE(std::find(in_string.begin(), in_string.end(), "\\u00"), in_string.end());
  EXPECT_EQ(std::find(in_string.begin(), in_string.end(), "\xA9"), in_string.end());
  EXPECT_EQ(std::find(in_string.begin(), in_string.end(), "<eos>"), in_string.end());
  ASSERT_TRUE(g.Accept(Id(*t, "\xC3")));  // a lead byte: now only its continuation
  EXPECT_EQ(AllowedTexts(g, *t), std::vector<std::string>{"\xA9"});
  ASSERT_TRUE(g.Accept(Id(*t, "\xA9")));
  ASSERT_TRUE(g.Accept(Id(*t, "\\u00")));
  // Only hex digits may follow: "1", "e9", and "caf\xC3\xA9" (c, a = the last two
  // digits, then plain text).
  EXPECT_EQ(AllowedTexts(g, *t), (std::vector<std::string>{"1", "caf\xC3\xA9", "e9"}));
  ASSERT_TRUE(g.Accept(Id(*t, "e9")));
  ASSERT_TRUE(g.Accept(Id(*t, "\"")));
  ASSERT_TRUE(g.Accept(Id(*t, "}")));
  EXPECT_TRUE(g.done());
  EXPECT_TRUE(OracleObject(g.text())) << g.text();
}

TEST(GrammarConstraint, RejectsBadOptions) {
  auto t = ToyTable();
  EXPECT_FALSE(GrammarConstraint::Create(t, {GrammarSegment::OneOf({})}).ok());
  auto c = GrammarConstraint::Create(t, {GrammarSegment::OneOf({"ab", "a"})});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("prefix"), std::string::npos);
}

TEST(TokenTable, EncodeExactGreedyAndMissingBytes) {
  auto t = ToyTable();
  auto ids = t->EncodeExact("get_weather\"");
  ASSERT_TRUE(ids);
  std::string back;
  for (int32_t id : *ids) back += t->text(id);
  EXPECT_EQ(back, "get_weather\"");
  // "get_w" would strand "eather": get + _ + weather + quote.
  EXPECT_EQ(ids->size(), 4u);
  EXPECT_FALSE(t->EncodeExact("zzz"));
  EXPECT_FALSE(t->EncodeExact("<eos>"));  // special tokens are never spelled
}

TEST(TokenTable, BuiltFromATokenizerSpellsAnyAsciiText) {
  auto tok = tokenize::MakeSyntheticTokenizer(tokenize::SyntheticKind::kByteBpe, 1000, 1);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  auto t = TokenTable::Build(*tok);
  ASSERT_EQ(t->size(), tok->vocab_size());
  const std::string text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\":";
  auto ids = t->EncodeExact(text);
  ASSERT_TRUE(ids);
  EXPECT_EQ(tok->Decode(*ids), text);
  for (int32_t id = 0; id < t->size(); ++id) {
    EXPECT_EQ(t->text(id), tok->TokenBytes(id));
    if (tok->IsEog(id)) {
      EXPECT_TRUE(t->special(id));
    }
  }
}

}  // namespace
}  // namespace lumen::engine
