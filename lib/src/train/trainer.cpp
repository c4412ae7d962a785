// The training loop. See trainer.hpp and DESIGN §2.
#include "wlb4d/train/trainer.hpp"

#include "wlb4d/balance/metrics.hpp"
#include "wlb4d/balance/sharding.hpp"
#include "wlb4d/balance/packer.hpp"
#include "wlb4d/core/clock.hpp"
#include "wlb4d/core/device_table.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/fault.hpp"
#include "wlb4d/core/memory.hpp"
#include "wlb4d/core/mpi_main.hpp"
#include "wlb4d/core/profiling.hpp"
#include "wlb4d/core/version.hpp"
#include "wlb4d/core/signals.hpp"
#include "wlb4d/data/dataset.hpp"
#include "wlb4d/data/tokenizer.hpp"
#include "wlb4d/data/blend.hpp"
#include "wlb4d/data/document_stream.hpp"
#include "wlb4d/core/sources.hpp"
#include "wlb4d/core/param_shapes.hpp"
#include "wlb4d/infer/decoder.hpp"
#include "wlb4d/infer/sampling.hpp"
#include "wlb4d/io/checkpoint.hpp"
#include "wlb4d/io/chrome_trace.hpp"
#include "wlb4d/io/tensorboard.hpp"
#include "wlb4d/train/checkpoint_state.hpp"
#include "wlb4d/model/transformer.hpp"
#include "wlb4d/optim/optimizer.hpp"
#include "wlb4d/pipeline/executor.hpp"
#include "wlb4d/pipeline/memory_model.hpp"
#include "wlb4d/train/calibrate.hpp"
#include "wlb4d/train/guards.hpp"
#include "wlb4d/train/report.hpp"

#include <Kokkos_Core.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <functional>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace wlb::train {

namespace {
/// A split key's sources (core/sources.hpp), globs expanded.
data::ResolvedSources split_sources(const char* key, const std::string& value) {
  return data::resolve_sources(key, core::parse_sources(key, value));
}

/// A deck's dataset: every file of the split's sources, opened as one
/// dataset; a missing file names the key and the command that makes one.
data::TokenDataset open_dataset(const char* key, const data::ResolvedSources& src) {
  for (const auto& path : src.files) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0)
      throw core::DataError(std::string(key) + " = " + path + ": token dataset does not exist; make it from a corpus "
                            "with: wlb4d-prep --input CORPUS.jsonl --output " + path);
  }
  if (src.files.size() == 1) return data::TokenDataset::open(src.files[0]);
  try {
    return data::TokenDataset::open(src.files);
  } catch (const core::DataError& e) {
    throw core::DataError(std::string(key) + ": " + e.what());
  }
}

/// Source s's first document in the dataset of all its files, for s = 0..n.
std::vector<std::int64_t> source_first_docs(const data::TokenDataset& ds, const data::ResolvedSources& src) {
  std::vector<std::int64_t> v;
  for (auto f : src.first_file) v.push_back(ds.file_first_doc(f));
  return v;
}
}  // namespace

namespace {

/// The data stream seen by the packer: documents of the training set's
/// sources in the blend's order (one source: the stream's seeded order).
class StreamSource final : public balance::DocSource {
 public:
  explicit StreamSource(data::BlendedStream& s) : s_(s) {}
  balance::Doc next() override {
    auto d = s_.next();
    return {d.doc_id, d.length};
  }

 private:
  data::BlendedStream& s_;
};


/// Σ over spans of d(d+1)/2: (query, key) pairs per head under the mask.
std::int64_t attention_pairs(const balance::MicroBatch& mb) {
  std::int64_t p = 0;
  for (const auto& s : mb.spans) p += s.length * (s.length + 1) / 2;
  return p;
}

/// Adds one run's measured times to this rank's timing record.
void add_run_stats(io::TimingRecord& rec, const pipeline::RunStats& r) {
  rec.time[io::kForward] += r.forward_s;
  rec.time[io::kBackward] += r.backward_s;
  rec.time[io::kP2PWait] += r.p2p_s;
  rec.time[io::kTPComm] += r.tp_comm_s;
  rec.tp_exposed += r.tp_comm_s;
  rec.tp_in_flight += r.tp_comm_s + r.tp_overlapped_s;
  rec.time[io::kCPComm] += r.cp_comm_s;
  rec.compute_cpu += r.compute_cpu_s;
}

/// /trace kinds after the pipeline's actions (pipeline::ActionType, codes
/// 0-6): the TP/CP collectives inside them, then the step's phases
/// (io/timing_log.hpp lists them; io/chrome_trace.hpp draws them).
enum TraceKind : int {
  kTraceTpComm = int(pipeline::ActionType::Weight) + 1,
  kTraceCpComm,
  kPhasePlan,
  kPhaseData,
  kPhaseRun,
  kPhaseDpReduce,
  kPhaseOptimizer,
  kPhaseEval,
  kPhaseCheckpoint,
  kPhaseSample,
  kNumTraceKinds
};
/// Names of kTraceTpComm.. (the /trace kind_names after the actions').
constexpr const char* kTraceKindNames[] = {"tp_comm",   "cp_comm",   "plan", "data",       "forward_backward",
                                           "dp_reduce", "optimizer", "eval", "checkpoint", "sample"};
/// Kokkos Tools region of each phase (an NVTX range under nvtx-connector).
constexpr const char* kPhaseRegions[] = {"wlb4d:plan",      "wlb4d:data", "wlb4d:forward_backward",
                                         "wlb4d:dp_reduce", "wlb4d:optimizer", "wlb4d:eval",
                                         "wlb4d:checkpoint", "wlb4d:sample"};
static_assert(sizeof kTraceKindNames / sizeof *kTraceKindNames == kNumTraceKinds - kTraceTpComm);
static_assert(sizeof kPhaseRegions / sizeof *kPhaseRegions == kNumTraceKinds - kPhasePlan);

/// /trace's kind_names: the pipeline's action names, then kTraceKindNames.
std::string trace_kind_names() {
  std::string s;
  for (auto k : {pipeline::ActionType::Forward, pipeline::ActionType::Backward, pipeline::ActionType::SendAct,
                 pipeline::ActionType::RecvAct, pipeline::ActionType::SendGrad, pipeline::ActionType::RecvGrad,
                 pipeline::ActionType::Weight})
    s += (s.empty() ? "" : ",") + std::string(pipeline::to_string(k));
  for (const char* n : kTraceKindNames) s += std::string(",") + n;
  return s;
}

/// One phase of a step: a Kokkos Tools region from construction to end()
/// and, when `rows` is given (a traced step), a /trace row of kind `kind`
/// with times from `origin`, the traced step's start. end() returns the
/// phase's wall seconds (the timing log's column).
class Phase {
 public:
  Phase(int kind, std::vector<io::TraceRecord>* rows, const io::TraceRecord& proto, double origin)
      : kind_(kind), rows_(rows), proto_(proto), origin_(origin), t0_(core::wall_seconds()) {
    region_.emplace(kPhaseRegions[kind - kPhasePlan]);
  }
  double end() {
    const double t1 = core::wall_seconds();
    region_.reset();
    if (rows_) {
      io::TraceRecord r = proto_;
      r.kind = kind_;
      r.t0 = t0_ - origin_;
      r.t1 = t1 - origin_;
      rows_->push_back(r);
    }
    return t1 - t0_;
  }

 private:
  int kind_;
  std::vector<io::TraceRecord>* rows_;
  io::TraceRecord proto_;
  double origin_, t0_;
  std::optional<core::ProfileRegion> region_;
};

/// Peak resident host memory of this process (MiB; core::peak_rss_bytes).
double peak_rss_mib() { return double(core::peak_rss_bytes()) / (1024.0 * 1024.0); }

}  // namespace

