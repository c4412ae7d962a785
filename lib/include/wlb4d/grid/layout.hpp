#pragma once
/// \file layout.hpp
/// \brief wlb::grid::GridLayout — the rank arithmetic of the 4D process grid
/// (DESIGN §4), with no MPI: usable by the planner/simulator and by tests.
///
/// world = dp·pp·cp·tp. Rank order puts TP innermost, then CP, then DP, and PP
/// outermost:
///
///     rank = ((pp_rank·dp + dp_rank)·cp + cp_rank)·tp + tp_rank
///
/// so the ranks of one TP group are consecutive, then those of one CP group,
/// and one pipeline stage (all dp, cp, tp for a fixed pp) is a contiguous block
/// of dp·cp·tp ranks.
/// Errors: ConfigError for non-positive sizes, ranks or coordinates out of range.

#include <string>
#include <vector>

namespace wlb::grid {

/// The four parallel axes.
enum class Axis { DP, PP, CP, TP };
const char* axis_name(Axis a);  ///< "dp", "pp", "cp", "tp"

/// A rank's position in the grid; each coordinate in [0, size of its axis).
struct Coords {
  int dp = 0, pp = 0, cp = 0, tp = 0;
  int operator[](Axis a) const;
  int& operator[](Axis a);
  bool operator==(const Coords& o) const { return dp == o.dp && pp == o.pp && cp == o.cp && tp == o.tp; }
};

/// Sizes of the four axes and the rank <-> coordinate maps.
class GridLayout {
 public:
  GridLayout() = default;
  /// \throws ConfigError if any size is < 1.
  GridLayout(int dp, int pp, int cp, int tp);

  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int cp() const { return cp_; }
  int tp() const { return tp_; }
  int size(Axis a) const;
  int world_size() const { return dp_ * pp_ * cp_ * tp_; }

  /// \throws ConfigError naming dp, pp, cp, tp and world_size unless
  /// dp·pp·cp·tp == world_size ("dp*pp*cp*tp = 2*2*2*2 = 16 must equal the
  /// number of MPI ranks (4)").
  void check_world(int world_size) const;

  /// World rank of c. \throws ConfigError if a coordinate is out of range.
  int rank_of(const Coords& c) const;
  /// Coordinates of a world rank. \throws ConfigError if out of [0, world).
  Coords coords_of(int rank) const;

  /// World ranks of the group along axis `a` that contains `rank` (all other
  /// coordinates equal), ordered by the coordinate on `a` — so a rank's index
  /// in the list is its coordinate on `a`.
  std::vector<int> axis_group(Axis a, int rank) const;
  /// World ranks of the DP×CP gradient group of `rank` (same pp and tp),
  /// ordered by dp·cp_size + cp (= increasing world rank). Index of a rank in
  /// it: dp_rank·cp + cp_rank.
  std::vector<int> dpcp_group(int rank) const;

  /// World rank of the previous / next pipeline stage (same dp, cp, tp), or -1
  /// on the first / last stage.
  int prev_stage(int rank) const;
  int next_stage(int rank) const;

  /// "rank 5: dp=0 pp=1 cp=0 tp=1".
  std::string describe(int rank) const;

 private:
  int dp_ = 1, pp_ = 1, cp_ = 1, tp_ = 1;
};

}  // namespace wlb::grid
