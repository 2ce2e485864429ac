#include "lumen/train/range_probe.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace lumen::train {

namespace {
constexpr std::string_view kNames[kNumProbeSites] = {
    "product.x", "product_t.dy", "head.xn", "head.coeff", "lora.x", "lora.u", "lora.dy", "lora.du"};
constexpr double kF16Max = 65504.0;
const double kF16MinSub = std::ldexp(1.0, -24), kF16MinNormal = std::ldexp(1.0, -14);
const double kBf16MinNormal = std::ldexp(1.0, -126);
// The largest finite bf16: (2 - 2^-7) 2^127.
const double kBf16Max = (2.0 - std::ldexp(1.0, -7)) * std::ldexp(1.0, 127);

std::string Verdict(const RangeStats& s, bool f16) {
  const int64_t flush = f16 ? s.f16_flush : s.bf16_flush;
  const int64_t over = f16 ? s.f16_overflow : s.bf16_overflow;
  std::string v;
  if (over) v += fmt::format("overflows ({} values)", over);
  if (flush)
    v += fmt::format("{}underflows to 0 ({} values, {:.2g}%)", v.empty() ? "" : ", ", flush,
                     100.0 * double(flush) / double(std::max<int64_t>(1, s.nonzero)));
  if (f16 && s.f16_subnormal > flush)
    v += fmt::format(
        "{}subnormal ({} values, {:.2g}%)", v.empty() ? "" : ", ", s.f16_subnormal - flush,
        100.0 * double(s.f16_subnormal - flush) / double(std::max<int64_t>(1, s.nonzero)));
  return v.empty() ? "fits" : v;
}
}  // namespace

std::string_view ProbeSiteName(ProbeSite s) { return kNames[int(s)]; }

void RangeProbe::Record(ProbeSite site, const float* v, int64_t n) {
  RangeStats& s = stats_[int(site)];
  double mx = s.max_abs,
         mn = s.min_nonzero > 0 ? s.min_nonzero : std::numeric_limits<double>::max();
  int64_t nz = 0, f16f = 0, f16s = 0, f16o = 0, bff = 0, bfo = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double a = std::fabs(double(v[i]));
    if (a == 0) continue;
    ++nz;
    mx = std::max(mx, a);
    mn = std::min(mn, a);
    // Below f16's smallest subnormal: zero, or that subnormal (error >= 50%).
    f16f += a < kF16MinSub;
    f16s += a < kF16MinNormal;
    f16o += a > kF16Max;
    bff += a < kBf16MinNormal;
    bfo += a > kBf16Max;
  }
  s.values += n;
  s.nonzero += nz;
  s.max_abs = mx;
  if (nz) s.min_nonzero = mn;
  s.f16_flush += f16f;
  s.f16_subnormal += f16s;
  s.f16_overflow += f16o;
  s.bf16_flush += bff;
  s.bf16_overflow += bfo;
}

std::string RangeProbe::Describe() const {
  std::string out = fmt::format("{:<13} {:>10} {:>12} {:>12}  {:<64} {}\n", "operands", "values",
                                "max |v|", "min |v|>0", "as f16", "as bf16");
  for (int i = 0; i < kNumProbeSites; ++i) {
    const RangeStats& s = stats_[i];
    if (s.values == 0) continue;
    out += fmt::format("{:<13} {:>10} {:>12.4g} {:>12.4g}  {:<64} {}\n", kNames[i], s.values,
                       s.max_abs, s.min_nonzero, Verdict(s, true), Verdict(s, false));
  }
  return out;
}

nlohmann::json RangeProbe::Json() const {
  nlohmann::json j = nlohmann::json::object();
  for (int i = 0; i < kNumProbeSites; ++i) {
    const RangeStats& s = stats_[i];
    if (s.values == 0) continue;
    j[std::string(kNames[i])] = {{"max_abs", s.max_abs},
                                 {"min_nonzero", s.min_nonzero},
                                 {"values", s.values},
                                 {"nonzero", s.nonzero},
                                 {"f16_flush", s.f16_flush},
                                 {"f16_subnormal", s.f16_subnormal},
                                 {"f16_overflow", s.f16_overflow},
                                 {"bf16_flush", s.bf16_flush},
                                 {"bf16_overflow", s.bf16_overflow},
                                 {"f16", Verdict(s, true)},
                                 {"bf16", Verdict(s, false)}};
  }
  return j;
}

}  // namespace lumen::train