struct Trainer::Impl {
  core::Config cfg;
  const grid::ProcessGrid& grid;
  data::ResolvedSources train_src;  // data.train's sources and files
  data::TokenDataset train_ds;      // all of them, as one dataset
  std::optional<data::TokenDataset> val_ds;
  data::BlendedStream stream;
  StreamSource source;
  std::int64_t vocab = 0;
  balance::CostModel cost;
  std::string cost_source;  // train::kCost*: saved in checkpoints, reused on resume (balance.calibrate)
  std::unique_ptr<balance::Packer> packer;
  std::unique_ptr<pipeline::Executor> exec;
  std::unique_ptr<optim::Optimizer> opt;
  std::int64_t step = 0;
  std::int64_t tokens_seen = 0;                    // training tokens consumed (checkpointed)
  core::PeakSource peak;                           // the MFU peak and where it came from (core::mfu_peak)
  double mem_capacity = 0;   // bytes per rank the step line's memory share divides by (0: unknown)
  bool mem_on_device = false;  // mem_capacity is device memory (else host MemTotal / ranks on the host)
  std::unique_ptr<CheckpointState> ckpt;  // TensorRef view of values + moments
  io::CheckpointDirLock dir_lock;                  // this run owns checkpoint.dir
  double last_ckpt_time = 0;
  std::unique_ptr<io::TimingLog> tlog;
  // Validation micro-batches (fixed order, built once).
  std::vector<balance::MicroBatch> val_mbs;
  std::int64_t val_targets = 0;
  int tokenizer_bos = -1;    // the training set's BOS id (stored in checkpoints; -1: none)
  std::string resumed_from;  // the checkpoint this run resumed from ("" : a fresh start)
  double run_start = 0;      // core::wall_seconds() when this start's training began (step line's elapsed, ETA)
  std::vector<io::TraceRecord> trace_rows;  // this rank's rows of the traced step (log.trace_step)
  double trace_origin = 0;                  // the traced step's start (core::wall_seconds())
  std::string trace_json;                   // log.trace_json resolved ("" : none)
  std::unique_ptr<io::TensorBoardWriter> tb;  // rank 0 with log.tensorboard_dir
  io::RunIdentity identity;                 // the timing log's; the trace JSON names the run with it
  double last_loss = std::numeric_limits<double>::quiet_NaN();  // loss of the last step run (checkpointed)
  pipeline::MemoryEstimate mem;  // this rank's predicted peak (memory model)
  std::optional<SpikeGuard> spike;       // train.skip_spike_z > 0
  std::int64_t skipped_steps = 0;        // updates the guard skipped (checkpointed)
  std::optional<StragglerFlag> straggler;  // rank 0, log.straggler_factor > 0
#ifdef KOKKOS_ENABLE_CUDA
  using StagingSpace = Kokkos::CudaHostPinnedSpace;  // page-locked: fast device -> host copies
#else
  using StagingSpace = Kokkos::HostSpace;
#endif
  Kokkos::View<float*, StagingSpace> staging;  // checkpoint.async: this rank's written shards (value, m, v)
  std::unique_ptr<io::AsyncCheckpointWriter> writer;  // checkpoint.async with MPI_THREAD_MULTIPLE; before staging dies
  // checkpoint.resume's answer, looked up once (verifying a checkpoint reads
  // all of it): by the cost model first under balance.calibrate, else by resume().
  std::optional<std::optional<std::string>> resume_lookup;

  Impl(const core::Config& c, const grid::ProcessGrid& g)
      : cfg(c),
        grid(g),
        train_src(split_sources("data.train", c.data.train)),
        train_ds(open_dataset("data.train", train_src)),
        stream(train_ds, source_first_docs(train_ds, train_src), train_src.weights, c.train.seed, c.data.shuffle,
               c.data.max_docs > 0 ? c.data.max_docs : -1),
        source(stream) {
    // The outputs first: an unwritable log fails now, not after calibration
    // and checkpoint load (checkpoint.dir is checked below, once its size is known).
    if (c.log.trace_step > 0)
      trace_json = c.log.trace_json == "auto" ? io::default_trace_json_path(c.log.timing_file) : c.log.trace_json;
    io::check_log_file_paths({{"log.timing_file", c.log.timing_file},
                              {"log.csv_file", c.log.csv_file},
                              {"log.trace_json", trace_json}},
                             g.world());
    io::check_tensorboard_dir(c.log.tensorboard_dir, g.world());  // creates it; the event file comes once the run is accepted
    if (!c.data.val.empty()) val_ds.emplace(open_dataset("data.val", split_sources("data.val", c.data.val)));
    if (g.rank() == 0 && stream.num_sources() > 1) {
      std::string what;
      for (int s = 0; s < stream.num_sources(); ++s)
        what += fmt::format("{}{}: {:.3g} of the tokens, {} documents ({})", s ? "; " : "", s + 1,
                            stream.weights()[std::size_t(s)], stream.stream(s).docs_per_epoch(),
                            train_src.names[std::size_t(s)]);
      spdlog::info("data.train blends {} sources: {}", stream.num_sources(), what);
    }
    if (g.rank() == 0)
      for (const auto* ds : {&train_ds, val_ds ? &*val_ds : nullptr})
        if (ds && !ds->has_checksum())
          spdlog::warn("{}: no checksum (written by an older wlb4d-prep): token ids are checked per read span "
                       "only; re-run wlb4d-prep to add max_token_id and tokens_fnv1a64",
                       ds->path());
    tokenizer_bos = data::make_tokenizer(train_ds.tokenizer(), train_ds.tokenizer_model(), train_ds.path(),
                                         train_ds.eos_id())
                        ->bos_id();
    vocab = model_vocab();
    cfg.model.data_vocab = train_ds.vocab_size();  // padded rows (vocab > it) are masked out of the loss
    core::install_memory_tracker();  // before any model allocation
    check_memory_fits();             // before anything large is allocated or planned
    check_has_targets();
    std::tie(cost, cost_source) = make_cost_model();
    packer = balance::make_packer(c, cost, wlb_length_sample());
    warn_if_dataset_smaller_than_a_step();
    exec = std::make_unique<pipeline::Executor>(cfg, g, vocab);
    if (c.balance.attention == "disaggregated") {
      exec->enable_disaggregated_attention(cost);  // collective over DP×CP
      if (g.rank() == 0)
        spdlog::info(g.dpcp().size() > 1
                         ? fmt::format("core attention: disaggregated over the DP×CP group of {} ranks per stage "
                                       "(tasks of {} query rows, tolerance {})",
                                       g.dpcp().size(), c.balance.ca_task_tokens, c.balance.ca_tolerance)
                         : std::string("core attention: balance.attention=disaggregated has no effect with "
                                       "dp·cp = 1 (an attention group of one rank); attention stays local"));
    }
    if (g.rank() == 0 && exec->chunks().front()->sequence_parallel()) {
      const std::int64_t cap = std::max<std::int64_t>(c.train.max_seq_len, c.balance.max_tokens);
      spdlog::info("sequence parallelism: residual/norm activations split over tp={} (T tokens of a CP shard: "
                   "ceil or floor of T/tp rows per TP rank; T = {}: {} rows)",
                   g.tp_size(), cap, exec->chunks().front()->residual_rows(cap).second);
    }
    std::vector<model::ParamRegistry<float>*> regs;
    for (auto& chunk : exec->chunks()) regs.push_back(&chunk->params());
    const bool bf16_reduce = c.comm.grad_reduce_dtype == "bf16";
    opt = std::make_unique<optim::Optimizer>(c.optim, c.train.steps, g, regs, c.parallel.zero, c.comm.bucket_mib,
                                             bf16_reduce);
    if (bf16_reduce && g.dpcp().size() > 1 && g.rank() == 0)
      spdlog::info("DP x CP gradient reduction in bf16 (comm.grad_reduce_dtype=bf16): rounded before the all-reduce, "
               "pairwise sums in fp32, one reduction after the backward (comm.bucket_mib ignored)");
    // Bucketed DP reduction: buckets start during the backward (optimizer.hpp).
    if (c.comm.bucket_mib > 0 && g.dpcp().size() > 1) {
      pipeline::GradHooks hooks;
      hooks.ready = [o = opt.get()](std::size_t chunk, std::int64_t from) { o->grads_ready(chunk, from); };
      hooks.progress = [o = opt.get()] { o->progress(); };
      exec->set_grad_hooks(std::move(hooks));
    }
    const std::vector<const model::ParamRegistry<float>*> cregs(regs.begin(), regs.end());
    ckpt = std::make_unique<CheckpointState>(g, cregs, opt->exp_avg(), opt->exp_avg_sq(),
                                                      opt->zero() == 1 ? &g.dpcp() : nullptr);  // collective over pp
    const auto& ck = c.checkpoint;
    if (ck.every > 0 || ck.every_minutes > 0 || ck.at_end) {  // fail now, not at the first checkpoint
      dir_lock.acquire(ck.dir, g.world());
      io::check_checkpoint_dir(ck.dir, g.world(), io::checkpoint_bytes_estimate(ckpt->tensors()));
    }
    if (ck.async && core::mpi_thread_multiple()) {
      const std::int32_t layout[4] = {g.dp_size(), g.pp_size(), g.cp_size(), g.tp_size()};
      writer = std::make_unique<io::AsyncCheckpointWriter>(g.world(), layout);  // collective
      ensure_staging();
      if (g.rank() == 0)
        spdlog::info("asynchronous checkpoints: the step stages the state to host memory, a writer thread writes, "
                     "reads back and commits the file (MPI_THREAD_MULTIPLE)");
    } else if (ck.async && g.rank() == 0) {
      spdlog::warn("checkpoint.async=true needs MPI_THREAD_MULTIPLE (the writer thread calls MPI-IO on its own "
                   "communicator), but this MPI library provides {}: checkpoints are written synchronously",
                   core::mpi_thread_level_name());
    }
    guard_earlier_outputs(ck.every > 0 || ck.every_minutes > 0 || ck.at_end);
    last_ckpt_time = core::wall_seconds();
    const auto& t = c.train;
    if (t.skip_spike_z > 0) {
      spike.emplace(t.skip_spike_z, t.skip_spike_window, t.skip_spike_warmup);
      if (g.rank() == 0)
        spdlog::info("loss-spike guard: a step whose loss or grad norm is more than {} standard deviations above "
                     "the mean of the last {} steps skips its update (judged from {} steps on)",
                     t.skip_spike_z, t.skip_spike_window, t.skip_spike_warmup);
    }
    if (c.log.straggler_factor > 0 && g.rank() == 0) {
      straggler.emplace(c.log.straggler_factor, c.log.straggler_steps);
      spdlog::info("straggler flag: a rank whose forward+backward time exceeds {}x the median of its pipeline "
                   "stage's ranks for {} consecutive steps is named",
                   c.log.straggler_factor, c.log.straggler_steps);
    }
  }

