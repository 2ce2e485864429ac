#include "lumen/kernels/roofline.h"

#include <chrono>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lumen/kernels/roofline.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace lumen::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

uint64_t StreamReadT(const void* p, size_t size) {
  const hn::ScalableTag<uint64_t> d;
  const size_t N = hn::Lanes(d);
  const uint64_t* q = static_cast<const uint64_t*>(p);
  const size_t n = size / sizeof(uint64_t);
  auto a = hn::Zero(d), b = hn::Zero(d), c = hn::Zero(d), e = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    a = hn::Xor(a, hn::LoadU(d, q + i));
    b = hn::Xor(b, hn::LoadU(d, q + i + N));
    c = hn::Xor(c, hn::LoadU(d, q + i + 2 * N));
    e = hn::Xor(e, hn::LoadU(d, q + i + 3 * N));
  }
  uint64_t r = hn::GetLane(hn::SumOfLanes(d, hn::Xor(hn::Xor(a, b), hn::Xor(c, e))));
  for (; i < n; ++i) r ^= q[i];
  return r;
}

double FmaFlopsT(double seconds) {
  const hn::ScalableTag<float> d;
  const double N = static_cast<double>(hn::Lanes(d));
  // 12 independent chains cover FMA latency x throughput on current cores.
  // Each starts from its own value: chains that start equal compute equal
  // values, and GCC merges them into one (the loop then reads 12x too fast).
  auto v0 = hn::Set(d, 1.0f), v1 = hn::Set(d, 1.001f), v2 = hn::Set(d, 1.002f);
  auto v3 = hn::Set(d, 1.003f), v4 = hn::Set(d, 1.004f), v5 = hn::Set(d, 1.005f);
  auto v6 = hn::Set(d, 1.006f), v7 = hn::Set(d, 1.007f), v8 = hn::Set(d, 1.008f);
  auto v9 = hn::Set(d, 1.009f), v10 = hn::Set(d, 1.010f), v11 = hn::Set(d, 1.011f);
  const auto m = hn::Set(d, 0.999999f), c = hn::Set(d, 1e-7f);
  const auto t0 = std::chrono::steady_clock::now();
  double flops = 0, elapsed = 0;
  constexpr int kIters = 1 << 16;
  do {
    for (int i = 0; i < kIters; ++i) {
      v0 = hn::MulAdd(v0, m, c);
      v1 = hn::MulAdd(v1, m, c);
      v2 = hn::MulAdd(v2, m, c);
      v3 = hn::MulAdd(v3, m, c);
      v4 = hn::MulAdd(v4, m, c);
      v5 = hn::MulAdd(v5, m, c);
      v6 = hn::MulAdd(v6, m, c);
      v7 = hn::MulAdd(v7, m, c);
      v8 = hn::MulAdd(v8, m, c);
      v9 = hn::MulAdd(v9, m, c);
      v10 = hn::MulAdd(v10, m, c);
      v11 = hn::MulAdd(v11, m, c);
    }
    flops += 12.0 * kIters * N * 2;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < seconds);
  const auto s = hn::Add(hn::Add(hn::Add(v0, v1), hn::Add(v2, v3)),
                         hn::Add(hn::Add(hn::Add(v4, v5), hn::Add(v6, v7)),
                                 hn::Add(hn::Add(v8, v9), hn::Add(v10, v11))));
  // Consume the result so the loop is not removed (the sum is never negative).
  if (hn::GetLane(s) < 0) flops = 0;
  return flops / elapsed;
}

int F32LanesT() { return static_cast<int>(hn::Lanes(hn::ScalableTag<float>())); }
int64_t TargetT() { return HWY_TARGET; }

}  // namespace lumen::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lumen::kernels {

HWY_EXPORT(StreamReadT);
HWY_EXPORT(FmaFlopsT);
HWY_EXPORT(F32LanesT);
HWY_EXPORT(TargetT);

uint64_t StreamRead(const void* p, size_t size) {
  return HWY_DYNAMIC_DISPATCH(StreamReadT)(p, size);
}
double MeasureFmaFlops(double seconds) { return HWY_DYNAMIC_DISPATCH(FmaFlopsT)(seconds); }
int KernelF32Lanes() { return HWY_DYNAMIC_DISPATCH(F32LanesT)(); }
const char* KernelTargetName() { return hwy::TargetName(HWY_DYNAMIC_DISPATCH(TargetT)()); }

}  // namespace lumen::kernels
#endif  // HWY_ONCE
