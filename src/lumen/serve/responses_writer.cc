// OpenAI Responses API: the response object and its streaming events
// (response.created, response.in_progress, response.output_item.added,
// response.content_part.added, response.output_text.delta,
// response.output_text.done, response.content_part.done,
// response.output_item.done, function_call_arguments.delta/done,
// response.completed, or response.incomplete when max_output_tokens cut
// it), each with a sequence_number.
#include "lumen/serve/protocol.h"

namespace lumen::serve {

using ojson = nlohmann::ordered_json;

namespace {

class ResponsesWriter : public ProtocolWriter {
 public:
  using ProtocolWriter::ProtocolWriter;

  std::string StreamStart() override {
    std::string out =
        Event("response.created", {{"response", Response("in_progress", ojson::array())}});
    out += Event("response.in_progress", {{"response", Response("in_progress", ojson::array())}});
    if (!tools()) out += OpenText();
    return out;
  }

  std::string StreamEnd() override {
    const ChoiceState& c = choices_[0];
    if (!c.error.empty()) return "";
    return Event(Incomplete(c) ? "response.incomplete" : "response.completed",
                 {{"response", Body()}});
  }

  ojson Body() override {
    const ChoiceState& c = choices_[0];
    const bool incomplete = Incomplete(c);
    ojson r = Response(incomplete ? "incomplete" : "completed", Output(c));
    if (incomplete) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
    r["output_text"] = c.reply.content;
    r["usage"] = {{"input_tokens", c.prompt_tokens},
                  {"input_tokens_details", {{"cached_tokens", c.cached_tokens}}},
                  {"output_tokens", c.completion_tokens},
                  {"output_tokens_details", {{"reasoning_tokens", 0}}},
                  {"total_tokens", c.prompt_tokens + c.completion_tokens}};
    return r;
  }

  // The reply as chat messages, for the response store.
  static ojson AsMessages(const ChoiceState& c) {
    ojson m = {{"role", "assistant"}, {"content", c.reply.content}};
    if (!c.reply.calls.empty()) {
      m["tool_calls"] = ojson::array();
      for (const auto& call : c.reply.calls)
        m["tool_calls"].push_back(
            {{"id", call.id},
             {"type", "function"},
             {"function",
              {{"name", call.name}, {"arguments", ToolArgumentsJson(call.arguments)}}}});
    }
    return m;
  }

 protected:
  std::string OnText(int, const std::string& text, const engine::GeneratedToken*) override {
    if (forced()) return CallEvents(ForcedDelta(0, false));
    if (tools() || text.empty()) return "";
    return Event(
        "response.output_text.delta",
        {{"item_id", MsgId()}, {"output_index", 0}, {"content_index", 0}, {"delta", text}});
  }

  std::string OnDone(int) override {
    const ChoiceState& c = choices_[0];
    if (!c.error.empty()) {
      ojson r = Response("failed", ojson::array());
      r["error"] = {{"code", "server_error"}, {"message", c.error}};
      return Event("response.failed", {{"response", r}});
    }
    std::string out;
    int index = 0;
    if (forced()) {
      // The function_call item was added with its name and streamed its
      // arguments; close it.
      out += CallEvents(ForcedDelta(0, true));
      const ToolCall& call = c.reply.calls[0];
      const ojson item = CallItem(call, 0);
      out += Event("response.function_call_arguments.done",
                   {{"item_id", item["id"]}, {"output_index", 0}, {"arguments", call.arguments}});
      return out + Event("response.output_item.done", {{"output_index", 0}, {"item", item}});
    }
    if (!tools() || !c.reply.content.empty()) {
      if (tools()) out += OpenText();
      if (tools())
        out += Event("response.output_text.delta", {{"item_id", MsgId()},
                                                    {"output_index", 0},
                                                    {"content_index", 0},
                                                    {"delta", c.reply.content}});
      out += Event("response.output_text.done", {{"item_id", MsgId()},
                                                 {"output_index", 0},
                                                 {"content_index", 0},
                                                 {"text", c.reply.content}});
      out += Event("response.content_part.done", {{"item_id", MsgId()},
                                                  {"output_index", 0},
                                                  {"content_index", 0},
                                                  {"part", TextPart(c.reply.content)}});
      out += Event("response.output_item.done",
                   {{"output_index", 0}, {"item", MessageItem(c.reply.content, Done(c))}});
      index = 1;
    }
    for (size_t i = 0; i < c.reply.calls.size(); ++i, ++index) {
      const ToolCall& call = c.reply.calls[i];
      ojson item = CallItem(call, i);
      item["status"] = "in_progress";
      item["arguments"] = "";
      out += Event("response.output_item.added", {{"output_index", index}, {"item", item}});
      out += Event("response.function_call_arguments.delta",
                   {{"item_id", item["id"]}, {"output_index", index}, {"delta", call.arguments}});
      out +=
          Event("response.function_call_arguments.done",
                {{"item_id", item["id"]}, {"output_index", index}, {"arguments", call.arguments}});
      out += Event("response.output_item.done",
                   {{"output_index", index}, {"item", CallItem(call, i)}});
    }
    return out;
  }

