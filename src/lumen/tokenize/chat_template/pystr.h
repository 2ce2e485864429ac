// Python str semantics over UTF-8 std::string, for the chat-template evaluator.
//
// Jinja2 runs on Python, so a template's `x.strip()`, `x|length`, `x[::-1]`,
// `{{ 1.0 }}` mean what Python says: indices count code points, whitespace is
// Python's Unicode whitespace (str.isspace), floats print as repr(float). These
// helpers reproduce that on UTF-8 bytes. Invalid UTF-8 bytes map one-to-one to
// lone code points U+DC80..U+DCFF (like Python's surrogateescape) so every
// byte string round-trips. Case mapping covers ASCII, Latin-1, Latin
// Extended-A, Greek and Cyrillic; other scripts are left unchanged.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lumen::tokenize::pystr {

std::u32string Decode(std::string_view s);
std::string Encode(std::u32string_view s);
void AppendUtf8(std::string& out, char32_t c);

// Number of code points.
size_t Length(std::string_view s);

// Python str.isspace() for one code point (also what re's \s matches).
bool IsSpace(char32_t c);

// str.strip / lstrip / rstrip; chars == nullopt strips whitespace.
std::string Strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right);

// str.split(sep, maxsplit) (sep nullopt: runs of whitespace) and rsplit.
std::vector<std::string> Split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit);
std::vector<std::string> RSplit(std::string_view s, const std::optional<std::string>& sep,
                                int64_t maxsplit);
std::vector<std::string> SplitLines(std::string_view s, bool keepends);

// str.replace(old, new, count); count < 0 means all.
std::string Replace(std::string_view s, std::string_view old_s, std::string_view new_s,
                    int64_t count);

std::string Upper(std::string_view s);
std::string Lower(std::string_view s);
std::string Capitalize(std::string_view s);
std::string TitleMethod(std::string_view s);  // str.title()
std::string JinjaTitle(std::string_view s);   // Jinja's |title filter
bool IsUpperCase(std::string_view s);         // str.isupper()
bool IsLowerCase(std::string_view s);         // str.islower()

// str.find / rfind / count over code point indices; -1 when absent.
int64_t Find(std::string_view s, std::string_view sub, bool reverse);
int64_t Count(std::string_view s, std::string_view sub);

// repr(str): quotes and escapes like Python.
std::string Repr(std::string_view s);

// repr(float) / str(float) exactly as CPython prints it.
std::string FormatFloat(double d);

// Python round(x, ndigits) for floats (round-half-even on the exact binary value).
double RoundFloat(double x, int64_t ndigits);

// Python int(str) (base 10, allows surrounding whitespace, sign and '_' between digits).
std::optional<int64_t> ParseInt(std::string_view s, int base);
// Python float(str): decimal, inf, nan, surrounding whitespace.
std::optional<double> ParseFloat(std::string_view s);

}  // namespace lumen::tokenize::pystr
