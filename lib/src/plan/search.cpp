// Layout search of wlb4d-plan --search (see search.hpp).
#include "wlb4d/plan/search.hpp"

#include "wlb4d/balance/doc_source.hpp"
#include "wlb4d/balance/packer.hpp"
#include "wlb4d/core/device_table.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/model/transformer.hpp"
#include "wlb4d/pipeline/memory_model.hpp"
#include "wlb4d/plan/simulate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <sstream>
#include <tuple>

namespace wlb::plan {
using namespace wlb::pipeline;  // schedules, stage times and the memory model the trainer runs

namespace {

using balance::StepPlan;

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::vector<int> micro_batch_counts(const core::Config& deck) {
  std::istringstream is(deck.plan.search_micro_batches);
  std::vector<int> out;
  for (std::string w; is >> w;) {
    std::size_t pos = 0;
    int x = 0;
    try {
      x = std::stoi(w, &pos);
    } catch (...) {
      pos = 0;
    }
    if (pos != w.size() || x < 1)
      throw core::ConfigError("plan.search_micro_batches='" + deck.plan.search_micro_batches +
                              "' must be space-separated counts >= 1");
    if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
  }
  if (out.empty()) out.push_back(deck.train.micro_batches);
  return out;
}

struct ScheduleChoice {
  const char* name;
  int v;
};
constexpr ScheduleChoice kSchedules[] = {{"1f1b", 1},        {"gpipe", 1}, {"zb1", 1}, {"interleaved", 2},
                                         {"interleaved", 4}, {"bfs", 2},   {"bfs", 4}};

double budget_bytes(const core::Config& c) { return core::device_memory_gib(c) * 1024.0 * 1024.0 * 1024.0; }

double peak_bytes(const core::Config& c) {
  double peak = 0;
  for (const auto& e : predict_memory_stages(c, plan_vocab(c))) peak = std::max(peak, e.total());
  return peak;
}

/// Step plans of the deck's packer for one (dp, micro-batches, cp, tp),
/// extended on demand (the packer keeps its queues between steps).
struct PlanStream {
  std::unique_ptr<balance::Packer> packer;
  std::unique_ptr<balance::SampledDocSource> src;
  std::vector<StepPlan> plans;
  const StepPlan& at(int s) {
    while (static_cast<int>(plans.size()) <= s)
      plans.push_back(packer->plan_step(static_cast<std::int64_t>(plans.size()), *src));
    return plans[static_cast<std::size_t>(s)];
  }
};

class Evaluator {
 public:
  Evaluator(const core::Config& deck, const std::vector<std::int64_t>& lengths) : deck_(deck), lengths_(lengths) {
    const balance::CostModel cost = plan_cost_model(deck);
    if (deck.balance.outlier_thresholds == "auto") {
      balance::PackerParams w = balance::PackerParams::from_config(deck);
      w.kind = "wlb";
      thresholds_ = balance::choose_outlier_thresholds(
          balance::sample_lengths(lengths, 20000, deck.train.seed ^ 0x5eed), w, cost);
    } else {
      thresholds_ = balance::parse_thresholds(deck.balance.outlier_thresholds);
    }
  }

  /// The candidate's cost model (see search.hpp for calibrate = false).
  balance::CostModel cost(const core::Config& c) const {
    balance::CostModel m = plan_cost_model(c);
    if (balance::CostModel::uses_deck_coefficients(c.balance)) {  // measured at the deck's tp; the FLOP profile scales itself
      const double s = double(deck_.parallel.tp) / c.parallel.tp;
      m.a *= s;
      m.b *= s;
    }
    return m;
  }