  /// checkpoint.resume=never starts at step 0, so an earlier run's
  /// checkpoints in checkpoint.dir (when this run writes checkpoints; the
  /// directory is locked by now) and its timing log would be replaced:
  /// refused, naming them, unless checkpoint.overwrite=true, which removes
  /// them first. Collective.
  /// \throws core::ConfigError on every rank.
  void guard_earlier_outputs(bool writes_checkpoints) {
    const auto& ck = cfg.checkpoint;
    if (ck.resume != "never") return;
    std::string err;
    if (grid.rank() == 0) {
      std::vector<std::string> found;
      if (writes_checkpoints)
        for (const auto& n : io::earlier_checkpoint_files(ck.dir))
          found.push_back((ck.dir.empty() || ck.dir.back() == '/' ? ck.dir : ck.dir + "/") + n);
      const std::size_t n_ckpt = found.size();
      for (const auto* f : {&cfg.log.timing_file, &cfg.log.csv_file, &trace_json}) {
        struct stat st {};
        if (!f->empty() && ::stat(f->c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0)
          found.push_back(*f);
      }
      std::string names;
      for (std::size_t i = 0; i < found.size() && i < 8; ++i) names += (i ? ", " : "") + found[i];
      if (found.size() > 8) names += " and " + std::to_string(found.size() - 8) + " more";
      const std::string what =
          (n_ckpt ? "checkpoint.dir='" + ck.dir + "' holds an earlier run's checkpoints" : std::string()) +
          (n_ckpt && found.size() > n_ckpt ? " and " : "") +
          (found.size() > n_ckpt ? std::string("an earlier run's timing log is there") : std::string());
      if (!found.empty() && !ck.overwrite) {
        err = "checkpoint.resume=never starts this run at step 0, but " + what + " (" + names +
              "): this run would replace them. Set checkpoint.overwrite=true to replace them, "
              "checkpoint.resume=auto to continue that run, or give this run a fresh checkpoint.dir "
              "(and log.timing_file / log.csv_file)";
      } else if (!found.empty()) {
        spdlog::warn("checkpoint.overwrite=true: {}; removing {} before this run starts at step 0", what, names);
        for (const auto& p : found)
          if (std::remove(p.c_str()) != 0 && errno != ENOENT) {
            err = "checkpoint.overwrite=true: cannot remove " + p + ": " + std::strerror(errno);
            break;
          }
      }
    }
    err = comm::agree(grid.world(), err);
    if (!err.empty()) throw core::ConfigError(err);
  }

  /// The memory model's prediction for this rank, printed by rank 0, and the
  /// upper bound of DESIGN §10 before any large allocation
  /// (pipeline::check_memory_fits; collective over the world).
  /// \throws core::ConfigError on every rank, with both numbers.
  void check_memory_fits() {
    pipeline::MemoryOptions opt;
    opt.dpcp_rank = grid.dpcp().rank();
    mem = pipeline::predict_memory(cfg, vocab, grid.pp_rank(), grid.tp_rank(), opt);
    if (grid.rank() == 0) print_memory_model(cfg, vocab, opt);
    const auto placed = pipeline::check_memory_fits(cfg, grid, mem.total());
    // The step line's memory share: a device's memory, or this host's
    // MemTotal shared by the ranks on it.
    mem_on_device = !Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible;
    if (mem_on_device) {
      mem_capacity = core::detected_device_memory_bytes();
      if (mem_capacity <= 0) mem_capacity = core::device_memory_gib(cfg) * 1024.0 * 1024.0 * 1024.0;
    } else {
      const double total = double(core::total_host_bytes());
      mem_capacity = total > 0 && placed.host_ranks > 0 ? total / placed.host_ranks : 0;
    }
    if (grid.rank() == 0) {
      const std::string advice = tp_host_advice(grid.tp_size(), grid.world_size(),
                                                placed.one_host ? grid.world_size() : 0,
                                                int(sysconf(_SC_NPROCESSORS_ONLN)));
      if (!advice.empty()) spdlog::warn("{}", advice);
    }
  }

  /// The model's vocabulary: the training set's, or model.vocab_size (padded).
  std::int64_t model_vocab() const {
    std::int64_t v = train_ds.vocab_size();
    if (cfg.model.vocab_size > 0) {
      if (cfg.model.vocab_size < v)
        throw core::ConfigError("model.vocab_size=" + std::to_string(cfg.model.vocab_size) +
                                " must be 0 or >= the vocabulary of data.train='" + cfg.data.train + "' (" +
                                std::to_string(v) + ")");
      v = cfg.model.vocab_size;  // padded rows: never targets, masked out of the softmax (data_vocab)
    }
    if (val_ds && val_ds->vocab_size() != train_ds.vocab_size())
      throw core::DataError("data.val='" + cfg.data.val + "' has vocab_size " + std::to_string(val_ds->vocab_size()) +
                            " but data.train='" + cfg.data.train + "' has " + std::to_string(train_ds.vocab_size()));
    return v;
  }

  /// A target is the next token of the same document, so a document of n
  /// tokens has n-1 of them. No targets means no loss to train on (loss 0/0):
  /// an error here, not "loss 0.0000". The validation batches likewise.
  void check_has_targets() {
    const std::int64_t n =
        cfg.data.max_docs > 0 ? std::min(train_ds.num_docs(), cfg.data.max_docs) : train_ds.num_docs();
    std::int64_t targets = 0;
    if (train_ds.has_loss_mask()) {
      // A fine-tuning dataset: its loss mask must leave some target.
      for (std::int64_t d = 0; d < n && targets == 0; ++d) targets += train_ds.span_targets(d, 0, train_ds.doc_length(d));
      if (targets == 0)
        throw core::DataError("data.train='" + cfg.data.train + "' has no loss targets: its /loss_mask masks every "
                              "token of the " + std::to_string(n) + " documents used (prepare it with wlb4d-prep "
                              "--sft from records with a response)");
    }
    for (std::int64_t d = 0; d < n && targets == 0; ++d) targets += train_ds.doc_length(d) - 1;
    if (targets == 0)
      throw core::DataError("data.train='" + cfg.data.train + "' has no target tokens: all " + std::to_string(n) +
                            " documents used are 1 token long (a target is the next token of the same "
                            "document, so a document needs >= 2 tokens)");
    if (!val_ds || cfg.train.eval_every == 0) return;
    build_validation_batches();
    if (val_targets == 0 && val_ds->has_loss_mask())
      throw core::DataError("data.val='" + cfg.data.val + "' gives no loss targets: its loss mask masks every "
                            "target of its first documents within train.eval_tokens=" +
                            std::to_string(cfg.train.eval_tokens) +
                            "; raise train.eval_tokens, or set data.val= (empty) or train.eval_every=0");
    if (val_targets == 0)
      throw core::DataError("data.val='" + cfg.data.val + "' gives no target tokens: its first documents within "
                            "train.eval_tokens=" + std::to_string(cfg.train.eval_tokens) + " (of " +
                            std::to_string(val_ds->num_docs()) +
                            ") are 1 token long; give a validation set with documents of >= 2 tokens, or set "
                            "data.val= (empty) or train.eval_every=0 to train without validation");
  }

  /// The checkpoint checkpoint.resume names, if any (collective; once).
  const std::optional<std::string>& resume_path() {
    if (!resume_lookup)
      resume_lookup = io::resolve_resume(cfg.checkpoint.dir, cfg.checkpoint.resume, grid.world(), nullptr,
                                         [&](const std::string& p) {
                                           // A checkpoint written for another model is skipped like a corrupt one.
                                           return io::checkpoint_model_mismatch(p, cfg.model, vocab);
                                         });
    return *resume_lookup;
  }

  /// The balancing cost model and its source (collective). By default
  /// untimed (the deck's cost_a/b/c or the FLOP-count model), so the same
  /// deck, seed and data plan the same batches on any machine (DESIGN §3).
  /// balance.calibrate=true: the constants of the checkpoint resumed from
  /// when it calibrated, so a resume plans as the uninterrupted run; else
  /// timed now on this build's layer, a degenerate fit falling back to the
  /// FLOP-count model with a warning (train::accept_calibration).
  std::pair<balance::CostModel, std::string> make_cost_model() {
    RunCostModel r;
    std::string how;
    if (!cfg.balance.calibrate) {
      r = untimed_cost_model(cfg);
      how = r.source == kCostDeck ? "from the deck (balance.cost_a/cost_b/cost_c)"
                                  : "from FLOP counts (plan.flops_per_s, plan.attention_efficiency)";
    } else {
      std::optional<RunCostModel> saved;
      if (const auto& path = resume_path()) {
        // Rank 0 reads the attributes; every rank gets them (or the error).
        std::string err, source;
        double abc[3] = {0, 0, 0};
        if (grid.rank() == 0) {
          try {
            const auto info = io::read_checkpoint_info(*path);
            source = info.cost_source;
            abc[0] = info.cost_a;
            abc[1] = info.cost_b;
            abc[2] = info.cost_c;
          } catch (const std::exception& e) {
            err = e.what();
          }
        }
        err = comm::agree(grid.world(), err);
        if (!err.empty()) throw core::CheckpointError(err);
        source = comm::bcast_string(grid.world(), source, 0);
        grid.world().broadcast(abc, 3, 0);
        balance::CostModel m;
        m.a = abc[0];
        m.b = abc[1];
        m.c = abc[2];
        saved = reuse_calibration(cfg, source, m);
        if (saved)
          how = saved->source == kCostFlopsFallback && !saved->warning.empty()
                    ? "from FLOP counts (the calibration stored in " + *path + " is degenerate)"
                    : "reused from " + *path + " (" + source + " at the run's first start)";
        else if (grid.rank() == 0)
          spdlog::info("balance.calibrate=true: {} stores no calibration ({}): calibrating now", *path,
                       source.empty() ? std::string("cost model not recorded") : "cost model " + source);
      }
      if (saved) {
        r = *saved;
      } else {
        core::fault_point("calibrate", grid.rank(), -1);  // tests only (WLB4D_FAULT)
        const auto cal = calibrate_cost_model(
            cfg.model, std::max<std::int64_t>(cfg.train.max_seq_len, cfg.balance.max_tokens), grid.world());
        r = accept_calibration(cfg, cal.cost);
        how = r.source == kCostFlopsFallback ? "from FLOP counts (calibration degenerate)"
                                             : "calibrated on this build's layer";
      }
      if (!r.warning.empty() && grid.rank() == 0) spdlog::warn("{}", r.warning);
    }
    const auto& k = r.cost;
    if (grid.rank() == 0)
      spdlog::info("cost model {}: a = {:.3e} s/token, b = {:.3e} s/token^2, c = {:.3e} s per layer (breakpoint "
                   "{:.0f} tokens)",
                   how, k.a, k.b, k.c, k.breakpoint());
    return {r.cost, r.source};
  }

  /// wlb with outlier_thresholds=auto tunes on a sample of document lengths:
  /// the first (up to 8192) documents of the training data, the same on every rank.
  /// A training set smaller than one step's token budget is drawn several
  /// times within every step (the stream wraps to the next epoch): legal, but
  /// rarely meant, so say it once at start-up.
  void warn_if_dataset_smaller_than_a_step() const {
    const std::int64_t docs = cfg.data.max_docs > 0 ? std::min(cfg.data.max_docs, train_ds.num_docs()) : train_ds.num_docs();
    const std::int64_t tokens = train_ds.doc_offset(docs);
    const std::int64_t budget = std::int64_t(cfg.train.micro_batches) * cfg.train.max_seq_len;
    if (tokens < budget && grid.rank() == 0)
      spdlog::warn("data.train='{}' holds {} tokens{}, less than one step's budget of {} (train.micro_batches x "
                   "train.max_seq_len): every step repeats its documents about {:.1f} times",
                   cfg.data.train, tokens, cfg.data.max_docs > 0 ? " (data.max_docs)" : "", budget,
                   double(budget) / double(std::max<std::int64_t>(tokens, 1)));
  }

  std::vector<std::int64_t> wlb_length_sample() const {
    std::vector<std::int64_t> lengths;
    if (cfg.balance.packer != "wlb" || cfg.balance.outlier_thresholds != "auto") return lengths;
    std::int64_t n = train_ds.num_docs();
    if (cfg.data.max_docs > 0) n = std::min(n, cfg.data.max_docs);
    for (std::int64_t d = 0; d < std::min<std::int64_t>(n, 8192); ++d) lengths.push_back(train_ds.doc_length(d));
    return lengths;
  }

  /// A timing record for this step, with this rank's grid coordinates.
  io::TimingRecord new_record() const {
    io::TimingRecord rec;
    rec.step = step;
    rec.rank = grid.rank();
    rec.dp = grid.dp_rank();
    rec.pp = grid.pp_rank();
    rec.cp = grid.cp_rank();
    rec.tp = grid.tp_rank();
    return rec;
  }

  /// Zeroes the gradients and stages this rank's slice of its replica's micro-batches.
  void load(const balance::StepPlan& plan) {
    for (auto& chunk : exec->chunks()) chunk->zero_grad();
    const auto r = std::size_t(grid.dp_rank());
    exec->load(train_ds, plan.micro_batches.at(r), plan.sharding.at(r), &plan);
  }

  /// The step's loss normaliser: the plan's target count, or with a loss
  /// mask (a fine-tuning dataset) the unmasked targets of the loaded
  /// micro-batches summed over DP×CP (every rank of a DP×CP group holds
  /// other tokens of the step; TP and PP peers load the same). Collective
  /// over DP×CP when the dataset has a loss mask.
  std::int64_t step_targets(const balance::StepPlan& plan) const {
    if (!train_ds.has_loss_mask()) return plan.target_tokens;
    return grid.dpcp().allreduce_value(exec->local_targets());
  }

  /// Token-level mean loss from this rank's Σ CE: summed over DP×CP, taken
  /// from the last pipeline stage (the only one with a loss). Collective.
  double reduce_loss(double loss_sum, std::int64_t target_tokens) const {
    loss_sum = grid.dpcp().allreduce_value(loss_sum);
    if (grid.pp_size() > 1) loss_sum = grid.pp().allreduce_value(grid.is_last_stage() ? loss_sum : 0.0);
    return target_tokens > 0 ? loss_sum / double(target_tokens) : 0.0;
  }

  StepResult result(const balance::StepPlan& plan, std::int64_t targets, double loss,
                    const optim::UpdateResult& upd, const SpikeDecision& guard) const {
    StepResult res;
    res.step = step;
    res.loss = loss;
    res.skipped = upd.skipped;
    res.z_loss = guard.z_loss;
    res.z_grad = guard.z_grad;
    res.skipped_steps = skipped_steps;
    res.grad_norm = upd.grad_norm;
    res.lr = upd.lr;
    res.tokens = plan.tokens;
    res.target_tokens = targets;
    std::int64_t pairs = 0;
    for (const auto& rep : plan.micro_batches)
      for (const auto& mb : rep) pairs += attention_pairs(mb);
    res.model_flops = model::model_flops(cfg.model, vocab, plan.tokens, pairs);
    {
      const auto st = stream.state();
      res.samples = 0;
      for (int s = 0; s < stream.num_sources(); ++s)
        res.samples += st.streams[std::size_t(s)].epoch * stream.stream(s).docs_per_epoch() +
                       st.streams[std::size_t(s)].position;
    }
    res.skipped_steps = skipped_steps;
    if (stream.num_sources() > 1) {  // the step's tokens per source of the blend
      res.source_tokens.assign(std::size_t(stream.num_sources()), 0);
      for (const auto& rep : plan.micro_batches)
        for (const auto& mb : rep)
          for (const auto& sp : mb.spans) res.source_tokens[std::size_t(stream.source_of(sp.doc_id))] += sp.length;
      res.source_drawn = stream.tokens_drawn();
    }
    return res;
  }

  /// After ++step: every eval_every steps and at the last step.
  bool eval_due() const {
    return cfg.train.eval_every > 0 && val_ds && (step % cfg.train.eval_every == 0 || step == cfg.train.steps);
  }

  void fill_record(io::TimingRecord& rec, const StepResult& res, const balance::StepMetrics& metrics) const {
    rec.loss = res.loss;
    rec.val_loss = res.val_loss;
    rec.grad_norm = res.grad_norm;
    rec.lr = res.lr;
    rec.tokens = res.tokens;
    rec.local_tokens = exec->local_tokens();
    rec.gflops = res.seconds > 0 ? res.model_flops / res.seconds * 1e-9 : 0;
    rec.attn_imbalance = metrics.attention_imbalance;
    rec.latency_imbalance = metrics.latency_imbalance;
    rec.cp_imbalance = metrics.cp_imbalance;
    rec.delay_mean = metrics.mean_delay_steps;
    rec.delay_max = double(metrics.max_delay_steps);
    rec.tokens_seen = tokens_seen;
    rec.skipped = res.skipped ? 1 : 0;
    rec.skipped_steps = res.skipped_steps;
    rec.rss_mib = peak_rss_mib();
    rec.mfu = peak.flops > 0 ? rec.gflops * 1e9 / double(grid.world().size()) / peak.flops : -1.0;
  }

  /// The step's communication figures: DP exposed / in flight and, with
  /// disaggregated attention, the plan's core-attention balance and the
  /// exchange's traffic and wait.
  void fill_comm_stats(io::TimingRecord& rec) {
    if (exec->disaggregated_attention()) {
      const auto& ca = exec->attention_stats();
      const auto x = exec->take_attention_exchange_stats();
      rec.ca_cost_before = ca.cost_before;
      rec.ca_cost_after = ca.cost_after;
      rec.ca_imbalance_before = ca.imbalance_before();
      rec.ca_imbalance = ca.imbalance_after();
      rec.ca_bytes = x.bytes_sent + x.bytes_received;
      rec.ca_exposed = x.exposed_s;
    }
    rec.dp_exposed = opt->dp_exposed_seconds();
    rec.dp_in_flight = opt->dp_in_flight_seconds();
  }

  /// Global grad norm, NaN/inf check, clip and AdamW (collective), then the
  /// bf16 weight copies marked stale for the next forward.
  optim::UpdateResult update(double loss, SpikeDecision* guard) {
    std::function<bool(const optim::UpdateResult&)> skip;
    if (spike)
      skip = [&](const optim::UpdateResult& u) {
        *guard = spike->observe(loss, u.grad_norm);
        // The loss and the norm are equal on every rank already; agreeing
        // on the decision keeps every rank's update (or skip) alike anyway.
        const int any = grid.world().allreduce_value(guard->skip ? 1 : 0, comm::ReduceOp::Max);
        guard->skip = any != 0;
        return guard->skip;
      };
    const optim::UpdateResult upd = opt->step(step, loss, skip);
    if (upd.skipped) {
      ++skipped_steps;
      if (grid.rank() == 0)
        spdlog::warn("step {}: loss spike: loss {:.4f} (z = {:.1f}), grad norm {:.4g} (z = {:.1f}) beyond "
                     "train.skip_spike_z={} (window of {} steps): update skipped on every rank ({} skipped so far)",
                     step + 1, loss, guard->z_loss, upd.grad_norm, guard->z_grad, cfg.train.skip_spike_z,
                     cfg.train.skip_spike_window, skipped_steps);
    }
    for (auto& chunk : exec->chunks()) chunk->mark_weights_updated();
    Kokkos::fence();
    return upd;
  }

  /// The step's start time, after the device is idle. A traced step starts
  /// at a world barrier so that every rank's trace shares its origin (ranks
  /// of one node also share the steady clock). Collective when traced.
  double start_clock(bool traced) const {
    Kokkos::fence();
    if (traced) grid.world().barrier();
    return core::wall_seconds();
  }

  /// The step's result completed with its wall time (max over ranks:
  /// collective) and this rank's timing record.
  StepResult finish_step(StepResult res, io::TimingRecord& rec, const balance::StepMetrics& metrics) const {
    res.seconds = grid.world().allreduce_value(rec.time[io::kTotal], comm::ReduceOp::Max);
    fill_record(rec, res, metrics);
    fill_memory(rec);
    res.record = rec;
    return res;
  }

  /// A /trace row of this rank in step `s` (kind and times still to set).
  io::TraceRecord trace_row(std::int64_t s) const {
    io::TraceRecord r;
    r.step = s;
    r.rank = grid.rank();
    r.stage = grid.pp_rank();
    r.virtual_stage = -1;
    r.micro_batch = -1;
    r.peer = -1;
    return r;
  }

  /// Phase `kind` of step `s` (see Phase); a /trace row too when `traced`.
  Phase phase(int kind, std::int64_t s, bool traced) {
    return Phase(kind, traced ? &trace_rows : nullptr, trace_row(s), trace_origin);
  }

  /// The traced run's actions and their TP/CP collectives as /trace rows,
  /// times from the step's start (trace_origin).
  void keep_trace(const pipeline::RunStats& run) {
    for (const auto& a : run.trace) {
      io::TraceRecord r = trace_row(step);
      r.virtual_stage = a.action.virtual_stage;
      r.micro_batch = a.action.micro_batch;
      r.kind = int(a.action.type);
      r.peer = a.action.peer;
      r.t0 = a.t0 - trace_origin;
      r.t1 = a.t1 - trace_origin;
      trace_rows.push_back(r);
    }
    for (const auto& c : run.comm_trace) {
      io::TraceRecord r = trace_row(step);
      r.virtual_stage = c.virtual_stage;
      r.micro_batch = c.micro_batch;
      r.kind = c.kind == pipeline::CommTiming::Tp ? kTraceTpComm : kTraceCpComm;
      r.t0 = c.t0 - trace_origin;
      r.t1 = c.t1 - trace_origin;
      trace_rows.push_back(r);
    }
  }

  /// Rank 0, after the traced step's rows are gathered (`rows`, every
  /// rank's; `all` the step's timing records, for the ranks' coordinates):
  /// the Chrome trace JSON (log.trace_json). A write failure is a warning:
  /// the run goes on, the HDF5 /trace has the same rows.
  void write_trace_json(const std::vector<io::TraceRecord>& rows, const std::vector<io::TimingRecord>& all,
                        const std::string& kind_names) const {
    if (trace_json.empty() || grid.rank() != 0) return;
    std::vector<io::RankCoords> coords;
    for (const auto& r : all) coords.push_back({r.rank, r.dp, r.pp, r.cp, r.tp});
    try {
      io::write_chrome_trace(trace_json, rows, kind_names, coords, identity);
      spdlog::info("trace of step {} written to {} (open it at ui.perfetto.dev or chrome://tracing)",
                   cfg.log.trace_step, trace_json);
    } catch (const std::exception& e) {
      spdlog::warn("{}; the trace stays in the timing log's /trace", e.what());
    }
  }

  /// Rank 0: the step's scalars into the TensorBoard event file. A write
  /// failure (a full disk) is a warning and ends the TensorBoard output;
  /// training goes on.
  void write_scalars(const StepResult& last, const std::vector<io::TimingRecord>& all) {
    if (!tb) return;
    try {
      auto v = step_scalars(last, step_figures(all));
      if (spike) v.push_back({"guard/skipped_steps", double(last.skipped_steps)});
      for (auto& x : source_scalars(last, train_src.names)) v.push_back(std::move(x));  // a blend's sources
      tb->add_scalars(last.step + 1, v);
    } catch (const std::exception& e) {
      spdlog::warn("{}; no more TensorBoard scalars this run (training goes on)", e.what());
      tb.reset();
    }
  }

  /// Rank 0 with log.straggler_factor: the ranks slow for
  /// log.straggler_steps consecutive steps after step `s` (0-based), from
  /// every rank's timing record of it; a rank named for the first time in
  /// its streak gets a warning naming its grid coordinates.
  std::vector<Straggler> observe_stragglers(std::int64_t s, const std::vector<io::TimingRecord>& all) {
    if (!straggler) return {};
    std::vector<Straggler> newly;
    auto slow = straggler->observe(all, &newly);
    for (const auto& x : newly) {
      const auto& r = all.at(std::size_t(x.rank));
      spdlog::warn("straggler: rank {} (dp={} pp={} cp={} tp={}) computed {:.1f}x the median of its pipeline "
                   "stage's ranks for {} consecutive steps (step {}: {:.0f} ms forward+backward; "
                   "log.straggler_factor={}); training goes on",
                   x.rank, r.dp, r.pp, r.cp, r.tp, x.ratio, x.steps, s + 1,
                   (r.time[io::kForward] + r.time[io::kBackward]) * 1e3, cfg.log.straggler_factor);
    }
    return slow;
  }

  /// Fixed order, fixed packing: the first eval_tokens tokens of the validation
  /// documents, concatenated and cut at max_seq_len (balance::pack_in_order).
  void build_validation_batches() {
    std::vector<balance::Span> spans;
    std::int64_t budget = cfg.train.eval_tokens;
    for (std::int64_t d = 0; d < val_ds->num_docs() && budget > 0; ++d) {
      const std::int64_t len = std::min<std::int64_t>(val_ds->doc_length(d), budget);
      spans.push_back({d, 0, len});
      budget -= len;
    }
    val_mbs = balance::pack_in_order(spans, cfg.train.max_seq_len);
    for (const auto& mb : val_mbs) {
      if (!val_ds->has_loss_mask()) {
        val_targets += mb.target_tokens();
        continue;
      }
      for (const auto& sp : mb.spans) val_targets += val_ds->span_targets(sp.doc_id, sp.offset, sp.length);
    }
  }

  /// Checkpoint urgency agreed by every rank (clocks and signals are per rank):
  /// 0 none, 1 checkpoint.every_minutes elapsed, 2 SIGTERM/SIGUSR1 (checkpoint, then stop).
  int agreed_checkpoint_urgency() const {
    const auto& ck = cfg.checkpoint;
    int urgent = (ck.every_minutes > 0 && core::wall_seconds() - last_ckpt_time >= 60.0 * ck.every_minutes) ? 1 : 0;
    if (core::stop_signal() != 0) urgent = 2;
    return grid.world().allreduce_value(urgent, comm::ReduceOp::Max);
  }

  /// After ++step: checkpoint.every, an agreed urgency, or checkpoint.at_end.
  bool checkpoint_due(int urgent) const {
    const auto& ck = cfg.checkpoint;
    return (ck.every > 0 && step % ck.every == 0) || urgent > 0 || (ck.at_end && step == cfg.train.steps);
  }

  /// This rank's memory figures into a timing record (bytes).
  void fill_memory(io::TimingRecord& rec) const {
    rec.mem_predicted = std::int64_t(mem.total());
    rec.mem_measured = core::kokkos_peak_bytes(MemSpace::name());  // the space the model predicts
  }

  /// Writes the checkpoint of the current step (collective over the world).
  /// After ++step: every train.sample_every steps.
  bool sample_due() const { return cfg.train.sample_every > 0 && step % cfg.train.sample_every == 0; }

  /// train.sample_every: rank 0 assembles the current weights tensor by
  /// tensor (CheckpointState::gather_tensor, collective over the world) into
  /// an infer::Decoder and prints sample_tokens tokens continuing
  /// sample_prompt, drawn at temperature 1 with the seed train.seed + step
  /// (llm.c's samples). Returns the seconds it took (every rank).
  double sample_text() {
    const double t0 = core::wall_seconds();
    const auto& g = grid;
    ckpt->pull_values();
    const auto shapes = core::param_shapes(cfg.model, vocab);
    const auto fetch = [&](const std::string& name, const std::vector<std::int64_t>&) {
      return ckpt->gather_tensor(name, g.world(), 0);
    };
    if (g.rank() != 0) {
      for (const auto& p : shapes) fetch(p.name, p.global_shape);
      return core::wall_seconds() - t0;
    }
    const auto tok =
        data::make_tokenizer(train_ds.tokenizer(), train_ds.tokenizer_model(), train_ds.path(), train_ds.eos_id());
    std::vector<std::int32_t> prompt;
    for (auto t : tok->encode(cfg.train.sample_prompt)) prompt.push_back(std::int32_t(t));
    if (prompt.empty()) prompt.push_back(tok->bos_id() >= 0 ? tok->bos_id() : tok->eos_id());  // a new document
    infer::Decoder dec(cfg.model, vocab, train_ds.vocab_size(),
                       std::int64_t(prompt.size()) + cfg.train.sample_tokens, fetch);
    infer::SamplingOptions so;
    so.seed = cfg.train.seed + std::uint64_t(step);
    infer::Sampler sampler(so);
    const auto gen = infer::generate(dec, prompt, cfg.train.sample_tokens, sampler, tok->eos_id());
    std::vector<token_t> ids;
    for (auto t : gen.tokens)
      if (t != tok->eos_id()) ids.push_back(token_t(t));
    std::string text = cfg.train.sample_prompt + tok->decode(ids.data(), ids.size());
    spdlog::info("sample at step {} ({} tokens{}): {}", step, gen.tokens.size(),
                 gen.stopped ? ", ended the document" : "", infer::printable(text));
    return core::wall_seconds() - t0;
  }

  std::string save_checkpoint() {
    Kokkos::fence();
    ckpt->pull();  // ZeRO-1: gathers the moments into host staging
    struct Release {
      CheckpointState& s;
      ~Release() { s.release(); }
    } release{*ckpt};
    const std::string path = io::save_checkpoint(cfg.checkpoint, grid, ckpt->tensors(), train_state(), ckpt_info());
    last_ckpt_time = core::wall_seconds();
    if (grid.rank() == 0) spdlog::info("checkpoint {} written (step {})", path, step);
    return path;
  }

  /// checkpoint.async: the blocking part. Waits for the save in flight (one
  /// at a time), copies this rank's written shards (values, AdamW moments)
  /// into `staging`, and hands them to the writer thread. Collective.
  /// Returns the write seconds of the previous save when it was collected here.
  double save_checkpoint_async() {
    const double t0 = core::wall_seconds();
    const double previous = collect_async(true);  // a second save waits for the first
    const double t1 = core::wall_seconds();
    Kokkos::fence();
    ckpt->pull();
    std::vector<io::TensorRef> refs = ckpt->tensors();
    ensure_staging();
    float* p = staging.data();
    for (auto& t : refs) {
      if (!t.writer) {
        t.value = t.m = t.v = nullptr;  // not read: one writer per element
        continue;
      }
      std::size_t n = 1;
      for (auto c : t.count) n *= std::size_t(c);
      for (float** b : {&t.value, &t.m, &t.v}) {
        std::memcpy(p, *b, n * sizeof(float));
        *b = p;
        p += n;
      }
    }
    ckpt->release();
    writer->start(cfg.checkpoint, std::move(refs), train_state(), ckpt_info());
    last_ckpt_time = core::wall_seconds();
    if (grid.rank() == 0)
      spdlog::info("checkpoint of step {}: {} staged to host memory in {:.3f} s{}; writing in the background", step,
                   core::format_bytes(double(p - staging.data()) * sizeof(float)), last_ckpt_time - t1,
                   previous > 0 || t1 - t0 > 1e-3
                       ? fmt::format(" (after waiting {:.3f} s for the previous write)", t1 - t0)
                       : std::string());
    return previous;
  }

  /// The staging buffers of checkpoint.async: value, m and v of every shard
  /// this rank writes. Allocated and touched once (at start-up), so no save
  /// pays the page faults of fresh memory.
  void ensure_staging() {
    std::size_t total = 0;
    for (const auto& t : ckpt->tensors())
      if (t.writer) {
        std::size_t n = 1;
        for (auto c : t.count) n *= std::size_t(c);
        total += 3 * n;
      }
    if (staging.extent(0) >= total) return;
    staging = decltype(staging)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "checkpoint_staging"), total);
    Kokkos::deep_copy(staging, 0.0f);
  }

  /// checkpoint.async: collects a finished save (`wait`: waits for the one
  /// in flight). Returns the seconds the writer thread took (0: none
  /// collected). Collective. \throws core::CheckpointError (every rank) when
  /// the save failed: the previous checkpoint and `latest` are unchanged.
  double collect_async(bool wait) {
    if (!writer || !writer->in_flight()) return 0;
    if (!wait && !writer->done(grid.world())) return 0;
    const auto r = writer->wait();
    if (!r->error.empty()) throw core::CheckpointError(r->error);
    if (grid.rank() == 0)
      spdlog::info("checkpoint {} written (step {}; in the background: {:.2f} s to write, read back and commit)",
                   r->path, r->step, r->seconds);
    return r->seconds;
  }

  io::TrainState train_state() const {
    io::TrainState st;
    st.step = step;
    st.tokens_seen = tokens_seen;
    st.stream_epoch = stream.stream(0).state().epoch;  // one source: the stream of one file, as always
    st.stream_position = stream.stream(0).state().position;
    if (stream.num_sources() > 1) st.data_sources = stream.save();
    st.packer_state = packer->save_state();
    st.seed = cfg.train.seed;
    st.last_loss = last_loss;
    st.skipped_steps = skipped_steps;
    if (spike) st.spike_window = spike->window_pairs();
    return st;
  }

  io::CheckpointInfo ckpt_info() const {
    io::CheckpointInfo info;
    info.deck = core::to_ini(cfg);
    info.dataset_identity = train_ds.identity();
    info.model = cfg.model;
    info.vocab = vocab;  // padded vocabulary: the tensors' shape
    info.precision = cfg.train.precision;
    info.cost_source = cost_source;  // reused on resume under balance.calibrate
    info.cost_a = cost.a;
    info.cost_b = cost.b;
    info.cost_c = cost.c;
    info.tokenizer = train_ds.tokenizer();  // an export or a sample decodes with it
    info.tokenizer_vocab = train_ds.vocab_size();
    info.eos_id = train_ds.eos_id();
    info.bos_id = tokenizer_bos;
    info.tokenizer_model = train_ds.tokenizer_model();
    return info;
  }

  /// checkpoint.init_from: the values of any checkpoint (any layout; weights
  /// only, e.g. imported from Hugging Face), resharded to this layout; the
  /// optimizer, step, data stream and packer start fresh (collective).
  void init_from_weights() {
    const std::string& src = cfg.checkpoint.init_from;
    io::verify_checkpoint(src, grid.world());  // every checksum and the digest, before a single value is used
    auto refs = ckpt->tensors();
    for (auto& t : refs) t.m = t.v = nullptr;  // values only
    const auto r = io::load_checkpoint(src, grid, refs, cfg.model, vocab);
    ckpt->push_values();
    if (grid.rank() == 0)
      spdlog::info("initialised from {} (checkpoint.init_from: its weights{}; written by wlb4d {} on "
                   "dp={} pp={} cp={} tp={}); optimizer, data order and step start fresh at step 0",
                   src, r.info.weights_only ? " (a weights-only checkpoint)" : fmt::format(" of step {}", r.info.step),
                   r.info.program_version, r.info.layout[0], r.info.layout[1], r.info.layout[2], r.info.layout[3]);
  }

  /// checkpoint.resume: values, moments, step, tokens, stream and packer state (collective).
  void resume() {
    // A newest checkpoint written for another model is skipped like a corrupt one (resume=auto).
    const auto path = resume_path();
    if (!path) {
      if (!cfg.checkpoint.init_from.empty()) {
        init_from_weights();
      } else if (cfg.checkpoint.resume == "auto" && !cfg.checkpoint.dir.empty() && grid.rank() == 0) {
        // Say it: a restarted job that finds nothing to resume (a wrong
        // checkpoint.dir) must not look like one that resumed.
        spdlog::info("checkpoint.resume=auto: no checkpoint to resume in checkpoint.dir='{}'; starting at step 0",
                     cfg.checkpoint.dir);
      }
      return;
    }
    if (!cfg.checkpoint.init_from.empty() && grid.rank() == 0)
      spdlog::info("checkpoint.init_from={} is not used: resuming the run from {} (a restarted job continues)",
                   cfg.checkpoint.init_from, *path);
    ckpt->prepare_load();  // ZeRO-1: host staging for the whole moments
    const auto r = io::load_checkpoint(*path, grid, ckpt->tensors(), cfg.model, vocab);
    ckpt->push();
    resumed_from = *path;
    step = r.state.step;
    tokens_seen = r.state.tokens_seen;
    last_loss = r.state.last_loss;
    skipped_steps = r.state.skipped_steps;
    if (spike) spike->restore(r.state.spike_window);
    if (stream.num_sources() > 1 || !r.state.data_sources.empty()) {
      if (r.state.data_sources.empty())
        throw core::CheckpointError(*path + ": data.train blends " + std::to_string(stream.num_sources()) +
                                    " sources but the checkpoint holds the position of one stream (/state/data_sources "
                                    "missing): resume with the data.train it was written with");
      try {
        stream.load(r.state.data_sources);
      } catch (const core::DataError& e) {
        throw core::CheckpointError(*path + ": " + e.what());
      }
    } else {
      data::BlendedStream::State st = stream.state();
      st.streams[0] = {r.state.stream_epoch, r.state.stream_position};
      stream.restore(st);
    }
    packer->load_state(r.state.packer_state);
    if (grid.rank() == 0) {
      spdlog::info("resumed from {} at step {} (written by wlb4d {} on dp={} pp={} cp={} tp={}, precision {}; "
                   "continuing in {} from its fp32 master weights)",
                   *path, step, r.info.program_version, r.info.layout[0], r.info.layout[1], r.info.layout[2],
                   r.info.layout[3], r.info.precision.empty() ? std::string("not recorded") : r.info.precision,
                   cfg.train.precision);
      // Only what the data is matters: the same files copied to another
      // folder (a node-local disk) or touched are the same dataset.
      using TD = data::TokenDataset;
      if (TD::content_identity(r.info.dataset_identity) != TD::content_identity(train_ds.identity()))
        spdlog::warn("data.train changed since the checkpoint: was {}, is {}", r.info.dataset_identity,
                     train_ds.identity());
      else if (r.info.dataset_identity != train_ds.identity())
        spdlog::info("data.train: the same files (sizes, documents, offsets) at another path or time than the "
                     "checkpoint's: was {}, is {}", r.info.dataset_identity, train_ds.identity());
      if (!r.info.cost_source.empty() &&
          (r.info.cost_a != cost.a || r.info.cost_b != cost.b || r.info.cost_c != cost.c))
        spdlog::warn("the checkpoint planned with another cost model ({}: a = {:.3e}, b = {:.3e}, c = {:.3e}) than "
                     "this start ({}, balance.calibrate={}): batches are planned differently from the "
                     "uninterrupted run",
                     r.info.cost_source, r.info.cost_a, r.info.cost_b, r.info.cost_c, cost_source,
                     cfg.balance.calibrate);
      if (r.state.seed != cfg.train.seed)
        spdlog::warn("train.seed={} differs from the checkpoint's {}: the data order changes", cfg.train.seed,
                     r.state.seed);
    }
  }
};

