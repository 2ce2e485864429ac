// Issue 17, first proof: the lambda controllers driven by synthetic traces
// (SFT still learning; plateau; displacement onset; a noisy flat signal; a
// saturated actuator; recovery), asserting the phase sequences, the clamps,
// anti-windup, that noise alone never changes the phase, that static is
// constant, and that Serialize -> Restore mid-trace continues bit-identically.
//
// The traces are piecewise lines plus a fixed residual pattern, repeated
// every 4 readings: d * (1, -1, -1, 1) on l_w and d * (-1, 1, 1, -1) on l_r.
// The pattern is orthogonal to a line, so the first measurement (the line
// through the 4 warmup readings) gives exactly sigma_w = sigma_r = sqrt(2) d
// and sigma_m = 2 sqrt(2) d; its second differences are +-2d wherever it
// starts, so the second measurement (when WARMUP ends, on the last 4
// readings, if they lie on one line) gives sigma_w = sigma_r = 2d / sqrt(6)
// and sigma_m = 4d / sqrt(6). Every transition is deterministic. (The noise
// tests use random noise instead of the pattern.)
#include "lumen/train/lambda_controller.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace lumen::train {
namespace {

// The pattern amplitude: sqrt(3) / 100, so the noise measured when WARMUP ends
// (2 kD / sqrt(6)) is sqrt(2) / 100.
const double kD = 0.01 * std::sqrt(3.0);

struct Trace {
  std::vector<ControlReading> r;
  double w = 0, l = 0;        // current l_w, l_r (on the line, without the pattern)
  size_t pattern = SIZE_MAX;  // the residual pattern is on the first `pattern` readings
  void Push(double w_, double l_) {
    if (r.size() < pattern) {
      const double pat[4] = {1, -1, -1, 1};
      w_ += kD * pat[r.size() % 4];
      l_ -= kD * pat[r.size() % 4];
    }
    ControlReading x;
    x.step = int64_t(r.size() + 1) * 10;
    x.l_w = w_;
    x.l_r = l_;
    x.margin = w_ - l_;
    x.accuracy = w_ > l_ ? 1.0 : 0.0;
    x.nll = -w_;
    r.push_back(x);
  }
  // 4 warmup readings on the line (w0 + slope i, r0 + slope i) (plus the
  // pattern); leaves (w, l) at the line's last point.
  Trace& Warmup(double w0, double l0, double slope) {
    for (int i = 0; i < 4; ++i) Push(w0 + slope * i, l0 + slope * i);
    w = w0 + 3 * slope;
    l = l0 + 3 * slope;
    return *this;
  }
  // n readings, each moving l_w by dw and l_r by dr.
  Trace& Line(int n, double dw, double dr) {
    for (int i = 0; i < n; ++i) {
      w += dw;
      l += dr;
      Push(w, l);
    }
    return *this;
  }
};

struct Obs {
  ControlPhase phase;
  double value;
  std::string reason;
};

std::vector<Obs> Drive(LambdaController& c, const std::vector<ControlReading>& r, size_t from = 0,
                       size_t to = SIZE_MAX) {
  std::vector<Obs> out;
  for (size_t i = from; i < std::min(to, r.size()); ++i) {
    const double v = c.Update(r[i]);
    EXPECT_EQ(v, c.value());
    out.push_back({c.phase(), v, c.last_reason()});
  }
  return out;
}

// "warmup ramp@17 backoff@30": the first phase, then each change with its
// 1-based reading.
std::string Phases(const std::vector<Obs>& obs) {
  std::string s;
  for (size_t i = 0; i < obs.size(); ++i) {
    if (i == 0) {
      s = std::string(PhaseName(obs[i].phase));
    } else if (obs[i].phase != obs[i - 1].phase) {
      s += " " + std::string(PhaseName(obs[i].phase)) + "@" + std::to_string(i + 1);
    }
  }
  return s;
}

ControllerOptions Opts(ControllerKind k) {
  ControllerOptions o;
  o.kind = k;
  o.warmup_readings = 4;
  return o;
}

// Learning (slope 0.05 per reading, far above the threshold), then flat. The
// pattern covers the readings up to the end of WARMUP (reading learn + 8; it
// ends on reading learn + 8, after K plateau readings); from there on the
// trace is noiseless, so the laws' outputs are exact.
Trace Plateau(int learn, int flat) {
  Trace t;
  t.pattern = size_t(learn) + 8;
  t.Warmup(-2.0, -2.5, 0.05).Line(learn, 0.05, 0.05).Line(flat, 0, 0);
  return t;
}

// Plateau, then displacement: l_w falls 0.02 a reading while l_r falls 0.1
// (the margin grows 0.08 a reading) for 4 readings, then l_w stalls low, then
// recovers to its plateau and holds.
Trace Displacement() {
  Trace t = Plateau(8, 12);
  t.Line(4, -0.02, -0.1).Line(8, 0, 0).Line(4, 0.02, 0).Line(16, 0, 0);
  return t;
}

TEST(LambdaControllerTest, ParseAndNames) {
  for (auto k : {ControllerKind::kStatic, ControllerKind::kAimd, ControllerKind::kP,
                 ControllerKind::kPd, ControllerKind::kPid}) {
    auto p = ParseControllerKind(ControllerKindName(k));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, k);
  }
  EXPECT_EQ(ControllerKindName(ControllerKind::kPd), "pd");
  auto bad = ParseControllerKind("pi");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "unknown lambda controller 'pi' (expected static, aimd, p, pd or pid)");
  EXPECT_EQ(PhaseName(ControlPhase::kWarmup), "warmup");
  EXPECT_EQ(PhaseName(ControlPhase::kRamp), "ramp");
  EXPECT_EQ(PhaseName(ControlPhase::kBackoff), "backoff");
  EXPECT_EQ(PhaseName(ControlPhase::kHold), "hold");
  EXPECT_EQ(PhaseName(ControlPhase::kFrozen), "frozen");
}

