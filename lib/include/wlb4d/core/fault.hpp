#pragma once
/// \file fault.hpp
/// \brief Deterministic fault injection for tests (not a deck key): the
/// environment variable WLB4D_FAULT names one fault, so crash, stall,
/// full-disk and timeout tests do not race a poller that sends signals.
///
///   WLB4D_FAULT=stall:rank=R:step=S[:phase=P][:signal=STOP]
///                                     world rank R stops making progress (it
///                                     sleeps, as under SIGSTOP) when it
///                                     reaches fault point P of step S
///                                     (0-based; no step at phases ckpt_load
///                                     and calibrate); signal=STOP: it sends
///                                     itself SIGSTOP (the whole process
///                                     stops, its threads too).
///   WLB4D_FAULT=crash:rank=R:step=S[:phase=P][:signal=KILL|ABRT|SEGV]
///                                     world rank R dies there of the signal
///                                     (default KILL: no handler, no flush,
///                                     as a node or OOM-killer loss).
///   WLB4D_FAULT=delay:rank=R:phase=P:seconds=N[:step=S]
///   WLB4D_FAULT=delay:rank=R:phase=P:ms=N[:step=S]
///                                     world rank R sleeps N s (N ms) at fault
///                                     point P (of step S; any step when
///                                     omitted), then goes on: a window in
///                                     which a test sends a signal (e.g.
///                                     during ckpt_load), or, at forward or
///                                     backward (inside the timed compute), a
///                                     slow rank for the straggler flag.
///   WLB4D_FAULT=spike:step=S:scale=X  step S (0-based) of every rank sees its
///                                     loss and its loss gradient multiplied
///                                     by the integer X (fault_loss_scale): a
///                                     deterministic loss and grad-norm spike
///                                     for the spike guard (train.skip_spike_z).
///   WLB4D_FAULT=ckpt_write:rank=R:after_bytes=N
///                                     checkpoint writes of world rank R fail
///                                     as on a full disk (ENOSPC) once the
///                                     tensor bytes it has written in this
///                                     process would exceed N; deterministic
///                                     mid-write "no space left on device".
///   WLB4D_FAULT=ckpt_free:bytes=N     the free space that the checkpoint.dir
///                                     checks see (start-up and before each
///                                     write) is N bytes instead of statvfs'
///                                     figure: a nearly full disk without a
///                                     mount, or a roomy one so that a small
///                                     tmpfs fails inside the write.
///   WLB4D_FAULT=calib_load:sample=K:percent=P
///                                     start-up calibration (balance.calibrate)
///                                     records sample K (0-based, in the order
///                                     of train::calibrate_cost_model) as P %
///                                     of its measured seconds: a background
///                                     load that slowed (P > 100) one timed
///                                     shape, made deterministic.
///   WLB4D_FAULT=prep_encode:rank=R:batch=K
///                                     wlb4d-prep: world rank R fails to
///                                     encode batch K (0-based, of each
///                                     split) with a DataError: a rank's
///                                     failure in the middle of the MPI
///                                     encoding (prep.hpp).
///
/// Fault points P: "step" (default; start of Trainer::step), "forward" and
/// "backward" (the first forward / backward action of the step in the
/// pipeline executor), "calibrate" (the trainer's start-up, before it times
/// the cost model under balance.calibrate=true; step -1), "ckpt_load" (the
/// trainer, before it reads the
/// checkpoint it resumes from; step -1), "ckpt_save" (a writer rank inside
/// the checkpoint write, right after the collective file creation; step = the
/// checkpoint's step, i.e. the steps done). The message of a fired fault
/// point names the process id (tests send it signals).
///
/// Errors: a malformed value throws std::invalid_argument naming
/// WLB4D_FAULT, the value and the rule (check_fault_env() at start-up, on
/// every rank). Unset (the normal case) costs one getenv.

#include <cstdint>
#include <string>

namespace wlb::core {

/// One parsed WLB4D_FAULT value (kind empty: no fault).
struct FaultSpec {
  std::string kind;              ///< "", stall, crash, delay, ckpt_write, ckpt_free, calib_load, spike, prep_encode
  std::string phase = "step";    ///< step, forward, backward, calibrate, ckpt_load, ckpt_save (stall/crash/delay)
  int rank = -1;                 ///< world rank (stall, crash, ckpt_write)
  std::int64_t step = -1;        ///< 0-based step (stall, crash)
  long long after_bytes = -1;    ///< ckpt_write
  long long free_bytes = -1;     ///< ckpt_free
  int signal = 9;                ///< crash: SIGKILL, SIGABRT or SIGSEGV; stall: SIGSTOP or 9 (sleep)
  long long seconds = -1;        ///< delay (seconds)
  long long ms = -1;             ///< delay (milliseconds; instead of seconds)
  long long scale = -1;          ///< spike: factor on the step's loss and loss gradient
  long long sample = -1;         ///< calib_load: calibration sample index
  long long percent = -1;        ///< calib_load: the sample's recorded share of its measured seconds (%)
  long long batch = -1;          ///< prep_encode: the batch (0-based, per split) whose encoding fails
};

/// Parses a WLB4D_FAULT value; "" gives an inactive spec.
/// \throws std::invalid_argument "WLB4D_FAULT='…': …" naming the bad field
///         and the accepted forms.
FaultSpec parse_fault(const std::string& text);

/// Parses the environment's WLB4D_FAULT once (the value every fault hook
/// uses). Call first thing, so a typo fails the run on every rank at once.
/// \throws std::invalid_argument as parse_fault.
void check_fault_env();

/// Fault point `phase` of `step` on `world_rank` ("step": the start of every
/// step, which also remembers rank and step for the phase-only overload;
/// "ckpt_load" with step -1).
void fault_point(const char* phase, int world_rank, std::int64_t step);

/// Fault point inside a step ("forward", "backward"; the executor), for the
/// rank and step of the last fault_point("step", …) call.
void fault_point(const char* phase);

/// True when WLB4D_FAULT=ckpt_write:rank=R:after_bytes=N names this rank and
/// `bytes_after` (its checkpoint tensor bytes in this process, including the
/// write about to be made) exceeds N: the caller then fails that write with
/// ENOSPC's message.
bool fault_write_fails(int world_rank, std::uint64_t bytes_after);

/// The free bytes that WLB4D_FAULT=ckpt_free:bytes=N asks checkpoint.dir's
/// checks to see; -1 when not set (use statvfs).
long long fault_free_bytes();

/// Factor on step `step`'s loss and loss gradient that
/// WLB4D_FAULT=spike:step=S:scale=X asks for: X at step S, 1 otherwise (and
/// when not set). The same on every rank.
double fault_loss_scale(std::int64_t step);

/// True when WLB4D_FAULT=prep_encode:rank=R:batch=K names this rank and batch.
bool fault_prep_encode_fails(int world_rank, long long batch);

/// Factor on the measured seconds of calibration sample `sample` that
/// WLB4D_FAULT=calib_load:sample=K:percent=P asks for: P/100 for sample K,
/// 1 otherwise (and when not set).
double fault_calibration_scale(long long sample);

}  // namespace wlb::core
