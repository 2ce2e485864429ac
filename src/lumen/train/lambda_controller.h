// The preference-pressure controller (issue 17): drives ORPO's lambda (or
// SimPO's beta) from readings of the preference metrics taken at each
// evaluation, instead of holding it fixed.
//
// Signals. Each reading gives l_w (mean per-token log-prob of the chosen
// answers), l_r (of the rejected), the margin, accuracy and nll; the
// controller uses l_w, l_r and the margin (accuracy and nll are for logs).
// Every signal is smoothed by Holt's linear filter (double exponential
// smoothing: a level and a trend, both with weight `ema` on the past):
//   level' = ema (level + trend) + (1 - ema) x
//   trend' = ema trend + (1 - ema) (level' - level)
// It follows a straight line with neither lag nor bias, so the trend is the
// robust slope (per reading); raw deltas are never used.
//
// Noise and thresholds, measured twice from the signal itself (no hand
// constants). (1) The first `warmup_readings` readings (at least 3): per
// signal, sigma = the residual standard deviation of a least-squares line
// through them (n - 2 degrees of freedom), and the filter starts from that
// line (level = its end value, trend = its slope). These readings usually
// fall on the steep early part of training, a curve rather than a line, so
// this sigma is mostly curvature (0.6-1.3 nats/token on the issue-17
// experiment, against a true reading-to-reading noise of 0.01-0.02); it only
// serves to tell when WARMUP's improvement has slowed. (2) When WARMUP ends
// (plateau x K), the noise is measured again on the last `warmup_readings`
// readings, where the improvement has slowed, by two estimators that a
// smooth trend does not fool: their second differences (for a smooth curve
// plus white noise, y[i] - 2 y[i+1] + y[i+2] has variance 6 sigma^2 plus the
// squared local curvature, so a trend, even a steep one, drops out: sigma =
// rms / sqrt(6)) and the residuals of a least-squares parabola through them
// (n - 3 degrees of freedom; none below 4 readings). sigma = the larger of
// the two: each is unbiased on noise around a gentle curve, and the larger
// guards against a low fluke of either on few readings, which would let noise
// alone change the phase. On the issue-17 runs this gives 0.01-0.05
// nats/token where the first measurement gave 0.6-1.3. The filter restarts
// from the line through those readings (so it does not ring on the bend out
// of the steep part), and the best and warmup levels start from there. The
// thresholds used from then on:
//   trend threshold   tau_T = noise_sigmas * sigma * gain_trend      (per signal)
//   level-drop        tau_L = 2 * noise_sigmas * sigma_w * gain_level (l_w; 2x: the
//                             best level is itself up to noise_sigmas high and
//                             the current one as much low)
//   degeneration      D = `degeneration`, or 2 * tau_L when it is 0
// Derived signals (each reading after the warmup readings):
//   improving  trend_w >  tau_T(w)
//   plateau    |trend_w| <= tau_T(w)
//   falling    trend_w < -tau_T(w)
//   recovered  not falling  and  best_w - level_w <= tau_L (best_w: the highest
//              l_w level so far)
// Only the slope enters a phase: best_w is the running maximum of a noisy
// level, biased upward the longer the run (about sqrt(2 ln N) of its sigma
// after N readings), so a test against it would let noise alone change the
// phase on long runs. It is used only where a high best errs toward caution:
// leaving HOLD/BACKOFF (recovered), and the size of the P/PID retreat.
//   displaced  falling  and  trend_m > tau_T(m)  and  trend_r < -tau_T(r): the
//              margin grows because l_r falls while l_w falls. (The issue also
//              counts "l_w stalls", but it calls a flat l_w with a growing
//              margin healthy; the two overlap, and a flat l_w is what RAMP
//              runs on, so here displacement needs l_w to fall.)
//   degenerate (after WARMUP) warmup_level - level_w > D, warmup_level being
//              the l_w level when WARMUP ended (the fit reached at lambda_min).
// Hysteresis: a phase changes only after its condition held on `hysteresis`
// (K) consecutive readings; all counts restart at every phase change and at
// every backoff, so each phase lasts at least K readings.
//
// kStatic: value() is `initial` forever (bit-identical to a fixed lambda);
// the phase is kHold. Adaptive kinds start at `min` in kWarmup (`initial` is
// not used) and share WARMUP and the degeneration guard:
//   WARMUP  at min during the warmup readings and while l_w improves;
//           plateau x K -> RAMP (+ramp on entry).
//   any     degenerate x K -> FROZEN at min, for good (the guard never thaws).
// kAimd:
//   RAMP    +ramp per reading while l_w is not falling (clamped at max; a
//           falling reading not yet confirmed pauses the ramp);
//           displaced x K -> BACKOFF (value * backoff, clamped at min);
//           falling x K (without displacement) -> HOLD.
//   BACKOFF displaced x K again -> another cut; trend_w >= -tau_T(w) x K
//           (l_w stopped falling) -> HOLD.
//   HOLD    displaced x K -> BACKOFF (cut); recovered x K -> RAMP (+ramp on
//           entry). If l_w never comes back within tau_L of its best, AIMD
//           holds for good (only the guard acts from there).
// kP, kPd, kPid act on the l_w error against its best level so far:
//   value = clamp(ref - (max - min) (kp e + kd d + ki I), min, max)
//   e = max(0, (best_w - level_w) / tau_L - 1)   deficit beyond the noise band
//   d = max(0, -trend_w / tau_T(w) - 1)          fall rate beyond the noise band
//   I = sum of e over the readings in BACKOFF whose output, before adding,
//       was above min (anti-windup: no accumulation while clamped)
//   ref: the push reference, +ramp per RAMP reading whose l_w is not falling,
//       clamped to [min, max] (so it cannot wind up at max either); held in
//       BACKOFF.
// Units: e and d count thresholds past the noise band, so the gains are
// fractions of the [min, max] range per threshold. With the default
// degeneration threshold (2 tau_L, i.e. e = 1) kp = 1 means the P term alone
// reaches min just as the deficit reaches the degeneration guard; kd = 0.5
// retreats half the range for a fall twice the slope threshold; ki = 0.1
// keeps a tenth of the range per reading at e = 1. kP uses kp only, kPd kp
// and kd, kPid all three. Biased toward pushing: e and d act only in BACKOFF,
// entered on falling x K (confirmed degradation) and left on recovered x K
// (-> RAMP, +ramp to ref on entry). The integral never unwinds: it outlives
// BACKOFF and lowers the ceiling to max - (max - min) ki I, so PID remembers
// where the cliff was and settles below it, where P returns to its reference.
//
// last_reason(): why the last Update changed the value or the phase, e.g.
// "l_w plateaued: ramp 0.05 -> 0.10 (noise of l_w 0.012)" (the second
// measurement) or "l_w holds: ramp 0.10 -> 0.15"; empty when it changed neither. A
// reading with a non-finite l_w, l_r or margin is ignored (the state does not
// move) and last_reason() says so.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "lumen/core/status.h"

