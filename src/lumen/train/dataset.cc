#include "lumen/train/dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lumen/engine/chat.h"

namespace lumen::train {

namespace {
using json = nlohmann::ordered_json;

constexpr std::string_view kKindNames[] = {"messages", "prompt/completion", "text", "preference"};

Result<RowKind> DetectKind(const json& row) {
  if (!row.is_object()) return Error("a row must be a JSON object");
  if (row.contains("chosen") || row.contains("rejected")) return RowKind::kPreference;
  if (row.contains("messages")) return RowKind::kMessages;
  if (row.contains("completion")) return RowKind::kPromptCompletion;
  if (row.contains("text")) return RowKind::kText;
  return Error(
      "unknown row shape: expected \"messages\", \"prompt\"+\"completion\", \"text\" or "
      "\"prompt\"+\"chosen\"+\"rejected\"");
}

size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

struct Tokenizing {
  const engine::Model& model;
  const engine::ChatFormatter& chat;

  Result<std::vector<int32_t>> Render(const json& messages, bool add_generation_prompt) const {
    LUMEN_ASSIGN_OR_RETURN(std::string text,
                           chat.Render(messages, json(), add_generation_prompt, json::object()));
    return model.tokenizer().Encode(text, /*add_special=*/false);
  }

  Status CheckMessages(const json& m, const char* field) const {
    if (!m.is_array() || m.empty()) return Errorf("\"{}\" must be a non-empty message list", field);
    for (const auto& msg : m)
      if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string() ||
          !msg.contains("content"))
        return Errorf("\"{}\": every message needs a string \"role\" and a \"content\"", field);
    return Status::Ok();
  }

  // Splits a full sequence at the prompt: prompt tokens, then response.
  static void Split(const std::vector<int32_t>& prompt, std::vector<int32_t> full,
                    std::vector<int32_t>& p_out, std::vector<int32_t>& r_out) {
    const size_t n = CommonPrefix(prompt, full);
    p_out.assign(full.begin(), full.begin() + n);
    r_out.assign(full.begin() + n, full.end());
  }

  // prompt (string or messages) + response (string or messages) -> tokens.
  Status PromptResponse(const json& prompt, const json& response, const char* field,
                        std::vector<int32_t>& p_out, std::vector<int32_t>& r_out) const {
    const auto& tok = model.tokenizer();
    if (prompt.is_string() && response.is_string()) {
      const std::string p = prompt.get<std::string>();
      std::vector<int32_t> pt = tok.Encode(p, true);
      std::vector<int32_t> full = tok.Encode(p + response.get<std::string>(), true);
      if (tok.eos() >= 0) full.push_back(tok.eos());
      Split(pt, std::move(full), p_out, r_out);
      return Status::Ok();
    }
    json pm = prompt;
    if (pm.is_string()) pm = json::array({{{"role", "user"}, {"content", pm}}});
    LUMEN_RETURN_IF_ERROR(CheckMessages(pm, "prompt"));
    json rm = response;
    if (rm.is_string()) rm = json::array({{{"role", "assistant"}, {"content", rm}}});
    LUMEN_RETURN_IF_ERROR(CheckMessages(rm, field));
    json all = pm;
    for (const auto& m : rm) all.push_back(m);
    LUMEN_ASSIGN_OR_RETURN(auto pt, Render(pm, true));
    LUMEN_ASSIGN_OR_RETURN(auto full, Render(all, false));
    Split(pt, std::move(full), p_out, r_out);
    return Status::Ok();
  }

