// Start-up calibration of the balancing cost model (train/calibrate.hpp):
// the shapes it times, and that the fitted Eq. 2 model describes them.
// Timing-based values are checked loosely (shared machines): structure exactly,
// the fit against the measured samples (an independent computation) within 50 %.
#include "wlb4d/train/calibrate.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

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
