// Admission: whether a request fits the context the server was started with
// (the context engine::Fit checked against the memory budget at start-up).
//
// The rule, the same for every generation endpoint: the prompt alone must
// leave room for one token (P < ctx), and an explicit max_tokens must fit
// beside it (P + max_tokens <= ctx). A request without max_tokens is admitted
// when P < ctx and generates until the context is full. A refusal is a 400
// with code "context_length_exceeded" (OpenAI / Responses shapes), its param
// naming max_tokens (max_output_tokens for Responses) or the prompt field, and
// a message giving the three numbers.
//
// `serve --clamp-max-tokens` (clamp = true) is llama-server's behaviour
// instead: max_tokens beyond the room left is cut to it (the reply ends with
// finish_reason "length" when the context fills); the prompt rule still holds.
#pragma once

#include <cstdint>
#include <optional>

#include "lumen/serve/api_error.h"
#include "lumen/serve/request.h"

namespace lumen::serve {

inline constexpr const char* kContextLengthExceeded = "context_length_exceeded";

// nullopt: admitted (with clamp, *max_tokens is cut to ctx - prompt_tokens).
// prompt_field: "messages", "prompt", "input".
std::optional<ApiError> AdmitContext(Api api, const char* prompt_field, int64_t prompt_tokens,
                                     int* max_tokens, int64_t ctx, bool clamp);

}  // namespace lumen::serve
