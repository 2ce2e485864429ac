// SamplerConfig: every knob of the sampler chain, and the three ways it is
// filled: a JSON object (the server's per-request form), CLI-style flags
// (ApplyFlag), and a curve file (LoadCurveFile). Validate() checks a whole
// config; every error names the field or flag and the reason, e.g.
// "hlg.width: must be > 0, got -1" or "--top-p: must be in (0, 1], got 1.5".
//
// Defaults leave every extra sampler off: a default config samples from
// softmax(logits) at temperature 1. The chain order is documented in
// sampler.h and docs/reference/sampling.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "lumen/core/status.h"

namespace lumen::sample {

enum class HlgPivot { kTop, kEntropy, kMedian };

// "top" / "entropy" / "median".
std::string_view HlgPivotName(HlgPivot p);

// HLG tone-curve sampling (docs/design/sampling.md). All widths in nats.
struct HlgConfig {
  bool enabled = false;
  double width = 4.0;     // w: half-width of the linear mid region
  double shoulder = 4.0;  // beta_h: scale of the log roll-off above the mids
  double toe = 6.0;       // beta_t: scale of the log roll-off below the mids
  HlgPivot pivot = HlgPivot::kTop;
  double pivot_offset = 6.0;  // c: for pivot top, mu = l_max - c
  bool rolloff = true;        // false: g(z) = m*z everywhere (plain temperature)
};

// One control point, in probability percent: input x_pct maps to output y_pct.
struct CurvePoint {
  double x_pct = 0;
  double y_pct = 0;
  bool operator==(const CurvePoint&) const = default;
};

// Control-point curve: monotone cubic Hermite through the points in log-prob
// space, applied as p_out ∝ exp(curve(log p_in)).
struct CurveConfig {
  bool enabled = false;
  std::vector<CurvePoint> points;
  bool allow_nonmonotone = false;
};

// DRY ("don't repeat yourself") penalty; off while multiplier == 0.
struct DryConfig {
  double multiplier = 0.0;
  double base = 1.75;
  int32_t allowed_length = 2;
  int32_t last_n = -1;  // -1: the whole history; 0: DRY off
  // Breakers as text, for the caller to tokenize into breaker_ids (the sampler
  // never sees a tokenizer). The defaults are llama.cpp's.
  std::vector<std::string> sequence_breakers = {"\n", ":", "\"", "*"};
  // Breakers as token-id sequences: what the sampler actually uses.
  std::vector<std::vector<int32_t>> breaker_ids;
};

struct SamplerConfig {
  double temperature = 1.0;      // 0: greedy
  std::optional<uint64_t> seed;  // empty: a random seed chosen per Sampler

  // Logit processors (applied before greedy and before every route).
  std::vector<std::pair<int32_t, double>> logit_bias;  // token id -> added to its logit
  double repetition_penalty = 1.0;  // llama.cpp style: divide positive, multiply negative
  int32_t repeat_last_n = 64;       // window for the three penalties; -1 all, 0 off
  double presence_penalty = 0.0;    // subtract once if the token occurs in the window
  double frequency_penalty = 0.0;   // subtract count * value
  DryConfig dry;

  // Standard path (skipped under HLG or curve).
  int32_t top_k = 0;             // 0: off
  double typical_p = 1.0;        // 1: off
  double top_p = 1.0;            // 1: off
  double min_p = 0.0;            // 0: off
  double top_n_sigma = -1.0;     // <= 0: off
  double xtc_probability = 0.0;  // 0: off
  double xtc_threshold = 0.1;
  int32_t mirostat = 0;  // 0 off, 2 = mirostat v2 (v1 is not supported)
  double mirostat_tau = 5.0;
  double mirostat_eta = 0.1;

  // Replacement samplers for the temperature/truncation step.
  HlgConfig hlg;
  CurveConfig curve;

  // How many alternatives Sample() reports in TokenLogprobs::top (0..20).
  int32_t top_logprobs = 0;
};

// Checks every field; the first problem is returned, named by its JSON path.
Status Validate(const SamplerConfig& config);

// Checks the parts that depend on the vocabulary: logit_bias and DRY breaker ids
// must name tokens in [0, vocab_size).
Status ValidateForVocab(const SamplerConfig& config, int32_t vocab_size);

// Reads the sampler fields of a request object, starting from `base` (the
// server's defaults). Unknown top-level keys are ignored (the request has many
// other fields); unknown keys inside "hlg" and "curve" are errors. null means
// "not given". The result is validated.
Result<SamplerConfig> ParseSamplerJson(const nlohmann::json& request,
                                       const SamplerConfig& base = SamplerConfig());

// Parses {"points": [[x, y], ...], "allow_nonmonotone": bool} (or a bare array
// of points) into a validated, enabled CurveConfig. `where` prefixes errors.
Result<CurveConfig> ParseCurveJson(const nlohmann::json& j, std::string_view where = "curve");

// Loads a curve file for --curve FILE.json; errors start with the path.
Result<CurveConfig> LoadCurveFile(const std::string& path);

// Applies one CLI flag (with its leading dashes) and its value, e.g.
// ApplyFlag(c, "--top-p", "0.9"). Errors name the flag. Returns an error
// "unknown sampler flag" for flags this module does not own; IsSamplerFlag
// tells the CLI which flags to route here.
Status ApplyFlag(SamplerConfig& config, std::string_view flag, std::string_view value);
bool IsSamplerFlag(std::string_view flag);
// Every flag ApplyFlag accepts, for help text.
std::vector<std::string_view> SamplerFlags();

}  // namespace lumen::sample
