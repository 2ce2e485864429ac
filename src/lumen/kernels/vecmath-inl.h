// Per-target bodies of the vecmath span kernels (vecmath.h). Included by
// vecmath.cc inside its Highway target loop; never included outside
// src/lumen/kernels/. Exp/Log mirror ExpRef/LogRef (vecmath_ref.h) operation
// for operation, with Mul/Add rather than MulAdd, so every target gives the
// reference's bits.
#if defined(LUMEN_KERNELS_VECMATH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LUMEN_KERNELS_VECMATH_INL_H_
#undef LUMEN_KERNELS_VECMATH_INL_H_
#else
#define LUMEN_KERNELS_VECMATH_INL_H_
#endif

#include <hwy/highway.h>

#include "lumen/kernels/vecmath.h"
#include "lumen/kernels/vecmath_ref.h"

HWY_BEFORE_NAMESPACE();
namespace lumen::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// hn::Mul kept apart from a following add (see ref::Mul): on the FMA targets
// GCC would otherwise fuse it.
template <class V>
HWY_INLINE V M(V a, V b) {
  V r = hn::Mul(a, b);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  asm("" : "+v"(r.raw));
#endif
  return r;
}

template <class D, class V = hn::Vec<D>>
HWY_INLINE V VExp(D d, V x) {
  const hn::RebindToSigned<D> di;
  const auto zero = hn::Lt(x, hn::Set(d, -87.3f));
  x = hn::Max(x, hn::Set(d, -87.3f));
  x = hn::Min(x, hn::Set(d, 88.0f));
  const V fx = hn::Add(M(x, hn::Set(d, 1.44269504088896341f)), hn::Set(d, 0.5f));
  const V tf = hn::Floor(fx);
  x = hn::Sub(x, M(tf, hn::Set(d, 0.693359375f)));
  x = hn::Add(x, M(tf, hn::Set(d, 2.12194440e-4f)));
  const V z = M(x, x);
  V y = hn::Set(d, 1.9875691500e-4f);
  y = hn::Add(M(y, x), hn::Set(d, 1.3981999507e-3f));
  y = hn::Add(M(y, x), hn::Set(d, 8.3334519073e-3f));
  y = hn::Add(M(y, x), hn::Set(d, 4.1665795894e-2f));
  y = hn::Add(M(y, x), hn::Set(d, 1.6666665459e-1f));
  y = hn::Add(M(y, x), hn::Set(d, 5.0000001201e-1f));
  y = hn::Add(hn::Add(M(y, z), x), hn::Set(d, 1.0f));
  const auto bits = hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, tf), hn::Set(di, 127)));
  y = M(y, hn::BitCast(d, bits));
  return hn::IfThenZeroElse(zero, y);
}

template <class D, class V = hn::Vec<D>>
HWY_INLINE V VLog(D d, V x) {
  const hn::RebindToSigned<D> di;
  auto bits = hn::BitCast(di, x);
  auto e = hn::Sub(hn::And(hn::ShiftRight<23>(bits), hn::Set(di, 0xff)), hn::Set(di, 126));
  bits = hn::Or(hn::And(bits, hn::Set(di, 0x007fffff)), hn::Set(di, 0x3f000000));
  V m = hn::BitCast(d, bits);
  const auto small = hn::Lt(m, hn::Set(d, 0.707106781186547524f));
  e = hn::IfThenElse(hn::RebindMask(di, small), hn::Sub(e, hn::Set(di, 1)), e);
  const V ef = hn::ConvertTo(d, e);
  m = hn::Sub(hn::Add(m, hn::IfThenElseZero(small, m)), hn::Set(d, 1.0f));
  const V z = M(m, m);
  V y = hn::Set(d, 7.0376836292e-2f);
  y = hn::Sub(M(y, m), hn::Set(d, 1.1514610310e-1f));
  y = hn::Add(M(y, m), hn::Set(d, 1.1676998740e-1f));
  y = hn::Sub(M(y, m), hn::Set(d, 1.2420140846e-1f));
  y = hn::Add(M(y, m), hn::Set(d, 1.4249322787e-1f));
  y = hn::Sub(M(y, m), hn::Set(d, 1.6668057665e-1f));
  y = hn::Add(M(y, m), hn::Set(d, 2.0000714765e-1f));
  y = hn::Sub(M(y, m), hn::Set(d, 2.4999993993e-1f));
  y = hn::Add(M(y, m), hn::Set(d, 3.3333331174e-1f));
  y = M(M(y, m), z);
  y = hn::Add(y, M(ef, hn::Set(d, -2.12194440e-4f)));
  y = hn::Sub(y, M(z, hn::Set(d, 0.5f)));
  return hn::Add(hn::Add(m, y), M(ef, hn::Set(d, 0.693359375f)));
}

