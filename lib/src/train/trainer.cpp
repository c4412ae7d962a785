// The training loop. See trainer.hpp and DESIGN §2.
#include "wlb4d/train/trainer.hpp"

#include "wlb4d/balance/metrics.hpp"
#include "wlb4d/balance/sharding.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/data/dataset.hpp"
#include "wlb4d/core/signals.hpp"
#include "wlb4d/data/document_stream.hpp"
#include "wlb4d/io/checkpoint.hpp"
#include "wlb4d/io/checkpoint_model.hpp"
#include "wlb4d/model/transformer.hpp"
#include "wlb4d/optim/adamw.hpp"
#include "wlb4d/pipeline/schedule.hpp"
#include "wlb4d/train/batch.hpp"
#include "wlb4d/train/calibrate.hpp"
#include "wlb4d/train/executor.hpp"

#include <Kokkos_Core.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <sys/resource.h>
#include <cmath>
#include <optional>

namespace wlb::train {

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

}  // namespace

struct Trainer::Impl {
  core::Config cfg;
  const grid::ProcessGrid& grid;
  data::TokenDataset train_ds;
  std::optional<data::TokenDataset> val_ds;
  data::DocumentStream stream;
  StreamSource source;
  balance::CostModel cost;
  std::unique_ptr<balance::Packer> packer;
  std::unique_ptr<Executor> exec;
  std::int64_t vocab = 0;
  std::int64_t step = 0;
  std::vector<Vec> m, v;  // AdamW moments per local chunk, flat like the registry
  std::int64_t tokens_seen = 0;                    // training tokens consumed (checkpointed)
  std::unique_ptr<io::ModelCheckpointState> ckpt;  // TensorRef view of values + moments
  double last_ckpt_time = 0;
  std::unique_ptr<io::TimingLog> tlog;
  // Validation micro-batches (fixed order, built once).
  std::vector<balance::MicroBatch> val_mbs;
  std::int64_t val_targets = 0;

  Impl(const core::Config& c, const grid::ProcessGrid& g)
      : cfg(c),
        grid(g),
        train_ds(data::TokenDataset::open(c.data.train)),
        stream(train_ds, c.train.seed, c.data.shuffle, c.data.max_docs > 0 ? c.data.max_docs : -1),
        source(stream) {
    if (!c.data.val.empty()) val_ds.emplace(data::TokenDataset::open(c.data.val));
    vocab = train_ds.vocab_size();
    if (c.model.vocab_size > 0) {
      if (c.model.vocab_size < vocab)
        throw core::ConfigError("model.vocab_size=" + std::to_string(c.model.vocab_size) +
                                " must be 0 or >= the vocabulary of data.train='" + c.data.train + "' (" +
                                std::to_string(vocab) + ")");
      vocab = c.model.vocab_size;  // padded rows are never targets; they only cost FLOPs
    }
    if (val_ds && val_ds->vocab_size() != train_ds.vocab_size())
      throw core::DataError("data.val='" + c.data.val + "' has vocab_size " + std::to_string(val_ds->vocab_size()) +
                            " but data.train='" + c.data.train + "' has " + std::to_string(train_ds.vocab_size()));
    if (c.balance.calibrate) {
      const auto cal = calibrate_cost_model(c.model, std::max<std::int64_t>(c.train.max_seq_len, c.balance.max_tokens),
                                            g.world());
      cost = cal.cost;
      if (g.rank() == 0)
        spdlog::info("cost model calibrated on this build's layer: a = {:.3e} s/token, b = {:.3e} s/token^2, "
                     "c = {:.3e} s per layer (breakpoint {:.0f} tokens)",
                     cost.a, cost.b, cost.c, cost.breakpoint());
    } else {
      cost = balance::CostModel::from_config(c);
    }
    // wlb with outlier_thresholds=auto tunes on a sample of document lengths:
    // the first (up to 8192) documents of the training data, the same on every rank.
    std::vector<std::int64_t> lengths;
    if (c.balance.packer == "wlb" && c.balance.outlier_thresholds == "auto") {
      std::int64_t n = train_ds.num_docs();
      if (c.data.max_docs > 0) n = std::min(n, c.data.max_docs);
      for (std::int64_t d = 0; d < std::min<std::int64_t>(n, 8192); ++d) lengths.push_back(train_ds.doc_length(d));
    }
    packer = balance::make_packer(c, cost, lengths);
    exec = std::make_unique<Executor>(c, g, vocab);
    for (auto& chunk : exec->chunks()) {
      const auto n = chunk->params().local_numel();
      m.emplace_back("adam_m", n);
      v.emplace_back("adam_v", n);
    }
    std::vector<const model::ParamRegistry<float>*> regs;
    for (auto& chunk : exec->chunks()) regs.push_back(&chunk->params());
    ckpt = std::make_unique<io::ModelCheckpointState>(g, regs, m, v);  // collective over pp
    last_ckpt_time = now();
  }