  /// Simulates `steps` steps of c and fills the time fields of out.
  void run(const core::Config& c, int steps, SearchCandidate& out) {
    const auto key = std::make_tuple(c.parallel.dp, c.train.micro_batches, c.parallel.cp, c.parallel.tp);
    const balance::CostModel cm = cost(c);
    auto it = streams_.find(key);
    if (it == streams_.end()) {
      balance::PackerParams p = balance::PackerParams::from_config(c);
      p.thresholds = p.kind == "wlb" ? thresholds_ : std::vector<std::int64_t>{};
      PlanStream st;
      st.packer = balance::make_packer(p, cm);
      st.src = std::make_unique<balance::SampledDocSource>(lengths_, c.train.seed);
      it = streams_.emplace(key, std::move(st)).first;
    }
    const StepModel sm = StepModel::cluster(c);
    double time = 0, tokens = 0, flops = 0, bubble = 0, tp = 0, cp = 0, pp = 0, dp = 0;
    const std::int64_t vocab = plan_vocab(c);
    for (int s = 0; s < steps; ++s) {
      const StepPlan& plan = it->second.at(s);
      const StepTime t = simulate_step_time(plan, c, cm, sm);
      time += t.seconds;
      bubble += t.bubble_fraction;
      tp += t.tp_s;
      cp += t.cp_s;
      pp += t.pp_s;
      dp += t.dp_s;
      std::int64_t pairs = 0;
      for (const auto& rep : plan.micro_batches)
        for (const auto& mb : rep)
          for (const auto& sp : mb.spans) pairs += sp.length * (sp.length + 1) / 2;
      tokens += double(plan.tokens);
      flops += model::model_flops(c.model, vocab, plan.tokens, pairs);
    }
    const double peak = plan_peak_flops(c);  // 0: no peak known, no MFU
    out.steps = steps;
    out.step_time_s = time / steps;
    out.tokens_per_step = tokens / steps;
    out.tokens_per_s = time > 0 ? tokens / time : 0;
    out.mfu = time > 0 && peak > 0 ? flops / (time * c.parallel.world() * peak) : -1;
    out.bubble = bubble / steps;
    out.tp_share = time > 0 ? tp / time : 0;
    out.cp_share = time > 0 ? cp / time : 0;
    out.pp_share = time > 0 ? pp / time : 0;
    out.dp_share = time > 0 ? dp / time : 0;
  }

