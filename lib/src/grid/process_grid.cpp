// wlb::grid::ProcessGrid — MPI communicators of the 4D grid. Compiled into
// wlb4d_grid, which links wlb4d_comm (grid sits above comm, DESIGN §1).
#include "wlb4d/grid/process_grid.hpp"

#include "wlb4d/core/error.hpp"
#if defined(WLB4D_HAVE_NCCL)
#include "wlb4d/comm/nccl_communicator.hpp"
#endif

#include <fmt/format.h>

namespace wlb::grid {

namespace {

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  throw core::CommError(fmt::format("process grid: {} failed: {}", call, std::string(buf, len)));
}

/// Splits `parent` by (color, key) into an owned Communicator.
comm::Communicator split(MPI_Comm parent, int color, int key, comm::WaitMode wait) {
  MPI_Comm c = MPI_COMM_NULL;
  check(MPI_Comm_split(parent, color, key, &c), "MPI_Comm_split");
  return comm::Communicator(c, wait, /*owns=*/true);
}

}  // namespace

ProcessGrid::ProcessGrid(int dp, int pp, int cp, int tp, comm::WaitMode wait, MPI_Comm world) {
  layout_ = GridLayout(dp, pp, cp, tp);
  int wsize = 0;
  check(MPI_Comm_size(world, &wsize), "MPI_Comm_size");
  layout_.check_world(wsize);  // identical on every rank: all throw, none hangs
  check(MPI_Comm_rank(world, &rank_), "MPI_Comm_rank");
  coords_ = layout_.coords_of(rank_);

  MPI_Comm dup = MPI_COMM_NULL;
  check(MPI_Comm_dup(world, &dup), "MPI_Comm_dup");
  world_ = comm::Communicator(dup, wait, /*owns=*/true);
  const MPI_Comm w = world_.mpi();

  // colour = world rank of the group's member with coordinate 0 on the axis;
  // key = the coordinate, so the rank in the axis communicator is the coordinate.
  auto axis_split = [&](Axis a) {
    Coords base = coords_;
    base[a] = 0;
    return split(w, layout_.rank_of(base), coords_[a], wait);
  };
  tp_ = axis_split(Axis::TP);
  cp_ = axis_split(Axis::CP);
  dp_ = axis_split(Axis::DP);
  pp_ = axis_split(Axis::PP);
  Coords base = coords_;
  base.dp = 0;
  base.cp = 0;
  dpcp_ = split(w, layout_.rank_of(base), coords_.dp * layout_.cp() + coords_.cp, wait);
  // Names for messages (the collective watchdog names the group that hangs).
  world_.set_name("world");
  tp_.set_name("TP");
  cp_.set_name("CP");
  dp_.set_name("DP");
  pp_.set_name("PP");
  dpcp_.set_name("DP×CP");
}

const comm::Communicator& ProcessGrid::axis(Axis a) const {
  switch (a) {
    case Axis::DP: return dp_;
    case Axis::PP: return pp_;
    case Axis::CP: return cp_;
    case Axis::TP: return tp_;
  }
  return world_;
}

void ProcessGrid::use_backend(const std::string& backend) {
  if (backend == "mpi") return;
  if (backend != "nccl") throw core::ConfigError("comm.backend='" + backend + "' must be one of: mpi, nccl");
#if defined(WLB4D_HAVE_NCCL)
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible) {
    throw core::ConfigError(std::string("comm.backend=nccl needs device buffers, but this build's Kokkos memory "
                                        "space is ") +
                            MemSpace::name() + " (configure Kokkos with CUDA, or set comm.backend=mpi)");
  } else {
    use_device_backend(comm::make_nccl_collectives);
  }
#else
  throw core::ConfigError(
      "comm.backend=nccl: this build has no NCCL backend (configure with -DWLB4D_ENABLE_CUDA=ON against a "
      "CUDA-enabled Kokkos, or set comm.backend=mpi)");
#endif
}

void ProcessGrid::use_device_backend(const DeviceFactory& make) {
  // PP too: stage-to-stage activations and gradients go device to device
  // (pipeline::Executor::send/receive).
  for (comm::Communicator* c : {&tp_, &cp_, &dp_, &dpcp_, &pp_}) c->attach_device(make(*c));
}

}  // namespace wlb::grid