// NaN -> -inf, +inf -> FLT_MAX.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V VClean(D d, V x) {
  const V ninf = hn::Set(d, ref::kNegInf);
  return hn::IfThenElse(hn::Gt(x, ninf), hn::Min(x, hn::Set(d, ref::kFloatMax)), ninf);
}

template <class D, class V = hn::Vec<D>>
HWY_INLINE float VMaxLane(D d, V v) {
  return hn::GetLane(hn::MaxOfLanes(d, v));
}

inline float CleanMaxT(const float* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto m0 = hn::Set(d, ref::kNegInf), m1 = m0;
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    m0 = hn::Max(m0, VClean(d, hn::LoadU(d, x + i)));
    m1 = hn::Max(m1, VClean(d, hn::LoadU(d, x + i + N)));
  }
  float r = VMaxLane(d, hn::Max(m0, m1));
  for (; i < n; ++i) r = std::max(r, ref::Clean(x[i]));
  return r;
}

inline float MaxF32T(const float* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto m0 = hn::Set(d, ref::kNegInf), m1 = m0;
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    m0 = hn::Max(m0, hn::LoadU(d, x + i));
    m1 = hn::Max(m1, hn::LoadU(d, x + i + N));
  }
  float r = VMaxLane(d, hn::Max(m0, m1));
  for (; i < n; ++i) r = std::max(r, x[i]);
  return r;
}

inline float CleanShiftScoreT(const float* HWY_RESTRICT x, size_t n, float shift, float gain,
                              float* HWY_RESTRICT lp, float* HWY_RESTRICT s) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto vs = hn::Set(d, shift), vg = hn::Set(d, gain), z = hn::Zero(d);
  auto mx = hn::Set(d, ref::kNegInf);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto l = hn::Sub(VClean(d, hn::LoadU(d, x + i)), vs);
    const auto sc = hn::Add(hn::Mul(vg, l), z);
    hn::StoreU(l, d, lp + i);
    hn::StoreU(sc, d, s + i);
    mx = hn::Max(mx, sc);
  }
  float r = VMaxLane(d, mx);
  for (; i < n; ++i) {
    lp[i] = ref::Clean(x[i]) - shift;
    s[i] = gain * lp[i] + 0.0f;
    r = std::max(r, s[i]);
  }
  return r;
}

inline void CleanShiftT(const float* HWY_RESTRICT x, size_t n, float shift,
                        float* HWY_RESTRICT lp) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto vs = hn::Set(d, shift);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Sub(VClean(d, hn::LoadU(d, x + i)), vs), d, lp + i);
  for (; i < n; ++i) lp[i] = ref::Clean(x[i]) - shift;
}

inline float ScaleScoreT(const float* HWY_RESTRICT lp, size_t n, float gain,
                         float* HWY_RESTRICT s) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto vg = hn::Set(d, gain), z = hn::Zero(d);
  auto mx = hn::Set(d, ref::kNegInf);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto sc = hn::Add(hn::Mul(vg, hn::LoadU(d, lp + i)), z);
    hn::StoreU(sc, d, s + i);
    mx = hn::Max(mx, sc);
  }
  float r = VMaxLane(d, mx);
  for (; i < n; ++i) {
    s[i] = gain * lp[i] + 0.0f;
    r = std::max(r, s[i]);
  }
  return r;
}

// Lane sum of a float vector, in double.
template <class D, class V = hn::Vec<D>>
HWY_INLINE double VSumD(D d, V v) {
  HWY_ALIGN float buf[hn::MaxLanes(d)];
  hn::Store(v, d, buf);
  double s = 0;
  for (size_t j = 0; j < hn::Lanes(d); ++j) s += buf[j];
  return s;
}