Trainer::Trainer(const core::Config& cfg, const grid::ProcessGrid& grid)
    : impl_(std::make_unique<Impl>(cfg, grid)) {
  auto& I = *impl_;
  I.resume();  // before the restart record, so /restarts shows the resumed step
  core::install_stop_handlers();
  io::RestartRecord rr;
  rr.step = I.step;
  rr.dp = grid.dp_size();
  rr.pp = grid.pp_size();
  rr.cp = grid.cp_size();
  rr.tp = grid.tp_size();
  rr.unix_time = double(std::chrono::system_clock::now().time_since_epoch().count()) * 1e-9;
  rr.cost_a = I.cost.a;
  rr.cost_b = I.cost.b;
  rr.cost_c = I.cost.c;
  rr.cost_calibrated = I.cost_source == kCostCalibrated ? 1 : I.cost_source == kCostDeck ? 0 : 2;
  io::RunIdentity id;
  id.deck = cfg.deck_path;
  id.program_version = fmt::format("{} (git {})", core::kVersion, core::kGitSha);
  const std::time_t t = std::time(nullptr);
  char iso[32] = {};
  std::tm utc{};
  gmtime_r(&t, &utc);
  std::strftime(iso, sizeof iso, "%Y-%m-%dT%H:%M:%SZ", &utc);
  id.start_time = iso;
  id.layout = fmt::format("dp={} pp={} cp={} tp={} schedule={} v={}", rr.dp, rr.pp, rr.cp, rr.tp,
                          cfg.parallel.schedule, cfg.parallel.virtual_stages);
  id.world_size = grid.world().size();
  I.peak = core::mfu_peak(cfg, core::detected_device_name());
  if (grid.rank() == 0)
    spdlog::info("MFU {}", I.peak.flops > 0 ? "against " + I.peak.source : "not reported: " + I.peak.source.substr(8));
  id.peak_tflops = I.peak.flops * 1e-12;
  I.tlog = std::make_unique<io::TimingLog>(cfg.log.timing_file, cfg.log.csv_file, grid.world(), rr, id);
  I.identity = id;
  I.tb = io::open_tensorboard(cfg.log.tensorboard_dir, grid.world());  // this start's event file (rank 0)
  if (I.tb) {
    // A restart marker at the first step this start runs: TensorBoard then
    // drops an earlier start's points from it on (a resume from an older
    // checkpoint runs those steps again).
    try {
      I.tb->session_start(I.step + 1);
      spdlog::info("TensorBoard scalars: {} (tensorboard --logdir {})", I.tb->path(), cfg.log.tensorboard_dir);
    } catch (const std::exception& e) {
      spdlog::warn("{}; no TensorBoard scalars this run (training goes on)", e.what());
      I.tb.reset();
    }
  }
}

