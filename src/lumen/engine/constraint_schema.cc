#include "lumen/engine/constraint_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace lumen::engine {

using ojson = nlohmann::ordered_json;

// ---------------------------------------------------------------------------
// SchemaGrammar: the automaton

void SchemaGrammar::Expand(Stack s, Stacks& out, int depth) const {
  // A rule reached again without consuming a byte (left recursion through
  // $ref) is cut here; its other alternatives still apply.
  if (depth > 64 || s.size() > kMaxStack) return;
  if (s.empty()) {
    out.push_back(std::move(s));
    return;
  }
  const uint32_t p = s.back();
  const int32_t sym = syms_[p];
  if (sym < 0) {
    out.push_back(std::move(s));
    return;
  }
  s.pop_back();
  if (syms_[p + 1] != kEnd) s.push_back(p + 1);
  for (uint32_t a : alts_[size_t(sym)]) {
    Stack t = s;
    if (syms_[a] != kEnd) t.push_back(a);
    Expand(std::move(t), out, depth + 1);
  }
}

namespace {
void SortUnique(SchemaGrammar::Stacks& st) {
  std::sort(st.begin(), st.end());
  st.erase(std::unique(st.begin(), st.end()), st.end());
}
}  // namespace

SchemaGrammar::Stacks SchemaGrammar::Start() const {
  Stacks out;
  for (uint32_t a : alts_[size_t(root_)]) {
    Stack s;
    if (syms_[a] != kEnd) s.push_back(a);
    Expand(std::move(s), out, 0);
  }
  SortUnique(out);
  return out;
}

SchemaGrammar::Stacks SchemaGrammar::Advance(const Stacks& st, uint8_t c) const {
  Stacks out;
  for (const Stack& s : st) {
    if (s.empty()) continue;
    const uint32_t p = s.back();
    if (!Matches(syms_[p], c)) continue;
    Stack t(s.begin(), s.end() - 1);
    if (syms_[p + 1] != kEnd) t.push_back(p + 1);
    Expand(std::move(t), out, 0);
  }
  SortUnique(out);
  // Bounded work per byte: every stack is a prefix of some valid value, so
  // dropping some (an ambiguous schema with very many live branches) keeps
  // the output valid.
  if (out.size() > kMaxStacks) out.resize(kMaxStacks);
  return out;
}

SchemaGrammar::ByteSet SchemaGrammar::NextBytes(const Stacks& st) const {
  ByteSet b{};
  for (const Stack& s : st) {
    if (s.empty()) continue;
    const ByteSet& c = classes_[size_t(-(syms_[s.back()] + 1))];
    for (int i = 0; i < 4; ++i) b[i] |= c[i];
  }
  return b;
}

bool SchemaGrammar::InFreeString(const Stacks& st) const {
  for (const Stack& s : st)
    if (!s.empty() && s.back() == free_char_pos_) return true;
  return false;
}

// ---------------------------------------------------------------------------
// SchemaBuilder: grammar construction and the JSON Schema compiler

using Seq = std::vector<int32_t>;

class SchemaBuilder {
 public:
  SchemaBuilder(const ojson& root) : root_(root), g_(std::make_shared<SchemaGrammar>()) {}

  Result<std::shared_ptr<const SchemaGrammar>> Build();

