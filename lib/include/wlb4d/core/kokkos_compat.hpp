#pragma once
/// \file kokkos_compat.hpp
/// \brief The overlap of Kokkos 3.4 (Debian) and 4.x/5.x (Spack) used inside kernels.
///
/// Kokkos 3.4 has math only in Kokkos::Experimental and no Kokkos::min/max;
/// 3.7 promoted math to Kokkos:: and 4.3 removed Experimental:: math
/// (hpc-conventions §3.2). Kernels call wlb::kmath::exp etc., never the std::
/// versions (not callable on CUDA) nor a version-specific spelling.

#include <Kokkos_Core.hpp>

namespace wlb::kmath {

#if KOKKOS_VERSION >= 30700
using Kokkos::exp;
using Kokkos::log;
using Kokkos::sqrt;
using Kokkos::pow;
using Kokkos::fabs;
using Kokkos::cos;
using Kokkos::sin;
using Kokkos::isfinite;
#else
using Kokkos::Experimental::exp;
using Kokkos::Experimental::log;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::pow;
using Kokkos::Experimental::fabs;
using Kokkos::Experimental::cos;
using Kokkos::Experimental::sin;
using Kokkos::Experimental::isfinite;
#endif

template <class T>
KOKKOS_INLINE_FUNCTION constexpr T min(T a, T b) { return b < a ? b : a; }
template <class T>
KOKKOS_INLINE_FUNCTION constexpr T max(T a, T b) { return a < b ? b : a; }

}  // namespace wlb::kmath
