#include "lumen/sample/config.h"

#include <charconv>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "lumen/core/buffer.h"
#include "lumen/sample/curve.h"

namespace lumen::sample {

using nlohmann::json;

std::string_view HlgPivotName(HlgPivot p) {
  switch (p) {
    case HlgPivot::kTop:
      return "top";
    case HlgPivot::kEntropy:
      return "entropy";
    case HlgPivot::kMedian:
      return "median";
  }
  return "?";
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One scalar knob: its JSON path, its CLI flags, its type and its range. The
// single table drives JSON parsing, flag parsing and Validate, so a range is
// written once.
struct Field {
  std::string_view json;
  std::string_view flag;   // primary CLI flag, "" if none
  std::string_view flag2;  // alias, "" if none
  bool is_int;
  double lo, hi;
  bool lo_open, hi_open;
  double* (*dref)(SamplerConfig&);
  int32_t* (*iref)(SamplerConfig&);
};

#define LUMEN_D(expr) [](SamplerConfig& c) -> double* { return &c.expr; }, nullptr
#define LUMEN_I(expr) nullptr, [](SamplerConfig& c) -> int32_t* { return &c.expr; }

const Field kFields[] = {
    {"temperature", "--temp", "--temperature", false, 0, kInf, false, true, LUMEN_D(temperature)},
    {"top_k", "--top-k", "", true, 0, kInf, false, true, LUMEN_I(top_k)},
    {"top_p", "--top-p", "", false, 0, 1, true, false, LUMEN_D(top_p)},
    {"min_p", "--min-p", "", false, 0, 1, false, false, LUMEN_D(min_p)},
    {"typical_p", "--typical-p", "--typical", false, 0, 1, true, false, LUMEN_D(typical_p)},
    {"repetition_penalty", "--repeat-penalty", "", false, 0, kInf, true, true,
     LUMEN_D(repetition_penalty)},
    {"repeat_last_n", "--repeat-last-n", "", true, -1, kInf, false, true, LUMEN_I(repeat_last_n)},
    {"presence_penalty", "--presence-penalty", "", false, -2, 2, false, false,
     LUMEN_D(presence_penalty)},
    {"frequency_penalty", "--frequency-penalty", "", false, -2, 2, false, false,
     LUMEN_D(frequency_penalty)},
    {"top_n_sigma", "--top-n-sigma", "", false, -kInf, kInf, true, true, LUMEN_D(top_n_sigma)},
    {"xtc_probability", "--xtc-probability", "", false, 0, 1, false, false,
     LUMEN_D(xtc_probability)},
    {"xtc_threshold", "--xtc-threshold", "", false, 0, 1, false, false, LUMEN_D(xtc_threshold)},
    {"mirostat", "--mirostat", "", true, 0, 2, false, false, LUMEN_I(mirostat)},
    {"mirostat_tau", "--mirostat-ent", "--mirostat-tau", false, 0, kInf, true, true,
     LUMEN_D(mirostat_tau)},
    {"mirostat_eta", "--mirostat-lr", "--mirostat-eta", false, 0, kInf, true, true,
     LUMEN_D(mirostat_eta)},
    {"dry_multiplier", "--dry-multiplier", "", false, 0, kInf, false, true,
     LUMEN_D(dry.multiplier)},
    {"dry_base", "--dry-base", "", false, 1, kInf, false, true, LUMEN_D(dry.base)},
    {"dry_allowed_length", "--dry-allowed-length", "", true, 1, kInf, false, true,
     LUMEN_I(dry.allowed_length)},
    {"dry_penalty_last_n", "--dry-penalty-last-n", "", true, -1, kInf, false, true,
     LUMEN_I(dry.last_n)},
    {"hlg.width", "--hlg-width", "", false, 0, kInf, true, true, LUMEN_D(hlg.width)},
    {"hlg.shoulder", "--hlg-shoulder", "", false, 0, kInf, true, true, LUMEN_D(hlg.shoulder)},
    {"hlg.toe", "--hlg-toe", "", false, 0, kInf, true, true, LUMEN_D(hlg.toe)},
    {"hlg.pivot_offset", "--hlg-pivot-offset", "", false, -kInf, kInf, true, true,
     LUMEN_D(hlg.pivot_offset)},
    {"top_logprobs", "", "", true, 0, 20, false, false, LUMEN_I(top_logprobs)},
};

#undef LUMEN_D
#undef LUMEN_I

std::string FormatNum(double v) { return fmt::format("{}", v); }

std::string RangeText(const Field& f) {
  const bool has_lo = std::isfinite(f.lo), has_hi = std::isfinite(f.hi);
  if (has_lo && has_hi) {
    return fmt::format("in {}{}, {}{}", f.lo_open ? "(" : "[", FormatNum(f.lo), FormatNum(f.hi),
                       f.hi_open ? ")" : "]");
  }
  if (has_lo) return fmt::format("{} {}", f.lo_open ? ">" : ">=", FormatNum(f.lo));
  if (has_hi) return fmt::format("{} {}", f.hi_open ? "<" : "<=", FormatNum(f.hi));
  return "finite";
}

// Range check shared by JSON, flags and Validate; `name` is what the user typed.
Status CheckField(const Field& f, std::string_view name, double v) {
  if (!std::isfinite(v)) return Errorf("{}: must be finite, got {}", name, FormatNum(v));
  const bool lo_ok = f.lo_open ? v > f.lo : v >= f.lo;
  const bool hi_ok = f.hi_open ? v < f.hi : v <= f.hi;
  if (!lo_ok || !hi_ok) {
    return Errorf("{}: must be {}, got {}", name, RangeText(f), FormatNum(v));
  }
  if (f.json == "mirostat" && v == 1) {
    return Errorf("{}: mirostat v1 is not supported; use 0 (off) or 2", name);
  }
  return Status::Ok();
}

Status SetField(const Field& f, std::string_view name, double v, SamplerConfig& c) {
  if (f.is_int && v != std::floor(v)) {
    return Errorf("{}: must be an integer, got {}", name, FormatNum(v));
  }
  LUMEN_RETURN_IF_ERROR(CheckField(f, name, v));
  if (f.is_int) {
    if (v > std::numeric_limits<int32_t>::max()) {
      return Errorf("{}: too large, got {}", name, FormatNum(v));
    }
    *f.iref(c) = static_cast<int32_t>(v);
  } else {
    *f.dref(c) = v;
  }
  return Status::Ok();
}

double GetField(const Field& f, SamplerConfig& c) {
  return f.is_int ? static_cast<double>(*f.iref(c)) : *f.dref(c);
}

const Field* FindJson(std::string_view name) {
  for (const Field& f : kFields) {
    if (f.json == name) return &f;
  }
  return nullptr;
}

Result<HlgPivot> ParsePivot(std::string_view name, std::string_view s) {
  if (s == "top") return HlgPivot::kTop;
  if (s == "entropy") return HlgPivot::kEntropy;
  if (s == "median") return HlgPivot::kMedian;
  return Errorf("{}: must be top, entropy or median, got '{}'", name, s);
}

Result<bool> ParseOnOff(std::string_view name, std::string_view s) {
  if (s == "on" || s == "true" || s == "1") return true;
  if (s == "off" || s == "false" || s == "0") return false;
  return Errorf("{}: must be on or off, got '{}'", name, s);
}

// --- JSON ---------------------------------------------------------------

Result<double> JsonNumber(const json& v, std::string_view name) {
  if (!v.is_number()) return Errorf("{}: must be a number, got {}", name, v.dump());
  return v.get<double>();
}

Result<bool> JsonBool(const json& v, std::string_view name) {
  if (!v.is_boolean()) return Errorf("{}: must be true or false, got {}", name, v.dump());
  return v.get<bool>();
}

Status ParseLogitBias(const json& v, SamplerConfig& c) {
  c.logit_bias.clear();
  auto add = [&](const json& id_json, std::string_view id_text, const json& bias_json,
                 std::string_view where) -> Status {
    int64_t id = -1;
    if (id_json.is_number_integer()) {
      id = id_json.get<int64_t>();
    } else if (!id_text.empty()) {
      auto [p, ec] = std::from_chars(id_text.data(), id_text.data() + id_text.size(), id);
      if (ec != std::errc() || p != id_text.data() + id_text.size()) id = -1;
    }
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
      return Errorf("{}: token id must be a non-negative integer, got {}", where,
                    id_text.empty() ? id_json.dump() : std::string(id_text));
    }
    double bias;
    if (bias_json.is_boolean() && !bias_json.get<bool>()) {
      bias = -std::numeric_limits<double>::infinity();  // llama.cpp: false bans the token
    } else if (bias_json.is_number()) {
      bias = bias_json.get<double>();
    } else {
      return Errorf("{}: bias must be a number (or false to ban), got {}", where, bias_json.dump());
    }
    c.logit_bias.emplace_back(static_cast<int32_t>(id), bias);
    return Status::Ok();
  };
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      LUMEN_RETURN_IF_ERROR(
          add(json(), it.key(), it.value(), fmt::format("logit_bias.{}", it.key())));
    }
    return Status::Ok();
  }
  if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string where = fmt::format("logit_bias[{}]", i);
      if (!v[i].is_array() || v[i].size() != 2) {
        return Errorf("{}: must be [token_id, bias], got {}", where, v[i].dump());
      }
      LUMEN_RETURN_IF_ERROR(add(v[i][0], "", v[i][1], where));
    }
    return Status::Ok();
  }
  return Errorf("logit_bias: must be an object {{\"token_id\": bias}} or an array, got {}",
                v.dump());
}

