// Cost model: Eq. 2 form, CP form, FLOP profile and least-squares calibration.
#include "wlb4d/balance/cost_model.hpp"
#include "wlb4d/core/device_table.hpp"
#include "wlb4d/balance/sharding.hpp"
#include "wlb4d/core/error.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

using namespace wlb::balance;

namespace {
MicroBatch mb_of(std::initializer_list<std::int64_t> lens) {
  MicroBatch mb;
  std::int64_t id = 0;
  for (auto l : lens) mb.spans.push_back(Span{id++, 0, l});
  return mb;
}
}  // namespace

TEST(CostModel, Eq2IsAdditiveOverSpans) {
  CostModel m;
  m.a = 2e-6;
  m.b = 3e-11;
  m.c = 1e-4;
  const auto mb = mb_of({1000, 4000, 7});
  const double expect = 1e-4 + 2e-6 * (1000 + 4000 + 7) + 3e-11 * (1e6 + 16e6 + 49);
  EXPECT_NEAR(m.latency(mb), expect, 1e-15);
  EXPECT_NEAR(m.latency(5007.0, 1e6 + 16e6 + 49), expect, 1e-15);
  EXPECT_DOUBLE_EQ(m.breakpoint(), 2e-6 / 3e-11);
}

TEST(CostModel, CpFormMatchesEq2ForTileAlignedSpansOnOneRank) {
  CostModel m;
  m.a = 1e-6;
  m.b = 1e-10;
  m.c = 5e-5;
  m.small_tile_efficiency = 1.0;
  const auto mb = mb_of({1024, 4096, 512});
  // cp = 1: one rank owns both halves, merged into the whole span.
  EXPECT_NEAR(m.latency(mb, 1, Sharding::Document), m.latency(mb), 1e-9 * m.latency(mb));
  // With cp ranks the linear term divides and the attention term is spread.
  const auto r = m.rank_latencies(mb, 2, Sharding::Document);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_NEAR(r[0] + r[1], 2 * m.c + m.a * mb.tokens() + m.b * (1024.0 * 1024 + 4096.0 * 4096 + 512.0 * 512),
              1e-9);
}

TEST(CostModel, SmallShardsArePenalised) {
  CostModel m;
  m.b = 1.0;
  // 16-, 100- and 128-token query pieces are padded to one 128-token tile and
  // run at the small-tile efficiency ...
  EXPECT_DOUBLE_EQ(m.attention_piece(0, 16), 128.0 * 16 / m.small_tile_efficiency);
  EXPECT_DOUBLE_EQ(m.attention_piece(0, 100), 128.0 * 100 / m.small_tile_efficiency);
  EXPECT_DOUBLE_EQ(m.attention_piece(1000, 128), 128.0 * 2128 / m.small_tile_efficiency);
  EXPECT_DOUBLE_EQ(m.attention_piece(0, 256), 256.0 * 256);
  EXPECT_DOUBLE_EQ(m.attention_piece(5, 0), 0.0);
}

TEST(CostModel, FromModelFlopProfile) {
  wlb::core::ModelConfig llama7b;
  llama7b.layers = 32;
  llama7b.d_model = 4096;
  llama7b.heads = 32;
  llama7b.kv_heads = 32;
  llama7b.ffn_hidden = 11008;
  const auto m = CostModel::from_model(llama7b, 8, 4e14, 0.6);
  const double p_layer = 4.0 * 4096 * 4096 + 3.0 * 4096 * 11008;
  EXPECT_NEAR(m.a, 6 * p_layer / 8 / 4e14, 1e-18);
  EXPECT_NEAR(m.b, 7.0 * 4096 / 8 / (0.6 * 4e14), 1e-22);
  // FLOP-parity breakpoint of docs/wlb-llm.md §2.1 (≈49K for Llama2-7B at eff 1),
  // shifted by the 3 : 3.5 fwd+bwd factors and the attention efficiency.
  EXPECT_NEAR(m.breakpoint(), 6.0 / 7.0 * 0.6 * p_layer / 4096, 1.0);
  EXPECT_THROW(CostModel::from_model(llama7b, 0, 4e14), wlb::core::ConfigError);
  EXPECT_THROW(CostModel::from_model(llama7b, 1, 0), wlb::core::ConfigError);
}

