#include "lumen/tokenize/chat_template/pystr.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace lumen::tokenize::pystr {
namespace {

// Decodes one code point at s[i]; invalid bytes become U+DC80+byte.
char32_t DecodeOne(std::string_view s, size_t& i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  auto bad = [&]() {
    ++i;
    return static_cast<char32_t>(0xDC00 + c);
  };
  if (c < 0x80) {
    ++i;
    return c;
  }
  int n;
  char32_t cp;
  if ((c & 0xE0) == 0xC0) {
    n = 1;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 2;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 3;
    cp = c & 0x07;
  } else {
    return bad();
  }
  if (i + n >= s.size()) return bad();
  for (int k = 1; k <= n; ++k) {
    unsigned char cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return bad();
    cp = (cp << 6) | (cc & 0x3F);
  }
  // Overlong forms, surrogates and out-of-range values are invalid.
  if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
      cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    return bad();
  }
  i += n + 1;
  return cp;
}

bool IsCased(char32_t c);
char32_t ToUpper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 &&
      c != 0x17F) {
    bool odd_is_lower = !((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E));
    if (odd_is_lower ? (c & 1) : !(c & 1)) return c - 1;
    return c;
  }
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}
char32_t ToLower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  if (c == 0x178) return 0xFF;
  if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 &&
      c != 0x17F) {
    bool odd_is_lower = !((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E));
    if (odd_is_lower ? !(c & 1) : (c & 1)) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}
bool IsUpperChar(char32_t c) { return ToLower(c) != c; }
bool IsLowerChar(char32_t c) { return ToUpper(c) != c || c == 0xDF; }
bool IsCased(char32_t c) { return IsUpperChar(c) || IsLowerChar(c); }

}  // namespace

void AppendUtf8(std::string& out, char32_t c) {
  if (c >= 0xDC80 && c <= 0xDCFF) {  // surrogateescape'd raw byte
    out.push_back(static_cast<char>(c - 0xDC00));
  } else if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::u32string Decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) out.push_back(DecodeOne(s, i));
  return out;
}

std::string Encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) AppendUtf8(out, c);
  return out;
}

size_t Length(std::string_view s) {
  size_t n = 0, i = 0;
  while (i < s.size()) {
    DecodeOne(s, i);
    ++n;
  }
  return n;
}

bool IsSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

std::string Strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right) {
  std::u32string u = Decode(s);
  std::u32string set;
  if (chars) set = Decode(*chars);
  auto strip_it = [&](char32_t c) {
    return chars ? set.find(c) != std::u32string::npos : IsSpace(c);
  };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return Encode(std::u32string_view(u).substr(b, e - b));
}

std::vector<std::string> Split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit) {
  std::vector<std::string> out;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (sep) {
    size_t pos = 0;
    while (maxsplit > 0) {
      size_t f = s.find(*sep, pos);
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, f - pos));
      pos = f + sep->size();
      --maxsplit;
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  std::u32string u = Decode(s);
  size_t i = 0, n = u.size();
  while (true) {
    while (i < n && IsSpace(u[i])) ++i;
    if (i == n) break;
    if (maxsplit == 0) {
      size_t e = n;
      while (e > i && IsSpace(u[e - 1])) --e;
      out.push_back(Encode(std::u32string_view(u).substr(i, e - i)));
      break;
    }
    size_t j = i;
    while (j < n && !IsSpace(u[j])) ++j;
    out.push_back(Encode(std::u32string_view(u).substr(i, j - i)));
    --maxsplit;
    i = j;
  }
  return out;
}

