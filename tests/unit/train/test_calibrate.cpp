// Start-up calibration of the balancing cost model (train/calibrate.hpp):
// the shapes it times, that the fitted Eq. 2 model describes them, and which
// model a run plans with (untimed by default, a degenerate fit falls back,
// saved constants are reused on resume).
// Timing-based values are checked loosely (shared machines): structure exactly,
// the fit against the measured samples (an independent computation) within 50 %.
#include "wlb4d/core/device_table.hpp"
#include "wlb4d/train/calibrate.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

using namespace wlb;

TEST(Calibrate, TimesThreeLengthsTimesFourSplitsAndFitsThem) {
  core::ModelConfig m;
  m.layers = 3;  // calibration times one layer whatever the depth
  m.d_model = 64;
  m.heads = 4;
  m.kv_heads = 2;
  m.ffn_hidden = 160;
  const std::int64_t T = 512;
  const auto cal = train::calibrate_cost_model(m, T, comm::Communicator::self(), 1);
  ASSERT_EQ(cal.samples.size(), 12u);
  std::map<std::int64_t, int> per_length;
  for (const auto& s : cal.samples) {
    const auto len = std::int64_t(s.sum_d);
    per_length[len]++;
    // ndocs equal documents of len/ndocs tokens: Σd² = len² / ndocs.
    const double ndocs = double(len) * double(len) / s.sum_d2;
    EXPECT_TRUE(std::fabs(ndocs - 1) < 1e-9 || std::fabs(ndocs - 4) < 1e-9 || std::fabs(ndocs - 16) < 1e-9 ||
                std::fabs(ndocs - 64) < 1e-9)
        << "sum_d " << s.sum_d << " sum_d2 " << s.sum_d2;
    EXPECT_GT(s.seconds, 0);
  }
  EXPECT_EQ(per_length, (std::map<std::int64_t, int>{{T / 4, 4}, {T / 2, 4}, {T, 4}}));
  EXPECT_GE(cal.cost.a, 0);
  EXPECT_GE(cal.cost.b, 0);
  EXPECT_GE(cal.cost.c, 0);
  // The fit explains the measurements: total predicted vs total measured time.
  double measured = 0, predicted = 0;
  for (const auto& s : cal.samples) {
    measured += s.seconds;
    predicted += cal.cost.latency(s.sum_d, s.sum_d2);
  }
  EXPECT_NEAR(predicted / measured, 1.0, 0.5);
  // Longer micro-batches cost more under the model.
  EXPECT_GT(cal.cost.latency(double(T), double(T) * T), cal.cost.latency(double(T / 4), double(T / 4) * (T / 4)));
}

namespace {
core::Config flops_deck() {
  core::Config c;
  c.model.layers = 2;
  c.model.d_model = 64;
  c.model.heads = 4;
  c.model.kv_heads = 2;
  c.model.ffn_hidden = 160;
  return c;
}
balance::CostModel abc(double a, double b, double c) {
  balance::CostModel m;
  m.a = a;
  m.b = b;
  m.c = c;
  return m;
}
}  // namespace

// The default is untimed: the same constants on any machine.
TEST(RunCostModel, DefaultIsTheFlopCountModel) {
  core::Config c = flops_deck();
  const auto r = train::untimed_cost_model(c);
  EXPECT_EQ(r.source, train::kCostFlops);
  const auto want = balance::CostModel::from_model(c.model, 1, core::gemm_flops(c), c.plan.attention_efficiency);
  EXPECT_EQ(r.cost.a, want.a);
  EXPECT_EQ(r.cost.b, want.b);
  c.balance.cost_a = 1e-6;
  EXPECT_EQ(train::untimed_cost_model(c).source, train::kCostDeck);
  EXPECT_EQ(train::untimed_cost_model(c).cost.a, 1e-6);
}

// A calibration with b = 0 ("breakpoint inf tokens", as one under load gave)
// is not planned with: the FLOP-count model, and a warning naming the fit.
TEST(RunCostModel, DegenerateCalibrationFallsBackWithAWarning) {
  core::Config c = flops_deck();
  c.balance.calibrate = true;
  c.balance.cost_a = 5e-6;  // ignored under calibrate=true, also by the fallback
  const auto flops = balance::CostModel::from_model(c.model, 1, core::gemm_flops(c), c.plan.attention_efficiency);
  const auto good = train::accept_calibration(c, abc(2e-7, 3e-11, 1e-5));
  EXPECT_EQ(good.source, train::kCostCalibrated);
  EXPECT_EQ(good.warning, "");
  EXPECT_EQ(good.cost.b, 3e-11);
  for (const auto& bad : {abc(2e-7, 0, 1e-5), abc(0, 3e-11, 0), abc(2e-7, 3e-11, -1), abc(std::nan(""), 1e-11, 0)}) {
    const auto r = train::accept_calibration(c, bad);
    EXPECT_EQ(r.source, train::kCostFlopsFallback);
    EXPECT_EQ(r.cost.a, flops.a);
    EXPECT_EQ(r.cost.b, flops.b);
    EXPECT_NE(r.warning.find("balance.calibrate=true: the calibration is degenerate"), std::string::npos) << r.warning;
    EXPECT_NE(r.warning.find("planning with the FLOP-count model instead"), std::string::npos) << r.warning;
  }
  EXPECT_NE(train::accept_calibration(c, abc(2e-7, 0, 1e-5)).warning.find("b = 0.000e+00 is not positive"),
            std::string::npos);
}

// On resume the checkpoint's constants are reused exactly (no new timing);
// a checkpoint of an untimed run, or none stored, means: calibrate now.
TEST(RunCostModel, SavedCalibrationIsReusedOnResume) {
  core::Config c = flops_deck();
  c.balance.calibrate = true;
  const auto saved = abc(1.234567e-7, 8.7654321e-12, 4.5e-6);
  const auto r = train::reuse_calibration(c, train::kCostCalibrated, saved);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->source, train::kCostCalibrated);
  EXPECT_EQ(r->cost.a, saved.a);
  EXPECT_EQ(r->cost.b, saved.b);
  EXPECT_EQ(r->cost.c, saved.c);
  const auto fb = train::reuse_calibration(c, train::kCostFlopsFallback, saved);
  ASSERT_TRUE(fb);
  EXPECT_EQ(fb->source, train::kCostFlopsFallback);
  EXPECT_EQ(fb->cost.a, saved.a);
  EXPECT_EQ(fb->warning, "");
  // Damaged constants are checked again: the fallback, loudly.
  const auto dmg = train::reuse_calibration(c, train::kCostCalibrated, abc(1e-7, 0, 0));
  ASSERT_TRUE(dmg);
  EXPECT_EQ(dmg->source, train::kCostFlopsFallback);
  EXPECT_NE(dmg->warning, "");
  EXPECT_FALSE(train::reuse_calibration(c, train::kCostFlops, saved));
  EXPECT_FALSE(train::reuse_calibration(c, train::kCostDeck, saved));
  EXPECT_FALSE(train::reuse_calibration(c, "", saved));
}
