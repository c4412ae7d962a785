// wlb::grid::GridLayout — rank arithmetic of the 4D grid (no MPI).
#include "wlb4d/grid/layout.hpp"

#include "wlb4d/core/error.hpp"

#include <fmt/format.h>

namespace wlb::grid {

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::DP: return "dp";
    case Axis::PP: return "pp";
    case Axis::CP: return "cp";
    case Axis::TP: return "tp";
  }
  return "?";
}

int Coords::operator[](Axis a) const {
  switch (a) {
    case Axis::DP: return dp;
    case Axis::PP: return pp;
    case Axis::CP: return cp;
    case Axis::TP: return tp;
  }
  return dp;
}

int& Coords::operator[](Axis a) {
  switch (a) {
    case Axis::DP: return dp;
    case Axis::PP: return pp;
    case Axis::CP: return cp;
    case Axis::TP: return tp;
  }
  return dp;
}

GridLayout::GridLayout(int dp, int pp, int cp, int tp) : dp_(dp), pp_(pp), cp_(cp), tp_(tp) {
  if (dp < 1 || pp < 1 || cp < 1 || tp < 1)
    throw core::ConfigError(
        fmt::format("process grid: parallel.dp={}, pp={}, cp={}, tp={}: every axis size must be >= 1", dp, pp, cp, tp));
}

int GridLayout::size(Axis a) const {
  switch (a) {
    case Axis::DP: return dp_;
    case Axis::PP: return pp_;
    case Axis::CP: return cp_;
    case Axis::TP: return tp_;
  }
  return 1;
}

void GridLayout::check_world(int world_size) const {
  if (world_size != this->world_size())
    throw core::ConfigError(fmt::format(
        "process grid: parallel.dp*pp*cp*tp = {}*{}*{}*{} = {} must equal the number of MPI ranks ({})", dp_, pp_,
        cp_, tp_, this->world_size(), world_size));
}

int GridLayout::rank_of(const Coords& c) const {
  for (Axis a : {Axis::DP, Axis::PP, Axis::CP, Axis::TP})
    if (c[a] < 0 || c[a] >= size(a))
      throw core::ConfigError(fmt::format("process grid: coordinate {}={} out of range [0, {})", axis_name(a), c[a],
                                          size(a)));
  return ((c.pp * dp_ + c.dp) * cp_ + c.cp) * tp_ + c.tp;
}

Coords GridLayout::coords_of(int rank) const {
  if (rank < 0 || rank >= world_size())
    throw core::ConfigError(fmt::format("process grid: rank {} out of range [0, {})", rank, world_size()));
  Coords c;
  c.tp = rank % tp_;
  rank /= tp_;
  c.cp = rank % cp_;
  rank /= cp_;
  c.dp = rank % dp_;
  c.pp = rank / dp_;
  return c;
}

std::vector<int> GridLayout::axis_group(Axis a, int rank) const {
  Coords c = coords_of(rank);
  std::vector<int> g;
  g.reserve(static_cast<std::size_t>(size(a)));
  for (int i = 0; i < size(a); ++i) {
    c[a] = i;
    g.push_back(rank_of(c));
  }
  return g;
}

std::vector<int> GridLayout::dpcp_group(int rank) const {
  Coords c = coords_of(rank);
  std::vector<int> g;
  g.reserve(static_cast<std::size_t>(dp_ * cp_));
  for (int d = 0; d < dp_; ++d)
    for (int k = 0; k < cp_; ++k) {
      c.dp = d;
      c.cp = k;
      g.push_back(rank_of(c));
    }
  return g;
}

int GridLayout::prev_stage(int rank) const {
  Coords c = coords_of(rank);
  if (c.pp == 0) return -1;
  --c.pp;
  return rank_of(c);
}

int GridLayout::next_stage(int rank) const {
  Coords c = coords_of(rank);
  if (c.pp + 1 == pp_) return -1;
  ++c.pp;
  return rank_of(c);
}

std::string GridLayout::describe(int rank) const {
  const Coords c = coords_of(rank);
  return fmt::format("rank {}: dp={} pp={} cp={} tp={}", rank, c.dp, c.pp, c.cp, c.tp);
}

}  // namespace wlb::grid
