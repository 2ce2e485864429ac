#include "lumen/tokenize/chat_template/lexer.h"

#include <algorithm>
#include <cstdlib>

#include "lumen/tokenize/chat_template/pystr.h"

namespace lumen::tokenize {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  explicit Lexer(std::string_view raw) {
    // Jinja splits on \r\n, \r, \n, joins with \n and drops one trailing newline.
    src_.reserve(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '\r') {
        if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
        src_.push_back('\n');
      } else {
        src_.push_back(raw[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  Result<std::vector<Token>> Run() {
    size_t pos = 0;
    bool line_starting = true;
    const size_t n = src_.size();
    while (pos < n) {
      size_t t = FindTagStart(pos);
      if (t == std::string::npos) {
        Emit(TokenType::kData, src_.substr(pos), pos);
        break;
      }
      char kind = src_[t + 1];
      size_t after = t + 2;
      char sign = 0;
      if (after < n && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      size_t raw_end = kind == '%' ? MatchRawBegin(after) : std::string::npos;
      std::string text = src_.substr(pos, t - pos);
      ApplyStrip(text, sign, kind != '{', line_starting);
      if (!text.empty()) Emit(TokenType::kData, std::move(text), pos);
      if (raw_end != std::string::npos) {
        line_starting = src_[raw_end - 1] == '\n';
        LUMEN_ASSIGN_OR_RETURN(pos, LexRaw(raw_end, t, line_starting));
        line_starting = src_[pos - 1] == '\n';
        continue;
      }
      line_starting = false;
      if (kind == '#') {
        LUMEN_ASSIGN_OR_RETURN(pos, SkipComment(after, t));
        line_starting = src_[pos - 1] == '\n';
        continue;
      }
      Emit(kind == '%' ? TokenType::kBlockBegin : TokenType::kVarBegin, "", t);
      LUMEN_ASSIGN_OR_RETURN(pos, LexTag(after, kind == '%', line_starting));
    }
    Emit(TokenType::kEof, "", n);
    return std::move(tokens_);
  }

 private:
  void Position(size_t offset, int& line, int& col) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t idx = static_cast<size_t>(it - line_starts_.begin()) - 1;
    line = static_cast<int>(idx + 1);
    col = static_cast<int>(offset - line_starts_[idx] + 1);
  }

  Status ErrorAt(size_t offset, std::string_view what) const {
    int line, col;
    Position(offset, line, col);
    return Errorf("template syntax error at {}:{}: {}", line, col, what);
  }

  Token& Emit(TokenType type, std::string text, size_t offset) {
    Token tok;
    tok.type = type;
    tok.text = std::move(text);
    Position(offset, tok.line, tok.column);
    tokens_.push_back(std::move(tok));
    return tokens_.back();
  }

  size_t FindTagStart(size_t pos) const {
    while (true) {
      size_t t = src_.find('{', pos);
      if (t == std::string::npos || t + 1 >= src_.size()) return std::string::npos;
      char c = src_[t + 1];
      if (c == '%' || c == '{' || c == '#') return t;
      pos = t + 1;
    }
  }

  // Length in bytes of the Unicode whitespace run starting at pos.
  size_t SpaceRun(size_t pos) const {
    size_t i = pos;
    while (i < src_.size()) {
      size_t j = i;
      char32_t c = NextCodePoint(j);
      if (!pystr::IsSpace(c)) break;
      i = j;
    }
    return i - pos;
  }

  char32_t NextCodePoint(size_t& i) const {
    size_t len = 1;
    unsigned char c = static_cast<unsigned char>(src_[i]);
    if (c >= 0xF0)
      len = 4;
    else if (c >= 0xE0)
      len = 3;
    else if (c >= 0xC0)
      len = 2;
    len = std::min(len, src_.size() - i);
    std::u32string u = pystr::Decode(std::string_view(src_).substr(i, len));
    // Decode may split an invalid sequence; consume exactly the first code point.
    std::string first;
    pystr::AppendUtf8(first, u.empty() ? 0 : u[0]);
    i += std::max<size_t>(1, std::min(first.size(), len));
    return u.empty() ? 0 : u[0];
  }

  // `{%[-+]? raw \s* (-%}\s* | %})`: returns the end of the match or npos.
  size_t MatchRawBegin(size_t after) const {
    size_t i = after + SpaceRun(after);
    if (src_.compare(i, 3, "raw") != 0) return std::string::npos;
    i += 3;
    i += SpaceRun(i);
    if (src_.compare(i, 3, "-%}") == 0) return i + 3 + SpaceRun(i + 3);
    if (src_.compare(i, 2, "%}") == 0) return i + 2;
    return std::string::npos;
  }

  void ApplyStrip(std::string& text, char sign, bool lstrip_allowed, bool line_starting) const {
    if (sign == '-') {
      text = pystr::Strip(text, std::nullopt, false, true);
    } else if (sign != '+' && lstrip_allowed) {
      size_t l_pos = text.rfind('\n');
      l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
      if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
        std::string tail = text.substr(l_pos);
        if (pystr::Strip(tail, std::nullopt, true, true).empty()) text.resize(l_pos);
      }
    }
  }

  // Matches the end of a block-like tag at i: `+%}`, `-%}\s*`, `%}\n?`.
  size_t MatchBlockEnd(size_t i, char close) const {
    std::string end = std::string(1, close) + "}";
    if ((src_[i] == '+' || src_[i] == '-') && src_.compare(i + 1, 2, end) == 0) {
      if (src_[i] == '+') return i + 3;
      return i + 3 + SpaceRun(i + 3);
    }
    if (src_.compare(i, 2, end) == 0) {
      size_t e = i + 2;
      if (e < src_.size() && src_[e] == '\n') ++e;  // trim_blocks
      return e;
    }
    return std::string::npos;
  }

  Result<size_t> SkipComment(size_t pos, size_t start) const {
    for (size_t i = pos; i + 1 < src_.size(); ++i) {
      size_t e = MatchBlockEnd(i, '#');
      if (e != std::string::npos) return e;
    }
    return ErrorAt(start, "missing end of comment tag '#}'");
  }

  Result<size_t> LexRaw(size_t pos, size_t start, bool line_starting) {
    for (size_t i = pos; i + 1 < src_.size(); ++i) {
      if (src_[i] != '{' || src_[i + 1] != '%') continue;
      size_t j = i + 2;
      char sign = 0;
      if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) sign = src_[j++];
      j += SpaceRun(j);
      if (src_.compare(j, 6, "endraw") != 0) continue;
      j += 6;
      j += SpaceRun(j);
      size_t e = MatchBlockEnd(j, '%');
      if (e == std::string::npos) continue;
      std::string text = src_.substr(pos, i - pos);
      ApplyStrip(text, sign, true, line_starting);
      if (!text.empty()) Emit(TokenType::kData, std::move(text), pos);
      return e;
    }
    return ErrorAt(start, "missing end of raw directive '{% endraw %}'");
  }

  // `(\d+_)*\d+` at i: end offset or npos.
  size_t Digits(size_t i) const {
    if (i >= src_.size() || !IsDigit(src_[i])) return std::string::npos;
    while (true) {
      while (i < src_.size() && IsDigit(src_[i])) ++i;
      if (i + 1 < src_.size() && src_[i] == '_' && IsDigit(src_[i + 1])) {
        ++i;
        continue;
      }
      return i;
    }
  }

  size_t MatchFloat(size_t i) const {
    if (i > 0 && src_[i - 1] == '.') return std::string::npos;
    size_t p = Digits(i);
    if (p == std::string::npos) return p;
    auto exp_at = [&](size_t q) -> size_t {
      if (q >= src_.size() || (src_[q] != 'e' && src_[q] != 'E')) return std::string::npos;
      ++q;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      return Digits(q);
    };
    size_t f = (p < src_.size() && src_[p] == '.') ? Digits(p + 1) : std::string::npos;
    if (f != std::string::npos) {
      size_t e = exp_at(f);
      if (e != std::string::npos) return e;
    }
    size_t e = exp_at(p);
    if (e != std::string::npos) return e;
    return f;
  }

  size_t MatchInt(size_t i, int& base) const {
    auto lower = [&](size_t k) {
      return k < src_.size() ? static_cast<char>(std::tolower(static_cast<unsigned char>(src_[k])))
                             : '\0';
    };
    auto valid = [&](char c, int b) {
      if (b == 2) return c == '0' || c == '1';
      if (b == 8) return c >= '0' && c <= '7';
      if (b == 16) return IsDigit(c) || (c >= 'a' && c <= 'f');
      return IsDigit(c);
    };
    if (src_[i] == '0' && (lower(i + 1) == 'b' || lower(i + 1) == 'o' || lower(i + 1) == 'x')) {
      base = lower(i + 1) == 'b' ? 2 : (lower(i + 1) == 'o' ? 8 : 16);
      size_t k = i + 2, end = std::string::npos;
      while (true) {
        size_t m = k;
        if (lower(m) == '_') ++m;
        if (!valid(lower(m), base)) break;
        k = m + 1;
        end = k;
      }
      if (end != std::string::npos) return end;
    }
    base = 10;
    if (!IsDigit(src_[i])) return std::string::npos;
    bool zero = src_[i] == '0';
    size_t k = i + 1;
    while (true) {
      size_t m = k;
      if (lower(m) == '_') ++m;
      char c = lower(m);
      if (!(zero ? c == '0' : IsDigit(c))) break;
      k = m + 1;
    }
    return k;
  }

  Result<std::string> Unescape(std::string_view body, size_t offset) const {
    std::string out;
    size_t i = 0;
    auto hex = [&](size_t start, int count, uint32_t& v) {
      if (start + count > body.size()) return false;
      v = 0;
      for (int k = 0; k < count; ++k) {
        char c = static_cast<char>(std::tolower(static_cast<unsigned char>(body[start + k])));
        int d = IsDigit(c) ? c - '0' : (c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1);
        if (d < 0) return false;
        v = v * 16 + d;
      }
      return true;
    };
    while (i < body.size()) {
      char c = body[i];
      if (c != '\\' || i + 1 >= body.size()) {
        out.push_back(c);
        ++i;
        continue;
      }
      char e = body[i + 1];
      i += 2;
      switch (e) {
        case '\n':
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
        case 'u':
        case 'U': {
          int count = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
          uint32_t v;
          if (!hex(i, count, v))
            return ErrorAt(offset, fmt::format("truncated \\{} escape in string literal", e));
          if (v > 0x10FFFF) return ErrorAt(offset, "illegal Unicode character in string literal");
          pystr::AppendUtf8(out, v);
          i += count;
          break;
        }
        case 'N':
          return ErrorAt(offset, "unsupported construct: \\N{...} escape in string literal");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = e - '0';
            for (int k = 0; k < 2 && i < body.size() && body[i] >= '0' && body[i] <= '7'; ++k)
              v = v * 8 + (body[i++] - '0');
            pystr::AppendUtf8(out, v);
          } else if (static_cast<unsigned char>(e) >= 0x80) {
            // Python backslash-replaces the non-ASCII char first, so "\é" becomes "\xe9".
            size_t j = i - 1;
            char32_t cp = NextCodePoint(j);
            char buf[16];
            if (cp < 0x100)
              std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp));
            else if (cp < 0x10000)
              std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
            else
              std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(cp));
            out += buf;
            i = j;
          } else {
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    return out;
  }

