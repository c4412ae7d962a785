#pragma once
/// \file report.hpp
/// \brief What the trainer tells its user on rank 0: the step line, the
/// start-up advice, the memory report and the run summary. The trainer
/// computes; this file formats (DESIGN §2, step 7 "records").
///
/// The step line (one per train.print_every steps, and the first, the last
/// and every evaluated step; 160-175 characters; docs/step-line.md):
///   [2026-12-05 12:34:56] step    10/12 | loss 5.1234 lr 3.00e-04 gnorm 1.234
///   | samples 1.2k skipped 0 | 2345 tok/s/dev 0.0123 TFLOP/s/dev MFU 12.3% |
///   mem 3.2% | step 123 ms
/// wall-clock time (local), progress, loss (and validation loss), lr, global
/// grad norm, consumed samples (StepResult::samples) and skipped steps,
/// throughput since the previous line per device (tokens/s, model TFLOP/s,
/// MFU against the peak of core::mfu_peak), memory as a share of the device
/// (memory_share), the step's own time (evaluation, checkpoint and sample
/// apart, each shown when it ran).
/// The detail line (format_detail_line, every log.detail_every steps) has
/// what no peer's log has: compute min/mean/max over ranks, the plan's
/// attention and latency imbalance and the measured CPU imbalance (max/mean
/// compute CPU time over ranks), and the exposed / in-flight communication of
/// DP and TP (and, with disaggregated attention, the core attention imbalance
/// before -> after, bytes moved and exposed wait), with elapsed time, ETA,
/// tokens seen and per step, and memory in MiB of the capacity.
/// With the loss-spike guard: " | SKIPPED (z loss 12.3 grad 45.6)" after
/// the loss on a skipped step; with the straggler flag: " | straggler r3
/// 2.4x (5 steps)"; with checkpoint.async, " | ckpt N ms" is the blocking
/// staging and " | ckpt write N ms (background)" the writer thread's time, on
/// the step where it finished.

#include "wlb4d/core/config.hpp"
#include "wlb4d/grid/process_grid.hpp"
#include "wlb4d/io/tensorboard.hpp"
#include "wlb4d/io/timing_log.hpp"
#include "wlb4d/pipeline/memory_model.hpp"
#include "wlb4d/train/trainer.hpp"

#include <cstdint>
#include <ctime>
#include <string>
#include <vector>

