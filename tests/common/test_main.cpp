// Shared main() of every wlb4d test executable: MPI + Kokkos + GoogleTest.
// Under mpiexec, only rank 0 prints gtest's progress; every rank returns its
// own result, so a failure on any rank fails the ctest entry.
#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <mpi.h>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  Kokkos::initialize(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  int any_fail = 0;
  MPI_Allreduce(&rc, &any_fail, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank != 0 && rc != 0) std::fprintf(stderr, "[r%d] test failures on this rank\n", rank);
  Kokkos::finalize();
  MPI_Finalize();
  return any_fail;
}
