#include "lumen/tokenize/unicode.h"

#include <algorithm>
#include <vector>

#include "lumen/tokenize/unicode_tables.h"

namespace lumen::tokenize {
namespace ud = unicode_data;

size_t ValidUtf8Length(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t n = s.size();
  uint8_t c = p[i];
  if (c < 0x80) return 1;
  size_t len;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + 1 >= n || p[i + 1] < lo || p[i + 1] > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if (i + k >= n || p[i + k] < 0x80 || p[i + k] > 0xBF) return 0;
  }
  return len;
}

char32_t DecodeUtf8(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t len = ValidUtf8Length(s, i);
  if (len == 0) {
    // Maximal subpart: a lead byte plus the continuation bytes that were valid
    // so far (WHATWG "U+FFFD per maximal subpart").
    uint8_t c = p[i];
    size_t adv = 1;
    size_t need = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
      need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    for (size_t k = 1; k <= need && i + k < s.size(); ++k) {
      uint8_t b = p[i + k];
      uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
      if (b < l || b > h) break;
      ++adv;
    }
    i += adv;
    return 0xFFFD;
  }
  char32_t cp;
  switch (len) {
    case 1:
      cp = p[i];
      break;
    case 2:
      cp = (char32_t(p[i] & 0x1F) << 6) | (p[i + 1] & 0x3F);
      break;
    case 3:
      cp = (char32_t(p[i] & 0x0F) << 12) | (char32_t(p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F);
      break;
    default:
      cp = (char32_t(p[i] & 0x07) << 18) | (char32_t(p[i + 1] & 0x3F) << 12) |
           (char32_t(p[i + 2] & 0x3F) << 6) | (p[i + 3] & 0x3F);
  }
  i += len;
  return cp;
}

void AppendUtf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t len = ValidUtf8Length(s, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string SanitizeUtf8(std::string_view s) {
  if (IsValidUtf8(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    size_t len = ValidUtf8Length(s, i);
    if (len) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      DecodeUtf8(s, i);
      AppendUtf8(out, 0xFFFD);
    }
  }
  return out;
}

namespace {

constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr int kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
              kSCount = kLCount * kNCount;

uint8_t Ccc(char32_t cp) {
  if (cp < 0x300) return 0;
  const ud::CccRange* end = ud::kCcc + ud::kCccSize;
  const ud::CccRange* it = std::upper_bound(
      ud::kCcc, end, cp, [](char32_t c, const ud::CccRange& r) { return c < r.first; });
  if (it == ud::kCcc) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

bool NfcUnsafe(char32_t cp) {
  if (cp < 0x300) return false;
  const ud::CpRange* end = ud::kNfcUnsafe + ud::kNfcUnsafeSize;
  const ud::CpRange* it = std::upper_bound(
      ud::kNfcUnsafe, end, cp, [](char32_t c, const ud::CpRange& r) { return c < r.first; });
  if (it == ud::kNfcUnsafe) return false;
  --it;
  return cp <= it->last;
}

void Decompose(char32_t cp, bool compat, std::vector<char32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    int s = static_cast<int>(cp - kSBase);
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xA0) {
    const ud::DecompEntry* end = ud::kDecomp + ud::kDecompSize;
    const ud::DecompEntry* it = std::lower_bound(
        ud::kDecomp, end, cp, [](const ud::DecompEntry& e, char32_t c) { return e.cp < c; });
    // Entries for one code point: canonical (compat=0) first, then compat.
    const ud::DecompEntry* best = nullptr;
    for (; it != end && it->cp == cp; ++it) {
      if (!it->compat || compat) best = it;
    }
    if (best) {
      out.insert(out.end(), ud::kDecompData + best->offset,
                 ud::kDecompData + best->offset + best->len);
      return;
    }
  }
  out.push_back(cp);
}

char32_t Compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const ud::ComposeEntry* end = ud::kCompose + ud::kComposeSize;
  const ud::ComposeEntry* it =
      std::lower_bound(ud::kCompose, end, std::pair(a, b),
                       [](const ud::ComposeEntry& e, const std::pair<char32_t, char32_t>& k) {
                         return e.first < k.first || (e.first == k.first && e.second < k.second);
                       });
  if (it != end && it->first == a && it->second == b) return it->composite;
  return 0;
}

}  // namespace

std::string Normalize(std::string_view s, NormalForm form) {
  bool compat = form == NormalForm::kNfkc || form == NormalForm::kNfkd;
  bool compose = form == NormalForm::kNfc || form == NormalForm::kNfkc;
  // Quick check: ASCII is invariant under every form; text without NFC-unsafe
  // code points is invariant under NFC.
  bool quick = true;
  for (size_t i = 0; i < s.size() && quick;) {
    uint8_t c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    if (form != NormalForm::kNfc) {
      quick = false;
      break;
    }
    char32_t cp = DecodeUtf8(s, i);
    if (NfcUnsafe(cp)) quick = false;
  }
  if (quick) return std::string(s);

  std::vector<char32_t> cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) Decompose(DecodeUtf8(s, i), compat, cps);
  // Canonical ordering: stable sort each run of non-starters by class.
  for (size_t i = 0; i < cps.size();) {
    if (Ccc(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && Ccc(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j,
                     [](char32_t a, char32_t b) { return Ccc(a) < Ccc(b); });
    i = j;
  }
  if (compose && !cps.empty()) {
    // Canonical composition: a character combines with the last starter when
    // nothing between them blocks it (an intervening class >= its own).
    size_t starter = 0;
    bool have_starter = Ccc(cps[0]) == 0;
    int last_ccc = have_starter ? 0 : 256;
    size_t out_n = 1;
    for (size_t i = 1; i < cps.size(); ++i) {
      char32_t c = cps[i];
      int cc = Ccc(c);
      if (have_starter && (out_n == starter + 1 || (last_ccc != 0 && last_ccc < cc))) {
        if (char32_t comp = Compose(cps[starter], c)) {
          cps[starter] = comp;
          continue;
        }
      }
      if (cc == 0) {
        starter = out_n;
        have_starter = true;
        last_ccc = 0;
      } else {
        last_ccc = cc;
      }
      cps[out_n++] = c;
    }
    cps.resize(out_n);
  }
  std::string out;
  out.reserve(s.size());
  for (char32_t c : cps) AppendUtf8(out, c);
  return out;
}

namespace {
constexpr bool PrintableByte(int x) {
  return (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
}
struct ByteTables {
  char32_t to_cp[256];
  int16_t to_byte[256 + 68];
};
constexpr ByteTables MakeByteTables() {
  ByteTables t{};
  int n = 0;
  for (int x = 0; x < 256; ++x) t.to_cp[x] = PrintableByte(x) ? x : 256 + n++;
  for (auto& v : t.to_byte) v = -1;
  for (int x = 0; x < 256; ++x) t.to_byte[t.to_cp[x]] = static_cast<int16_t>(x);
  return t;
}
constexpr ByteTables kByteTables = MakeByteTables();
}  // namespace

char32_t ByteToUnicode(uint8_t b) { return kByteTables.to_cp[b]; }

int UnicodeToByte(char32_t cp) { return cp < 256 + 68 ? kByteTables.to_byte[cp] : -1; }

}  // namespace lumen::tokenize