TEST(LambdaControllerTest, ValidateOptionsNamesTheField) {
  auto msg = [](auto edit) {
    ControllerOptions o = Opts(ControllerKind::kAimd);
    edit(o);
    return ValidateControllerOptions(o).message();
  };
  EXPECT_EQ(msg([](auto&) {}), "OK");
  EXPECT_EQ(msg([](auto& o) { o.max = 0.01; }), "controller max 0.01: below min 0.05");
  EXPECT_EQ(msg([](auto& o) { o.backoff = 1; }), "controller backoff 1: must be in (0, 1)");
  EXPECT_EQ(msg([](auto& o) { o.warmup_readings = 2; }),
            "controller warmup_readings 2: must be >= 3 (a line and its noise)");
  EXPECT_EQ(msg([](auto& o) { o.ema = 1; }), "controller ema 1: must be in [0, 1)");
  EXPECT_EQ(msg([](auto& o) { o.hysteresis = 0; }), "controller hysteresis 0: must be >= 1");
  EXPECT_EQ(msg([](auto& o) { o.ki = -1; }), "controller gains kp 1 kd 0.5 ki -1: must be >= 0");
  EXPECT_EQ(msg([](auto& o) { o.ramp = NAN; }), "controller ramp: nan is not finite");
  // Static only needs finite numbers: its value may lie outside [min, max].
  ControllerOptions s;
  s.initial = 2.0;
  EXPECT_TRUE(ValidateControllerOptions(s).ok());
}

TEST(LambdaControllerTest, HoltNoiseGains) {
  // ema 0: level = x, trend = x_t - x_{t-1}: gains 1 and sqrt(2).
  HoltGains g0 = HoltNoiseGains(0.0);
  EXPECT_EQ(g0.level, 1.0);
  EXPECT_DOUBLE_EQ(g0.trend, std::sqrt(2.0));
  // ema 0.5 against the stationary covariance P = A P A^T + B B^T of the
  // filter's state-space form, solved by iteration (a different route than
  // the impulse-response sum).
  const double e = 0.5, a = 1 - e;
  const double A[2][2] = {{e, e}, {-a * a, e * (1 + a)}};
  const double B[2] = {a, a * a};
  double P[2][2] = {{0, 0}, {0, 0}};
  for (int it = 0; it < 2000; ++it) {
    double Q[2][2];
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 2; ++j) {
        double s = B[i] * B[j];
        for (int k = 0; k < 2; ++k) {
          for (int l = 0; l < 2; ++l) s += A[i][k] * P[k][l] * A[j][l];
        }
        Q[i][j] = s;
      }
    }
    std::copy(&Q[0][0], &Q[0][0] + 4, &P[0][0]);
  }
  HoltGains g = HoltNoiseGains(e);
  EXPECT_NEAR(g.level, std::sqrt(P[0][0]), 1e-12);
  EXPECT_NEAR(g.trend, std::sqrt(P[1][1]), 1e-12);
  EXPECT_LT(g.trend, g0.trend);  // smoothing quiets the slope
}

