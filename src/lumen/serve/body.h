// The gate every POST body passes before a protocol parser sees it: size
// limit (413), strict UTF-8 (400 naming the byte offset) and JSON syntax
// (400 naming the parser's position). Also the entry point of the request
// fuzz target (tests/fuzz/request_fuzz.cc).
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "lumen/serve/api_error.h"

namespace lumen::serve {

// Checks that `s` is valid UTF-8 (no overlongs, surrogates or code points
// above U+10FFFF); on failure *bad_offset is the first bad byte.
bool ValidUtf8(std::string_view s, size_t* bad_offset);

bool ParseBody(std::string_view body, size_t max_bytes, nlohmann::ordered_json* out, ApiError* err);

}  // namespace lumen::serve
