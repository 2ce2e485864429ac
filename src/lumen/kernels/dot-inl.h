// Per-target f32 dot products (Highway). Included by kernel .cc files inside
// their HWY_NAMESPACE; never included outside src/lumen/kernels/.
#if defined(LUMEN_KERNELS_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LUMEN_KERNELS_DOT_INL_H_
#undef LUMEN_KERNELS_DOT_INL_H_
#else
#define LUMEN_KERNELS_DOT_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace lumen::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// sum a[i] * b[i] with four independent accumulators (hides FMA latency).
HWY_INLINE float DotF32(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(d, a + i + N), hn::LoadU(d, b + i + N), s1);
    s2 = hn::MulAdd(hn::LoadU(d, a + i + 2 * N), hn::LoadU(d, b + i + 2 * N), s2);
    s3 = hn::MulAdd(hn::LoadU(d, a + i + 3 * N), hn::LoadU(d, b + i + 3 * N), s3);
  }
  for (; i + N <= n; i += N) s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
  float sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// y[i] += alpha * x[i]
HWY_INLINE void AxpyF32(float alpha, const float* HWY_RESTRICT x, float* HWY_RESTRICT y,
                        int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto va = hn::Set(d, alpha);
  int64_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::MulAdd(va, hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, y + i);
  for (; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace lumen::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // LUMEN_KERNELS_DOT_INL_H_