TEST(LambdaControllerTest, ThresholdsComeFromTheWarmupNoise) {
  for (double scale : {1.0, 10.0}) {
    ControllerOptions o = Opts(ControllerKind::kAimd);
    LambdaController c(o);
    const double pat[4] = {1, -1, -1, 1};
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(c.thresholds().sigma_w, 0.0);
      ControlReading r;
      r.l_w = -2 + 0.05 * i + scale * kD * pat[i];
      r.l_r = -2.5 + 0.05 * i - scale * kD * pat[i];
      r.margin = r.l_w - r.l_r;
      c.Update(r);
    }
    const ControlThresholds& t = c.thresholds();
    const HoltGains g = HoltNoiseGains(o.ema);
    EXPECT_NEAR(t.sigma_w, std::sqrt(2.0) * scale * kD, 1e-12);
    EXPECT_NEAR(t.sigma_r, std::sqrt(2.0) * scale * kD, 1e-12);
    EXPECT_NEAR(t.sigma_m, 2 * std::sqrt(2.0) * scale * kD, 1e-12);
    EXPECT_DOUBLE_EQ(t.trend_w, 3 * t.sigma_w * g.trend);
    EXPECT_DOUBLE_EQ(t.trend_m, 3 * t.sigma_m * g.trend);
    EXPECT_DOUBLE_EQ(t.level_drop, 2 * 3 * t.sigma_w * g.level);
    EXPECT_DOUBLE_EQ(t.degeneration, 2 * t.level_drop);
  }
  // An explicit degeneration threshold wins.
  ControllerOptions o = Opts(ControllerKind::kAimd);
  o.degeneration = 0.3;
  LambdaController c(o);
  Trace t = Plateau(0, 0);
  Drive(c, t.r);
  EXPECT_EQ(c.thresholds().degeneration, 0.3);
}

TEST(LambdaControllerTest, StaticIsConstant) {
  ControllerOptions o;  // kStatic
  o.initial = 0.1;
  LambdaController c(o);
  Trace t = Displacement();
  t.Line(10, -0.2, 0);  // and a collapse, which static ignores
  for (const Obs& ob : Drive(c, t.r)) {
    EXPECT_EQ(ob.value, 0.1);  // bit-identical to a fixed lambda
    EXPECT_EQ(ob.phase, ControlPhase::kHold);
    EXPECT_EQ(ob.reason, "");
  }
  // Static ignores min/max: a value outside them is kept.
  o.initial = 0.9;
  LambdaController hi(o);
  EXPECT_EQ(hi.Update(t.r[0]), 0.9);
}

// SFT still learning: l_w rises 0.05 a reading for 40 readings, so the
// adaptive controllers stay in WARMUP at min and say nothing.
TEST(LambdaControllerTest, SftStillLearningStaysInWarmupAtMin) {
  for (auto k :
       {ControllerKind::kAimd, ControllerKind::kP, ControllerKind::kPd, ControllerKind::kPid}) {
    LambdaController c(Opts(k));
    Trace t;
    t.Warmup(-2.0, -2.5, 0.05).Line(40, 0.05, 0.02);
    auto obs = Drive(c, t.r);
    EXPECT_EQ(Phases(obs), "warmup") << ControllerKindName(k);
    for (const Obs& ob : obs) {
      EXPECT_EQ(ob.value, 0.05);
      EXPECT_EQ(ob.reason, "");
    }
  }
}

// Plateau and a saturated actuator: l_w stops improving, the controller
// leaves WARMUP after K plateau readings and ramps by exactly `ramp` per
// reading to max, where it stays (clamped, still RAMP, silent).
TEST(LambdaControllerTest, AimdPlateauRampsToMaxAndStaysThere) {
  LambdaController c(Opts(ControllerKind::kAimd));
  Trace t = Plateau(8, 40);
  auto obs = Drive(c, t.r);
  EXPECT_EQ(Phases(obs), "warmup ramp@16");
  double want = 0.05;
  for (size_t i = 15; i < obs.size(); ++i) {
    const double prev = want;
    want = want + 0.05 >= 0.5 - 1e-9 * 0.05 ? 0.5 : want + 0.05;  // snaps onto max
    EXPECT_EQ(obs[i].value, want) << i;
    EXPECT_LE(obs[i].value, 0.5);
    if (want != prev) {
      EXPECT_EQ(obs[i].reason,
                fmt::format("{} {:.2f} -> {:.2f}",
                            i == 15 ? "l_w plateaued: ramp" : "l_w holds: ramp", prev, want) +
                    (i == 15 ? " (noise of l_w 0.014)" : ""));
    } else {
      EXPECT_EQ(obs[i].reason, "");
    }
  }
  EXPECT_EQ(obs[15].reason, "l_w plateaued: ramp 0.05 -> 0.10 (noise of l_w 0.014)");
  EXPECT_EQ(obs.back().value, 0.5);
  EXPECT_EQ(obs[23].value, 0.5);  // 0.05 + 9 ramps reaches max at reading 24
  EXPECT_LT(obs[22].value, 0.5);
}