// Sums of x in blocks of kSumBlock (f32 vector lanes, then f64 per block).
inline double BlockSumT(const float* HWY_RESTRICT x, size_t n, double* HWY_RESTRICT blocks) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  double total = 0;
  size_t nb = 0;
  for (size_t b = 0; b < n; b += kSumBlock) {
    const size_t end = std::min(n, b + kSumBlock);
    auto acc0 = hn::Zero(d), acc1 = hn::Zero(d);
    size_t i = b;
    for (; i + 2 * N <= end; i += 2 * N) {
      acc0 = hn::Add(acc0, hn::LoadU(d, x + i));
      acc1 = hn::Add(acc1, hn::LoadU(d, x + i + N));
    }
    double sum = VSumD(d, hn::Add(acc0, acc1));
    for (; i < end; ++i) sum += x[i];
    if (blocks) blocks[nb] = sum;
    ++nb;
    total += sum;
  }
  return total;
}

// Scores then e = Exp(score - shift) with blocked sums, in one pass: vf(i)
// gives the score vector of lanes [i, i+N), sf(i) the score of element i.
// ExpShiftSum runs the same loop on stored scores, so a fused route and an
// unfused one give the same e bits and the same sums.
template <class VecFn, class ScalarFn>
HWY_INLINE double ScoreExpBlocked(size_t n, float shift, float* HWY_RESTRICT s,
                                  float* HWY_RESTRICT e, double* HWY_RESTRICT blocks, VecFn vf,
                                  ScalarFn sf) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto vs = hn::Set(d, shift);
  double total = 0;
  size_t nb = 0;
  for (size_t b = 0; b < n; b += kSumBlock) {
    const size_t end = std::min(n, b + kSumBlock);
    auto acc0 = hn::Zero(d), acc1 = hn::Zero(d);
    size_t i = b;
    for (; i + 2 * N <= end; i += 2 * N) {
      const auto s0 = vf(i), s1 = vf(i + N);
      if (s) {
        hn::StoreU(s0, d, s + i);
        hn::StoreU(s1, d, s + i + N);
      }
      const auto v0 = VExp(d, hn::Sub(s0, vs)), v1 = VExp(d, hn::Sub(s1, vs));
      if (e) {
        hn::StoreU(v0, d, e + i);
        hn::StoreU(v1, d, e + i + N);
      }
      acc0 = hn::Add(acc0, v0);
      acc1 = hn::Add(acc1, v1);
    }
    double sum = VSumD(d, hn::Add(acc0, acc1));
    for (; i < end; ++i) {
      const float sc = sf(i);
      if (s) s[i] = sc;
      const float v = ref::ExpRef(sc - shift);
      if (e) e[i] = v;
      sum += v;
    }
    if (blocks) blocks[nb] = sum;
    ++nb;
    total += sum;
  }
  return total;
}

inline double ExpShiftSumT(const float* s, size_t n, float shift, float* e, double* blocks) {
  const hn::ScalableTag<float> d;
  return ScoreExpBlocked(
      n, shift, nullptr, e, blocks, [&](size_t i) { return hn::LoadU(d, s + i); },
      [&](size_t i) { return s[i]; });
}

inline void ExpMomentsT(const float* HWY_RESTRICT lp, size_t n, double* sum_e, double* sum_elp) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto ninf = hn::Set(d, ref::kNegInf);
  double se = 0, sel = 0;
  for (size_t b = 0; b < n; b += kSumBlock) {
    const size_t end = std::min(n, b + kSumBlock);
    auto ae = hn::Zero(d), al = hn::Zero(d);
    size_t i = b;
    for (; i + N <= end; i += N) {
      const auto l = hn::LoadU(d, lp + i);
      const auto ev = VExp(d, l);
      ae = hn::Add(ae, ev);
      al = hn::Add(al, hn::IfThenElseZero(hn::Gt(l, ninf), hn::Mul(ev, l)));
    }
    double be = VSumD(d, ae), bl = VSumD(d, al);
    for (; i < end; ++i) {
      const float ev = ref::ExpRef(lp[i]);
      be += ev;
      if (lp[i] > ref::kNegInf) bl += ev * lp[i];
    }
    se += be;
    sel += bl;
  }
  *sum_e = se;
  *sum_elp = sel;
}

