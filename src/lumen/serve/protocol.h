// Protocol writers: turn the events of one request's jobs into the response
// of the protocol the client speaks, either one JSON body or SSE events.
//
//   OpenAI chat:   chat.completion / chat.completion.chunk ... data: [DONE]
//   OpenAI text:   text_completion (chunks) ... data: [DONE]
//   Anthropic:     message / message_start, content_block_start, ping,
//                  content_block_delta, content_block_stop, message_delta,
//                  message_stop
//   Responses:     response / response.created, response.in_progress,
//                  response.output_item.added, response.content_part.added,
//                  response.output_text.delta, ... response.completed
//
// The handler (server.cc) feeds events in arrival order; ChoiceState keeps
// what each choice produced so far. When the request has tools, text is held
// until the choice ends and then parsed for tool calls (tool_calls.h), since
// a call's start cannot be told from text before its format marker is whole.
// A forced call (tool_choice required / named) is known to be one call from
// the first token, so it streams: the call's name once whole, then argument
// pieces as they are generated.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lumen/serve/engine_bridge.h"
#include "lumen/serve/tool_calls.h"

namespace lumen::serve {

struct ChoiceState {
  std::string text;  // all text so far
  std::vector<engine::GeneratedToken> tokens;
  bool done = false;
  engine::FinishReason finish = engine::FinishReason::kLength;
  std::string stop_matched;
  std::string error;
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  ParsedReply reply;  // set at done when tools were offered
  // Forced call streaming: what of it went out already.
  bool call_name_sent = false;
  size_t call_args_sent = 0;
};

struct ExchangeInfo {
  std::string id;       // chatcmpl-..., msg_..., resp_...
  int64_t created = 0;  // unix seconds
  std::string model;    // the name reported back
  GenRequest req;
  Prepared prep;
  const tokenize::Tokenizer* tok = nullptr;
  std::string previous_response_id;
};

class ProtocolWriter {
 public:
  explicit ProtocolWriter(ExchangeInfo info) : x_(std::move(info)), choices_(x_.req.n) {}
  virtual ~ProtocolWriter() = default;

  // Updates the choice state, then returns the SSE text to send (stream).
  std::string Feed(const ChoiceEvent& e);
  virtual std::string StreamStart() = 0;
  virtual std::string StreamEnd() = 0;  // after every choice is done
  virtual nlohmann::ordered_json Body() = 0;

  const std::vector<ChoiceState>& choices() const { return choices_; }
  const ExchangeInfo& info() const { return x_; }
  // The first job error, if any (turned into HTTP 500 / an error event).
  std::string error() const;

 protected:
  virtual std::string OnText(int index, const std::string& text,
                             const engine::GeneratedToken* tok) = 0;
  virtual std::string OnDone(int index) = 0;
  bool tools() const { return !x_.prep.tool_names.empty(); }
  bool forced() const { return x_.prep.forced_call; }
  // What of the forced call is new since the last call: the name once whole
  // (at_done: whatever it is), then new argument text.
  struct CallDelta {
    bool name_ready = false;
    std::string name;
    std::string args;
  };
  CallDelta ForcedDelta(int index, bool at_done);
  std::string CallIdPrefix() const { return "call_" + x_.id + "_"; }
  int64_t completion_total() const;
  static std::string Sse(const nlohmann::ordered_json& data);  // data: ...
  static std::string SseEvent(const std::string& event, const nlohmann::ordered_json& data);
  static std::string Dump(const nlohmann::ordered_json& j);
  nlohmann::ordered_json LogprobEntry(const engine::GeneratedToken& t) const;

  ExchangeInfo x_;
  std::vector<ChoiceState> choices_;
};

std::unique_ptr<ProtocolWriter> MakeChatWriter(ExchangeInfo info);
std::unique_ptr<ProtocolWriter> MakeCompletionWriter(ExchangeInfo info);
std::unique_ptr<ProtocolWriter> MakeMessagesWriter(ExchangeInfo info);
std::unique_ptr<ProtocolWriter> MakeResponsesWriter(ExchangeInfo info);

// "stop" / "length" / "tool_calls" (OpenAI); "end_turn" / "max_tokens" /
// "stop_sequence" / "tool_use" (Anthropic).
std::string OpenAIFinish(const ChoiceState& c);
// The reply as an OpenAI chat message (assistant, with tool_calls), for the
// Responses store.
nlohmann::ordered_json ReplyAsMessage(const ChoiceState& c);
std::string AnthropicStop(const ChoiceState& c);

}  // namespace lumen::serve