// Displacement onset and recovery: the margin grows because l_r falls while
// l_w falls (readings 25-28). AIMD keeps ramping through reading 25 (the
// smoothed slope is not yet past its threshold), pauses on 27-28 (falling,
// unconfirmed), cuts on the K-th falling reading (29), holds once the fall has stopped for K
// readings, and ramps again once l_w has been back at its plateau for K readings.
TEST(LambdaControllerTest, AimdDisplacementBacksOffHoldsAndRecovers) {
  LambdaController c(Opts(ControllerKind::kAimd));
  Trace t = Displacement();
  auto obs = Drive(c, t.r);
  EXPECT_EQ(Phases(obs), "warmup ramp@16 backoff@29 hold@32 ramp@40");
  EXPECT_EQ(obs[24].value, 0.5);
  EXPECT_EQ(obs[27].value, 0.5);
  EXPECT_EQ(obs[27].reason, "");
  EXPECT_EQ(obs[28].value, 0.25);
  EXPECT_EQ(obs[28].reason, "displacement (margin up, l_r down, l_w down): backoff 0.50 -> 0.25");
  for (int i = 28; i < 39; ++i) EXPECT_EQ(obs[i].value, 0.25) << i;  // no ramp until recovered
  EXPECT_EQ(obs[31].reason, "l_w stopped falling: hold at 0.25");
  EXPECT_EQ(obs[39].reason, "l_w recovered: ramp 0.25 -> 0.30");
  EXPECT_EQ(obs[39].value, 0.25 + 0.05);
  EXPECT_EQ(obs.back().value, 0.5);
  // The l_w level when WARMUP ended: the plateau at -1.45, plus Holt's
  // overshoot from the trend it carried into the kink.
  EXPECT_GT(c.thresholds().warmup_level, -1.45);
  EXPECT_LT(c.thresholds().warmup_level, -1.44);
}

// l_w falls but l_r falls with it (the margin is flat): not displacement, so
// no cut; the ramp stops and AIMD holds (it never recovers in this trace).
TEST(LambdaControllerTest, AimdFallingWithoutDisplacementHolds) {
  LambdaController c(Opts(ControllerKind::kAimd));
  Trace t = Plateau(8, 12);
  t.Line(4, -0.02, -0.02).Line(20, 0, 0);
  auto obs = Drive(c, t.r);
  EXPECT_EQ(Phases(obs), "warmup ramp@16 hold@29");
  EXPECT_EQ(obs[28].reason, "l_w falling without displacement: hold at 0.50");
  EXPECT_EQ(obs.back().value, 0.5);
}

// A second confirmed displacement while in BACKOFF cuts again; the cuts
// clamp at min.
TEST(LambdaControllerTest, AimdPersistentDisplacementCutsAgainDownToMin) {
  ControllerOptions o = Opts(ControllerKind::kAimd);
  o.degeneration = 100;  // keep the guard out of it
  LambdaController c(o);
  Trace t = Plateau(8, 12);
  t.Line(30, -0.02, -0.1);
  auto obs = Drive(c, t.r);
  EXPECT_EQ(Phases(obs), "warmup ramp@16 backoff@29");
  const double want[] = {0.25, 0.125, 0.0625, 0.05};
  for (int n = 0; n < 4; ++n) {
    EXPECT_EQ(obs[28 + 3 * n].value, want[n]);  // a cut every K readings
    EXPECT_EQ(obs[28 + 3 * n].reason,
              fmt::format(
                  "{}: backoff {} -> {}",
                  n == 0 ? "displacement (margin up, l_r down, l_w down)" : "displacement persists",
                  n == 0 ? "0.50" : fmt::format("{:g}", want[n - 1]),
                  want[n] == 0.05 ? "0.05" : fmt::format("{:g}", want[n])));
  }
  for (size_t i = 38; i < obs.size(); ++i) {
    EXPECT_EQ(obs[i].value, 0.05);
    EXPECT_EQ(obs[i].reason, "");  // at min, further cuts change nothing and say nothing
  }
}

