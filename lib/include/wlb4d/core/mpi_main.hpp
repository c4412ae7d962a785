#pragma once
/// \file mpi_main.hpp
/// \brief The common main() of wlb4d's MPI programs: MPI + Kokkos start-up,
/// and loud, collective failure (DESIGN §3).
///
/// Errors every rank detects identically (a bad deck, a world-size mismatch,
/// a missing dataset or checkpoint) are printed once, by rank 0, when every
/// rank reports the same text within 5 s (a side communicator's nonblocking
/// reduction of the text's hash); all ranks then finalize and return 2 for a
/// deck error (ConfigError), 1 for any other — a clean collective exit with
/// no hang and no abort banner. Where the texts differ, or a rank did not
/// fail, each failing rank prints its own message; when every rank failed (a
/// barrier on a side communicator completes within 3 s) each exits with the
/// code at once, otherwise the job is aborted (MPI_Abort), so a rank waiting
/// in a collective cannot hang it. An InternalError (a bug) is printed by
/// every rank that hit it and takes the second path with code 3.

#include <functional>

namespace wlb::core {

/// Runs body(argc, argv) between MPI_Init_thread/Kokkos::initialize and
/// Kokkos::finalize/MPI_Finalize. body returns the exit code. Kokkos never
/// sees --help/-h (body does: the tool's own help comes first); --kokkos-help
/// prints Kokkos' help and returns 0 without running body. body gets argv
/// without the --kokkos-* flags Kokkos consumed.
/// \return body's code; 2 after the same ConfigError on every rank, 1 after the
/// same other error on every rank; otherwise the job ends as described above.
int mpi_main(int argc, char** argv, const std::function<int(int, char**)>& body);

/// A function mpi_main calls right before MPI_Abort (after the error is
/// printed), e.g. to end stopped ranks of this host that would outlive the
/// job (comm/phase_watch.hpp). One hook; nullptr removes it.
void set_before_abort(void (*fn)());
/// Calls the hook (if any); for other abort paths (the phase deadline).
void run_before_abort();
/// Waits, at most max_seconds, until what this process wrote to stdout and
/// stderr has been read from the pipes (FIONREAD reaches 0). Under mpiexec
/// those pipes lead to the process manager, which drops what it has not yet
/// read once it tears the job down: call this after a last message and
/// before anything that ends the job (MPI_Abort, killing a peer, _Exit).
/// Returns at once where an output is a file or a terminal.
void wait_output_forwarded(double max_seconds);

/// True when MPI_Init_thread provided MPI_THREAD_MULTIPLE (mpi_main asks
/// for it: a background thread, the asynchronous checkpoint writer, may then
/// call MPI on its own communicator). The environment variable
/// WLB4D_MPI_THREADS=funneled asks for MPI_THREAD_FUNNELED only (tests of
/// the fallback; an MPI library without thread support behaves the same).
bool mpi_thread_multiple();
/// The thread level MPI provided, as MPI names it ("MPI_THREAD_FUNNELED", ...).
const char* mpi_thread_level_name();

/// World rank and size (valid inside mpi_main).
int world_rank();
int world_size();

}  // namespace wlb::core
