// Control-point curve: a monotone cubic Hermite (Fritsch-Carlson / PCHIP)
// curve through N >= 2 points given in probability percent, mapped to log-prob
// space (X = ln(x_pct/100), Y = ln(y_pct/100)). Above the top point it continues
// as a line with the top tangent; below the bottom point as a line with slope
// max(M0, 1), so the deep tail is never lifted relative to T = 1.
//
// The sampler applies it as p_out ∝ exp(C(log p_in)). To make the identity
// curve reproduce T = 1 bit-exactly, the curve is stored as an offset from the
// identity: Offset(l) = C(l) - l, a Hermite cubic with values Y_k - X_k and
// tangents M_k - 1, which is exactly 0.0 (not merely ≈ 0) when every Y_k == X_k.
// See docs/design/sampling.md.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "lumen/core/status.h"
#include "lumen/kernels/vecmath.h"
#include "lumen/sample/config.h"

namespace lumen::sample {

// Validates the points: at least 2, finite, x and y in (0, 100], x strictly
// increasing, y non-decreasing unless allow_nonmonotone. `where` prefixes the
// message, e.g. "curve.points[2]: x must be strictly increasing (5 after 5)".
Status ValidateCurve(const CurveConfig& curve, std::string_view where = "curve");

class Pchip {
 public:
  // `curve` must pass ValidateCurve (LUMEN_CHECKed size only).
  explicit Pchip(const CurveConfig& curve);
  Pchip() = default;

  // C(l) - l at log-probability l (finite). Double precision throughout.
  double Offset(double l) const;
  // C(l) itself (for tests and the curve designer).
  double Eval(double l) const { return l + Offset(l); }
  // C'(l), the slope (for tests).
  double Slope(double l) const;

  std::span<const double> knots_x() const { return x_; }
  std::span<const double> knots_y() const { return y_; }
  std::span<const double> tangents() const { return m_; }
  // The offset cubic for kernels::PchipScore (points into this object; the
  // kernel evaluates exactly Offset's expression, bit for bit).
  kernels::PchipSpan span() const {
    const size_t n = x_.size();
    return {x_.data(),
            a_.data(),
            b_.data(),
            c_.data(),
            d_.data(),
            inv_h_.data(),
            n,
            y_[0] - x_[0],
            y_[n - 1] - x_[n - 1],
            low_slope_off_,
            high_slope_off_};
  }

 private:
  int Segment(double l) const;  // k with x_[k] <= l < x_[k+1], clamped
  std::vector<double> x_, y_, m_;
  // Per segment k, offset cubic in t = (l - x_k) / h_k: a + t*(b + t*(c + t*d)).
  std::vector<double> a_, b_, c_, d_, inv_h_;
  double low_slope_off_ = 0;   // max(M0, 1) - 1
  double high_slope_off_ = 0;  // M_{N-1} - 1
};

}  // namespace lumen::sample
