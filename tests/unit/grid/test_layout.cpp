// wlb::grid::GridLayout: rank <-> coordinates, groups, stage neighbours (no MPI).
#include "wlb4d/core/error.hpp"
#include "wlb4d/grid/layout.hpp"

#include <gtest/gtest.h>

#include <array>
#include <set>
#include <vector>

using wlb::grid::Axis;
using wlb::grid::Coords;
using wlb::grid::GridLayout;

TEST(GridLayout, RankFormulaAndRoundTrip) {
  for (auto [dp, pp, cp, tp] : std::vector<std::array<int, 4>>{{1, 1, 1, 1}, {2, 3, 2, 2}, {3, 2, 1, 4}, {1, 4, 3, 1}}) {
    GridLayout L(dp, pp, cp, tp);
    ASSERT_EQ(L.world_size(), dp * pp * cp * tp);
    int expect = 0;  // ranks enumerated PP outermost, then DP, CP, TP innermost
    for (int p = 0; p < pp; ++p)
      for (int d = 0; d < dp; ++d)
        for (int k = 0; k < cp; ++k)
          for (int t = 0; t < tp; ++t, ++expect) {
            Coords c{d, p, k, t};
            ASSERT_EQ(L.rank_of(c), expect);
            ASSERT_EQ(L.coords_of(expect), c);
          }
  }
}

TEST(GridLayout, DescribeMatchesTheDocumentedExample) {
  GridLayout L(2, 2, 1, 2);
  EXPECT_EQ(L.describe(5), "rank 5: dp=0 pp=1 cp=0 tp=1");
}

TEST(GridLayout, GroupsPartitionTheWorld) {
  GridLayout L(2, 2, 2, 2);
  for (Axis a : {Axis::DP, Axis::PP, Axis::CP, Axis::TP}) {
    std::set<std::vector<int>> groups;
    for (int r = 0; r < L.world_size(); ++r) {
      auto g = L.axis_group(a, r);
      ASSERT_EQ(int(g.size()), 2);
      EXPECT_EQ(g[L.coords_of(r)[a]], r);  // index = coordinate
      groups.insert(g);
    }
    EXPECT_EQ(int(groups.size()), 8);
  }
  EXPECT_EQ(L.axis_group(Axis::TP, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(L.axis_group(Axis::CP, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(L.axis_group(Axis::DP, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(L.axis_group(Axis::PP, 5), (std::vector<int>{5, 13}));
  EXPECT_EQ(L.dpcp_group(5), (std::vector<int>{1, 3, 5, 7}));  // same pp=0, tp=1
  EXPECT_EQ(L.prev_stage(5), -1);
  EXPECT_EQ(L.next_stage(5), 13);
  EXPECT_EQ(L.prev_stage(13), 5);
  EXPECT_EQ(L.next_stage(13), -1);
}

TEST(GridLayout, Errors) {
  EXPECT_THROW(GridLayout(0, 1, 1, 1), wlb::core::ConfigError);
  GridLayout L(2, 2, 2, 2);
  try {
    L.check_world(4);
    ADD_FAILURE();
  } catch (const wlb::core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("2*2*2*2 = 16 must equal the number of MPI ranks (4)"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(L.check_world(16));
  EXPECT_THROW(L.coords_of(16), wlb::core::ConfigError);
  EXPECT_THROW(L.rank_of(Coords{0, 2, 0, 0}), wlb::core::ConfigError);
}