Trainer::~Trainer() = default;

std::int64_t Trainer::current_step() const { return impl_->step; }

StepResult Trainer::step() {
  auto& I = *impl_;
  core::fault_point("step", I.grid.rank(), I.step);  // tests only (WLB4D_FAULT)
  const core::ProfileRegion step_region("wlb4d:step");
  io::TimingRecord rec = I.new_record();
  const bool traced = I.cfg.log.trace_step == I.step + 1;  // log.trace_step counts from 1, like the step line
  const double t_start = I.start_clock(traced);
  if (traced) {
    I.trace_rows.clear();
    I.trace_origin = t_start;
  }
  const std::int64_t s = I.step;

  // 1. Plan: identical on every rank (same stream, same packer).
  Phase plan_phase = I.phase(kPhasePlan, s, traced);
  const balance::StepPlan plan = I.packer->plan_step(I.step, I.source);
  I.tokens_seen += plan.tokens;
  auto metrics = balance::step_metrics(plan, I.cost, I.grid.cp_size());
  rec.time[io::kPlan] = plan_phase.end();

  // 2-4. This rank's slice of its replica's micro-batches; the schedule.
  Phase data_phase = I.phase(kPhaseData, s, traced);
  I.load(plan);
  const std::int64_t targets = I.step_targets(plan);
  metrics.target_tokens = targets;
  if (targets == 0 && I.grid.rank() == 0)
    spdlog::warn("step {}: no loss targets (the loss mask masks every target of the step): loss 0, zero gradient",
                 I.step + 1);
  rec.time[io::kData] = data_phase.end();
  Phase run_phase = I.phase(kPhaseRun, s, traced);
  const double spike_scale = core::fault_loss_scale(I.step);  // tests only (WLB4D_FAULT=spike)
  const auto run = I.exec->run(/*backward=*/true, targets > 0 ? spike_scale / double(targets) : 0.0, traced);
  add_run_stats(rec, run);
  if (traced) I.keep_trace(run);
  Kokkos::fence();
  run_phase.end();  // the run's times are RunStats' (compute and communication apart)

  // 5. Gradients: sum over DP×CP (each replica holds partial sums).
  Phase dp_phase = I.phase(kPhaseDpReduce, s, traced);
  I.opt->reduce_gradients();
  Kokkos::fence();
  rec.time[io::kDPReduce] = dp_phase.end();
  I.fill_comm_stats(rec);

  // 6. Loss, global grad norm, NaN/inf check, clip, AdamW.
  Phase opt_phase = I.phase(kPhaseOptimizer, s, traced);
  const double loss = I.reduce_loss(run.loss_sum, targets) * spike_scale;
  SpikeDecision guard;
  const optim::UpdateResult upd = I.update(loss, &guard);
  rec.time[io::kOptimizer] = opt_phase.end();

  // 7. Records (and the validation loss when due). kTotal is the step alone:
  // evaluation (and, in run(), the checkpoint) have their own columns.
  rec.time[io::kTotal] = core::wall_seconds() - t_start;
  StepResult res = I.result(plan, targets, loss, upd, guard);
  ++I.step;
  if (I.eval_due()) {
    Phase eval_phase = I.phase(kPhaseEval, s, traced);
    res.val_loss = evaluate();
    Kokkos::fence();
    rec.time[io::kEval] = eval_phase.end();
  }
  return I.finish_step(std::move(res), rec, metrics);
}

