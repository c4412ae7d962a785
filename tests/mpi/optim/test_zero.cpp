// ZeRO-1 (optim::Optimizer with zero = 1) against the replicated optimizer
// (zero = 0) fed the same per-rank gradients, on a dp group of 1 or 3 ranks:
// the parameters, the global gradient norm (clipping active) and the
// gathered AdamW moments must agree, while each rank holds only its
// model::split_range share of the moments (uneven over 3 ranks, cutting
// through tensors).
#include "test_util.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/grid/process_grid.hpp"
#include "wlb4d/model/params.hpp"
#include "wlb4d/optim/optimizer.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <vector>

using namespace wlb;

namespace {

/// Gradients that differ per rank and per step (the DP replicas' partial sums).
void fill_grads(model::ParamRegistry<float>& reg, int rank, int step) {
  auto h = Kokkos::create_mirror_view(reg.grads());
  for (std::size_t i = 0; i < h.extent(0); ++i)
    h(i) = float(0.01 * std::sin(0.37 * double(i) + 1.3 * rank + 0.7 * step));
  Kokkos::deep_copy(reg.grads(), h);
}

std::vector<float> host(const Vec& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<float>(h.data(), h.data() + h.extent(0));
}

}  // namespace

TEST(Zero1, SameUpdateAsReplicatedAdamWWithShardedMoments) {
  const int R = test::world_size(), me = test::world_rank();
  grid::ProcessGrid g(R, 1, 1, 1, comm::WaitMode::Yield, MPI_COMM_WORLD);
  const auto mc = test::tiny_model(2, 16, 2, 1, 24);
  const std::int64_t vocab = 37;
  model::ParamRegistry<float> a(mc, vocab, model::ModelShard{}), b(mc, vocab, model::ModelShard{});
  a.init_parameters(11);
  b.init_parameters(11);
  core::OptimConfig oc;
  oc.lr = 1e-2;
  oc.min_lr = 1e-3;
  oc.warmup_steps = 1;
  oc.weight_decay = 0.1;
  oc.grad_clip = 0.05;  // below the norm: the clip factor depends on the global norm
  oc.eps = 1e-6;
  optim::Optimizer replicated(oc, 4, g, {&a}, 0), sharded(oc, 4, g, {&b}, 1);

  const std::int64_t N = a.local_numel();
  const auto [off, cnt] = model::split_range(N, R, me);
  ASSERT_EQ(std::int64_t(sharded.exp_avg()[0].extent(0)), cnt);  // the memory ZeRO-1 saves
  ASSERT_EQ(std::int64_t(sharded.exp_avg_sq()[0].extent(0)), cnt);
  ASSERT_EQ(sharded.shard_begin(0), off);
  ASSERT_EQ(std::int64_t(replicated.exp_avg()[0].extent(0)), N);

  for (int step = 0; step < 3; ++step) {
    fill_grads(a, me, step);
    fill_grads(b, me, step);
    replicated.reduce_gradients();
    sharded.reduce_gradients();
    const auto ra = replicated.step(step, 1.0);
    const auto rb = sharded.step(step, 1.0);
    ASSERT_LT(ra.clip_factor, 1.0) << "clipping must be active";
    EXPECT_NEAR(rb.grad_norm, ra.grad_norm, 1e-12 * ra.grad_norm) << "step " << step;
    EXPECT_NEAR(rb.clip_factor, ra.clip_factor, 1e-12) << "step " << step;
    const auto va = host(a.values()), vb = host(b.values());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < va.size(); ++i) bad += std::abs(va[i] - vb[i]) > 1e-6f * (std::abs(va[i]) + 1e-3f);
    EXPECT_EQ(bad, 0u) << "step " << step << ": parameters differ (every rank holds the all-gathered values)";
  }
  // The shards, gathered, are the replicated moments.
  const auto ma = host(replicated.exp_avg()[0]), mb = host(sharded.exp_avg()[0]);
  std::vector<int> counts(R), displs(R);
  for (int r = 0; r < R; ++r) {
    const auto [o, n] = model::split_range(N, R, r);
    counts[r] = int(n);
    displs[r] = int(o);
  }
  std::vector<float> whole(std::size_t(N), -1.0f);
  g.dpcp().allgatherv(mb.data(), mb.size(), whole.data(), counts, displs);
  std::size_t bad = 0;
  for (std::int64_t i = 0; i < N; ++i) bad += std::abs(whole[i] - ma[i]) > 1e-6f * (std::abs(ma[i]) + 1e-6f);
  EXPECT_EQ(bad, 0u) << "gathered first moments differ from the replicated ones";
}

TEST(Zero1, RejectsUnknownStage) {
  grid::ProcessGrid g(1, 1, 1, 1, comm::WaitMode::Yield, MPI_COMM_SELF);
  model::ParamRegistry<float> a(test::tiny_model(2, 16, 2, 1, 24), 37, model::ModelShard{});
  const std::vector<model::ParamRegistry<float>*> chunks = {&a};
  EXPECT_THROW(optim::Optimizer(core::OptimConfig{}, 4, g, chunks, 2), core::ConfigError);
}

// A non-finite gradient names the step counted from 1 (as the progress lines)
// and the first such tensor; under ZeRO-1 the rank that owns it names it.
TEST(Zero1, NonFiniteGradientNamesStepFromOneAndTheTensor) {
  for (int zero : {0, 1}) {
    grid::ProcessGrid g(1, 1, 1, 1, comm::WaitMode::Yield, MPI_COMM_SELF);
    model::ParamRegistry<float> a(test::tiny_model(2, 16, 2, 1, 24), 37, model::ModelShard{});
    a.init_parameters(5);
    fill_grads(a, 0, 0);
    const auto& p = a.at("layers.1.mlp.w_up");
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), p.grad);
    h(3) = std::nanf("");
    Kokkos::deep_copy(p.grad, h);
    const std::vector<model::ParamRegistry<float>*> chunks = {&a};
    optim::Optimizer opt(core::OptimConfig{}, 4, g, chunks, zero);
    opt.reduce_gradients();
    try {
      opt.step(2, 1.0);
      ADD_FAILURE() << "no NumericsError (zero=" << zero << ")";
    } catch (const core::NumericsError& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("at step 3 "), std::string::npos) << w;
      EXPECT_NE(w.find("gradient of layers.1.mlp.w_up"), std::string::npos) << w;
    }
  }
}