 private:
  // Grammar pieces.
  // Past the size limits the builder stops growing (Build reports it), so a
  // hostile schema cannot run the server out of memory.
  static constexpr size_t kMaxRules = size_t(1) << 18, kMaxSymbols = size_t(1) << 21;
  int32_t NewRule() {
    if (g_->alts_.size() >= kMaxRules) {
      too_large_ = true;
      return 0;
    }
    g_->alts_.emplace_back();
    return static_cast<int32_t>(g_->alts_.size() - 1);
  }
  // Returns the position of the alternative's first symbol.
  uint32_t Alt(int32_t rule, const Seq& seq) {
    const auto start = static_cast<uint32_t>(g_->syms_.size());
    if (too_large_ || start + seq.size() >= kMaxSymbols) {
      too_large_ = true;
      return 0;
    }
    g_->alts_[size_t(rule)].push_back(start);
    g_->syms_.insert(g_->syms_.end(), seq.begin(), seq.end());
    g_->syms_.push_back(SchemaGrammar::kEnd);
    return start;
  }
  int32_t Class(const SchemaGrammar::ByteSet& b) {
    auto [it, fresh] = class_ids_.emplace(b, static_cast<int32_t>(g_->classes_.size()));
    if (fresh) g_->classes_.push_back(b);
    return -(it->second + 1);
  }
  int32_t Range(uint8_t lo, uint8_t hi) {
    SchemaGrammar::ByteSet b{};
    for (int c = lo; c <= hi; ++c) b[size_t(c) >> 6] |= uint64_t(1) << (c & 63);
    return Class(b);
  }
  int32_t Byte(uint8_t c) { return Range(c, c); }
  static void Append(Seq& s, const Seq& more) { s.insert(s.end(), more.begin(), more.end()); }
  Seq Lit(std::string_view text) {
    Seq s;
    for (char c : text) s.push_back(Byte(static_cast<uint8_t>(c)));
    return s;
  }
  // A rule with one alternative per sequence.
  int32_t Union(const std::vector<Seq>& alts) {
    const int32_t r = NewRule();
    for (const Seq& a : alts) Alt(r, a);
    return r;
  }

  // Shared value rules.
  int32_t FreeString();            // '"' chars '"'
  int32_t Char();                  // one string character (for bounded strings)
  int32_t OtherChar(bool astral);  // one string character that is not plain ASCII
  static SchemaGrammar::ByteSet Bytes(std::string_view chars);
  static SchemaGrammar::ByteSet PlainAscii();  // printable ASCII but '"' and '\\'
  int32_t One(const Seq& seq) {
    const int32_t r = NewRule();
    Alt(r, seq);
    return r;
  }
  int32_t Digits(size_t max);  // 0..max more digits; SIZE_MAX: unbounded
  int32_t AnyValue();
  int32_t Bool() {
    if (bool_ < 0) bool_ = Union({Lit("true"), Lit("false")});
    return bool_;
  }
  int32_t Null() {
    if (null_ < 0) null_ = One(Lit("null"));
    return null_;
  }

  // The compiler.
  Result<int32_t> Compile(const ojson& s, const std::string& path);
  Result<int32_t> CompileNode(const ojson& s, const std::string& path);
  Result<int32_t> CompileRef(const std::string& ref, const std::string& path);
  Result<int32_t> CompileType(const std::string& type, const ojson& s, const std::string& path);
  Result<int32_t> CompileObject(const ojson& s, const std::string& path);
  Result<int32_t> CompileArray(const ojson& s, const std::string& path);
  Result<int32_t> CompileString(const ojson& s, const std::string& path);
  Result<int32_t> CompileNumber(bool integer, const ojson& s, const std::string& path);
  Result<int64_t> Count(const ojson& s, const char* key, const std::string& path, int64_t cap);

  static std::string At(const std::string& path, std::string_view key) {
    return path.empty() ? std::string(key) : path + "." + std::string(key);
  }

  const ojson& root_;
  std::shared_ptr<SchemaGrammar> g_;
  std::map<SchemaGrammar::ByteSet, int32_t> class_ids_;
  std::map<std::string, int32_t> refs_;
  std::map<size_t, int32_t> digits_;
  int32_t free_string_ = -1, char_ = -1, other_char_ = -1, other_bmp_char_ = -1, any_ = -1,
          bool_ = -1, null_ = -1;
  int32_t number_ = -1, integer_ = -1;
  int depth_ = 0;  // schema nesting being compiled
  bool too_large_ = false;
};

