#pragma once
/// \file mpi_main.hpp
/// \brief The common main() of wlb4d's MPI programs: MPI + Kokkos start-up,
/// and loud, collective failure (DESIGN §3).
///
/// Errors every rank detects identically (a bad deck, a world-size mismatch)
/// are printed by every rank, which then finalizes and returns 2 — a clean
/// collective exit with no hang. Any other exception is printed by the rank
/// that hit it, which then calls MPI_Abort so the job ends instead of
/// deadlocking in the next collective.

#include <functional>

namespace wlb::core {

/// Runs body(argc, argv) between MPI_Init_thread/Kokkos::initialize and
/// Kokkos::finalize/MPI_Finalize. body returns the exit code. Kokkos never
/// sees --help/-h (body does: the tool's own help comes first); --kokkos-help
/// prints Kokkos' help and returns 0 without running body. body gets argv
/// without the --kokkos-* flags Kokkos consumed.
/// \return body's code, 2 after a ConfigError (all ranks), otherwise aborts.
int mpi_main(int argc, char** argv, const std::function<int(int, char**)>& body);

/// World rank and size (valid inside mpi_main).
int world_rank();
int world_size();

}  // namespace wlb::core