Status ParseHlg(const json& v, SamplerConfig& c) {
  if (v.is_boolean()) {
    c.hlg.enabled = v.get<bool>();
    return Status::Ok();
  }
  if (!v.is_object()) return Errorf("hlg: must be an object or a boolean, got {}", v.dump());
  c.hlg.enabled = true;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string name = "hlg." + it.key();
    const json& x = it.value();
    if (x.is_null()) continue;
    if (it.key() == "enabled") {
      LUMEN_ASSIGN_OR_RETURN(c.hlg.enabled, JsonBool(x, name));
    } else if (it.key() == "rolloff") {
      LUMEN_ASSIGN_OR_RETURN(c.hlg.rolloff, JsonBool(x, name));
    } else if (it.key() == "pivot") {
      if (!x.is_string()) return Errorf("{}: must be a string, got {}", name, x.dump());
      LUMEN_ASSIGN_OR_RETURN(c.hlg.pivot, ParsePivot(name, x.get<std::string>()));
    } else if (const Field* f = FindJson(name)) {
      LUMEN_ASSIGN_OR_RETURN(double d, JsonNumber(x, name));
      LUMEN_RETURN_IF_ERROR(SetField(*f, name, d, c));
    } else {
      return Errorf(
          "{}: unknown field (known: enabled, width, shoulder, toe, pivot, "
          "pivot_offset, rolloff)",
          name);
    }
  }
  return Status::Ok();
}

}  // namespace

