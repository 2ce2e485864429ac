// Field checks shared by the protocol parsers; every error names the field.
#include <algorithm>
#include <cctype>
#include <cmath>

#include "lumen/serve/request.h"

namespace lumen::serve {

using ojson = nlohmann::ordered_json;

ojson ToolArgumentsJson(const std::string& arguments) {
  ojson j = ojson::parse(arguments, nullptr, false);
  return j.is_discarded() ? ojson(arguments) : j;
}

std::string TypeName(const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::null:
      return "null";
    case ojson::value_t::boolean:
      return "a boolean";
    case ojson::value_t::string:
      return "a string";
    case ojson::value_t::array:
      return "an array";
    case ojson::value_t::object:
      return "an object";
    case ojson::value_t::number_float:
      return "a number";
    default:
      return "an integer";
  }
}

Status ExpectBool(const ojson& v, const std::string& field, bool* out) {
  if (v.is_null()) return Status::Ok();
  if (!v.is_boolean()) return Errorf("{}: must be a boolean, got {}", field, TypeName(v));
  *out = v.get<bool>();
  return Status::Ok();
}

Status ExpectString(const ojson& v, const std::string& field, std::string* out) {
  if (!v.is_string()) return Errorf("{}: must be a string, got {}", field, TypeName(v));
  *out = v.get<std::string>();
  return Status::Ok();
}

Status ExpectInt(const ojson& v, const std::string& field, int64_t lo, int64_t hi, int64_t* out) {
  int64_t x;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
      return Errorf("{}: must be at most {}, got {}", field, hi, v.dump());
    x = v.get<int64_t>();
  } else if (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()) &&
             std::abs(v.get<double>()) < 1e15) {
    x = static_cast<int64_t>(v.get<double>());
  } else {
    return Errorf("{}: must be an integer, got {}", field, TypeName(v));
  }
  if (x < lo) return Errorf("{}: must be >= {}, got {}", field, lo, x);
  if (x > hi) return Errorf("{}: must be <= {}, got {}", field, hi, x);
  *out = x;
  return Status::Ok();
}

namespace {
// Request keys that configure the sampler (sample::ParseSamplerJson names).
constexpr const char* kSamplerKeys[] = {"temperature",
                                        "top_p",
                                        "top_k",
                                        "min_p",
                                        "typical_p",
                                        "seed",
                                        "logit_bias",
                                        "presence_penalty",
                                        "frequency_penalty",
                                        "repetition_penalty",
                                        "repeat_penalty",
                                        "repeat_last_n",
                                        "top_n_sigma",
                                        "xtc_probability",
                                        "xtc_threshold",
                                        "mirostat",
                                        "mirostat_tau",
                                        "mirostat_eta",
                                        "dry_multiplier",
                                        "dry_base",
                                        "dry_allowed_length",
                                        "dry_penalty_last_n",
                                        "dry_sequence_breakers",
                                        "hlg",
                                        "curve"};
}  // namespace

Status ParseSamplerFields(const ojson& body, GenRequest& r) {
  for (const char* k : kSamplerKeys) {
    auto it = body.find(k);
    if (it == body.end() || it->is_null()) continue;
    r.sampler_fields[k] = nlohmann::json::parse(it->dump());
  }
  return Status::Ok();
}

Status ParseStop(const ojson& v, const char* field, GenRequest& r) {
  if (v.is_null()) return Status::Ok();
  auto add = [&](const ojson& s, const std::string& where) -> Status {
    if (!s.is_string()) return Errorf("{}: must be a string, got {}", where, TypeName(s));
    if (s.get<std::string>().empty()) return Errorf("{}: must not be empty", where);
    r.stop.push_back(s.get<std::string>());
    return Status::Ok();
  };
  if (v.is_string()) return add(v, field);
  if (!v.is_array())
    return Errorf("{}: must be a string or an array of strings, got {}", field, TypeName(v));
  if (v.size() > 16) return Errorf("{}: at most 16 stop strings, got {}", field, v.size());
  for (size_t i = 0; i < v.size(); ++i)
    LUMEN_RETURN_IF_ERROR(add(v[i], fmt::format("{}[{}]", field, i)));
  return Status::Ok();
}

Status ParseMaxTokens(const ojson& v, const char* field, GenRequest& r) {
  if (v.is_null()) return Status::Ok();
  int64_t x;
  LUMEN_RETURN_IF_ERROR(ExpectInt(v, field, 1, int64_t(1) << 30, &x));
  r.max_tokens = x;
  return Status::Ok();
}

