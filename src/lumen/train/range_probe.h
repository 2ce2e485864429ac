// The range probe of `lumen train --probe-ranges` (issue 16): during a real
// run, the magnitudes of the operands that enter each kind of product, so
// the experiment can say whether f16 operands (5 exponent bits) would lose
// values where bf16 (8, the f32 range) does not:
//
//   product.x    activations entering the frozen forward products (x of x W^T)
//   product_t.dy cotangents entering the frozen backward products (dy of dy W)
//   head.xn      normed hiddens entering the head's logit products
//   head.coeff   the weights entering the head's dh product: exp(z - running max) c'
//                (the one-pass fused head), g (onehot - softmax) (the plain head and
//                the recomputing fused backward)
//   lora.x       inputs of A x;  lora.u: A x entering B u
//   lora.dy      cotangents entering dy B;  lora.du: s dy B entering du A
//
// Per site: the largest |v|, the smallest non-zero |v|, and counts of the
// non-zero values f16 would flush (below 2^-24, its subnormal floor), store
// subnormal (below 2^-14, its normal floor: fewer significant bits) or
// overflow (above 65504), and those bf16 would lose: below 2^-126 (the
// AVX512-BF16 dot treats subnormal inputs as zero) or above its largest
// finite value. Weights are not probed: their storage fixes their range.
//
// Off costs one null-pointer check per product (the graph and heads hold a
// RangeProbe*); on, one pass over each operand in the calling thread.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace lumen::train {

enum class ProbeSite : int {
  kProductX,
  kProductTDy,
  kHeadXn,
  kHeadCoeff,
  kLoraX,
  kLoraU,
  kLoraDy,
  kLoraDu,
};
inline constexpr int kNumProbeSites = 8;

struct RangeStats {
  double max_abs = 0;
  double min_nonzero = 0;  // 0: no non-zero value seen
  int64_t values = 0, nonzero = 0;
  int64_t f16_flush = 0, f16_subnormal = 0, f16_overflow = 0;  // of the non-zero values
  int64_t bf16_flush = 0, bf16_overflow = 0;
};

class RangeProbe {
 public:
  void Record(ProbeSite site, const float* v, int64_t n);
  const RangeStats& stats(ProbeSite s) const { return stats_[int(s)]; }
  // One line per site that saw values, with the verdict for f16 and bf16.
  std::string Describe() const;
  // {"site": {max_abs, min_nonzero, values, ..., "f16": verdict, "bf16": verdict}}
  nlohmann::json Json() const;

 private:
  std::array<RangeStats, kNumProbeSites> stats_{};
};

std::string_view ProbeSiteName(ProbeSite s);

}  // namespace lumen::train
