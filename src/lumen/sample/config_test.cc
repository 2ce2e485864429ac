#include "lumen/sample/config.h"

#include <limits>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace lumen::sample {
namespace {

using nlohmann::json;

std::string JsonError(const char* text) {
  auto r = ParseSamplerJson(json::parse(text));
  return r.ok() ? "OK" : r.status().message();
}

std::string FlagError(std::string_view flag, std::string_view value) {
  SamplerConfig c;
  return ApplyFlag(c, flag, value).message();
}

TEST(SamplerConfig, DefaultsAreValidAndOff) {
  SamplerConfig c;
  EXPECT_TRUE(Validate(c).ok());
  EXPECT_EQ(c.temperature, 1.0);
  EXPECT_EQ(c.top_k, 0);
  EXPECT_FALSE(c.hlg.enabled);
  EXPECT_FALSE(c.curve.enabled);
  EXPECT_EQ(c.hlg.pivot_offset, 6.0);
  EXPECT_EQ(c.hlg.width, 4.0);
  EXPECT_EQ(c.hlg.shoulder, 4.0);
  EXPECT_EQ(c.hlg.toe, 6.0);
}

TEST(SamplerJson, ParsesEveryField) {
  auto r = ParseSamplerJson(json::parse(R"({
    "model": "ignored", "messages": [], "temperature": 0.7, "top_p": 0.9, "top_k": 40,
    "min_p": 0.05, "seed": 12345678901234, "presence_penalty": 0.5, "frequency_penalty": -0.5,
    "repetition_penalty": 1.1, "repeat_last_n": 128, "logit_bias": {"15043": -100, "7": 2.5},
    "typical_p": 0.95, "xtc_probability": 0.5, "xtc_threshold": 0.2, "dry_multiplier": 0.8,
    "dry_base": 1.5, "dry_allowed_length": 3, "dry_penalty_last_n": 256,
    "dry_sequence_breakers": ["\n", "###"], "top_n_sigma": 1.5, "mirostat": 0,
    "mirostat_tau": 4, "mirostat_eta": 0.2, "top_logprobs": 5, "stop": null,
    "hlg": {"width": 3, "shoulder": 2, "toe": 5, "pivot": "median", "pivot_offset": 4,
            "rolloff": false}
  })"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const SamplerConfig& c = *r;
  EXPECT_EQ(c.temperature, 0.7);
  EXPECT_EQ(c.top_p, 0.9);
  EXPECT_EQ(c.top_k, 40);
  EXPECT_EQ(c.min_p, 0.05);
  EXPECT_EQ(c.seed, 12345678901234ULL);
  EXPECT_EQ(c.presence_penalty, 0.5);
  EXPECT_EQ(c.frequency_penalty, -0.5);
  EXPECT_EQ(c.repetition_penalty, 1.1);
  EXPECT_EQ(c.repeat_last_n, 128);
  ASSERT_EQ(c.logit_bias.size(), 2u);
  EXPECT_EQ(c.logit_bias[0], (std::pair<int32_t, double>{15043, -100}));
  EXPECT_EQ(c.logit_bias[1], (std::pair<int32_t, double>{7, 2.5}));
  EXPECT_EQ(c.typical_p, 0.95);
  EXPECT_EQ(c.xtc_probability, 0.5);
  EXPECT_EQ(c.xtc_threshold, 0.2);
  EXPECT_EQ(c.dry.multiplier, 0.8);
  EXPECT_EQ(c.dry.base, 1.5);
  EXPECT_EQ(c.dry.allowed_length, 3);
  EXPECT_EQ(c.dry.last_n, 256);
  EXPECT_EQ(c.dry.sequence_breakers, (std::vector<std::string>{"\n", "###"}));
  EXPECT_EQ(c.top_n_sigma, 1.5);
  EXPECT_EQ(c.mirostat_tau, 4);
  EXPECT_EQ(c.mirostat_eta, 0.2);
  EXPECT_EQ(c.top_logprobs, 5);
  EXPECT_TRUE(c.hlg.enabled);
  EXPECT_EQ(c.hlg.width, 3);
  EXPECT_EQ(c.hlg.shoulder, 2);
  EXPECT_EQ(c.hlg.toe, 5);
  EXPECT_EQ(c.hlg.pivot, HlgPivot::kMedian);
  EXPECT_EQ(c.hlg.pivot_offset, 4);
  EXPECT_FALSE(c.hlg.rolloff);
}

TEST(SamplerJson, CurveAndAliases) {
  auto r = ParseSamplerJson(json::parse(
      R"({"curve": {"points": [[1, 0.5], [50, 60], [100, 100]]}, "repeat_penalty": 1.3,
          "logit_bias": [[5, false], [6, 1]], "seed": -1})"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->curve.enabled);
  ASSERT_EQ(r->curve.points.size(), 3u);
  EXPECT_EQ(r->curve.points[1], (CurvePoint{50, 60}));
  EXPECT_EQ(r->repetition_penalty, 1.3);
  EXPECT_EQ(r->logit_bias[0].second, -std::numeric_limits<double>::infinity());
  EXPECT_FALSE(r->seed.has_value());
  auto off = ParseSamplerJson(json::parse(R"({"hlg": {"enabled": false, "width": 2}})"));
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->hlg.enabled);
  EXPECT_EQ(off->hlg.width, 2);
  // Starts from the given base (server defaults).
  SamplerConfig base;
  base.top_k = 40;
  auto b = ParseSamplerJson(json::parse(R"({"temperature": 0})"), base);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->top_k, 40);
  EXPECT_EQ(b->temperature, 0);
}

