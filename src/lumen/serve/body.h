// The gate every POST body passes before a protocol parser sees it: size
// limit (413), strict UTF-8 (400 naming the byte offset) and JSON syntax
// (400 naming the parser's position). Also the entry point of the request
// fuzz target (tests/fuzz/request_fuzz.cc).
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "lumen/core/utf8.h"
#include "lumen/serve/api_error.h"

namespace lumen::serve {

using lumen::ValidUtf8;  // core/utf8.h: strict, reports the first bad byte

bool ParseBody(std::string_view body, size_t max_bytes, nlohmann::ordered_json* out, ApiError* err);

}  // namespace lumen::serve