double Trainer::evaluate() {
  auto& I = *impl_;
  if (!I.val_ds) throw core::ConfigError("evaluation needs data.val (a validation dataset)");
  const auto& g = I.grid;
  if (I.val_mbs.empty()) I.build_validation_batches();
  // Replica r evaluates micro-batches r, r+dp, ...; every replica runs the same count
  // (pipeline ranks must agree), padding with nothing when the count is uneven.
  std::vector<balance::MicroBatch> mine;
  for (std::size_t i = std::size_t(g.dp_rank()); i < I.val_mbs.size(); i += std::size_t(g.dp_size()))
    mine.push_back(I.val_mbs[i]);
  double loss_sum = 0;
  // Evaluate in groups the executor can hold (its workspace slots).
  const std::size_t per_round = std::size_t(I.cfg.train.micro_batches / g.dp_size());
  const std::size_t rounds = (I.val_mbs.size() + per_round * g.dp_size() - 1) / (per_round * g.dp_size());
  for (std::size_t r = 0; r < rounds; ++r) {
    std::vector<balance::MicroBatch> group;
    for (std::size_t i = r * per_round; i < std::min(mine.size(), (r + 1) * per_round); ++i) group.push_back(mine[i]);
    std::vector<balance::Sharding> sh(group.size(), balance::Sharding::Sequence);
    I.exec->load(*I.val_ds, group, sh);
    loss_sum += I.exec->run(/*backward=*/false, 0.0).loss_sum;
  }
  return I.reduce_loss(loss_sum, I.val_targets);
}

