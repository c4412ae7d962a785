// Bucketed DP gradient reduction (comm.bucket_mib, optim::Optimizer
// grads_ready / reduce_gradients) against the unbucketed reduction
// (bucket_mib = 0) of the same per-rank gradients, on a group of 1 or 3 ranks
// (uneven ZeRO-1 ranges that cut through buckets and tensors). The gradients
// are multiples of 2^-10 of magnitude < 2, so every sum is exact in any order:
// the comparison is bitwise and tests which elements were summed, not the
// collective's rounding.
#include "test_util.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/grid/process_grid.hpp"
#include "wlb4d/model/params.hpp"
#include "wlb4d/optim/optimizer.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <set>
#include <vector>

using namespace wlb;

namespace {

/// Per-rank gradients k/1024, k in [-512, 511], shifted by `salt`.
void fill_grads(model::ParamRegistry<float>& reg, int rank, int salt, std::int64_t lo, std::int64_t hi) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), reg.grads());
  for (std::int64_t i = lo; i < hi; ++i)
    h(i) = float(int((i * 37 + rank * 101 + salt * 7) % 1024) - 512) / 1024.0f;
  Kokkos::deep_copy(reg.grads(), h);
}

std::vector<float> host(const Vec& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<float>(h.data(), h.data() + h.extent(0));
}

core::OptimConfig optim_config() {
  core::OptimConfig oc;
  oc.lr = 1e-2;
  return oc;
}

}  // namespace

// Buckets tile the flat buffer from its end, in whole tensors, each closed as
// soon as it holds bucket_mib MiB.
TEST(Buckets, WholeTensorsInReverseOrder) {
  const int R = test::world_size();
  grid::ProcessGrid g(R, 1, 1, 1, comm::WaitMode::Yield, MPI_COMM_WORLD);
  model::ParamRegistry<float> a(test::tiny_model(2, 16, 2, 1, 24), 37, model::ModelShard{});
  std::set<std::int64_t> starts;
  std::int64_t smallest = 1 << 30;
  for (const auto& p : a) {
    starts.insert(std::int64_t(p.offset));
    smallest = std::min(smallest, p.local_numel());
  }
  const std::int64_t N = a.local_numel();
  for (double mib : {0.00001, 0.0001, 0.001, 0.01, 1.0}) {
    optim::Optimizer o(optim_config(), 4, g, {&a}, 0, mib);
    const auto b = o.buckets(0);
    if (R == 1) {  // a group of one reduces nothing
      EXPECT_TRUE(b.empty());
      continue;
    }
    const auto cap = std::int64_t(mib * 1024 * 1024 / 4 + 0.999);
    ASSERT_FALSE(b.empty()) << mib;
    EXPECT_EQ(b.front().second, N) << mib;
    EXPECT_EQ(b.back().first, 0) << mib;
    for (std::size_t k = 0; k < b.size(); ++k) {
      EXPECT_TRUE(starts.count(b[k].first)) << "bucket " << k << " starts inside a tensor";
      if (k + 1 < b.size()) {
        EXPECT_EQ(b[k + 1].second, b[k].first) << "buckets must tile the buffer";
        EXPECT_GE(b[k].second - b[k].first, cap) << "only the last bucket may be short";
        // Closed as soon as it reached the cap: without its first tensor it was short.
        const auto it = starts.upper_bound(b[k].first);
        const std::int64_t next = it == starts.end() ? N : *it;  // b[k] holds more than one tensor if next < end
        EXPECT_LT(b[k].second - next, cap) << mib << " bucket " << k;
      }
    }
    if (cap <= smallest) {
      EXPECT_EQ(b.size(), starts.size()) << "a bucket smaller than every tensor: one tensor each";
    }
    if (cap >= N) {
      EXPECT_EQ(b.size(), 1u) << "a bucket larger than the model: one";
    }
  }
}

// grads_ready(c, from) starts exactly the buckets inside [from, N): changing
// the gradients below them afterwards changes the reduced result there, and
// the result everywhere equals the unbucketed reduction of the final values.
TEST(Buckets, StartedBucketsAndTheRestEqualTheUnbucketedSum) {
  const int R = test::world_size(), me = test::world_rank();
  grid::ProcessGrid g(R, 1, 1, 1, comm::WaitMode::Yield, MPI_COMM_WORLD);
  const auto mc = test::tiny_model(2, 16, 2, 1, 24);
  for (int zero : {0, 1})
    for (double mib : {0.00001, 0.0001, 0.004, 1.0}) {
      model::ParamRegistry<float> a(mc, 37, model::ModelShard{}), b(mc, 37, model::ModelShard{});
      optim::Optimizer bucketed(optim_config(), 4, g, {&a}, zero, mib), plain(optim_config(), 4, g, {&b}, zero, 0);
      const std::int64_t N = a.local_numel();
      for (int step = 0; step < 2; ++step) {
        fill_grads(a, me, step, 0, N);
        fill_grads(b, me, step, 0, N);
        // The backward has finished everything from the middle tensor up.
        std::vector<std::int64_t> offs;
        for (const auto& p : a) offs.push_back(std::int64_t(p.offset));
        const std::int64_t from = offs[offs.size() / 2];
        bucketed.grads_ready(0, from);
        std::int64_t lowest = N;  // first element of the started buckets
        for (const auto& [lo, hi] : bucketed.buckets(0))
          if (lo >= from) lowest = std::min(lowest, lo);
        if (R > 1 && mib < 0.00005) {
          EXPECT_EQ(lowest, from) << "one tensor per bucket: all of [from, N) started";
        }
        // ... then the rest of the backward changes the elements below.
        fill_grads(a, me, step + 10, 0, lowest);
        fill_grads(b, me, step + 10, 0, lowest);
        bucketed.progress();
        bucketed.reduce_gradients();
        plain.reduce_gradients();
        EXPECT_LE(bucketed.dp_exposed_seconds(), bucketed.dp_in_flight_seconds() + 1e-12);
        const auto ga = host(a.grads()), gb = host(b.grads());
        const auto [o0, n0] = zero == 1 ? model::split_range(N, R, me) : std::pair<std::int64_t, std::int64_t>(0, N);
        int bad = 0;
        for (std::int64_t i = o0; i < o0 + n0; ++i)
          if (ga[std::size_t(i)] != gb[std::size_t(i)] && bad++ < 3)
            ADD_FAILURE() << "zero=" << zero << " bucket_mib=" << mib << " step " << step << " element " << i
                          << " (from " << from << ", first started " << lowest << "): " << ga[std::size_t(i)]
                          << " vs unbucketed " << gb[std::size_t(i)];
      }
    }
}

TEST(Buckets, NegativeSizeRefusedNamingTheKey) {
  grid::ProcessGrid g(1, 1, 1, 1, comm::WaitMode::Yield, MPI_COMM_SELF);
  model::ParamRegistry<float> a(test::tiny_model(2, 16, 2, 1, 24), 37, model::ModelShard{});
  try {
    optim::Optimizer o(optim_config(), 4, g, {&a}, 0, -1);
    FAIL() << "expected a ConfigError";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("comm.bucket_mib"), std::string::npos) << e.what();
  }
}
