#pragma once
/// \file blas_info.hpp
/// \brief Which BLAS kernel the GEMMs actually run (the BLAS kernel report), and
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
  /// openblas_get_parallel(): 0 sequential, 1 its own pthreads, 2 OpenMP; -1 unknown / not OpenBLAS.
  int parallel = -1;
  int host_threads = 1;      ///< threads of Kokkos' host execution space (1 on Serial)
  std::string omp_wait_policy;  ///< OMP_WAIT_POLICY as set ("" if unset)
  SimdLevel cpu = SimdLevel::Unknown;     ///< what this CPU supports
  SimdLevel kernel = SimdLevel::Unknown;  ///< what the kernel uses
  std::string coretype_env;  ///< OPENBLAS_CORETYPE as set ("" if unset)
  bool sbgemm = false;       ///< the loaded BLAS exports cblas_sbgemm (bf16 in, fp32 out; OpenBLAS BUILD_BFLOAT16)
  bool cpu_bf16 = false;     ///< the CPU has AVX512-BF16 (VDPBF16PS)
  /// One line for the start-up log ("OpenBLAS core Haswell (AVX2), 1 thread; CPU: AVX-512").
  std::string summary() const;
  /// A warning when the kernel's level is below the CPU's (and known):
  /// names OPENBLAS_CORETYPE, the value to set and the measured rates;
  /// "" when there is nothing to say.
  std::string advice() const;
  /// A warning when OpenBLAS's own threads (a pthreads build, > 1 thread) and
  /// Kokkos' OpenMP threads (> 1) share the rank's cores while OMP_WAIT_POLICY
  /// is not passive: between parallel regions the OpenMP threads spin and take
  /// the cores from the GEMM's threads (measured on the 2-core platform,
  /// quickstart model at 2 + 2 threads: 888 ms per step, 295 with passive, 464
  /// on 1 thread). The variable must be set before start (the OpenMP runtime
  /// reads it when loaded), so this names it; "" when there is nothing to say.
  std::string thread_advice() const;
};

/// Probes the running process. Cheap (a few dlsym calls); thread-safe. Kokkos must be initialised (host_threads).
BlasInfo probe_blas();

/// OpenBLAS's cblas_sbgemm (cblas.h, OpenBLAS >= 0.3.10 built with
/// BUILD_BFLOAT16): C = alpha·op(A)·op(B) + beta·C with A, B bf16 (uint16
/// bits), C fp32, fp32 accumulation. Enum arguments as CBLAS (order 101 row
/// major, transpose 111 no / 112 yes); 32-bit integers (a BLAS built with
/// INTERFACE64 would need int64: not supported, none is used here).
using SbgemmFn = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                          const unsigned short* a, int lda, const unsigned short* b, int ldb, float beta, float* c,
                          int ldc);
/// cblas_sbgemm of the loaded BLAS (dlsym), nullptr if it has none (Debian 12's
/// OpenBLAS 0.3.21 has none). The environment variable WLB4D_NO_SBGEMM=1
/// hides it (to compare both bf16 GEMM paths on one machine).
SbgemmFn find_sbgemm();

}  // namespace wlb::core