Status ValidateTools(const ojson& tools, const char* field) {
  if (!tools.is_array()) return Errorf("{}: must be an array, got {}", field, TypeName(tools));
  // OpenAI's rule for function names: [a-zA-Z0-9_.-]{1,64}.
  auto valid_name = [](const std::string& n) {
    if (n.empty() || n.size() > 64) return false;
    for (unsigned char c : n)
      if (!std::isalnum(c) && c != '_' && c != '.' && c != '-') return false;
    return true;
  };
  std::vector<std::string> seen;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", field, i);
    const ojson& t = tools[i];
    if (!t.is_object()) return Errorf("{}: must be an object, got {}", at, TypeName(t));
    auto type = t.find("type");
    if (type == t.end() || !type->is_string() || *type != "function")
      return Errorf("{}.type: must be \"function\"", at);
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) return Errorf("{}.function: must be an object", at);
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string())
      return Errorf("{}.function.name: must be a string", at);
    const std::string n = name->get<std::string>();
    if (!valid_name(n))
      return Errorf("{}.function.name: must match [a-zA-Z0-9_.-]{{1,64}}, got '{}'", at, n);
    if (std::find(seen.begin(), seen.end(), n) != seen.end())
      return Errorf("{}.function.name: duplicate tool name '{}'", at, n);
    seen.push_back(n);
    auto desc = fn->find("description");
    if (desc != fn->end() && !desc->is_null() && !desc->is_string())
      return Errorf("{}.function.description: must be a string, got {}", at, TypeName(*desc));
    auto params = fn->find("parameters");
    if (params != fn->end() && !params->is_null()) {
      const std::string pat = at + ".function.parameters";
      if (!params->is_object())
        return Errorf("{}: must be a JSON Schema object, got {}", pat, TypeName(*params));
      auto ptype = params->find("type");
      if (ptype != params->end() && (!ptype->is_string() || *ptype != "object"))
        return Errorf("{}.type: must be \"object\", got {}", pat, ptype->dump());
      auto props = params->find("properties");
      if (props != params->end() && !props->is_object())
        return Errorf("{}.properties: must be an object, got {}", pat, TypeName(*props));
      if (props != params->end())
        for (auto it = props->begin(); it != props->end(); ++it)
          if (!it->is_object() && !it->is_boolean())
            return Errorf("{}.properties.{}: must be a schema object, got {}", pat, it.key(),
                          TypeName(*it));
      auto req = params->find("required");
      if (req != params->end()) {
        if (!req->is_array())
          return Errorf("{}.required: must be an array of strings, got {}", pat, TypeName(*req));
        for (size_t j = 0; j < req->size(); ++j)
          if (!(*req)[j].is_string())
            return Errorf("{}.required[{}]: must be a string, got {}", pat, j, TypeName((*req)[j]));
      }
    }
  }
  return Status::Ok();
}

Status ParseToolChoice(const ojson& v, const char* field, GenRequest& r) {
  if (v.is_null()) return Status::Ok();
  std::string name;
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s != "none" && s != "auto" && s != "required")
      return Errorf("{}: must be \"none\", \"auto\", \"required\" or a function object, got '{}'",
                    field, s);
    r.tool_choice = s;
    r.tool_choice_named = false;
    if (s == "required" && r.tools.is_null()) return Errorf("{}: \"required\" needs tools", field);
    return Status::Ok();
  }
  if (!v.is_object())
    return Errorf("{}: must be a string or an object, got {}", field, TypeName(v));
  auto fn = v.find("function");
  if (fn != v.end() && fn->is_object() && fn->contains("name") && (*fn)["name"].is_string())
    name = (*fn)["name"].get<std::string>();
  else if (v.contains("name") && v["name"].is_string())
    name = v["name"].get<std::string>();
  else
    return Errorf("{}.function.name: must be a string", field);
  bool found = false;
  if (r.tools.is_array())
    for (const auto& t : r.tools) found |= t["function"]["name"] == name;
  if (!found) return Errorf("{}: no tool named '{}' in tools", field, name);
  r.tool_choice = name;
  r.tool_choice_named = true;
  return Status::Ok();
}

Status ParseResponseFormat(const ojson& f, const std::string& field, bool nested, GenRequest& r) {
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
    return Errorf("{}.type: must be a string", field);
  const std::string t = f["type"].get<std::string>();
  if (t != "text" && t != "json_object" && t != "json_schema")
    return Errorf("{}.type: unknown type '{}' (text, json_object, json_schema)", field, t);
  r.response_format = t;
  if (t != "json_schema") return Status::Ok();
  const ojson* spec = &f;
  std::string at = field;
  if (nested) {
    at = field + ".json_schema";
    auto js = f.find("json_schema");
    if (js == f.end() || !js->is_object())
      return Errorf("{}: must be an object with the schema", at);
    spec = &*js;
  }
  if (spec->contains("name") && !(*spec)["name"].is_null())
    LUMEN_RETURN_IF_ERROR(ExpectString((*spec)["name"], at + ".name", &r.json_schema_name));
  LUMEN_RETURN_IF_ERROR(
      ExpectBool(spec->value("strict", ojson()), at + ".strict", &r.json_schema_strict));
  r.json_schema_field = at + ".schema";
  auto schema = spec->find("schema");
  if (schema == spec->end() || schema->is_null())
    return Errorf("{}: missing (the JSON Schema the reply must follow)", r.json_schema_field);
  if (!schema->is_object() && !schema->is_boolean())
    return Errorf("{}: must be an object, got {}", r.json_schema_field, TypeName(*schema));
  r.json_schema = *schema;
  return Status::Ok();
}

}  // namespace lumen::serve