namespace lumen::train {

struct ControlReading {
  int64_t step = 0;
  double l_w = 0, l_r = 0, margin = 0, accuracy = 0, nll = 0;
};

enum class ControllerKind { kStatic, kAimd, kP, kPd, kPid };
enum class ControlPhase {
  kWarmup,
  kRamp,
  kBackoff,
  kHold,
  kFrozen
};  // kFrozen: degeneration guard

struct ControllerOptions {
  ControllerKind kind = ControllerKind::kStatic;
  double initial = 0.1;  // static value (ORPO --lambda / SimPO --beta)
  double min = 0.05, max = 0.5, ramp = 0.05, backoff = 0.5;
  int hysteresis = 3;                   // K consecutive readings before a phase change
  int warmup_readings = 3;              // readings used to measure the noise (>= 3)
  double noise_sigmas = 3.0;            // thresholds = this many std devs of the noise
  double ema = 0.5;                     // Holt smoothing: weight of the past, in [0, 1)
  double kp = 1.0, kd = 0.5, ki = 0.1;  // range fractions per threshold (see above)
  double degeneration = 0.0;  // 0: 2 * tau_L; else nats/token of l_w below the warmup level
};

// The thresholds measured from the warmup readings (all 0 before).
struct ControlThresholds {
  double sigma_w = 0, sigma_r = 0, sigma_m = 0;  // noise of l_w, l_r, margin
  double trend_w = 0, trend_r = 0, trend_m = 0;  // tau_T per signal
  double level_drop = 0;                         // tau_L
  double degeneration = 0;                       // D
  double warmup_level = 0;                       // l_w level when WARMUP ended
};

// One signal's Holt filter state.
struct HoltState {
  double level = 0, trend = 0;
};

// The standard deviation of the filter's level and trend per unit of white
// noise on its input (steady state), for smoothing weight `ema`: the root sum
// of squares of the impulse responses. ema 0 gives {1, sqrt(2)}.
struct HoltGains {
  double level = 0, trend = 0;
};
HoltGains HoltNoiseGains(double ema);

// Refuses options that cannot drive a controller (min > max, ramp <= 0,
// backoff outside (0, 1), hysteresis < 1, warmup_readings < 3, ema outside
// [0, 1), negative gains, non-finite values), naming the field.
Status ValidateControllerOptions(const ControllerOptions& o);

class LambdaController {
 public:
  // `o` must pass ValidateControllerOptions (checked).
  explicit LambdaController(const ControllerOptions& o);