namespace wlb::train {

/// Start-up advice against tensor parallelism on one small shared-memory host:
/// the warning text when tp > 1, all `world` ranks run on one host
/// (`host_ranks` == `world`) and that host has fewer than
/// kTpAdviceCoresPerRank cores (`host_cores`, online CPUs) per rank; ""
/// otherwise. Why: every layer's TP collectives (forward all-reduces after
/// wo/w_down, backward ones after the column-parallel GEMMs) then cost as
/// much as the GEMM time they split. Measured (scripts/bench.sh on
/// inputs/bench-quickstart.ini, 8 x 256 tokens, 2 ranks on 2 shared cores,
/// alternating, 2 sets): tp=2 0.80x [0.74-0.84] of 1 rank (313-340 ms of a
/// 655-715 ms step in TP communication), dp=2 1.27x. Advice only; the run
/// proceeds unchanged. The threshold is a judgement: only 1 core per rank was
/// measured.
inline constexpr int kTpAdviceCoresPerRank = 4;
std::string tp_host_advice(int tp, int world, int host_ranks, int host_cores);

/// Tokens, seconds and FLOP since the last printed step line.
struct Throughput {
  double tokens = 0, seconds = 0, flops = 0;
  void add(const StepResult& r) {
    tokens += double(r.tokens);
    seconds += r.seconds;
    flops += r.model_flops;
  }
};

/// What the step line needs beyond the step's own result.
struct StepLineContext {
  int total_steps = 0;
  int devices = 1;         ///< world size: throughput and MFU are per device (rank)
  double peak_tflops = 0;  ///< the MFU peak per device (core::mfu_peak; TFLOP/s; 0: no MFU field)
  double elapsed = 0;      ///< seconds since run() started
  double eta = 0;          ///< seconds left at the mean pace (eval and checkpoints included)
  /// What memory_share divides by (bytes per rank; 0: unknown, MiB shown):
  /// a device build's device memory (cudaDeviceProp::totalGlobalMem, else
  /// core::device_memory_gib), a host build's MemTotal (/proc/meminfo) of
  /// rank 0's host divided by the ranks on that host.
  double mem_capacity_bytes = 0;
  bool mem_on_device = false;  ///< device build: the used memory is the Kokkos peak, else the peak RSS
  std::int64_t print_count = 0;  ///< step lines printed so far by this start, this one included
  std::string timestamp;   ///< "YYYY-MM-DD HH:MM:SS" ("": now, local time)
  bool guard = false;      ///< the loss-spike guard is on: the line shows the skipped count
  std::string stragglers;  ///< format_stragglers() of the ranks the straggler flag names ("" : none)
};

/// The cross-rank figures of one step that the step line shows, from every
/// rank's timing record of it (io::TimingLog::append; seconds unless noted).
struct StepFigures {
  double compute_min = 0, compute_mean = 0, compute_max = 0;  ///< forward + backward over ranks
  double cpu_imbalance = 1;  ///< max/mean compute_cpu over ranks (the measured imbalance)
  double dp_exposed = 0, dp_in_flight = 0, tp_exposed = 0, tp_in_flight = 0;  ///< max over ranks
  double ca_exposed = 0;     ///< core attention's exposed wait, max over ranks
  double ca_bytes = 0;       ///< core attention's bytes moved (each byte once)
  double ca_imbalance_before = 0, ca_imbalance = 0;  ///< max over ranks (0: attention stays local)
  double rss_mib = 0;        ///< peak RSS, max over ranks (MiB)
  double mem_measured_bytes = 0;  ///< Kokkos peak in the model's memory space, max over ranks (bytes)
  double eval = 0, checkpoint = 0, sample = 0;  ///< max over ranks (0: not this step)
  double ckpt_write = 0;  ///< checkpoint.async: a background save that finished this step (max over ranks; 0: none)
};
StepFigures step_figures(const std::vector<io::TimingRecord>& all);

/// The step's scalars for TensorBoard (log.tensorboard_dir), by tag:
///   train/loss, train/lr, train/grad_norm; train/tokens_per_s (the whole
///   job's: the step's tokens / its wall time, evaluation and checkpoint
///   apart); train/mfu (a fraction, as the timing log's mfu; only with
///   a known peak, core::mfu_peak); val/loss (evaluated steps only);
///   mem/peak_rss_mib; balance/imbalance_attn, balance/imbalance_lat,
///   balance/imbalance_cpu (the step line's "imbalance attn/lat/cpu"), and
///   with disaggregated attention balance/core_attn_before,
///   balance/core_attn_after; comm/dp_exposed_ms, comm/dp_in_flight_ms,
///   comm/tp_exposed_ms, comm/tp_in_flight_ms; time/step_ms, and
///   time/eval_ms, time/checkpoint_ms (with checkpoint.async the blocking
///   staging), time/checkpoint_write_ms (checkpoint.async: the background
///   write, on the step it finished), time/sample_ms on steps that did it.
///   The trainer adds guard/skipped_steps (the timing log's skipped_steps)
///   when the loss-spike guard is on, and source_scalars' for a blended
///   data.train.
/// Cross-rank values are StepFigures' (max over ranks); the plan's
/// imbalance figures are the same on every rank (`last.record`'s).
std::vector<io::ScalarValue> step_scalars(const StepResult& last, const StepFigures& f);

/// A blend's source as a TensorBoard tag component: "<k>_<stem>", k the
/// 1-based source number, stem the basename of the source's first path
/// without ".h5", glob characters (*?[]) and characters other than
/// [A-Za-z0-9._-] dropped, then '-', '_' and '.' trimmed from both ends
/// ("runs/web/web-*.h5" -> "1_web"; an empty stem leaves "1").
std::string source_tag(int k, const std::string& name);

/// Per-source scalars of a blended data.train (`last.source_tokens` not
/// empty; none otherwise), for source s with tag source_tag(s + 1, names[s]):
///   data/source/<tag>/tokens       the step's tokens from the source (the
///                                  step line's "src a/b"; tokens)
///   data/source/<tag>/drawn_share  its share of all tokens drawn so far, a
///                                  fraction in [0, 1] (the step line's
///                                  "drawn x/y%" / 100)
/// names: the sources as data.train lists them (ResolvedSources::names);
/// \throws std::invalid_argument when names has not one entry per source.
std::vector<io::ScalarValue> source_scalars(const StepResult& last, const std::vector<std::string>& names);

/// The step line of `last` (see the file comment); `all` is every rank's
/// timing record of the step (io::TimingLog::append), `w` the throughput
/// window since the previous line. One line, no trailing newline.
std::string format_step_line(const StepResult& last, const std::vector<io::TimingRecord>& all, const Throughput& w,
                             const StepLineContext& ctx);

/// The second line (see the file comment), printed after the step line when
/// detail_due(). One line, no trailing newline.
std::string format_detail_line(const StepResult& last, const std::vector<io::TimingRecord>& all,
                               const StepLineContext& ctx);

/// log.detail_every = `every` steps: the detail line follows the first and
/// the last step line, and a step line at least `every` steps after the last
/// detail line (steps 1-based, as the step line counts); every <= 0: never.
bool detail_due(std::int64_t step, std::int64_t last_detail_step, bool first_line, bool last_step, int every);

/// Memory used / ctx.mem_capacity_bytes: the max over ranks of the Kokkos
/// peak (device builds) or of the peak RSS (host builds); -1 when the
/// capacity is unknown.
double memory_share(const StepFigures& f, const StepLineContext& ctx);

/// "2026-12-05 12:34:56": local time, as Megatron-LM's log lines.
std::string step_timestamp(std::time_t t);

/// "1:02:03" (hours unbounded).
std::string hms(double seconds);
/// 950, 12.3k, 4.56M, 7.89G.
std::string human_count(double x);

/// Rank 0, at start-up: the model's GEMM work per token and the memory
/// model's prediction per pipeline stage and its maximum.
void print_memory_model(const core::Config& cfg, std::int64_t vocab, const pipeline::MemoryOptions& opt);

/// Rank 0, at the end: predicted (`predicted_bytes`, this rank's memory model
/// total) vs measured Kokkos peak and peak RSS of every rank, then the
/// summary line (steps, peak memory range, final loss; `stopped`: a stop
/// signal ended the run after a checkpoint at `step`). Collective over the world.
void print_run_summary(const grid::ProcessGrid& grid, double predicted_bytes, const StepResult& last,
                       std::int64_t step, int total_steps, bool stopped);

}  // namespace wlb::train
