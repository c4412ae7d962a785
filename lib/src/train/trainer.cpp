// The training loop. See trainer.hpp and DESIGN §2.
#include "wlb4d/train/trainer.hpp"

#include "wlb4d/balance/metrics.hpp"
#include "wlb4d/balance/sharding.hpp"
#include "wlb4d/balance/packer.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/fault.hpp"
#include "wlb4d/core/memory.hpp"
#include "wlb4d/core/version.hpp"
#include "wlb4d/core/signals.hpp"
#include "wlb4d/data/dataset.hpp"
#include "wlb4d/data/document_stream.hpp"
#include "wlb4d/io/checkpoint.hpp"
#include "wlb4d/io/checkpoint_model.hpp"
#include "wlb4d/model/transformer.hpp"
#include "wlb4d/optim/optimizer.hpp"
#include "wlb4d/pipeline/executor.hpp"
#include "wlb4d/pipeline/memory_model.hpp"
#include "wlb4d/train/calibrate.hpp"

#include <Kokkos_Core.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <functional>
#include <limits>
#include <optional>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace wlb::train {

std::string tp_host_advice(int tp, int world, int host_ranks, int host_cores) {
  if (tp <= 1 || host_ranks != world || world < 1 || host_cores >= kTpAdviceCoresPerRank * world) return {};
  return fmt::format(
      "parallel.tp={} with all {} ranks on one host of {} cores (fewer than {} per rank): tensor parallelism is not "
      "advised here. Every layer all-reduces its activations over TP in the forward and its input gradients in the "
      "backward, and at these sizes that costs about what the split GEMMs save: measured on "
      "inputs/bench-quickstart.ini, 2 ranks on 2 shared cores, tp=2 ran at 0.80x of 1 rank's tokens/s (0.74-0.84x; "
      "313-340 ms of a 655-715 ms step in TP collectives, 286-312 ms computing), dp=2 at 1.27x. Prefer parallel.dp (or pp) over tp on this host; "
      "tp pays across GPUs or hosts with many cores per rank.",
      tp, world, host_cores, kTpAdviceCoresPerRank);
}

namespace {

/// The data stream seen by the packer: documents of the training set in the
/// stream's seeded order.
class StreamSource final : public balance::DocSource {
 public:
  explicit StreamSource(data::DocumentStream& s) : s_(s) {}
  balance::Doc next() override {
    auto d = s_.next();
    return {d.doc_id, d.length};
  }