Result<CurveConfig> ParseCurveJson(const json& j, std::string_view where) {
  CurveConfig curve;
  curve.enabled = true;
  const json* points = &j;
  if (j.is_object()) {
    points = nullptr;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "points") {
        points = &it.value();
      } else if (it.key() == "allow_nonmonotone") {
        LUMEN_ASSIGN_OR_RETURN(curve.allow_nonmonotone,
                               JsonBool(it.value(), fmt::format("{}.allow_nonmonotone", where)));
      } else if (it.key() == "enabled") {
        LUMEN_ASSIGN_OR_RETURN(curve.enabled,
                               JsonBool(it.value(), fmt::format("{}.enabled", where)));
      } else {
        return Errorf("{}.{}: unknown field (known: points, allow_nonmonotone, enabled)", where,
                      it.key());
      }
    }
    if (points == nullptr) return Errorf("{}.points: missing", where);
  }
  if (!points->is_array()) {
    return Errorf("{}.points: must be an array of [x_pct, y_pct] pairs, got {}", where,
                  points->dump());
  }
  for (size_t i = 0; i < points->size(); ++i) {
    const json& p = (*points)[i];
    bool ok = false;
    CurvePoint cp;
    if (p.is_array() && p.size() == 2 && p[0].is_number() && p[1].is_number()) {
      cp = {p[0].get<double>(), p[1].get<double>()};
      ok = true;
    } else if (p.is_object() && p.contains("x") && p.contains("y") && p["x"].is_number() &&
               p["y"].is_number()) {
      cp = {p["x"].get<double>(), p["y"].get<double>()};
      ok = true;
    }
    if (!ok) {
      return Errorf("{}.points[{}]: must be [x_pct, y_pct] (numbers), got {}", where, i, p.dump());
    }
    curve.points.push_back(cp);
  }
  if (curve.enabled) LUMEN_RETURN_IF_ERROR(ValidateCurve(curve, where));
  return curve;
}

