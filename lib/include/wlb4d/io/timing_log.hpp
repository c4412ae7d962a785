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
///   attributes on /: format = "wlb4d-timing", format_version = 3.
/// All times are wall seconds measured after Kokkos::fence(), except
/// TimingRecord::compute_cpu (process CPU seconds).
/// Version 2 added compute_cpu and the cost-model columns of /restarts;
/// version 3 the memory columns mem_predicted, mem_measured, mem_rss. An
/// older file is refused (DataError) rather than appended to.

#include "wlb4d/comm/communicator.hpp"

#include <cstdint>
#include <memory>
#include <string>
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
  kEval,        ///< validation
  kTotal,       ///< whole step
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
  /// Memory of this rank (bytes): the memory model's predicted peak
  /// (pipeline::predict_memory), the measured high-water mark of Kokkos
  /// allocations in the model's memory space so far (core::kokkos_peak_bytes)
  /// and the peak resident set so far (getrusage).
  std::int64_t mem_predicted = 0;
  std::int64_t mem_measured = 0;
  std::int64_t mem_rss = 0;
};

/// One row of /restarts.
struct RestartRecord {
  std::int64_t step = 0;           ///< first step run by this start
  std::int32_t dp = 1, pp = 1, cp = 1, tp = 1;
  double unix_time = 0;            ///< seconds since the epoch
  /// Balancing cost model this start planned with (balance::CostModel,
  /// WLB-LLM Eq. 2 per layer): a [s/token], b [s/token²], c [s/micro-batch].
  double cost_a = 0, cost_b = 0, cost_c = 0;
  std::int32_t cost_calibrated = 0;  ///< 1: measured at start-up; 0: from the deck
};

/// Collective writer: every rank calls append(); rank 0 gathers and writes.
class TimingLog {
 public:
  /// Opens (appending) or creates the table. Empty path: records are only
  /// gathered (for summaries), nothing is written.
  /// \throws core::DataError if the file exists but is not a timing log.
  TimingLog(const std::string& h5_path, const std::string& csv_path, const comm::Communicator& world,
            const RestartRecord& restart);
  ~TimingLog();
  TimingLog(const TimingLog&) = delete;
  TimingLog& operator=(const TimingLog&) = delete;

  /// Collective: gathers every rank's record of this step; rank 0 appends
  /// them. Returns all ranks' records (valid on every rank).
  std::vector<TimingRecord> append(const TimingRecord& mine);

  /// Reads every row of /steps (serial; for tests and tools).
  static std::vector<TimingRecord> read_steps(const std::string& h5_path);
  static std::vector<RestartRecord> read_restarts(const std::string& h5_path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wlb::io