namespace {

// Unbounded numbers keep to 18 integer digits and a 2-digit exponent, so
// every one parses to a finite double.
constexpr size_t kMaxIntDigits = 18;

constexpr std::string_view kSupported =
    "type, properties, required, additionalProperties, items, minItems, maxItems, enum, const, "
    "anyOf, $ref, $defs, minLength, maxLength, minimum, maximum";

bool Annotation(std::string_view k) {
  static const std::set<std::string_view> kIgnored = {
      "$schema",  "$id",        "$comment", "title",     "description", "default",
      "examples", "deprecated", "readOnly", "writeOnly", "$defs",       "definitions"};
  return kIgnored.count(k) > 0;
}

bool Known(std::string_view k) {
  static const std::set<std::string_view> kKeys = {
      "type",      "properties", "required", "additionalProperties",
      "items",     "minItems",   "maxItems", "enum",
      "const",     "anyOf",      "$ref",     "minLength",
      "maxLength", "minimum",    "maximum"};
  return kKeys.count(k) > 0 || Annotation(k);
}

// Whether JSON value v has JSON Schema type t.
bool HasType(const ojson& v, std::string_view t) {
  if (t == "string") return v.is_string();
  if (t == "integer")
    return v.is_number_integer() ||
           (v.is_number_float() && std::trunc(v.get<double>()) == v.get<double>());
  if (t == "number") return v.is_number();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  return false;
}

const std::set<std::string_view> kTypes = {"string", "integer", "number", "boolean",
                                           "null",   "object",  "array"};

// Decimal digits of n >= 0 (0 has one).
int DigitCount(uint64_t n) {
  int d = 1;
  while (n >= 10) n /= 10, ++d;
  return d;
}

}  // namespace

SchemaGrammar::ByteSet SchemaBuilder::Bytes(std::string_view chars) {
  SchemaGrammar::ByteSet b{};
  for (char ch : chars) {
    const auto c = static_cast<uint8_t>(ch);
    b[c >> 6] |= uint64_t(1) << (c & 63);
  }
  return b;
}

SchemaGrammar::ByteSet SchemaBuilder::PlainAscii() {
  SchemaGrammar::ByteSet b{};
  for (int c = 0x20; c < 0x80; ++c)
    if (c != '"' && c != '\\') b[size_t(c) >> 6] |= uint64_t(1) << (c & 63);
  return b;
}

int32_t SchemaBuilder::OtherChar(bool astral) {
  int32_t& cached = astral ? other_char_ : other_bmp_char_;
  if (cached >= 0) return cached;
  // One code point that is not plain ASCII: well-formed UTF-8 (no surrogates,
  // <= U+10FFFF; without `astral`, none above U+FFFF) or an escape (\uXXXX
  // outside the surrogate range).
  cached = NewRule();
  const int32_t r = cached;
  const int32_t cont = Range(0x80, 0xBF), hex = Class(Bytes("0123456789abcdefABCDEF"));
  Alt(r, {Range(0xC2, 0xDF), cont});
  Alt(r, {Byte(0xE0), Range(0xA0, 0xBF), cont});
  Alt(r, {Range(0xE1, 0xEC), cont, cont});
  Alt(r, {Byte(0xED), Range(0x80, 0x9F), cont});
  Alt(r, {Range(0xEE, 0xEF), cont, cont});
  if (astral) {
    Alt(r, {Byte(0xF0), Range(0x90, 0xBF), cont, cont});
    Alt(r, {Range(0xF1, 0xF3), cont, cont, cont});
    Alt(r, {Byte(0xF4), Range(0x80, 0x8F), cont, cont});
  }
  Alt(r, {Byte('\\'), Class(Bytes("\"\\/bfnrt"))});
  Alt(r, {Byte('\\'), Byte('u'), Class(Bytes("0123456789abcefABCEF")), hex, hex, hex});
  Alt(r, {Byte('\\'), Byte('u'), Class(Bytes("dD")), Range('0', '7'), hex, hex});
  return r;
}