TEST(CostModel, FromConfig) {
  wlb::core::Config cfg;
  // The default: not timed, the FLOP-count model of the deck's model and rates
  // (no plan.device and no plan.flops_per_s: the fallback rate).
  EXPECT_FALSE(cfg.balance.calibrate);
  EXPECT_FALSE(CostModel::uses_deck_coefficients(cfg.balance));
  EXPECT_EQ(CostModel::gemm_flops_per_s(cfg), wlb::core::kFallbackGemmFlops);
  const auto flops = CostModel::from_model(cfg.model, cfg.parallel.tp, wlb::core::kFallbackGemmFlops,
                                           cfg.plan.attention_efficiency);
  auto m = CostModel::from_config(cfg);
  EXPECT_EQ(m.a, flops.a);
  EXPECT_EQ(m.b, flops.b);
  EXPECT_EQ(m.c, 0);
  // bf16 runs use the bf16 GEMM rate when the deck gives one.
  cfg.train.precision = "bf16";
  cfg.plan.flops_per_s_bf16 = 4 * wlb::core::kFallbackGemmFlops;
  EXPECT_EQ(CostModel::gemm_flops_per_s(cfg), cfg.plan.flops_per_s_bf16);
  EXPECT_DOUBLE_EQ(CostModel::from_config(cfg).a, flops.a / 4);
  cfg.train.precision = "fp32";
  // The deck's coefficients when given.
  cfg.balance.cost_a = 1e-7;
  cfg.balance.cost_b = 2e-12;
  cfg.balance.cost_c = 3e-5;
  EXPECT_TRUE(CostModel::uses_deck_coefficients(cfg.balance));
  m = CostModel::from_config(cfg);
  EXPECT_EQ(m.a, 1e-7);
  EXPECT_EQ(m.b, 2e-12);
  EXPECT_EQ(m.c, 3e-5);
  // calibrate=true: the trainer times kernels; what needs no timing (the
  // planner, a degenerate calibration's fallback) is the FLOP-count model.
  cfg.balance.calibrate = true;
  EXPECT_FALSE(CostModel::uses_deck_coefficients(cfg.balance));
  EXPECT_EQ(CostModel::from_config(cfg).a, flops.a);
}

// A calibration that cannot be planned with is named, whatever made it so.
TEST(CostModel, CalibrationProblem) {
  CostModel ok;
  ok.a = 1e-7;
  ok.b = 1e-11;
  ok.c = 1e-5;
  EXPECT_EQ(ok.calibration_problem(), "");
  auto with = [&](double a, double b, double c) {
    CostModel m = ok;
    m.a = a;
    m.b = b;
    m.c = c;
    return m.calibration_problem();
  };
  // b = 0: the "breakpoint inf tokens" of a calibration under load.
  EXPECT_NE(with(1e-7, 0, 1e-5).find("quadratic (attention) term b = 0.000e+00 is not positive"), std::string::npos);
  EXPECT_NE(with(1e-7, -1e-12, 0).find("is not positive"), std::string::npos);
  EXPECT_NE(with(0, 1e-11, 0).find("linear term a = 0.000e+00 is not positive"), std::string::npos);
  EXPECT_NE(with(1e-7, 1e-11, -1e-6).find("c = -1.000e-06 is negative"), std::string::npos);
  EXPECT_NE(with(std::nan(""), 1e-11, 0).find("not all finite"), std::string::npos);
  EXPECT_NE(with(1e-7, std::numeric_limits<double>::infinity(), 0).find("not all finite"), std::string::npos);
  EXPECT_NE(with(1e300, 1e-300, 0).find("breakpoint a/b = inf"), std::string::npos);  // overflows
}

TEST(CostModelFit, RecoversCoefficientsFromNoisyTimings) {
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int> nd(1, 20), len(1, 16384);
  std::normal_distribution<double> noise(0.0, 0.005);
  const double a = 3e-7, b = 1.5e-11, c = 2e-4;
  std::vector<Sample> s;
  for (int i = 0; i < 400; ++i) {
    double sd = 0, sd2 = 0;
    for (int k = nd(rng); k > 0; --k) {
      const double d = len(rng);
      sd += d;
      sd2 += d * d;
    }
    const double t = c + a * sd + b * sd2;
    s.push_back({sd, sd2, t * (1 + noise(rng))});
  }
  const auto m = fit(s);
  EXPECT_NEAR(m.a / a, 1.0, 0.03);
  EXPECT_NEAR(m.b / b, 1.0, 0.03);
  EXPECT_NEAR(m.c / c, 1.0, 0.3);
}

TEST(CostModelFit, ExactDataIsReproducedAndNegativeTermsDropped) {
  // Exact quadratic, no constant.
  std::vector<Sample> s;
  for (double d : {512.0, 1024.0, 4096.0, 8192.0, 32768.0}) s.push_back({d, d * d, 1e-6 * d + 1e-12 * d * d});
  auto m = fit(s);
  EXPECT_NEAR(m.a, 1e-6, 1e-12);
  EXPECT_NEAR(m.b, 1e-12, 1e-17);
  EXPECT_NEAR(m.c, 0.0, 1e-9);
  // Timings that decrease with Σd² would need b < 0: b is dropped, fit stays >= 0.
  std::vector<Sample> t;
  for (double d : {1000.0, 2000.0, 3000.0, 4000.0}) t.push_back({d, d * d, 1e-3 + 1e-6 * d - 1e-11 * d * d});
  m = fit(t);
  EXPECT_GE(m.a, 0);
  EXPECT_GE(m.c, 0);
  EXPECT_EQ(m.b, 0);
}

TEST(CostModelFit, RejectsBadSamples) {
  EXPECT_THROW(fit({}), wlb::core::DataError);
  EXPECT_THROW(fit({{1, 1, -1}}), wlb::core::DataError);
  EXPECT_THROW(fit({{1, 1, std::nan("")}}), wlb::core::DataError);
  // One sample still determines one coefficient (a single-column fit).
  EXPECT_NO_THROW(fit({{100, 1e4, 1e-3}}));
}
