#pragma once
/// \file blas_info.hpp
/// \brief Which BLAS kernel the GEMMs actually run (issue [P] item 7), and
/// whether the CPU allows a faster one.
///
/// The GEMMs go through KokkosBlas::gemm to the host BLAS. OpenBLAS picks its
/// kernel at load time from the CPU id, or from `OPENBLAS_CORETYPE` when set;
/// an OpenBLAS older than the CPU (Debian 12's 0.3.21 on Zen 5) falls back to
/// a generic SSE3 kernel ("Prescott"), measured on this platform at 25–30
/// GFLOP/s per core against 101 (Haswell, AVX2) and 188 (SkylakeX, AVX-512).
/// probe_blas() finds OpenBLAS at run time (dlsym of openblas_get_corename and
/// openblas_get_num_threads: no link dependency, any other BLAS reports
/// "not OpenBLAS") and compares the kernel's instruction set with the CPU's
/// (GCC/Clang __builtin_cpu_supports on x86-64). Nothing here throws: a
/// missing symbol or a non-x86 CPU gives "not OpenBLAS" / Unknown and no advice.

#include <string>

namespace wlb::core {

/// SIMD level of a CPU or of a BLAS kernel, ordered.
enum class SimdLevel { Unknown = 0, Sse = 1, Avx = 2, Avx2 = 3, Avx512 = 4 };
const char* to_string(SimdLevel s);

/// The SIMD level an OpenBLAS core name's kernel uses ("Haswell" -> Avx2,
/// "SkylakeX" -> Avx512, "Prescott" -> Sse; case-insensitive). Unknown names
/// give Unknown (never warned about).
SimdLevel openblas_core_level(const std::string& core);

/// The OPENBLAS_CORETYPE value whose kernel matches `cpu` best among those
/// OpenBLAS 0.3.x ships: Avx512 -> "SkylakeX", Avx2 -> "Haswell",
/// Avx -> "Sandybridge"; "" for lower levels.
std::string best_openblas_core(SimdLevel cpu);

struct BlasInfo {
  bool openblas = false;     ///< the process runs OpenBLAS
  std::string core;          ///< openblas_get_corename() (e.g. "Prescott"), "" if not OpenBLAS
  int threads = 0;           ///< openblas_get_num_threads(), 0 if not OpenBLAS
  SimdLevel cpu = SimdLevel::Unknown;     ///< what this CPU supports
  SimdLevel kernel = SimdLevel::Unknown;  ///< what the kernel uses
  std::string coretype_env;  ///< OPENBLAS_CORETYPE as set ("" if unset)
  /// One line for the start-up log ("OpenBLAS core Haswell (AVX2), 1 thread; CPU: AVX-512").
  std::string summary() const;
  /// A warning when the kernel's level is below the CPU's (and known):
  /// names OPENBLAS_CORETYPE, the value to set and the measured rates;
  /// "" when there is nothing to say.
  std::string advice() const;
};

/// Probes the running process. Cheap (two dlsym calls); thread-safe.
BlasInfo probe_blas();

}  // namespace wlb::core