  // Lexes the inside of `{% ... %}` or `{{ ... }}`; returns the offset after the end tag.
  Result<size_t> LexTag(size_t pos, bool block, bool& line_starting) {
    std::vector<char> balance;
    const size_t n = src_.size();
    while (true) {
      if (pos >= n) return pos;  // the parser reports the missing end tag
      if (balance.empty()) {
        size_t e = std::string::npos;
        if (block) {
          e = MatchBlockEnd(pos, '%');
        } else if (src_[pos] == '-' && src_.compare(pos + 1, 2, "}}") == 0) {
          e = pos + 3 + SpaceRun(pos + 3);
        } else if (src_.compare(pos, 2, "}}") == 0) {
          e = pos + 2;
        }
        if (e != std::string::npos) {
          Emit(block ? TokenType::kBlockEnd : TokenType::kVarEnd, "", pos);
          line_starting = src_[e - 1] == '\n';
          return e;
        }
      }
      size_t sp = SpaceRun(pos);
      if (sp > 0) {
        pos += sp;
        continue;
      }
      char c = src_[pos];
      size_t f = MatchFloat(pos);
      if (f != std::string::npos) {
        std::string digits;
        for (size_t k = pos; k < f; ++k)
          if (src_[k] != '_') digits.push_back(src_[k]);
        Token& tok = Emit(TokenType::kFloat, digits, pos);
        tok.float_value = std::strtod(digits.c_str(), nullptr);
        pos = f;
        continue;
      }
      int base = 10;
      size_t ie = IsDigit(c) ? MatchInt(pos, base) : std::string::npos;
      if (ie != std::string::npos) {
        std::string digits;
        for (size_t k = pos + (base == 10 ? 0 : 2); k < ie; ++k)
          if (src_[k] != '_') digits.push_back(src_[k]);
        errno = 0;
        char* endp = nullptr;
        unsigned long long v = std::strtoull(digits.c_str(), &endp, base);
        if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX))
          return ErrorAt(pos, "integer literal too large");
        Token& tok = Emit(TokenType::kInt, src_.substr(pos, ie - pos), pos);
        tok.int_value = static_cast<int64_t>(v);
        pos = ie;
        continue;
      }
      unsigned char uc = static_cast<unsigned char>(c);
      if (std::isalpha(uc) || c == '_' || uc >= 0x80) {
        size_t k = pos;
        while (k < n) {
          unsigned char ch = static_cast<unsigned char>(src_[k]);
          if (std::isalnum(ch) || ch == '_') {
            ++k;
          } else if (ch >= 0x80) {
            size_t j = k;
            if (pystr::IsSpace(NextCodePoint(j))) break;
            k = j;
          } else {
            break;
          }
        }
        Emit(TokenType::kName, src_.substr(pos, k - pos), pos);
        pos = k;
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t k = pos + 1;
        while (k < n && src_[k] != c) k += src_[k] == '\\' ? 2 : 1;
        if (k >= n) return ErrorAt(pos, "unterminated string literal");
        LUMEN_ASSIGN_OR_RETURN(std::string s,
                               Unescape(std::string_view(src_).substr(pos + 1, k - pos - 1), pos));
        Emit(TokenType::kString, std::move(s), pos);
        pos = k + 1;
        continue;
      }
      static const char* kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
      std::string op;
      for (const char* two : kTwo)
        if (src_.compare(pos, 2, two) == 0) op = two;
      if (op.empty() && std::string_view("+-/*%~[](){}><=.:|,;").find(c) != std::string::npos)
        op = std::string(1, c);
      if (op.empty()) return ErrorAt(pos, fmt::format("unexpected char '{}'", c));
      if (op == "(" || op == "[" || op == "{") {
        balance.push_back(op == "(" ? ')' : (op == "[" ? ']' : '}'));
      } else if (op == ")" || op == "]" || op == "}") {
        if (balance.empty()) return ErrorAt(pos, fmt::format("unexpected '{}'", op));
        if (balance.back() != op[0])
          return ErrorAt(pos, fmt::format("unexpected '{}', expected '{}'", op, balance.back()));
        balance.pop_back();
      }
      Emit(TokenType::kOperator, op, pos);
      pos += op.size();
    }
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

Result<std::vector<Token>> Lex(std::string_view source) { return Lexer(source).Run(); }

}  // namespace lumen::tokenize