int32_t SchemaBuilder::Char() {
  if (char_ >= 0) return char_;
  char_ = NewRule();
  Alt(char_, {Class(PlainAscii())});
  // Bounded strings keep to the BMP, where a code point (JSON Schema's
  // length) is also one UTF-16 unit (JavaScript's, e.g. zod's .max()).
  Alt(char_, {OtherChar(/*astral=*/false)});
  return char_;
}

int32_t SchemaBuilder::FreeString() {
  if (free_string_ >= 0) return free_string_;
  // chars := '"' | plain chars | other chars: the closing quote is part of
  // the loop, and the plain alternative's class is the fast path's marker
  // (InFreeString).
  const int32_t chars = NewRule();
  Alt(chars, {Byte('"')});
  g_->free_char_pos_ = Alt(chars, {Class(PlainAscii()), chars});
  Alt(chars, {OtherChar(/*astral=*/true), chars});
  free_string_ = One({Byte('"'), chars});
  return free_string_;
}

int32_t SchemaBuilder::Digits(size_t max) {
  auto it = digits_.find(max);
  if (it != digits_.end()) return it->second;
  const int32_t r = NewRule();
  digits_[max] = r;
  Alt(r, {});
  if (max == SIZE_MAX)
    Alt(r, {Range('0', '9'), r});
  else if (max > 0)
    Alt(r, {Range('0', '9'), Digits(max - 1)});
  return r;
}

int32_t SchemaBuilder::AnyValue() {
  if (any_ >= 0) return any_;
  any_ = NewRule();
  const int32_t str = FreeString();
  // object: '{' '}' | '{' str ':' V tail ; tail: '}' | ',' str ':' V tail
  const int32_t otail = NewRule();
  Alt(otail, {Byte('}')});
  Alt(otail, {Byte(','), str, Byte(':'), any_, otail});
  const int32_t atail = NewRule();
  Alt(atail, {Byte(']')});
  Alt(atail, {Byte(','), any_, atail});
  Alt(any_, {Byte('{'), Byte('}')});
  Alt(any_, {Byte('{'), str, Byte(':'), any_, otail});
  Alt(any_, {Byte('['), Byte(']')});
  Alt(any_, {Byte('['), any_, atail});
  Alt(any_, {str});
  auto num = CompileNumber(false, ojson::object(), "");
  Alt(any_, {*num});
  Alt(any_, {Bool()});
  Alt(any_, {Null()});
  return any_;
}

Result<int64_t> SchemaBuilder::Count(const ojson& s, const char* key, const std::string& path,
                                     int64_t cap) {
  auto it = s.find(key);
  if (it == s.end()) return int64_t(-1);
  if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0))
    return Errorf("{}: must be a non-negative integer", At(path, key));
  const auto v = it->get<uint64_t>();
  if (v > uint64_t(cap))
    return Errorf("{}: {} is above the {} that lumen enforces", At(path, key), v, cap);
  return static_cast<int64_t>(v);
}

Result<int32_t> SchemaBuilder::Compile(const ojson& s, const std::string& path) {
  // Nesting is bounded (the compiler recurses), and so is the grammar.
  if (depth_ >= 64)
    return Errorf("{}: the schema nests deeper than 64 levels", path.empty() ? "schema" : path);
  if (too_large_) return Error("schema: too large to enforce");
  ++depth_;
  auto r = CompileNode(s, path);
  --depth_;
  return r;
}

