// main() of the kernel benchmarks: Kokkos must be initialised around Google Benchmark.
#include <Kokkos_Core.hpp>
#include <benchmark/benchmark.h>
#include <mpi.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  ::benchmark::Initialize(&argc, argv);
  ::benchmark::RunSpecifiedBenchmarks();
  ::benchmark::Shutdown();
  Kokkos::finalize();
  MPI_Finalize();
  return 0;
}
