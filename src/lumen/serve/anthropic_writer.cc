// Anthropic message body and the messages streaming event grammar:
// message_start, content_block_start, ping, content_block_delta (text_delta /
// input_json_delta), content_block_stop, message_delta, message_stop.
#include "lumen/serve/protocol.h"

namespace lumen::serve {

using ojson = nlohmann::ordered_json;

namespace {

class MessagesWriter : public ProtocolWriter {
 public:
  using ProtocolWriter::ProtocolWriter;

  std::string StreamStart() override {
    ojson msg = Message(ojson::array(), nullptr, nullptr);
    msg["usage"] = {{"input_tokens", x_.prep.prompt.size()}, {"output_tokens", 0}};
    std::string out = SseEvent("message_start", {{"type", "message_start"}, {"message", msg}});
    if (!tools()) {
      out += BlockStart(0, {{"type", "text"}, {"text", ""}});
      text_open_ = true;
    }
    return out + SseEvent("ping", {{"type", "ping"}});
  }

  std::string StreamEnd() override { return SseEvent("message_stop", {{"type", "message_stop"}}); }

  ojson Body() override {
    const ChoiceState& c = choices_[0];
    return Message(Content(c), AnthropicStop(c),
                   c.stop_matched.empty() ? ojson() : ojson(c.stop_matched));
  }

 protected:
  std::string OnText(int, const std::string& text, const engine::GeneratedToken*) override {
    if (forced()) return CallEvents(ForcedDelta(0, false));
    if (tools() || text.empty()) return "";
    return SseEvent("content_block_delta", {{"type", "content_block_delta"},
                                            {"index", 0},
                                            {"delta", {{"type", "text_delta"}, {"text", text}}}});
  }

  std::string OnDone(int) override {
    const ChoiceState& c = choices_[0];
    if (!c.error.empty())
      return SseEvent(
          "error", {{"type", "error"}, {"error", {{"type", "api_error"}, {"message", c.error}}}});
    std::string out;
    int index = 0;
    if (forced()) {
      // The tool_use block opened with its name and streamed its input.
      out += CallEvents(ForcedDelta(0, true));
      out += SseEvent("content_block_stop", {{"type", "content_block_stop"}, {"index", 0}});
      return out + MessageDelta(c);
    }
    if (text_open_) {
      out += SseEvent("content_block_stop", {{"type", "content_block_stop"}, {"index", 0}});
      index = 1;
    } else if (!c.reply.content.empty() || c.reply.calls.empty()) {
      // Text, or nothing at all: the body then holds one empty text block,
      // and so does the stream.
      out += BlockStart(0, {{"type", "text"}, {"text", ""}});
      if (!c.reply.content.empty())
        out += SseEvent("content_block_delta",
                        {{"type", "content_block_delta"},
                         {"index", 0},
                         {"delta", {{"type", "text_delta"}, {"text", c.reply.content}}}});
      out += SseEvent("content_block_stop", {{"type", "content_block_stop"}, {"index", 0}});
      index = 1;
    }
    for (const auto& call : c.reply.calls) {
      out += BlockStart(
          index,
          {{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", ojson::object()}});
      out +=
          SseEvent("content_block_delta",
                   {{"type", "content_block_delta"},
                    {"index", index},
                    {"delta", {{"type", "input_json_delta"}, {"partial_json", call.arguments}}}});
      out += SseEvent("content_block_stop", {{"type", "content_block_stop"}, {"index", index}});
      ++index;
    }
    return out + MessageDelta(c);
  }

 private:
  std::string MessageDelta(const ChoiceState& c) {
    return SseEvent(
        "message_delta",
        {{"type", "message_delta"},
         {"delta",
          {{"stop_reason", AnthropicStop(c)},
           {"stop_sequence", c.stop_matched.empty() ? ojson() : ojson(c.stop_matched)}}},
         {"usage", Usage(c)}});
  }
  // Anthropic's input_tokens leave out cache reads. message_start goes out
  // before the prompt cache is looked up, so it counts the whole prompt;
  // message_delta's usage is cumulative and carries the final counts, the
  // non-streaming body's.
  static ojson Usage(const ChoiceState& c) {
    return {{"input_tokens", c.prompt_tokens - c.cached_tokens},
            {"cache_read_input_tokens", c.cached_tokens},
            {"cache_creation_input_tokens", 0},
            {"output_tokens", c.completion_tokens}};
  }
  std::string CallEvents(const CallDelta& d) {
    std::string out;
    if (d.name_ready)
      out += BlockStart(0, {{"type", "tool_use"},
                            {"id", CallIdPrefix() + "0"},
                            {"name", d.name},
                            {"input", ojson::object()}});
    if (!d.args.empty())
      out += SseEvent("content_block_delta",
                      {{"type", "content_block_delta"},
                       {"index", 0},
                       {"delta", {{"type", "input_json_delta"}, {"partial_json", d.args}}}});
    return out;
  }
  std::string BlockStart(int index, ojson block) {
    return SseEvent(
        "content_block_start",
        {{"type", "content_block_start"}, {"index", index}, {"content_block", std::move(block)}});
  }
  ojson Content(const ChoiceState& c) const {
    ojson content = ojson::array();
    if (!c.reply.content.empty() || c.reply.calls.empty())
      content.push_back({{"type", "text"}, {"text", c.reply.content}});
    for (const auto& call : c.reply.calls)
      content.push_back({{"type", "tool_use"},
                         {"id", call.id},
                         {"name", call.name},
                         {"input", InputOf(call.arguments)}});
    return content;
  }
  // Arguments cut by max_tokens are no object yet: the block's input is {}.
  static ojson InputOf(const std::string& arguments) {
    ojson j = ojson::parse(arguments, nullptr, false);
    return j.is_object() ? j : ojson::object();
  }
  ojson Message(ojson content, ojson stop_reason, ojson stop_sequence) const {
    const ChoiceState& c = choices_[0];
    return {{"id", x_.id},
            {"type", "message"},
            {"role", "assistant"},
            {"model", x_.model},
            {"content", std::move(content)},
            {"stop_reason", std::move(stop_reason)},
            {"stop_sequence", std::move(stop_sequence)},
            {"usage", Usage(c)}};
  }
  bool text_open_ = false;
};

}  // namespace

std::unique_ptr<ProtocolWriter> MakeMessagesWriter(ExchangeInfo info) {
  return std::make_unique<MessagesWriter>(std::move(info));
}

}  // namespace lumen::serve
