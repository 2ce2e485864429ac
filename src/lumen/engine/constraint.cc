#include "lumen/engine/constraint.h"
#include "lumen/core/route.h"

#include <algorithm>
#include <bit>
#include <limits>

namespace lumen::engine {

LUMEN_ROUTE(
    constraint_mask,
    {.node = "sample.constraint",
     .name = "grammar-mask",
     .tier = Tier::kL1,
     .oracle = "nlohmann::json's parser and each tool-call format's parser",
     .bound = "exactly the tokens the grammar allows",
     .tests = "JsonAcceptor.AgreesWithNlohmannOnRandomTexts;GrammarConstraint.*;SchemaGrammar.*;"
              "ForcedToolCall.GrammarMatchesEachFormatsParser;SchedulerTest."
              "ConstrainedNeighbourDoesNotChangeOthers",
     .when = "constraint=on",
     .priority = 10});

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Whether `s` is whole, valid UTF-8 (no overlongs, surrogates or > U+10FFFF).
bool ValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    int left;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      left = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      left = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      left = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    ++i;
    for (int k = 0; k < left; ++k, ++i) {
      if (i >= s.size()) return false;
      const auto d = static_cast<uint8_t>(s[i]);
      if (d < lo || d > hi) return false;
      lo = 0x80, hi = 0xBF;
    }
  }
  return true;
}

