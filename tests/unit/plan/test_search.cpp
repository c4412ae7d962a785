// The layout search of wlb4d-plan --search (plan/search.hpp): it never
// proposes what the trainer's deck validation rejects (checked by parsing
// each proposal back as a deck, as wlb4d --check does), it always evaluates
// the deck's own setting, it enumerates every legal layout, and on
// constructed cases it picks the known answer.
#include "wlb4d/core/config.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/pipeline/memory_model.hpp"
#include "wlb4d/plan/search.hpp"
#include "wlb4d/plan/simulate.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <tuple>

using namespace wlb;
using namespace wlb::pipeline;
using namespace wlb::plan;

namespace {

core::Config deck(const std::vector<std::string>& overrides) {
  return core::parse_deck_text("", overrides);
}

// Independent of the search: the text a proposal would be written as, parsed
// and validated as wlb4d --check --check-ranks world does.
bool trainer_accepts(const core::Config& c, int world) {
  try {
    const core::Config back = core::parse_deck_text(core::to_ini(c));
    core::validate_world(back, world);
    return true;
  } catch (const core::ConfigError&) {
    return false;
  }
}

std::vector<std::int64_t> lengths(std::mt19937& rng, int n, std::int64_t lo, std::int64_t hi) {
  std::uniform_int_distribution<std::int64_t> d(lo, hi);
  std::vector<std::int64_t> out;
  for (int i = 0; i < n; ++i) out.push_back(d(rng));
  return out;
}

double peak(const core::Config& c) {
  double p = 0;
  for (const auto& e : predict_memory_stages(c, plan_vocab(c))) p = std::max(p, e.total());
  return p;
}

}  // namespace

// Property: random models, device counts and micro-batch counts.
TEST(LayoutSearch, ProposesOnlyWhatTheTrainerAcceptsAndAlwaysTheDeck) {
  std::mt19937 rng(20261201);
  int searched = 0;
  for (int trial = 0; trial < 24; ++trial) {
    auto pick = [&](std::vector<int> v) { return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)]; };
    const int heads = pick({1, 2, 3, 4, 6, 8});
    std::vector<int> kvs;
    for (int k = 1; k <= heads; ++k)
      if (heads % k == 0) kvs.push_back(k);
    const int kv = pick(kvs), hd = pick({2, 4, 8});
    const int layers = pick({1, 2, 3, 4, 6, 8}), ffn = pick({1, 3, 8, 24});
    const int world = pick({1, 2, 3, 4, 6, 8, 12, 16}), m = pick({1, 2, 3, 4, 6, 8}), dpn = pick({1, 2, 4, 8});
    core::Config d = deck({"model.layers=" + std::to_string(layers), "model.heads=" + std::to_string(heads),
                           "model.kv_heads=" + std::to_string(kv), "model.d_model=" + std::to_string(heads * hd),
                           "model.ffn_hidden=" + std::to_string(ffn), "model.vocab_size=50",
                           "train.micro_batches=" + std::to_string(m), "train.max_seq_len=32",
                           "plan.devices_per_node=" + std::to_string(dpn),
                           "plan.search_micro_batches=" + std::to_string(m) + " " + std::to_string(2 * m),
                           "plan.steps=2", "plan.search_coarse_steps=1", "plan.search_refine=3",
                           "plan.flops_per_s=1e9", "balance.packer=greedy"});
    SearchCounts counts;
    const auto cands = search_candidates(d, world, &counts);
    EXPECT_EQ(counts.enumerated,
              counts.rejected + counts.off_node + counts.symmetric + static_cast<long>(cands.size()));
    for (const auto& c : cands) {
      ASSERT_TRUE(trainer_accepts(c, world)) << "trial " << trial;
      EXPECT_EQ(d.plan.devices_per_node % c.parallel.tp, 0);
    }
    // Completeness: every factorisation the trainer accepts (with the
    // default 1f1b, no recompute, zero 0, no SP) and whose TP fits a node is
    // enumerated.
    std::set<std::tuple<int, int, int, int>> got;
    for (const auto& c : cands) got.emplace(c.parallel.dp, c.parallel.pp, c.parallel.cp, c.parallel.tp);
    for (int tp = 1; tp <= world; ++tp)
      for (int cp = 1; cp <= world; ++cp)
        for (int pp = 1; pp <= world; ++pp) {
          if (world % (tp * cp * pp) != 0) continue;
          core::Config c = d;
          c.parallel.tp = tp;
          c.parallel.cp = cp;
          c.parallel.pp = pp;
          c.parallel.dp = world / (tp * cp * pp);
          if (!trainer_accepts(c, world) || dpn % tp != 0) continue;
          EXPECT_TRUE(got.count({c.parallel.dp, pp, cp, tp})) << c.parallel.dp << " " << pp << " " << cp << " " << tp;
        }
    if (cands.empty()) continue;
    // The deck: a random legal candidate with a random feature setting.
    core::Config user = cands[std::uniform_int_distribution<std::size_t>(0, cands.size() - 1)(rng)];
    user.plan.device_memory_gib = 80;
    const auto lens = lengths(rng, 200, 1, 40);
    const SearchReport rep = search_layouts(user, lens);
    ++searched;
    int deck_rows = 0;
    for (const auto& s : rep.ranked) {
      EXPECT_TRUE(trainer_accepts(s.cfg, world));
      EXPECT_GT(s.step_time_s, 0);
      EXPECT_EQ(s.steps, 2);
      if (s.is_deck) {
        ++deck_rows;
        EXPECT_EQ(s.label(), SearchCandidate{user}.label());
      }
    }
    EXPECT_EQ(deck_rows, 1) << "trial " << trial;
    EXPECT_LE(static_cast<int>(rep.ranked.size()), 4);
    for (std::size_t i = 1; i < rep.ranked.size(); ++i)
      EXPECT_GE(rep.ranked[i - 1].tokens_per_s, rep.ranked[i].tokens_per_s);
  }
  EXPECT_GE(searched, 12);
}

