// Pipeline event simulation against the analytic schedules.
#include "wlb4d/balance/pipeline_sim.hpp"
#include "wlb4d/core/error.hpp"

#include <gtest/gtest.h>

#include <random>

using namespace wlb::balance;

namespace {
PipelineTimes uniform(int stages, int m, double f, double b, double p2p = 0) {
  PipelineTimes t;
  t.fwd.assign(stages, std::vector<double>(m, f));
  t.bwd.assign(stages, std::vector<double>(m, b));
  if (p2p > 0) t.p2p.assign(m, p2p);
  return t;
}
}  // namespace

TEST(PipelineSim, OneFOneBUniformMatchesAnalyticBubble) {
  for (int pp : {1, 2, 4, 8}) {
    for (int m : {1, 2, 4, 8, 16, 32}) {
      const double f = 1.0, b = 2.0;
      const auto r = simulate_pipeline("1f1b", pp, 1, uniform(pp, m, f, b));
      EXPECT_NEAR(r.makespan, (m + pp - 1) * (f + b), 1e-9) << "pp=" << pp << " m=" << m;
      EXPECT_NEAR(r.bubble_fraction, double(pp - 1) / (m + pp - 1), 1e-12) << "pp=" << pp << " m=" << m;
    }
  }
}

TEST(PipelineSim, GPipeUniformMatchesAnalytic) {
  for (int pp : {2, 4}) {
    for (int m : {1, 4, 9}) {
      const auto r = simulate_pipeline("gpipe", pp, 1, uniform(pp, m, 1.0, 2.0));
      EXPECT_NEAR(r.makespan, (m + pp - 1) * 3.0, 1e-9);
    }
  }
}

TEST(PipelineSim, InterleavedUniformBubbleShrinksByVirtualStages) {
  // Megatron: bubble time (pp−1)·(f+b)/v for per-chunk times f/v, b/v.
  for (int pp : {2, 4}) {
    for (int v : {2, 4}) {
      for (int m : {pp, 2 * pp, 4 * pp}) {
        const double f = 1.0, b = 2.0;
        const auto r = simulate_pipeline("interleaved", pp, v, uniform(pp * v, m, f / v, b / v));
        EXPECT_NEAR(r.makespan, m * (f + b) + (pp - 1) * (f + b) / v, 1e-9) << pp << " " << v << " " << m;
      }
    }
  }
}

TEST(PipelineSim, BfsAndVariableTimesComplete) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(0.5, 3.0);
  PipelineTimes t;
  const int pp = 4, v = 2, m = 8;
  t.fwd.assign(pp * v, std::vector<double>(m));
  t.bwd = t.fwd;
  for (auto* x : {&t.fwd, &t.bwd})
    for (auto& row : *x)
      for (auto& e : row) e = u(rng);
  t.p2p.assign(m, 0.1);
  double total = 0;
  for (int k = 0; k < pp * v; ++k)
    for (int i = 0; i < m; ++i) total += t.fwd[k][i] + t.bwd[k][i];
  for (const char* s : {"bfs", "interleaved"}) {
    const auto r = simulate_pipeline(s, pp, v, t);
    double busy = 0;
    for (double x : r.busy) busy += x;
    EXPECT_NEAR(busy, total, 1e-9);
    EXPECT_GE(r.makespan, total / pp);
  }
}

TEST(PipelineSim, ImbalancedMicroBatchStretchesTheCriticalPath) {
  // pp = m = 4, micro-batch 1 three times slower (f 3, b 6; others f 1, b 2).
  // Critical path (reference §1.2): F0 on stage 0, then micro-batch 1 through
  // all stages forward and backward, then B2, B3 on stage 0:
  // 1 + 4·(3+6) + 2·2 = 41 — far above the balanced time at the same mean
  // work, (m+pp−1)·4.5 = 31.5.
  const int pp = 4, m = 4;
  auto t = uniform(pp, m, 1.0, 2.0);
  for (int k = 0; k < pp; ++k) {
    t.fwd[k][1] = 3.0;
    t.bwd[k][1] = 6.0;
  }
  const auto r = simulate_pipeline("1f1b", pp, 1, t);
  EXPECT_NEAR(r.makespan, 41.0, 1e-9);
  EXPECT_GT(r.makespan, (m + pp - 1) * 4.5);
}

TEST(PipelineSim, P2pAddsToTheCriticalPath) {
  const int pp = 4;
  const double c = 0.25;
  // One micro-batch: forward down and backward up, 2(pp−1) transfers.
  auto r = simulate_pipeline("1f1b", pp, 1, uniform(pp, 1, 1.0, 2.0, c));
  EXPECT_NEAR(r.makespan, pp * 3.0 + 2 * (pp - 1) * c, 1e-9);
  // Many: at least fill + drain transfers on top of the compute-only time.
  for (int m : {4, 8, 16}) {
    const double base = simulate_pipeline("1f1b", pp, 1, uniform(pp, m, 1.0, 2.0)).makespan;
    r = simulate_pipeline("1f1b", pp, 1, uniform(pp, m, 1.0, 2.0, c));
    EXPECT_GE(r.makespan + 1e-9, base + 2 * (pp - 1) * c);
  }
}

TEST(PipelineSim, RejectsBadInput) {
  EXPECT_THROW(schedule_order("zigzag", 2, 1, 4), wlb::core::ConfigError);
  EXPECT_THROW(schedule_order("1f1b", 2, 2, 4), wlb::core::ConfigError);
  EXPECT_THROW(schedule_order("interleaved", 4, 2, 6), wlb::core::ConfigError);
  EXPECT_THROW(simulate_pipeline("1f1b", 2, 1, uniform(3, 4, 1, 1)), wlb::core::ConfigError);
}