// The degeneration guard: l_w falls far below its warmup level (0.03 a
// reading for 10 readings against D = 2 tau_L ~ 0.114); AIMD cuts first,
// then the guard freezes at min and stays frozen through the recovery.
TEST(LambdaControllerTest, DegenerationFreezesAtMinForGood) {
  for (auto k :
       {ControllerKind::kAimd, ControllerKind::kP, ControllerKind::kPd, ControllerKind::kPid}) {
    LambdaController c(Opts(k));
    Trace t = Plateau(8, 12);
    t.Line(10, -0.03, -0.1).Line(10, 0, 0).Line(10, 0.03, 0).Line(20, 0, 0);
    auto obs = Drive(c, t.r);
    EXPECT_EQ(Phases(obs), "warmup ramp@16 backoff@28 frozen@31") << ControllerKindName(k);
    for (size_t i = 30; i < obs.size(); ++i) {
      EXPECT_EQ(obs[i].value, 0.05);
      EXPECT_EQ(obs[i].reason, i == 30 ? obs[30].reason : "");
    }
    EXPECT_NE(obs[30].reason.find("l_w degenerated: level -1.6611 is 0.2111 below its warmup "
                                  "level -1.4500 (threshold 0.1144): frozen "),
              std::string::npos)
        << obs[30].reason;
  }
}

// The P -> PD -> PID ablation on the displacement trace: all three confirm
// the degradation on reading 29 (like AIMD) and leave BACKOFF on 42. P
// retreats in proportion to the deficit and goes back to its reference (the
// cliff, 0.5) as l_w recovers, and so does PD; PID's integral keeps a lasting retreat, so it
// settles below the cliff.
TEST(LambdaControllerTest, PidFamilyOnDisplacement) {
  std::vector<std::vector<Obs>> runs;
  for (auto k : {ControllerKind::kP, ControllerKind::kPd, ControllerKind::kPid}) {
    LambdaController c(Opts(k));
    Trace t = Displacement();
    runs.push_back(Drive(c, t.r));
    EXPECT_EQ(Phases(runs.back()), "warmup ramp@16 backoff@29 ramp@40") << ControllerKindName(k);
    EXPECT_EQ(runs.back()[24].value, 0.5);
  }
  const auto &p = runs[0], &pd = runs[1], &pid = runs[2];
  // On the confirming reading the deficit is e = 0.51 thresholds past the
  // noise band: P retreats 0.45 e; PD further (the fall rate, d = 0.31).
  EXPECT_NEAR(p[28].value, 0.5 - 0.45 * 0.51, 0.45 * 0.005);
  EXPECT_LT(pd[28].value, p[28].value);
  EXPECT_EQ(p.back().value, 0.5);  // P returns to its reference
  EXPECT_EQ(pd.back().value, 0.5);
  EXPECT_LT(pid.back().value, 0.45);  // PID remembers the cliff
  EXPECT_GT(pid.back().value, 0.05);
}

// With a gentler kp, P's retreat on the confirming reading stays above min,
// and PD retreats further there: its slope term acts on the fall rate.
TEST(LambdaControllerTest, PdRetreatsFurtherThanPOnAFastFall) {
  double v[2];
  int i = 0;
  for (auto k : {ControllerKind::kP, ControllerKind::kPd}) {
    ControllerOptions o = Opts(k);
    o.kp = 0.3;
    LambdaController c(o);
    auto obs = Drive(c, Displacement().r);
    EXPECT_EQ(Phases(obs), "warmup ramp@16 backoff@29 ramp@40");
    v[i++] = obs[28].value;
  }
  EXPECT_GT(v[0], 0.05);
  EXPECT_NEAR(v[0], 0.5 - 0.45 * 0.3 * 0.51, 0.45 * 0.3 * 0.005);  // e = 0.51 to 2 places
  EXPECT_LT(v[1], v[0]);
}