 private:
  std::string CallEvents(const CallDelta& d) {
    std::string out;
    const std::string item_id = "fc_" + x_.id.substr(5) + "_0";
    if (d.name_ready) {
      ToolCall call{CallIdPrefix() + "0", d.name, ""};
      ojson item = CallItem(call, 0);
      item["status"] = "in_progress";
      out += Event("response.output_item.added", {{"output_index", 0}, {"item", item}});
    }
    if (!d.args.empty())
      out += Event("response.function_call_arguments.delta",
                   {{"item_id", item_id}, {"output_index", 0}, {"delta", d.args}});
    return out;
  }
  std::string Event(const std::string& type, ojson data) {
    ojson j = {{"type", type}, {"sequence_number", seq_++}};
    for (auto it = data.begin(); it != data.end(); ++it) j[it.key()] = it.value();
    return SseEvent(type, j);
  }
  std::string OpenText() {
    std::string out = Event("response.output_item.added",
                            {{"output_index", 0}, {"item", MessageItem("", "in_progress")}});
    return out + Event("response.content_part.added", {{"item_id", MsgId()},
                                                       {"output_index", 0},
                                                       {"content_index", 0},
                                                       {"part", TextPart("")}});
  }
  std::string MsgId() const { return "msg_" + x_.id.substr(5); }
  static ojson TextPart(const std::string& text) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}};
  }
  // Cut by max_output_tokens (or the context): the response is "incomplete",
  // and so is its message item, as OpenAI marks them.
  static bool Incomplete(const ChoiceState& c) {
    return (c.finish == engine::FinishReason::kLength ||
            c.finish == engine::FinishReason::kContext) &&
           (c.reply.calls.empty() || c.reply.truncated);
  }
  static const char* Done(const ChoiceState& c) {
    return Incomplete(c) ? "incomplete" : "completed";
  }
  ojson MessageItem(const std::string& text, const char* status) const {
    ojson content = ojson::array();
    if (std::string(status) != "in_progress") content.push_back(TextPart(text));
    return {{"type", "message"},
            {"id", MsgId()},
            {"status", status},
            {"role", "assistant"},
            {"content", content}};
  }
  ojson CallItem(const ToolCall& call, size_t i) const {
    const bool cut = choices_[0].reply.truncated;
    return {
        {"type", "function_call"},     {"id", "fc_" + x_.id.substr(5) + "_" + std::to_string(i)},
        {"call_id", call.id},          {"name", call.name},
        {"arguments", call.arguments}, {"status", cut ? "incomplete" : "completed"}};
  }
  ojson Output(const ChoiceState& c) const {
    ojson out = ojson::array();
    if (!c.reply.content.empty() || c.reply.calls.empty())
      out.push_back(MessageItem(c.reply.content, Done(c)));
    for (size_t i = 0; i < c.reply.calls.size(); ++i) out.push_back(CallItem(c.reply.calls[i], i));
    return out;
  }
  ojson Response(const char* status, ojson output) const {
    ojson tools = ojson::array();
    if (x_.req.tools.is_array())
      for (const auto& t : x_.req.tools) {
        ojson f = {{"type", "function"}, {"name", t["function"]["name"]}};
        if (t["function"].contains("description")) f["description"] = t["function"]["description"];
        f["parameters"] = t["function"].value("parameters", ojson::object());
        f["strict"] = false;
        tools.push_back(f);
      }
    return {{"id", x_.id},
            {"object", "response"},
            {"created_at", x_.created},
            {"status", status},
            {"error", nullptr},
            {"incomplete_details", nullptr},
            {"instructions", x_.req.instructions ? ojson(*x_.req.instructions) : ojson()},
            {"max_output_tokens", x_.req.max_tokens ? ojson(*x_.req.max_tokens) : ojson()},
            {"model", x_.model},
            {"output", std::move(output)},
            {"parallel_tool_calls", true},
            {"previous_response_id",
             x_.previous_response_id.empty() ? ojson() : ojson(x_.previous_response_id)},
            {"store", x_.req.store},
            {"temperature", x_.prep.sampler.temperature},
            {"top_p", x_.prep.sampler.top_p},
            {"text", {{"format", TextFormat()}}},
            {"tool_choice", x_.req.tool_choice_named
                                ? ojson{{"type", "function"}, {"name", x_.req.tool_choice}}
                                : ojson(x_.req.tool_choice)},
            {"tools", tools},
            {"truncation", "disabled"},
            {"usage", nullptr},
            {"metadata", ojson::object()}};
  }
  ojson TextFormat() const {
    ojson f = {{"type", x_.req.response_format}};
    if (x_.req.response_format == "json_schema") {
      f["name"] = x_.req.json_schema_name;
      f["schema"] = x_.req.json_schema;
      f["strict"] = x_.req.json_schema_strict;
    }
    return f;
  }
  int64_t seq_ = 0;
};

}  // namespace

std::unique_ptr<ProtocolWriter> MakeResponsesWriter(ExchangeInfo info) {
  return std::make_unique<ResponsesWriter>(std::move(info));
}

nlohmann::ordered_json ReplyAsMessage(const ChoiceState& c) {
  return ResponsesWriter::AsMessages(c);
}

}  // namespace lumen::serve