Result<int32_t> SchemaBuilder::CompileNode(const ojson& s, const std::string& path) {
  if (s.is_boolean()) {
    if (s.get<bool>()) return AnyValue();
    return Errorf("{}: the schema false admits no value", path.empty() ? "schema" : path);
  }
  if (!s.is_object())
    return Errorf("{}: a schema must be an object or a boolean, got {}",
                  path.empty() ? "schema" : path, s.type_name());
  for (const auto& [k, v] : s.items())
    if (!Known(k))
      return Errorf("{}: keyword '{}' is not supported (lumen enforces {})", At(path, k), k,
                    kSupported);
  if (auto ref = s.find("$ref"); ref != s.end()) {
    if (!ref->is_string()) return Errorf("{}: must be a string", At(path, "$ref"));
    return CompileRef(ref->get<std::string>(), At(path, "$ref"));
  }
  if (auto any = s.find("anyOf"); any != s.end()) {
    const std::string at = At(path, "anyOf");
    if (!any->is_array() || any->empty()) return Errorf("{}: must be a non-empty array", at);
    for (const char* k : {"type", "enum", "const", "properties", "items"})
      if (s.contains(k))
        return Errorf("{}: '{}' beside anyOf is not supported (move it into each branch)",
                      At(path, k), k);
    std::vector<Seq> alts;
    for (size_t i = 0; i < any->size(); ++i) {
      auto r = Compile((*any)[i], fmt::format("{}[{}]", at, i));
      if (!r.ok()) return r.status();
      alts.push_back({*r});
    }
    return Union(alts);
  }
  // The allowed types.
  std::vector<std::string> types;
  if (auto t = s.find("type"); t != s.end()) {
    const std::string at = At(path, "type");
    std::vector<ojson> names;
    if (t->is_string())
      names = {*t};
    else if (t->is_array() && !t->empty())
      names.assign(t->begin(), t->end());
    else
      return Errorf("{}: must be a type name or a non-empty array of them", at);
    for (const auto& n : names) {
      if (!n.is_string() || !kTypes.count(n.get<std::string>()))
        return Errorf("{}: unknown type {} (string, integer, number, boolean, null, object, array)",
                      at, n.dump());
      types.push_back(n.get<std::string>());
    }
  }
  const auto typed = [&](const ojson& v) {
    if (types.empty()) return true;
    for (const auto& t : types)
      if (HasType(v, t)) return true;
    return false;
  };
  if (auto c = s.find("const"); c != s.end()) {
    if (!typed(*c))
      return Errorf("{}: {} does not have the schema's type", At(path, "const"), c->dump());
    return One(Lit(c->dump()));
  }
  if (auto e = s.find("enum"); e != s.end()) {
    const std::string at = At(path, "enum");
    if (!e->is_array() || e->empty()) return Errorf("{}: must be a non-empty array", at);
    std::vector<Seq> alts;
    std::set<std::string> seen;
    for (const auto& v : *e)
      if (typed(v) && seen.insert(v.dump()).second) alts.push_back(Lit(v.dump()));
    if (alts.empty()) return Errorf("{}: no value has the schema's type", at);
    return Union(alts);
  }
  if (types.empty()) {
    // Untyped: the keywords say which type is meant; none: any value.
    if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties"))
      types = {"object"};
    else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems"))
      types = {"array"};
    else if (s.contains("minLength") || s.contains("maxLength"))
      types = {"string"};
    else if (s.contains("minimum") || s.contains("maximum"))
      types = {"number"};
    else
      return AnyValue();
  }
  std::vector<Seq> alts;
  for (const auto& t : types) {
    auto r = CompileType(t, s, path);
    if (!r.ok()) return r.status();
    alts.push_back({*r});
  }
  if (alts.size() == 1) return alts[0][0];
  return Union(alts);
}

Result<int32_t> SchemaBuilder::CompileRef(const std::string& ref, const std::string& path) {
  if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
  if (ref.empty() || ref[0] != '#')
    return Errorf("{}: '{}' is not supported (only references inside the schema, \"#/...\")", path,
                  ref);
  const ojson* target = &root_;
  if (ref.size() > 1) {
    ojson::json_pointer ptr;
    try {
      ptr = ojson::json_pointer(ref.substr(1));
    } catch (const std::exception&) {
      return Errorf("{}: '{}' is not a valid JSON pointer", path, ref);
    }
    if (!root_.contains(ptr)) return Errorf("{}: '{}' does not resolve in the schema", path, ref);
    target = &root_.at(ptr);
  }
  // The rule exists before its body, so a recursive reference finds it.
  const int32_t r = NewRule();
  refs_[ref] = r;
  std::string where = ref.size() > 1 ? ref.substr(2) : std::string();
  std::replace(where.begin(), where.end(), '/', '.');
  auto body = Compile(*target, where);
  if (!body.ok()) return body.status();
  Alt(r, {*body});
  return r;
}

