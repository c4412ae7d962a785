#pragma once
/// \file timing_log.hpp
/// \brief Per-step, per-rank timing records (DESIGN §7): an HDF5 table
/// appended across restarts, an optional CSV copy, and the min/mean/max
/// summary rank 0 prints.
///
/// File layout (log.timing_file):
///   /steps     1-D extendible compound dataset of TimingRecord, one row per
///              (step, rank), chunked; appended by rank 0 after each step.
///   /restarts  1-D extendible compound dataset of RestartRecord, one row per
///              start of the trainer (first start included).
///   /sources   1-D extendible compound dataset of SourceRecord, only when
///              data.train blends several sources: one row per (step,
///              source): the step's tokens from it, the tokens and documents
///              drawn from it so far, its weight (additive: no version change;
///              rows of steps run again after a resume are replaced).
///   /trace     1-D extendible compound dataset of TraceRecord: the step
///              log.trace_step names, one row per (rank, interval): every
///              pipeline action, every TP collective and CP exchange inside
///              them, and the step's phases; attribute kind_names
///              (comma-separated names of the `kind` codes, the latest
///              writer's list; codes only ever get appended). The trainer's
///              kinds: 0-6 the pipeline actions F, B, SendAct, RecvAct,
///              SendGrad, RecvGrad, W (pipeline::ActionType); 7 tp_comm, 8
///              cp_comm (one collective's exposed interval, in the action
///              whose micro_batch/virtual_stage the row carries); 9-16 the
///              phases plan, data, forward_backward, dp_reduce, optimizer,
///              eval, checkpoint, sample (micro_batch, virtual_stage -1).
///              Logs of earlier wlb4d versions hold kinds 0-6 only. Absent
///              when no step was traced. io/chrome_trace.hpp draws it.
///   attributes on /: format = "wlb4d-timing", format_version = 7, and the
///              run's identity as of the latest start (RunIdentity: deck,
///              program_version, start_time, layout, world_size, peak_tflops).
/// All times are wall seconds measured after Kokkos::fence(), except
/// TimingRecord::compute_cpu (process CPU seconds).
/// Version 2 added compute_cpu and the cost-model columns of /restarts;
/// version 3 the step-line columns (elapsed, tokens_seen, rss_mib, mfu), t_total
/// without evaluation and checkpoint, /trace, the identity attributes and the
/// memory columns (mem_predicted, mem_measured); version 4 the communication
/// overlap columns (dp_exposed, dp_in_flight, tp_exposed, tp_in_flight);
/// version 5 the core-attention columns (ca_cost_before, ca_cost_after,
/// ca_imbalance_before, ca_imbalance, ca_bytes, ca_exposed); version 6 the
/// t_sample column (train.sample_every, outside t_total); version 7 the
/// guard and asynchronous checkpoint columns (skipped, skipped_steps,
/// ckpt_write). A file
/// of another version is refused (DataError) rather than appended to.

#include "wlb4d/comm/communicator.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace wlb::io {

/// Time categories of one step on one rank (seconds).
enum TimeCategory : int {
  kPlan = 0,    ///< step planning (balance)
  kData,        ///< reading tokens and building the local batch
  kForward,     ///< forward compute
  kBackward,    ///< backward compute
  kP2PWait,     ///< pipeline send/recv waiting
  kTPComm,      ///< tensor-parallel collectives
  kCPComm,      ///< context-parallel all-gather / reduce-scatter
  kDPReduce,    ///< gradient reduction over DP×CP
  kOptimizer,   ///< clipping + AdamW
  kCheckpoint,  ///< checkpoint writing
  kEval,        ///< validation (not part of kTotal)
  kSample,      ///< a text sample, train.sample_every (not part of kTotal)
  kTotal,       ///< the optimizer step alone: plan .. optimizer; eval and checkpoint excluded
  kNumCategories
};
/// Column names of the categories, in enum order ("plan", "data", ...).
const char* category_name(int c);

