// Sequence parallelism of the model (Korthikanti et al. 2022 §4.2.2): on 2
// ranks, a tp=2 model with sequence_parallel = true gives the same loss, the
// same parameter gradients (every shard; the TP-replicated norm weights equal
// on both ranks) and the same stage output / stage-input gradient rows as the
// tp=2 model without SP computed on the same ranks in the same test. Token
// counts 13 (uneven over tp=2: 7 + 6) and 1 (T < tp: rank 1 holds no row).
// fp64; tolerance 1e-11 relative. Also: full/selective recompute under SP is
// bit-identical to recompute = none under SP.
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

// init_std 0.3: large enough that every non-linearity matters.
const core::ModelConfig kModel = tiny_model(2, 16, 4, 2, 24, 0.3);

constexpr std::int64_t kVocab = 23;  // 12 + 11 over tp = 2

std::vector<token_t> ids_for(std::int64_t T) {
  std::mt19937_64 rng(99);  // same on every rank
  std::uniform_int_distribution<int> u(0, int(kVocab) - 1);
  std::vector<token_t> ids(T);
  for (auto& i : ids) i = token_t(u(rng));
  return ids;
}

ModelShard shard(bool embedding, bool head) {
  const auto w = comm::Communicator::world();
  ModelShard s;
  s.embedding = embedding;
  s.head = head;
  s.tp_rank = w.rank();
  s.tp_size = w.size();
  return s;
}

double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-8); }

void expect_same_grads(const ParamRegistry<double>& got, const ParamRegistry<double>& want, double tol) {
  for (const auto& p : got) {
    const auto hg = host_vec(p.grad), hw = host_vec(want.at(p.name).grad);
    ASSERT_EQ(hg.size(), hw.size()) << p.name;
    double worst = 0;
    for (std::size_t i = 0; i < hg.size(); ++i) worst = std::max(worst, rel(hg[i], hw[i]));
    EXPECT_LE(worst, tol) << p.name;
    if (p.tp_replicated) {  // every TP rank must hold the same (full) gradient
      std::vector<double> mx = hg, mn = hg;
      comm::Communicator::world().allreduce(mx.data(), mx.size(), comm::ReduceOp::Max);
      comm::Communicator::world().allreduce(mn.data(), mn.size(), comm::ReduceOp::Min);
      EXPECT_EQ(mx, mn) << p.name << " differs between TP ranks";
    }
  }
}

/// Loss and gradients of the whole model (embedding to loss) on T tokens.
void whole_model_matches(std::int64_t T, std::vector<std::int64_t> cu) {
  const auto world = comm::Communicator::world();
  const auto cfg = kModel;
  const auto mb = make_micro_batch(cu, ids_for(T));
  const double gs = 1.0 / double(std::max<std::int64_t>(mb.target_tokens, 1));
  Transformer<double> ref(cfg, kVocab, shard(true, true), world, 1, 13);
  Transformer<double> sp(cfg, kVocab, shard(true, true), world, 1, 13, /*sequence_parallel=*/true);
  ASSERT_TRUE(sp.sequence_parallel());
  ASSERT_EQ(sp.residual_rows(T), split_range(T, 2, world.rank()));
  for (auto* m : {&ref, &sp}) {
    m->params().init_parameters(5);
    m->zero_grad();
  }
  const double loss_ref = ref.forward(0, mb).loss;
  ref.backward(0, mb, {}, gs);
  const double loss_sp = sp.forward(0, mb).loss;
  sp.backward(0, mb, {}, gs);
  EXPECT_NEAR(loss_sp, loss_ref, 1e-12 * std::fabs(loss_ref)) << "T=" << T;
  expect_same_grads(sp.params(), ref.params(), 1e-11);
}

}  // namespace

TEST(ModelSP, WholeModelUnevenTokens) {
  ASSERT_EQ(comm::Communicator::world().size(), 2);
  whole_model_matches(13, {0, 5, 6, 13});  // rows 0..6 on rank 0, 7..12 on rank 1
}