// Anti-windup. Saturated at max: the push reference is clamped, so the first
// confirmed degradation lowers the value on that very reading. Pinned at min:
// the integral stops growing, so after recovery the value leaves min at once.
TEST(LambdaControllerTest, PidAntiWindup) {
  ControllerOptions o = Opts(ControllerKind::kPid);
  o.degeneration = 100;  // keep the guard out of it
  LambdaController c(o);
  Trace t = Plateau(8, 60);  // max from reading 25 to 84
  t.Line(4, -0.02, -0.1).Line(30, 0, 0).Line(4, 0.02, 0.1).Line(20, 0, 0);
  std::vector<Obs> obs;
  std::vector<double> integral, ref;
  for (const auto& r : t.r) {
    c.Update(r);
    obs.push_back({c.phase(), c.value(), c.last_reason()});
    const auto s = c.Serialize();
    integral.push_back(s["integral"].get<double>());
    ref.push_back(s["ref"].get<double>());
  }
  EXPECT_EQ(Phases(obs), "warmup ramp@16 backoff@77 ramp@110");
  // Saturated at max for 52 readings, the reference never wound past max...
  for (size_t i = 24; i < 76; ++i) {
    EXPECT_EQ(obs[i].value, 0.5);
    EXPECT_EQ(ref[i], 0.5);
  }
  // ...so the confirming reading retreats at once (P + D, most of the way).
  EXPECT_LT(obs[76].value, 0.2);
  EXPECT_EQ(obs[76].reason,
            "l_w degrading (0.51 level, 0.31 slope thresholds past noise): backoff 0.50 -> "
            "0.175556");
  // The integral grew on every reading whose output was above min (77-89:
  // it walks the output down to min), and then stayed put for the 16 readings
  // the output was pinned at min despite a deficit of ~0.4 threshold each.
  for (size_t i = 76; i < 90; ++i) EXPECT_GT(integral[i], integral[i - 1]) << i;
  for (size_t i = 89; i < 106; ++i) {
    EXPECT_EQ(integral[i], integral[89]) << i;
    EXPECT_EQ(obs[i].value, 0.05) << i;
  }
  EXPECT_GT(integral[89], 6.0);
  EXPECT_LT(integral[89], 6.5);
  // After the recovery the value climbs back at once and settles at the
  // ceiling the integral leaves, max - (max - min) ki I; had the integral
  // wound up over the pinned stretch (~7 more) it would hold min for good.
  EXPECT_GT(obs[106].value, 0.05);
  const double settled = std::clamp(0.5 - 0.45 * 0.1 * integral.back(), 0.05, 0.5);
  EXPECT_EQ(obs.back().value, settled);
  EXPECT_GT(settled, 0.15);
  EXPECT_EQ(obs[109].reason, fmt::format("l_w recovered: push resumes at {:.6g}", settled));
}

// Deterministic noise: uniform in [-a, a] from splitmix64.
struct Noise {
  uint64_t s;
  double Next(double a) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return a * (2.0 * double(z >> 11) / double(1ull << 53) - 1.0);
  }
};

// A noisy flat signal: 10 warmup readings and 300 more of the same level with
// independent uniform noise on l_w and l_r (so on the margin too). Each
// adaptive controller leaves WARMUP once (the signal is flat), ramps to max
// and then never changes phase again, across 40 seeds: noise alone does not
// cut, hold or freeze. A noisy rising signal stays in WARMUP.
TEST(LambdaControllerTest, NoiseAloneNeverChangesThePhase) {
  for (auto k :
       {ControllerKind::kAimd, ControllerKind::kP, ControllerKind::kPd, ControllerKind::kPid}) {
    for (uint64_t seed = 1; seed <= 40; ++seed) {
      ControllerOptions o = Opts(k);
      o.warmup_readings = 10;
      LambdaController flat(o), rising(o);
      Noise n{seed};
      Trace f, r;
      f.pattern = r.pattern = 0;
      for (int i = 0; i < 310; ++i) {
        f.Push(-1.5 + n.Next(0.02), -2.0 + n.Next(0.02));
        r.Push(-3.0 + 0.03 * i + n.Next(0.02), -3.2 + 0.03 * i + n.Next(0.02));
      }
      auto obs = Drive(flat, f.r);
      const std::string ph = Phases(obs);
      ASSERT_EQ(ph.rfind("warmup ramp@", 0), 0u)
          << ControllerKindName(k) << " seed " << seed << ": " << ph;
      EXPECT_EQ(ph.find(' ', 7), std::string::npos)
          << ControllerKindName(k) << " seed " << seed << ": " << ph;
      EXPECT_EQ(obs.back().value, 0.5);
      EXPECT_EQ(Phases(Drive(rising, r.r)), "warmup") << ControllerKindName(k) << " seed " << seed;
    }
  }
}

// A noisy version of the displacement trace, for checkpoint tests.
Trace NoisyDisplacement(uint64_t seed) {
  Trace t = Displacement();
  Noise n{seed};
  for (size_t i = 4; i < t.r.size(); ++i) {
    t.r[i].l_w += n.Next(0.004);
    t.r[i].l_r += n.Next(0.004);
    t.r[i].margin = t.r[i].l_w - t.r[i].l_r;
  }
  return t;
}

