// Cluster-scale simulator behind wlb4d-plan (see simulate.hpp).
#include "wlb4d/plan/simulate.hpp"

#include "wlb4d/balance/attention_tasks.hpp"
#include "wlb4d/balance/doc_source.hpp"
#include "wlb4d/balance/packer.hpp"
#include "wlb4d/balance/sharding.hpp"
#include "wlb4d/core/device_table.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/memory.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <sstream>

namespace wlb::plan {

using namespace wlb::balance;
using namespace wlb::pipeline;  // schedules, stage times and the memory model the trainer runs

namespace {

std::vector<std::string> words(const std::string& s) {
  std::istringstream is(s);
  std::vector<std::string> out;
  for (std::string w; is >> w;) out.push_back(w);
  return out;
}

constexpr double kMaxPlanTokens = 2e10;

double ring_allgather(double alpha, double beta, int g, double bytes_per_rank) {
  return g <= 1 ? 0.0 : (g - 1) * (alpha + beta * bytes_per_rank);
}

}  // namespace

double plan_gemm_flops(const core::Config& cfg) { return CostModel::gemm_flops_per_s(cfg); }

double plan_peak_flops(const core::Config& cfg) {
  return cfg.log.peak_tflops > 0 ? cfg.log.peak_tflops * 1e12 : core::device_peak_flops(cfg);
}

std::string device_line(const core::Config& cfg) {
  const auto& p = cfg.plan;
  const std::string& prec = cfg.train.precision;
  const core::DeviceSpec* dev = core::find_device(p.device);
  const bool rate_given = prec == "bf16" ? (p.flops_per_s_bf16 > 0 || (!dev && p.flops_per_s > 0)) : p.flops_per_s > 0;
  const std::string rate_src =
      rate_given ? (prec == "bf16" && p.flops_per_s_bf16 > 0 ? "plan.flops_per_s_bf16" : "plan.flops_per_s")
      : dev      ? fmt::format("{} peak x plan.gemm_efficiency {}", prec, p.gemm_efficiency)
                 : fmt::format("assumed: no plan.device, no plan.flops_per_s");
  const std::string mem_src = p.device_memory_gib > 0 ? "plan.device_memory_gib"
                              : dev ? fmt::format("{} GB", dev->memory_gb)
                                    : "assumed: no plan.device, no plan.device_memory_gib";
  std::string out = dev ? fmt::format("device: plan.device={} ({}), precision {}: peak {:.4g} TFLOP/s", dev->key,
                                      dev->name, prec, dev->peak_flops(prec) * 1e-12)
                        : fmt::format("device: none (plan.device empty), precision {}", prec);
  out += fmt::format("; GEMM rate {:.4g} FLOP/s ({}); memory {:.4g} GiB ({})", plan_gemm_flops(cfg), rate_src,
                     core::device_memory_gib(cfg), mem_src);
  const double peak = plan_peak_flops(cfg);
  if (cfg.log.peak_tflops > 0)
    out += fmt::format("; MFU peak {:.4g} TFLOP/s (log.peak_tflops)", cfg.log.peak_tflops);
  else if (peak <= 0)
    out += "; no MFU (no peak known: set plan.device or log.peak_tflops)";
  return out + "\n";
}

// The trainer's untimed model (the planner cannot time kernels: with
// balance.calibrate=true it plans with the FLOP profile, as the trainer does
// when a calibration is degenerate).
CostModel plan_cost_model(const core::Config& cfg) { return CostModel::from_config(cfg); }

StepModel StepModel::uniform(const core::Config& cfg) {
  StepModel s;
  s.tp = s.cp = s.pp = s.dp = Link{cfg.plan.alpha_s, cfg.plan.beta_s_per_byte};
  return s;
}

StepModel StepModel::cluster(const core::Config& cfg) {
  const auto& p = cfg.parallel;
  const Link intra{cfg.plan.intra_alpha_s, cfg.plan.intra_beta_s_per_byte};
  const Link inter{cfg.plan.alpha_s, cfg.plan.beta_s_per_byte};
  const int n = cfg.plan.devices_per_node;
  // Grid order (DESIGN §4): TP innermost, then CP, DP, PP: a group spans the
  // ranks [0, product of its own and the inner axes).
  auto link = [&](long span) { return span <= n ? intra : inter; };
  StepModel s;
  s.tp = link(long(p.tp));
  s.cp = link(long(p.tp) * p.cp);
  s.dp = link(long(p.tp) * p.cp * p.dp);
  s.pp = link(long(p.tp) * p.cp * p.dp * p.pp);  // some stage boundary crosses nodes unless all fit one
  s.tp_comm = true;
  s.recompute = true;
  s.head_params = double(plan_vocab(cfg)) * cfg.model.d_model;
  return s;
}

std::vector<std::vector<Action>> planner_action_lists(const core::ParallelConfig& par, int m) {
  std::vector<std::vector<Action>> lists;
  for (int r = 0; r < par.pp; ++r) lists.push_back(training_action_list(par, r, m, /*backward=*/true));
  return lists;
}

namespace {

/// Communication charged per pipeline (all ranks together, seconds).
struct CommTotals {
  double tp = 0, cp = 0, pp = 0;
};

/// Per micro-batch and global chunk: forward and backward seconds, and the
/// p2p time of its messages (see the model in simulate.hpp).
StageTimes replica_times(const std::vector<MicroBatch>& mbs, const std::vector<Sharding>& sharding,
                         const core::Config& cfg, const CostModel& cost, const std::vector<int>& layers,
                         const StepModel& sm, CommTotals& totals,
                         const std::vector<std::vector<double>>* attn_override = nullptr,
                         const std::vector<double>* ca_exchange = nullptr,
                         const std::vector<std::vector<double>>* ca_home = nullptr) {
  const auto& par = cfg.parallel;
  const auto& m = cfg.model;
  const double kv_local = std::max(1, m.kv_heads / par.tp);
  const std::size_t K = layers.size();
  const bool full = sm.recompute && m.recompute == "full";
  const double head_ratio = sm.head_params / double(m.layer_matmul_params());
  StageTimes t;
  for (std::size_t i = 0; i < mbs.size(); ++i) {
    const auto& mb = mbs[i];
    // Disaggregated: each CP rank's attention is what the group's assignment gave it.
    const auto attn = attn_override ? (*attn_override)[i] : cost.rank_attention(mb, par.cp, sharding[i]);
    const double cax = ca_exchange ? (*ca_exchange)[i] : 0.0;
    const auto tok = shard_tokens(mb, par.cp, sharding[i]);
    double f = 0, b = 0, w = 0, head = 0;
    for (int c = 0; c < par.cp; ++c) {
      const double lin = cost.c + cost.a * static_cast<double>(tok[static_cast<std::size_t>(c)].size());
      head = std::max(head, cost.a * head_ratio * static_cast<double>(tok[static_cast<std::size_t>(c)].size()));
      const double at = attn[static_cast<std::size_t>(c)];
      // Disaggregated: half the exchange goes each pass; ping-pong hides it
      // behind the attention of the rank's own kept tasks (ca_exchange.hpp).
      const double kept = ca_home ? (*ca_home)[i][static_cast<std::size_t>(c)] : 0.0;
      const double xf = std::max(0.0, cax / 2 - kept / 3.5), xb = std::max(0.0, cax / 2 - kept * 2.5 / 3.5);
      f = std::max(f, lin / 3.0 + at / 3.5 + xf);
      // B: the input-gradient GEMMs (= forward GEMMs) and the attention
      // backward; W: the weight-gradient GEMMs (= forward GEMMs).
      b = std::max(b, lin / 3.0 + at * 2.5 / 3.5 + xb);
      w = std::max(w, lin / 3.0);
    }
    const double T = static_cast<double>(mb.tokens());
    const double kv_bytes = T / par.cp * 2.0 * kv_local * m.head_dim() * 2.0;
    const double ag = ring_allgather(sm.cp.alpha_s, sm.cp.beta_s_per_byte, par.cp, kv_bytes);
    // Two TP all-reduces of the CP shard's activations (bf16) per layer pass.
    const double act_bytes = T / par.cp * m.d_model * 2.0;
    const double ar = (sm.tp_comm && par.tp > 1)
                          ? 2.0 * 2.0 * (par.tp - 1) * (sm.tp.alpha_s + sm.tp.beta_s_per_byte * act_bytes / par.tp)
                          : 0.0;
    const double fwd = f + ag + ar;
    const double bwd = b + ag + ar + (full ? fwd : 0.0);
    t.forward.emplace_back(K);
    t.backward.emplace_back(K);
    t.weight.emplace_back(K);
    for (std::size_t k = 0; k < K; ++k) {
      t.forward.back()[k] = layers[k] * fwd;
      t.backward.back()[k] = layers[k] * bwd;
      t.weight.back()[k] = layers[k] * w;
      if (k + 1 == K) {  // the LM head on the last chunk (TP-split, like the layers' GEMMs)
        t.forward.back()[k] += head / 3.0;
        t.backward.back()[k] += head / 3.0;  // not a layer: recompute does not re-run it
        t.weight.back()[k] += head / 3.0;
      }
      totals.tp += layers[k] * ar * (full ? 3.0 : 2.0);
      totals.cp += layers[k] * (ag * (full ? 3.0 : 2.0) + cax * (full ? 1.5 : 1.0));
    }
    t.p2p.push_back(sm.pp.alpha_s + sm.pp.beta_s_per_byte * T / (par.cp * par.tp) * m.d_model * 2.0);
    // Forward activation and backward gradient, at each of K-1 chunk boundaries.
    totals.pp += 2.0 * double(K - 1) * t.p2p.back();
  }
  return t;
}

}  // namespace

StepTime simulate_step_time(const StepPlan& plan, const core::Config& cfg, const CostModel& cost) {
  return simulate_step_time(plan, cfg, cost, StepModel::uniform(cfg));
}

StepTime simulate_step_time(const StepPlan& plan, const core::Config& cfg, const CostModel& cost,
                            const StepModel& sm) {
  const auto& par = cfg.parallel;
  const auto& m = cfg.model;
  const int v = par.virtual_stages, K = par.pp * v;
  if (m.layers < K)
    throw core::ConfigError(fmt::format("model.layers={} must be >= parallel.pp*parallel.virtual_stages={}", m.layers, K));
  std::vector<int> layers;
  for (int k = 0; k < K; ++k) layers.push_back(chunk_layers(m.layers, K, k).size());
  StepTime out;
  // Disaggregated attention: per replica, micro-batch and CP rank, the
  // assigned attention cost, and per micro-batch the exchange seconds per layer.
  std::vector<std::vector<std::vector<double>>> ca_attn;
  std::vector<std::vector<double>> ca_x;
  std::vector<std::vector<std::vector<double>>> ca_home;
  if (sm.disaggregated_attention) {
    const double hq = double(m.heads) / par.tp, kv = std::max(1, m.kv_heads / par.tp), D = m.head_dim();
    const balance::AttentionTraffic traffic{4.0 * hq * D * 2.0 + hq * 4.0, 4.0 * kv * D * 2.0};
    const auto slots = balance::disaggregate_step(plan, par.cp, cost, traffic, sm.ca_task_tokens, sm.ca_tolerance);
    ca_attn.resize(plan.micro_batches.size());
    ca_x.resize(plan.micro_batches.size());
    ca_home.resize(plan.micro_batches.size());
    for (std::size_t d = 0; d < plan.micro_batches.size(); ++d) {
      ca_attn[d].resize(plan.micro_batches[d].size());
      ca_x[d].resize(plan.micro_batches[d].size());
      ca_home[d].resize(plan.micro_batches[d].size());
    }
    double before = 0, after = 0;
    for (std::size_t j = 0; j < slots.size(); ++j) {
      const auto& sl = slots[j];
      const double most = *std::max_element(sl.bytes_in.begin(), sl.bytes_in.end());
      const double x = most > 0 ? sm.dp.alpha_s + sm.dp.beta_s_per_byte * most : 0.0;
      for (std::size_t k = 0; k < sl.replicas.size(); ++k) {
        const auto d = static_cast<std::size_t>(sl.replicas[k]);
        ca_attn[d][j].assign(sl.cost_after.begin() + long(k) * par.cp, sl.cost_after.begin() + long(k + 1) * par.cp);
        ca_x[d][j] = x;
        ca_home[d][j].assign(sl.cost_home.begin() + long(k) * par.cp, sl.cost_home.begin() + long(k + 1) * par.cp);
      }
      auto imb = [](const std::vector<double>& v) {
        double sum = 0, mx = 0;
        for (double c : v) sum += c, mx = std::max(mx, c);
        return sum > 0 ? mx * double(v.size()) / sum : 1.0;
      };
      before += imb(sl.cost_before);
      after += imb(sl.cost_after);
      out.ca_bytes_per_layer += most;
    }
    if (!slots.empty()) {
      out.ca_imbalance_before = before / double(slots.size());
      out.ca_imbalance_after = after / double(slots.size());
    }
  }
  for (std::size_t r = 0; r < plan.micro_batches.size(); ++r) {
    const int n = static_cast<int>(plan.micro_batches[r].size());
    if (n == 0) continue;
    CommTotals tot;
    const StageTimes t = replica_times(plan.micro_batches[r], plan.sharding[r], cfg, cost, layers, sm, tot,
                                       sm.disaggregated_attention ? &ca_attn[r] : nullptr,
                                       sm.disaggregated_attention ? &ca_x[r] : nullptr,
                                       sm.disaggregated_attention ? &ca_home[r] : nullptr);
    const auto res = simulate_schedule(planner_action_lists(par, n), par.pp, v, t, 0.0, P2PMode::Eager);
    if (res.makespan > out.seconds) {
      out.seconds = res.makespan;
      out.bubble_fraction = res.bubble_fraction();
      out.tp_s = tot.tp / par.pp;
      out.cp_s = tot.cp / par.pp;
      out.pp_s = tot.pp / par.pp;
    }
  }
  // Gradient all-reduce of one stage's layer parameters over dp·cp (bf16);
  // ZeRO-1's reduce-scatter + all-gather moves the same bytes.
  const double bytes = 2.0 * double(m.layer_matmul_params()) * layers[0] * v / par.tp;
  const int g = par.dp * par.cp;
  if (g > 1) {
    out.dp_s = 2.0 * (g - 1) * sm.dp.alpha_s + 2.0 * (g - 1) / g * bytes * sm.dp.beta_s_per_byte;
    out.seconds += out.dp_s;
  }
  return out;
}

std::int64_t plan_vocab(const core::Config& cfg) { return cfg.model.vocab_size > 0 ? cfg.model.vocab_size : 32000; }

std::vector<MemoryRow> memory_table(const core::Config& cfg, std::int64_t vocab) {
  const double budget = core::device_memory_gib(cfg) * 1024.0 * 1024.0 * 1024.0;
  auto row = [&](const core::Config& c, const std::string& name) {
    MemoryRow r;
    r.setting = name;
    const auto stages = predict_memory_stages(c, vocab);
    for (const auto& e : stages) {
      r.stage_bytes.push_back(e.total());
      r.peak_bytes = std::max(r.peak_bytes, e.total());
    }
    const auto worst = max_memory(stages);
    r.terms = fmt::format("pp rank {}: {}", worst.pp_rank, format_memory(worst));
    r.fits = r.peak_bytes <= budget;
    return r;
  };
  auto name = [](const core::Config& c) {
    return fmt::format("recompute={}{} zero={} sp={}", c.model.recompute,
                       c.model.recompute_layers > 0 ? fmt::format("({} layers)", c.model.recompute_layers) : "",
                       c.parallel.zero, c.parallel.sequence_parallel ? "on" : "off");
  };
  std::vector<MemoryRow> out{row(cfg, "deck: " + name(cfg))};
  for (const char* rc : {"none", "selective", "full"})
    for (int z : {0, 1})
      for (int sp = 0; sp <= (cfg.parallel.tp > 1 ? 1 : 0); ++sp) {
        core::Config c = cfg;
        c.model.recompute = rc;
        c.model.recompute_layers = 0;
        c.parallel.zero = z;
        c.parallel.sequence_parallel = sp == 1;
        out.push_back(row(c, name(c)));
      }
  return out;
}

double planner_host_bytes(const core::Config& cfg, double mean_length) {
  const auto& par = cfg.parallel;
  const double T = double(std::max<std::int64_t>(cfg.train.max_seq_len, cfg.balance.max_tokens));
  const double tokens = double(cfg.train.micro_batches) * T;                  // one step, all replicas
  const double spans = tokens / std::max(1.0, mean_length) + 2.0 * cfg.train.micro_batches;
  const double m = double(cfg.train.micro_batches) / std::max(1, par.dp);
  const double actions = 6.0 * m * par.virtual_stages * par.pp * par.pp;     // every rank's list
  // Span 24 B; CP token lists 8 B per token (shard_tokens); Action 16 B, and
  // the schedule builder's global event list about as much again.
  return spans * 24.0 * 2 + tokens * 8.0 + actions * 16.0 * 2;
}

void check_plan_bounds(const core::Config& cfg, const std::vector<std::int64_t>& lengths, double rows) {
  if (lengths.empty()) throw core::DataError("wlb4d-plan: plan.lengths holds no document lengths");
  {
    double sum = 0;
    for (auto l : lengths) sum += double(l);
    const double need = planner_host_bytes(cfg, sum / double(lengths.size()));
    const double have = double(core::available_host_bytes());
    if (have > 0 && need > have)
      throw core::ConfigError(fmt::format(
          "wlb4d-plan: simulating one step of train.micro_batches={} x {} tokens (parallel.dp={}, pp={}, "
          "virtual_stages={}) needs about {} of host memory, but MemAvailable (/proc/meminfo) is {}: lower "
          "train.micro_batches, train.max_seq_len/balance.max_tokens or parallel.dp",
          cfg.train.micro_batches, std::max<std::int64_t>(cfg.train.max_seq_len, cfg.balance.max_tokens),
          cfg.parallel.dp, cfg.parallel.pp, cfg.parallel.virtual_stages, core::format_bytes(need),
          core::format_bytes(have)));
  }
  // Work bound: the simulation walks every token of every simulated step
  // (packing, CP shards); about 1e9 tokens per CPU second here.
  const double T = double(std::max<std::int64_t>(cfg.train.max_seq_len, cfg.balance.max_tokens));
  const double work = double(cfg.plan.steps) * rows * double(cfg.train.micro_batches) * T;
  if (work > kMaxPlanTokens)
    throw core::ConfigError(fmt::format(
        "wlb4d-plan: plan.steps={} x {:.0f} rows x train.micro_batches={} x {:.0f} tokens = {:.3g} simulated "
        "tokens exceeds the planner's bound of {:.3g} (minutes of work): lower plan.steps, "
        "train.micro_batches or train.max_seq_len/balance.max_tokens",
        cfg.plan.steps, rows, cfg.train.micro_batches, T, work, kMaxPlanTokens));
}

PlanReport simulate_plan(const core::Config& cfg, const std::vector<std::int64_t>& lengths) {
  const auto attentions = words(cfg.plan.attention);
  check_plan_bounds(cfg, lengths,
                    double(words(cfg.plan.packers).size() * words(cfg.plan.shardings).size() *
                               std::max<std::size_t>(1, attentions.size()) + 1));
  PlanReport rep;
  rep.vocab = plan_vocab(cfg);
  rep.memory = memory_table(cfg, rep.vocab);
  rep.cost = plan_cost_model(cfg);
  const auto packers = words(cfg.plan.packers);
  const auto shardings = words(cfg.plan.shardings);
  if (packers.empty()) throw core::ConfigError("plan.packers must name at least one of fixed greedy wlb");
  if (shardings.empty())
    throw core::ConfigError("plan.shardings must name at least one of sequence document adaptive");
  PackerParams base = PackerParams::from_config(cfg);  // validates the deck's own packer settings
  for (const auto& p : packers) {
    base.kind = p;
    base.validate();
  }
  for (const auto& s : shardings) {
    base.sharding = s;
    base.validate();
  }
  // Resolve wlb thresholds once.
  if (cfg.balance.outlier_thresholds == "auto") {
    PackerParams w = base;
    w.kind = "wlb";
    rep.thresholds = choose_outlier_thresholds(sample_lengths(lengths, 20000, cfg.train.seed ^ 0x5eed), w, rep.cost);
  } else {
    rep.thresholds = parse_thresholds(cfg.balance.outlier_thresholds);
  }

  auto run = [&](const std::string& kind, const std::string& sharding, const std::string& attention = "local") {
    StepModel sm = StepModel::uniform(cfg);
    sm.disaggregated_attention = attention == "disaggregated";
    sm.ca_task_tokens = cfg.plan.ca_task_tokens;
    sm.ca_tolerance = cfg.plan.ca_tolerance;
    PackerParams p = base;
    p.kind = kind;
    p.sharding = sharding;
    p.thresholds = kind == "wlb" ? rep.thresholds : std::vector<std::int64_t>{};
    auto packer = make_packer(p, rep.cost);
    SampledDocSource src(lengths, cfg.train.seed);
    std::vector<StepMetrics> ms;
    PlanRow row;
    row.packer = kind;
    row.sharding = sharding;
    row.attention = attention;
    double time = 0, bubble = 0, plan_s = 0, ca_before = 0, ca_after = 0, ca_bytes = 0;
    for (int s = 0; s < cfg.plan.steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      const StepPlan plan = packer->plan_step(s, src);
      plan_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ms.push_back(step_metrics(plan, rep.cost, cfg.parallel.cp));
      const auto st = simulate_step_time(plan, cfg, rep.cost, sm);
      time += st.seconds;
      bubble += st.bubble_fraction;
      ca_before += st.ca_imbalance_before;
      ca_after += st.ca_imbalance_after;
      ca_bytes += st.ca_bytes_per_layer;
    }
    const double n = std::max(1, cfg.plan.steps);
    row.metrics = summarize(ms);
    row.step_time_s = time / n;
    row.bubble_fraction = bubble / n;
    row.plan_ms = plan_s / n * 1e3;
    row.ca_imbalance_before = ca_before / n;
    row.ca_imbalance_after = ca_after / n;
    row.ca_bytes_per_layer = ca_bytes / n;
    row.tokens_per_s = row.step_time_s > 0 ? row.metrics.tokens_per_step / row.step_time_s : 0;
    row.mem_peak_bytes = rep.memory.front().peak_bytes;  // the trainer's workspaces do not depend on the packer
    return row;
  };
  const PlanRow baseline = run("fixed", "sequence");
  for (const auto& a : attentions) {
    for (const auto& p : packers) {
      for (const auto& s : shardings) {
        PlanRow row = (p == "fixed" && s == "sequence" && a == "local") ? baseline : run(p, s, a);
        row.speedup = row.step_time_s > 0 ? baseline.step_time_s / row.step_time_s : 1.0;
        rep.rows.push_back(row);
      }
    }
  }
  return rep;
}

std::string format_table(const PlanReport& rep, const core::Config& cfg) {
  std::string out;
  const auto& par = cfg.parallel;
  out += fmt::format(
      "wlb4d-plan: {} layers, d_model {}, (tp, cp, pp, dp) = ({}, {}, {}, {}), schedule {}, {} micro-batches x {} "
      "tokens, max_tokens {}, {} steps\n",
      cfg.model.layers, cfg.model.d_model, par.tp, par.cp, par.pp, par.dp, par.schedule, cfg.train.micro_batches,
      cfg.train.max_seq_len, cfg.balance.max_tokens > 0 ? cfg.balance.max_tokens : cfg.train.max_seq_len,
      cfg.plan.steps);
  out += device_line(cfg);
  out += fmt::format("cost model per layer (fwd+bwd): a = {:.4g} s/token, b = {:.4g} s/token^2, c = {:.4g} s; "
                     "attention = linear at d = {:.0f} tokens\n",
                     rep.cost.a, rep.cost.b, rep.cost.c, rep.cost.breakpoint());
  std::string th;
  for (auto x : rep.thresholds) th += fmt::format("{}{}", th.empty() ? "" : " ", x);
  out += fmt::format("wlb outlier thresholds: {} (balance.outlier_thresholds = {}), max_delay {} steps\n\n",
                     th.empty() ? "none" : th, cfg.balance.outlier_thresholds, cfg.balance.max_delay);
  const double gib = 1024.0 * 1024.0 * 1024.0, budget = core::device_memory_gib(cfg);
  out += fmt::format("{:<7} {:<9} {:>8} {:>8} {:>7} {:>7} {:>10} {:>8} {:>7} {:>6} {:>6} {:>9} {:>9}\n", "packer",
                     "sharding", "lat_ID", "attn_ID", "cp_ID", "bubble", "step_s", "speedup", "delay", "maxdel", "tok/st",
                     "plan_ms", "mem_GiB");
  for (const auto& r : rep.rows) {
    const double g = r.mem_peak_bytes / gib;
    out += fmt::format("{:<7} {:<9} {:>8.3f} {:>8.3f} {:>7.3f} {:>7.3f} {:>10.4f} {:>7.3f}x {:>7.3f} {:>6} {:>5.0f}K {:>9.3f} "
                       "{:>9.2f}{}\n",
                       r.packer, r.sharding, r.metrics.latency_imbalance, r.metrics.attention_imbalance,
                       r.metrics.cp_imbalance, r.bubble_fraction, r.step_time_s, r.speedup, r.metrics.mean_delay_steps,
                       r.metrics.max_delay_steps, r.metrics.tokens_per_step / 1024.0, r.plan_ms, g,
                       g > budget ? " > device" : "");
    if (r.attention == "disaggregated") {
      out.pop_back();
      out += fmt::format("  | disaggregated attention: group-rank attn_ID {:.3f} -> {:.3f}, exchange {:.1f} MiB/layer\n",
                         r.ca_imbalance_before, r.ca_imbalance_after, r.ca_bytes_per_layer / (1024.0 * 1024.0));
    }
  }
  out += fmt::format("\nmemory per rank (predicted peak, {}, vocabulary {}{}; device memory {:.4g} GiB):\n",
                     cfg.train.precision, rep.vocab, cfg.model.vocab_size > 0 ? "" : " assumed: model.vocab_size = 0", budget);
  std::string hdr;
  for (int r = 0; r < cfg.parallel.pp; ++r) hdr += fmt::format(" {:>8}", fmt::format("pp{}", r));
  out += fmt::format("{:<48}{} {:>9}  {}\n", "setting", hdr, "max_GiB", "fits");
  for (const auto& m : rep.memory) {
    std::string st;
    for (double b : m.stage_bytes) st += fmt::format(" {:>8.2f}", b / gib);
    out += fmt::format("{:<48}{} {:>9.2f}  {}\n", m.setting, st, m.peak_bytes / gib,
                       m.fits ? "yes" : fmt::format("NO (> {:.4g} GiB)", budget));
  }
  out += fmt::format("deck setting, largest stage: {}\n", rep.memory.front().terms);
  out += "\nlat_ID: max x n / total per-micro-batch latency (paper Table 2); attn_ID: max/mean sum d^2; cp_ID: CP-rank\n"
         "causal-work imbalance; bubble: pipeline idle fraction (parallel.schedule); speedup over fixed+sequence; delay: token-weighted mean\n"
         "wait (steps); tok/st: tokens per step; mem_GiB: predicted peak per rank with the deck's recompute/zero/sp\n"
         "(max over ranks; '> device': above the device memory, plan.device_memory_gib or plan.device's).\n";
  return out;
}

std::string format_csv(const PlanReport& rep) {
  std::string out =
      "packer,sharding,latency_imbalance,attention_imbalance,step_time_s,speedup,mean_delay_steps,max_delay_steps,"
      "cp_imbalance,replica_imbalance,bubble_fraction,tokens_per_step,tokens_per_s,plan_ms,mem_peak_bytes,"
      "attention,ca_imbalance_before,ca_imbalance_after,ca_bytes_per_layer\n";
  for (const auto& r : rep.rows) {
    out += fmt::format("{},{},{:.6f},{:.6f},{:.6g},{:.6f},{:.6f},{},{:.6f},{:.6f},{:.6f},{:.1f},{:.6g},{:.6f},{:.0f},{},{:.6f},{:.6f},{:.0f}\n",
                       r.packer, r.sharding, r.metrics.latency_imbalance, r.metrics.attention_imbalance, r.step_time_s,
                       r.speedup, r.metrics.mean_delay_steps, r.metrics.max_delay_steps, r.metrics.cp_imbalance,
                       r.metrics.replica_imbalance, r.bubble_fraction, r.metrics.tokens_per_step, r.tokens_per_s,
                       r.plan_ms, r.mem_peak_bytes, r.attention, r.ca_imbalance_before, r.ca_imbalance_after,
                       r.ca_bytes_per_layer);
  }
  return out;
}

}  // namespace wlb::plan
