#include "lumen/tokenize/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "lumen/tokenize/unicode.h"

namespace lumen::tokenize {

const char kGpt2Pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char kLlama3Pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char kQwen2Pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

struct Regex::Code {
  pcre2_code* code = nullptr;
  // Bounds backtracking so a hostile pattern from a file cannot hang us;
  // only read while matching, so sharing it across threads is safe.
  pcre2_match_context* ctx = nullptr;
  ~Code() {
    pcre2_match_context_free(ctx);
    pcre2_code_free(code);
  }
};

namespace {

// JavaScript's \s: WhiteSpace + LineTerminator.
constexpr char kJsSpaceClass[] =
    "\\t\\n\\x{0B}\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}\\x{FEFF}";

std::string JsCompat(std::string_view p) {
  std::string s(p);
  const std::string from = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
  const std::string to = "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))";
  for (size_t pos; (pos = s.find(from)) != std::string::npos;) s.replace(pos, from.size(), to);
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '\\' && i + 1 < s.size()) {
      char n = s[i + 1];
      if (n == 's') {
        out += in_class ? std::string(kJsSpaceClass) : "[" + std::string(kJsSpaceClass) + "]";
      } else if (n == 'S' && !in_class) {
        out += "[^" + std::string(kJsSpaceClass) + "]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class)
      in_class = true;
    else if (c == ']' && in_class)
      in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

Result<Regex> Regex::Compile(std::string_view pattern, bool js_compat) {
  std::string p = js_compat ? JsCompat(pattern) : std::string(pattern);
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                                   PCRE2_UTF | PCRE2_NO_UTF_CHECK, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    return Errorf("regex '{}': offset {}: {}", std::string(pattern), off,
                  reinterpret_cast<const char*>(buf));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter
  Regex r;
  r.code_ = std::make_shared<Code>();
  r.code_->code = code;
  r.code_->ctx = pcre2_match_context_create(nullptr);
  pcre2_set_match_limit(r.code_->ctx, 1000000);
  pcre2_set_depth_limit(r.code_->ctx, 10000);
  r.source_ = std::string(pattern);
  return r;
}

Regex Regex::Literal(std::string_view text) {
  Regex r;
  r.source_ = std::string(text);
  return r;
}

std::vector<std::pair<size_t, size_t>> Regex::Matches(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  if (!code_) {
    if (source_.empty()) return out;
    for (size_t pos = 0; (pos = text.find(source_, pos)) != std::string_view::npos;
         pos += source_.size()) {
      out.emplace_back(pos, pos + source_.size());
    }
    return out;
  }
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  size_t start = 0;
  while (start <= text.size()) {
    int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                         PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t s = ov[0], e = ov[1];
    out.emplace_back(s, e);
    if (e > s) {
      start = e;
    } else {
      if (s >= text.size()) break;
      size_t i = s;
      DecodeUtf8(text, i);
      start = i;
    }
  }
  pcre2_match_data_free(md);
  return out;
}

std::string ApplyNormalizers(const std::vector<NormalizerStep>& steps, std::string text) {
  for (const NormalizerStep& st : steps) {
    switch (st.kind) {
      case NormalizerKind::kNfc:
        text = Normalize(text, NormalForm::kNfc);
        break;
      case NormalizerKind::kNfd:
        text = Normalize(text, NormalForm::kNfd);
        break;
      case NormalizerKind::kNfkc:
        text = Normalize(text, NormalForm::kNfkc);
        break;
      case NormalizerKind::kNfkd:
        text = Normalize(text, NormalForm::kNfkd);
        break;
      case NormalizerKind::kReplace: {
        std::string out;
        size_t prev = 0;
        st.pattern.ForEachMatch(text, [&](size_t s, size_t e) {
          out.append(text, prev, s - prev);
          out += st.content;
          prev = e;
        });
        out.append(text, prev, std::string::npos);
        text = std::move(out);
        break;
      }
      case NormalizerKind::kPrepend:
        if (!text.empty()) text = st.content + text;
        break;
      case NormalizerKind::kLowercase:
        for (char& c : text) {
          if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
        }
        break;
      case NormalizerKind::kStrip: {
        size_t b = 0, e = text.size();
        if (st.left) {
          while (b < e) {
            size_t i = b;
            char32_t cp = DecodeUtf8(text, i);
            if (!IsJsSpace(cp)) break;
            b = i;
          }
        }
        if (st.right) {
          while (e > b) {
            size_t s = e - 1;
            while (s > b && (static_cast<unsigned char>(text[s]) & 0xC0) == 0x80) --s;
            size_t i = s;
            if (!IsJsSpace(DecodeUtf8(text, i))) break;
            e = s;
          }
        }
        text = text.substr(b, e - b);
        break;
      }
    }
  }
  return text;
}

bool IsJsSpace(char32_t cp) {
  return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

namespace {

void SplitPiece(const PreTokenizerStep& st, std::string_view t, std::vector<std::string>& out) {
  std::vector<std::pair<size_t, size_t>> m;
  st.pattern.ForEachMatch(t, [&](size_t s, size_t e) { m.emplace_back(s, e); });
  if (st.invert) {
    // transformers.js keeps only the matches.
    for (auto [s, e] : m) {
      if (e > s) out.emplace_back(t.substr(s, e - s));
    }
    return;
  }
  size_t prev = 0;
  std::string pending;  // kMergedWithNext / kContiguous carry
  bool has_pending = false;
  auto emit = [&](std::string_view piece) {
    if (!piece.empty()) out.emplace_back(piece);
  };
  for (auto [s, e] : m) {
    if (e == s) continue;
    std::string_view gap = t.substr(prev, s - prev);
    std::string_view match = t.substr(s, e - s);
    switch (st.behavior) {
      case SplitBehavior::kIsolated:
        emit(gap);
        emit(match);
        break;
      case SplitBehavior::kRemoved:
        emit(gap);
        break;
      case SplitBehavior::kMergedWithPrevious:
        out.emplace_back(std::string(gap) + std::string(match));
        break;
      case SplitBehavior::kMergedWithNext:
        if (has_pending) {
          emit(pending + std::string(gap));
          has_pending = false;
        } else {
          emit(gap);
        }
        pending = std::string(match);
        has_pending = true;
        break;
      case SplitBehavior::kContiguous:
        if (has_pending && gap.empty()) {
          pending += match;
        } else {
          if (has_pending) emit(pending);
          emit(gap);
          pending = std::string(match);
          has_pending = true;
        }
        break;
    }
    prev = e;
  }
  std::string_view rest = t.substr(prev);
  if (has_pending) {
    if (st.behavior == SplitBehavior::kMergedWithNext) {
      emit(pending + std::string(rest));
      return;
    }
    emit(pending);
  }
  emit(rest);
}

std::string ToByteAlphabet(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) AppendUtf8(out, ByteToUnicode(b));
  return out;
}

}  // namespace

void PreTokenize(const std::vector<PreTokenizerStep>& steps, std::string_view text,
                 bool first_section, std::vector<std::string>& out, bool* byte_level) {
  *byte_level = false;
  std::vector<std::string> cur, next;
  cur.emplace_back(text);
  for (size_t k = 0; k < steps.size(); ++k) {
    const PreTokenizerStep& st = steps[k];
    const bool last = k + 1 == steps.size();
    next.clear();
    for (std::string& piece : cur) {
      switch (st.kind) {
        case PreTokenizerKind::kSplit:
          SplitPiece(st, piece, next);
          break;
        case PreTokenizerKind::kByteLevel: {
          if (st.add_prefix_space && !piece.starts_with(' ')) piece.insert(0, 1, ' ');
          size_t first = next.size();
          if (st.use_regex) {
            st.pattern.ForEachMatch(piece, [&](size_t s, size_t e) {
              if (e > s) next.emplace_back(piece.substr(s, e - s));
            });
          } else {
            next.push_back(std::move(piece));
          }
          if (!last) {
            for (size_t i = first; i < next.size(); ++i) next[i] = ToByteAlphabet(next[i]);
          } else {
            *byte_level = true;
          }
          break;
        }
        case PreTokenizerKind::kMetaspace: {
          std::string s;
          for (char c : piece) {
            if (c == ' ')
              s += st.replacement;
            else
              s += c;
          }
          bool prepend = st.add_prefix_space && st.prepend_scheme != "never" &&
                         (st.prepend_scheme == "always" || first_section);
          if (prepend && !s.starts_with(st.replacement)) s = st.replacement + s;
          if (!st.split) {
            next.push_back(std::move(s));
          } else {
            // Split before each replacement character (MergedWithNext).
            size_t startp = 0;
            for (size_t pos = s.find(st.replacement, 1); pos != std::string::npos;
                 pos = s.find(st.replacement, pos + 1)) {
              if (pos > startp) next.emplace_back(s.substr(startp, pos - startp));
              startp = pos;
            }
            if (startp < s.size()) next.emplace_back(s.substr(startp));
          }
          break;
        }
        case PreTokenizerKind::kDigits: {
          // JS: /[^\d]+|\d+/ (or \d), \d being ASCII digits.
          size_t i = 0;
          while (i < piece.size()) {
            bool digit = piece[i] >= '0' && piece[i] <= '9';
            size_t j = i + 1;
            if (!(digit && st.individual_digits)) {
              while (j < piece.size() && (piece[j] >= '0' && piece[j] <= '9') == digit) ++j;
            }
            next.emplace_back(piece.substr(i, j - i));
            i = j;
          }
          break;
        }
      }
    }
    std::swap(cur, next);
  }
  for (auto& p : cur) out.push_back(std::move(p));
}

}  // namespace lumen::tokenize