// Serialize -> dump -> parse -> Restore at every reading continues
// bit-identically: same values, phases and reasons, and the same final state.
TEST(LambdaControllerTest, SerializeRestoreContinuesBitIdentically) {
  for (auto k : {ControllerKind::kStatic, ControllerKind::kAimd, ControllerKind::kP,
                 ControllerKind::kPd, ControllerKind::kPid}) {
    const ControllerOptions o = Opts(k);
    const Trace t = NoisyDisplacement(7);
    LambdaController whole(o);
    const auto want = Drive(whole, t.r);
    const std::string want_state = whole.Serialize().dump();
    for (size_t cut = 0; cut <= t.r.size(); ++cut) {
      LambdaController first(o);
      auto got = Drive(first, t.r, 0, cut);
      const std::string saved = first.Serialize().dump();
      auto restored = LambdaController::Restore(o, nlohmann::json::parse(saved));
      ASSERT_TRUE(restored.ok()) << restored.status().message();
      EXPECT_EQ(restored->Serialize().dump(), saved);
      EXPECT_EQ(restored->value(), first.value());
      EXPECT_EQ(restored->phase(), first.phase());
      EXPECT_EQ(restored->last_reason(), first.last_reason());
      auto rest = Drive(*restored, t.r, cut);
      got.insert(got.end(), rest.begin(), rest.end());
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i].value, want[i].value)
            << ControllerKindName(k) << " cut " << cut << " i " << i;
        ASSERT_EQ(got[i].phase, want[i].phase);
        ASSERT_EQ(got[i].reason, want[i].reason);
      }
      EXPECT_EQ(restored->Serialize().dump(), want_state)
          << ControllerKindName(k) << " cut " << cut;
    }
  }
  // The noisy trace does exercise every AIMD phase it claims to.
  LambdaController c(Opts(ControllerKind::kAimd));
  EXPECT_EQ(Phases(Drive(c, NoisyDisplacement(7).r)), "warmup ramp@16 backoff@29 hold@32 ramp@40");
}

TEST(LambdaControllerTest, RestoreRefusesAMismatchOrABrokenState) {
  ControllerOptions o = Opts(ControllerKind::kAimd);
  LambdaController c(o);
  Drive(c, Displacement().r, 0, 20);
  const nlohmann::json s = c.Serialize();
  ControllerOptions other = o;
  other.max = 0.4;
  auto r = LambdaController::Restore(other, s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "controller state: saved with max 0.5, but the options say 0.4");
  other = o;
  other.kind = ControllerKind::kPid;
  EXPECT_EQ(LambdaController::Restore(other, s).status().message(),
            "controller state: saved with kind \"aimd\", but the options say \"pid\"");
  nlohmann::json bad = s;
  bad["version"] = 9;
  EXPECT_EQ(LambdaController::Restore(o, bad).status().message(),
            "controller state: version 9 (this build reads 2)");
  bad = s;
  bad["phase"] = "cruise";
  EXPECT_EQ(LambdaController::Restore(o, bad).status().message(), "unknown phase 'cruise'");
  bad = s;
  bad.erase("holt");
  EXPECT_NE(LambdaController::Restore(o, bad).status().message().find("controller state: "),
            std::string::npos);
  bad = s;
  bad["value"] = 0.9;
  EXPECT_EQ(LambdaController::Restore(o, bad).status().message(),
            "controller state: value 0.9 outside [0.05, 0.5]");
  EXPECT_EQ(LambdaController::Restore(o, nlohmann::json::array()).status().message(),
            "controller state: not a JSON object");
}

// A non-finite reading is ignored: the state does not move, and the reason
// says so.
TEST(LambdaControllerTest, NonFiniteReadingIsIgnored) {
  LambdaController a(Opts(ControllerKind::kAimd)), b(Opts(ControllerKind::kAimd));
  const Trace t = Displacement();
  Drive(a, t.r, 0, 10);
  Drive(b, t.r, 0, 10);
  ControlReading bad = t.r[10];
  bad.l_r = NAN;
  b.Update(bad);
  EXPECT_EQ(b.last_reason(), "step 110: l_r is nan: reading ignored");
  EXPECT_EQ(b.readings(), 10);
  EXPECT_EQ(a.Serialize().dump(), [&] {
    auto s = b.Serialize();
    s["reason"] = "";
    return s.dump();
  }());
  EXPECT_EQ(Phases(Drive(a, t.r, 10)), Phases(Drive(b, t.r, 10)));
}

