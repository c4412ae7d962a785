// The planner's pipeline simulation: it runs the trainer's own action lists
// (one schedule implementation), against analytic makespans and bubbles.
#include "wlb4d/core/error.hpp"
#include "wlb4d/pipeline/schedule.hpp"
#include "wlb4d/plan/simulate.hpp"

#include <gtest/gtest.h>

#include <random>

using namespace wlb::pipeline;
using namespace wlb::plan;
namespace core = wlb::core;
namespace balance = wlb::balance;

namespace {
StageTimes uniform(int chunks, int m, double f, double b, double p2p = 0) {
  StageTimes t = StageTimes::uniform(m, chunks, f, b);
  if (p2p > 0) t.p2p.assign(std::size_t(m), p2p);
  return t;
}
SimResult sim(const char* schedule, int pp, int v, const StageTimes& t) {
  wlb::core::ParallelConfig par;
  par.pp = pp;
  par.virtual_stages = v;
  par.schedule = schedule;
  return simulate_schedule(planner_action_lists(par, int(t.forward.size())), pp, v, t, 0.0, P2PMode::Eager);
}
}  // namespace

// The contract: for every schedule and (p, m, v) up to 4 x 8 x 2, the
// lists the planner simulates are the lists the trainer's executor runs.
TEST(PlannerSimulation, SimulatesTheTrainersActionLists) {
  int checked = 0;
  for (const char* s : {"gpipe", "1f1b", "interleaved", "bfs", "zb1"})
    for (int p = 1; p <= 4; ++p)
      for (int m = 1; m <= 8; ++m)
        for (int v = 1; v <= 2; ++v) {
          wlb::core::ParallelConfig par;
          par.pp = p;
          par.virtual_stages = v;
          par.schedule = s;
          const auto kind = parse_schedule_kind(s);
          const bool legal = !(v > 1 && (kind == ScheduleKind::GPipe || kind == ScheduleKind::OneFOneB ||
                                          kind == ScheduleKind::ZeroBubbleH1)) &&
                             !(kind == ScheduleKind::Interleaved && v > 1 && m % p != 0);
          if (!legal) {
            EXPECT_THROW(planner_action_lists(par, m), wlb::core::ConfigError);
            continue;
          }
          const auto planner = planner_action_lists(par, m);
          ASSERT_EQ(int(planner.size()), p);
          for (int r = 0; r < p; ++r) {
            // The executor's list (pipeline::Executor::run) for the same rank.
            EXPECT_EQ(planner[std::size_t(r)], training_action_list(par, r, m, true))
                << s << " p=" << p << " m=" << m << " v=" << v << " rank " << r;
            EXPECT_EQ(planner[std::size_t(r)], build_schedule(kind, r, p, m, v));
          }
          // ... and they simulate to completion, every compute counted once.
          const auto res = simulate_schedule(planner, p, v, uniform(p * v, m, 1.0, 2.0), 0.0, P2PMode::Eager);
          double busy = 0;
          for (double b : res.busy) busy += b;
          EXPECT_NEAR(busy, 3.0 * m * p * v, 1e-9);
          ++checked;
        }
  EXPECT_GT(checked, 150);
}

// The case where the deleted planner copy disagreed (pp=2, m=2, v=2): the
// trainer's interleaved schedule runs all 4 forwards of rank 1 first
// (Megatron: all warm-up when m == pp), and the planner sees exactly that.
TEST(PlannerSimulation, InterleavedWithMicroBatchesEqualToStages) {
  wlb::core::ParallelConfig par;
  par.pp = 2;
  par.virtual_stages = 2;
  par.schedule = "interleaved";
  const auto lists = planner_action_lists(par, 2);
  int warm = 0;
  for (const auto& a : lists[1]) {
    if (a.type == ActionType::Backward) break;
    if (a.type == ActionType::Forward) ++warm;
  }
  EXPECT_EQ(warm, 4);
}