  Status Row(RowKind kind, const json& row, Example& ex) const {
    const auto& tok = model.tokenizer();
    auto need_string = [&](const char* k) -> Status {
      if (!row.contains(k) || !row[k].is_string()) return Errorf("\"{}\" must be a string", k);
      return Status::Ok();
    };
    switch (kind) {
      case RowKind::kText: {
        LUMEN_RETURN_IF_ERROR(need_string("text"));
        std::vector<int32_t> all = tok.Encode(row["text"].get<std::string>(), true);
        if (tok.eos() >= 0) all.push_back(tok.eos());
        if (all.size() < 2) return Error("\"text\" is empty");
        ex.prompt.assign(all.begin(), all.begin() + 1);
        ex.chosen.assign(all.begin() + 1, all.end());
        break;
      }
      case RowKind::kPromptCompletion:
        LUMEN_RETURN_IF_ERROR(need_string("prompt"));
        LUMEN_RETURN_IF_ERROR(need_string("completion"));
        LUMEN_RETURN_IF_ERROR(
            PromptResponse(row["prompt"], row["completion"], "completion", ex.prompt, ex.chosen));
        break;
      case RowKind::kMessages: {
        const json& m = row.contains("messages") ? row["messages"] : json();
        LUMEN_RETURN_IF_ERROR(CheckMessages(m, "messages"));
        if (m.back()["role"] != "assistant")
          return Error("the last message must be the assistant turn to learn (role \"assistant\")");
        json head = json::array();
        for (size_t i = 0; i + 1 < m.size(); ++i) head.push_back(m[i]);
        if (head.empty()) return Error("a chat row needs at least one turn before the assistant's");
        LUMEN_ASSIGN_OR_RETURN(auto pt, Render(head, true));
        LUMEN_ASSIGN_OR_RETURN(auto full, Render(m, false));
        Split(pt, std::move(full), ex.prompt, ex.chosen);
        break;
      }
      case RowKind::kPreference: {
        for (const char* k : {"prompt", "chosen", "rejected"})
          if (!row.contains(k) || !(row[k].is_string() || row[k].is_array()))
            return Errorf("\"{}\" must be a string or a message list", k);
        std::vector<int32_t> p2;
        LUMEN_RETURN_IF_ERROR(
            PromptResponse(row["prompt"], row["chosen"], "chosen", ex.prompt, ex.chosen));
        LUMEN_RETURN_IF_ERROR(
            PromptResponse(row["prompt"], row["rejected"], "rejected", p2, ex.rejected));
        // The two prompts may split differently at the boundary: keep the
        // shorter common prefix as the prompt and move the rest to responses.
        const size_t n = CommonPrefix(ex.prompt, p2);
        ex.chosen.insert(ex.chosen.begin(), ex.prompt.begin() + n, ex.prompt.end());
        ex.rejected.insert(ex.rejected.begin(), p2.begin() + n, p2.end());
        ex.prompt.resize(n);
        if (ex.rejected.empty()) return Error("\"rejected\" has no tokens after the prompt");
        break;
      }
    }
    if (ex.chosen.empty()) return Error("the response has no tokens after the prompt");
    if (ex.prompt.empty()) {  // scored tokens are predicted from a previous one
      ex.prompt.push_back(ex.chosen.front());
      ex.chosen.erase(ex.chosen.begin());
      if (!ex.rejected.empty()) ex.rejected.erase(ex.rejected.begin());
      if (ex.chosen.empty()) return Error("the response is a single token with no prompt");
    }
    return Status::Ok();
  }
};

// Cuts prompt + response to max tokens (response tail first, then the
// prompt's head, always keeping one response token). True if anything went.
bool Truncate(std::vector<int32_t>& prompt, std::vector<int32_t>& resp, int64_t max) {
  if (resp.empty() || int64_t(prompt.size() + resp.size()) <= max) return false;
  const int64_t keep_resp = std::max<int64_t>(1, max - int64_t(prompt.size()));
  if (int64_t(resp.size()) > keep_resp) resp.resize(keep_resp);
  const int64_t extra = int64_t(prompt.size() + resp.size()) - max;
  if (extra > 0)
    prompt.erase(prompt.begin(),
                 prompt.begin() + std::min<int64_t>(extra, int64_t(prompt.size()) - 1));
  return true;
}
}  // namespace

std::string_view RowKindName(RowKind k) { return kKindNames[int(k)]; }