// Traces shaped like the issue-17 experiment's (docs/experiments/dynamic-lambda.md;
// 5 warmup readings as there): l_w rises steeply and smoothly from the base
// model's -3.1 towards -0.6 (-0.6 - 2.5 exp(-i / 1.2)), then stays on that
// curve with small noise (uniform +-0.02, sigma 0.012: the feeling runs'
// reading-to-reading noise at low lambda was 0.011-0.013) while the margin
// grows (l_r falls 0.1 a reading). The first measurement, a line through
// the steep part, reads that curve as noise (sigma ~0.4); the second, when
// WARMUP ends, sees the noise.
Trace ExperimentLike(uint64_t seed, int plateau) {
  Trace t;
  t.pattern = 0;
  Noise n{seed};
  double l = 0;
  for (int i = 0; i < 8 + plateau; ++i) {
    const double w = -0.6 - 2.5 * std::exp(-i / 1.2);
    l = i < 8 ? w - 0.02 : l - 0.1;
    t.w = w;
    t.l = l;
    t.Push(w + n.Next(0.02), l + n.Next(0.02));
  }
  return t;
}

// The feeling case: after the plateau, l_w dips 0.3 nats over 3 readings while
// the margin grows (l_r falls 0.5 a reading), stays low, then recovers.
// Every adaptive controller backs off (the first version, with the line
// through the steep part as the noise, never did: l_w "held" through it).
TEST(LambdaControllerTest, ExperimentLikeDisplacementBacksOff) {
  for (auto k :
       {ControllerKind::kAimd, ControllerKind::kP, ControllerKind::kPd, ControllerKind::kPid}) {
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      ControllerOptions o = Opts(k);
      o.warmup_readings = 5;
      o.max = 20;
      o.ramp = 1.0;
      LambdaController c(o);
      Trace t = ExperimentLike(seed, 6);
      Noise n{seed + 1000};
      for (int i = 0; i < 3; ++i) t.Push((t.w -= 0.1) + n.Next(0.02), (t.l -= 0.5) + n.Next(0.02));
      for (int i = 0; i < 5; ++i) t.Push(t.w + n.Next(0.02), (t.l -= 0.1) + n.Next(0.02));
      for (int i = 0; i < 3; ++i) t.Push((t.w += 0.1) + n.Next(0.02), t.l + n.Next(0.02));
      const auto obs = Drive(c, t.r);
      const std::string ph = Phases(obs);
      const std::string at = fmt::format("{} seed {}: {}", ControllerKindName(k), seed, ph);
      ASSERT_EQ(ph.rfind("warmup ramp@", 0), 0u) << at;
      EXPECT_NE(ph.find("backoff@"), std::string::npos) << at;
      // No phase change before the dip (reading 15): noise alone does not act.
      size_t i = 0;
      while (i < obs.size() && obs[i].phase == ControlPhase::kWarmup) ++i;
      for (; i < 14; ++i) EXPECT_EQ(obs[i].phase, ControlPhase::kRamp) << at;
      EXPECT_LT(c.thresholds().sigma_w, 0.05) << at;  // the noise, not the curve
      double lo = 1e9;
      for (size_t i = 14; i < obs.size(); ++i) lo = std::min(lo, obs[i].value);
      EXPECT_LT(lo, obs[13].value) << at;  // lambda came down from where the dip began
    }
  }
  // The first measurement alone (a line through the 5 steep readings) is
  // mostly curve: far above the noise, as in the experiment.
  ControllerOptions o = Opts(ControllerKind::kAimd);
  o.warmup_readings = 5;
  LambdaController c(o);
  Drive(c, ExperimentLike(1, 0).r, 0, 5);
  EXPECT_GT(c.thresholds().sigma_w, 0.2);
}

// The uppercase case: the same steep rise, then l_w flat (with noise) while
// the margin keeps growing: healthy, so no controller ever backs off; it
// leaves WARMUP once and ramps (to 20 with the wide range).
TEST(LambdaControllerTest, ExperimentLikeHealthyPlateauNeverBacksOff) {
  for (auto k :
       {ControllerKind::kAimd, ControllerKind::kP, ControllerKind::kPd, ControllerKind::kPid}) {
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      ControllerOptions o = Opts(k);
      o.warmup_readings = 5;
      o.max = 20;
      o.ramp = 1.0;
      LambdaController c(o);
      const auto obs = Drive(c, ExperimentLike(seed, 40).r);
      const std::string ph = Phases(obs);
      const std::string at = fmt::format("{} seed {}: {}", ControllerKindName(k), seed, ph);
      ASSERT_EQ(ph.rfind("warmup ramp@", 0), 0u) << at;
      EXPECT_EQ(ph.find(' ', 7), std::string::npos) << at;
      EXPECT_EQ(obs.back().value, 20.0) << at;
    }
  }
}

}  // namespace
}  // namespace lumen::train
