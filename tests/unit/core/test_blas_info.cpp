// The BLAS kernel check: core names to SIMD levels (OpenBLAS
// 0.3.x's x86-64 names), the advice only when the kernel is below the CPU.
#include "wlb4d/core/blas_info.hpp"

#include <gtest/gtest.h>

using namespace wlb::core;

TEST(BlasInfo, CoreNamesMapToTheirInstructionSet) {
  EXPECT_EQ(openblas_core_level("Prescott"), SimdLevel::Sse);
  EXPECT_EQ(openblas_core_level("NEHALEM"), SimdLevel::Sse);
  EXPECT_EQ(openblas_core_level("Sandybridge"), SimdLevel::Avx);
  EXPECT_EQ(openblas_core_level("Haswell"), SimdLevel::Avx2);
  EXPECT_EQ(openblas_core_level("Zen"), SimdLevel::Avx2);
  EXPECT_EQ(openblas_core_level("SkylakeX"), SimdLevel::Avx512);
  EXPECT_EQ(openblas_core_level("neoversen1"), SimdLevel::Unknown);  // not x86: no advice
  EXPECT_EQ(best_openblas_core(SimdLevel::Avx512), "SkylakeX");
  EXPECT_EQ(best_openblas_core(SimdLevel::Avx2), "Haswell");
  EXPECT_EQ(best_openblas_core(SimdLevel::Sse), "");
}

TEST(BlasInfo, AdviceOnlyWhenTheKernelIsBelowTheCpu) {
  BlasInfo b;
  b.openblas = true;
  b.core = "Prescott";
  b.kernel = SimdLevel::Sse;
  b.cpu = SimdLevel::Avx512;
  const std::string a = b.advice();
  EXPECT_NE(a.find("OPENBLAS_CORETYPE=SkylakeX"), std::string::npos) << a;
  EXPECT_NE(a.find("Set"), std::string::npos) << a;  // unset in the environment
  b.coretype_env = "Prescott";
  EXPECT_NE(b.advice().find("Change OPENBLAS_CORETYPE=SkylakeX"), std::string::npos) << b.advice();
  b.cpu = SimdLevel::Avx2;
  EXPECT_NE(b.advice().find("OPENBLAS_CORETYPE=Haswell"), std::string::npos);
  b.core = "Haswell";
  b.kernel = SimdLevel::Avx2;
  EXPECT_EQ(b.advice(), "");  // the kernel matches the CPU
  b.kernel = SimdLevel::Unknown;
  b.cpu = SimdLevel::Avx512;
  EXPECT_EQ(b.advice(), "");  // an unknown core name is never warned about
  b.openblas = false;
  EXPECT_EQ(b.advice(), "");
  EXPECT_NE(b.summary().find("not OpenBLAS"), std::string::npos);
}

TEST(BlasInfo, ProbeOfThisProcess) {
  // This test binary does not link a BLAS: the probe must say so, not guess.
  const BlasInfo b = probe_blas();
  if (b.openblas) {
    EXPECT_FALSE(b.core.empty());
  } else {
    EXPECT_TRUE(b.core.empty());
    EXPECT_EQ(b.advice(), "");
  }
}

TEST(BlasInfo, ThreadAdviceOnlyWhenPthreadsOpenBlasAndOpenMpThreadsSpinTogether) {
  BlasInfo b;
  b.openblas = true;
  b.parallel = 1;  // OpenBLAS's own pthreads (Debian's libopenblasp)
  b.threads = 2;
  b.host_threads = 2;
  const std::string a = b.thread_advice();
  EXPECT_NE(a.find("OMP_WAIT_POLICY=passive"), std::string::npos) << a;
  EXPECT_NE(a.find("OMP_WAIT_POLICY is unset"), std::string::npos) << a;
  b.omp_wait_policy = "ACTIVE";
  EXPECT_NE(b.thread_advice().find("'ACTIVE'"), std::string::npos) << b.thread_advice();
  b.omp_wait_policy = "Passive";  // case-insensitive, as libgomp reads it
  EXPECT_EQ(b.thread_advice(), "");
  b.omp_wait_policy = "";
  b.host_threads = 1;  // Serial Kokkos or 1 OpenMP thread: nothing spins
  EXPECT_EQ(b.thread_advice(), "");
  b.host_threads = 2;
  b.threads = 1;  // single-threaded GEMMs
  EXPECT_EQ(b.thread_advice(), "");
  b.threads = 2;
  b.parallel = 2;  // an OpenMP OpenBLAS shares Kokkos' pool
  EXPECT_EQ(b.thread_advice(), "");
  b.parallel = 1;
  b.openblas = false;
  EXPECT_EQ(b.thread_advice(), "");
}
