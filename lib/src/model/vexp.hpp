// Vectorised expf for the host kernels of wlb::model (internal header).
//
// glibc's expf is a scalar call: the exponentials of the cross-entropy over the
// vocabulary, SwiGLU's sigmoid and the attention softmax spent most of their
// time in it. vexp8 evaluates eight exponentials at once with GCC vector
// extensions (one AVX2 register; two SSE registers without AVX): Cephes'
// expf reduction x = n·ln2 + r, |r| ≤ ln2/2, a degree-6 polynomial for e^r
// and 2^n assembled in the exponent bits. Relative error ≤ 2 ulp against the
// correctly rounded value (glibc: ≤ 1 ulp), so results move in the last bits
// only. exp(-inf) = 0, exp(x < -87.33) = 0 (below FLT_MIN; glibc returns
// subnormals there), exp(x > 88.72) = +inf, NaN propagates.
//
// Host only: device builds keep kmath::exp (WLB4D_VEXP is undefined there).
#pragma once

#if defined(__GNUC__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__) && \
    !defined(__SYCL_DEVICE_ONLY__) && !defined(KOKKOS_ENABLE_CUDA) && !defined(KOKKOS_ENABLE_HIP) && \
    !defined(KOKKOS_ENABLE_SYCL)
#define WLB4D_VEXP 1

#include <cmath>
#include <cstdint>
#include <cstring>

namespace wlb::model::vexp {

typedef float f8 __attribute__((vector_size(32)));
typedef std::int32_t i8 __attribute__((vector_size(32)));

inline f8 splat(float a) { return f8{a, a, a, a, a, a, a, a}; }

inline f8 load(const float* p) {
  f8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, f8 v) { std::memcpy(p, &v, sizeof v); }

/// e^x, lane-wise, for any float vector type F with int32 lanes I (f8/i8,
/// or f16/i16 with AVX-512): every lane does the same arithmetic, so the
/// width never changes a result.
template <class F, class I>
inline F expv(F x) {
  const F hi = F{} + 88.7228393f, lo = F{} + -87.3365479f;
  const I over = x > hi, under = x < lo;
  // Clamp by selection (NaN compares false and passes through).
  x = over ? hi : x;
  x = under ? lo : x;
  // n = round(x / ln2); floor(t + 0.5) through a truncating conversion of a
  // value kept positive by the clamp offset.
  const F t = x * 1.44269504088896341f + 0.5f;
  I n = __builtin_convertvector(t, I);
  n -= (__builtin_convertvector(n, F) > t) ? I{} + 1 : I{};  // floor for t < 0
  const F fn = __builtin_convertvector(n, F);
  F r = x - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  F p = F{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  F y = p * (r * r) + r + 1.0f;
  // 2^n in the exponent field; n ∈ [-126, 128]: split so each factor is normal.
  const I n1 = n >> 1, n2 = n - n1;
  F s1, s2;
  const I e1 = (n1 + 127) << 23, e2 = (n2 + 127) << 23;
  std::memcpy(&s1, &e1, sizeof s1);
  std::memcpy(&s2, &e2, sizeof s2);
  y = y * s1 * s2;
  y = over ? F{} + HUGE_VALF : y;
  y = under ? F{} : y;
  return y;
}
inline f8 exp8(f8 x) { return expv<f8, i8>(x); }
#ifdef __AVX512F__
typedef float f16 __attribute__((vector_size(64)));
typedef std::int32_t i16 __attribute__((vector_size(64)));
#endif

/// e^x of one float, the same arithmetic as exp8 (for tails).
inline float exp1(float x) {
  f8 v = splat(x);
  return exp8(v)[0];
}

}  // namespace wlb::model::vexp
#endif

#ifdef WLB4D_VEXP
namespace wlb::model::vexp {

/// y[j] = e^(x[j] - sub) · mul for j < n (y may alias x). float: exp8;
/// double: std::exp (no vector path).
inline void exp_shift(const float* x, float* y, int n, float sub, float mul = 1.0f) {
  int j = 0;
#ifdef __AVX512F__
  // One zmm register per 16 values: half the instructions of two f8.
  for (; j + 16 <= n; j += 16) {
    f16 v;
    std::memcpy(&v, x + j, sizeof v);
    v = expv<f16, i16>(v - sub) * mul;
    std::memcpy(y + j, &v, sizeof v);
  }
#endif
  const f8 vs = splat(sub), vm = splat(mul);
  for (; j + 8 <= n; j += 8) store(y + j, exp8(load(x + j) - vs) * vm);
  if (j < n) {
    float tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int k = 0; j + k < n; ++k) tmp[k] = x[j + k];
    const f8 r = exp8(load(tmp) - vs) * vm;
    for (int k = 0; j + k < n; ++k) y[j + k] = r[k];
  }
}
inline void exp_shift(const double* x, double* y, int n, double sub, double mul = 1.0) {
  for (int j = 0; j < n; ++j) y[j] = std::exp(x[j] - sub) * mul;
}
inline float exp_one(float x) { return exp1(x); }
inline double exp_one(double x) { return std::exp(x); }

}  // namespace wlb::model::vexp
#endif
