#pragma once
/// \file bf16.hpp
/// \brief bfloat16 (1 sign, 8 exponent, 7 mantissa bits: the top half of an
/// IEEE-754 binary32) and its conversions, for train.precision = bf16
/// (DESIGN §10).
///
/// Kokkos 3.4 (Debian) has no bf16 scalar (Kokkos 4 has
/// Kokkos::Experimental::bhalf_t), so the storage type is our own: the 16
/// bits, in a std::uint16_t, bit-compatible with OpenBLAS's `bfloat16`,
/// CUDA's `__nv_bfloat16` and Kokkos 4's bhalf_t.
///
/// fp32 → bf16 rounds to nearest, ties to even (IEEE-754 roundTiesToEven on
/// the 16 dropped bits, as Intel's AVX512-BF16 VCVTNEPS2BF16 and CUDA's
/// __float2bfloat16_rn): finite values above the largest bf16
/// (0x7F7F = 3.3895314e38) by at least half an ulp overflow to ±inf;
/// subnormals round like normals (no flush to zero); ±inf stay ±inf; a NaN
/// stays a NaN, made quiet (bit 6 of the bf16 set) with its sign and top
/// payload bits, so a payload that lived only in the dropped bits cannot
/// turn into an inf. bf16 → fp32 is exact (append 16 zero bits).
///
/// Usable in kernels (KOKKOS_INLINE_FUNCTION, no std:: calls). Nothing throws.

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace wlb::core {

/// bf16 bits (storage type of bf16 tensors).
using bf16_bits = std::uint16_t;

namespace detail {
union F32Bits {
  float f;
  std::uint32_t u;
};
}  // namespace detail

/// fp32 → bf16, round to nearest even (see the file comment).
KOKKOS_INLINE_FUNCTION bf16_bits float_to_bf16(float x) {
  detail::F32Bits b;
  b.f = x;
  const std::uint32_t u = b.u;
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_bits((u >> 16) | 0x0040u);  // NaN: quiet, keep sign
  // Adding 0x7fff rounds up exactly when the dropped half exceeds 0x8000;
  // the kept LSB adds the last 1 for a tie with an odd LSB (ties to even).
  // A carry out of the mantissa bumps the exponent, which is the right
  // answer, up to inf for the largest finite values.
  return bf16_bits((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// bf16 → fp32 (exact).
KOKKOS_INLINE_FUNCTION float bf16_to_float(bf16_bits h) {
  detail::F32Bits b;
  b.u = std::uint32_t(h) << 16;
  return b.f;
}

/// x rounded to the nearest bf16, as an fp32 (the value a bf16 GEMM operand has).
KOKKOS_INLINE_FUNCTION float round_to_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

/// Unit roundoff of bf16 (2^-8: 8 significant bits); |round(x) − x| ≤ u·|x| for normal x.
constexpr double kBf16UnitRoundoff = 1.0 / 256.0;

}  // namespace wlb::core