std::vector<std::string> RSplit(std::string_view s, const std::optional<std::string>& sep,
                                int64_t maxsplit) {
  std::vector<std::string> out;
  if (maxsplit < 0) return Split(s, sep, maxsplit);
  if (sep) {
    size_t end = s.size();
    while (maxsplit > 0 && end >= sep->size()) {
      size_t f = s.rfind(*sep, end - sep->size());
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(f + sep->size(), end - f - sep->size()));
      end = f;
      --maxsplit;
    }
    out.emplace_back(s.substr(0, end));
  } else {
    std::u32string u = Decode(s);
    size_t e = u.size();
    while (true) {
      while (e > 0 && IsSpace(u[e - 1])) --e;
      if (e == 0) break;
      if (maxsplit == 0) {
        size_t b = 0;
        while (b < e && IsSpace(u[b])) ++b;
        out.push_back(Encode(std::u32string_view(u).substr(b, e - b)));
        break;
      }
      size_t b = e;
      while (b > 0 && !IsSpace(u[b - 1])) --b;
      out.push_back(Encode(std::u32string_view(u).substr(b, e - b)));
      --maxsplit;
      e = b;
    }
  }
  return std::vector<std::string>(out.rbegin(), out.rend());
}

std::vector<std::string> SplitLines(std::string_view s, bool keepends) {
  std::u32string u = Decode(s);
  std::vector<std::string> out;
  size_t i = 0, n = u.size();
  while (i < n) {
    size_t j = i;
    while (j < n) {
      char32_t c = u[j];
      if (c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
          c == 0x85 || c == 0x2028 || c == 0x2029)
        break;
      ++j;
    }
    size_t eol = j;
    if (j < n) {
      eol = (u[j] == '\r' && j + 1 < n && u[j + 1] == '\n') ? j + 2 : j + 1;
    }
    out.push_back(Encode(std::u32string_view(u).substr(i, (keepends ? eol : j) - i)));
    i = eol;
  }
  return out;
}

std::string Replace(std::string_view s, std::string_view old_s, std::string_view new_s,
                    int64_t count) {
  if (count < 0) count = INT64_MAX;
  std::string out;
  if (old_s.empty()) {
    // Python inserts `new` before every code point and at the end.
    size_t i = 0;
    while (i < s.size() && count > 0) {
      out.append(new_s);
      --count;
      size_t b = i;
      DecodeOne(s, i);
      out.append(s.substr(b, i - b));
    }
    if (count > 0) out.append(new_s);
    if (i < s.size()) out.append(s.substr(i));
    return out;
  }
  size_t pos = 0;
  while (count > 0) {
    size_t f = s.find(old_s, pos);
    if (f == std::string_view::npos) break;
    out.append(s.substr(pos, f - pos));
    out.append(new_s);
    pos = f + old_s.size();
    --count;
  }
  out.append(s.substr(pos));
  return out;
}

std::string Upper(std::string_view s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    char32_t c = DecodeOne(s, i);
    if (c == 0xDF) {
      out += "SS";
      continue;
    }
    AppendUtf8(out, ToUpper(c));
  }
  return out;
}

std::string Lower(std::string_view s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) AppendUtf8(out, ToLower(DecodeOne(s, i)));
  return out;
}

std::string Capitalize(std::string_view s) {
  std::u32string u = Decode(s);
  std::string out;
  for (size_t i = 0; i < u.size(); ++i) AppendUtf8(out, i == 0 ? ToUpper(u[i]) : ToLower(u[i]));
  return out;
}

std::string TitleMethod(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  size_t i = 0;
  while (i < s.size()) {
    char32_t c = DecodeOne(s, i);
    char32_t m = prev_cased ? ToLower(c) : ToUpper(c);
    AppendUtf8(out, m);
    prev_cased = IsCased(c);
  }
  return out;
}

std::string JinjaTitle(std::string_view s) {
  // Splits on runs of [-\s({\[<] and capitalizes the first char of each piece.
  std::u32string u = Decode(s);
  auto is_sep = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || IsSpace(c);
  };
  std::string out;
  size_t i = 0;
  while (i < u.size()) {
    bool sep = is_sep(u[i]);
    size_t j = i;
    while (j < u.size() && is_sep(u[j]) == sep) ++j;
    for (size_t k = i; k < j; ++k) AppendUtf8(out, k == i ? ToUpper(u[k]) : ToLower(u[k]));
    i = j;
  }
  return out;
}

bool IsUpperCase(std::string_view s) {
  bool cased = false;
  size_t i = 0;
  while (i < s.size()) {
    char32_t c = DecodeOne(s, i);
    if (IsLowerChar(c)) return false;
    if (IsUpperChar(c)) cased = true;
  }
  return cased;
}

