// OpenAI chat.completion(.chunk) and text_completion bodies and SSE chunks.
#include "lumen/serve/protocol.h"

#include <utility>

namespace lumen::serve {

using ojson = nlohmann::ordered_json;

namespace {

ojson ToolCallsJson(const ParsedReply& r, bool with_index) {
  ojson a = ojson::array();
  for (size_t i = 0; i < r.calls.size(); ++i) {
    ojson c = ojson::object();
    if (with_index) c["index"] = i;
    c["id"] = r.calls[i].id;
    c["type"] = "function";
    c["function"] = {{"name", r.calls[i].name}, {"arguments", r.calls[i].arguments}};
    a.push_back(c);
  }
  return a;
}

class ChatWriter : public ProtocolWriter {
 public:
  using ProtocolWriter::ProtocolWriter;

  std::string StreamStart() override {
    std::string out;
    for (int i = 0; i < x_.req.n; ++i)
      out += Chunk(i, {{"role", "assistant"}, {"content", ""}}, ojson(), ojson());
    return out;
  }

  std::string StreamEnd() override {
    std::string out;
    if (x_.req.include_usage) {
      ojson j = Base();
      j["choices"] = ojson::array();
      j["usage"] = Usage();
      out += Sse(j);
    }
    return out + "data: [DONE]\n\n";
  }

  ojson Body() override {
    ojson j = {{"id", x_.id},
               {"object", "chat.completion"},
               {"created", x_.created},
               {"model", x_.model},
               {"system_fingerprint", "lumen"}};
    ojson cs = ojson::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const ChoiceState& c = choices_[i];
      ojson msg = {
          {"role", "assistant"},
          {"content",
           c.reply.calls.empty() || !c.reply.content.empty() ? ojson(c.reply.content) : ojson()}};
      if (!c.reply.calls.empty()) msg["tool_calls"] = ToolCallsJson(c.reply, false);
      ojson lp;
      if (x_.req.logprobs) {
        lp = {{"content", ojson::array()}};
        for (const auto& t : c.tokens) lp["content"].push_back(LogprobEntry(t));
      }
      cs.push_back(
          {{"index", i}, {"message", msg}, {"logprobs", lp}, {"finish_reason", OpenAIFinish(c)}});
    }
    j["choices"] = cs;
    j["usage"] = Usage();
    return j;
  }

 protected:
  std::string OnText(int index, const std::string& text,
                     const engine::GeneratedToken* tok) override {
    if (forced()) return CallChunks(index, ForcedDelta(index, false));
    if (tools()) return "";  // held until done (tool-call parsing)
    if (text.empty() && !(tok && x_.req.logprobs)) return "";
    ojson lp;
    if (tok && x_.req.logprobs) lp = {{"content", ojson::array({LogprobEntry(*tok)})}};
    return Chunk(index, {{"content", text}}, lp, ojson());
  }

  std::string OnDone(int index) override {
    const ChoiceState& c = choices_[index];
    std::string out;
    if (!c.error.empty()) {
      ojson err = {{"error",
                    {{"message", c.error},
                     {"type", "server_error"},
                     {"param", nullptr},
                     {"code", nullptr}}}};
      return Sse(err);
    }
    // With tools offered the text is held (parsed for calls at the end) or
    // streamed as call pieces, and no chunk carried logprobs: they all go
    // with the first chunk sent here, so the stream holds the body's.
    ojson lp;
    if ((forced() || tools()) && x_.req.logprobs) {
      lp = {{"content", ojson::array()}};
      for (const auto& t : c.tokens) lp["content"].push_back(LogprobEntry(t));
    }
    if (forced()) {
      out += CallChunks(index, ForcedDelta(index, true));
    } else if (tools()) {
      if (!c.reply.content.empty())
        out += Chunk(index, {{"content", c.reply.content}}, std::exchange(lp, ojson()), ojson());
      if (!c.reply.calls.empty())
        out += Chunk(index, {{"tool_calls", ToolCallsJson(c.reply, true)}},
                     std::exchange(lp, ojson()), ojson());
    }
    return out + Chunk(index, ojson::object(), std::move(lp), OpenAIFinish(c));
  }

 private:
  // A forced call as OpenAI streams one: the first delta holds index, id,
  // type and name with empty arguments; later ones only argument pieces.
  std::string CallChunks(int index, const CallDelta& d) const {
    std::string out;
    if (d.name_ready)
      out += Chunk(
          index,
          {{"tool_calls", ojson::array({{{"index", 0},
                                         {"id", CallIdPrefix() + "0"},
                                         {"type", "function"},
                                         {"function", {{"name", d.name}, {"arguments", ""}}}}})}},
          ojson(), ojson());
    if (!d.args.empty())
      out += Chunk(
          index,
          {{"tool_calls", ojson::array({{{"index", 0}, {"function", {{"arguments", d.args}}}}})}},
          ojson(), ojson());
    return out;
  }
  ojson Base() const {
    ojson j = {{"id", x_.id},
               {"object", "chat.completion.chunk"},
               {"created", x_.created},
               {"model", x_.model},
               {"system_fingerprint", "lumen"}};
    return j;
  }
  std::string Chunk(int index, ojson delta, ojson logprobs, ojson finish) const {
    ojson j = Base();
    j["choices"] = ojson::array({{{"index", index},
                                  {"delta", std::move(delta)},
                                  {"logprobs", std::move(logprobs)},
                                  {"finish_reason", std::move(finish)}}});
    if (x_.req.include_usage) j["usage"] = nullptr;
    return Sse(j);
  }
  ojson Usage() const {
    const int64_t p = choices_.empty() ? 0 : choices_[0].prompt_tokens;
    const int64_t cached = choices_.empty() ? 0 : choices_[0].cached_tokens;
    const int64_t c = completion_total();
    return {{"prompt_tokens", p},
            {"completion_tokens", c},
            {"total_tokens", p + c},
            {"prompt_tokens_details", {{"cached_tokens", cached}}},
            {"completion_tokens_details", {{"reasoning_tokens", 0}}}};
  }
};

class CompletionWriter : public ProtocolWriter {
 public:
  using ProtocolWriter::ProtocolWriter;

