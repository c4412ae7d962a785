// TP layout equivalence of the model (DESIGN §3): on 2 ranks, a tp=2 model
// (heads, kv heads, FFN columns and the vocabulary split; uneven vocab 23 →
// 12+11 and FFN 25 → 13+12) gives the same loss, the same gradient of every
// parameter element (its shard against the matching slice of the tp=1
// gradient) and the same stage-input gradient as a tp=1 model computed on
// each rank in the same test. fp64; tolerance 1e-10 relative.
#include "test_util.hpp"
#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/model/transformer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace wlb;
using namespace wlb::model;
using namespace wlb::test;

namespace {

// FFN 25: uneven shards on tp = 2; init_std 0.3: every non-linearity matters.
const core::ModelConfig kModel = tiny_model(2, 16, 4, 2, 25, 0.3);

constexpr std::int64_t kVocab = 23;

std::vector<token_t> ids_for(std::int64_t T) {
  std::mt19937_64 rng(99);  // same on every rank
  std::uniform_int_distribution<int> u(0, int(kVocab) - 1);
  std::vector<token_t> ids(T);
  for (auto& i : ids) i = token_t(u(rng));
  return ids;
}

void expect_shard_matches(const ParamRegistry<double>& part, const ParamRegistry<double>& full, double tol) {
  for (const auto& p : part) {
    const auto& g = full.at(p.name);
    const auto hp = host_vec(p.grad), hf = host_vec(g.grad);
    double worst = 0;
    for (std::int64_t i = 0; i < p.local_numel(); ++i) {
      const double want = hf[p.global_index(i)];
      worst = std::max(worst, std::fabs(hp[i] - want) / std::max(std::fabs(want), 1e-8));
    }
    EXPECT_LE(worst, tol) << p.name;
  }
}

}  // namespace

TEST(ModelTP, TwoRanksMatchOneRank) {
  const auto world = comm::Communicator::world();
  ASSERT_EQ(world.size(), 2);
  const auto cfg = kModel;
  const auto mb = make_micro_batch({0, 5, 6, 13}, ids_for(13));
  const double gs = 1.0 / double(mb.target_tokens);

  Transformer<double> ref(cfg, kVocab, ModelShard{}, comm::Communicator(), 1, 13);
  ref.params().init_parameters(5);
  ref.zero_grad();
  const double loss_ref = ref.forward(0, mb).loss;
  ref.backward(0, mb, {}, gs);

  ModelShard s;
  s.tp_rank = world.rank();
  s.tp_size = 2;
  Transformer<double> tp(cfg, kVocab, s, world, 1, 13);
  tp.params().init_parameters(5);
  tp.zero_grad();
  const double loss_tp = tp.forward(0, mb).loss;
  tp.backward(0, mb, {}, gs);

  EXPECT_NEAR(loss_tp, loss_ref, 1e-12 * std::fabs(loss_ref));
  expect_shard_matches(tp.params(), ref.params(), 1e-10);
}

TEST(ModelTP, MiddleStageInputGradientMatches) {
  const auto world = comm::Communicator::world();
  const auto cfg = kModel;
  const auto mb = make_micro_batch({0, 7, 13}, {});
  ModelShard s1;
  s1.embedding = false;
  s1.head = false;
  Transformer<double> ref(cfg, kVocab, s1, comm::Communicator(), 1, 13);
  ModelShard s2 = s1;
  s2.tp_rank = world.rank();
  s2.tp_size = 2;
  Transformer<double> tp(cfg, kVocab, s2, world, 1, 13);
  ref.params().init_parameters(8);
  tp.params().init_parameters(8);
  std::mt19937_64 rng(3);  // same input on both ranks
  View2<double> in("in", 13, 16), gout("gout", 13, 16);
  fill_normal(in, rng);
  fill_normal(gout, rng);
  ref.zero_grad();
  tp.zero_grad();
  const auto o_ref = host_vec(ref.forward(0, mb, in).hidden);
  const auto o_tp = host_vec(tp.forward(0, mb, in).hidden);
  for (std::size_t i = 0; i < o_ref.size(); ++i) ASSERT_NEAR(o_tp[i], o_ref[i], 1e-12 * (1 + std::fabs(o_ref[i])));
  const auto d_ref = host_vec(ref.backward(0, mb, gout));
  const auto d_tp = host_vec(tp.backward(0, mb, gout));
  for (std::size_t i = 0; i < d_ref.size(); ++i) ASSERT_NEAR(d_tp[i], d_ref[i], 1e-12 * (1 + std::fabs(d_ref[i])));
  expect_shard_matches(tp.params(), ref.params(), 1e-10);
}