/// One row of /steps. POD: gathered as bytes and written as an HDF5 compound.
struct TimingRecord {
  std::int64_t step = 0;
  std::int32_t rank = 0;
  std::int32_t dp = 0, pp = 0, cp = 0, tp = 0;  ///< this rank's grid coordinates
  double time[kNumCategories] = {};              ///< seconds per category
  double loss = 0;            ///< step training loss (token-level mean)
  double val_loss = -1;       ///< validation loss at this step (-1: none)
  double grad_norm = 0;       ///< global gradient L2 norm before clipping
  double lr = 0;              ///< learning rate used
  std::int64_t tokens = 0;    ///< tokens of the whole step (all replicas)
  std::int64_t local_tokens = 0;  ///< tokens this rank processed in the step
  double gflops = 0;          ///< achieved model GFLOP/s of the step (whole job)
  double attn_imbalance = 1;  ///< max/mean Σd² over micro-batches
  double latency_imbalance = 1;  ///< max × pp / total latency, docs/wlb-llm.md §1.4 (WLB-LLM §3.1)
  double cp_imbalance = 1;    ///< max/mean attention work over CP ranks
  double delay_mean = 0;      ///< mean outlier delay (steps) of documents trained this step
  double delay_max = 0;       ///< max outlier delay (steps)
  /// Process CPU seconds of forward+backward compute, communication calls
  /// excluded (comm::comm_cpu_seconds). Unlike wall time it is not inflated
  /// by time-slicing when ranks outnumber cores, so max/mean of it over ranks
  /// is the measured compute imbalance the balancer aims to remove.
  double compute_cpu = 0;
  double elapsed = 0;         ///< wall seconds since this start of the trainer, at the end of the step (eval, checkpoint included)
  std::int64_t tokens_seen = 0;  ///< tokens trained so far, this step included (all starts together)
  double rss_mib = 0;         ///< peak resident host memory of this rank (MiB, getrusage ru_maxrss)
  /// Model FLOP utilisation of the step: gflops·1e9 / world size / peak, the
  /// peak of core::mfu_peak (log.peak_tflops, else plan.device, else a CUDA
  /// build's detected device)
  /// (PaLM's MFU, Chowdhery et al. 2022 App. B; the FLOP of model::model_flops); -1: no peak given.
  double mfu = -1;
  /// Memory of this rank (bytes): the memory model's predicted peak
  /// (pipeline::predict_memory) and the measured high-water mark of Kokkos
  /// allocations in the model's memory space so far (core::kokkos_peak_bytes);
  /// the resident set is rss_mib.
  std::int64_t mem_predicted = 0;
  std::int64_t mem_measured = 0;
  /// Communication that can overlap compute (wall seconds of this step on
  /// this rank): *_exposed is the time this rank waited for it (compute
  /// stopped), *_in_flight the time it was outstanding, exposed or hidden
  /// behind compute (in_flight − exposed: overlapped). dp: the DP×CP gradient
  /// reduction (comm.bucket_mib buckets: the union of each bucket's start to
  /// its completion; optim::Optimizer::dp_in_flight_seconds); tp: the TP
  /// collectives (tp_exposed = t_tp_comm; in flight adds the fused
  /// backward's dX reductions while their dW GEMMs ran). exposed <= in_flight
  /// <= t_total.
  double dp_exposed = 0, dp_in_flight = 0;
  double tp_exposed = 0, tp_in_flight = 0;
  /// Core-attention disaggregation (balance.attention = disaggregated; 0
  /// when local): this rank's planned attention cost with every task at home
  /// and after the assignment (cost-model seconds per layer, Σ over the
  /// step's micro-batches), the group's imbalance (Σ slots max / Σ slots
  /// mean) before and after it, the bytes this rank sent + received in the
  /// exchanges and the wall seconds it waited for them (exposed).
  double ca_cost_before = 0, ca_cost_after = 0, ca_imbalance_before = 0, ca_imbalance = 0;
  double ca_bytes = 0, ca_exposed = 0;
  /// Loss-spike guard (train.skip_spike_z): 1 when this step's optimizer
  /// update was skipped (every rank alike), and the updates skipped so far
  /// (all starts together; checkpointed).
  std::int32_t skipped = 0;
  std::int64_t skipped_steps = 0;
  /// Asynchronous checkpoints (checkpoint.async): wall seconds the writer
  /// thread took to write and commit the checkpoint whose write finished
  /// during this step (hidden behind training; 0: none finished). The
  /// blocking part (staging to host) is t_checkpoint.
  double ckpt_write = 0;
};

/// One row of /trace: one interval of one rank in the traced step: a
/// pipeline action (pipeline::Executor::run with trace), a TP/CP collective
/// inside one, or a phase of the step (DESIGN §7; kinds in the file comment).
struct TraceRecord {
  std::int64_t step = 0;           ///< 0-based step index, as /steps
  std::int32_t rank = 0;           ///< world rank
  std::int32_t stage = 0;          ///< pipeline rank (pp coordinate)
  std::int32_t virtual_stage = 0;  ///< local model chunk (-1: a phase of the whole step)
  std::int32_t micro_batch = 0;    ///< micro-batch index of the DP replica (-1: a phase of the whole step)
  std::int32_t kind = 0;           ///< action kind, a code named by /trace's kind_names
  std::int32_t peer = -1;          ///< pipeline rank of the partner of a message; -1 for compute
  double t0 = 0, t1 = 0;           ///< start, end: seconds since the traced step's start on this rank
};