Result<int32_t> SchemaBuilder::CompileType(const std::string& type, const ojson& s,
                                           const std::string& path) {
  if (type == "string") return CompileString(s, path);
  if (type == "integer") return CompileNumber(true, s, path);
  if (type == "number") return CompileNumber(false, s, path);
  if (type == "boolean") return Bool();
  if (type == "null") return Null();
  if (type == "object") return CompileObject(s, path);
  return CompileArray(s, path);
}

Result<int32_t> SchemaBuilder::CompileString(const ojson& s, const std::string& path) {
  auto lo = Count(s, "minLength", path, 4096);
  if (!lo.ok()) return lo.status();
  auto hi = Count(s, "maxLength", path, 4096);
  if (!hi.ok()) return hi.status();
  if (*lo <= 0 && *hi < 0) return FreeString();
  const int64_t min = std::max<int64_t>(*lo, 0), max = *hi;
  if (max >= 0 && max < min)
    return Errorf("{}: maxLength {} is below minLength {}", At(path, "maxLength"), max, min);
  // rest[k]: the string after k characters.
  const int32_t ch = Char();
  const int64_t n = max >= 0 ? max : min;
  std::vector<int32_t> rest(size_t(n) + 1);
  for (auto& r : rest) r = NewRule();
  for (int64_t k = 0; k <= n; ++k) {
    const int32_t r = rest[size_t(k)];
    if (k >= min) Alt(r, {Byte('"')});
    if (k < n) Alt(r, {ch, rest[size_t(k) + 1]});
    if (max < 0 && k == n) Alt(r, {ch, r});  // unbounded above: loop at minLength
  }
  return One({Byte('"'), rest[0]});
}

Result<int32_t> SchemaBuilder::CompileNumber(bool integer, const ojson& s,
                                             const std::string& path) {
  const auto bound = [&](const char* key, double* out) -> Status {
    auto it = s.find(key);
    if (it == s.end()) return Status::Ok();
    if (!it->is_number()) return Errorf("{}: must be a number", At(path, key));
    *out = it->get<double>();
    return Status::Ok();
  };
  double lo = -INFINITY, hi = INFINITY;
  LUMEN_RETURN_IF_ERROR(bound("minimum", &lo));
  LUMEN_RETURN_IF_ERROR(bound("maximum", &hi));
  if (lo > 0)
    return Errorf("{}: a minimum above 0 ({}) is not supported (ranges must hold 0)",
                  At(path, "minimum"), lo);
  if (hi < 0)
    return Errorf("{}: a maximum below 0 ({}) is not supported (ranges must hold 0)",
                  At(path, "maximum"), hi);
  int32_t& cached = integer ? integer_ : number_;
  const bool bounded = std::isfinite(lo) || std::isfinite(hi);
  if (!bounded && cached >= 0) return cached;

  // fraction: '.' digit+ ; exponent: [eE] [+-]? digit{1,2} (unbounded only)
  const int32_t frac = NewRule();
  Alt(frac, {});
  if (!integer) Alt(frac, {Byte('.'), Range('0', '9'), Digits(SIZE_MAX)});
  const int32_t expo = NewRule();
  Alt(expo, {});
  if (!integer && !bounded) {
    const int32_t sign = Union({Seq{}, Seq{Byte('+')}, Seq{Byte('-')}});
    Alt(expo, {Class(Bytes("eE")), sign, Range('0', '9'), Digits(1)});
  }
  const int32_t r = NewRule();
  // Zero, with a fraction when 0.x stays within the maximum.
  if (!integer && (!std::isfinite(hi) || hi >= 1))
    Alt(r, {Byte('0'), frac, expo});
  else
    Alt(r, {Byte('0'), expo});
  // Each side of zero: the magnitudes in (0, limit] that a digit count
  // guarantees (integers of D digits are <= 10^D - 1; numbers with D integer
  // digits are < 10^D).
  for (const bool negative : {false, true}) {
    const double limit = negative ? -lo : hi;
    const Seq sign = negative ? Seq{Byte('-')} : Seq{};
    const auto add = [&](Seq tail) {
      Seq alt = sign;
      Append(alt, tail);
      alt.push_back(expo);
      Alt(r, alt);
    };
    if (!std::isfinite(limit)) {
      add({Range('1', '9'), Digits(kMaxIntDigits - 1), frac});
      if (negative && !integer) add({Byte('0'), Byte('.'), Range('0', '9'), Digits(SIZE_MAX)});
      continue;
    }
    const double m = std::floor(std::min(limit, 1e18));
    if (m < 1) continue;
    if (integer) {
      const int d = DigitCount(static_cast<uint64_t>(m) + 1) - 1;
      if (d == 0)
        add({Range('1', static_cast<uint8_t>('0' + int(m)))});
      else
        add({Range('1', '9'), Digits(size_t(d - 1))});
      continue;
    }
    const int d = DigitCount(static_cast<uint64_t>(m)) - 1;  // 10^d <= limit
    if (d >= 1) add({Range('1', '9'), Digits(size_t(d - 1)), frac});
    if (negative) add({Byte('0'), Byte('.'), Range('0', '9'), Digits(SIZE_MAX)});
  }
  if (!bounded) cached = r;
  return r;
}

