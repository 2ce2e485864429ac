// Vectorized span kernels for the sampler's full-vocabulary passes and for
// evaluation: max, exp with a shift and a (blocked) sum, log-softmax, the HLG
// tone-curve score and the PCHIP curve score over a span. Highway with runtime
// dispatch (vecmath-inl.h per target, vecmath.cc dispatch); scalar references
// in vecmath_ref.h.
//
// Contract: every element-wise output (exp, scores, log-softmax given its
// normalizer) has the same bits on every SIMD target and in the scalar
// reference: the polynomials use separate multiplies and adds (no FMA) in one
// fixed order, and a span's tail runs the reference code. So two callers that
// run the same kernel on the same inputs get identical floats (the sampler's
// bit-exact degeneracy gates rely on this). Sums are reassociated (float lanes
// within each kSumBlock-element block, double across blocks), so they differ
// from a sequential sum by at most about kSumBlock * 2^-24 relative, and
// between targets (lane counts differ); the same target always gives the same
// sum. NaN inputs are the caller's business except where "clean" is said.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lumen::kernels {

// Block size of the blocked sums (the sampler's draw walks these blocks).
inline constexpr size_t kSumBlock = 256;
inline size_t SumBlocks(size_t n) { return (n + kSumBlock - 1) / kSumBlock; }

// HLG tone-curve score parameters (sample/hlg.h): for l > -inf,
//   s = m*l + off(z), z = l - mu, u = max(|z| - width, 0),
//   off = m*(u - toe*ln(1 + u/toe))            for z <= 0 (toe),
//   off = 0 - m*(u - shoulder*ln(1 + u/shoulder)) for z > 0 (shoulder);
// off is exactly +0.0 in the mids, so s == m*l + 0.0f there. -inf stays -inf.
struct HlgSpan {
  float mu = 0, m = 1, width = 4, toe = 6, shoulder = 4;
  float inv_toe = 1.0f / 6, inv_shoulder = 1.0f / 4;
};

// A PCHIP curve stored as an offset from the identity (sample/curve.h), by
// pointers into the owner's arrays: n_knots knots x[], per segment k the cubic
// a + t*(b + t*(c + t*d)) in t = (l - x[k]) * inv_h[k]; linear beyond the ends.
struct PchipSpan {
  const double* x = nullptr;
  const double *a = nullptr, *b = nullptr, *c = nullptr, *d = nullptr, *inv_h = nullptr;
  size_t n_knots = 0;
  double v_first = 0, v_last = 0;                // offset at x[0], x[n-1]
  double low_slope_off = 0, high_slope_off = 0;  // offset slopes beyond the ends
};

// max over i of Clean(x[i]) (NaN -> -inf, +inf -> FLT_MAX); -inf when n == 0.
float CleanMax(const float* x, size_t n);
// max over i of x[i] (no NaN expected); -inf when n == 0.
float MaxF32(const float* x, size_t n);

// lp[i] = Clean(x[i]) - shift; s[i] = gain * lp[i] + 0.0f. Returns max s.
float CleanShiftScore(const float* x, size_t n, float shift, float gain, float* lp, float* s);
// lp[i] = Clean(x[i]) - shift.
void CleanShift(const float* x, size_t n, float shift, float* lp);
// s[i] = gain * lp[i] + 0.0f. Returns max s.
float ScaleScore(const float* lp, size_t n, float gain, float* s);

// e[i] = Exp(s[i] - shift) (e may be null: not stored). Returns the sum of e;
// blocks (may be null) receives SumBlocks(n) block sums.
double ExpShiftSum(const float* s, size_t n, float shift, float* e, double* blocks);
// Blocked sum of x (as ExpShiftSum's, without the exp).
double BlockSum(const float* x, size_t n, double* blocks);
// sum_e = sum Exp(lp[i]), sum_elp = sum Exp(lp[i]) * lp[i] (0 for lp = -inf).
void ExpMoments(const float* lp, size_t n, double* sum_e, double* sum_elp);

// s[i] = HLG score of lp[i] (HlgSpan). Returns max s.
float HlgScore(const float* lp, size_t n, const HlgSpan& p, float* s);
// s[i] = float(double(lp[i]) + Offset(double(lp[i]) - log_z)), -inf kept. Returns max s.
float PchipScore(const float* lp, size_t n, double log_z, const PchipSpan& c, float* s);

// Fused score + exp: s (may be null) as HlgScore / PchipScore, then e and the
// blocked sums exactly as ExpShiftSum(s, n, shift, e, blocks) would give on
// those scores (same bits), in one pass. The caller supplies the shift (for
// a monotone map, the score of the top log-prob, e.g. HlgScoreAt(0, p)).
double HlgScoreExp(const float* lp, size_t n, const HlgSpan& p, float shift, float* s, float* e,
                   double* blocks);
double PchipScoreExp(const float* lp, size_t n, double log_z, const PchipSpan& c, float shift,
                     float* s, float* e, double* blocks);
// One element's score, the same bits the span kernels give.
float HlgScoreAt(float lp, const HlgSpan& p);
float PchipScoreAt(float lp, double log_z, const PchipSpan& c);

// out[i] = x[i] - logZ with logZ = max + log(sum exp(x - max)) (x finite or
// -inf; not all -inf). Returns logZ. out may alias x.
double LogSoftmax(const float* x, size_t n, float* out);

// Writes the indices i with x[i] >= thresh to idx (in order); returns how many.
size_t IndicesAtLeast(const float* x, size_t n, float thresh, uint32_t* idx);

}  // namespace lumen::kernels