StepResult Trainer::run() {
  auto& I = *impl_;
  const auto& g = I.grid;
  StepResult last;
  if (!I.resumed_from.empty() && I.step >= I.cfg.train.steps) {
    if (g.rank() == 0)
      spdlog::info("run already complete: checkpoint {} is at step {} (its last step), train.steps={}; last loss {}; "
                   "nothing to train (raise train.steps to continue)",
                   I.resumed_from, I.step, I.cfg.train.steps,
                   std::isnan(I.last_loss) ? std::string("not stored (an older checkpoint)")
                                           : fmt::format("{:.4f}", I.last_loss));
    last.loss = I.last_loss;
    return last;
  }
  Throughput window;
  std::int64_t step_lines = 0;        // step lines printed by this start
  std::int64_t last_detail_step = 0;  // the step of the last detail line (log.detail_every)
  bool stop = false;
  I.run_start = core::wall_seconds();
  const std::int64_t first_step = I.step;
  const std::string kind_names = trace_kind_names();  // /trace's names of the kind codes
  while (I.step < I.cfg.train.steps && !stop) {
    last = step();
    I.last_loss = last.loss;
    last.record.ckpt_write = I.collect_async(false);  // a background save that finished meanwhile
    const bool traced = last.step + 1 == I.cfg.log.trace_step;
    const int urgent = I.agreed_checkpoint_urgency();
    stop = urgent == 2;
    if (I.checkpoint_due(urgent)) {
      Phase ckpt_phase = I.phase(kPhaseCheckpoint, last.step, traced);
      if (I.writer)
        last.record.ckpt_write += I.save_checkpoint_async();  // the blocking part: staging (after the previous write)
      else
        I.save_checkpoint();
      last.record.time[io::kCheckpoint] = ckpt_phase.end();  // not part of kTotal (the step alone)
      // The run's last save (the end, or a stop signal) completes before the
      // program goes on to exit; its write is reported with this step.
      if (I.writer && (stop || I.step >= I.cfg.train.steps)) last.record.ckpt_write += I.collect_async(true);
    }
    const bool sampled = I.sample_due();
    if (sampled) {
      Phase sample_phase = I.phase(kPhaseSample, last.step, traced);
      I.sample_text();
      last.record.time[io::kSample] = sample_phase.end();  // not part of kTotal either
    }
    window.add(last);
    const double elapsed = core::wall_seconds() - I.run_start;
    last.record.elapsed = elapsed;
    const std::vector<io::TimingRecord> all = I.tlog->append(last.record);
    if (!last.source_tokens.empty()) {
      std::vector<io::SourceRecord> rows;
      for (int s = 0; s < I.stream.num_sources(); ++s) {
        io::SourceRecord r;
        r.step = last.step;
        r.source = s;
        r.tokens = last.source_tokens[std::size_t(s)];
        r.drawn_tokens = last.source_drawn[std::size_t(s)];
        r.drawn_docs = I.stream.state().docs[std::size_t(s)];
        r.weight = I.stream.weights()[std::size_t(s)];
        rows.push_back(r);
      }
      I.tlog->append_sources(rows);  // rank 0 writes
    }
    if (traced) I.write_trace_json(I.tlog->append_trace(I.trace_rows, kind_names), all, kind_names);  // collective
    const std::vector<Straggler> slow = I.observe_stragglers(last.step, all);
    if (g.rank() == 0) I.write_scalars(last, all);
    const bool print = (last.step + 1) % I.cfg.train.print_every == 0 || last.step == 0 ||
                       last.step + 1 == I.cfg.train.steps || last.val_loss >= 0 || sampled || last.skipped;
    if (print && g.rank() == 0) {
      StepLineContext ctx;
      ctx.total_steps = I.cfg.train.steps;
      ctx.devices = g.world().size();
      ctx.peak_tflops = I.peak.flops * 1e-12;
      ctx.mem_capacity_bytes = I.mem_capacity;
      ctx.mem_on_device = I.mem_on_device;
      ctx.print_count = ++step_lines;
      ctx.elapsed = elapsed;
      const double done = double(I.step - first_step);
      ctx.eta = done > 0 ? elapsed / done * double(I.cfg.train.steps - I.step) : 0;
      ctx.guard = I.spike.has_value();
      ctx.stragglers = format_stragglers(slow);
      spdlog::info("{}", format_step_line(last, all, window, ctx));
      const bool last_step = last.step + 1 == I.cfg.train.steps;
      if (detail_due(last.step + 1, last_detail_step, ctx.print_count == 1, last_step, I.cfg.log.detail_every)) {
        spdlog::info("{}", format_detail_line(last, all, ctx));
        last_detail_step = last.step + 1;
      }
      window = Throughput{};
    }
  }
  I.collect_async(true);  // no save outlives the run
  print_run_summary(g, I.mem.total(), last, I.step, I.cfg.train.steps, stop);
  return last;
}

std::vector<std::string> Trainer::parameter_names() const {
  model::ParamRegistry<float> full(impl_->cfg.model, impl_->vocab, model::ModelShard{});
  std::vector<std::string> names;
  for (const auto& p : full) names.push_back(p.name);
  return names;
}

std::vector<float> Trainer::gather_parameter(const std::string& name) const {
  auto& I = *impl_;
  const auto& g = I.grid;
  model::ParamRegistry<float> full(I.cfg.model, I.vocab, model::ModelShard{});
  const auto& gp = full.at(name);
  std::vector<float> out(std::size_t(gp.global_numel()), 0.0f);
  // Owners: the stage holding it, DP/CP replica 0, and TP rank 0 for replicated tensors.
  if (g.dp_rank() == 0 && g.cp_rank() == 0) {
    for (auto& chunk : I.exec->chunks()) {
      const auto* p = chunk->params().find(name);
      if (!p || (p->tp_replicated && g.tp_rank() != 0)) continue;
      auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), p->value);
      for (std::int64_t i = 0; i < p->local_numel(); ++i) out[std::size_t(p->global_index(i))] = h(i);
    }
  }
  g.world().allreduce(out.data(), out.size());
  return out;
}

}  // namespace wlb::train