TEST(SamplerJson, ErrorsNameTheField) {
  EXPECT_EQ(JsonError(R"({"hlg": {"width": -1}})"), "hlg.width: must be > 0, got -1");
  EXPECT_EQ(JsonError(R"({"top_p": 1.5})"), "top_p: must be in (0, 1], got 1.5");
  EXPECT_EQ(JsonError(R"({"top_k": 1.5})"), "top_k: must be an integer, got 1.5");
  EXPECT_EQ(JsonError(R"({"top_k": -2})"), "top_k: must be >= 0, got -2");
  EXPECT_EQ(JsonError(R"({"temperature": "hot"})"), R"(temperature: must be a number, got "hot")");
  EXPECT_EQ(JsonError(R"({"temperature": true})"), "temperature: must be a number, got true");
  EXPECT_EQ(JsonError(R"({"temperature": -0.1})"), "temperature: must be >= 0, got -0.1");
  EXPECT_EQ(JsonError(R"({"hlg": {"pivot": "mid"}})"),
            "hlg.pivot: must be top, entropy or median, got 'mid'");
  EXPECT_EQ(JsonError(R"({"hlg": {"widht": 3}})"),
            "hlg.widht: unknown field (known: enabled, width, shoulder, toe, pivot, "
            "pivot_offset, rolloff)");
  EXPECT_EQ(JsonError(R"({"hlg": 3})"), "hlg: must be an object or a boolean, got 3");
  EXPECT_EQ(JsonError(R"({"logit_bias": {"abc": 1}})"),
            "logit_bias.abc: token id must be a non-negative integer, got abc");
  EXPECT_EQ(JsonError(R"({"logit_bias": {"5": "x"}})"),
            R"(logit_bias.5: bias must be a number (or false to ban), got "x")");
  EXPECT_EQ(JsonError(R"({"curve": {"points": [[1, 1], [1, 2]]}})"),
            "curve.points[1]: x must be strictly increasing, got 1 after 1");
  EXPECT_EQ(JsonError(R"({"curve": {"points": [[1, 1], "a"]}})"),
            R"(curve.points[1]: must be [x_pct, y_pct] (numbers), got "a")");
  EXPECT_EQ(JsonError(R"({"curve": {"pts": []}})"),
            "curve.pts: unknown field (known: points, allow_nonmonotone, enabled)");
  EXPECT_EQ(JsonError(R"({"hlg": true, "curve": {"points": [[1, 1], [100, 100]]}})"),
            "hlg: cannot be combined with curve; both replace the temperature step");
  EXPECT_EQ(JsonError(R"({"mirostat": 1})"),
            "mirostat: mirostat v1 is not supported; use 0 (off) or 2");
  EXPECT_EQ(JsonError(R"({"mirostat": 2, "hlg": {}})"),
            "mirostat: cannot be combined with hlg; both replace the truncation step");
  EXPECT_EQ(JsonError(R"({"top_logprobs": 21})"), "top_logprobs: must be in [0, 20], got 21");
  EXPECT_EQ(JsonError(R"({"seed": -5})"), "seed: must be >= 0 (or -1 for random), got -5");
  EXPECT_EQ(JsonError(R"({"presence_penalty": 3})"), "presence_penalty: must be in [-2, 2], got 3");
  EXPECT_EQ(JsonError(R"({"dry_sequence_breakers": "x"})"),
            R"(dry_sequence_breakers: must be an array of strings, got "x")");
  EXPECT_EQ(JsonError("[1]"), "request: must be a JSON object, got [1]");
  EXPECT_EQ(JsonError(R"({"temperature": null, "whatever": {"a": 1}})"), "OK");
}

