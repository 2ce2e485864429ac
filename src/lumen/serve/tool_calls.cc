#include "lumen/serve/tool_calls.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace lumen::serve {

namespace {

using json = nlohmann::ordered_json;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool Allowed(const std::string& name, const std::vector<std::string>& names) {
  return !name.empty() &&
         (names.empty() || std::find(names.begin(), names.end(), name) != names.end());
}

// {"name": n, "arguments"|"parameters": {...} or "<json string>"} -> call.
bool CallFromJson(const json& j, const std::vector<std::string>& names, ToolCall* out) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  out->name = j["name"].get<std::string>();
  if (!Allowed(out->name, names)) return false;
  json args = json::object();
  for (const char* k : {"arguments", "parameters"}) {
    if (!j.contains(k)) continue;
    args = j[k];
    if (args.is_string()) {
      json parsed = json::parse(args.get<std::string>(), nullptr, false);
      if (parsed.is_discarded()) return false;
      args = parsed;
    }
    break;
  }
  if (!args.is_object()) return false;
  out->arguments = args.dump(-1, ' ', false, json::error_handler_t::replace);
  return true;
}

// Parses the JSON value starting at s (skipping leading spaces); returns the
// length consumed, 0 if none.
// Index of the bracket that closes the one at s[open] ('{' or '['), counting
// brackets outside JSON strings; npos when the text ends first.
size_t MatchingClose(std::string_view s, size_t open) {
  int depth = 0;
  bool in_str = false, esc = false;
  for (size_t k = open; k < s.size(); ++k) {
    const char c = s[k];
    if (in_str) {
      if (esc)
        esc = false;
      else if (c == '\\')
        esc = true;
      else if (c == '"')
        in_str = false;
      continue;
    }
    if (c == '"') {
      in_str = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return k;
    }
  }
  return std::string_view::npos;
}

size_t ParseJsonPrefix(std::string_view s, json* out) {
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  if (i == s.size() || (s[i] != '{' && s[i] != '[')) return 0;
  const size_t k = MatchingClose(s, i);
  if (k == std::string_view::npos) return 0;
  *out = json::parse(s.substr(i, k + 1 - i), nullptr, false);
  return out->is_discarded() ? 0 : k + 1;
}

bool ParseHermes(std::string_view text, const std::vector<std::string>& names, ParsedReply& r) {
  constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
  if (text.find(kOpen) == std::string_view::npos) return false;
  std::string content;
  std::vector<ToolCall> calls;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t open = text.find(kOpen, pos);
    if (open == std::string_view::npos) {
      content += text.substr(pos);
      break;
    }
    content += text.substr(pos, open - pos);
    const size_t body = open + kOpen.size();
    size_t close = text.find(kClose, body);
    std::string_view inner =
        text.substr(body, close == std::string_view::npos ? std::string_view::npos : close - body);
    json j = json::parse(Trim(inner), nullptr, false);
    ToolCall c;
    if (j.is_discarded() || !CallFromJson(j, names, &c)) return false;
    calls.push_back(std::move(c));
    pos = close == std::string_view::npos ? text.size() : close + kClose.size();
  }
  r.content = std::string(Trim(content));
  r.calls = std::move(calls);
  return true;
}

bool ParseMistral(std::string_view text, const std::vector<std::string>& names, ParsedReply& r) {
  constexpr std::string_view kTag = "[TOOL_CALLS]";
  const size_t at = text.find(kTag);
  if (at == std::string_view::npos) return false;
  std::string_view rest = text.substr(at + kTag.size());
  std::vector<ToolCall> calls;
  json j;
  if (size_t n = ParseJsonPrefix(rest, &j); n > 0) {
    if (j.is_object()) j = json::array({j});
    for (const auto& e : j) {
      ToolCall c;
      if (!CallFromJson(e, names, &c)) return false;
      calls.push_back(std::move(c));
    }
  } else {
    // name[ARGS]{...}, possibly repeated with [TOOL_CALLS] between.
    while (!rest.empty()) {
      const size_t args = rest.find("[ARGS]");
      if (args == std::string_view::npos) return false;
      ToolCall c;
      json call = {{"name", std::string(Trim(rest.substr(0, args)))}};
      std::string_view a = rest.substr(args + 6);
      size_t used = ParseJsonPrefix(a, &j);
      if (used == 0) return false;
      call["arguments"] = j;
      if (!CallFromJson(call, names, &c)) return false;
      calls.push_back(std::move(c));
      rest = Trim(a.substr(used));
      if (rest.starts_with(kTag))
        rest.remove_prefix(kTag.size());
      else if (!rest.empty())
        return false;
    }
  }
  if (calls.empty()) return false;
  r.content = std::string(Trim(text.substr(0, at)));
  r.calls = std::move(calls);
  return true;
}