// The HLG score of one vector of log-probs (HlgSpan; ref::HlgScoreRef per lane).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V HlgVec(D d, V l, const HlgSpan& p) {
  const auto mu = hn::Set(d, p.mu), m = hn::Set(d, p.m), w = hn::Set(d, p.width);
  const auto zero = hn::Zero(d), ninf = hn::Set(d, ref::kNegInf);
  const auto z = hn::Sub(l, mu);
  const auto u = hn::Max(hn::Sub(hn::Abs(z), w), zero);
  auto off = zero;
  // Tokens in the mids need no log (their offset is exactly +0.0).
  if (!hn::AllFalse(d, hn::Gt(u, zero))) {
    const auto shoulder = hn::Gt(z, zero);
    const auto b = hn::IfThenElse(shoulder, hn::Set(d, p.shoulder), hn::Set(d, p.toe));
    const auto ib = hn::IfThenElse(shoulder, hn::Set(d, p.inv_shoulder), hn::Set(d, p.inv_toe));
    const auto mag = M(m, hn::Sub(u, M(b, VLog(d, hn::Add(hn::Set(d, 1.0f), M(u, ib))))));
    off = hn::IfThenElse(shoulder, hn::Sub(zero, mag), mag);
  }
  return hn::IfThenElse(hn::Gt(l, ninf), hn::Add(M(m, l), off), ninf);
}

inline float HlgScoreT(const float* HWY_RESTRICT lp, size_t n, const HlgSpan& p,
                       float* HWY_RESTRICT s) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto mx = hn::Set(d, ref::kNegInf);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto sc = HlgVec(d, hn::LoadU(d, lp + i), p);
    hn::StoreU(sc, d, s + i);
    mx = hn::Max(mx, sc);
  }
  float r = VMaxLane(d, mx);
  for (; i < n; ++i) {
    s[i] = ref::HlgScoreRef(lp[i], p);
    r = std::max(r, s[i]);
  }
  return r;
}

inline double HlgScoreExpT(const float* lp, size_t n, const HlgSpan& p, float shift, float* s,
                           float* e, double* blocks) {
  const hn::ScalableTag<float> d;
  return ScoreExpBlocked(
      n, shift, s, e, blocks, [&](size_t i) { return HlgVec(d, hn::LoadU(d, lp + i), p); },
      [&](size_t i) { return ref::HlgScoreRef(lp[i], p); });
}

// PCHIP scores of Lanes(dd) log-probs (ref::PchipScoreRef per lane), in double.
template <class DD, class DF>
HWY_INLINE hn::Vec<DF> PchipVec(DD dd, DF df, hn::Vec<DF> lpf, double log_z, const PchipSpan& c) {
  const size_t nk = c.n_knots;
  const auto l = hn::PromoteTo(dd, lpf);
  const auto ld = hn::Sub(l, hn::Set(dd, log_z));
  const auto x0 = hn::Set(dd, c.x[0]), xl = hn::Set(dd, c.x[nk - 1]);
  const auto below = hn::Lt(ld, x0), above = hn::Gt(ld, xl);
  auto off = hn::Zero(dd);
  // Most of a large vocabulary lies below the bottom knot: the cubic is only
  // evaluated when some lane is inside.
  if (!hn::AllTrue(dd, hn::Or(below, above))) {
    auto xk = x0, a = hn::Set(dd, c.a[0]), b = hn::Set(dd, c.b[0]);
    auto cc = hn::Set(dd, c.c[0]), dk = hn::Set(dd, c.d[0]), ih = hn::Set(dd, c.inv_h[0]);
    for (size_t k = 1; k + 1 < nk; ++k) {
      const auto xs = hn::Set(dd, c.x[k]);
      const auto ge = hn::Ge(ld, xs);
      xk = hn::IfThenElse(ge, xs, xk);
      a = hn::IfThenElse(ge, hn::Set(dd, c.a[k]), a);
      b = hn::IfThenElse(ge, hn::Set(dd, c.b[k]), b);
      cc = hn::IfThenElse(ge, hn::Set(dd, c.c[k]), cc);
      dk = hn::IfThenElse(ge, hn::Set(dd, c.d[k]), dk);
      ih = hn::IfThenElse(ge, hn::Set(dd, c.inv_h[k]), ih);
    }
    const auto t = M(hn::Sub(ld, xk), ih);
    off = hn::Add(a, M(t, hn::Add(b, M(t, hn::Add(cc, M(t, dk))))));
  }
  off = hn::IfThenElse(
      below, hn::Add(hn::Set(dd, c.v_first), M(hn::Set(dd, c.low_slope_off), hn::Sub(ld, x0))),
      off);
  off = hn::IfThenElse(
      above, hn::Add(hn::Set(dd, c.v_last), M(hn::Set(dd, c.high_slope_off), hn::Sub(ld, xl))),
      off);
  const auto sc = hn::DemoteTo(df, hn::Add(l, off));
  const auto ninf = hn::Set(df, ref::kNegInf);
  return hn::IfThenElse(hn::Gt(lpf, ninf), sc, ninf);
}