Result<CurveConfig> LoadCurveFile(const std::string& path) {
  LUMEN_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Errorf("{}: not valid JSON", path);
  if (j.is_object() && j.contains("curve")) j = j["curve"];
  return std::move(ParseCurveJson(j, "curve")).WithContext(path);
}

Status Validate(const SamplerConfig& config) {
  SamplerConfig c = config;  // Field accessors take a mutable config
  for (const Field& f : kFields) {
    LUMEN_RETURN_IF_ERROR(CheckField(f, f.json, GetField(f, c)));
  }
  for (size_t i = 0; i < c.logit_bias.size(); ++i) {
    const auto [id, bias] = c.logit_bias[i];
    if (id < 0) return Errorf("logit_bias[{}]: token id must be >= 0, got {}", i, id);
    if (std::isnan(bias) || bias == std::numeric_limits<double>::infinity()) {
      return Errorf("logit_bias.{}: bias must be a finite number or -inf, got {}", id, bias);
    }
  }
  for (size_t i = 0; i < c.dry.breaker_ids.size(); ++i) {
    if (c.dry.breaker_ids[i].empty()) {
      return Errorf("dry_sequence_breakers[{}]: empty token sequence", i);
    }
    for (int32_t id : c.dry.breaker_ids[i]) {
      if (id < 0) return Errorf("dry_sequence_breakers[{}]: token id {} is negative", i, id);
    }
  }
  if (c.curve.enabled) LUMEN_RETURN_IF_ERROR(ValidateCurve(c.curve, "curve"));
  if (c.hlg.enabled && c.curve.enabled) {
    return Error("hlg: cannot be combined with curve; both replace the temperature step");
  }
  if (c.mirostat == 2 && (c.hlg.enabled || c.curve.enabled)) {
    return Errorf("mirostat: cannot be combined with {}; both replace the truncation step",
                  c.hlg.enabled ? "hlg" : "curve");
  }
  return Status::Ok();
}

Status ValidateForVocab(const SamplerConfig& config, int32_t vocab_size) {
  for (const auto& [id, bias] : config.logit_bias) {
    if (id < 0 || id >= vocab_size) {
      return Errorf("logit_bias.{}: token id out of range (vocabulary size {})", id, vocab_size);
    }
  }
  for (size_t i = 0; i < config.dry.breaker_ids.size(); ++i) {
    for (int32_t id : config.dry.breaker_ids[i]) {
      if (id < 0 || id >= vocab_size) {
        return Errorf("dry_sequence_breakers[{}]: token id {} out of range (vocabulary size {})", i,
                      id, vocab_size);
      }
    }
  }
  return Status::Ok();
}

