#include "lumen/serve/protocol.h"

#include <cmath>

namespace lumen::serve {

using ojson = nlohmann::ordered_json;

std::string ProtocolWriter::Dump(const ojson& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string ProtocolWriter::Sse(const ojson& data) { return "data: " + Dump(data) + "\n\n"; }

std::string ProtocolWriter::SseEvent(const std::string& event, const ojson& data) {
  return "event: " + event + "\ndata: " + Dump(data) + "\n\n";
}

std::string ProtocolWriter::error() const {
  for (const auto& c : choices_)
    if (!c.error.empty()) return c.error;
  return "";
}

int64_t ProtocolWriter::completion_total() const {
  int64_t n = 0;
  for (const auto& c : choices_) n += c.completion_tokens;
  return n;
}

std::string ProtocolWriter::Feed(const ChoiceEvent& e) {
  if (e.index < 0 || e.index >= static_cast<int>(choices_.size())) return "";
  ChoiceState& c = choices_[e.index];
  using K = engine::JobEvent;
  switch (e.ev.kind) {
    case K::kStarted:
      c.prompt_tokens = e.ev.prompt_tokens;
      c.cached_tokens = e.ev.cached_tokens;
      return "";
    case K::kToken:
      c.tokens.push_back(e.ev.token);
      c.text += e.ev.text;
      return OnText(e.index, e.ev.text, &c.tokens.back());
    case K::kDone: {
      std::string out;
      if (!e.ev.text.empty()) {
        c.text += e.ev.text;
        out += OnText(e.index, e.ev.text, nullptr);
      }
      c.done = true;
      c.finish = e.ev.finish;
      c.stop_matched = e.ev.stop_matched;
      c.prompt_tokens = e.ev.prompt_tokens;
      c.cached_tokens = e.ev.cached_tokens;
      c.completion_tokens = e.ev.completion_tokens;
      if (forced())
        c.reply = ForcedReply(c.text, x_.prep.tool_names, CallIdPrefix());
      else if (tools())
        c.reply = ParseToolCalls(c.text, x_.prep.tool_names, CallIdPrefix());
      else
        c.reply.content = c.text;
      return out + OnDone(e.index);
    }
    case K::kError:
      c.done = true;
      c.error = e.ev.error.empty() ? "generation failed" : e.ev.error;
      c.finish = engine::FinishReason::kCancelled;
      return OnDone(e.index);
  }
  return "";
}

ProtocolWriter::CallDelta ProtocolWriter::ForcedDelta(int index, bool at_done) {
  ChoiceState& c = choices_[index];
  CallDelta d;
  const ForcedCall fc = ScanForcedCall(c.text);
  if (!c.call_name_sent && (fc.name_done || at_done)) {
    d.name_ready = true;
    d.name = at_done && !c.reply.calls.empty() ? c.reply.calls[0].name : fc.name;
    c.call_name_sent = true;
  }
  if (c.call_name_sent && fc.args.size() > c.call_args_sent) {
    d.args = fc.args.substr(c.call_args_sent);
    c.call_args_sent = fc.args.size();
  }
  return d;
}

ojson ProtocolWriter::LogprobEntry(const engine::GeneratedToken& t) const {
  auto one = [&](int32_t id, float lp) {
    const std::string s = x_.tok->TokenBytes(id);
    ojson bytes = ojson::array();
    for (unsigned char ch : x_.tok->TokenBytes(id)) bytes.push_back(int(ch));
    return ojson{
        {"token", s}, {"logprob", std::isfinite(lp) ? double(lp) : -9999.0}, {"bytes", bytes}};
  };
  ojson e = one(t.id, t.logprobs.chosen.logprob);
  ojson top = ojson::array();
  for (const auto& a : t.logprobs.top) top.push_back(one(a.token, a.logprob));
  e["top_logprobs"] = top;
  return e;
}

std::string OpenAIFinish(const ChoiceState& c) {
  if (!c.reply.calls.empty() && !c.reply.truncated) return "tool_calls";
  switch (c.finish) {
    case engine::FinishReason::kLength:
    case engine::FinishReason::kContext:
      return "length";
    default:
      return "stop";
  }
}

std::string AnthropicStop(const ChoiceState& c) {
  if (!c.reply.calls.empty() && !c.reply.truncated) return "tool_use";
  switch (c.finish) {
    case engine::FinishReason::kLength:
    case engine::FinishReason::kContext:
      return "max_tokens";
    case engine::FinishReason::kStop:
      return c.stop_matched.empty() ? "end_turn" : "stop_sequence";
    default:
      return "end_turn";
  }
}

}  // namespace lumen::serve
