#pragma once
/// \file phase_watch.hpp
/// \brief Phase deadline: the watchdog for work outside wlb::comm's waits.
///
/// The collective watchdog (set_wait_timeout) sees only waits inside
/// wlb::comm. HDF5's collective checkpoint I/O blocks inside MPI-IO, where a
/// rank that stops (SIGSTOP, a stall) hangs the others silently. A PhaseWatch
/// covers such a phase: a process-wide thread ends the job when the phase
/// has made no progress (PhaseWatch::progress) for wait_timeout() seconds
/// (comm.timeout_s). It prints, on stderr, the phase, its target (e.g. the
/// checkpoint file), where this rank waits, and the ranks of this host that
/// have not finished the phase (world rank, pid, whether stopped, where they
/// are), runs the phase's clean-up (e.g. removing the checkpoint's .tmp),
/// sends SIGKILL to the stopped ranks of this host, and calls MPI_Abort.
///
/// Why SIGKILL for stopped peers (not SIGCONT): MPI_Abort's teardown sends
/// SIGTERM, which a stopped process only sees when continued; continued, it
/// would resume inside a collective write whose peers are gone (or run
/// wlb4d's graceful-stop handler, which only sets a flag), so it could
/// outlive the job. A checkpoint is committed by rank 0's atomic renames, so
/// killing a rank never leaves a half-visible checkpoint.
///
/// Other ranks' progress is read from a node-shared board
/// (MPI_Win_allocate_shared over the ranks of one host), so the thread makes
/// no MPI call until the abort; ranks on other hosts are not visible from
/// here (the message says how many).

#include "wlb4d/comm/communicator.hpp"

#include <functional>
#include <string>

namespace wlb::comm {

/// Collective over `world` (MPI_COMM_WORLD's ranks), once at start-up:
/// learns the ranks of this host and their pids, maps the progress board,
/// installs end_stopped_peers() as mpi_main's pre-abort hook, and starts the
/// deadline thread (idle until a PhaseWatch is armed with wait_timeout() >
/// 0). Torn down at MPI_Finalize. Calling it again is a no-op. Where MPI
/// cannot share memory within a host, each rank's board holds itself alone.
/// \throws core::CommError when the start-up barrier fails (watchdog included).
void init_phase_watch(const Communicator& world);

/// Sends SIGKILL to the ranks of this host that are stopped (state T in
/// /proc) and returns "world rank R (pid P)" for each, comma separated ("" if
/// none). Used right before an abort (mpi_main, the phase deadline): a
/// stopped rank never handles the SIGTERM of the teardown.
std::string end_stopped_peers();

/// The ranks end_stopped_peers() would end, without sending anything: an
/// abort names them before the SIGKILL (the process manager may end this
/// rank as soon as a peer dies).
std::string stopped_peers();

/// One phase of this rank (e.g. "checkpoint save"); armed from construction
/// to destruction when wait_timeout() > 0 and init_phase_watch ran. Not
/// nested: one phase at a time per process.
class PhaseWatch {
 public:
  /// `target` names what the phase works on (a file); `on_timeout` runs on
  /// the deadline thread before the abort and returns a note for the
  /// message (e.g. "removed X.tmp").
  PhaseWatch(const char* phase, std::string target, std::function<std::string()> on_timeout = {});
  ~PhaseWatch();
  PhaseWatch(const PhaseWatch&) = delete;
  PhaseWatch& operator=(const PhaseWatch&) = delete;
};

/// Records that this rank's current phase moved on to `what` (e.g. "writing
/// /model/embed.weight"): restarts the deadline and is shown in messages.
/// No-op outside a phase.
void phase_progress(const std::string& what);

}  // namespace wlb::comm