Result<SamplerConfig> ParseSamplerJson(const json& request, const SamplerConfig& base) {
  if (!request.is_object()) {
    return Errorf("request: must be a JSON object, got {}", request.dump());
  }
  SamplerConfig c = base;
  for (auto it = request.begin(); it != request.end(); ++it) {
    std::string key = it.key();
    const json& v = it.value();
    if (v.is_null()) continue;
    if (key == "repeat_penalty") key = "repetition_penalty";  // llama.cpp server name
    if (key == "seed") {
      if (!v.is_number_integer()) return Errorf("seed: must be an integer, got {}", v.dump());
      if (v.is_number_unsigned()) {
        c.seed = v.get<uint64_t>();
      } else if (v.get<int64_t>() == -1) {
        c.seed.reset();  // -1: random, as in llama.cpp
      } else if (v.get<int64_t>() < 0) {
        return Errorf("seed: must be >= 0 (or -1 for random), got {}", v.dump());
      } else {
        c.seed = static_cast<uint64_t>(v.get<int64_t>());
      }
    } else if (key == "logit_bias") {
      LUMEN_RETURN_IF_ERROR(ParseLogitBias(v, c));
    } else if (key == "hlg") {
      LUMEN_RETURN_IF_ERROR(ParseHlg(v, c));
    } else if (key == "curve") {
      LUMEN_ASSIGN_OR_RETURN(c.curve, ParseCurveJson(v, "curve"));
    } else if (key == "dry_sequence_breakers") {
      if (!v.is_array()) {
        return Errorf("dry_sequence_breakers: must be an array of strings, got {}", v.dump());
      }
      c.dry.sequence_breakers.clear();
      for (size_t i = 0; i < v.size(); ++i) {
        if (!v[i].is_string() || v[i].get<std::string>().empty()) {
          return Errorf("dry_sequence_breakers[{}]: must be a non-empty string, got {}", i,
                        v[i].dump());
        }
        c.dry.sequence_breakers.push_back(v[i].get<std::string>());
      }
    } else if (const Field* f = key.find('.') == std::string::npos ? FindJson(key) : nullptr) {
      if (v.is_boolean()) return Errorf("{}: must be a number, got {}", key, v.dump());
      LUMEN_ASSIGN_OR_RETURN(double d, JsonNumber(v, key));
      LUMEN_RETURN_IF_ERROR(SetField(*f, key, d, c));
    }
  }
  LUMEN_RETURN_IF_ERROR(Validate(c));
  return c;
}

// --- flags ---------------------------------------------------------------

namespace {

constexpr std::string_view kExtraFlags[] = {
    "--seed",  "--hlg-sampling", "--hlg-pivot",           "--hlg-rolloff",
    "--curve", "--logit-bias",   "--dry-sequence-breaker"};

const Field* FindFlag(std::string_view flag) {
  for (const Field& f : kFields) {
    if (!f.flag.empty() && (f.flag == flag || f.flag2 == flag)) return &f;
  }
  return nullptr;
}

Result<double> ParseNumber(std::string_view flag, std::string_view s) {
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) {
    return Errorf("{}: expected a number, got '{}'", flag, s);
  }
  return v;
}

}  // namespace

bool IsSamplerFlag(std::string_view flag) {
  if (FindFlag(flag)) return true;
  for (std::string_view f : kExtraFlags) {
    if (f == flag) return true;
  }
  return false;
}

std::vector<std::string_view> SamplerFlags() {
  std::vector<std::string_view> out;
  for (const Field& f : kFields) {
    if (!f.flag.empty()) out.push_back(f.flag);
    if (!f.flag2.empty()) out.push_back(f.flag2);
  }
  for (std::string_view f : kExtraFlags) out.push_back(f);
  return out;
}