  std::string StreamStart() override {
    if (!x_.req.echo) return "";
    std::string out;
    for (int i = 0; i < x_.req.n; ++i) out += Chunk(i, x_.prep.prompt_text, ojson(), ojson());
    return out;
  }

  std::string StreamEnd() override {
    std::string out;
    if (x_.req.include_usage) {
      ojson j = Base();
      j["choices"] = ojson::array();
      j["usage"] = Usage();
      out += Sse(j);
    }
    return out + "data: [DONE]\n\n";
  }

  ojson Body() override {
    ojson j = Base();
    ojson cs = ojson::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const ChoiceState& c = choices_[i];
      ojson lp;
      if (x_.req.logprobs) {
        lp = {{"tokens", ojson::array()},
              {"token_logprobs", ojson::array()},
              {"top_logprobs", ojson::array()},
              {"text_offset", ojson::array()}};
        size_t off = x_.req.echo ? x_.prep.prompt_text.size() : 0;
        for (const auto& t : c.tokens) {
          ojson e = LogprobEntry(t);
          lp["tokens"].push_back(e["token"]);
          lp["token_logprobs"].push_back(e["logprob"]);
          ojson top = ojson::object();
          for (const auto& a : e["top_logprobs"]) top[a["token"].get<std::string>()] = a["logprob"];
          lp["top_logprobs"].push_back(top);
          lp["text_offset"].push_back(off);
          off += e["token"].get<std::string>().size();
        }
      }
      cs.push_back({{"text", (x_.req.echo ? x_.prep.prompt_text : std::string()) + c.text},
                    {"index", i},
                    {"logprobs", lp},
                    {"finish_reason", OpenAIFinish(c)}});
    }
    j["choices"] = cs;
    j["usage"] = Usage();
    return j;
  }

 protected:
  std::string OnText(int index, const std::string& text,
                     const engine::GeneratedToken* tok) override {
    if (text.empty() && !(tok && x_.req.logprobs)) return "";
    ojson lp;
    if (tok && x_.req.logprobs) {
      ojson e = LogprobEntry(*tok);
      ojson top = ojson::object();
      for (const auto& a : e["top_logprobs"]) top[a["token"].get<std::string>()] = a["logprob"];
      // The body's text_offset, counted the same way (bytes from the start
      // of the returned text, the prompt's first with echo).
      if (offsets_.empty())
        offsets_.assign(size_t(x_.req.n), x_.req.echo ? x_.prep.prompt_text.size() : 0);
      size_t& off = offsets_[size_t(index)];
      lp = {{"tokens", {e["token"]}},
            {"token_logprobs", {e["logprob"]}},
            {"top_logprobs", {top}},
            {"text_offset", {off}}};
      off += e["token"].get<std::string>().size();
    }
    return Chunk(index, text, lp, ojson());
  }

  std::string OnDone(int index) override {
    const ChoiceState& c = choices_[index];
    if (!c.error.empty())
      return Sse({{"error",
                   {{"message", c.error},
                    {"type", "server_error"},
                    {"param", nullptr},
                    {"code", nullptr}}}});
    return Chunk(index, "", ojson(), OpenAIFinish(c));
  }

 private:
  std::vector<size_t> offsets_;  // per choice: the next streamed token's text_offset
  ojson Base() const {
    return {
        {"id", x_.id}, {"object", "text_completion"}, {"created", x_.created}, {"model", x_.model}};
  }
  std::string Chunk(int index, const std::string& text, ojson lp, ojson finish) const {
    ojson j = Base();
    j["choices"] = ojson::array({{{"text", text},
                                  {"index", index},
                                  {"logprobs", std::move(lp)},
                                  {"finish_reason", std::move(finish)}}});
    if (x_.req.include_usage) j["usage"] = nullptr;
    return Sse(j);
  }
  ojson Usage() const {
    const int64_t p = choices_.empty() ? 0 : choices_[0].prompt_tokens;
    const int64_t cached = choices_.empty() ? 0 : choices_[0].cached_tokens;
    const int64_t c = completion_total();
    return {{"prompt_tokens", p},
            {"completion_tokens", c},
            {"total_tokens", p + c},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  }
};

}  // namespace

std::unique_ptr<ProtocolWriter> MakeChatWriter(ExchangeInfo info) {
  return std::make_unique<ChatWriter>(std::move(info));
}
std::unique_ptr<ProtocolWriter> MakeCompletionWriter(ExchangeInfo info) {
  return std::make_unique<CompletionWriter>(std::move(info));
}

}  // namespace lumen::serve
