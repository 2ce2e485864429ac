#include "lumen/serve/admission.h"

#include <fmt/format.h>

namespace lumen::serve {

std::optional<ApiError> AdmitContext(Api api, const char* prompt_field, int64_t prompt_tokens,
                                     std::optional<int64_t> max_tokens, int64_t ctx) {
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
  if (max_tokens && prompt_tokens + *max_tokens > ctx) {
    const char* field = api == Api::kResponses ? "max_output_tokens" : "max_tokens";
    e.param = field;
    e.message = fmt::format(
        "{}: the prompt ({} tokens) plus {} ({}) is {} tokens, more than the context ({} "
        "tokens); ask for at most {}",
        field, prompt_tokens, field, *max_tokens, prompt_tokens + *max_tokens, ctx,
        ctx - prompt_tokens);
    return e;
  }
  return std::nullopt;
}

}  // namespace lumen::serve