Status ApplyFlag(SamplerConfig& c, std::string_view flag, std::string_view value) {
  if (const Field* f = FindFlag(flag)) {
    LUMEN_ASSIGN_OR_RETURN(double v, ParseNumber(flag, value));
    return SetField(*f, flag, v, c);
  }
  if (flag == "--seed") {
    if (value == "-1") {
      c.seed.reset();
      return Status::Ok();
    }
    uint64_t s = 0;
    auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), s);
    if (value.empty() || ec != std::errc() || p != value.data() + value.size()) {
      return Errorf("{}: expected a non-negative integer (or -1 for random), got '{}'", flag,
                    value);
    }
    c.seed = s;
    return Status::Ok();
  }
  if (flag == "--hlg-sampling") {
    LUMEN_ASSIGN_OR_RETURN(c.hlg.enabled, ParseOnOff(flag, value));
    return Status::Ok();
  }
  if (flag == "--hlg-rolloff") {
    LUMEN_ASSIGN_OR_RETURN(c.hlg.rolloff, ParseOnOff(flag, value));
    return Status::Ok();
  }
  if (flag == "--hlg-pivot") {
    LUMEN_ASSIGN_OR_RETURN(c.hlg.pivot, ParsePivot(flag, value));
    return Status::Ok();
  }
  if (flag == "--curve") {
    LUMEN_ASSIGN_OR_RETURN(c.curve, std::move(LoadCurveFile(std::string(value))).WithContext(flag));
    return Status::Ok();
  }
  if (flag == "--logit-bias" && value.find(',') != std::string_view::npos) {
    // A comma-separated list: each entry as below.
    for (size_t start = 0; start <= value.size();) {
      size_t end = value.find(',', start);
      if (end == std::string_view::npos) end = value.size();
      LUMEN_RETURN_IF_ERROR(ApplyFlag(c, flag, value.substr(start, end - start)));
      start = end + 1;
    }
    return Status::Ok();
  }
  if (flag == "--logit-bias") {
    // llama.cpp form: TOKEN+BIAS or TOKEN-BIAS; also TOKEN=BIAS.
    size_t pos = value.find_first_of("+-=", 1);
    if (pos == std::string_view::npos) {
      return Errorf(
          "{}: expected TOKEN+BIAS, TOKEN-BIAS or TOKEN=BIAS (several: comma-separated or the "
          "flag repeated), got '{}'",
          flag, value);
    }
    int64_t id = -1;
    std::string_view id_text = value.substr(0, pos);
    auto [p, ec] = std::from_chars(id_text.data(), id_text.data() + id_text.size(), id);
    if (ec != std::errc() || p != id_text.data() + id_text.size() || id < 0 ||
        id > std::numeric_limits<int32_t>::max()) {
      return Errorf("{}: token id must be a non-negative integer, got '{}'", flag, id_text);
    }
    std::string_view bias_text = value.substr(value[pos] == '=' ? pos + 1 : pos);
    if (!bias_text.empty() && bias_text[0] == '+') bias_text.remove_prefix(1);
    LUMEN_ASSIGN_OR_RETURN(double bias, ParseNumber(flag, bias_text));
    if (std::isnan(bias) || bias == std::numeric_limits<double>::infinity()) {
      return Errorf("{}: bias must be finite or -inf, got '{}'", flag, bias_text);
    }
    c.logit_bias.emplace_back(static_cast<int32_t>(id), bias);
    return Status::Ok();
  }
  if (flag == "--dry-sequence-breaker") {
    // As in llama.cpp: the first use replaces the defaults; "none" clears.
    if (c.dry.sequence_breakers == DryConfig().sequence_breakers) c.dry.sequence_breakers.clear();
    if (value == "none") {
      c.dry.sequence_breakers.clear();
    } else if (value.empty()) {
      return Errorf("{}: must not be empty", flag);
    } else {
      c.dry.sequence_breakers.emplace_back(value);
    }
    return Status::Ok();
  }
  return Errorf("{}: unknown sampler flag", flag);
}

}  // namespace lumen::sample
