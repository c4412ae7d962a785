// Unit tests of the memory model (pipeline/memory_model.hpp): the in-flight
// count against a naive walk of each schedule's action list, the ZeRO-1 and
// SP terms against their rules, the parameter term against a real
// ParamRegistry, and huge inputs (no overflow, no time).
#include "wlb4d/pipeline/memory_model.hpp"

#include "wlb4d/core/config.hpp"
#include "wlb4d/model/params.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <set>

namespace {
using namespace wlb;

core::Config base() {
  core::Config c;
  c.model.layers = 8;
  c.model.d_model = 64;
  c.model.heads = 4;
  c.model.kv_heads = 2;
  c.model.ffn_hidden = 160;
  c.train.micro_batches = 8;
  c.train.max_seq_len = 128;
  return c;
}

// Naive: the most forwards whose backward has not run, on any one chunk.
int naive_in_flight(const std::vector<pipeline::Action>& list) {
  std::map<int, std::set<int>> pending;
  std::size_t most = 0;
  for (const auto& a : list) {
    if (a.type == pipeline::ActionType::Forward) pending[a.virtual_stage].insert(a.micro_batch);
    if (a.type == pipeline::ActionType::Backward) pending[a.virtual_stage].erase(a.micro_batch);
    for (const auto& kv : pending) most = std::max(most, kv.second.size());
  }
  return int(most);
}

TEST(MemoryModel, InFlightMatchesTheActionList) {
  struct Case {
    const char* schedule;
    int pp, v, m;
  };
  for (const Case k : {Case{"gpipe", 4, 1, 8}, Case{"1f1b", 4, 1, 8}, Case{"1f1b", 4, 1, 2}, Case{"interleaved", 2, 2, 4},
                       Case{"interleaved", 4, 2, 8}, Case{"bfs", 2, 2, 4}, Case{"1f1b", 1, 1, 4}}) {
    core::ParallelConfig par;
    par.pp = k.pp;
    par.virtual_stages = k.v;
    par.schedule = k.schedule;
    for (int r = 0; r < k.pp; ++r) {
      const int got = pipeline::micro_batches_in_flight(par, r, k.m);
      EXPECT_EQ(got, naive_in_flight(pipeline::training_action_list(par, r, k.m, true)))
          << k.schedule << " p=" << k.pp << " v=" << k.v << " m=" << k.m << " r=" << r;
      if (std::string(k.schedule) == "gpipe" || std::string(k.schedule) == "bfs") {
        EXPECT_EQ(got, k.m);
      }
      if (std::string(k.schedule) == "1f1b") {
        EXPECT_EQ(got, std::min(k.m, k.pp - r));
      }
    }
  }
}

TEST(MemoryModel, ParametersEqualTheRegistry) {
  core::Config c = base();
  c.parallel.pp = 2;
  c.parallel.tp = 2;
  c.model.ffn_hidden = 161;  // uneven over TP: rank 0 holds one column more
  const std::int64_t vocab = 97;
  for (int r = 0; r < 2; ++r)
    for (int t = 0; t < 2; ++t) {
      model::ModelShard sh;
      sh.layer_begin = 4 * r;
      sh.layer_end = 4 * r + 4;
      sh.embedding = r == 0;
      sh.head = r == 1;
      sh.tp_rank = t;
      sh.tp_size = 2;
      model::ParamRegistry<float> reg(c.model, vocab, sh);
      const auto e = pipeline::predict_memory(c, vocab, r, t);
      EXPECT_DOUBLE_EQ(e.term("parameters"), 4.0 * double(reg.local_numel())) << r << "," << t;
      EXPECT_DOUBLE_EQ(e.term("gradients"), e.term("parameters"));
      EXPECT_DOUBLE_EQ(e.term("optimizer_state"), 2 * e.term("parameters"));
    }
}

TEST(MemoryModel, ZeroOneDividesTheOptimizerStateByTheGradientGroup) {
  core::Config c = base();
  c.parallel.dp = 2;
  c.parallel.cp = 3;
  const double full = pipeline::predict_memory(c, 1000, 0).term("optimizer_state");
  c.parallel.zero = 1;
  const auto e = pipeline::predict_memory(c, 1000, 0);
  const double P = e.term("parameters") / 4;
  EXPECT_DOUBLE_EQ(e.term("optimizer_state"), 2 * 4 * std::ceil(P / 6));
  EXPECT_NEAR(e.term("optimizer_state"), full / 6, 8.0);
  EXPECT_DOUBLE_EQ(e.term("parameters"), pipeline::predict_memory(c, 1000, 0).term("parameters"));
}

TEST(MemoryModel, SequenceParallelDividesTheResidualRegionByTp) {
  core::Config c = base();
  c.parallel.tp = 2;
  c.parallel.pp = 2;
  c.model.recompute = "full";  // only x_in per layer, and x_out: all residual region
  const auto off = pipeline::predict_memory(c, 1000, 0);
  c.parallel.sequence_parallel = true;
  const auto on = pipeline::predict_memory(c, 1000, 0);
  EXPECT_DOUBLE_EQ(on.term("activations"), off.term("activations") / 2);
  EXPECT_DOUBLE_EQ(on.term("p2p_buffers"), off.term("p2p_buffers") / 2);
  EXPECT_GT(on.term("sp_gather"), 0);
  // Uneven T/tp: ceil.
  c.train.max_seq_len = 129;
  c.parallel.tp = 2;
  const auto odd = pipeline::predict_memory(c, 1000, 0);
  const double d = c.model.d_model, layers = 4, s = odd.slots;
  EXPECT_DOUBLE_EQ(odd.term("activations"), s * (layers + 1) * d * 65 * 4);
}

TEST(MemoryModel, RecomputeKeepsFewerFields) {
  core::Config c = base();
  const double none = pipeline::predict_memory(c, 1000, 0).term("activations");
  c.model.recompute = "selective";
  const auto sel = pipeline::predict_memory(c, 1000, 0);
  c.model.recompute = "full";
  const auto full = pipeline::predict_memory(c, 1000, 0);
  EXPECT_LT(full.term("activations"), sel.term("activations"));
  EXPECT_LT(sel.term("activations"), none);
  // selective drops rstd1, xn1, rstd2, xn2, act: (2d + 2 + F) per layer per token.
  const double C = 128, d = 64, F = 160, L = 8, s = sel.slots;
  EXPECT_DOUBLE_EQ(none - sel.term("activations"), s * L * (2 * d + 2 + F) * C * 4);
  EXPECT_DOUBLE_EQ(sel.term("recompute_workspace"), (2 * d + 2 + F) * C * 4);
}

TEST(MemoryModel, HugeInputsGiveFiniteNumbersQuickly) {
  const auto t0 = std::chrono::steady_clock::now();
  for (auto set : {+[](core::Config& c) { c.model.layers = 100000000; },
                   +[](core::Config& c) { c.train.micro_batches = 100000000; c.parallel.schedule = "gpipe"; c.parallel.pp = 4; },
                   +[](core::Config& c) { c.train.max_seq_len = 2000000000; },
                   +[](core::Config& c) { c.model.d_model = 1 << 20; c.model.ffn_hidden = 1 << 30; c.model.heads = 1 << 14; c.model.kv_heads = 1 << 14; }}) {
    core::Config c = base();
    set(c);
    const auto e = pipeline::max_memory(pipeline::predict_memory_stages(c, 1 << 30));
    EXPECT_TRUE(std::isfinite(e.total()));
    EXPECT_GT(e.total(), 1e12);  // > 1 TB: the trainer's bound refuses it
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

}  // namespace