/// One row of /sources (only when data.train blends several sources): what
/// one source gave one step. Written by rank 0; rows of steps run again
/// after a resume are replaced, as /steps' rows.
struct SourceRecord {
  std::int64_t step = 0;          ///< 0-based step index, as /steps
  std::int32_t source = 0;        ///< 0-based source index, in data.train's order
  std::int32_t reserved = 0;      ///< padding (0)
  std::int64_t tokens = 0;        ///< tokens of the step's plan from this source (trained this step)
  std::int64_t drawn_tokens = 0;  ///< tokens drawn from the source so far (data::BlendedStream, cumulative)
  std::int64_t drawn_docs = 0;    ///< documents drawn from the source so far
  double weight = 0;              ///< the source's weight (normalised)
};

/// Who wrote the log, stored as attributes on / at every start (the latest wins).
struct RunIdentity {
  std::string deck;             ///< deck file ("" : defaults and command line only)
  std::string program_version;  ///< e.g. "0.1.0 (git 27b2f9f)"
  std::string start_time;       ///< ISO 8601 UTC of this start
  std::string layout;           ///< "dp=1 pp=2 cp=1 tp=1 schedule=1f1b v=1"
  std::int32_t world_size = 1;
  double peak_tflops = 0;       ///< the MFU peak, TFLOP/s per device (core::mfu_peak; 0: none)
};

/// One row of /restarts.
struct RestartRecord {
  std::int64_t step = 0;           ///< first step run by this start
  std::int32_t dp = 1, pp = 1, cp = 1, tp = 1;
  double unix_time = 0;            ///< seconds since the epoch
  /// Balancing cost model this start planned with (balance::CostModel,
  /// WLB-LLM Eq. 2 per layer): a [s/token], b [s/token²], c [s/micro-batch].
  double cost_a = 0, cost_b = 0, cost_c = 0;
  /// 1: calibrated (balance.calibrate: timed at start-up, or reused from the
  /// checkpoint resumed from); 0: from the deck; 2: from FLOP counts (the
  /// default, or a degenerate calibration's fallback).
  std::int32_t cost_calibrated = 0;
};

/// Collective writer: every rank calls append(); rank 0 gathers and writes.
class TimingLog {
 public:
  /// Opens (appending) or creates the table. Empty path: records are only
  /// gathered (for summaries), nothing is written. Rows of /steps (and of the
  /// CSV) with step >= restart.step are dropped first: this start runs those
  /// steps again (a resume from a checkpoint older than the last logged
  /// step), so every step appears once, from the start that ran it last;
  /// /restarts keeps every start.
  /// \throws core::DataError if the file exists but is not a timing log, or
  ///         cannot be created ("timing log 'P' cannot be created: <errno
  ///         text>"; HDF5's own error stack is not printed).
  TimingLog(const std::string& h5_path, const std::string& csv_path, const comm::Communicator& world,
            const RestartRecord& restart, const RunIdentity& identity = {});
  ~TimingLog();
  TimingLog(const TimingLog&) = delete;
  TimingLog& operator=(const TimingLog&) = delete;

  /// Collective: gathers every rank's record of this step; rank 0 appends
  /// them. Returns all ranks' records (valid on every rank).
  std::vector<TimingRecord> append(const TimingRecord& mine);

  /// Collective: gathers every rank's trace rows (any count, 0 allowed);
  /// rank 0 appends them to /trace (created on first use) and sets its
  /// kind_names attribute. Returns all rows on rank 0, none elsewhere.
  std::vector<TraceRecord> append_trace(const std::vector<TraceRecord>& mine, const std::string& kind_names);

  /// Rank 0 appends rows to /sources (created on first use); other ranks
  /// ignore the call. Not collective.
  void append_sources(const std::vector<SourceRecord>& rows);
  /// Rows of /sources (empty when the run did not blend sources).
  static std::vector<SourceRecord> read_sources(const std::string& h5_path);

  /// Reads every row of /steps (serial; for tests and tools).
  static std::vector<TimingRecord> read_steps(const std::string& h5_path);
  static std::vector<RestartRecord> read_restarts(const std::string& h5_path);
  /// Rows of /trace (empty if no step was traced).
  static std::vector<TraceRecord> read_trace(const std::string& h5_path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Start-up check (collective over `world`; rank 0, the writer, looks) of
/// log files, before calibration and checkpoint load, so that an unwritable
/// log fails in seconds, not after them: for each (deck key, path) with a
/// non-empty path an existing file must be writable; otherwise its folder
/// must exist, be a directory, and take a new file (a probe file is created
/// and removed; access(W_OK) misses read-only mounts for root).
/// \throws core::DataError on every rank naming the key, the path and the
///         cause, e.g. "log.timing_file='runs/x/t.h5': folder 'runs/x' does
///         not exist (the trainer does not create log files' folders)".
void check_log_file_paths(const std::vector<std::pair<std::string, std::string>>& key_paths,
                          const comm::Communicator& world);

/// check_log_file_paths for log.timing_file and log.csv_file.
void check_timing_log_paths(const std::string& timing_file, const std::string& csv_file,
                            const comm::Communicator& world);

}  // namespace wlb::io
