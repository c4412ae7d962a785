// The loss-spike guard and the straggler flag (train/guards.hpp) against
// naive re-computations of their rules.
#include "wlb4d/train/guards.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

using wlb::train::SpikeGuard;
using wlb::train::StragglerFlag;

namespace {
/// The rule written out naively: z of x against the values, population std.
double naive_z(const std::vector<double>& v, double x) {
  double m = 0;
  for (double a : v) m += a;
  m /= double(v.size());
  double q = 0;
  for (double a : v) q += (a - m) * (a - m);
  const double sd = std::sqrt(q / double(v.size()));
  return sd > 0 ? (x - m) / sd : 0;
}

wlb::io::TimingRecord rec(int rank, int pp, double fwd, double bwd) {
  wlb::io::TimingRecord r;
  r.rank = rank;
  r.pp = pp;
  r.time[wlb::io::kForward] = fwd;
  r.time[wlb::io::kBackward] = bwd;
  return r;
}
}  // namespace

TEST(SpikeGuard, MatchesTheNaiveRuleOnANoisyCurveWithSpikes) {
  const int window = 10, warmup = 4;
  const double z = 3;
  SpikeGuard g(z, window, warmup);
  std::mt19937_64 rng(7);
  std::normal_distribution<double> noise(0, 0.05);
  std::vector<double> lw, gw;
  int skips = 0;
  for (int s = 0; s < 300; ++s) {
    double loss = 5 * std::exp(-s / 80.0) + 2 + noise(rng), gn = 1 + 0.2 * noise(rng);
    if (s % 37 == 20) loss *= 3;  // loss spikes
    if (s % 53 == 30) gn *= 10;   // grad-norm spikes
    const auto d = g.observe(loss, gn);
    const bool judged = int(lw.size()) >= warmup;
    EXPECT_EQ(d.judged, judged) << s;
    const double zl = judged ? naive_z(lw, loss) : 0, zg = judged ? naive_z(gw, gn) : 0;
    EXPECT_DOUBLE_EQ(d.z_loss, zl) << s;
    EXPECT_DOUBLE_EQ(d.z_grad, zg) << s;
    EXPECT_EQ(d.skip, judged && (zl > z || zg > z)) << s;
    skips += d.skip;
    lw.push_back(loss);
    gw.push_back(gn);
    if (int(lw.size()) > window) {
      lw.erase(lw.begin());
      gw.erase(gw.begin());
    }
  }
  EXPECT_GE(skips, 10);  // the injected spikes are caught
}

TEST(SpikeGuard, NothingIsJudgedBeforeWarmupOrOnAConstantWindow) {
  SpikeGuard g(2, 8, 3);
  EXPECT_FALSE(g.observe(1, 1).judged);
  EXPECT_FALSE(g.observe(1, 1).judged);
  EXPECT_FALSE(g.observe(1000, 1).skip);  // 2 values: still warming up
  SpikeGuard c(2, 8, 2);
  c.observe(1, 1);
  c.observe(1, 1);
  const auto d = c.observe(1e6, 1e6);  // std 0: no judgement possible
  EXPECT_TRUE(d.judged);
  EXPECT_FALSE(d.skip);
}

TEST(SpikeGuard, ADropIsNeverASpike) {
  SpikeGuard g(2, 8, 4);
  for (double x : {3.0, 3.1, 2.9, 3.05}) g.observe(x, 1 + x / 100);
  EXPECT_FALSE(g.observe(0.01, 0.01).skip);
  EXPECT_TRUE(g.observe(30, 1).skip);
}

TEST(SpikeGuard, RestoredWindowDecidesAsTheUninterruptedOne) {
  SpikeGuard a(3, 6, 4);
  std::vector<double> in;
  for (int s = 0; s < 20; ++s) in.push_back(2 + 0.1 * std::sin(s));
  for (int s = 0; s < 10; ++s) a.observe(in[std::size_t(s)], in[std::size_t(s)] / 2);
  SpikeGuard b(3, 6, 4);
  b.restore(a.window_pairs());
  EXPECT_EQ(b.window_pairs(), a.window_pairs());
  for (int s = 10; s < 20; ++s) {
    const double x = s == 15 ? 50 : in[std::size_t(s)];
    const auto da = a.observe(x, x / 2), db = b.observe(x, x / 2);
    EXPECT_EQ(da.skip, db.skip);
    EXPECT_EQ(da.z_loss, db.z_loss);  // bit for bit
  }
  // A smaller window keeps the newest pairs.
  SpikeGuard c(3, 2, 2);
  c.restore({1, 10, 2, 20, 3, 30});
  EXPECT_EQ(c.window_pairs(), (std::vector<double>{2, 20, 3, 30}));
  EXPECT_THROW(c.restore({1, 2, 3}), std::invalid_argument);
}

TEST(StragglerFlag, NamesARankSlowForKConsecutiveStepsWithinItsStage) {
  StragglerFlag f(1.5, 3);
  // pp=2, 3 ranks per stage; stage 1 is naturally slower (the LM head), not a straggler.
  auto step = [&](double slow) {
    return f.observe({rec(0, 0, 0.1, 0.2), rec(1, 0, 0.1, 0.2 * slow), rec(2, 0, 0.11, 0.2), rec(3, 1, 0.3, 0.6),
                      rec(4, 1, 0.3, 0.61), rec(5, 1, 0.31, 0.6)});
  };
  EXPECT_TRUE(step(3).empty());
  EXPECT_TRUE(step(3).empty());
  std::vector<wlb::train::Straggler> newly;
  const auto s3 = f.observe({rec(0, 0, 0.1, 0.2), rec(1, 0, 0.1, 0.6), rec(2, 0, 0.11, 0.2), rec(3, 1, 0.3, 0.6),
                             rec(4, 1, 0.3, 0.61), rec(5, 1, 0.31, 0.6)},
                            &newly);
  ASSERT_EQ(s3.size(), 1u);
  EXPECT_EQ(s3[0].rank, 1);
  EXPECT_EQ(s3[0].steps, 3);
  EXPECT_NEAR(s3[0].ratio, 0.7 / 0.31, 1e-12);  // median of 0.3, 0.7, 0.31
  ASSERT_EQ(newly.size(), 1u);
  EXPECT_EQ(step(3).size(), 1u);  // still named, not new
  EXPECT_TRUE(step(1).empty());   // recovered: the streak restarts
  EXPECT_TRUE(step(3).empty());
  EXPECT_EQ(wlb::train::format_stragglers(s3), " | straggler r1 2.3x (3 steps)");
}

TEST(StragglerFlag, OneRankPerStageComparesTheWorldAndOneRankNeverFlags) {
  StragglerFlag f(1.5, 1);
  const auto s = f.observe({rec(0, 0, 1, 1), rec(1, 1, 1, 1.1), rec(2, 2, 3, 3), rec(3, 3, 1, 1)});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 2);
  StragglerFlag one(1.5, 1);
  EXPECT_TRUE(one.observe({rec(0, 0, 5, 5)}).empty());
}