namespace {
// A small model on a 4-device node, alpha-beta and FLOP rates of a CPU-like
// cluster; fixed packing so only the layout differs.
std::vector<std::string> small_model() {
  return {"model.layers=4", "model.d_model=64", "model.heads=4", "model.kv_heads=4", "model.ffn_hidden=128",
          "model.vocab_size=256", "train.micro_batches=4", "train.max_seq_len=256", "balance.packer=fixed",
          "parallel.dp=4", "plan.devices_per_node=4", "plan.flops_per_s=1e10", "plan.intra_alpha_s=2e-5",
          "plan.intra_beta_s_per_byte=1e-9", "plan.steps=4", "plan.search_refine=8"};
}
}  // namespace

TEST(LayoutSearch, ModelThatFitsOneDeviceGoesDataParallel) {
  std::mt19937 rng(1);
  // Short documents: attention (whose per-micro-batch spread DP replicas wait
  // for) is small next to the linear layers.
  const auto rep = search_layouts(deck(small_model()), lengths(rng, 2000, 8, 32));
  std::printf("%s", format_search(rep, 5).c_str());
  ASSERT_FALSE(rep.ranked.empty());
  const auto& p = rep.ranked.front().cfg.parallel;
  EXPECT_EQ(std::make_tuple(p.dp, p.pp, p.cp, p.tp), std::make_tuple(4, 1, 1, 1)) << rep.ranked.front().label();
  // Nothing was needed to fit: no recompute, no ZeRO.
  EXPECT_EQ(rep.ranked.front().cfg.model.recompute, "none");
  EXPECT_EQ(p.zero, 0);
}

TEST(LayoutSearch, OptimizerStateThatDoesNotFitNeedsZeroOrMorePipelineStages) {
  // One head (tp must be 1: TP cannot shard the parameters), 8 layers of d = 512.
  std::vector<std::string> ov;
  for (const auto& o : small_model())
    if (o.rfind("model.", 0) != 0) ov.push_back(o);
  ov.insert(ov.end(), {"model.layers=8", "model.d_model=512", "model.heads=1", "model.kv_heads=1",
                       "model.ffn_hidden=1376", "model.vocab_size=4096", "model.recompute=full"});
  core::Config d = deck(ov);
  // Budget between dp-only with replicated and with sharded AdamW state
  // (both with full recompute, the smallest activations).
  core::Config z1 = d;
  z1.parallel.zero = 1;
  const double replicated = peak(d), sharded = peak(z1);
  ASSERT_LT(sharded, replicated);
  d.plan.device_memory_gib = (replicated + sharded) / 2 / (1024.0 * 1024.0 * 1024.0);
  std::mt19937 rng(2);
  const auto rep = search_layouts(d, lengths(rng, 500, 20, 300));
  ASSERT_FALSE(rep.ranked.empty());
  const auto& best = rep.ranked.front();
  EXPECT_TRUE(best.cfg.parallel.zero == 1 || best.cfg.parallel.pp > 1) << best.label();
  EXPECT_TRUE(best.fits);
  EXPECT_FALSE(rep.deck.fits);  // the deck itself (dp=4, zero 0) is over the budget, and still evaluated
  for (const auto& s : rep.ranked) {
    if (s.is_deck) continue;
    EXPECT_TRUE(s.fits) << s.label();
    EXPECT_FALSE(s.cfg.parallel.pp == 1 && s.cfg.parallel.zero == 0) << s.label();
  }
  EXPECT_GT(rep.counts.over_memory, 0);
}

TEST(LayoutSearch, VeryLongDocumentsGoContextParallel) {
  // 64K context, GQA with one KV head (tp = 1 only). Long documents: half
  // the micro-batches hold one ~60K document (attention-bound), half short
  // ones; DP replicas wait for the slowest, a CP group shares every one.
  auto base = [](std::int64_t) {
    return deck({"model.layers=4", "model.d_model=1024", "model.heads=8", "model.kv_heads=1",
                 "model.ffn_hidden=2752", "model.vocab_size=32000", "train.micro_batches=4",
                 "train.max_seq_len=65536", "balance.packer=fixed", "balance.sharding=adaptive", "parallel.dp=4",
                 "plan.devices_per_node=4", "plan.device_memory_gib=1000", "plan.steps=6",
                 "plan.search_refine=8"});
  };
  std::mt19937 rng(3);
  std::vector<std::int64_t> long_docs;
  for (int i = 0; i < 400; ++i) long_docs.push_back(i % 2 ? 60000 : 1000 + i % 7);
  const auto rep_long = search_layouts(base(0), long_docs);
  ASSERT_FALSE(rep_long.ranked.empty());
  EXPECT_GT(rep_long.ranked.front().cfg.parallel.cp, 1) << rep_long.ranked.front().label();
  // The same deck with short documents: no CP (its K/V gathers buy nothing).
  const auto rep_short = search_layouts(base(0), lengths(rng, 4000, 200, 1200));
  ASSERT_FALSE(rep_short.ranked.empty());
  EXPECT_EQ(rep_short.ranked.front().cfg.parallel.cp, 1) << rep_short.ranked.front().label();
}

TEST(LayoutSearch, RefusesTooFewNodesAndNamesTheKeys) {
  core::Config d = deck(small_model());
  d.plan.nodes = 1;
  d.plan.devices_per_node = 2;
  try {
    search_layouts(d, {10, 20});
    FAIL() << "no error";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("plan.nodes=1 x plan.devices_per_node=2"), std::string::npos) << e.what();
  }
}