inline float PchipScoreT(const float* HWY_RESTRICT lp, size_t n, double log_z, const PchipSpan& c,
                         float* HWY_RESTRICT s) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const size_t N = hn::Lanes(dd);
  auto mx = hn::Set(df, ref::kNegInf);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto sc = PchipVec(dd, df, hn::LoadU(df, lp + i), log_z, c);
    hn::StoreU(sc, df, s + i);
    mx = hn::Max(mx, sc);
  }
  float r = hn::GetLane(hn::MaxOfLanes(df, mx));
  for (; i < n; ++i) {
    s[i] = ref::PchipScoreRef(lp[i], log_z, c);
    r = std::max(r, s[i]);
  }
  return r;
}

// Full float vectors from two double halves.
inline double PchipScoreExpT(const float* lp, size_t n, double log_z, const PchipSpan& c,
                             float shift, float* s, float* e, double* blocks) {
  const hn::ScalableTag<float> d;
#if HWY_TARGET == HWY_SCALAR
  auto vf = [&](size_t i) { return hn::Set(d, ref::PchipScoreRef(lp[i], log_z, c)); };
#else
  // Full float vectors from two halves evaluated in double.
  const hn::Repartition<double, decltype(d)> dd;  // Lanes(d) / 2 doubles
  const hn::Half<decltype(d)> dh;
  const size_t H = hn::Lanes(dh);
  auto vf = [&](size_t i) {
    const auto lo = PchipVec(dd, dh, hn::LoadU(dh, lp + i), log_z, c);
    const auto hi = PchipVec(dd, dh, hn::LoadU(dh, lp + i + H), log_z, c);
    return hn::Combine(d, hi, lo);
  };
#endif
  return ScoreExpBlocked(n, shift, s, e, blocks, vf,
                         [&](size_t i) { return ref::PchipScoreRef(lp[i], log_z, c); });
}

inline double LogSoftmaxT(const float* x, size_t n, float* out) {
  const float mx = MaxF32T(x, n);
  const double sum = ExpShiftSumT(x, n, mx, nullptr, nullptr);
  const float ls = static_cast<float>(std::log(sum));
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto vm = hn::Set(d, mx), vls = hn::Set(d, ls);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::Sub(hn::Sub(hn::LoadU(d, x + i), vm), vls), d, out + i);
  }
  for (; i < n; ++i) out[i] = (x[i] - mx) - ls;
  return static_cast<double>(mx) + std::log(sum);
}

inline size_t IndicesAtLeastT(const float* HWY_RESTRICT x, size_t n, float thresh,
                              uint32_t* HWY_RESTRICT idx) {
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const size_t N = hn::Lanes(d);
  const auto t = hn::Set(d, thresh);
  const auto step = hn::Set(du, static_cast<uint32_t>(N));
  auto vi = hn::Iota(du, 0);
  size_t k = 0, i = 0;
  // Branch-free: compress the lane indices that pass (k <= i, so the store
  // stays inside idx[0, n)).
  for (; i + N <= n; i += N) {
    const auto pass = hn::RebindMask(du, hn::Ge(hn::LoadU(d, x + i), t));
    k += hn::CompressBlendedStore(vi, pass, du, idx + k);
    vi = hn::Add(vi, step);
  }
  for (; i < n; ++i) {
    if (x[i] >= thresh) idx[k++] = static_cast<uint32_t>(i);
  }
  return k;
}

}  // namespace lumen::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // LUMEN_KERNELS_VECMATH_INL_H_
