// UTF-8 helpers and Unicode normalization for the tokenizers.
//
// Contract: every function takes and returns UTF-8. SanitizeUtf8 turns any byte
// string into valid UTF-8 the way the WHATWG decoder (JS TextDecoder, Rust
// String::from_utf8_lossy) does: each maximal invalid subpart becomes U+FFFD.
// Normalize implements NFC/NFD/NFKC/NFKD from tables generated out of Python's
// unicodedata (tools/gen_unicode_tables.py); input must be valid UTF-8.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace lumen::tokenize {

// Decodes one code point at s[i]; advances i. Invalid input yields U+FFFD and
// advances by the maximal invalid subpart (at least one byte).
char32_t DecodeUtf8(std::string_view s, size_t& i);
void AppendUtf8(std::string& out, char32_t cp);
// Length of the valid UTF-8 sequence starting at s[i], or 0 when invalid or
// truncated.
size_t ValidUtf8Length(std::string_view s, size_t i);
bool IsValidUtf8(std::string_view s);
std::string SanitizeUtf8(std::string_view s);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
std::string Normalize(std::string_view s, NormalForm form);

// GPT-2 byte-level alphabet: byte -> the code point standing for it.
char32_t ByteToUnicode(uint8_t b);
// Inverse; -1 when cp is not in the alphabet.
int UnicodeToByte(char32_t cp);

}  // namespace lumen::tokenize