bool ParseLlama3(std::string_view text, const std::vector<std::string>& names, ParsedReply& r) {
  std::string_view t = Trim(text);
  if (t.starts_with("<|python_tag|>")) t = Trim(t.substr(14));
  if (t.empty() || t.front() != '{') return false;
  std::vector<ToolCall> calls;
  while (!t.empty()) {
    json j;
    const size_t used = ParseJsonPrefix(t, &j);
    ToolCall c;
    if (used == 0 || !CallFromJson(j, names, &c)) return false;
    calls.push_back(std::move(c));
    t = Trim(t.substr(used));
    if (t.starts_with(";"))
      t = Trim(t.substr(1));
    else if (!t.empty())
      return false;
  }
  r.content.clear();
  r.calls = std::move(calls);
  return true;
}

}  // namespace

ParsedReply ParseToolCalls(std::string_view text, const std::vector<std::string>& tool_names,
                           std::string_view id_prefix) {
  ParsedReply r;
  if (!ParseHermes(text, tool_names, r) && !ParseMistral(text, tool_names, r) &&
      !ParseLlama3(text, tool_names, r)) {
    r.content = std::string(text);
    r.calls.clear();
  }
  for (size_t i = 0; i < r.calls.size(); ++i) r.calls[i].id = fmt::format("{}{}", id_prefix, i);
  return r;
}

ToolFormat DetectToolFormat(std::string_view rendered, std::string_view source) {
  auto has = [](std::string_view t, std::string_view m) { return t.find(m) != t.npos; };
  // The rendering shows the call itself; "parameters" there is the Llama 3
  // argument key (the probe renders no tool list that could hold the word).
  if (has(rendered, "<tool_call>")) return ToolFormat::kHermes;
  if (has(rendered, "[TOOL_CALLS]")) return ToolFormat::kMistral;
  if (has(rendered, "<|python_tag|>") || has(rendered, "\"parameters\""))
    return ToolFormat::kLlama3;
  if (has(source, "<tool_call>")) return ToolFormat::kHermes;
  if (has(source, "[TOOL_CALLS]")) return ToolFormat::kMistral;
  if (has(source, "<|python_tag|>")) return ToolFormat::kLlama3;
  return ToolFormat::kHermes;
}

std::string_view ToolFormatName(ToolFormat f) {
  switch (f) {
    case ToolFormat::kLlama3:
      return "llama3";
    case ToolFormat::kMistral:
      return "mistral";
    default:
      return "hermes";
  }
}

std::vector<engine::GrammarSegment> ToolCallGrammar(ToolFormat f,
                                                    const std::vector<std::string>& names) {
  using G = engine::GrammarSegment;
  std::vector<std::string> options;
  options.reserve(names.size());
  for (const auto& n : names) options.push_back(n + "\"");
  const char* open = "<tool_call>\n{\"name\": \"";
  const char* key = ", \"arguments\":";
  const char* close = "}\n</tool_call>";
  if (f == ToolFormat::kLlama3) {
    open = "{\"name\": \"";
    key = ", \"parameters\":";
    close = "}";
  } else if (f == ToolFormat::kMistral) {
    open = "[TOOL_CALLS] [{\"name\": \"";
    close = "}]";
  }
  return {G::Literal(open), G::OneOf(std::move(options)), G::Literal(key), G::JsonObject(),
          G::Literal(close)};
}

ForcedCall ScanForcedCall(std::string_view text) {
  ForcedCall fc;
  auto skip_ws = [&](size_t i) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    return i;
  };
  size_t i = text.find("\"name\"");
  if (i == text.npos) return fc;
  i = skip_ws(i + 6);
  if (i >= text.size() || text[i] != ':') return fc;
  i = skip_ws(i + 1);
  if (i >= text.size() || text[i] != '"') return fc;
  const size_t name_end = text.find('"', i + 1);
  if (name_end == text.npos) {
    fc.name = std::string(text.substr(i + 1));
    return fc;
  }
  fc.name = std::string(text.substr(i + 1, name_end - i - 1));
  fc.name_done = true;
  i = name_end + 1;
  size_t key = text.find("\"arguments\"", i);
  size_t key_len = 11;
  if (key == text.npos) key = text.find("\"parameters\"", i), key_len = 12;
  if (key == text.npos) return fc;
  i = skip_ws(key + key_len);
  if (i >= text.size() || text[i] != ':') return fc;
  i = skip_ws(i + 1);
  if (i >= text.size() || text[i] != '{') return fc;
  const size_t k = MatchingClose(text, i);
  if (k == std::string_view::npos) {
    fc.args = std::string(text.substr(i));  // cut before the object closed
    return fc;
  }
  fc.args = std::string(text.substr(i, k + 1 - i));
  fc.args_done = true;
  return fc;
}

ParsedReply ForcedReply(std::string_view text, const std::vector<std::string>& tool_names,
                        std::string_view id_prefix) {
  const ForcedCall fc = ScanForcedCall(text);
  ToolCall call;
  call.id = fmt::format("{}0", id_prefix);
  call.name = fc.name;
  if (!fc.name_done || !Allowed(fc.name, tool_names)) {
    // Cut inside the name: the first offered tool it starts.
    for (const auto& n : tool_names)
      if (n.starts_with(fc.name)) {
        call.name = n;
        break;
      }
  }
  call.arguments = fc.args;
  ParsedReply r;
  r.truncated = !fc.args_done;
  r.calls.push_back(std::move(call));
  return r;
}

}  // namespace lumen::serve
