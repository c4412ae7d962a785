// --version text (build_info.hpp).
#include "wlb4d/core/build_info.hpp"

#include "wlb4d/core/blas_info.hpp"
#include "wlb4d/core/version.hpp"

#include <Kokkos_Core.hpp>
#include <fmt/format.h>
#include <mpi.h>

namespace wlb::core {

namespace {
std::string kokkos_backends() {
  std::string b;
  auto add = [&b](const char* name) { b += (b.empty() ? "" : ", ") + std::string(name); };
#if defined(KOKKOS_ENABLE_SERIAL)
  add("Serial");
#endif
#if defined(KOKKOS_ENABLE_OPENMP)
  add("OpenMP");
#endif
#if defined(KOKKOS_ENABLE_THREADS)
  add("Threads");
#endif
#if defined(KOKKOS_ENABLE_CUDA)
  add("Cuda");
#endif
#if defined(KOKKOS_ENABLE_HIP)
  add("HIP");
#endif
#if defined(KOKKOS_ENABLE_SYCL)
  add("SYCL");
#endif
  return b.empty() ? "none" : b;
}

std::string mpi_library() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string s(buf, static_cast<std::size_t>(len > 0 ? len : 0));
  const auto nl = s.find('\n');  // MPICH prints a multi-line report: its first line names it
  if (nl != std::string::npos) s.resize(nl);
  std::string one;  // "MPICH Version:\t4.0.2" -> "MPICH Version: 4.0.2"
  for (char ch : s) {
    const bool space = ch == ' ' || ch == '\t' || ch == '\0' || ch == '\r';
    if (!space) one += ch;
    else if (!one.empty() && one.back() != ' ') one += ' ';
  }
  while (!one.empty() && one.back() == ' ') one.pop_back();
  s = one;
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  return fmt::format("{} (MPI standard {}.{})", s, major, minor);
}
}  // namespace

std::string version_report(const std::string& tool, const std::string& hdf5) {
  const int kv = KOKKOS_VERSION;
  std::string out = fmt::format("{} {} (git {})\n", tool, kVersion, kGitSha);
  out += fmt::format("  Kokkos   {}.{}.{} (backends: {}; default execution space {})\n", kv / 10000,
                     kv / 100 % 100, kv % 100, kokkos_backends(), Kokkos::DefaultExecutionSpace::name());
  out += fmt::format("  MPI      {}\n", mpi_library());
  out += fmt::format("  HDF5     {}\n", hdf5);
  std::string build_type(kBuildType);
  if (build_type.empty()) build_type = "no CMAKE_BUILD_TYPE";
  out += fmt::format("  build    {} ({})\n", build_type, std::string(kCompiler));
  const auto blas = probe_blas();
  out += fmt::format("  BLAS     {}\n", blas.summary());
  if (const auto advice = blas.advice(); !advice.empty()) out += fmt::format("  warning: {}\n", advice);
  return out;
}

}  // namespace wlb::core
