// Per-target pieces the attention kernels share (Highway): the load of
// KV-ring elements widened to f32 (one vector of a row's elements at an
// element offset, for f32, f16, bf16 and Q8_0 in blocks of kQK along the
// row) and the dispatch over those types, the -inf of a masked score, and
// exp with exact zeros for masked scores. Included by attention.cc,
// attention_rows.cc and attention_train.cc after hwy/contrib/math/math-inl.h;
// never outside src/lumen/kernels/.
#if defined(LUMEN_KERNELS_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LUMEN_KERNELS_ATTENTION_INL_H_
#undef LUMEN_KERNELS_ATTENTION_INL_H_
#else
#define LUMEN_KERNELS_ATTENTION_INL_H_
#endif

#include <cstdint>
#include <cstring>
#include <limits>

#include <hwy/highway.h>

#include "lumen/core/dtype.h"
#include "lumen/core/half.h"
#include "lumen/core/quant.h"

HWY_BEFORE_NAMESPACE();
namespace lumen::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lanes elements from element `at` of a ring laid out as T. Q8_0: the lanes
// must not cross a 32-block (callers keep head_dim % 32 == 0).
template <DType T>
HWY_INLINE hn::Vec<hn::ScalableTag<float>> LoadKv(const void* base, int64_t at) {
  const hn::ScalableTag<float> d;
  if constexpr (T == DType::kF16) {
    const hn::Rebind<hwy::float16_t, decltype(d)> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, static_cast<const hwy::float16_t*>(base) + at));
  } else if constexpr (T == DType::kBF16) {
    const hn::Rebind<hwy::bfloat16_t, decltype(d)> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, static_cast<const hwy::bfloat16_t*>(base) + at));
  } else if constexpr (T == DType::kQ8_0) {
    const uint8_t* blk = static_cast<const uint8_t*>(base) + (at / kQK) * sizeof(BlockQ8_0);
    uint16_t h;
    std::memcpy(&h, blk, 2);
    const hn::Rebind<int8_t, decltype(d)> d8;
    const hn::RebindToSigned<decltype(d)> di;
    const auto q =
        hn::PromoteTo(di, hn::LoadU(d8, reinterpret_cast<const int8_t*>(blk + 2) + at % kQK));
    return hn::Mul(hn::ConvertTo(d, q), hn::Set(d, F16ToF32(h)));
  } else {
    return hn::LoadU(d, static_cast<const float*>(base) + at);
  }
}

// Calls f.template operator()<T>() for a KV type LoadKv takes; false for others.
template <class F>
bool ForKvType(DType t, const F& f) {
  switch (t) {
    case DType::kF16:
      return f.template operator()<DType::kF16>();
    case DType::kBF16:
      return f.template operator()<DType::kBF16>();
    case DType::kF32:
      return f.template operator()<DType::kF32>();
    case DType::kQ8_0:
      return f.template operator()<DType::kQ8_0>();
    default:
      return false;
  }
}

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp(x) with exact zeros below the float range (and for -inf, a masked score,
// and NaN).
HWY_INLINE hn::Vec<hn::ScalableTag<float>> ExpZ(hn::ScalableTag<float> d,
                                                hn::Vec<hn::ScalableTag<float>> x) {
  const auto lo = hn::Set(d, -104.0f);
  return hn::IfThenElseZero(hn::Ge(x, lo), hn::Exp(d, hn::Max(x, lo)));
}

}  // namespace lumen::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
