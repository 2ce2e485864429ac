#include "lumen/sample/curve.h"

#include <algorithm>
#include <cmath>

#include "lumen/core/check.h"
#include "lumen/core/route.h"

namespace lumen::sample {

LUMEN_ROUTE(sample_curve,
            {.node = "sample.tone",
             .name = "curve",
             .tier = Tier::kL3,
             .oracle = "none (original); the identity curve is bit-identical to temperature 1",
             .bound = "identity bit-exact; ranking and argmax preserved; KL and diversity measured",
             .tests = "CurveGate.IdentityEqualsTemperatureOneBitExact;CurveProperty."
                      "RankingAndArgmaxPreserved;Curve.*;Pchip.*",
             .measure = "docs/experiments/sampling.md",
             .when = "sampler=curve",
             .priority = 10});

Status ValidateCurve(const CurveConfig& curve, std::string_view where) {
  const auto& p = curve.points;
  if (p.size() < 2) {
    return Errorf("{}.points: need at least 2 points, got {}", where, p.size());
  }
  for (size_t i = 0; i < p.size(); ++i) {
    for (auto [name, v] : {std::pair{"x", p[i].x_pct}, std::pair{"y", p[i].y_pct}}) {
      if (!std::isfinite(v))
        return Errorf("{}.points[{}]: {} must be finite, got {}", where, i, name, v);
      if (!(v > 0 && v <= 100)) {
        return Errorf("{}.points[{}]: {} must be a percentage in (0, 100], got {}", where, i, name,
                      v);
      }
    }
    if (i == 0) continue;
    if (!(p[i].x_pct > p[i - 1].x_pct)) {
      return Errorf("{}.points[{}]: x must be strictly increasing, got {} after {}", where, i,
                    p[i].x_pct, p[i - 1].x_pct);
    }
    if (!curve.allow_nonmonotone && p[i].y_pct < p[i - 1].y_pct) {
      return Errorf(
          "{}.points[{}]: y must not decrease, got {} after {} (set allow_nonmonotone to allow)",
          where, i, p[i].y_pct, p[i - 1].y_pct);
    }
  }
  return Status::Ok();
}

namespace {
double Sign(double v) { return v > 0 ? 1.0 : (v < 0 ? -1.0 : 0.0); }

// scipy's PchipInterpolator end condition: a one-sided three-point estimate,
// limited so the end segment stays shape-preserving. When both secants are
// equal the formula equals d0 mathematically; returning d0 directly keeps the
// identity curve's tangent exactly 1.
double EdgeTangent(double h0, double h1, double d0, double d1) {
  if (d0 == d1) return d0;
  double m = ((2 * h0 + h1) * d0 - h0 * d1) / (h0 + h1);
  if (Sign(m) != Sign(d0)) return 0.0;
  if (Sign(d0) != Sign(d1) && std::fabs(m) > std::fabs(3 * d0)) return 3 * d0;
  return m;
}
}  // namespace

Pchip::Pchip(const CurveConfig& curve) {
  const size_t n = curve.points.size();
  LUMEN_CHECK(n >= 2);
  x_.resize(n);
  y_.resize(n);
  m_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    x_[i] = std::log(curve.points[i].x_pct / 100.0);
    y_[i] = std::log(curve.points[i].y_pct / 100.0);
  }
  std::vector<double> h(n - 1), d(n - 1);
  for (size_t k = 0; k + 1 < n; ++k) {
    h[k] = x_[k + 1] - x_[k];
    d[k] = (y_[k + 1] - y_[k]) / h[k];
  }
  if (n == 2) {
    m_[0] = m_[1] = d[0];
  } else {
    for (size_t k = 1; k + 1 < n; ++k) {
      if (d[k - 1] == d[k]) {
        m_[k] = d[k];  // the harmonic mean below equals it; keep it exact
      } else if (d[k - 1] * d[k] <= 0) {
        m_[k] = 0.0;
      } else {
        const double w1 = 2 * h[k] + h[k - 1], w2 = h[k] + 2 * h[k - 1];
        m_[k] = (w1 + w2) / (w1 / d[k - 1] + w2 / d[k]);
      }
    }
    m_[0] = EdgeTangent(h[0], h[1], d[0], d[1]);
    m_[n - 1] = EdgeTangent(h[n - 2], h[n - 3], d[n - 2], d[n - 3]);
  }
  // Offset cubic per segment from the Hermite form with values v = Y - X and
  // tangents s = M - 1 (times h, in the t variable):
  //   a = v0, b = h s0, c = 3(v1 - v0) - h(2 s0 + s1), d = 2(v0 - v1) + h(s0 + s1).
  a_.resize(n - 1);
  b_.resize(n - 1);
  c_.resize(n - 1);
  d_.resize(n - 1);
  inv_h_.resize(n - 1);
  for (size_t k = 0; k + 1 < n; ++k) {
    const double v0 = y_[k] - x_[k], v1 = y_[k + 1] - x_[k + 1];
    const double s0 = h[k] * (m_[k] - 1.0), s1 = h[k] * (m_[k + 1] - 1.0);
    a_[k] = v0;
    b_[k] = s0;
    c_[k] = 3 * (v1 - v0) - 2 * s0 - s1;
    d_[k] = 2 * (v0 - v1) + s0 + s1;
    inv_h_[k] = 1.0 / h[k];
  }
  low_slope_off_ = std::max(m_[0], 1.0) - 1.0;
  high_slope_off_ = m_[n - 1] - 1.0;
}

int Pchip::Segment(double l) const {
  // upper_bound on the knots: first x_ > l, minus one, clamped to a segment.
  const auto it = std::upper_bound(x_.begin(), x_.end(), l);
  int k = static_cast<int>(it - x_.begin()) - 1;
  return std::clamp(k, 0, static_cast<int>(x_.size()) - 2);
}

double Pchip::Offset(double l) const {
  const size_t n = x_.size();
  if (l < x_[0]) return (y_[0] - x_[0]) + low_slope_off_ * (l - x_[0]);
  if (l > x_[n - 1]) return (y_[n - 1] - x_[n - 1]) + high_slope_off_ * (l - x_[n - 1]);
  const int k = Segment(l);
  const double t = (l - x_[k]) * inv_h_[k];
  return a_[k] + t * (b_[k] + t * (c_[k] + t * d_[k]));
}

double Pchip::Slope(double l) const {
  const size_t n = x_.size();
  if (l < x_[0]) return low_slope_off_ + 1.0;
  if (l > x_[n - 1]) return high_slope_off_ + 1.0;
  const int k = Segment(l);
  const double t = (l - x_[k]) * inv_h_[k];
  return 1.0 + (b_[k] + t * (2 * c_[k] + t * 3 * d_[k])) * inv_h_[k];
}

}  // namespace lumen::sample
