#pragma once
/// \file signals.hpp
/// \brief Graceful stop on SIGTERM / SIGUSR1 / SIGINT (Slurm sends one before
/// the time limit with `--signal=USR1@120`, SIGTERM on preemption; SIGINT is
/// Ctrl-C): the handler
/// only records the request; the trainer finishes the current step, writes a
/// checkpoint and exits 0. The decision is made collectively (any rank's
/// request stops every rank), so ranks that got no signal do not hang.

namespace wlb::core {

/// Installs the handlers for SIGTERM, SIGUSR1 and SIGINT (idempotent). The
/// app installs them first thing, so a signal during start-up (calibration,
/// checkpoint load) is not fatal: it is remembered, and the run stops after
/// its first step with a checkpoint.
void install_stop_handlers();

/// The signal number received (SIGTERM or SIGUSR1), or 0 if none.
int stop_signal();

/// Clears the request (tests).
void clear_stop_signal();

}  // namespace wlb::core
