// Generate: the decode loop shared by `lumen generate`, `lumen chat` and the
// server: prefill the prompt, then sample, append and stream text until EOS,
// a stop string, max_tokens, the context limit, or the caller says stop.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "lumen/engine/session.h"
#include "lumen/sample/sampler.h"

namespace lumen::engine {

enum class FinishReason { kLength, kStop, kEos, kContext, kCancelled };
std::string_view FinishReasonName(FinishReason r);  // "length", "stop", ...

struct GenerateOptions {
  int max_tokens = 256;  // new tokens; < 0: until the context is full
  bool ignore_eos = false;
  std::vector<std::string> stop;  // matched on decoded text, never partly emitted
  bool want_logprobs = false;
};

struct GeneratedToken {
  int32_t id;
  sample::TokenLogprobs logprobs;  // filled when want_logprobs
};

struct GenerateResult {
  FinishReason finish = FinishReason::kLength;
  std::vector<GeneratedToken> tokens;
  std::string text;           // streamed text, stop string excluded
  int64_t prompt_tokens = 0;  // tokens prefilled by this call
  double prefill_seconds = 0, decode_seconds = 0;
};

// on_text receives each newly complete piece of text; returning false cancels.
using TextSink = std::function<bool(std::string_view text)>;

// Appends `prompt` to the session (which may already hold earlier turns) and
// generates. The prompt may be empty if the session already has logits.
Result<GenerateResult> Generate(Session& session, sample::Sampler& sampler,
                                std::span<const int32_t> prompt, const GenerateOptions& opts,
                                const TextSink& on_text);

}  // namespace lumen::engine
