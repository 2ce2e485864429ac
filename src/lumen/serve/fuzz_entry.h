// ParseAnyRequest: the server's request path without a model, as one call, for
// the libFuzzer target (tests/fuzz/request_fuzz.cc) and its corpus replay in
// request_test.cc: the body gate (size, UTF-8, JSON), the protocol parser the
// first byte picks, the request's sampler fields, and the tool-call parser on
// the same bytes as model output. Never crashes; returns whether the input
// became a request.
#pragma once

#include <string_view>

namespace lumen::serve {

bool ParseAnyRequest(std::string_view input);

}  // namespace lumen::serve
