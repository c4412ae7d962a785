// core/bf16.hpp against an independent, bit-exact reference of IEEE-754
// roundTiesToEven to 8 significant bits: for x, the two bf16 neighbours
// (truncation and the next one up in magnitude) are compared by their exact
// distance to x in long double arithmetic (every bf16 and every fp32 is exact
// in double), the nearer wins, a tie goes to the even mantissa. Overflow
// follows IEEE: the "next" bf16 above the largest finite one is inf, whose
// value for the comparison is 2^128.
#include "wlb4d/core/bf16.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

// A named free function holds the kernel (nvcc: no extended lambda in
// TestBody, a private member).
namespace wlb_test_bf16 {
void convert(const Kokkos::View<float*>& x, const Kokkos::View<std::uint16_t*>& h) {
  Kokkos::parallel_for(
      "test_bf16", x.extent(0), KOKKOS_LAMBDA(const std::size_t i) { h(i) = wlb::core::float_to_bf16(x(i)); });
}
}  // namespace wlb_test_bf16

namespace {

using wlb::core::bf16_bits;
using wlb::core::bf16_to_float;
using wlb::core::float_to_bf16;

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The value of a non-NaN bf16 bit pattern, from its fields (not by shifting).
long double bf16_value(std::uint16_t h) {
  const int sign = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
  long double v;
  if (e == 0xff) v = std::ldexp(1.0L, 128);  // inf: 2^128 for the rounding decision
  else if (e == 0) v = std::ldexp((long double)m, -126 - 7);
  else v = std::ldexp((long double)(128 + m), e - 127 - 7);
  return sign ? -v : v;
}

// Reference: finite or infinite non-NaN x.
std::uint16_t reference(float x) {
  const std::uint32_t u = to_bits(x);
  if ((u & 0x7fffffffu) == 0x7f800000u) return std::uint16_t(u >> 16);  // inf
  const std::uint16_t lo = std::uint16_t(u >> 16);  // truncation toward zero
  const std::uint16_t hi = std::uint16_t(lo + 1);   // next magnitude up (may be inf)
  const long double X = x;
  const long double dlo = std::fabs(X - bf16_value(lo)), dhi = std::fabs(X - bf16_value(hi));
  if (dlo < dhi) return lo;
  if (dhi < dlo) return (hi & 0x7fff) >= 0x7f80 ? std::uint16_t((hi & 0x8000) | 0x7f80) : hi;
  return (lo & 1) ? hi : lo;  // tie: even mantissa
}

void expect_matches(std::uint32_t u) {
  const float x = from_bits(u);
  const bf16_bits got = float_to_bf16(x);
  ASSERT_EQ(got, reference(x)) << std::hex << "x bits 0x" << u << " (" << x << ")";
}

TEST(Bf16, TiesGoToEven) {
  // 1 + 2^-8 is halfway between 1 (mantissa 0, even) and 1 + 2^-7 (odd): down.
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808000u)), 0x3f80);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
  EXPECT_EQ(float_to_bf16(from_bits(0x3f818000u)), 0x3f82);
  // Just above / below a tie.
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(float_to_bf16(from_bits(0x3f817fffu)), 0x3f81);
  EXPECT_EQ(float_to_bf16(-1.00390625f), 0xbf80);
  for (std::uint32_t hi : {0x0000u, 0x0001u, 0x3f80u, 0x3f81u, 0x7f7eu, 0x8001u, 0xc2ffu})
    expect_matches((hi << 16) | 0x8000u);
}

TEST(Bf16, SubnormalsRoundLikeNormals) {
  const float tiny = from_bits(0x00000001u);  // smallest fp32 subnormal
  EXPECT_EQ(float_to_bf16(tiny), 0x0000);      // far below half a bf16 subnormal ulp
  EXPECT_EQ(float_to_bf16(from_bits(0x00008000u)), 0x0000);  // tie to even (0)
  EXPECT_EQ(float_to_bf16(from_bits(0x00018000u)), 0x0002);  // tie to even (up)
  EXPECT_EQ(float_to_bf16(from_bits(0x007fffffu)), 0x0080);  // rounds up into the normals
  EXPECT_EQ(bf16_to_float(0x0001), std::ldexp(1.0f, -133));  // smallest bf16 subnormal
  for (std::uint32_t u = 0; u < 0x00800000u; u += 0x1f3u) {
    expect_matches(u);
    expect_matches(u | 0x80000000u);
  }
}

TEST(Bf16, InfinitiesMaxFiniteAndOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_bf16(inf), 0x7f80);
  EXPECT_EQ(float_to_bf16(-inf), 0xff80);
  EXPECT_EQ(bf16_to_float(0x7f7f), 3.38953139e38f);  // largest finite bf16
  EXPECT_EQ(float_to_bf16(3.38953139e38f), 0x7f7f);
  // FLT_MAX is above max bf16 by more than half a bf16 ulp: inf.
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::max()), 0xff80);
  // Exactly half an ulp above max bf16: a tie with an odd mantissa, so inf.
  EXPECT_EQ(float_to_bf16(from_bits(0x7f7f8000u)), 0x7f80);
  EXPECT_EQ(float_to_bf16(from_bits(0x7f7f7fffu)), 0x7f7f);
  for (std::uint32_t u = 0x7f000000u; u < 0x7f800000u; u += 0x7ffu) expect_matches(u);
}

TEST(Bf16, NanStaysQuietNan) {
  for (std::uint32_t u : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fbfffffu, 0xff800001u, 0x7fffffffu,
                          0x7f80ffffu}) {
    const bf16_bits h = float_to_bf16(from_bits(u));
    EXPECT_TRUE(std::isnan(bf16_to_float(h))) << std::hex << u;
    EXPECT_TRUE(h & 0x0040) << "quiet bit, x bits 0x" << std::hex << u;
    EXPECT_EQ(h & 0x8000, (u >> 16) & 0x8000) << "sign, x bits 0x" << std::hex << u;
  }
  // A signalling NaN whose payload sits only in the dropped bits must not become inf.
  EXPECT_EQ(float_to_bf16(from_bits(0x7f800001u)), 0x7fc0);
}

TEST(Bf16, WideningIsExactAndRoundTrips) {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = bf16_to_float(bf16_bits(h));
    EXPECT_EQ(to_bits(f), h << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(float_to_bf16(f), h);
    }
  }
}

TEST(Bf16, RandomPatternsMatchReference) {
  std::mt19937 gen(7);
  for (int i = 0; i < 2000000; ++i) {
    const std::uint32_t u = gen();
    if ((u & 0x7fffffffu) > 0x7f800000u) continue;  // NaN: tested above
    expect_matches(u);
  }
}

TEST(Bf16, KernelConversionEqualsHost) {
  // The same inline function inside a Kokkos kernel (device path of a CUDA build).
  const int n = 1 << 16;
  Kokkos::View<float*> x("x", n);
  Kokkos::View<std::uint16_t*> h("h", n);
  auto xh = Kokkos::create_mirror_view(x);
  std::mt19937 gen(11);
  for (int i = 0; i < n; ++i) xh(i) = from_bits(gen() & 0xbfffffffu);  // no NaN/inf exponent
  Kokkos::deep_copy(x, xh);
  wlb_test_bf16::convert(x, h);
  auto hh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), h);
  for (int i = 0; i < n; ++i) ASSERT_EQ(hh(i), reference(xh(i))) << i;
}

}  // namespace
