// Which BLAS kernel runs. See blas_info.hpp.
#include "wlb4d/core/blas_info.hpp"

#include <Kokkos_Core.hpp>
#include <fmt/format.h>

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

namespace wlb::core {

const char* to_string(SimdLevel s) {
  switch (s) {
    case SimdLevel::Sse: return "SSE";
    case SimdLevel::Avx: return "AVX";
    case SimdLevel::Avx2: return "AVX2";
    case SimdLevel::Avx512: return "AVX-512";
    default: return "unknown";
  }
}

SimdLevel openblas_core_level(const std::string& core) {
  std::string c = core;
  std::transform(c.begin(), c.end(), c.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  // OpenBLAS 0.3.x x86-64 core names (driver/others/dynamic.c, corename[]).
  static const char* const avx512[] = {"skylakex", "cooperlake", "sapphirerapids"};
  static const char* const avx2[] = {"haswell", "zen", "excavator"};
  static const char* const avx[] = {"sandybridge", "bulldozer", "piledriver", "steamroller"};
  static const char* const sse[] = {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom",
                                    "opteron", "opteron_sse3", "barcelona", "bobcat", "nano", "katmai",
                                    "coppermine", "northwood", "banias", "athlon"};
  for (const char* n : avx512)
    if (c == n) return SimdLevel::Avx512;
  for (const char* n : avx2)
    if (c == n) return SimdLevel::Avx2;
  for (const char* n : avx)
    if (c == n) return SimdLevel::Avx;
  for (const char* n : sse)
    if (c == n) return SimdLevel::Sse;
  return SimdLevel::Unknown;
}

std::string best_openblas_core(SimdLevel cpu) {
  switch (cpu) {
    case SimdLevel::Avx512: return "SkylakeX";
    case SimdLevel::Avx2: return "Haswell";
    case SimdLevel::Avx: return "Sandybridge";
    default: return "";
  }
}

namespace {
SimdLevel cpu_level() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return SimdLevel::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SimdLevel::Avx2;
  if (__builtin_cpu_supports("avx")) return SimdLevel::Avx;
  return SimdLevel::Sse;
#else
  return SimdLevel::Unknown;  // not x86-64: no advice
#endif
}
}  // namespace

BlasInfo probe_blas() {
  BlasInfo b;
  b.cpu = cpu_level();
  if (const char* e = std::getenv("OPENBLAS_CORETYPE")) b.coretype_env = e;
  using CoreFn = char* (*)();
  using ThreadsFn = int (*)();
  const auto core = reinterpret_cast<CoreFn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  const auto threads = reinterpret_cast<ThreadsFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  const auto parallel = reinterpret_cast<ThreadsFn>(dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  if (const char* e = std::getenv("OMP_WAIT_POLICY")) b.omp_wait_policy = e;
  // --version probes before Kokkos starts: 1 then (no OpenMP pool to ask).
  b.host_threads = Kokkos::is_initialized() ? int(Kokkos::DefaultHostExecutionSpace().concurrency()) : 1;
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
  b.cpu_bf16 = __builtin_cpu_supports("avx512bf16");
#endif
  b.sbgemm = find_sbgemm() != nullptr;
  if (!core) return b;
  b.openblas = true;
  const char* name = core();
  b.core = name ? name : "";
  b.threads = threads ? threads() : 0;
  b.parallel = parallel ? parallel() : -1;
  b.kernel = openblas_core_level(b.core);
  return b;
}

SbgemmFn find_sbgemm() {
  if (const char* e = std::getenv("WLB4D_NO_SBGEMM"))
    if (std::string(e) == "1") return nullptr;
  return reinterpret_cast<SbgemmFn>(dlsym(RTLD_DEFAULT, "cblas_sbgemm"));
}

std::string BlasInfo::summary() const {
  const std::string bf = fmt::format("; sbgemm {}; CPU AVX512-BF16 {}", sbgemm ? "yes" : "no", cpu_bf16 ? "yes" : "no");
  if (!openblas) return fmt::format("BLAS: not OpenBLAS (no kernel check); CPU: {}{}", to_string(cpu), bf);
  return fmt::format("OpenBLAS core {} ({}), {} thread{}; CPU: {}; OPENBLAS_CORETYPE {}{}", core, to_string(kernel),
                     threads, threads == 1 ? "" : "s", to_string(cpu),
                     coretype_env.empty() ? std::string("unset") : "= " + coretype_env, bf);
}

std::string BlasInfo::advice() const {
  if (!openblas || kernel == SimdLevel::Unknown || cpu == SimdLevel::Unknown || kernel >= cpu) return "";
  const std::string best = best_openblas_core(cpu);
  if (best.empty()) return "";
  return fmt::format(
      "OpenBLAS runs its {} kernel '{}' on a CPU with {}: GEMMs may run several times below the machine "
      "(measured on one Zen 5 core: Prescott 25-30, Haswell 101, SkylakeX 188 GFLOP/s). {} "
      "OPENBLAS_CORETYPE={} in the environment of every rank (scripts/quickstart.sh, scripts/bench.sh and "
      "slurm/train-cpu.sbatch do when it is unset).",
      to_string(kernel), core, to_string(cpu), coretype_env.empty() ? "Set" : "Change", best);
}

std::string BlasInfo::thread_advice() const {
  if (!openblas || parallel != 1 || threads < 2 || host_threads < 2) return "";
  std::string pol = omp_wait_policy;
  for (auto& c : pol) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (pol == "passive") return "";
  return fmt::format(
      "OpenBLAS's own {} pthreads and Kokkos' {} OpenMP threads share this rank's cores, and OMP_WAIT_POLICY is {}: "
      "idle OpenMP threads spin and take the cores from the GEMMs (measured on 2 cores, quickstart model, 2 + 2 "
      "threads: 888 ms per step, 295 with OMP_WAIT_POLICY=passive, 464 on 1 thread). Set OMP_WAIT_POLICY=passive "
      "in the environment of every rank (it is read when the program starts; scripts/bench.sh and "
      "slurm/train-cpu.sbatch do when it is unset).",
      threads, host_threads, omp_wait_policy.empty() ? std::string("unset") : "'" + omp_wait_policy + "'");
}

}  // namespace wlb::core
