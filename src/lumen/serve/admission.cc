#include "lumen/serve/admission.h"

#include <fmt/format.h>

namespace lumen::serve {

std::optional<ApiError> AdmitContext(Api api, const char* prompt_field, int64_t prompt_tokens,
                                     int* max_tokens, int64_t ctx, bool clamp) {
  ApiError e;
  e.code = kContextLengthExceeded;
  if (prompt_tokens >= ctx) {
    e.param = prompt_field;
    e.message = fmt::format(
        "{}: the prompt ({} tokens) does not leave room in the context ({} tokens): shorten it, "
        "or start the server with a larger --ctx",
        prompt_field, prompt_tokens, ctx);
    return e;
  }
  if (*max_tokens < 0 || prompt_tokens + *max_tokens <= ctx) return std::nullopt;
  if (clamp) {
    *max_tokens = int(ctx - prompt_tokens);
    return std::nullopt;
  }
  const char* field = api == Api::kResponses ? "max_output_tokens" : "max_tokens";
  e.param = field;
  e.message = fmt::format(
      "{}: the prompt ({} tokens) plus {} ({}) is {} tokens, more than the context ({} tokens); "
      "ask for at most {} (or start the server with --clamp-max-tokens)",
      field, prompt_tokens, field, *max_tokens, prompt_tokens + *max_tokens, ctx,
      ctx - prompt_tokens);
  return e;
}

}  // namespace lumen::serve
