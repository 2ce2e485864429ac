#include "lumen/kernels/activation.h"
#include "lumen/core/route.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lumen/kernels/activation.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "lumen/kernels/vecmath-inl.h"

HWY_BEFORE_NAMESPACE();
namespace lumen::kernels::HWY_NAMESPACE {

template <bool kGelu>
HWY_INLINE void Gated(float* HWY_RESTRICT gate, const float* HWY_RESTRICT up, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto one = hn::Set(d, 1.0f);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto g = hn::LoadU(d, gate + i);
    auto z = g;
    if constexpr (kGelu) {
      const auto x3 = M(M(g, g), g);
      z = M(hn::Set(d, 1.5957691216057308f), hn::Add(g, M(hn::Set(d, 0.044715f), x3)));
    }
    const auto s = hn::Div(g, hn::Add(one, VExp(d, hn::Neg(z))));
    hn::StoreU(M(s, hn::LoadU(d, up + i)), d, gate + i);
  }
  const Activation act = kGelu ? Activation::kGeluTanh : Activation::kSilu;
  for (; i < n; ++i) gate[i] = GatedRef(act, gate[i], up[i]);
}

void GatedActivationT(Activation act, float* gate, const float* up, int64_t n) {
  if (act == Activation::kGeluTanh) return Gated<true>(gate, up, n);
  Gated<false>(gate, up, n);
}

}  // namespace lumen::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lumen::kernels {

LUMEN_ROUTE(
    act_gated,
    {.node = "act.gated",
     .name = "simd",
     .tier = Tier::kL1,
     .oracle = "GatedRef (vecmath's ExpRef polynomial; within a few ulp of std::exp/std::tanh)",
     .bound = "bit-identical on every target",
     .tests = "GatedActivation.EveryTargetGivesTheReferenceBits;GatedActivation."
              "ReferenceTracksTheTextbookFormulas",
     .priority = 10});

HWY_EXPORT(GatedActivationT);

void GatedActivation(Activation act, float* gate, const float* up, int64_t n) {
  HWY_DYNAMIC_DISPATCH(GatedActivationT)(act, gate, up, n);
}

}  // namespace lumen::kernels
#endif  // HWY_ONCE
