#pragma once
/// \file process_grid.hpp
/// \brief wlb::grid::ProcessGrid — this rank's place in the 4D grid and one
/// Communicator per axis (DESIGN §4).
///
/// Rank order and coordinates: see layout.hpp (TP innermost, then CP, DP, PP
/// outermost; rank = ((pp·DP + dp)·CP + cp)·TP + tp).
///
/// Communicators (each created by MPI_Comm_split of a private duplicate of the
/// given world communicator, with MPI_ERRORS_RETURN and the given WaitMode):
/// - tp(), cp(), dp(), pp(): all ranks that differ only in that coordinate; a
///   rank's rank in the axis communicator equals its coordinate on that axis
///   (so pp().rank() == pp_rank() and stage s is rank s of pp()).
/// - dpcp(): the gradient group — all ranks with the same pp and tp
///   coordinates (size dp·cp); rank in it = dp_rank·cp + cp_rank.
/// - world(): the duplicate of the whole world (size dp·pp·cp·tp).
///
/// Ownership: the grid creates its MPI communicators with shared ownership
/// (Communicator(comm, wait, owns=true)): each MPI_Comm is freed when the grid
/// and every copy of its Communicator are destroyed (normally: with the grid).
/// Destroy grids before MPI_Finalize (after it nothing is freed).
///
/// Link: ProcessGrid is compiled into wlb4d_grid, which links wlb4d_comm (it
/// owns Communicators; grid sits above comm, DESIGN §1); link wlb4d::grid.

#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/grid/layout.hpp"

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>

namespace wlb::grid {

class ProcessGrid {
 public:
  /// Collective over `world`. \throws ConfigError (on every rank, before any
  /// communication) if dp·pp·cp·tp != size of `world` or any size < 1; the
  /// message names dp, pp, cp, tp and the world size.
  /// \throws CommError if an MPI call fails.
  ProcessGrid(int dp, int pp, int cp, int tp, comm::WaitMode wait = comm::WaitMode::Yield,
              MPI_Comm world = MPI_COMM_WORLD);

  const GridLayout& layout() const { return layout_; }
  const Coords& coords() const { return coords_; }
  int rank() const { return rank_; }  ///< rank in the given world communicator
  int world_size() const { return layout_.world_size(); }
  int dp_rank() const { return coords_.dp; }
  int pp_rank() const { return coords_.pp; }
  int cp_rank() const { return coords_.cp; }
  int tp_rank() const { return coords_.tp; }
  int dp_size() const { return layout_.dp(); }
  int pp_size() const { return layout_.pp(); }
  int cp_size() const { return layout_.cp(); }
  int tp_size() const { return layout_.tp(); }

  const comm::Communicator& tp() const { return tp_; }
  const comm::Communicator& cp() const { return cp_; }
  const comm::Communicator& dp() const { return dp_; }
  const comm::Communicator& pp() const { return pp_; }
  /// The gradient group: same pp and tp coordinates (size dp·cp).
  const comm::Communicator& dpcp() const { return dpcp_; }
  const comm::Communicator& world() const { return world_; }
  /// Communicator of one axis (tp(), cp(), dp() or pp()).
  const comm::Communicator& axis(Axis a) const;

  /// Selects the backend of device-buffer collectives (deck key comm.backend):
  /// "mpi" (nothing attached) or "nccl": one NCCL communicator per group
  /// (tp, cp, dp, dpcp, pp), created from the MPI communicators (rank 0 of
  /// each group makes the unique id, MPI broadcasts it) and attached to them.
  /// Pipeline send/recv then go device to device on pp (matched by order);
  /// host scalars stay on MPI. Collective over the
  /// world; call before the communicators are copied (before the Trainer).
  /// \throws core::ConfigError (every rank alike) for "nccl" when this build
  /// has no NCCL (WLB4D_ENABLE_CUDA=OFF) or Kokkos' memory space is host
  /// memory (NCCL needs device buffers); \throws CommError if NCCL fails.
  void use_backend(const std::string& backend);
  /// Attaches make(c) to each group c (tp, cp, dp, dpcp, pp), in that order
  /// on every rank (make may be collective over c). use_backend("nccl")
  /// passes comm::make_nccl_collectives; tests pass a backend of their own
  /// to run the device paths on host builds. Same timing rule as use_backend.
  using DeviceFactory =
      std::function<std::shared_ptr<const comm::DeviceCollectives>(const comm::Communicator&)>;
  void use_device_backend(const DeviceFactory& make);

  bool is_first_stage() const { return coords_.pp == 0; }
  bool is_last_stage() const { return coords_.pp + 1 == layout_.pp(); }
  /// World rank of the previous / next pipeline stage (same dp, cp, tp), -1 if
  /// none. In pp() the same ranks are pp_rank()-1 and pp_rank()+1.
  int prev_stage_rank() const { return layout_.prev_stage(rank_); }
  int next_stage_rank() const { return layout_.next_stage(rank_); }

  /// "rank 5: dp=0 pp=1 cp=0 tp=1" (start-up printing).
  std::string describe() const { return layout_.describe(rank_); }

 private:
  GridLayout layout_;
  Coords coords_;
  int rank_ = 0;
  comm::Communicator world_, tp_, cp_, dp_, pp_, dpcp_;
};

}  // namespace wlb::grid