TEST(SamplerConfig, ValidateForVocab) {
  SamplerConfig c;
  c.logit_bias = {{5, 1.0}};
  EXPECT_TRUE(ValidateForVocab(c, 6).ok());
  EXPECT_EQ(ValidateForVocab(c, 5).message(),
            "logit_bias.5: token id out of range (vocabulary size 5)");
  c.logit_bias.clear();
  c.dry.breaker_ids = {{1, 9}};
  EXPECT_EQ(ValidateForVocab(c, 5).message(),
            "dry_sequence_breakers[0]: token id 9 out of range (vocabulary size 5)");
}

TEST(SamplerFlags, AppliesValues) {
  SamplerConfig c;
  ASSERT_TRUE(ApplyFlag(c, "--temp", "0.7").ok());
  ASSERT_TRUE(ApplyFlag(c, "--top-k", "40").ok());
  ASSERT_TRUE(ApplyFlag(c, "--top-p", "0.95").ok());
  ASSERT_TRUE(ApplyFlag(c, "--min-p", "0.05").ok());
  ASSERT_TRUE(ApplyFlag(c, "--repeat-penalty", "1.1").ok());
  ASSERT_TRUE(ApplyFlag(c, "--repeat-last-n", "-1").ok());
  ASSERT_TRUE(ApplyFlag(c, "--presence-penalty", "0.3").ok());
  ASSERT_TRUE(ApplyFlag(c, "--frequency-penalty", "0.2").ok());
  ASSERT_TRUE(ApplyFlag(c, "--seed", "18446744073709551615").ok());
  ASSERT_TRUE(ApplyFlag(c, "--hlg-sampling", "on").ok());
  ASSERT_TRUE(ApplyFlag(c, "--hlg-width", "3.5").ok());
  ASSERT_TRUE(ApplyFlag(c, "--hlg-shoulder", "2").ok());
  ASSERT_TRUE(ApplyFlag(c, "--hlg-toe", "7").ok());
  ASSERT_TRUE(ApplyFlag(c, "--hlg-pivot", "entropy").ok());
  ASSERT_TRUE(ApplyFlag(c, "--hlg-pivot-offset", "5").ok());
  ASSERT_TRUE(ApplyFlag(c, "--hlg-rolloff", "off").ok());
  ASSERT_TRUE(ApplyFlag(c, "--logit-bias", "15043+1").ok());
  ASSERT_TRUE(ApplyFlag(c, "--logit-bias", "7-2.5").ok());
  ASSERT_TRUE(ApplyFlag(c, "--logit-bias", "8=-inf").ok());
  ASSERT_TRUE(ApplyFlag(c, "--typical", "0.9").ok());
  ASSERT_TRUE(ApplyFlag(c, "--dry-multiplier", "0.8").ok());
  ASSERT_TRUE(ApplyFlag(c, "--dry-sequence-breaker", "###").ok());
  ASSERT_TRUE(ApplyFlag(c, "--dry-sequence-breaker", "\n").ok());
  EXPECT_EQ(c.temperature, 0.7);
  EXPECT_EQ(c.top_k, 40);
  EXPECT_EQ(c.top_p, 0.95);
  EXPECT_EQ(c.min_p, 0.05);
  EXPECT_EQ(c.repetition_penalty, 1.1);
  EXPECT_EQ(c.repeat_last_n, -1);
  EXPECT_EQ(c.presence_penalty, 0.3);
  EXPECT_EQ(c.frequency_penalty, 0.2);
  EXPECT_EQ(c.seed, 18446744073709551615ULL);
  EXPECT_TRUE(c.hlg.enabled);
  EXPECT_EQ(c.hlg.width, 3.5);
  EXPECT_EQ(c.hlg.shoulder, 2);
  EXPECT_EQ(c.hlg.toe, 7);
  EXPECT_EQ(c.hlg.pivot, HlgPivot::kEntropy);
  EXPECT_EQ(c.hlg.pivot_offset, 5);
  EXPECT_FALSE(c.hlg.rolloff);
  ASSERT_EQ(c.logit_bias.size(), 3u);
  EXPECT_EQ(c.logit_bias[0], (std::pair<int32_t, double>{15043, 1}));
  EXPECT_EQ(c.logit_bias[1], (std::pair<int32_t, double>{7, -2.5}));
  EXPECT_EQ(c.logit_bias[2].second, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(c.typical_p, 0.9);
  EXPECT_EQ(c.dry.multiplier, 0.8);
  EXPECT_EQ(c.dry.sequence_breakers, (std::vector<std::string>{"###", "\n"}));
  EXPECT_TRUE(Validate(c).ok());
  ASSERT_TRUE(ApplyFlag(c, "--dry-sequence-breaker", "none").ok());
  EXPECT_TRUE(c.dry.sequence_breakers.empty());
  ASSERT_TRUE(ApplyFlag(c, "--seed", "-1").ok());
  EXPECT_FALSE(c.seed.has_value());
  EXPECT_TRUE(IsSamplerFlag("--hlg-pivot"));
  EXPECT_TRUE(IsSamplerFlag("--mirostat-lr"));
  EXPECT_FALSE(IsSamplerFlag("--model"));
  EXPECT_GT(SamplerFlags().size(), 25u);
}

TEST(SamplerFlags, LogitBiasCommaListAndRepeats) {
  SamplerConfig c;
  ASSERT_TRUE(ApplyFlag(c, "--logit-bias", "15=-inf,7+2.5").ok());
  ASSERT_TRUE(ApplyFlag(c, "--logit-bias", "9-1").ok());
  ASSERT_EQ(c.logit_bias.size(), 3u);
  EXPECT_EQ(c.logit_bias[0].first, 15);
  EXPECT_EQ(c.logit_bias[0].second, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(c.logit_bias[1], (std::pair<int32_t, double>{7, 2.5}));
  EXPECT_EQ(c.logit_bias[2], (std::pair<int32_t, double>{9, -1}));
}

TEST(SamplerFlags, ErrorsNameTheFlag) {
  EXPECT_EQ(FlagError("--hlg-width", "-1"), "--hlg-width: must be > 0, got -1");
  EXPECT_EQ(FlagError("--top-p", "abc"), "--top-p: expected a number, got 'abc'");
  EXPECT_EQ(FlagError("--top-p", "1.5"), "--top-p: must be in (0, 1], got 1.5");
  EXPECT_EQ(FlagError("--top-k", "4.5"), "--top-k: must be an integer, got 4.5");
  EXPECT_EQ(FlagError("--temp", "nan"), "--temp: must be finite, got nan");
  EXPECT_EQ(FlagError("--temp", ""), "--temp: expected a number, got ''");
  EXPECT_EQ(FlagError("--hlg-sampling", "maybe"), "--hlg-sampling: must be on or off, got 'maybe'");
  EXPECT_EQ(FlagError("--hlg-pivot", "max"),
            "--hlg-pivot: must be top, entropy or median, got 'max'");
  EXPECT_EQ(FlagError("--seed", "x"),
            "--seed: expected a non-negative integer (or -1 for random), got 'x'");
  EXPECT_EQ(FlagError("--logit-bias", "abc"),
            "--logit-bias: expected TOKEN+BIAS, TOKEN-BIAS or TOKEN=BIAS (several: "
            "comma-separated or the flag repeated), got 'abc'");
  EXPECT_EQ(FlagError("--logit-bias", "5=-inf,abc"),
            "--logit-bias: expected TOKEN+BIAS, TOKEN-BIAS or TOKEN=BIAS (several: "
            "comma-separated or the flag repeated), got 'abc'");
  EXPECT_EQ(FlagError("--logit-bias", "x+1"),
            "--logit-bias: token id must be a non-negative integer, got 'x'");
  EXPECT_EQ(FlagError("--mirostat", "1"),
            "--mirostat: mirostat v1 is not supported; use 0 (off) or 2");
  EXPECT_EQ(FlagError("--frobnicate", "1"), "--frobnicate: unknown sampler flag");
  EXPECT_EQ(FlagError("--curve", "/nonexistent/c.json").substr(0, 29),
            "--curve: /nonexistent/c.json:");
}

TEST(CurveFile, LoadsAndReportsErrorsWithPath) {
  const auto dir = std::filesystem::temp_directory_path() / "lumen_sample_curve_test";
  std::filesystem::create_directories(dir);
  const std::string good = (dir / "good.json").string();
  const std::string bad = (dir / "bad.json").string();
  const std::string junk = (dir / "junk.json").string();
  std::ofstream(good) << R"({"points": [[0.1, 0.5], [10, 12], [100, 100]]})";
  std::ofstream(bad) << R"({"points": [[0.1, 0.5], [10, 0.2]]})";
  std::ofstream(junk) << "{points";
  auto g = LoadCurveFile(good);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ(g->points.size(), 3u);
  EXPECT_TRUE(g->enabled);
  EXPECT_EQ(LoadCurveFile(bad).status().message(),
            bad +
                ": curve.points[1]: y must not decrease, got 0.2 after 0.5 (set "
                "allow_nonmonotone to allow)");
  EXPECT_EQ(LoadCurveFile(junk).status().message(), junk + ": not valid JSON");
  SamplerConfig c;
  ASSERT_TRUE(ApplyFlag(c, "--curve", good).ok());
  EXPECT_TRUE(c.curve.enabled);
  EXPECT_EQ(ApplyFlag(c, "--curve", bad).message().substr(0, 9 + bad.size()), "--curve: " + bad);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lumen::sample