namespace {
/// A middle stage (no embedding, no head): output rows and input-gradient rows.
void middle_stage_matches(std::int64_t T, std::vector<std::int64_t> cu) {
  const auto world = comm::Communicator::world();
  const auto cfg = kModel;
  const std::int64_t d = cfg.d_model;
  const auto mb = make_micro_batch(cu, {});
  Transformer<double> ref(cfg, kVocab, shard(false, false), world, 1, 13);
  Transformer<double> sp(cfg, kVocab, shard(false, false), world, 1, 13, true);
  ref.params().init_parameters(8);
  sp.params().init_parameters(8);
  std::mt19937_64 rng(3);  // same input on both ranks
  View2<double> in("in", T, d), gout("gout", T, d);
  fill_normal(in, rng);
  fill_normal(gout, rng);
  const auto own = sp.residual_rows(T);
  const std::int64_t t0 = own.first, ts = own.second;  // not structured bindings: a lambda captures them (C++17)
  auto rows = [&](const View2<double>& v) {
    View2<double> r("rows", ts, d);
    Kokkos::deep_copy(r, Kokkos::subview(v, std::pair<std::int64_t, std::int64_t>(t0, t0 + ts), Kokkos::ALL));
    return r;
  };
  ref.zero_grad();
  sp.zero_grad();
  const auto o_ref = host_vec(ref.forward(0, mb, in).hidden);
  const auto out_sp = sp.forward(0, mb, rows(in)).hidden;
  ASSERT_EQ(std::int64_t(out_sp.extent(0)), ts);
  const auto o_sp = host_vec(out_sp);
  for (std::size_t i = 0; i < o_sp.size(); ++i)
    ASSERT_NEAR(o_sp[i], o_ref[std::size_t(t0 * d) + i], 1e-12 * (1 + std::fabs(o_sp[i])));
  const auto d_ref = host_vec(ref.backward(0, mb, gout));
  const auto d_sp = host_vec(sp.backward(0, mb, rows(gout)));
  ASSERT_EQ(std::int64_t(d_sp.size()), ts * d);
  for (std::size_t i = 0; i < d_sp.size(); ++i)
    ASSERT_NEAR(d_sp[i], d_ref[std::size_t(t0 * d) + i], 1e-12 * (1 + std::fabs(d_sp[i])));
  expect_same_grads(sp.params(), ref.params(), 1e-11);
}
}  // namespace

TEST(ModelSP, MiddleStageRowsMatch) { middle_stage_matches(13, {0, 7, 13}); }

TEST(ModelSP, MiddleStageFewerTokensThanRanks) {
  middle_stage_matches(1, {0, 1});  // rank 1 holds 0 rows and still joins every collective
}

TEST(ModelSP, RecomputeBitIdentical) {
  const auto world = comm::Communicator::world();
  const std::int64_t T = 13;
  const auto mb = make_micro_batch({0, 4, 13}, ids_for(T));
  auto run = [&](const std::string& rc) {
    auto cfg = kModel;
    cfg.recompute = rc;
    Transformer<double> m(cfg, kVocab, shard(true, true), world, 2, T, true);
    m.params().init_parameters(5);
    m.zero_grad();
    // Two slots in flight, as a pipeline keeps them.
    const double l0 = m.forward(0, mb).loss;
    const double l1 = m.forward(1, mb).loss;
    m.backward(1, mb, {}, 0.5);
    m.backward(0, mb, {}, 0.25);
    std::vector<double> out{l0, l1};
    for (const auto& p : m.params()) {
      const auto g = host_vec(p.grad);
      out.insert(out.end(), g.begin(), g.end());
    }
    return out;
  };
  const auto none = run("none");
  EXPECT_EQ(run("full"), none);
  EXPECT_EQ(run("selective"), none);
}