bool IsLowerCase(std::string_view s) {
  bool cased = false;
  size_t i = 0;
  while (i < s.size()) {
    char32_t c = DecodeOne(s, i);
    if (IsUpperChar(c)) return false;
    if (IsLowerChar(c)) cased = true;
  }
  return cased;
}

int64_t Find(std::string_view s, std::string_view sub, bool reverse) {
  size_t f = reverse ? s.rfind(sub) : s.find(sub);
  if (f == std::string_view::npos) return -1;
  return static_cast<int64_t>(Length(s.substr(0, f)));
}

int64_t Count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(Length(s)) + 1;
  int64_t n = 0;
  size_t pos = 0;
  while ((pos = s.find(sub, pos)) != std::string_view::npos) {
    ++n;
    pos += sub.size();
  }
  return n;
}

std::string Repr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  size_t i = 0;
  char buf[16];
  while (i < s.size()) {
    char32_t c = DecodeOne(s, i);
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0xA0) || c == 0xAD) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if ((c >= 0xD800 && c <= 0xDFFF) || (c >= 0x2000 && c <= 0x200F) ||
               (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x206F) || c == 0xFEFF ||
               c == 0x1680 || c == 0x3000 || (c >= 0xE000 && c <= 0xF8FF)) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      AppendUtf8(out, c);
    }
  }
  out.push_back(q);
  return out;
}

std::string FormatFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, then CPython's layout rule:
  // exponent notation when the decimal exponent is < -4 or >= 16.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  int exp = std::atoi(sci.c_str() + epos + 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  int decpt = exp + 1;
  std::string out = neg ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits + std::string(decpt - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
  return out;
}

double RoundFloat(double x, int64_t ndigits) {
  if (!std::isfinite(x)) return x;
  if (ndigits > 320) return x;
  if (ndigits >= 0) {
    char buf[400];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(ndigits), x);
    return std::strtod(buf, nullptr);
  }
  if (ndigits < -308) return 0.0 * x;
  double p = std::pow(10.0, static_cast<double>(-ndigits));
  double y = x / p;
  double r = std::nearbyint(y);  // default rounding mode: half to even
  return r * p;
}

std::optional<int64_t> ParseInt(std::string_view s, int base) {
  std::u32string u = Decode(s);
  size_t b = 0, e = u.size();
  while (b < e && IsSpace(u[b])) ++b;
  while (e > b && IsSpace(u[e - 1])) --e;
  std::string t;
  bool last_us = true;
  for (size_t i = b; i < e; ++i) {
    char32_t c = u[i];
    if (c == '_') {
      if (last_us) return std::nullopt;
      last_us = true;
      continue;
    }
    if (c > 0x7F) return std::nullopt;
    t.push_back(static_cast<char>(c));
    last_us = false;
  }
  if (t.empty() || last_us) return std::nullopt;
  bool neg = false;
  size_t i = 0;
  if (t[0] == '+' || t[0] == '-') {
    neg = t[0] == '-';
    i = 1;
  }
  if (i >= t.size()) return std::nullopt;
  int64_t v = 0;
  auto r = std::from_chars(t.data() + i, t.data() + t.size(), v, base);
  if (r.ec != std::errc() || r.ptr != t.data() + t.size()) return std::nullopt;
  return neg ? -v : v;
}

std::optional<double> ParseFloat(std::string_view s) {
  std::string t = Strip(s, std::nullopt, true, true);
  if (t.empty()) return std::nullopt;
  std::string low = Lower(t);
  std::string body = low;
  double sign = 1;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    sign = body[0] == '-' ? -1 : 1;
    body.erase(0, 1);
  }
  if (body == "inf" || body == "infinity") return sign * HUGE_VAL;
  if (body == "nan") return std::nan("");
  for (char c : body)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == '+' ||
          c == '-'))
      return std::nullopt;
  double v = 0;
  auto r = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t[0] == '+') r = std::from_chars(t.data() + 1, t.data() + t.size(), v);
  if (r.ec != std::errc() || r.ptr != t.data() + t.size()) return std::nullopt;
  return v;
}

}  // namespace lumen::tokenize::pystr
