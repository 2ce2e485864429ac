#include "lumen/engine/generate.h"

#include <algorithm>
#include <chrono>

#include "lumen/engine/stop.h"

namespace lumen::engine {

std::string_view FinishReasonName(FinishReason r) {
  // OpenAI's vocabulary: a stop string and end-of-sequence are both "stop";
  // max_tokens and a full context are both "length".
  switch (r) {
    case FinishReason::kLength:
    case FinishReason::kContext:
      return "length";
    case FinishReason::kStop:
    case FinishReason::kEos:
      return "stop";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "?";
}

Result<GenerateResult> Generate(Session& session, sample::Sampler& sampler,
                                std::span<const int32_t> prompt, const GenerateOptions& opts,
                                const TextSink& on_text) {
  using Clock = std::chrono::steady_clock;
  GenerateResult r;
  const tokenize::Tokenizer& tok = session.model().tokenizer();
  auto t0 = Clock::now();
  if (!prompt.empty()) {
    LUMEN_RETURN_IF_ERROR(session.Append(prompt));
  } else if (session.tokens().empty()) {
    return Error("generate: empty prompt and empty session");
  }
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  auto t1 = Clock::now();
  r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  tokenize::StreamingDetokenizer detok(tok, /*skip_special=*/true);
  // Decode the continuation in the context of the last few tokens so that a
  // first generated token like " time" keeps its leading space (SentencePiece
  // decoding drops it at the start of a sequence); their text is discarded.
  const auto& hist = session.tokens();
  const size_t context = std::min<size_t>(hist.size(), 8);
  for (size_t i = hist.size() - context; i < hist.size(); ++i) detok.Push(hist[i]);
  StopMatcher stops(opts.stop);
  auto emit = [&](const std::string& s) {
    if (s.empty()) return true;
    r.text += s;
    return on_text ? on_text(s) : true;
  };
  for (int n = 0; opts.max_tokens < 0 || n < opts.max_tokens; ++n) {
    if (static_cast<int64_t>(session.tokens().size()) >= session.ctx()) {
      r.finish = FinishReason::kContext;
      break;
    }
    GeneratedToken g;
    g.id = sampler.Sample(session.logits(), session.tokens(),
                          opts.want_logprobs ? &g.logprobs : nullptr);
    const bool eog = tok.IsEog(g.id);
    if (eog && !opts.ignore_eos) {
      r.finish = FinishReason::kEos;
      break;
    }
    r.tokens.push_back(g);
    const std::string text = stops.Push(detok.Push(g.id));
    if (!emit(text)) {
      r.finish = FinishReason::kCancelled;
      break;
    }
    if (stops.stopped()) {
      r.finish = FinishReason::kStop;
      break;
    }
    const int32_t id = g.id;
    LUMEN_RETURN_IF_ERROR(session.Append(std::span<const int32_t>(&id, 1)));
    r.finish = FinishReason::kLength;
  }
  if (r.finish != FinishReason::kStop && r.finish != FinishReason::kCancelled) {
    emit(stops.Push(detok.Flush()));
    if (!stops.stopped()) emit(stops.Flush());
    if (stops.stopped()) r.finish = FinishReason::kStop;
  }
  r.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  return r;
}

}  // namespace lumen::engine
