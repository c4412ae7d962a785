// Packers fixed / greedy / wlb: exactly-once tiling, caps, bounded delay,
// balance ordering on long-tailed streams, checkpoint continuation.
#include "wlb4d/balance/metrics.hpp"
#include "wlb4d/balance/packer.hpp"
#include "wlb4d/balance/sharding.hpp"
#include "wlb4d/core/error.hpp"

#include "balance_test_util.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <memory>

using namespace wlb::balance;

namespace {

CostModel test_cost() {
  CostModel m;  // attention/linear breakpoint 16K tokens
  m.a = 1e-6;
  m.b = 1e-6 / 16384;
  m.c = 1e-5;
  return m;
}

PackerParams params(const std::string& kind, int M, int dp, std::int64_t S, std::int64_t smax = 0) {
  PackerParams p;
  p.kind = kind;
  p.micro_batches = M;
  p.dp = dp;
  p.max_seq_len = S;
  p.max_tokens = smax;
  p.max_delay = 3;
  if (kind == "wlb") p.thresholds = {S / 4, S / 2};
  return p;
}

// Runs `steps` steps and checks every per-step invariant; returns the plans.
std::vector<StepPlan> run_checked(Packer& pk, VectorDocSource& src, const std::vector<std::int64_t>& lens, int steps,
                                  wlb_test::Coverage& cov) {
  const auto& p = pk.params();
  std::vector<StepPlan> plans;
  for (int s = 0; s < steps; ++s) {
    StepPlan plan = pk.plan_step(s, src);
    EXPECT_EQ(plan.step, s);
    EXPECT_EQ(static_cast<int>(plan.micro_batches.size()), p.dp);
    EXPECT_EQ(plan.sharding.size(), plan.micro_batches.size());
    std::int64_t tok = 0, tgt = 0;
    for (std::size_t r = 0; r < plan.micro_batches.size(); ++r) {
      EXPECT_EQ(static_cast<int>(plan.micro_batches[r].size()), p.micro_batches / p.dp);
      EXPECT_EQ(plan.sharding[r].size(), plan.micro_batches[r].size());
      for (const auto& mb : plan.micro_batches[r]) {
        EXPECT_FALSE(mb.spans.empty()) << "empty micro-batch at step " << s;
        // No attention span exceeds the context window, even where a wlb
        // micro-batch may hold more tokens (max_tokens > max_seq_len).
        for (const auto& sp : mb.spans) EXPECT_LE(sp.length, p.max_seq_len) << "step " << s;
        if (p.kind == "wlb") {
          EXPECT_LE(mb.tokens(), p.cap());
        } else {
          EXPECT_EQ(mb.tokens(), p.max_seq_len);
        }
        tok += mb.tokens();
        tgt += mb.target_tokens();
      }
    }
    EXPECT_EQ(plan.tokens, tok);
    EXPECT_EQ(plan.target_tokens, tgt);
    if (p.kind == "wlb") {
      EXPECT_LE(plan.max_delay_steps, p.max_delay);
    } else {
      EXPECT_EQ(plan.tokens, p.step_budget());
      EXPECT_EQ(plan.max_delay_steps, 0);
    }
    cov.add(plan);
    plans.push_back(std::move(plan));
  }
  for (const auto& sp : pk.pending()) cov.add(sp);
  cov.expect_exact_tiling(src.drawn(), [&](std::int64_t id) { return lens[static_cast<std::size_t>(id % static_cast<std::int64_t>(lens.size()))]; });
  return plans;
}

struct Case {
  std::string kind;
  bool real;
  int M, dp;
  std::int64_t S, smax;
  int max_delay;
  std::string thresholds;  // "", "none" or list
};

class PackerInvariants : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(PackerInvariants, ExactlyOnceCapsAndDelay) {
  const Case c = GetParam();
  std::vector<std::int64_t> lens =
      c.real ? sample_lengths(load_lengths_json(wlb_test::dist_path()), 20000, 99) : wlb_test::long_tail_lengths(5000, c.S, 7);
  PackerParams p = params(c.kind, c.M, c.dp, c.S, c.smax);
  p.max_delay = c.max_delay;
  if (c.thresholds == "none") p.thresholds.clear();
  p.cp = 2;
  p.sharding = "adaptive";
  auto pk = make_packer(p, test_cost());
  VectorDocSource src(lens);
  wlb_test::Coverage cov;
  run_checked(*pk, src, lens, 150, cov);
}

INSTANTIATE_TEST_SUITE_P(
    Streams, PackerInvariants,
    ::testing::Values(Case{"fixed", false, 4, 1, 8192, 0, 3, ""}, Case{"fixed", true, 8, 2, 32768, 0, 3, ""},
                      Case{"greedy", false, 4, 1, 8192, 0, 3, ""}, Case{"greedy", true, 8, 4, 32768, 0, 3, ""},
                      Case{"wlb", false, 4, 1, 8192, 0, 3, ""}, Case{"wlb", true, 4, 1, 32768, 40960, 3, ""},
                      Case{"wlb", true, 8, 2, 16384, 20480, 1, ""}, Case{"wlb", false, 6, 3, 4096, 8192, 0, ""},
                      Case{"wlb", true, 4, 2, 32768, 0, 5, "none"}, Case{"wlb", true, 2, 1, 1024, 1024, 2, ""}),
    [](const auto& info) {
      const Case& c = info.param;
      return c.kind + (c.real ? "_real" : "_synthetic") + "_M" + std::to_string(c.M) + "_dp" + std::to_string(c.dp) +
             "_delay" + std::to_string(c.max_delay) + (c.thresholds == "none" ? "_noqueues" : "");
    });

TEST(Packers, FixedIsStreamOrderInContiguousReplicaBlocks) {
  VectorDocSource src({5, 3, 9, 2, 7});
  auto pk = make_packer(params("fixed", 4, 2, 4), test_cost());
  const auto plan = pk->plan_step(0, src);
  // Stream: doc0[0,5) doc1[0,3) doc2[0,9) -> 16 tokens cut every 4.
  const std::vector<std::vector<Span>> expect = {
      {{0, 0, 4}}, {{0, 4, 1}, {1, 0, 3}}, {{2, 0, 4}}, {{2, 4, 4}}};
  ASSERT_EQ(plan.micro_batches.size(), 2u);
  EXPECT_EQ(plan.micro_batches[0][0].spans, expect[0]);
  EXPECT_EQ(plan.micro_batches[0][1].spans, expect[1]);
  EXPECT_EQ(plan.micro_batches[1][0].spans, expect[2]);
  EXPECT_EQ(plan.micro_batches[1][1].spans, expect[3]);
  // doc2's last token is carried to the next step as a span with offset 8.
  const auto next = pk->plan_step(1, src);
  EXPECT_EQ(next.micro_batches[0][0].spans.front(), (Span{2, 8, 1}));
}

TEST(Packers, BalanceOrderingOnLongTailedStreams) {
  // docs/wlb-llm.md §2.5 / Table 2: original (fixed) >= Fixed-Len Greedy >= WLB on
  // latency imbalance; the paper's 7B-128K setting N = 4, S = 128K.
  const CostModel cost = test_cost();
  for (int real = 0; real < 2; ++real) {
    const std::int64_t S = 131072;
    const auto lens = real ? sample_lengths(load_lengths_json(wlb_test::dist_path()), 40000, 3)
                           : wlb_test::long_tail_lengths(20000, S, 5);
    double lat[3], attn[3];
    int k = 0;
    for (const char* kind : {"fixed", "greedy", "wlb"}) {
      PackerParams p = params(kind, 4, 1, S, kind == std::string("wlb") ? S * 5 / 4 : 0);
      p.thresholds = kind == std::string("wlb") ? std::vector<std::int64_t>{S / 4, S / 2} : std::vector<std::int64_t>{};
      p.max_delay = 8;  // N = 4: the >= 64K queue fills about every 6 steps on this tail
      auto pk = make_packer(p, cost);
      VectorDocSource src(lens);
      std::vector<StepMetrics> ms;
      for (int s = 0; s < 300; ++s) ms.push_back(step_metrics(pk->plan_step(s, src), cost, 1));
      const auto run = summarize(ms);
      lat[k] = run.latency_imbalance;
      attn[k] = run.attention_imbalance;
      ++k;
    }
    SCOPED_TRACE(real ? "dist_wlbllm" : "synthetic");
    EXPECT_LE(lat[2], lat[1]);
    EXPECT_LE(lat[1], lat[0]);
    EXPECT_LE(attn[1], attn[0]);
    EXPECT_LE(attn[2], attn[1]);
    if (real) {
      EXPECT_LT(lat[2], 1.10);  // WLB-LLM, 2 queues: 1.05 in Table 2
    }
    std::printf("%s: latency imbalance fixed %.3f greedy %.3f wlb %.3f; attention %.3f %.3f %.3f\n",
                real ? "dist_wlbllm" : "synthetic", lat[0], lat[1], lat[2], attn[0], attn[1], attn[2]);
  }
}

TEST(Packers, SaveLoadContinuesIdentically) {
  const auto lens = sample_lengths(load_lengths_json(wlb_test::dist_path()), 5000, 17);
  for (const char* kind : {"fixed", "greedy", "wlb"}) {
    SCOPED_TRACE(kind);
    PackerParams p = params(kind, 4, 2, 16384, kind == std::string("wlb") ? 20480 : 0);
    p.cp = 2;
    p.sharding = "adaptive";
    auto a = make_packer(p, test_cost());
    SampledDocSource src_a(lens, 5);
    for (int s = 0; s < 37; ++s) a->plan_step(s, src_a);
    const auto state = a->save_state();
    // A fresh packer (other thresholds on purpose: the state carries them).
    PackerParams q = p;
    if (q.kind == "wlb") q.thresholds = {1000};
    auto b = make_packer(q, test_cost());
    b->load_state(state);
    EXPECT_EQ(b->save_state(), state);
    SampledDocSource src_b(lens, 5);
    src_b.seek(src_a.drawn());
    for (int s = 37; s < 80; ++s) {
      const auto pa = a->plan_step(s, src_a);
      const auto pb = b->plan_step(s, src_b);
      ASSERT_EQ(pa.micro_batches.size(), pb.micro_batches.size());
      for (std::size_t r = 0; r < pa.micro_batches.size(); ++r) {
        ASSERT_EQ(pa.micro_batches[r].size(), pb.micro_batches[r].size());
        for (std::size_t i = 0; i < pa.micro_batches[r].size(); ++i)
          ASSERT_EQ(pa.micro_batches[r][i].spans, pb.micro_batches[r][i].spans) << "step " << s;
        EXPECT_EQ(pa.sharding[r], pb.sharding[r]);
      }
      EXPECT_EQ(pa.delay_token_steps, pb.delay_token_steps);
    }
  }
}

TEST(Packers, LoadStateRejectsForeignOrCorruptState) {
  auto fixed = make_packer(params("fixed", 4, 1, 1024), test_cost());
  auto wlb = make_packer(params("wlb", 4, 1, 1024), test_cost());
  EXPECT_THROW(wlb->load_state(fixed->save_state()), wlb::core::CheckpointError);
  auto st = wlb->save_state();
  st.pop_back();
  EXPECT_THROW(wlb->load_state(st), wlb::core::CheckpointError);
  EXPECT_THROW(wlb->load_state({1, 2, 3}), wlb::core::CheckpointError);
}

TEST(Packers, WlbNeverWaitsPastMaxDelay) {
  const auto lens = sample_lengths(load_lengths_json(wlb_test::dist_path()), 20000, 23);
  for (int D : {0, 1, 2, 4, 8}) {
    PackerParams p = params("wlb", 8, 1, 32768, 32768);
    p.max_delay = D;
    p.thresholds = {2048, 8192, 16384};  // aggressive queues: many outliers wait
    auto pk = make_packer(p, test_cost());
    VectorDocSource src(lens);
    std::int64_t worst = 0, delayed = 0;
    for (int s = 0; s < 200; ++s) {
      const auto plan = pk->plan_step(s, src);
      worst = std::max(worst, plan.max_delay_steps);
      delayed += plan.delayed_spans;
    }
    // Pending pieces are not overdue either.
    EXPECT_LE(worst, D) << "max_delay " << D;
    if (D == 0) {
      EXPECT_EQ(delayed, 0);
    }
    if (D >= 2) {
      EXPECT_GT(delayed, 0);
    }
  }
}

TEST(Packers, AutoThresholdsFollowTheOfflineProcedure) {
  const auto lens = sample_lengths(load_lengths_json(wlb_test::dist_path()), 20000, 31);
  PackerParams p = params("wlb", 4, 1, 131072, 163840);
  std::vector<ThresholdTrial> trials;
  const auto th = choose_outlier_thresholds(lens, p, test_cost(), 48, 1.0, &trials);
  EXPECT_EQ(trials.size(), 26u);
  EXPECT_TRUE(std::is_sorted(th.begin(), th.end()));
  const ThresholdTrial* chosen = nullptr;
  double best = 1e9;
  for (const auto& t : trials) {
    if (t.thresholds == th) chosen = &t;
    if (t.mean_delay <= 1.0) best = std::min(best, t.imbalance);
  }
  ASSERT_NE(chosen, nullptr);
  EXPECT_LE(chosen->mean_delay, 1.0);
  EXPECT_LE(chosen->imbalance, best * 1.005 + 1e-12);
  EXPECT_FALSE(th.empty());  // on this long tail, queues pay off

  wlb::core::Config cfg;
  cfg.balance.packer = "wlb";
  cfg.train.max_seq_len = 4096;
  EXPECT_THROW(make_packer(cfg, test_cost()), wlb::core::ConfigError);  // auto without a sample
  EXPECT_NO_THROW(make_packer(cfg, test_cost(), lens));
  cfg.balance.outlier_thresholds = "1024 2048";
  EXPECT_NO_THROW(make_packer(cfg, test_cost()));
}

TEST(Packers, ParamsValidation) {
  EXPECT_THROW(make_packer(params("magic", 4, 1, 64), test_cost()), wlb::core::ConfigError);
  EXPECT_THROW(make_packer(params("fixed", 4, 3, 64), test_cost()), wlb::core::ConfigError);
  EXPECT_THROW(make_packer(params("wlb", 4, 1, 64, 32), test_cost()), wlb::core::ConfigError);
  EXPECT_THROW(parse_thresholds("9 3"), wlb::core::ConfigError);
  EXPECT_THROW(parse_thresholds("auto"), wlb::core::ConfigError);
  EXPECT_EQ(parse_thresholds("none"), std::vector<std::int64_t>{});
  EXPECT_EQ(parse_thresholds("100 2000"), (std::vector<std::int64_t>{100, 2000}));
}

TEST(Packers, ZeroLengthDocumentIsADataError) {
  VectorDocSource src({10, 0, 5});
  auto pk = make_packer(params("greedy", 2, 1, 64), test_cost());
  EXPECT_THROW(pk->plan_step(0, src), wlb::core::DataError);
}

TEST(Packers, ReplicaAssignmentBalancesAndFillsEvenly) {
  const std::vector<double> costs{9, 1, 8, 2, 7, 3, 6, 4};
  const auto rep = assign_to_replicas(costs, 4);
  ASSERT_EQ(rep.size(), 4u);
  std::vector<int> seen(costs.size(), 0);
  for (const auto& r : rep) {
    EXPECT_EQ(r.size(), 2u);
    double load = 0;
    for (auto j : r) {
      seen[j]++;
      load += costs[j];
    }
    EXPECT_DOUBLE_EQ(load, 10.0);
  }
  for (int s : seen) EXPECT_EQ(s, 1);
  EXPECT_THROW(assign_to_replicas(costs, 3), wlb::core::ConfigError);
}

TEST(Packers, StepMetricsDefinitions) {
  StepPlan plan;
  plan.micro_batches = {{MicroBatch{{{0, 0, 4}}}, MicroBatch{{{1, 0, 2}, {2, 0, 2}}}}};
  plan.sharding = {{Sharding::Sequence, Sharding::Sequence}};
  plan.tokens = 8;
  plan.delay_token_steps = 4;
  plan.max_delay_steps = 2;
  CostModel m;
  m.b = 1;
  const auto s = step_metrics(plan, m, 1);
  EXPECT_DOUBLE_EQ(s.attention_imbalance, 16.0 / 12.0);  // Σd²: 16 vs 8
  EXPECT_DOUBLE_EQ(s.mean_delay_steps, 0.5);
  EXPECT_EQ(s.max_delay_steps, 2);
  EXPECT_DOUBLE_EQ(s.cp_imbalance, 1.0);
}

// plan.lengths is opened only when it is a regular file: a FIFO would block
// the open forever and a device be read without end.
TEST(DocSource, LengthsFileMustBeARegularFile) {
  const std::string fifo = "lengths-fifo.json";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {fifo, std::string("/dev/zero")}) {
    try {
      wlb::balance::load_lengths_json(path);
      ADD_FAILURE() << "expected DataError for " << path;
    } catch (const wlb::core::DataError& e) {
      EXPECT_NE(std::string(e.what()).find("document lengths file '" + path + "' is not a regular file"),
                std::string::npos) << e.what();
    }
  }
  ::unlink(fifo.c_str());
}