Result<int32_t> SchemaBuilder::CompileObject(const ojson& s, const std::string& path) {
  struct Prop {
    std::string name;
    int32_t value;
    bool required;
  };
  std::vector<Prop> props;
  std::set<std::string> required;
  if (auto req = s.find("required"); req != s.end()) {
    const std::string at = At(path, "required");
    if (!req->is_array()) return Errorf("{}: must be an array of names", at);
    for (const auto& n : *req) {
      if (!n.is_string()) return Errorf("{}: must be an array of names, got {}", at, n.dump());
      required.insert(n.get<std::string>());
    }
  }
  bool extra_allowed = true;
  const ojson* extra_schema = nullptr;
  if (auto ap = s.find("additionalProperties"); ap != s.end()) {
    if (ap->is_boolean())
      extra_allowed = ap->get<bool>();
    else if (ap->is_object())
      extra_schema = &*ap;
    else
      return Errorf("{}: must be a boolean or a schema", At(path, "additionalProperties"));
  }
  std::set<std::string> declared;
  if (auto ps = s.find("properties"); ps != s.end()) {
    const std::string at = At(path, "properties");
    if (!ps->is_object()) return Errorf("{}: must be an object", at);
    for (const auto& [name, sub] : ps->items()) {
      auto v = Compile(sub, At(at, name));
      if (!v.ok()) return v.status();
      props.push_back({name, *v, required.count(name) > 0});
      declared.insert(name);
    }
  }
  // Required names without a property schema take any value (if extra keys
  // may appear at all).
  if (auto req = s.find("required"); req != s.end()) {
    for (const auto& n : *req) {
      const std::string name = n.get<std::string>();
      if (declared.count(name)) continue;
      if (!extra_allowed)
        return Errorf(
            "{}: '{}' is required but not among properties, and additionalProperties "
            "is false",
            At(path, "required"), name);
      int32_t v = AnyValue();
      if (extra_schema) {
        auto c = Compile(*extra_schema, At(path, "additionalProperties"));
        if (!c.ok()) return c.status();
        v = *c;
      }
      props.push_back({name, v, true});
      declared.insert(name);
    }
  }
  const int32_t obj = NewRule();
  if (props.empty() && extra_schema) {
    // A map: any keys, values of the schema.
    auto v = Compile(*extra_schema, At(path, "additionalProperties"));
    if (!v.ok()) return v.status();
    const int32_t str = FreeString();
    const int32_t tail = NewRule();
    Alt(tail, {Byte('}')});
    Alt(tail, {Byte(','), str, Byte(':'), *v, tail});
    Alt(obj, {Byte('{'), Byte('}')});
    Alt(obj, {Byte('{'), str, Byte(':'), *v, tail});
    return obj;
  }
  // after[i][e]: the object from property i on; e: something was written
  // (so the next property needs a comma). Only the reachable ones are built.
  const size_t n = props.size();
  std::vector<std::array<int32_t, 2>> after(n + 1, {-1, -1});
  for (size_t i = n + 1; i-- > 0;) {
    for (int e = 0; e < 2; ++e) {
      const int32_t r = NewRule();
      after[i][size_t(e)] = r;
      if (i == n) {
        Alt(r, {Byte('}')});
        continue;
      }
      const std::string key = nlohmann::json(props[i].name).dump() + ":";
      Seq take = e ? Lit("," + key) : Lit(key);
      take.push_back(props[i].value);
      take.push_back(after[i + 1][1]);
      Alt(r, take);
      if (!props[i].required) Alt(r, {after[i + 1][size_t(e)]});
    }
  }
  Alt(obj, {Byte('{'), after[0][0]});
  return obj;
}

