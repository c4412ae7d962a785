// wlb::grid::ProcessGrid on 1, 4 and 16 ranks. Coordinates are checked against
// an independent enumeration (nested loops in PP, DP, CP, TP order), and every
// axis communicator against sums computed from that enumeration.
#include "test_util.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/grid/process_grid.hpp"

#include <gtest/gtest.h>

#include <array>
#include <vector>

using wlb::comm::WaitMode;
using wlb::grid::Axis;
using wlb::grid::ProcessGrid;

using wlb::test::world_rank;
using wlb::test::world_size;

namespace {


struct Shape {
  int dp, pp, cp, tp;
};

/// Layouts checked for a world size (the brief's list).
std::vector<Shape> shapes_for(int world) {
  std::vector<Shape> all = {{1, 1, 1, 1}, {2, 1, 1, 2}, {1, 2, 2, 1}, {1, 1, 1, 4}, {2, 2, 2, 2}};
  std::vector<Shape> out;
  for (auto s : all)
    if (s.dp * s.pp * s.cp * s.tp == world) out.push_back(s);
  return out;
}

/// coords[rank] = {dp, pp, cp, tp}, by enumerating ranks in order: PP outermost, then DP, CP, TP.
std::vector<std::array<int, 4>> enumerate(const Shape& s) {
  std::vector<std::array<int, 4>> c;
  for (int p = 0; p < s.pp; ++p)
    for (int d = 0; d < s.dp; ++d)
      for (int k = 0; k < s.cp; ++k)
        for (int t = 0; t < s.tp; ++t) c.push_back({d, p, k, t});
  return c;
}

class GridTest : public ::testing::TestWithParam<WaitMode> {};

TEST_P(GridTest, CoordinatesCommunicatorsAndAxisSums) {
  const int W = world_size(), me = world_rank();
  const auto shapes = shapes_for(W);
  ASSERT_FALSE(shapes.empty()) << "no layout listed for " << W << " ranks";
  for (const Shape& s : shapes) {
    SCOPED_TRACE(testing::Message() << "layout dp=" << s.dp << " pp=" << s.pp << " cp=" << s.cp << " tp=" << s.tp);
    ProcessGrid g(s.dp, s.pp, s.cp, s.tp, GetParam());
    const auto tab = enumerate(s);
    const auto& mine = tab[me];
    EXPECT_EQ(g.rank(), me);
    EXPECT_EQ(g.world_size(), W);
    EXPECT_EQ(g.dp_rank(), mine[0]);
    EXPECT_EQ(g.pp_rank(), mine[1]);
    EXPECT_EQ(g.cp_rank(), mine[2]);
    EXPECT_EQ(g.tp_rank(), mine[3]);
    EXPECT_EQ(g.describe(), "rank " + std::to_string(me) + ": dp=" + std::to_string(mine[0]) +
                                " pp=" + std::to_string(mine[1]) + " cp=" + std::to_string(mine[2]) +
                                " tp=" + std::to_string(mine[3]));

    // Sizes, and the rank inside each axis communicator is the coordinate.
    EXPECT_EQ(g.dp().size(), s.dp);
    EXPECT_EQ(g.pp().size(), s.pp);
    EXPECT_EQ(g.cp().size(), s.cp);
    EXPECT_EQ(g.tp().size(), s.tp);
    EXPECT_EQ(g.dpcp().size(), s.dp * s.cp);
    EXPECT_EQ(g.world().size(), W);
    EXPECT_EQ(g.dp().rank(), mine[0]);
    EXPECT_EQ(g.pp().rank(), mine[1]);
    EXPECT_EQ(g.cp().rank(), mine[2]);
    EXPECT_EQ(g.tp().rank(), mine[3]);
    EXPECT_EQ(g.dpcp().rank(), mine[0] * s.cp + mine[2]);
    EXPECT_EQ(&g.axis(Axis::TP), &g.tp());
    EXPECT_EQ(g.dp().wait_mode(), GetParam());

    // Allreduce over each axis: Σ of the coordinates, and Σ of the world ranks
    // of the group (group = every rank equal to me except on that axis).
    const std::array<const wlb::comm::Communicator*, 4> comms = {&g.dp(), &g.pp(), &g.cp(), &g.tp()};
    for (int a = 0; a < 4; ++a) {
      long coord_sum = 0, rank_sum = 0;
      for (int r = 0; r < W; ++r) {
        bool same = true;
        for (int b = 0; b < 4; ++b)
          if (b != a && tab[r][b] != mine[b]) same = false;
        if (same) {
          coord_sum += tab[r][a];
          rank_sum += r;
        }
      }
      EXPECT_EQ(comms[a]->allreduce_value<std::int64_t>(mine[a]), coord_sum) << "axis " << a;
      EXPECT_EQ(comms[a]->allreduce_value<std::int64_t>(me), rank_sum) << "axis " << a;
    }
    long grad_sum = 0;
    for (int r = 0; r < W; ++r)
      if (tab[r][1] == mine[1] && tab[r][3] == mine[3]) grad_sum += r;
    EXPECT_EQ(g.dpcp().allreduce_value<std::int64_t>(me), grad_sum);
    EXPECT_EQ(g.world().allreduce_value<std::int64_t>(1), W);

    // Neighbouring stages: same dp, cp, tp; pp ± 1.
    auto find = [&](int d, int p, int k, int t) {
      for (int r = 0; r < W; ++r)
        if (tab[r] == std::array<int, 4>{d, p, k, t}) return r;
      return -1;
    };
    EXPECT_EQ(g.prev_stage_rank(), mine[1] == 0 ? -1 : find(mine[0], mine[1] - 1, mine[2], mine[3]));
    EXPECT_EQ(g.next_stage_rank(), mine[1] == s.pp - 1 ? -1 : find(mine[0], mine[1] + 1, mine[2], mine[3]));
    EXPECT_EQ(g.is_first_stage(), mine[1] == 0);
    EXPECT_EQ(g.is_last_stage(), mine[1] == s.pp - 1);
    // A message down the pipeline over pp(): stage s sends its world rank to s+1.
    int got = -1;
    if (!g.is_first_stage()) {
      g.pp().recv(&got, 1, g.pp_rank() - 1, 3);
      EXPECT_EQ(got, g.prev_stage_rank());
    }
    if (!g.is_last_stage()) g.pp().send(&me, 1, g.pp_rank() + 1, 3);
  }
}

TEST_P(GridTest, WorldSizeMismatchIsAConfigErrorOnEveryRank) {
  const int W = world_size();
  try {
    ProcessGrid g(2, 1, 1, W, GetParam());  // 2·W ranks wanted
    ADD_FAILURE() << "no error for a grid of " << 2 * W << " on " << W << " ranks";
  } catch (const wlb::core::ConfigError& e) {
    const std::string msg = e.what();
    const std::string want = "2*1*1*" + std::to_string(W) + " = " + std::to_string(2 * W) +
                             " must equal the number of MPI ranks (" + std::to_string(W) + ")";
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
  }
  EXPECT_THROW(ProcessGrid(0, 1, 1, W, GetParam()), wlb::core::ConfigError);
  // Every rank threw without communicating: the world is still in step.
  EXPECT_EQ(wlb::comm::Communicator::world().allreduce_value(1), W);
}

INSTANTIATE_TEST_SUITE_P(WaitModes, GridTest, ::testing::Values(WaitMode::Yield, WaitMode::Block),
                         [](const auto& info) { return info.param == WaitMode::Yield ? "Yield" : "Block"; });

}  // namespace