 private:
  data::DocumentStream& s_;
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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

/// Tokens, seconds and FLOP since the last printed step line.
struct Throughput {
  double tokens = 0, seconds = 0, flops = 0;
  void add(const StepResult& r) {
    tokens += double(r.tokens);
    seconds += r.seconds;
    flops += r.model_flops;
  }
};

/// Peak resident host memory of this process (MiB; core::peak_rss_bytes).
double peak_rss_mib() { return double(core::peak_rss_bytes()) / (1024.0 * 1024.0); }

/// "1:02:03" (hours unbounded).
std::string hms(double seconds) {
  const auto t = std::int64_t(std::max(0.0, seconds) + 0.5);
  return fmt::format("{}:{:02d}:{:02d}", t / 3600, int(t / 60 % 60), int(t % 60));
}

/// 950, 12.3k, 4.56M, 7.89G (tokens).
std::string human_count(double x) {
  if (x < 1e3) return fmt::format("{:.0f}", x);
  if (x < 1e6) return fmt::format("{:.1f}k", x * 1e-3);
  if (x < 1e9) return fmt::format("{:.2f}M", x * 1e-6);
  return fmt::format("{:.2f}G", x * 1e-9);
}

/// What the step line needs beyond the step's own result.
struct StepLineContext {
  int total_steps = 0;
  int devices = 1;          ///< world size: throughput and MFU are per device (rank)
  double peak_tflops = 0;   ///< log.peak_tflops (0: no MFU field)
  double elapsed = 0;       ///< seconds since run() started
  double eta = 0;           ///< seconds left at the mean pace (eval and checkpoints included)
};

/// Rank 0's step line: progress, loss, throughput since the last line (per
/// device and as MFU), the step's own time and, apart, its evaluation and
/// checkpoint time, memory, ETA, and the compute time and imbalance over
/// ranks of this step (`all`: every rank's record).
void print_step_line(const StepResult& last, const std::vector<io::TimingRecord>& all, const Throughput& w,
                     const StepLineContext& ctx) {
  double tmin = 1e300, tmax = 0, tsum = 0, cmax = 0, csum = 0, mem = 0, eval = 0, ckpt = 0;
  double dpx = 0, dpf = 0, tpx = 0, tpf = 0;  // communication exposed / in flight, max over ranks
  double cax = 0, cabytes = 0;  // core attention: exposed wait (max over ranks), bytes moved
  for (const auto& r : all) {
    cax = std::max(cax, r.ca_exposed);
    cabytes += r.ca_bytes / 2;  // each byte is counted by its sender and its receiver
    dpx = std::max(dpx, r.dp_exposed);
    dpf = std::max(dpf, r.dp_in_flight);
    tpx = std::max(tpx, r.tp_exposed);
    tpf = std::max(tpf, r.tp_in_flight);
    mem = std::max(mem, r.rss_mib);
    eval = std::max(eval, r.time[io::kEval]);
    ckpt = std::max(ckpt, r.time[io::kCheckpoint]);
    const double c = r.time[io::kForward] + r.time[io::kBackward];
    tmin = std::min(tmin, c);
    tmax = std::max(tmax, c);
    tsum += c;
    cmax = std::max(cmax, r.compute_cpu);
    csum += r.compute_cpu;
  }
  // Measured imbalance: max/mean compute CPU time over ranks (not wall, which
  // time-slicing inflates when ranks outnumber cores).
  const double cpu_imb = csum > 0 ? cmax / (csum / double(all.size())) : 1.0;
  const std::string val = last.val_loss >= 0 ? fmt::format(" | val {:.4f}", last.val_loss) : "";
  const double flops_dev = w.seconds > 0 ? w.flops / w.seconds / double(ctx.devices) : 0;
  const std::string mfu =
      ctx.peak_tflops > 0 ? fmt::format(" | MFU {:.1f}%", 100.0 * flops_dev / (ctx.peak_tflops * 1e12)) : "";
  // Disaggregated attention: the plan's max/mean attention cost over ranks before -> after, traffic, wait.
  // Group imbalance of the plan (Σ over micro-batches of max / mean; the worst group over stages).
  double cai_b = 0, cai_a = 0;
  for (const auto& r : all) {
    cai_b = std::max(cai_b, r.ca_imbalance_before);
    cai_a = std::max(cai_a, r.ca_imbalance);
  }
  const std::string ca = cai_b > 0 ? fmt::format(" | core attn {:.2f}->{:.2f}, {:.1f} MiB, exposed {:.1f} ms", cai_b,
                                                 cai_a, cabytes / 1048576.0, cax * 1e3)
                                   : std::string();
  const std::string extra = (eval > 0 ? fmt::format(" | eval {:.0f} ms", eval * 1e3) : std::string()) +
                            (ckpt > 0 ? fmt::format(" | ckpt {:.0f} ms", ckpt * 1e3) : std::string());
  spdlog::info(
      "step {:>5}/{} | {} | loss {:.4f}{} | lr {:.2e} | gnorm {:.3f} | tokens {} ({}/step) | {:.0f} tok/s/dev"
      " | {:.2f} GFLOP/s/dev{} | step {:.0f} ms{} | mem {:.0f} MiB | ETA {}"
      " | compute min/mean/max {:.0f}/{:.0f}/{:.0f} ms | imbalance attn {:.2f} lat {:.2f} cpu {:.2f}"
      " | comm exposed/in flight dp {:.1f}/{:.1f} tp {:.1f}/{:.1f} ms{}",
      last.step + 1, ctx.total_steps, hms(ctx.elapsed), last.loss, val, last.lr, last.grad_norm,
      human_count(double(last.record.tokens_seen)), last.tokens,
      w.seconds > 0 ? w.tokens / w.seconds / double(ctx.devices) : 0.0, flops_dev * 1e-9, mfu, last.seconds * 1e3,
      extra, mem, hms(ctx.eta), tmin * 1e3, tsum / double(all.size()) * 1e3, tmax * 1e3,
      last.record.attn_imbalance, last.record.latency_imbalance, cpu_imb, dpx * 1e3, dpf * 1e3, tpx * 1e3,
      tpf * 1e3, ca);
}

}  // namespace

struct Trainer::Impl {
  core::Config cfg;
  const grid::ProcessGrid& grid;
  data::TokenDataset train_ds;
  std::optional<data::TokenDataset> val_ds;
  data::DocumentStream stream;
  StreamSource source;
  std::int64_t vocab = 0;
  balance::CostModel cost;
  std::unique_ptr<balance::Packer> packer;
  std::unique_ptr<pipeline::Executor> exec;
  std::unique_ptr<optim::Optimizer> opt;
  std::int64_t step = 0;
  std::int64_t tokens_seen = 0;                    // training tokens consumed (checkpointed)
  std::unique_ptr<io::ModelCheckpointState> ckpt;  // TensorRef view of values + moments
  io::CheckpointDirLock dir_lock;                  // this run owns checkpoint.dir
  double last_ckpt_time = 0;
  std::unique_ptr<io::TimingLog> tlog;
  // Validation micro-batches (fixed order, built once).
  std::vector<balance::MicroBatch> val_mbs;
  std::int64_t val_targets = 0;
  std::string resumed_from;  // the checkpoint this run resumed from ("" : a fresh start)
  double run_start = 0;      // now() when this start's training began (step line's elapsed, ETA)
  std::vector<io::TraceRecord> trace_rows;  // this rank's actions of the traced step (log.trace_step)
  double last_loss = std::numeric_limits<double>::quiet_NaN();  // loss of the last step run (checkpointed)
  pipeline::MemoryEstimate mem;  // this rank's predicted peak (memory model)