  double value() const { return value_; }  // the current lambda (or beta)
  ControlPhase phase() const { return phase_; }
  const ControllerOptions& options() const { return o_; }
  const ControlThresholds& thresholds() const { return th_; }
  int64_t readings() const { return readings_; }  // readings used so far

  // Feeds one reading; returns the new value.
  double Update(const ControlReading& r);
  const std::string& last_reason() const { return reason_; }

  // Exact state for checkpoints: Serialize -> Restore continues
  // bit-identically (through dump() and parse() as well). Restore refuses a
  // state saved under different options.
  nlohmann::json Serialize() const;
  static Result<LambdaController> Restore(const ControllerOptions& o, const nlohmann::json& state);

 private:
  enum Sig { kW = 0, kR = 1, kM = 2 };
  // Consecutive-reading counts of the conditions (see the top of the file).
  struct Streaks {
    int plateau = 0, falling = 0, stopped = 0, recovered = 0, displaced = 0, degenerate = 0;
  };

  void FinishWarmupReadings();
  void RemeasureNoise();
  void SetThresholds(const double sigma[3]);
  std::vector<double> WarmSignal(int s) const;
  void Decide();
  void DecideAimd(bool falling);
  void DecidePid(bool falling);
  void SetPhase(ControlPhase p);
  double RampUp(double v) const;
  void Cut(const char* why);
  double PidOutput(double e, double d) const;

  ControllerOptions o_;
  HoltGains gains_;
  double value_ = 0;
  ControlPhase phase_ = ControlPhase::kWarmup;
  std::string reason_;
  int64_t readings_ = 0;
  int64_t last_step_ = -1;
  std::vector<ControlReading> warm_;  // the last warmup_readings readings while in WARMUP
  HoltState holt_[3];
  ControlThresholds th_;
  double best_w_ = 0;
  Streaks st_;
  double ref_ = 0;       // p/pd/pid push reference
  double integral_ = 0;  // p/pd/pid accumulated excess deficit
};

Result<ControllerKind> ParseControllerKind(std::string_view s);  // "static","aimd","p","pd","pid"
std::string_view ControllerKindName(ControllerKind k);
std::string_view PhaseName(ControlPhase p);  // "warmup","ramp","backoff","hold","frozen"

}  // namespace lumen::train
