// Dispatch for the vecmath span kernels: one HWY_DYNAMIC_DISPATCH per span.
#include "lumen/kernels/vecmath.h"

#include <algorithm>
#include <cmath>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lumen/kernels/vecmath.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "lumen/kernels/vecmath-inl.h"

#if HWY_ONCE
namespace lumen::kernels {

HWY_EXPORT(CleanMaxT);
HWY_EXPORT(MaxF32T);
HWY_EXPORT(CleanShiftScoreT);
HWY_EXPORT(ScaleScoreT);
HWY_EXPORT(CleanShiftT);
HWY_EXPORT(HlgScoreExpT);
HWY_EXPORT(PchipScoreExpT);
HWY_EXPORT(ExpShiftSumT);
HWY_EXPORT(BlockSumT);
HWY_EXPORT(ExpMomentsT);
HWY_EXPORT(HlgScoreT);
HWY_EXPORT(PchipScoreT);
HWY_EXPORT(LogSoftmaxT);
HWY_EXPORT(IndicesAtLeastT);

float CleanMax(const float* x, size_t n) { return HWY_DYNAMIC_DISPATCH(CleanMaxT)(x, n); }
float MaxF32(const float* x, size_t n) { return HWY_DYNAMIC_DISPATCH(MaxF32T)(x, n); }
float CleanShiftScore(const float* x, size_t n, float shift, float gain, float* lp, float* s) {
  return HWY_DYNAMIC_DISPATCH(CleanShiftScoreT)(x, n, shift, gain, lp, s);
}
void CleanShift(const float* x, size_t n, float shift, float* lp) {
  HWY_DYNAMIC_DISPATCH(CleanShiftT)(x, n, shift, lp);
}
double HlgScoreExp(const float* lp, size_t n, const HlgSpan& p, float shift, float* s, float* e,
                   double* blocks) {
  return HWY_DYNAMIC_DISPATCH(HlgScoreExpT)(lp, n, p, shift, s, e, blocks);
}
double PchipScoreExp(const float* lp, size_t n, double log_z, const PchipSpan& c, float shift,
                     float* s, float* e, double* blocks) {
  return HWY_DYNAMIC_DISPATCH(PchipScoreExpT)(lp, n, log_z, c, shift, s, e, blocks);
}
float HlgScoreAt(float lp, const HlgSpan& p) { return ref::HlgScoreRef(lp, p); }
float PchipScoreAt(float lp, double log_z, const PchipSpan& c) {
  return ref::PchipScoreRef(lp, log_z, c);
}
float ScaleScore(const float* lp, size_t n, float gain, float* s) {
  return HWY_DYNAMIC_DISPATCH(ScaleScoreT)(lp, n, gain, s);
}
double ExpShiftSum(const float* s, size_t n, float shift, float* e, double* blocks) {
  return HWY_DYNAMIC_DISPATCH(ExpShiftSumT)(s, n, shift, e, blocks);
}
double BlockSum(const float* x, size_t n, double* blocks) {
  return HWY_DYNAMIC_DISPATCH(BlockSumT)(x, n, blocks);
}
void ExpMoments(const float* lp, size_t n, double* sum_e, double* sum_elp) {
  HWY_DYNAMIC_DISPATCH(ExpMomentsT)(lp, n, sum_e, sum_elp);
}
float HlgScore(const float* lp, size_t n, const HlgSpan& p, float* s) {
  return HWY_DYNAMIC_DISPATCH(HlgScoreT)(lp, n, p, s);
}
float PchipScore(const float* lp, size_t n, double log_z, const PchipSpan& c, float* s) {
  return HWY_DYNAMIC_DISPATCH(PchipScoreT)(lp, n, log_z, c, s);
}
double LogSoftmax(const float* x, size_t n, float* out) {
  return HWY_DYNAMIC_DISPATCH(LogSoftmaxT)(x, n, out);
}
size_t IndicesAtLeast(const float* x, size_t n, float thresh, uint32_t* idx) {
  return HWY_DYNAMIC_DISPATCH(IndicesAtLeastT)(x, n, thresh, idx);
}

}  // namespace lumen::kernels
#endif  // HWY_ONCE