  /// Writes the checkpoint of the current step (collective over the world).
  std::string save_checkpoint() {
    Kokkos::fence();
    ckpt->pull();
    io::TrainState st;
    st.step = step;
    st.tokens_seen = tokens_seen;
    st.stream_epoch = stream.state().epoch;
    st.stream_position = stream.state().position;
    st.packer_state = packer->save_state();
    st.seed = cfg.train.seed;
    io::CheckpointInfo info;
    info.deck = core::to_ini(cfg);
    info.dataset_identity = train_ds.identity();
    info.model = cfg.model;
    info.vocab = vocab;  // padded vocabulary: the tensors' shape
    const std::string path = io::save_checkpoint(cfg.checkpoint, grid, ckpt->tensors(), st, info);
    last_ckpt_time = now();
    if (grid.rank() == 0) spdlog::info("checkpoint {} written (step {})", path, step);
    return path;
  }

  /// checkpoint.resume: values, moments, step, tokens, stream and packer state (collective).
  void resume() {
    const auto path = io::resolve_resume(cfg.checkpoint.dir, cfg.checkpoint.resume, grid.world());
    if (!path) return;
    const auto r = io::load_checkpoint(*path, grid, ckpt->tensors(), cfg.model, vocab);
    ckpt->push();
    step = r.state.step;
    tokens_seen = r.state.tokens_seen;
    stream.restore({r.state.stream_epoch, r.state.stream_position});
    packer->load_state(r.state.packer_state);
    if (grid.rank() == 0) {
      spdlog::info("resumed from {} at step {} (written by wlb4d {} on dp={} pp={} cp={} tp={})", *path, step,
                   r.info.program_version, r.info.layout[0], r.info.layout[1], r.info.layout[2], r.info.layout[3]);
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
  I.tlog = std::make_unique<io::TimingLog>(cfg.log.timing_file, cfg.log.csv_file, grid.world(), rr);
}

Trainer::~Trainer() = default;

std::int64_t Trainer::current_step() const { return impl_->step; }

StepResult Trainer::step() {
  auto& I = *impl_;
  const auto& cfg = I.cfg;
  const auto& g = I.grid;
  io::TimingRecord rec;
  rec.step = I.step;
  rec.rank = g.rank();
  rec.dp = g.dp_rank();
  rec.pp = g.pp_rank();
  rec.cp = g.cp_rank();
  rec.tp = g.tp_rank();
  Kokkos::fence();
  const double t_start = now();

  // 1. Plan: identical on every rank (same stream, same packer).
  double t0 = now();
  balance::StepPlan plan = I.packer->plan_step(I.step, I.source);
  I.tokens_seen += plan.tokens;
  const auto metrics = balance::step_metrics(plan, I.cost, g.cp_size());
  rec.time[io::kPlan] = now() - t0;

  // 2-4. Local batches, pipeline forward/backward (gradients accumulate).
  for (auto& chunk : I.exec->chunks()) chunk->zero_grad();
  const auto& mine = plan.micro_batches.at(std::size_t(g.dp_rank()));
  const auto& shard = plan.sharding.at(std::size_t(g.dp_rank()));
  t0 = now();
  I.exec->load(I.train_ds, mine, shard);
  rec.time[io::kData] = now() - t0;
  const double grad_scale = plan.target_tokens > 0 ? 1.0 / double(plan.target_tokens) : 0.0;
  double loss_sum = I.exec->run(/*backward=*/true, grad_scale, rec);

  // 5. Gradients: sum over DP×CP (each replica holds partial sums).
  Kokkos::fence();
  t0 = now();
  if (g.dpcp().size() > 1)
    for (auto& chunk : I.exec->chunks()) g.dpcp().allreduce(chunk->params().grads());
  Kokkos::fence();
  rec.time[io::kDPReduce] = now() - t0;

  // 6. Global grad norm (each element once: TP-replicated tensors only on
  //    tp rank 0; stages summed over PP), clip, AdamW.
  t0 = now();
  double sumsq = 0;
  for (auto& chunk : I.exec->chunks())
    for (const auto& p : chunk->params())
      if (!p.tp_replicated || g.tp_rank() == 0) sumsq += optim::sum_of_squares(p.grad);
  sumsq = g.tp().allreduce_value(sumsq);
  sumsq = g.pp().allreduce_value(sumsq);
  const double gnorm = std::sqrt(sumsq);
  loss_sum = g.dpcp().allreduce_value(loss_sum);
  if (g.pp_size() > 1) {  // the loss lives on the last stage
    double l = g.is_last_stage() ? loss_sum : 0.0;
    loss_sum = g.pp().allreduce_value(l);
  }
  const double loss = plan.target_tokens > 0 ? loss_sum / double(plan.target_tokens) : 0.0;
  if (!std::isfinite(loss) || !std::isfinite(gnorm)) {
    std::string where = !std::isfinite(loss) ? "the loss" : "the global gradient norm";
    for (auto& chunk : I.exec->chunks())
      for (const auto& p : chunk->params())
        if (!std::isfinite(optim::sum_of_squares(p.grad))) {
          where = "gradient of " + p.name;
          break;
        }
    throw core::NumericsError("non-finite value at step " + std::to_string(I.step) + " in " + where +
                              " (loss " + std::to_string(loss) + ", grad norm " + std::to_string(gnorm) + ")");
  }
  const double lr = optim::lr_at(cfg.optim, int(I.step), cfg.train.steps);
  optim::AdamWStep as;
  as.lr = lr;
  as.beta1 = cfg.optim.beta1;
  as.beta2 = cfg.optim.beta2;
  as.eps = cfg.optim.eps;
  as.grad_scale = optim::clip_factor(gnorm, cfg.optim.grad_clip);
  as.t = I.step + 1;
  for (std::size_t c = 0; c < I.exec->chunks().size(); ++c) {
    auto& reg = I.exec->chunks()[c]->params();
    for (const auto& p : reg) {
      as.weight_decay = p.decay ? cfg.optim.weight_decay : 0.0;
      const auto r = std::make_pair(p.offset, p.offset + std::size_t(p.local_numel()));
      optim::adamw_update(p.value, p.grad, Kokkos::subview(I.m[c], r), Kokkos::subview(I.v[c], r), as);
    }
  }
  Kokkos::fence();
  rec.time[io::kOptimizer] = now() - t0;

  StepResult res;
  res.step = I.step;
  res.loss = loss;
  res.grad_norm = gnorm;
  res.lr = lr;
  res.tokens = plan.tokens;
  res.target_tokens = plan.target_tokens;
  std::int64_t pairs = 0;
  for (const auto& rep : plan.micro_batches)
    for (const auto& mb : rep) pairs += attention_pairs(mb);
  res.model_flops = model::model_flops(cfg.model, I.vocab, plan.tokens, pairs);
  ++I.step;

  if (cfg.train.eval_every > 0 && I.val_ds && (I.step % cfg.train.eval_every == 0 || I.step == cfg.train.steps)) {
    t0 = now();
    res.val_loss = evaluate();
    rec.time[io::kEval] = now() - t0;
  }
  Kokkos::fence();
  rec.time[io::kTotal] = now() - t_start;
  res.seconds = g.world().allreduce_value(rec.time[io::kTotal], comm::ReduceOp::Max);
  rec.loss = loss;
  rec.val_loss = res.val_loss;
  rec.grad_norm = gnorm;
  rec.lr = lr;
  rec.tokens = plan.tokens;
  rec.local_tokens = I.exec->local_tokens();
  rec.gflops = res.seconds > 0 ? res.model_flops / res.seconds * 1e-9 : 0;
  rec.attn_imbalance = metrics.attention_imbalance;
  rec.latency_imbalance = metrics.latency_imbalance;
  rec.cp_imbalance = metrics.cp_imbalance;
  rec.delay_mean = metrics.mean_delay_steps;
  rec.delay_max = double(metrics.max_delay_steps);
  res.record = rec;
  return res;
}

double Trainer::evaluate() {
  auto& I = *impl_;
  if (!I.val_ds) throw core::ConfigError("evaluation needs data.val (a validation dataset)");
  const auto& g = I.grid;
  if (I.val_mbs.empty()) {
    // Fixed order, fixed packing: the first eval_tokens tokens of the validation
    // documents, concatenated and cut at max_seq_len, micro-batches dealt to DP replicas.
    const std::int64_t S = I.cfg.train.max_seq_len;
    std::int64_t budget = I.cfg.train.eval_tokens;
    balance::MicroBatch cur;
    for (std::int64_t d = 0; d < I.val_ds->num_docs() && budget > 0; ++d) {
      std::int64_t len = std::min<std::int64_t>(I.val_ds->doc_length(d), budget), off = 0;
      while (len > 0) {
        const std::int64_t take = std::min(len, S - cur.tokens());
        cur.spans.push_back({d, off, take});
        off += take;
        len -= take;
        budget -= take;
        if (cur.tokens() == S) {
          I.val_mbs.push_back(cur);
          cur.spans.clear();
        }
      }
    }
    if (!cur.spans.empty()) I.val_mbs.push_back(cur);
    for (const auto& mb : I.val_mbs) I.val_targets += mb.target_tokens();
  }
  // Replica r evaluates micro-batches r, r+dp, ...; every replica runs the same count
  // (pipeline ranks must agree), padding with nothing when the count is uneven.
  std::vector<balance::MicroBatch> mine;
  for (std::size_t i = std::size_t(g.dp_rank()); i < I.val_mbs.size(); i += std::size_t(g.dp_size()))
    mine.push_back(I.val_mbs[i]);
  double loss_sum = 0;
  // Evaluate in groups the executor can hold (its workspace slots).
  const std::size_t per_round = std::size_t(I.cfg.train.micro_batches / g.dp_size());
  const std::size_t rounds = (I.val_mbs.size() + per_round * g.dp_size() - 1) / (per_round * g.dp_size());
  io::TimingRecord scratch;
  for (std::size_t r = 0; r < rounds; ++r) {
    std::vector<balance::MicroBatch> group;
    for (std::size_t i = r * per_round; i < std::min(mine.size(), (r + 1) * per_round); ++i) group.push_back(mine[i]);
    std::vector<balance::Sharding> sh(group.size(), balance::Sharding::Sequence);
    I.exec->load(*I.val_ds, group, sh);
    loss_sum += I.exec->run(/*backward=*/false, 0.0, scratch);
  }
  loss_sum = g.dpcp().allreduce_value(loss_sum);
  if (g.pp_size() > 1) loss_sum = g.pp().allreduce_value(g.is_last_stage() ? loss_sum : 0.0);
  return I.val_targets > 0 ? loss_sum / double(I.val_targets) : 0.0;
}

StepResult Trainer::run() {
  auto& I = *impl_;
  const auto& g = I.grid;
  StepResult last;
  double window_tokens = 0, window_s = 0, window_flops = 0;
  const auto& ck = I.cfg.checkpoint;
  bool stop = false;
  while (I.step < I.cfg.train.steps && !stop) {
    last = step();
    // Checkpoint decision, agreed by every rank (clocks and signals are per rank):
    // 1 = every_minutes elapsed, 2 = SIGTERM/SIGUSR1 (checkpoint, then stop).
    int urgent = (ck.every_minutes > 0 && now() - I.last_ckpt_time >= 60.0 * ck.every_minutes) ? 1 : 0;
    if (core::stop_signal() != 0) urgent = 2;
    urgent = g.world().allreduce_value(urgent, comm::ReduceOp::Max);
    stop = urgent == 2;
    if ((ck.every > 0 && I.step % ck.every == 0) || urgent > 0 || (ck.at_end && I.step == I.cfg.train.steps)) {
      const double t0 = now();
      I.save_checkpoint();
      last.record.time[io::kCheckpoint] = now() - t0;
      last.record.time[io::kTotal] += last.record.time[io::kCheckpoint];
    }
    window_tokens += double(last.tokens);
    window_s += last.seconds;
    window_flops += last.model_flops;
    std::vector<io::TimingRecord> all = I.tlog->append(last.record);
    const bool print = (last.step + 1) % I.cfg.train.print_every == 0 || last.step == 0 ||
                       last.step + 1 == I.cfg.train.steps || last.val_loss >= 0;
    if (print && g.rank() == 0) {
      double tmin = 1e300, tmax = 0, tsum = 0, cmax = 0, csum = 0;
      for (const auto& r : all) {
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
      std::string val = last.val_loss >= 0 ? fmt::format(" | val {:.4f}", last.val_loss) : "";
      spdlog::info(
          "step {:>5}/{} | loss {:.4f}{} | lr {:.2e} | gnorm {:.3f} | {:.0f} tok/s | {:.2f} GFLOP/s | {:.0f} ms"
          " | compute min/mean/max {:.0f}/{:.0f}/{:.0f} ms | imbalance attn {:.2f} lat {:.2f} cpu {:.2f}",
          last.step + 1, I.cfg.train.steps, last.loss, val, last.lr, last.grad_norm, window_tokens / window_s,
          window_flops / window_s * 1e-9, last.seconds * 1e3, tmin * 1e3, tsum / double(all.size()) * 1e3,
          tmax * 1e3, last.record.attn_imbalance, last.record.latency_imbalance, cpu_imb);
      window_tokens = window_s = window_flops = 0;
    }
  }
  // Run summary: peak resident memory per rank (getrusage, KiB on Linux).
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const double rss_mib = double(ru.ru_maxrss) / 1024.0;
  const double rss_max = g.world().allreduce_value(rss_mib, comm::ReduceOp::Max);
  const double rss_min = g.world().allreduce_value(rss_mib, comm::ReduceOp::Min);
  if (stop && g.rank() == 0)
    spdlog::warn("stop requested (SIGTERM/SIGUSR1): checkpoint written after step {}", I.step);
  if (g.rank() == 0 && I.cfg.train.steps > 0)
    spdlog::info("done: {} steps | peak memory per rank {:.0f}-{:.0f} MiB | final loss {:.4f}{}", I.step, rss_min,
                 rss_max, last.loss, last.val_loss >= 0 ? fmt::format(" | val {:.4f}", last.val_loss) : "");
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