TEST(PlannerSimulation, OneFOneBUniformMatchesAnalyticBubble) {
  for (int pp : {1, 2, 4, 8})
    for (int m : {1, 2, 4, 8, 16, 32}) {
      const double f = 1.0, b = 2.0;
      const auto r = sim("1f1b", pp, 1, uniform(pp, m, f, b));
      EXPECT_NEAR(r.makespan, (m + pp - 1) * (f + b), 1e-9) << "pp=" << pp << " m=" << m;
      EXPECT_NEAR(r.bubble_fraction(), double(pp - 1) / (m + pp - 1), 1e-12) << "pp=" << pp << " m=" << m;
    }
}

TEST(PlannerSimulation, GPipeUniformMatchesAnalytic) {
  for (int pp : {2, 4})
    for (int m : {1, 4, 9}) EXPECT_NEAR(sim("gpipe", pp, 1, uniform(pp, m, 1.0, 2.0)).makespan, (m + pp - 1) * 3.0, 1e-9);
}

TEST(PlannerSimulation, InterleavedUniformBubbleAgainstMegatronsBound) {
  // Megatron (Narayanan et al. 2021, §2.2.2): bubble time (pp−1)·(f+b)/v for
  // per-chunk times f/v, b/v — a lower bound for any interleaved list. The
  // trainer's lists reach it when m == pp (all forwards first). For m > pp
  // their blocking receives, placed for rendezvous sends, sit 1–4.5 units
  // above it (pp=2, v=2, m=8: 28.5 against 25.5): the planner must predict
  // what the trainer runs, not the ideal; nonblocking pipeline p2p closes it.
  for (int pp : {2, 4})
    for (int v : {2, 4})
      for (int m : {pp, 2 * pp, 4 * pp}) {
        const double f = 1.0, b = 2.0;
        const auto r = sim("interleaved", pp, v, uniform(pp * v, m, f / v, b / v));
        const double megatron = m * (f + b) + (pp - 1) * (f + b) / v;
        EXPECT_GE(r.makespan, megatron - 1e-9) << pp << " " << v << " " << m;
        if (m == pp) {
          EXPECT_NEAR(r.makespan, megatron, 1e-9) << pp << " " << v << " " << m;
        }
        // Rendezvous (blocking sends) gives the same time: receives, not sends, set it.
        const auto rdv = simulate_schedule(planner_action_lists([&] {
                                             wlb::core::ParallelConfig par;
                                             par.pp = pp;
                                             par.virtual_stages = v;
                                             par.schedule = "interleaved";
                                             return par;
                                           }(), m),
                                           pp, v, uniform(pp * v, m, f / v, b / v));
        EXPECT_NEAR(rdv.makespan, r.makespan, 1e-9);
      }
}

TEST(PlannerSimulation, BfsAndVariableTimesComplete) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(0.5, 3.0);
  const int pp = 4, v = 2, m = 8;
  StageTimes t = uniform(pp * v, m, 0, 0, 0.1);
  double total = 0;
  for (auto* x : {&t.forward, &t.backward})
    for (auto& row : *x)
      for (auto& e : row) total += (e = u(rng));
  for (const char* s : {"bfs", "interleaved"}) {
    const auto r = sim(s, pp, v, t);
    double busy = 0;
    for (double x : r.busy) busy += x;
    EXPECT_NEAR(busy, total, 1e-9);
    EXPECT_GE(r.makespan, total / pp);
  }
}

