#include "lumen/train/lambda_controller.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "lumen/core/check.h"

namespace lumen::train {

namespace {

constexpr int kStateVersion = 2;  // 2: warm holds the last readings of WARMUP

// Shortest of 2..6 decimals that shows v to 1e-9: 0.1 -> "0.10",
// 0.15000000000000002 -> "0.15", 0.075 -> "0.075".
std::string Num(double v) {
  for (int p = 2; p <= 6; ++p) {
    std::string s = fmt::format("{:.{}f}", v, p);
    if (std::fabs(std::strtod(s.c_str(), nullptr) - v) <= 1e-9 * std::max(1.0, std::fabs(v))) {
      return s;
    }
  }
  return fmt::format("{:.6g}", v);
}

struct Fit {
  double end_level = 0, slope = 0, sigma = 0;
};

// Least-squares line through y at x = 0..n-1: its value at the last x, its
// slope and the residual standard deviation (n - 2 degrees of freedom),
// floored at 1e-6 * max(1, |mean|) so a noiseless (synthetic) warmup does not
// give zero thresholds.
Fit LineFit(const std::vector<double>& y) {
  const int n = int(y.size());
  const double xbar = 0.5 * (n - 1);
  double ybar = 0;
  for (double v : y) ybar += v;
  ybar /= n;
  double sxx = 0, sxy = 0;
  for (int i = 0; i < n; ++i) {
    sxx += (i - xbar) * (i - xbar);
    sxy += (i - xbar) * (y[i] - ybar);
  }
  Fit f;
  f.slope = sxy / sxx;
  f.end_level = ybar + f.slope * (n - 1 - xbar);
  double ssr = 0;
  for (int i = 0; i < n; ++i) {
    const double r = y[i] - (ybar + f.slope * (i - xbar));
    ssr += r * r;
  }
  f.sigma = std::max(std::sqrt(ssr / (n - 2)), 1e-6 * std::max(1.0, std::fabs(ybar)));
  return f;
}

// The noise of y from its second differences: for a smooth curve plus white
// noise of standard deviation sigma, y[i] - 2 y[i+1] + y[i+2] has variance
// 6 sigma^2 plus the square of the curve's local curvature, which is small
// once the curve bends slowly (a steep but straight or gently curving run
// cancels out, unlike in a line's residuals). The root mean square of the
// n - 2 differences over sqrt(6), floored like LineFit. n >= 3.
double SecondDiffSigma(const std::vector<double>& y) {
  const int n = int(y.size());
  double ss = 0, mean = 0;
  for (int i = 0; i + 2 < n; ++i) {
    const double d = y[i] - 2 * y[i + 1] + y[i + 2];
    ss += d * d;
  }
  for (double v : y) mean += v;
  mean /= n;
  return std::max(std::sqrt(ss / (6.0 * (n - 2))), 1e-6 * std::max(1.0, std::fabs(mean)));
}

// The residual standard deviation of a least-squares parabola through y at
// x = 0..n-1 (n - 3 degrees of freedom), floored like LineFit; 0 when n < 4.
double ParabolaSigma(const std::vector<double>& y) {
  const int n = int(y.size());
  if (n < 4) return 0;
  // Project out the orthogonal polynomials 1, x - xbar, (x - xbar)^2 - c.
  const double xbar = 0.5 * (n - 1);
  double c = 0, mean = 0;
  for (int i = 0; i < n; ++i) c += (i - xbar) * (i - xbar);
  c /= n;
  std::vector<double> r = y;
  for (double v : y) mean += v;
  mean /= n;
  for (int k = 0; k < 3; ++k) {
    auto basis = [&](int i) {
      const double x = i - xbar;
      return k == 0 ? 1.0 : k == 1 ? x : x * x - c;
    };
    double num = 0, den = 0;
    for (int i = 0; i < n; ++i) {
      num += basis(i) * r[i];
      den += basis(i) * basis(i);
    }
    for (int i = 0; i < n; ++i) r[i] -= num / den * basis(i);
  }
  double ss = 0;
  for (double v : r) ss += v * v;
  return std::max(std::sqrt(ss / (n - 3)), 1e-6 * std::max(1.0, std::fabs(mean)));
}

void HoltStep(HoltState& h, double ema, double x) {
  const double prev = h.level;
  h.level = ema * (h.level + h.trend) + (1 - ema) * x;
  h.trend = ema * h.trend + (1 - ema) * (h.level - prev);
}

bool Finite(double v) { return std::isfinite(v); }

}  // namespace

HoltGains HoltNoiseGains(double ema) {
  HoltState h;
  double sl = 0, st = 0;
  for (int64_t k = 0; k < 100000000; ++k) {
    HoltStep(h, ema, k == 0 ? 1.0 : 0.0);
    sl += h.level * h.level;
    st += h.trend * h.trend;
    if (k > 8 && std::fabs(h.level) + std::fabs(h.trend) < 1e-20) break;
  }
  return {std::sqrt(sl), std::sqrt(st)};
}

Status ValidateControllerOptions(const ControllerOptions& o) {
  const std::pair<const char*, double> finite[] = {{"initial", o.initial},
                                                   {"min", o.min},
                                                   {"max", o.max},
                                                   {"ramp", o.ramp},
                                                   {"backoff", o.backoff},
                                                   {"noise_sigmas", o.noise_sigmas},
                                                   {"ema", o.ema},
                                                   {"kp", o.kp},
                                                   {"kd", o.kd},
                                                   {"ki", o.ki},
                                                   {"degeneration", o.degeneration}};
  for (const auto& [name, v] : finite) {
    if (!Finite(v)) return Errorf("controller {}: {} is not finite", name, v);
  }
  if (o.kind == ControllerKind::kStatic) return Status::Ok();
  if (!(o.min > 0)) return Errorf("controller min {}: must be > 0", o.min);
  if (!(o.max >= o.min)) return Errorf("controller max {}: below min {}", o.max, o.min);
  if (!(o.ramp > 0)) return Errorf("controller ramp {}: must be > 0", o.ramp);
  if (!(o.backoff > 0 && o.backoff < 1)) {
    return Errorf("controller backoff {}: must be in (0, 1)", o.backoff);
  }
  if (o.hysteresis < 1) return Errorf("controller hysteresis {}: must be >= 1", o.hysteresis);
  if (o.warmup_readings < 3) {
    return Errorf("controller warmup_readings {}: must be >= 3 (a line and its noise)",
                  o.warmup_readings);
  }
  if (!(o.noise_sigmas > 0))
    return Errorf("controller noise_sigmas {}: must be > 0", o.noise_sigmas);
  if (!(o.ema >= 0 && o.ema < 1)) return Errorf("controller ema {}: must be in [0, 1)", o.ema);
  if (o.kp < 0 || o.kd < 0 || o.ki < 0) {
    return Errorf("controller gains kp {} kd {} ki {}: must be >= 0", o.kp, o.kd, o.ki);
  }
  if (o.degeneration < 0) return Errorf("controller degeneration {}: must be >= 0", o.degeneration);
  return Status::Ok();
}

LambdaController::LambdaController(const ControllerOptions& o) : o_(o) {
  LUMEN_CHECK(ValidateControllerOptions(o).ok());
  if (o_.kind == ControllerKind::kStatic) {
    value_ = o_.initial;
    phase_ = ControlPhase::kHold;
    return;
  }
  gains_ = HoltNoiseGains(o_.ema);
  value_ = o_.min;
  ref_ = o_.min;
  phase_ = ControlPhase::kWarmup;
}

double LambdaController::Update(const ControlReading& r) {
  reason_.clear();
  if (o_.kind == ControllerKind::kStatic || phase_ == ControlPhase::kFrozen) {
    ++readings_;
    last_step_ = r.step;
    return value_;
  }
  for (const auto& [name, v] :
       {std::pair<const char*, double>{"l_w", r.l_w}, {"l_r", r.l_r}, {"margin", r.margin}}) {
    if (!Finite(v)) {
      reason_ = fmt::format("step {}: {} is {}: reading ignored", r.step, name, v);
      return value_;
    }
  }
  ++readings_;
  last_step_ = r.step;
  if (phase_ == ControlPhase::kWarmup) {
    warm_.push_back(r);  // the last warmup_readings readings, for RemeasureNoise
    if (int64_t(warm_.size()) > o_.warmup_readings) warm_.erase(warm_.begin());
  }
  if (readings_ <= o_.warmup_readings) {
    if (readings_ == o_.warmup_readings) FinishWarmupReadings();
    return value_;
  }
  HoltStep(holt_[kW], o_.ema, r.l_w);
  HoltStep(holt_[kR], o_.ema, r.l_r);
  HoltStep(holt_[kM], o_.ema, r.margin);
  best_w_ = std::max(best_w_, holt_[kW].level);
  Decide();
  return value_;
}

void LambdaController::SetThresholds(const double sigma[3]) {
  const double n = o_.noise_sigmas;
  th_.sigma_w = sigma[kW];
  th_.sigma_r = sigma[kR];
  th_.sigma_m = sigma[kM];
  th_.trend_w = n * th_.sigma_w * gains_.trend;
  th_.trend_r = n * th_.sigma_r * gains_.trend;
  th_.trend_m = n * th_.sigma_m * gains_.trend;
  th_.level_drop = 2 * n * th_.sigma_w * gains_.level;
  th_.degeneration = o_.degeneration > 0 ? o_.degeneration : 2 * th_.level_drop;
}

void LambdaController::FinishWarmupReadings() {
  double sigma[3];
  for (int s = 0; s < 3; ++s) {
    const Fit f = LineFit(WarmSignal(s));
    holt_[s] = {f.end_level, f.slope};
    sigma[s] = f.sigma;
  }
  SetThresholds(sigma);
  best_w_ = holt_[kW].level;
}

void LambdaController::RemeasureNoise() {
  double sigma[3];
  for (int s = 0; s < 3; ++s) {
    const std::vector<double> y = WarmSignal(s);
    const Fit f = LineFit(y);
    holt_[s] = {f.end_level, f.slope};
    sigma[s] = std::max(SecondDiffSigma(y), ParabolaSigma(y));
  }
  SetThresholds(sigma);
  best_w_ = holt_[kW].level;
  warm_.clear();
}

std::vector<double> LambdaController::WarmSignal(int s) const {
  std::vector<double> y;
  for (const auto& r : warm_) y.push_back(s == kW ? r.l_w : s == kR ? r.l_r : r.margin);
  return y;
}

// value + ramp, clamped at max; within a billionth of a ramp of max counts as
// max, so 0.05 + 9 x 0.05 lands on 0.5 rather than 0.49999999999999994.
double LambdaController::RampUp(double v) const {
  const double n = v + o_.ramp;
  return n >= o_.max - 1e-9 * o_.ramp ? o_.max : n;
}

void LambdaController::SetPhase(ControlPhase p) {
  phase_ = p;
  st_ = {};
}

void LambdaController::Cut(const char* why) {
  const double old = value_;
  value_ = std::max(o_.min, value_ * o_.backoff);
  if (value_ != old || phase_ != ControlPhase::kBackoff) {
    reason_ = fmt::format("{}: backoff {} -> {}", why, Num(old), Num(value_));
  }
  SetPhase(ControlPhase::kBackoff);
}

void LambdaController::Decide() {
  const double tw = holt_[kW].trend;
  const bool improving = tw > th_.trend_w;
  const bool trend_fall = tw < -th_.trend_w;
  const bool falling = trend_fall;
  const bool recovered = !trend_fall && best_w_ - holt_[kW].level <= th_.level_drop;
  const bool displaced = falling && holt_[kM].trend > th_.trend_m && holt_[kR].trend < -th_.trend_r;
  const bool degenerate =
      phase_ != ControlPhase::kWarmup && th_.warmup_level - holt_[kW].level > th_.degeneration;
  auto count = [](int& s, bool c) { s = c ? s + 1 : 0; };
  count(st_.plateau, !improving && !trend_fall);
  count(st_.falling, falling);
  count(st_.stopped, !trend_fall);
  count(st_.recovered, recovered);
  count(st_.displaced, displaced);
  count(st_.degenerate, degenerate);
  const int k = o_.hysteresis;

  if (phase_ == ControlPhase::kWarmup) {
    if (st_.plateau >= k) {
      RemeasureNoise();
      th_.warmup_level = holt_[kW].level;
      const double old = value_;
      value_ = RampUp(value_);
      ref_ = value_;
      reason_ = fmt::format("l_w plateaued: ramp {} -> {} (noise of l_w {:.2g})", Num(old),
                            Num(value_), th_.sigma_w);
      SetPhase(ControlPhase::kRamp);
    }
    return;
  }
  if (st_.degenerate >= k) {
    const double old = value_;
    value_ = o_.min;
    reason_ = fmt::format(
        "l_w degenerated: level {:.4f} is {:.4f} below its warmup level {:.4f} (threshold "
        "{:.4f}): frozen {} -> {}",
        holt_[kW].level, th_.warmup_level - holt_[kW].level, th_.warmup_level, th_.degeneration,
        Num(old), Num(value_));
    SetPhase(ControlPhase::kFrozen);
    return;
  }
  if (o_.kind == ControllerKind::kAimd) {
    DecideAimd(falling);
  } else {
    DecidePid(falling);
  }
}

void LambdaController::DecideAimd(bool falling) {
  const int k = o_.hysteresis;
  const double old = value_;
  switch (phase_) {
    case ControlPhase::kRamp:
      if (st_.displaced >= k) {
        Cut("displacement (margin up, l_r down, l_w down)");
      } else if (st_.falling >= k) {
        reason_ = fmt::format("l_w falling without displacement: hold at {}", Num(value_));
        SetPhase(ControlPhase::kHold);
      } else if (!falling) {
        value_ = RampUp(value_);
        if (value_ != old) {
          reason_ = fmt::format("l_w holds: ramp {} -> {}", Num(old), Num(value_));
        }
      }
      break;
    case ControlPhase::kBackoff:
      if (st_.displaced >= k) {
        Cut("displacement persists");
      } else if (st_.stopped >= k) {
        reason_ = fmt::format("l_w stopped falling: hold at {}", Num(value_));
        SetPhase(ControlPhase::kHold);
      }
      break;
    case ControlPhase::kHold:
      if (st_.displaced >= k) {
        Cut("displacement (margin up, l_r down, l_w down)");
      } else if (st_.recovered >= k) {
        value_ = RampUp(value_);
        reason_ = fmt::format("l_w recovered: ramp {} -> {}", Num(old), Num(value_));
        SetPhase(ControlPhase::kRamp);
      }
      break;
    default:
      break;
  }
}

double LambdaController::PidOutput(double e, double d) const {
  const double kd = o_.kind == ControllerKind::kP ? 0.0 : o_.kd;
  const double ki = o_.kind == ControllerKind::kPid ? o_.ki : 0.0;
  const double u = ref_ - (o_.max - o_.min) * (o_.kp * e + kd * d + ki * integral_);
  return std::clamp(u, o_.min, o_.max);
}

void LambdaController::DecidePid(bool falling) {
  const int k = o_.hysteresis;
  const double old = value_;
  bool entered = false;
  if (phase_ == ControlPhase::kRamp) {
    if (st_.falling < k) {
      if (!falling) ref_ = RampUp(ref_);
      value_ = PidOutput(0, 0);
      if (value_ != old)
        reason_ = fmt::format("no degradation: push {} -> {}", Num(old), Num(value_));
      return;
    }
    SetPhase(ControlPhase::kBackoff);  // confirmed: the law below acts from this reading
    entered = true;
  } else if (phase_ == ControlPhase::kBackoff && st_.recovered >= k) {
    ref_ = RampUp(ref_);
    value_ = PidOutput(0, 0);
    reason_ = value_ != old ? fmt::format("l_w recovered: push {} -> {}", Num(old), Num(value_))
                            : fmt::format("l_w recovered: push resumes at {}", Num(value_));
    SetPhase(ControlPhase::kRamp);
    return;
  }
  if (phase_ != ControlPhase::kBackoff) return;
  const double e = std::max(0.0, (best_w_ - holt_[kW].level) / th_.level_drop - 1);
  const double d = std::max(0.0, -holt_[kW].trend / th_.trend_w - 1);
  // Anti-windup: the integral grows only while the output is not pinned at min.
  if (o_.kind == ControllerKind::kPid && o_.ki > 0) {
    const double pre = ref_ - (o_.max - o_.min) * (o_.kp * e + o_.kd * d + o_.ki * integral_);
    if (pre > o_.min) integral_ += e;
  }
  value_ = PidOutput(e, d);
  if (value_ != old || entered) {
    reason_ =
        fmt::format("l_w degrading ({:.2f} level, {:.2f} slope thresholds past noise): {} {} -> {}",
                    e, d, entered ? "backoff" : "adjust", Num(old), Num(value_));
  }
}

namespace {

nlohmann::json OptionsJson(const ControllerOptions& o) {
  return {{"kind", ControllerKindName(o.kind)},
          {"initial", o.initial},
          {"min", o.min},
          {"max", o.max},
          {"ramp", o.ramp},
          {"backoff", o.backoff},
          {"hysteresis", o.hysteresis},
          {"warmup_readings", o.warmup_readings},
          {"noise_sigmas", o.noise_sigmas},
          {"ema", o.ema},
          {"kp", o.kp},
          {"kd", o.kd},
          {"ki", o.ki},
          {"degeneration", o.degeneration}};
}

Result<ControlPhase> ParsePhase(std::string_view s) {
  for (auto p : {ControlPhase::kWarmup, ControlPhase::kRamp, ControlPhase::kBackoff,
                 ControlPhase::kHold, ControlPhase::kFrozen}) {
    if (PhaseName(p) == s) return p;
  }
  return Errorf("unknown phase '{}'", s);
}

}  // namespace

nlohmann::json LambdaController::Serialize() const {
  nlohmann::json warm = nlohmann::json::array();
  for (const auto& r : warm_) warm.push_back({r.step, r.l_w, r.l_r, r.margin, r.accuracy, r.nll});
  nlohmann::json holt = nlohmann::json::array();
  for (const auto& h : holt_) holt.push_back({h.level, h.trend});
  return {{"version", kStateVersion},
          {"options", OptionsJson(o_)},
          {"value", value_},
          {"phase", PhaseName(phase_)},
          {"reason", reason_},
          {"readings", readings_},
          {"last_step", last_step_},
          {"warm", warm},
          {"holt", holt},
          {"thresholds",
           {th_.sigma_w, th_.sigma_r, th_.sigma_m, th_.trend_w, th_.trend_r, th_.trend_m,
            th_.level_drop, th_.degeneration, th_.warmup_level}},
          {"best_w", best_w_},
          {"streaks",
           {st_.plateau, st_.falling, st_.stopped, st_.recovered, st_.displaced, st_.degenerate}},
          {"ref", ref_},
          {"integral", integral_}};
}

Result<LambdaController> LambdaController::Restore(const ControllerOptions& o,
                                                   const nlohmann::json& s) {
  LUMEN_RETURN_IF_ERROR(ValidateControllerOptions(o));
  LambdaController c(o);
  try {
    if (!s.is_object()) return Error("controller state: not a JSON object");
    if (s.at("version").get<int>() != kStateVersion) {
      return Errorf("controller state: version {} (this build reads {})", s.at("version").dump(),
                    kStateVersion);
    }
    const nlohmann::json want = OptionsJson(o);
    const nlohmann::json& have = s.at("options");
    for (auto it = want.begin(); it != want.end(); ++it) {
      if (!have.contains(it.key()) || have.at(it.key()) != it.value()) {
        return Errorf("controller state: saved with {} {}, but the options say {}", it.key(),
                      have.contains(it.key()) ? have.at(it.key()).dump() : "nothing",
                      it.value().dump());
      }
    }
    c.value_ = s.at("value").get<double>();
    LUMEN_ASSIGN_OR_RETURN(c.phase_, ParsePhase(s.at("phase").get<std::string>()));
    c.reason_ = s.at("reason").get<std::string>();
    c.readings_ = s.at("readings").get<int64_t>();
    c.last_step_ = s.at("last_step").get<int64_t>();
    for (const auto& w : s.at("warm")) {
      ControlReading r;
      r.step = w.at(0).get<int64_t>();
      r.l_w = w.at(1).get<double>();
      r.l_r = w.at(2).get<double>();
      r.margin = w.at(3).get<double>();
      r.accuracy = w.at(4).get<double>();
      r.nll = w.at(5).get<double>();
      c.warm_.push_back(r);
    }
    const auto& holt = s.at("holt");
    if (holt.size() != 3) return Error("controller state: holt needs 3 signals");
    for (int i = 0; i < 3; ++i) {
      c.holt_[i] = {holt.at(i).at(0).get<double>(), holt.at(i).at(1).get<double>()};
    }
    const auto& t = s.at("thresholds");
    double* th[] = {&c.th_.sigma_w,    &c.th_.sigma_r,      &c.th_.sigma_m,
                    &c.th_.trend_w,    &c.th_.trend_r,      &c.th_.trend_m,
                    &c.th_.level_drop, &c.th_.degeneration, &c.th_.warmup_level};
    if (t.size() != std::size(th)) return Error("controller state: thresholds needs 9 values");
    for (size_t i = 0; i < std::size(th); ++i) *th[i] = t.at(i).get<double>();
    c.best_w_ = s.at("best_w").get<double>();
    const auto& st = s.at("streaks");
    int* sp[] = {&c.st_.plateau,   &c.st_.falling,   &c.st_.stopped,
                 &c.st_.recovered, &c.st_.displaced, &c.st_.degenerate};
    if (st.size() != std::size(sp)) return Error("controller state: streaks needs 6 counts");
    for (size_t i = 0; i < std::size(sp); ++i) {
      *sp[i] = st.at(i).get<int>();
      if (*sp[i] < 0) return Error("controller state: negative streak");
    }
    c.ref_ = s.at("ref").get<double>();
    c.integral_ = s.at("integral").get<double>();
  } catch (const nlohmann::json::exception& e) {
    return Errorf("controller state: {}", e.what());
  }
  const bool adaptive = o.kind != ControllerKind::kStatic;
  if (adaptive && !(c.value_ >= o.min && c.value_ <= o.max)) {
    return Errorf("controller state: value {} outside [{}, {}]", c.value_, o.min, o.max);
  }
  if (!adaptive && c.value_ != o.initial) {
    return Errorf("controller state: static value {} but the options say {}", c.value_, o.initial);
  }
  const int64_t want_warm =
      c.phase_ == ControlPhase::kWarmup ? std::min<int64_t>(c.readings_, o.warmup_readings) : 0;
  if (c.readings_ < 0 || (adaptive && int64_t(c.warm_.size()) != want_warm)) {
    return Errorf("controller state: {} warmup readings stored after {} readings", c.warm_.size(),
                  c.readings_);
  }
  return c;
}

Result<ControllerKind> ParseControllerKind(std::string_view s) {
  for (auto k : {ControllerKind::kStatic, ControllerKind::kAimd, ControllerKind::kP,
                 ControllerKind::kPd, ControllerKind::kPid}) {
    if (ControllerKindName(k) == s) return k;
  }
  return Errorf("unknown lambda controller '{}' (expected static, aimd, p, pd or pid)", s);
}

std::string_view ControllerKindName(ControllerKind k) {
  static constexpr std::string_view kNames[] = {"static", "aimd", "p", "pd", "pid"};
  return kNames[int(k)];
}

std::string_view PhaseName(ControlPhase p) {
  static constexpr std::string_view kNames[] = {"warmup", "ramp", "backoff", "hold", "frozen"};
  return kNames[int(p)];
}

}  // namespace lumen::train