Result<Dataset> LoadJsonl(const std::string& path, const engine::Model& model,
                          const DatasetOptions& opts) {
  if (opts.max_seq_len < 2) return Errorf("--max-seq-len {}: must be at least 2", opts.max_seq_len);
  std::ifstream f(path);
  if (!f) return Errorf("{}: cannot open", path);
  LUMEN_ASSIGN_OR_RETURN(auto chat, engine::ChatFormatter::Create(model));
  const Tokenizing tz{model, chat};
  Dataset d;
  d.path = path;
  std::string line;
  int lineno = 0;
  bool have_kind = false;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto fail = [&](const Status& s) -> Status {
      if (opts.skip_bad_rows) {
        ++d.skipped;
        return Status::Ok();
      }
      return Errorf("{}:{}: {} (fix the row or pass --skip-bad-rows)", path, lineno, s.message());
    };
    json row = json::parse(line, nullptr, false);
    if (row.is_discarded()) {
      LUMEN_RETURN_IF_ERROR(fail(Error("not valid JSON")));
      continue;
    }
    auto kind = DetectKind(row);
    if (!kind.ok()) {
      LUMEN_RETURN_IF_ERROR(fail(kind.status()));
      continue;
    }
    if (!have_kind) {
      d.kind = *kind;
      have_kind = true;
    } else if (*kind != d.kind) {
      LUMEN_RETURN_IF_ERROR(
          fail(Errorf("a {} row in a file of {} rows", RowKindName(*kind), RowKindName(d.kind))));
      continue;
    }
    Example ex;
    ex.line = lineno;
    Status s = tz.Row(d.kind, row, ex);
    if (!s.ok()) {
      LUMEN_RETURN_IF_ERROR(fail(s));
      continue;
    }
    bool cut = false;
    if (d.kind == RowKind::kPreference) {
      std::vector<int32_t> p2 = ex.prompt;
      cut = Truncate(ex.prompt, ex.chosen, opts.max_seq_len);
      cut |= Truncate(p2, ex.rejected, opts.max_seq_len);
      if (p2.size() != ex.prompt.size()) {  // keep one shared prompt: the shorter
        const size_t n = std::min(p2.size(), ex.prompt.size());
        ex.prompt.erase(ex.prompt.begin(), ex.prompt.end() - n);
      }
    } else {
      cut = Truncate(ex.prompt, ex.chosen, opts.max_seq_len);
    }
    d.truncated += cut;
    d.rows.push_back(std::move(ex));
  }
  if (d.rows.empty())
    return Errorf("{}: no usable rows{}", path,
                  d.skipped ? fmt::format(" ({} skipped as bad)", d.skipped) : "");
  return d;
}

Result<std::string> InspectData(const std::string& dir, const engine::Model& model,
                                const DatasetOptions& opts) {
  std::string out;
  DatasetOptions unlimited = opts;
  unlimited.max_seq_len = int64_t(1) << 40;
  for (const char* name : {"train.jsonl", "valid.jsonl"}) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    if (!std::filesystem::exists(path)) {
      if (std::string(name) == "train.jsonl") return Errorf("{}: no train.jsonl", dir);
      out += fmt::format("{}: absent\n", name);
      continue;
    }
    LUMEN_ASSIGN_OR_RETURN(Dataset d, LoadJsonl(path, model, unlimited));
    std::vector<int64_t> lens;
    int64_t over = 0;
    for (const auto& e : d.rows) {
      const int64_t n = int64_t(e.prompt.size() + std::max(e.chosen.size(), e.rejected.size()));
      lens.push_back(n);
      over += n > opts.max_seq_len;
    }
    std::sort(lens.begin(), lens.end());
    double mean = 0;
    for (int64_t n : lens) mean += double(n) / double(lens.size());
    out += fmt::format(
        "{}: {} rows, kind {}, tokens per row min {} mean {:.1f} p95 {} max {}; {} rows longer "
        "than --max-seq-len {}{}\n",
        name, d.rows.size(), RowKindName(d.kind), lens.front(), mean,
        lens[std::min(lens.size() - 1, size_t(double(lens.size()) * 0.95))], lens.back(), over,
        opts.max_seq_len, d.skipped ? fmt::format("; {} bad rows skipped", d.skipped) : "");
  }
  return out;
}

}  // namespace lumen::train