TEST(PlannerSimulation, ImbalancedMicroBatchStretchesTheCriticalPath) {
  // pp = m = 4, micro-batch 1 three times slower (f 3, b 6; others f 1, b 2).
  // Critical path (WLB-LLM §3, "propagation"): F0 on stage 0, then
  // micro-batch 1 through all stages forward and backward, then B2, B3 on
  // stage 0: 1 + 4·(3+6) + 2·2 = 41 — far above the balanced time at the same
  // mean work, (m+pp−1)·4.5 = 31.5.
  const int pp = 4, m = 4;
  auto t = uniform(pp, m, 1.0, 2.0);
  for (int k = 0; k < pp; ++k) {
    t.forward[1][std::size_t(k)] = 3.0;
    t.backward[1][std::size_t(k)] = 6.0;
  }
  const auto r = sim("1f1b", pp, 1, t);
  EXPECT_NEAR(r.makespan, 41.0, 1e-9);
  EXPECT_GT(r.makespan, (m + pp - 1) * 4.5);
}

TEST(PlannerSimulation, P2pAddsToTheCriticalPath) {
  const int pp = 4;
  const double c = 0.25;
  // One micro-batch: forward down and backward up, 2(pp−1) transfers.
  auto r = sim("1f1b", pp, 1, uniform(pp, 1, 1.0, 2.0, c));
  EXPECT_NEAR(r.makespan, pp * 3.0 + 2 * (pp - 1) * c, 1e-9);
  // Many: at least fill + drain transfers on top of the compute-only time.
  for (int m : {4, 8, 16}) {
    const double base = sim("1f1b", pp, 1, uniform(pp, m, 1.0, 2.0)).makespan;
    r = sim("1f1b", pp, 1, uniform(pp, m, 1.0, 2.0, c));
    EXPECT_GE(r.makespan + 1e-9, base + 2 * (pp - 1) * c);
  }
}

TEST(PlannerSimulation, RejectsBadInput) {
  wlb::core::ParallelConfig par;
  par.pp = 2;
  par.schedule = "zigzag";
  EXPECT_THROW(planner_action_lists(par, 4), wlb::core::ConfigError);
  par.schedule = "1f1b";
  par.virtual_stages = 2;
  EXPECT_THROW(planner_action_lists(par, 4), wlb::core::ConfigError);
  par.pp = 4;
  par.schedule = "interleaved";
  EXPECT_THROW(planner_action_lists(par, 6), wlb::core::ConfigError);
  par.virtual_stages = 1;
  par.pp = 2;
  par.schedule = "1f1b";
  // Times of the wrong shape are a caller bug, not a deck error.
  EXPECT_THROW(simulate_schedule(planner_action_lists(par, 4), 2, 1, uniform(3, 4, 1, 1)), wlb::core::InternalError);
  StageTimes t = uniform(2, 4, 1, 1);
  t.p2p.assign(3, 0.1);
  EXPECT_THROW(simulate_schedule(planner_action_lists(par, 4), 2, 1, t), wlb::core::InternalError);
}

// The planner's step time for zb1 against 1f1b on the same plan: the planner
// splits each backward into B and W (simulate.hpp) and the zb1 lists fill the
// cool-down with W, so the simulated step is shorter and the bubble smaller.
TEST(PlannerSimulation, ZeroBubbleBeatsOneFOneBWithSplitTimes) {
  for (int pp : {2, 4}) {
    const int m = 8;
    StageTimes t = uniform(pp, m, 1.0, 1.0);
    t.weight.assign(std::size_t(m), std::vector<double>(std::size_t(pp), 1.0));
    const auto z = sim("zb1", pp, 1, t), o = sim("1f1b", pp, 1, t);
    EXPECT_NEAR(z.makespan, 3.0 * m + (pp - 1) * 1.0, 1e-9) << pp;  // (p-1)(F+B-W)
    EXPECT_NEAR(o.makespan, 3.0 * m + (pp - 1) * 2.0, 1e-9) << pp;  // split 1F1B: (p-1)(F+B)
    EXPECT_LT(z.bubble_fraction(), o.bubble_fraction());
  }
}