Result<int32_t> SchemaBuilder::CompileArray(const ojson& s, const std::string& path) {
  int32_t item;
  if (auto it = s.find("items"); it != s.end()) {
    if (it->is_array())
      return Errorf("{}: a list of item schemas (a tuple) is not supported", At(path, "items"));
    auto r = Compile(*it, At(path, "items"));
    if (!r.ok()) return r.status();
    item = *r;
  } else {
    item = AnyValue();
  }
  auto lo = Count(s, "minItems", path, 256);
  if (!lo.ok()) return lo.status();
  auto hi = Count(s, "maxItems", path, 256);
  if (!hi.ok()) return hi.status();
  const int64_t min = std::max<int64_t>(*lo, 0), max = *hi;
  if (max >= 0 && max < min)
    return Errorf("{}: maxItems {} is below minItems {}", At(path, "maxItems"), max, min);
  // tail[k]: after k >= 1 items.
  const int64_t n = max >= 0 ? max : std::max<int64_t>(min, 1);
  std::vector<int32_t> tail(size_t(n) + 1, -1);
  for (int64_t k = 1; k <= n; ++k) tail[size_t(k)] = NewRule();
  for (int64_t k = 1; k <= n; ++k) {
    const int32_t r = tail[size_t(k)];
    if (k >= min) Alt(r, {Byte(']')});
    if (k < n) Alt(r, {Byte(','), item, tail[size_t(k) + 1]});
    if (max < 0 && k == n) Alt(r, {Byte(','), item, r});
  }
  const int32_t arr = NewRule();
  if (min == 0) Alt(arr, {Byte('['), Byte(']')});
  if (n >= 1) Alt(arr, {Byte('['), item, tail[1]});
  return arr;
}

Result<std::shared_ptr<const SchemaGrammar>> SchemaBuilder::Build() {
  if (root_.is_object()) {
    const auto numeric = [](const ojson& t) {
      return t.is_string() && (t == "number" || t == "integer");
    };
    auto t = root_.find("type");
    bool bare_number =
        t != root_.end() &&
        (numeric(*t) || (t->is_array() && std::any_of(t->begin(), t->end(), numeric)));
    if (bare_number)
      return Error(
          "type: a number at the top level is not supported (its end cannot be told); wrap it in "
          "an object");
  }
  auto r = Compile(root_, "");
  if (!r.ok()) return r.status();
  g_->root_ = *r;
  if (too_large_) return Error("schema: too large to enforce");
  if (g_->Start().empty()) return Error("schema: admits no value");
  return std::shared_ptr<const SchemaGrammar>(g_);
}

Result<std::shared_ptr<const SchemaGrammar>> CompileJsonSchema(const ojson& schema) {
  SchemaBuilder b(schema);
  return b.Build();
}

}  // namespace lumen::engine