bool IsWs(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool IsDigit(uint8_t c) { return c >= '0' && c <= '9'; }
int HexValue(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

constexpr std::string_view kLiterals[] = {"true", "false", "null"};

}  // namespace

// ---------------------------------------------------------------------------
// TokenTable

std::shared_ptr<const TokenTable> TokenTable::Build(const tokenize::Tokenizer& tok) {
  auto t = std::make_shared<TokenTable>();
  const int32_t V = tok.vocab_size();
  t->tok_ = &tok;
  t->offsets_.reserve(size_t(V) + 1);
  t->flags_.resize(size_t(V));
  t->offsets_.push_back(0);
  for (int32_t id = 0; id < V; ++id) {
    t->bytes_ += tok.TokenBytes(id);
    t->offsets_.push_back(static_cast<uint32_t>(t->bytes_.size()));
    if (tok.IsSpecial(id) || tok.IsEog(id)) t->flags_[size_t(id)] |= kSpecial;
  }
  t->Index();
  return t;
}

std::shared_ptr<const TokenTable> TokenTable::FromStrings(const std::vector<std::string>& texts,
                                                          const std::vector<bool>& special) {
  auto t = std::make_shared<TokenTable>();
  t->offsets_.push_back(0);
  t->flags_.resize(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    t->bytes_ += texts[i];
    t->offsets_.push_back(static_cast<uint32_t>(t->bytes_.size()));
    if (i < special.size() && special[i]) t->flags_[i] |= kSpecial;
  }
  t->Index();
  return t;
}

void TokenTable::Index() {
  for (int32_t id = 0; id < size(); ++id) {
    const std::string_view s = text(id);
    max_len_ = std::max(max_len_, s.size());
    if (special(id) || s.empty()) continue;
    by_text_.emplace(s, id);
    bool plain = ValidUtf8(s);
    for (char ch : s) {
      const auto c = static_cast<uint8_t>(ch);
      if (c < 0x20 || c == '"' || c == '\\') plain = false;
    }
    if (plain) flags_[size_t(id)] |= kPlainString;
  }
}

std::optional<std::vector<int32_t>> TokenTable::EncodeExact(std::string_view text) const {
  if (tok_) {
    std::vector<int32_t> ids = tok_->Encode(text, /*add_special=*/false, /*parse_special=*/true);
    std::string got;
    for (int32_t id : ids)
      if (id >= 0 && id < size()) got += this->text(id);
    if (got == text) return ids;
  }
  // Fewest tokens that spell the text exactly (greedy longest match can
  // paint itself into a corner: "get_w" + "eather" when only "weather" exists).
  const size_t n = text.size();
  constexpr int kUnreached = std::numeric_limits<int>::max();
  std::vector<int> cost(n + 1, kUnreached);
  std::vector<int32_t> last(n + 1, -1);
  cost[0] = 0;
  for (size_t pos = 0; pos < n; ++pos) {
    if (cost[pos] == kUnreached) continue;
    for (size_t len = 1; len <= std::min(max_len_, n - pos); ++len) {
      auto it = by_text_.find(text.substr(pos, len));
      if (it == by_text_.end() || cost[pos] + 1 >= cost[pos + len]) continue;
      cost[pos + len] = cost[pos] + 1;
      last[pos + len] = it->second;
    }
  }
  if (cost[n] == kUnreached) return std::nullopt;
  std::vector<int32_t> out(static_cast<size_t>(cost[n]));
  for (size_t pos = n, k = out.size(); pos > 0; pos -= this->text(last[pos]).size())
    out[--k] = last[pos];
  return out;
}

// ---------------------------------------------------------------------------
// JsonAcceptor

bool JsonAcceptor::Whitespace(uint8_t) { return ++ws_run_ <= kMaxWhitespaceRun; }

bool JsonAcceptor::Open(bool object) {
  if (depth_ >= kMaxDepth) return false;
  const uint64_t bit = uint64_t(1) << depth_;
  stack_ = object ? (stack_ | bit) : (stack_ & ~bit);
  ++depth_;
  mode_ = object ? kObjKeyOrEnd : kArrValueOrEnd;
  return true;
}

bool JsonAcceptor::Close(bool object) {
  if (depth_ == 0 || in_object() != object) return false;
  --depth_;
  mode_ = depth_ == 0 ? kDone : kAfterValue;
  return true;
}

bool JsonAcceptor::EndValue() {
  mode_ = kAfterValue;
  return true;
}

bool JsonAcceptor::Value(uint8_t c) {
  switch (c) {
    case '{':
      return Open(true);
    case '[':
      return Open(false);
    case '"':
      mode_ = kString;
      key_ = false;
      return true;
    case '-':
      mode_ = kNumMinus;
      return true;
    case '0':
      mode_ = kNumZero;
      return true;
    case 't':
    case 'f':
    case 'n':
      mode_ = kLiteral;
      lit_ = c == 't' ? 0 : c == 'f' ? 1 : 2;
      lit_pos_ = 1;
      return true;
    default:
      if (c >= '1' && c <= '9') {
        mode_ = kNumInt;
        return true;
      }
      return false;
  }
}

bool JsonAcceptor::StringByte(uint8_t c) {
  if (utf8_left_ > 0) {
    if (c < utf8_lo_ || c > utf8_hi_) return false;
    --utf8_left_;
    utf8_lo_ = 0x80, utf8_hi_ = 0xBF;
    return true;
  }
  if (c == '"') {
    if (key_) {
      key_ = false;
      mode_ = kColon;
      return true;
    }
    return EndValue();
  }
  if (c == '\\') {
    mode_ = kEscape;
    return true;
  }
  if (c < 0x20) return false;
  if (c < 0x80) return true;
  if (c >= 0xC2 && c <= 0xDF) {
    utf8_left_ = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    utf8_left_ = 2;
    if (c == 0xE0) utf8_lo_ = 0xA0;
    if (c == 0xED) utf8_hi_ = 0x9F;  // no UTF-16 surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    utf8_left_ = 3;
    if (c == 0xF0) utf8_lo_ = 0x90;
    if (c == 0xF4) utf8_hi_ = 0x8F;  // <= U+10FFFF
  } else {
    return false;
  }
  return true;
}

bool JsonAcceptor::Feed(uint8_t c) {
  const bool ws = IsWs(c);
  switch (mode_) {
    case kString:
      return StringByte(c);
    case kEscape:
      if (c == 'u') {
        mode_ = kUnicode;
        hex_ = 0;
        code_ = 0;
        return true;
      }
      if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' &&
          c != 't')
        return false;
      mode_ = kString;
      return true;
    case kUnicode: {
      const int v = HexValue(c);
      if (v < 0) return false;
      code_ = static_cast<uint16_t>(code_ * 16 + v);
      ++hex_;
      // Decide surrogate validity as early as the digits allow, so a prefix
      // that can only end in a lone surrogate is refused.
      if (hex_ == 1 && want_low_ && code_ != 0xD) return false;
      if (hex_ == 2) {
        const bool low = code_ >= 0xDC && code_ <= 0xDF;
        if (want_low_ != low) return false;
      }
      if (hex_ == 4) {
        const bool high = code_ >= 0xD800 && code_ <= 0xDBFF;
        want_low_ = high;
        mode_ = high ? kLowBackslash : kString;
      }
      return true;
    }
    case kLowBackslash:
      if (c != '\\') return false;
      mode_ = kLowU;
      return true;
    case kLowU:
      if (c != 'u') return false;
      mode_ = kUnicode;
      hex_ = 0;
      code_ = 0;
      return true;
    case kNumMinus:
      if (c == '0') {
        mode_ = kNumZero;
        return true;
      }
      if (c >= '1' && c <= '9') {
        mode_ = kNumInt;
        return true;
      }
      return false;
    case kNumZero:
    case kNumInt:
    case kNumFrac:
      if (IsDigit(c) && mode_ != kNumZero) return true;
      if (c == '.' && mode_ != kNumFrac) {
        mode_ = kNumDot;
        return true;
      }
      if (c == 'e' || c == 'E') {
        mode_ = kNumExp;
        return true;
      }
      EndValue();
      return Feed(c);  // the number ended; c belongs to what follows
    case kNumDot:
      if (!IsDigit(c)) return false;
      mode_ = kNumFrac;
      return true;
    case kNumExp:
      if (c == '+' || c == '-') {
        mode_ = kNumExpSign;
        return true;
      }
      [[fallthrough]];
    case kNumExpSign:
      if (!IsDigit(c)) return false;
      mode_ = kNumExpDigits;
      return true;
    case kNumExpDigits:
      if (IsDigit(c)) return true;
      EndValue();
      return Feed(c);
    case kLiteral: {
      const std::string_view lit = kLiterals[lit_];
      if (static_cast<uint8_t>(lit[lit_pos_]) != c) return false;
      if (++lit_pos_ == lit.size()) EndValue();
      return true;
    }
    case kDone:
      return false;
    default:
      break;
  }
  // Structural modes: whitespace is allowed between tokens.
  if (ws) return Whitespace(c);
  ws_run_ = 0;
  switch (mode_) {
    case kStart:
      return c == '{' && Open(true);
    case kObjKeyOrEnd:
      if (c == '}') return Close(true);
      [[fallthrough]];
    case kObjKey:
      if (c != '"') return false;
      mode_ = kString;
      key_ = true;
      return true;
    case kColon:
      if (c != ':') return false;
      mode_ = kValue;
      return true;
    case kArrValueOrEnd:
      if (c == ']') return Close(false);
      return Value(c);
    case kValue:
      return Value(c);
    case kAfterValue:
      if (c == ',') {
        mode_ = in_object() ? kObjKey : kValue;
        return true;
      }
      if (c == '}' || c == ']') return Close(c == '}');
      return false;
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------
// GrammarConstraint

GrammarConstraint::GrammarConstraint(std::shared_ptr<const TokenTable> t,
                                     std::vector<GrammarSegment> s)
    : table_(std::move(t)), segs_(std::move(s)) {
  Enter(state_);
}

Result<std::unique_ptr<GrammarConstraint>> GrammarConstraint::Create(
    std::shared_ptr<const TokenTable> table, std::vector<GrammarSegment> segments) {
  if (!table || table->size() == 0) return Error("constraint: empty vocabulary");
  for (size_t i = 0; i < segments.size(); ++i) {
    auto& g = segments[i];
    if (g.kind != GrammarSegment::kOneOf) continue;
    if (g.options.empty()) return Errorf("constraint: segment {} has no options", i);
    std::sort(g.options.begin(), g.options.end());
    for (size_t k = 0; k < g.options.size(); ++k) {
      if (g.options[k].empty()) return Errorf("constraint: segment {} has an empty option", i);
      // Sorted, so a prefix sits right before its extensions.
      if (k + 1 < g.options.size() && g.options[k + 1].starts_with(g.options[k]))
        return Errorf("constraint: option '{}' is a prefix of '{}'", g.options[k],
                      g.options[k + 1]);
    }
  }
  return std::unique_ptr<GrammarConstraint>(
      new GrammarConstraint(std::move(table), std::move(segments)));
}

void GrammarConstraint::Enter(State& st) const {
  for (; st.seg < segs_.size(); ++st.seg) {
    const GrammarSegment& g = segs_[st.seg];
    st.off = 0;
    if (g.kind == GrammarSegment::kLiteral && g.text.empty()) continue;
    if (g.kind == GrammarSegment::kOneOf) st.lo = 0, st.hi = uint32_t(g.options.size());
    if (g.kind == GrammarSegment::kJsonObject) st.json = JsonAcceptor();
    if (g.kind == GrammarSegment::kSchema) st.stacks = g.schema->Start();
    return;
  }
}

bool GrammarConstraint::Step(State& st, uint8_t c) const {
  if (st.seg >= segs_.size()) return false;
  const GrammarSegment& g = segs_[st.seg];
  switch (g.kind) {
    case GrammarSegment::kLiteral:
      if (static_cast<uint8_t>(g.text[st.off]) != c) return false;
      if (++st.off == g.text.size()) {
        ++st.seg;
        Enter(st);
      }
      return true;
    case GrammarSegment::kOneOf: {
      uint32_t lo = st.hi, hi = st.lo;
      for (uint32_t i = st.lo; i < st.hi; ++i) {
        const std::string& o = g.options[i];
        if (o.size() > st.off && static_cast<uint8_t>(o[st.off]) == c) {
          lo = std::min(lo, i);
          hi = i + 1;
        }
      }
      if (lo >= hi) return false;
      st.lo = lo, st.hi = hi;
      ++st.off;
      // Prefix-free options: a whole one is the only one left.
      if (hi - lo == 1 && g.options[lo].size() == st.off) {
        ++st.seg;
        Enter(st);
      }
      return true;
    }
    case GrammarSegment::kJsonObject:
      if (!st.json.Feed(c)) return false;
      if (st.json.complete()) {
        ++st.seg;
        Enter(st);
      }
      return true;
    case GrammarSegment::kSchema: {
      SchemaGrammar::Stacks next = g.schema->Advance(st.stacks, c);
      if (next.empty()) return false;
      st.stacks = std::move(next);
      if (SchemaGrammar::Accepted(st.stacks)) {
        st.stacks.clear();
        ++st.seg;
        Enter(st);
      }
      return true;
    }
  }
  return false;
}

bool GrammarConstraint::Walk(State& st, std::string_view bytes) const {
  for (char c : bytes)
    if (!Step(st, static_cast<uint8_t>(c))) return false;
  return true;
}

bool GrammarConstraint::Allows(std::string_view s) const {
  State st = state_;
  return Walk(st, s);
}

bool GrammarConstraint::Forced(std::vector<int32_t>* out, std::string* error) {
  out->clear();
  if (done()) return true;
  const GrammarSegment& g = segs_[state_.seg];
  std::string_view rest;
  if (g.kind == GrammarSegment::kLiteral)
    rest = std::string_view(g.text).substr(state_.off);
  else if (g.kind == GrammarSegment::kOneOf && state_.hi - state_.lo == 1)
    rest = std::string_view(g.options[state_.lo]).substr(state_.off);
  std::string schema_run;
  if (g.kind == GrammarSegment::kSchema) {
    // The bytes that are the only possible next one, one after another.
    SchemaGrammar::Stacks st = state_.stacks;
    while (!st.empty() && !SchemaGrammar::Accepted(st) && schema_run.size() < 256) {
      const SchemaGrammar::ByteSet b = g.schema->NextBytes(st);
      int count = 0, byte = -1;
      for (int w = 0; w < 4; ++w) {
        count += std::popcount(b[size_t(w)]);
        if (b[size_t(w)]) byte = w * 64 + std::countr_zero(b[size_t(w)]);
      }
      if (count != 1) break;
      schema_run += static_cast<char>(byte);
      st = g.schema->Advance(st, static_cast<uint8_t>(byte));
    }
    // Stop at a character boundary.
    while (!schema_run.empty() && (static_cast<uint8_t>(schema_run.back()) & 0xC0) == 0x80)
      schema_run.pop_back();
    if (!schema_run.empty() && static_cast<uint8_t>(schema_run.back()) >= 0xC0)
      schema_run.pop_back();
    rest = schema_run;
  }
  if (rest.empty()) return true;
  auto ids = table_->EncodeExact(rest);
  if (!ids) {
    *error = fmt::format("constraint: the vocabulary cannot spell '{}'", rest);
    return false;
  }
  *out = std::move(*ids);
  return true;
}

size_t GrammarConstraint::Mask(std::span<float> logits) const {
  const TokenTable& t = *table_;
  const int32_t V = std::min<int32_t>(t.size(), static_cast<int32_t>(logits.size()));
  for (size_t i = size_t(V); i < logits.size(); ++i) logits[i] = kNegInf;
  const GrammarSegment* seg = state_.seg < segs_.size() ? &segs_[state_.seg] : nullptr;
  const bool schema = seg && seg->kind == GrammarSegment::kSchema;
  bool in_string = seg && seg->kind == GrammarSegment::kJsonObject && state_.json.in_plain_string();
  SchemaGrammar::ByteSet first{};
  if (schema) {
    in_string = seg->schema->InFreeString(state_.stacks);
    first = seg->schema->NextBytes(state_.stacks);
  }
  size_t allowed = 0;
  for (int32_t id = 0; id < V; ++id) {
    if (t.special(id)) {
      logits[size_t(id)] = kNegInf;
      continue;
    }
    if (in_string && t.plain_string(id)) {
      ++allowed;
      continue;
    }
    const std::string_view s = t.text(id);
    if (schema && !s.empty()) {
      const auto c = static_cast<uint8_t>(s[0]);
      if (!((first[c >> 6] >> (c & 63)) & 1)) {
        logits[size_t(id)] = kNegInf;
        continue;
      }
    }
    State st = state_;
    if (s.empty() || !Walk(st, s)) {
      logits[size_t(id)] = kNegInf;
      continue;
    }
    ++allowed;
  }
  return allowed;
}

bool GrammarConstraint::Accept(int32_t id) {
  if (id < 0 || id >= table_->size()) return false;
  const std::string_view s = table_->text(id);
  State st = state_;
  if (s.empty() || !Walk(st, s)) return false;
  state_ = st;
  text_ += s;
  return true;
}

}  // namespace lumen::engine