// Core-attention disaggregation in the step model: with a free
// exchange (α = β = 0), a plan whose replicas hold very different attention
// work gets a shorter step and a balanced group; with a costly link the
// exchange is charged and can make it slower; dp=1 cp=1 has nothing to move.
TEST(PlannerSimulation, DisaggregatedAttentionBalancesTheGroupAndChargesTheExchange) {
  core::Config cfg = core::parse_deck_text(
      "", {"model.layers=2", "model.d_model=256", "model.heads=4", "model.kv_heads=4", "model.ffn_hidden=512",
           "parallel.dp=2", "parallel.cp=2", "parallel.pp=1", "parallel.tp=1", "train.micro_batches=2",
           "train.max_seq_len=16384", "balance.calibrate=false", "balance.cost_a=1e-8", "balance.cost_b=1e-11",
           "plan.alpha_s=0", "plan.beta_s_per_byte=0"});
  const auto cost = plan_cost_model(cfg);
  balance::StepPlan plan;
  plan.micro_batches.resize(2);
  plan.sharding.assign(2, {balance::Sharding::Document});
  plan.micro_batches[0] = {balance::MicroBatch{{{0, 0, 16384}}}};  // one long document
  balance::MicroBatch shorts;
  for (int i = 0; i < 64; ++i) shorts.spans.push_back({1 + i, 0, 256});
  plan.micro_batches[1] = {shorts};
  StepModel local = StepModel::uniform(cfg), ca = local;
  ca.disaggregated_attention = true;
  ca.ca_task_tokens = 512;
  const StepTime tl = simulate_step_time(plan, cfg, cost, local);
  const StepTime tc = simulate_step_time(plan, cfg, cost, ca);
  EXPECT_GT(tc.ca_imbalance_before, 1.8);
  EXPECT_LT(tc.ca_imbalance_after, 1.05);
  EXPECT_GT(tc.ca_bytes_per_layer, 0);
  EXPECT_LT(tc.seconds, 0.8 * tl.seconds) << "free exchange: the long replica's attention is shared";
  // A slow link: the same moves, charged α + β·bytes per layer less what the
  // ping-pong hides behind the rank's own kept attention, which is at most
  // all the plan's attention per layer (A): 2 layers x [x - A, x].
  double A = 0;
  for (const auto& rep : plan.micro_batches)
    for (const auto& mb : rep)
      for (const auto& sp : mb.spans) A += cost.attention_piece(0, sp.length);
  for (double beta : {1e-6, 1e-4}) {
    ca.dp = Link{1e-3, beta};
    const StepTime slow = simulate_step_time(plan, cfg, cost, ca);
    const double x = 1e-3 + beta * tc.ca_bytes_per_layer;
    const double exposed = slow.seconds - tc.seconds - (slow.dp_s - tc.dp_s);
    EXPECT_LE(exposed, 2 * x + 1e-9 + 1e-9 * slow.seconds) << "beta " << beta << ": more than the exchange";
    EXPECT_GE(exposed, 2 * (x - A) - 1e-9) << "beta " << beta << ": hid more than the kept attention";
    EXPECT_GT(exposed, 0) << "beta " << beta;
    if (beta > 1e-5) {
      ASSERT_GT(x, 20 * A) << "the slow case must dwarf the attention";
      EXPECT_GT(exposed, 1.8 * x) << "a link this slow cannot be hidden";
    }
  }
  // One rank: nothing to balance.
  core::Config one = cfg;
  one.parallel.dp = one.parallel.cp = 1;
  balance::StepPlan p1;
  p1.micro_batches = {{plan.micro_batches[0][0]}};
  p1.sharding = {{balance::Sharding::Sequence}};
  StepModel ca1 = StepModel::uniform(one);
  ca1.disaggregated_attention = true;
  const StepTime t1 = simulate_step_time(p1, one, cost, ca1);
  EXPECT_DOUBLE_EQ(t1.ca_bytes_per_layer, 0);
  EXPECT_DOUBLE_EQ(t1.seconds, simulate_step_time(p1, one, cost, StepModel::uniform(one)).seconds);
}