  Impl(const core::Config& c, const grid::ProcessGrid& g)
      : cfg(c),
        grid(g),
        train_ds(data::TokenDataset::open(c.data.train)),
        stream(train_ds, c.train.seed, c.data.shuffle, c.data.max_docs > 0 ? c.data.max_docs : -1),
        source(stream) {
    // The outputs first: an unwritable log fails now, not after calibration
    // and checkpoint load (checkpoint.dir is checked below, once its size is known).
    io::check_timing_log_paths(c.log.timing_file, c.log.csv_file, g.world());
    if (!c.data.val.empty()) val_ds.emplace(data::TokenDataset::open(c.data.val));
    if (g.rank() == 0)
      for (const auto* ds : {&train_ds, val_ds ? &*val_ds : nullptr})
        if (ds && !ds->has_checksum())
          spdlog::warn("{}: no checksum (written by an older wlb4d-prep): token ids are checked per read span "
                       "only; re-run wlb4d-prep to add max_token_id and tokens_fnv1a64",
                       ds->path());
    vocab = model_vocab();
    cfg.model.data_vocab = train_ds.vocab_size();  // padded rows (vocab > it) are masked out of the loss
    core::install_memory_tracker();  // before any model allocation
    check_memory_fits();             // before anything large is allocated or planned
    check_has_targets();
    cost = make_cost_model();
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
    ckpt = std::make_unique<io::ModelCheckpointState>(g, cregs, opt->exp_avg(), opt->exp_avg_sq(),
                                                      opt->zero() == 1 ? &g.dpcp() : nullptr);  // collective over pp
    const auto& ck = c.checkpoint;
    if (ck.every > 0 || ck.every_minutes > 0 || ck.at_end) {  // fail now, not at the first checkpoint
      dir_lock.acquire(ck.dir, g.world());
      io::check_checkpoint_dir(ck.dir, g.world(), io::checkpoint_bytes_estimate(ckpt->tensors()));
    }
    guard_earlier_outputs(ck.every > 0 || ck.every_minutes > 0 || ck.at_end);
    last_ckpt_time = now();
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
      for (const auto* f : {&cfg.log.timing_file, &cfg.log.csv_file}) {
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

  /// Upper bound ([N], DESIGN §10): the memory model's prediction for this
  /// rank against what it can get, before any large allocation. Host memory
  /// (MemSpace host-accessible): the ranks sharing a host together against
  /// its MemAvailable. Device memory: this rank against plan.device_memory_gib.
  /// Rank 0 prints the prediction per pipeline stage. Collective over the world.
  /// \throws core::ConfigError on every rank, with both numbers.
  void check_memory_fits() {
    pipeline::MemoryOptions opt;
    opt.dpcp_rank = grid.dpcp().rank();
    mem = pipeline::predict_memory(cfg, vocab, grid.pp_rank(), grid.tp_rank(), opt);
    const double mine = mem.total();
    if (grid.rank() == 0) {
      // What scripts/bench.sh divides by the SGEMM rate for the GEMM-bound share ([P] 1).
      const std::int64_t nmm = model::matmul_params(cfg.model, vocab);
      spdlog::info("model: {} matmul parameters (LM head included, embedding excluded), vocabulary {}: "
                   "GEMM work 6*N_mm = {:.4g} FLOP per token (forward + backward)",
                   nmm, vocab, 6.0 * double(nmm));
      const auto stages = pipeline::predict_memory_stages(cfg, vocab, opt);
      for (const auto& e : stages)
        spdlog::info("memory model: pp rank {} (tp rank 0): {}", e.pp_rank, pipeline::format_memory(e));
      spdlog::info("memory model: predicted peak per rank, max over ranks {} (pp rank {})",
                   core::format_bytes(pipeline::max_memory(stages).total()), pipeline::max_memory(stages).pp_rank);
    }
    constexpr bool host = Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible;
    double need = mine, have = 0;
    std::string where;
    if (host) {
      char name[256] = {};
      gethostname(name, sizeof(name) - 1);
      const int color = int(std::hash<std::string>{}(name) & 0x3fffffff);
      const auto node = grid.world().split(color, grid.rank());
      need = node->allreduce_value(mine);
      const double avail = double(core::available_host_bytes());
      have = node->allreduce_value(avail, comm::ReduceOp::Min);
      where = fmt::format("MemAvailable of host {} (/proc/meminfo), shared by its {} ranks", name, node->size());
      const int all_here = grid.world().allreduce_value(node->size() == grid.world_size() ? 1 : 0, comm::ReduceOp::Min);
      if (grid.rank() == 0) {
        const std::string advice = tp_host_advice(grid.tp_size(), grid.world_size(), all_here ? grid.world_size() : 0,
                                                  int(sysconf(_SC_NPROCESSORS_ONLN)));
        if (!advice.empty()) spdlog::warn("{}", advice);
      }
      if (avail < 0) return;  // unknown: no bound
    } else {
      have = cfg.plan.device_memory_gib * 1024.0 * 1024.0 * 1024.0;
      where = fmt::format("plan.device_memory_gib={} of device memory per rank", cfg.plan.device_memory_gib);
    }
    const int over = grid.world().allreduce_value(need > have ? 1 : 0, comm::ReduceOp::Max);
    if (over == 0) return;
    const double worst = grid.world().allreduce_value(mine, comm::ReduceOp::Max);
    throw core::ConfigError(fmt::format(
        "the memory model predicts {} on this rank (pp rank {}, tp rank {}; {} needed{}; max over ranks {}), but "
        "only {} is available ({}): reduce train.micro_batches, train.max_seq_len/balance.max_tokens or "
        "model size, or use more ranks, model.recompute, parallel.zero=1",
        core::format_bytes(mine), grid.pp_rank(), grid.tp_rank(), core::format_bytes(need),
        host ? " by the ranks of this host" : "", core::format_bytes(worst), core::format_bytes(have), where));
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
    for (std::int64_t d = 0; d < n && targets == 0; ++d) targets += train_ds.doc_length(d) - 1;
    if (targets == 0)
      throw core::DataError("data.train='" + cfg.data.train + "' has no target tokens: all " + std::to_string(n) +
                            " documents used are 1 token long (a target is the next token of the same "
                            "document, so a document needs >= 2 tokens)");
    if (!val_ds || cfg.train.eval_every == 0) return;
    build_validation_batches();
    if (val_targets == 0)
      throw core::DataError("data.val='" + cfg.data.val + "' gives no target tokens: its first documents within "
                            "train.eval_tokens=" + std::to_string(cfg.train.eval_tokens) + " (of " +
                            std::to_string(val_ds->num_docs()) +
                            ") are 1 token long; give a validation set with documents of >= 2 tokens, or set "
                            "data.val= (empty) or train.eval_every=0 to train without validation");
  }

  /// Calibrated on this build's layer (balance.calibrate), else from the deck.
  balance::CostModel make_cost_model() const {
    if (!cfg.balance.calibrate) return balance::CostModel::from_config(cfg);
    const auto cal = calibrate_cost_model(
        cfg.model, std::max<std::int64_t>(cfg.train.max_seq_len, cfg.balance.max_tokens), grid.world());
    const auto& k = cal.cost;
    if (grid.rank() == 0)
      spdlog::info("cost model calibrated on this build's layer: a = {:.3e} s/token, b = {:.3e} s/token^2, "
                   "c = {:.3e} s per layer (breakpoint {:.0f} tokens)",
                   k.a, k.b, k.c, k.breakpoint());
    return k;
  }

  /// wlb with outlier_thresholds=auto tunes on a sample of document lengths:
  /// the first (up to 8192) documents of the training data, the same on every rank.
  /// A training set smaller than one step's token budget is drawn several
  /// times within every step (the stream wraps to the next epoch): legal, but
  /// rarely meant, so say it once at start-up.
  void warn_if_dataset_smaller_than_a_step() const {
    const auto& d = train_ds.doc_offsets();
    const std::int64_t docs = cfg.data.max_docs > 0 ? std::min(cfg.data.max_docs, train_ds.num_docs()) : train_ds.num_docs();
    const std::int64_t tokens = std::int64_t(d[std::size_t(docs)]);
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

  /// Token-level mean loss from this rank's Σ CE: summed over DP×CP, taken
  /// from the last pipeline stage (the only one with a loss). Collective.
  double reduce_loss(double loss_sum, std::int64_t target_tokens) const {
    loss_sum = grid.dpcp().allreduce_value(loss_sum);
    if (grid.pp_size() > 1) loss_sum = grid.pp().allreduce_value(grid.is_last_stage() ? loss_sum : 0.0);
    return target_tokens > 0 ? loss_sum / double(target_tokens) : 0.0;
  }

  StepResult result(const balance::StepPlan& plan, double loss, const optim::UpdateResult& upd) const {
    StepResult res;
    res.step = step;
    res.loss = loss;
    res.grad_norm = upd.grad_norm;
    res.lr = upd.lr;
    res.tokens = plan.tokens;
    res.target_tokens = plan.target_tokens;
    std::int64_t pairs = 0;
    for (const auto& rep : plan.micro_batches)
      for (const auto& mb : rep) pairs += attention_pairs(mb);
    res.model_flops = model::model_flops(cfg.model, vocab, plan.tokens, pairs);
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
    rec.rss_mib = peak_rss_mib();
    rec.mfu = cfg.log.peak_tflops > 0
                  ? rec.gflops * 1e9 / double(grid.world().size()) / (cfg.log.peak_tflops * 1e12)
                  : -1.0;
  }

  /// The traced step's actions as /trace rows, times from the step's start.
  void keep_trace(const std::vector<pipeline::ActionTiming>& t, double t_start) {
    trace_rows.clear();
    for (const auto& a : t) {
      io::TraceRecord r;
      r.step = step;
      r.rank = grid.rank();
      r.stage = grid.pp_rank();
      r.virtual_stage = a.action.virtual_stage;
      r.micro_batch = a.action.micro_batch;
      r.kind = int(a.action.type);
      r.peer = a.action.peer;
      r.t0 = a.t0 - t_start;
      r.t1 = a.t1 - t_start;
      trace_rows.push_back(r);
    }
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
    for (const auto& mb : val_mbs) val_targets += mb.target_tokens();
  }

  /// Checkpoint urgency agreed by every rank (clocks and signals are per rank):
  /// 0 none, 1 checkpoint.every_minutes elapsed, 2 SIGTERM/SIGUSR1 (checkpoint, then stop).
  int agreed_checkpoint_urgency() const {
    const auto& ck = cfg.checkpoint;
    int urgent = (ck.every_minutes > 0 && now() - last_ckpt_time >= 60.0 * ck.every_minutes) ? 1 : 0;
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

  /// Rank 0: predicted vs measured peak (Kokkos high-water mark) per rank.
  /// Collective over the world.
  void print_memory_report() const {
    const int n = grid.world_size();
    std::vector<double> mine = {mem.total(), double(core::kokkos_peak_bytes(MemSpace::name())), double(core::peak_rss_bytes()),
                                double(grid.pp_rank()), double(grid.tp_rank())};
    std::vector<double> all(mine.size() * std::size_t(n));
    grid.world().allgather(mine.data(), all.data(), mine.size());
    if (grid.rank() != 0) return;
    for (int r = 0; r < n; ++r) {
      const double* x = &all[std::size_t(r) * mine.size()];
      spdlog::info("memory rank {} (pp {}, tp {}): predicted {} | measured Kokkos peak {} ({:+.1f}%) | peak RSS {}",
                   r, int(x[3]), int(x[4]), core::format_bytes(x[0]), core::format_bytes(x[1]),
                   x[0] > 0 ? (x[1] / x[0] - 1) * 100 : 0.0, core::format_bytes(x[2]));
    }
  }

  /// Run summary: peak resident memory per rank (getrusage, KiB on Linux).
  void print_summary(const StepResult& last, bool stopped) const {
    print_memory_report();
    const double rss_mib = peak_rss_mib();
    const double rss_max = grid.world().allreduce_value(rss_mib, comm::ReduceOp::Max);
    const double rss_min = grid.world().allreduce_value(rss_mib, comm::ReduceOp::Min);
    if (grid.rank() != 0) return;
    if (stopped) spdlog::warn("stop requested (SIGTERM/SIGUSR1): checkpoint written after step {}", step);
    if (cfg.train.steps > 0)
      spdlog::info("done: {} steps | peak memory per rank {:.0f}-{:.0f} MiB | final loss {:.4f}{}", step, rss_min,
                   rss_max, last.loss, last.val_loss >= 0 ? fmt::format(" | val {:.4f}", last.val_loss) : "");
  }

  /// Writes the checkpoint of the current step (collective over the world).
  std::string save_checkpoint() {
    Kokkos::fence();
    ckpt->pull();  // ZeRO-1: gathers the moments into host staging
    struct Release {
      io::ModelCheckpointState& s;
      ~Release() { s.release(); }
    } release{*ckpt};
    io::TrainState st;
    st.step = step;
    st.tokens_seen = tokens_seen;
    st.stream_epoch = stream.state().epoch;
    st.stream_position = stream.state().position;
    st.packer_state = packer->save_state();
    st.seed = cfg.train.seed;
    st.last_loss = last_loss;
    io::CheckpointInfo info;
    info.deck = core::to_ini(cfg);
    info.dataset_identity = train_ds.identity();
    info.model = cfg.model;
    info.vocab = vocab;  // padded vocabulary: the tensors' shape
    info.precision = cfg.train.precision;
    const std::string path = io::save_checkpoint(cfg.checkpoint, grid, ckpt->tensors(), st, info);
    last_ckpt_time = now();
    if (grid.rank() == 0) spdlog::info("checkpoint {} written (step {})", path, step);
    return path;
  }

  /// checkpoint.resume: values, moments, step, tokens, stream and packer state (collective).
  void resume() {
    // A newest checkpoint written for another model is skipped like a corrupt one (resume=auto).
    const auto path = io::resolve_resume(cfg.checkpoint.dir, cfg.checkpoint.resume, grid.world(), nullptr,
                                         [&](const std::string& p) {
                                           return io::checkpoint_model_mismatch(p, cfg.model, vocab);
                                         });
    if (!path) return;
    ckpt->prepare_load();  // ZeRO-1: host staging for the whole moments
    core::fault_point("ckpt_load", grid.rank(), -1);  // tests only (WLB4D_FAULT)
    const auto r = io::load_checkpoint(*path, grid, ckpt->tensors(), cfg.model, vocab);
    ckpt->push();
    resumed_from = *path;
    step = r.state.step;
    tokens_seen = r.state.tokens_seen;
    last_loss = r.state.last_loss;
    stream.restore({r.state.stream_epoch, r.state.stream_position});
    packer->load_state(r.state.packer_state);
    if (grid.rank() == 0) {
      spdlog::info("resumed from {} at step {} (written by wlb4d {} on dp={} pp={} cp={} tp={}, precision {}; "
                   "continuing in {} from its fp32 master weights)",
                   *path, step, r.info.program_version, r.info.layout[0], r.info.layout[1], r.info.layout[2],
                   r.info.layout[3], r.info.precision.empty() ? std::string("not recorded") : r.info.precision,
                   cfg.train.precision);
      if (r.info.dataset_identity != train_ds.identity())
        spdlog::warn("data.train changed since the checkpoint: was {}, is {}", r.info.dataset_identity,
                     train_ds.identity());
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
  rr.cost_calibrated = cfg.balance.calibrate ? 1 : 0;
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
  id.peak_tflops = cfg.log.peak_tflops;
  I.tlog = std::make_unique<io::TimingLog>(cfg.log.timing_file, cfg.log.csv_file, grid.world(), rr, id);
}

Trainer::~Trainer() = default;

std::int64_t Trainer::current_step() const { return impl_->step; }

StepResult Trainer::step() {
  auto& I = *impl_;
  core::fault_point("step", I.grid.rank(), I.step);  // tests only (WLB4D_FAULT)
  io::TimingRecord rec = I.new_record();
  // log.trace_step counts from 1, like the step line. The traced step starts
  // at a world barrier so that every rank's trace shares its origin (ranks of
  // one node also share the steady clock).
  const bool traced = I.cfg.log.trace_step == I.step + 1;
  Kokkos::fence();
  if (traced) I.grid.world().barrier();
  const double t_start = now();

  // 1. Plan: identical on every rank (same stream, same packer).
  double t0 = now();
  const balance::StepPlan plan = I.packer->plan_step(I.step, I.source);
  I.tokens_seen += plan.tokens;
  const auto metrics = balance::step_metrics(plan, I.cost, I.grid.cp_size());
  rec.time[io::kPlan] = now() - t0;

  // 2-4. This rank's slice of its replica's micro-batches; the schedule.
  t0 = now();
  I.load(plan);
  rec.time[io::kData] = now() - t0;
  const auto run =
      I.exec->run(/*backward=*/true, plan.target_tokens > 0 ? 1.0 / double(plan.target_tokens) : 0.0, traced);
  add_run_stats(rec, run);
  if (traced) I.keep_trace(run.trace, t_start);

  // 5. Gradients: sum over DP×CP (each replica holds partial sums).
  Kokkos::fence();
  t0 = now();
  I.opt->reduce_gradients();
  Kokkos::fence();
  rec.time[io::kDPReduce] = now() - t0;
  if (I.exec->disaggregated_attention()) {
    const auto& ca = I.exec->attention_stats();
    const auto x = I.exec->take_attention_exchange_stats();
    rec.ca_cost_before = ca.cost_before;
    rec.ca_cost_after = ca.cost_after;
    rec.ca_imbalance_before = ca.imbalance_before();
    rec.ca_imbalance = ca.imbalance_after();
    rec.ca_bytes = x.bytes_sent + x.bytes_received;
    rec.ca_exposed = x.exposed_s;
  }
  rec.dp_exposed = I.opt->dp_exposed_seconds();
  rec.dp_in_flight = I.opt->dp_in_flight_seconds();

  // 6. Loss, global grad norm, NaN/inf check, clip, AdamW.
  t0 = now();
  const double loss = I.reduce_loss(run.loss_sum, plan.target_tokens);
  const optim::UpdateResult upd = I.opt->step(I.step, loss);
  for (auto& chunk : I.exec->chunks()) chunk->mark_weights_updated();  // bf16: copies refreshed before the next forward
  Kokkos::fence();
  rec.time[io::kOptimizer] = now() - t0;

  // 7. Records (and the validation loss when due). kTotal is the step alone:
  // evaluation (and, in run(), the checkpoint) have their own columns.
  rec.time[io::kTotal] = now() - t_start;
  StepResult res = I.result(plan, loss, upd);
  ++I.step;
  if (I.eval_due()) {
    t0 = now();
    res.val_loss = evaluate();
    Kokkos::fence();
    rec.time[io::kEval] = now() - t0;
  }
  res.seconds = I.grid.world().allreduce_value(rec.time[io::kTotal], comm::ReduceOp::Max);
  I.fill_record(rec, res, metrics);
  I.fill_memory(rec);
  res.record = rec;
  return res;
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
  bool stop = false;
  I.run_start = now();
  const std::int64_t first_step = I.step;
  std::string kind_names;  // /trace's names of the action kinds (pipeline::ActionType order)
  for (auto k : {pipeline::ActionType::Forward, pipeline::ActionType::Backward, pipeline::ActionType::SendAct,
                 pipeline::ActionType::RecvAct, pipeline::ActionType::SendGrad, pipeline::ActionType::RecvGrad,
                 pipeline::ActionType::Weight})
    kind_names += (kind_names.empty() ? "" : ",") + std::string(pipeline::to_string(k));
  while (I.step < I.cfg.train.steps && !stop) {
    last = step();
    I.last_loss = last.loss;
    const int urgent = I.agreed_checkpoint_urgency();
    stop = urgent == 2;
    if (I.checkpoint_due(urgent)) {
      const double t0 = now();
      I.save_checkpoint();
      last.record.time[io::kCheckpoint] = now() - t0;  // not part of kTotal (the step alone)
    }
    window.add(last);
    const double elapsed = now() - I.run_start;
    last.record.elapsed = elapsed;
    const std::vector<io::TimingRecord> all = I.tlog->append(last.record);
    if (last.step + 1 == I.cfg.log.trace_step) I.tlog->append_trace(I.trace_rows, kind_names);  // collective
    const bool print = (last.step + 1) % I.cfg.train.print_every == 0 || last.step == 0 ||
                       last.step + 1 == I.cfg.train.steps || last.val_loss >= 0;
    if (print && g.rank() == 0) {
      StepLineContext ctx;
      ctx.total_steps = I.cfg.train.steps;
      ctx.devices = g.world().size();
      ctx.peak_tflops = I.cfg.log.peak_tflops;
      ctx.elapsed = elapsed;
      const double done = double(I.step - first_step);
      ctx.eta = done > 0 ? elapsed / done * double(I.cfg.train.steps - I.step) : 0;
      print_step_line(last, all, window, ctx);
      window = Throughput{};
    }
  }
  I.print_summary(last, stop);
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