 private:
  const core::Config& deck_;
  const std::vector<std::int64_t>& lengths_;
  std::vector<std::int64_t> thresholds_;
  std::map<std::tuple<int, int, int, int>, PlanStream> streams_;
};

bool better(const SearchCandidate& a, const SearchCandidate& b) {
  if (a.tokens_per_s != b.tokens_per_s) return a.tokens_per_s > b.tokens_per_s;
  return a.peak_bytes < b.peak_bytes;  // a tie (the same time): the smaller footprint
}

}  // namespace

std::string SearchCandidate::label() const {
  const auto& p = cfg.parallel;
  return fmt::format("dp={} pp={} cp={} tp={} {} v={} m={} recompute={} zero={} sp={}", p.dp, p.pp, p.cp, p.tp,
                     p.schedule, p.virtual_stages, cfg.train.micro_batches, cfg.model.recompute, p.zero,
                     p.sequence_parallel ? "on" : "off");
}

std::vector<core::Config> search_candidates(const core::Config& deck, int world, SearchCounts* counts) {
  SearchCounts local;
  SearchCounts& n = counts ? *counts : local;
  const auto ms = micro_batch_counts(deck);
  std::vector<core::Config> out;
  for (int tp : divisors(world))
    for (int cp : divisors(world / tp))
      for (int pp : divisors(world / tp / cp)) {
        const int dp = world / tp / cp / pp;
        for (int m : ms)
          for (const auto& sch : kSchedules)
            for (const char* rc : {"none", "selective", "full"})
              for (int zero : {0, 1})
                for (bool sp : {false, true}) {
                  ++n.enumerated;
                  core::Config c = deck;
                  c.parallel.dp = dp;
                  c.parallel.pp = pp;
                  c.parallel.cp = cp;
                  c.parallel.tp = tp;
                  c.parallel.schedule = sch.name;
                  c.parallel.virtual_stages = sch.v;
                  c.parallel.zero = zero;
                  c.parallel.sequence_parallel = sp;
                  c.train.micro_batches = m;
                  c.model.recompute = rc;
                  c.model.recompute_layers = 0;
                  try {
                    core::validate(c);  // the trainer's own rules (wlb4d --check runs the same two)
                    core::validate_world(c, world);
                  } catch (const core::ConfigError& e) {
                    if (n.first_rejection.empty()) n.first_rejection = e.what();
                    ++n.rejected;
                    continue;
                  }
                  if (deck.plan.devices_per_node % tp != 0) {
                    ++n.off_node;
                    continue;
                  }
                  // Schedules that order the same actions: every schedule on
                  // one stage; gpipe and zb1 on one micro-batch per replica
                  // (nothing to interleave, its W has nothing to fill) run
                  // 1f1b's list, so their rows would repeat 1f1b's to the digit.
                  const bool one_micro_batch = c.train.micro_batches == c.parallel.dp;
                  if ((pp == 1 && c.parallel.schedule != "1f1b") ||
                      (one_micro_batch && (c.parallel.schedule == "gpipe" || c.parallel.schedule == "zb1"))) {
                    ++n.symmetric;
                    continue;
                  }
                  out.push_back(std::move(c));
                }
      }
  return out;
}

SearchReport search_layouts(const core::Config& deck, const std::vector<std::int64_t>& lengths) {
  if (lengths.empty()) throw core::DataError("wlb4d-plan --search: plan.lengths holds no document lengths");
  const auto t0 = std::chrono::steady_clock::now();
  SearchReport rep;
  rep.world = deck.parallel.world();
  const int dpn = deck.plan.devices_per_node;
  rep.nodes = deck.plan.nodes > 0 ? deck.plan.nodes : (rep.world + dpn - 1) / dpn;
  if (long(rep.nodes) * dpn < rep.world)
    throw core::ConfigError(fmt::format(
        "plan.nodes={} x plan.devices_per_node={} = {} devices must be >= the deck's parallel.dp*pp*cp*tp = {}",
        deck.plan.nodes, dpn, long(rep.nodes) * dpn, rep.world));
  {
    // Bounds as the packer comparison's: the refined rows over plan.steps
    // with the largest micro-batch count, plus the coarse pass (counted below).
    core::Config big = deck;
    const auto ms = micro_batch_counts(deck);
    big.train.micro_batches = *std::max_element(ms.begin(), ms.end());
    check_plan_bounds(big, lengths, double(deck.plan.search_refine + 1));
  }
  Evaluator ev(deck, lengths);
  SearchCounts& n = rep.counts;
  const auto cands = search_candidates(deck, rep.world, &n);

  // Memory and dominance (search.hpp rules 4 and 5): candidates come grouped
  // by (layout, micro-batches, schedule) in the order of increasing charge.
  std::vector<SearchCandidate> survivors;
  std::string group_done;
  for (const auto& c : cands) {
    const auto& p = c.parallel;
    const std::string group = fmt::format("{} {} {} {} {} {} {}", p.dp, p.pp, p.cp, p.tp, c.train.micro_batches,
                                          p.schedule, p.virtual_stages);
    if (group == group_done) {
      ++n.dominated;
      continue;
    }
    SearchCandidate s;
    s.cfg = c;
    s.peak_bytes = peak_bytes(c);
    if (s.peak_bytes > budget_bytes(c)) {
      ++n.over_memory;
      continue;
    }
    group_done = group;
    survivors.push_back(std::move(s));
  }

  // Coarse pass.
  for (auto& s : survivors) ev.run(s.cfg, deck.plan.search_coarse_steps, s);
  n.coarse = static_cast<long>(survivors.size());
  std::sort(survivors.begin(), survivors.end(), better);
  if (survivors.size() > static_cast<std::size_t>(deck.plan.search_refine))
    survivors.resize(static_cast<std::size_t>(deck.plan.search_refine));

  // The deck's own setting is always evaluated, fitting or not.
  rep.deck.cfg = deck;
  rep.deck.is_deck = true;
  rep.deck.peak_bytes = peak_bytes(deck);
  rep.deck.fits = rep.deck.peak_bytes <= budget_bytes(deck);
  const std::string deck_label = rep.deck.label() +
                                 (deck.model.recompute_layers > 0 ? fmt::format("({})", deck.model.recompute_layers) : "");
  bool deck_in = false;
  for (auto& s : survivors) {
    if (s.label() == deck_label) {
      s.is_deck = true;
      deck_in = true;
    }
  }
  if (!deck_in) survivors.push_back(rep.deck);

  // Fine pass: plan.steps steps each.
  for (auto& s : survivors) ev.run(s.cfg, deck.plan.steps, s);
  n.refined = static_cast<long>(survivors.size());
  std::sort(survivors.begin(), survivors.end(), better);
  for (const auto& s : survivors)
    if (s.is_deck) rep.deck = s;
  rep.ranked = std::move(survivors);
  n.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

std::string format_search(const SearchReport& rep, int top) {
  const auto& n = rep.counts;
  std::string out = fmt::format(
      "wlb4d-plan --search: {} devices ({} node(s)); {} candidates enumerated: {} rejected by the trainer's deck "
      "validation, {} with TP across nodes, {} symmetric, {} over the memory budget, {} dominated; {} simulated on "
      "the coarse pass, {} refined over plan.steps steps; {:.2f} s\n",
      rep.world, rep.nodes, n.enumerated, n.rejected, n.off_node, n.symmetric, n.over_memory, n.dominated, n.coarse,
      n.refined, n.seconds);
  out += device_line(rep.deck.cfg);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const int deck_m = rep.deck.cfg.train.micro_batches;
  out += fmt::format("{:>4} {:>3} {:>3} {:>3} {:>3} {:<11} {:>1} {:>4} {:<9} {:>4} {:>3} {:>10} {:>8} {:>10} {:>6} "
                     "{:>8} {:>6} {:>5} {:>5} {:>5} {:>5}\n",
                     "rank", "dp", "pp", "cp", "tp", "schedule", "v", "m", "recompute", "zero", "sp", "step_s",
                     "tok/st", "tok/s", "MFU", "mem_GiB", "bubble", "TP", "CP", "PP", "DP");
  auto row = [&](int rank, const SearchCandidate& s) {
    const auto& p = s.cfg.parallel;
    const int m = s.cfg.train.micro_batches;
    return fmt::format("{:>4} {:>3} {:>3} {:>3} {:>3} {:<11} {:>1} {:>4} {:<9} {:>4} {:>3} {:>10.4f} {:>8} "
                       "{:>10.4g} {:>6} {:>8.3f} {:>6.3f} {:>5.3f} {:>5.3f} {:>5.3f} {:>5.3f}{}{}{}\n",
                       rank, p.dp, p.pp, p.cp, p.tp, p.schedule, p.virtual_stages, m, s.cfg.model.recompute, p.zero,
                       p.sequence_parallel ? "on" : "off", s.step_time_s,
                       s.tokens_per_step >= 1e4 ? fmt::format("{:.0f}K", s.tokens_per_step / 1024.0)
                                                : fmt::format("{:.0f}", s.tokens_per_step),
                       s.tokens_per_s,
                       s.mfu >= 0 ? fmt::format("{:.3f}", s.mfu) : std::string("-"), s.peak_bytes / gib, s.bubble,
                       s.tp_share, s.cp_share, s.pp_share, s.dp_share, s.is_deck ? "  <- deck" : "",
                       s.fits ? "" : " (> device)",
                       m != deck_m ? fmt::format(" (global batch {:g}x the deck's)", double(m) / deck_m) : "");
  };
  int deck_rank = 0;
  for (std::size_t i = 0; i < rep.ranked.size(); ++i) {
    if (static_cast<int>(i) < top) out += row(static_cast<int>(i) + 1, rep.ranked[i]);
    if (rep.ranked[i].is_deck) deck_rank = static_cast<int>(i) + 1;
  }
  if (deck_rank > top) out += row(deck_rank, rep.ranked[static_cast<std::size_t>(deck_rank) - 1]);
  if (!rep.ranked.empty() && rep.deck.step_time_s > 0) {
    const SearchCandidate* same = best_at_deck_batch(rep);
    if (same)
      out += fmt::format("best vs deck at the deck's global batch (m={}): {:.3f}x tokens/s ({})\n", deck_m,
                         same->tokens_per_s / rep.deck.tokens_per_s, same->label());
    if (rep.ranked.front().cfg.train.micro_batches != deck_m)
      out += fmt::format("best overall changes the global batch to m={} ({:g}x the deck's tokens per step, a "
                         "different optimisation problem): {:.3f}x tokens/s ({})\n",
                         rep.ranked.front().cfg.train.micro_batches,
                         double(rep.ranked.front().cfg.train.micro_batches) / deck_m, rep.ranked.front().tokens_per_s / rep.deck.tokens_per_s, rep.ranked.front().label());
  }
  out += "rank: place in this ranking; v: virtual stages per pipeline rank; m: train.micro_batches, all DP replicas\n"
         "together (each runs m/dp); recompute, zero, sp: model.recompute, parallel.zero, sequence parallelism;\n"
         "symmetric: a schedule that orders the same actions as 1f1b (any on pp=1; gpipe and zb1 on m/dp=1).\n"
         "step_s: mean simulated step time; tok/st: mean tokens per step (the global batch: train.micro_batches x\n"
         "the context window; rows with another m than the deck's say so); MFU: model FLOP/s per device / peak\n"
         "(log.peak_tflops, else plan.device's peak at train.precision; '-': no peak known); mem_GiB: predicted peak\n"
         "per rank; bubble: pipeline idle share; TP/CP/PP/DP: share of the step time a rank spends in TP\n"
         "collectives, CP K/V gathers, PP p2p and the gradient reduction.\n";
  return out;
}

const SearchCandidate* best_at_deck_batch(const SearchReport& rep) {
  for (const auto& s : rep.ranked)
    if (s.cfg.train.micro_batches == rep.deck.cfg.train.micro_batches) return &s;
  return nullptr;
}

std::string search_deck(const SearchCandidate& best, const std::string& lengths_path) {
  core::Config c = best.cfg;
  c.plan.lengths = lengths_path;
  return fmt::format(
      "# Written by wlb4d-plan --search: the best of the searched layouts.\n"
      "# {}\n"
      "# predicted: {:.4f} s per step, {:.4g} tokens/s, MFU {}, peak {:.2f} GiB per rank\n"
      "# (over {} simulated steps). Every key is written (core::to_ini).\n\n{}",
      best.label(), best.step_time_s, best.tokens_per_s,
      best.mfu >= 0 ? fmt::format("{:.3f}", best.mfu) : std::string("- (no peak known)"), best.peak_bytes / (1024.0 * 1024.0 * 1024.0),
      best.steps, core::to_ini(c));
}

}  // namespace wlb::plan
