// wlb::comm::NcclCommunicator — NCCL backend (device buffers). Compiled only
// with WLB4D_ENABLE_CUDA (WLB4D_HAVE_NCCL); an empty translation unit otherwise.
#include "wlb4d/comm/nccl_communicator.hpp"

#if defined(WLB4D_HAVE_NCCL)

#include "wlb4d/core/clock.hpp"
#include "wlb4d/core/error.hpp"

#include <fmt/format.h>
#include <sched.h>

#include <cstdint>
#include <string>

namespace wlb::comm {

namespace {

void check_cuda(cudaError_t e, const char* call, int rank) {
  if (e == cudaSuccess) return;
  throw core::CommError(fmt::format("wlb::comm (NCCL backend): {} failed on rank {}: {} ({})", call, rank,
                                    cudaGetErrorString(e), cudaGetErrorName(e)));
}

void check_nccl(ncclResult_t r, const char* call, int rank, ncclComm_t comm) {
  if (r == ncclSuccess) return;
  const char* last = comm ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  throw core::CommError(fmt::format("wlb::comm (NCCL backend): {} failed on rank {}: {}{}{}", call, rank,
                                    ncclGetErrorString(r), (last && *last) ? " — " : "", last ? last : ""));
}

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  throw core::CommError("wlb::comm (NCCL backend): unknown ReduceOp");
}

}  // namespace

template <> ncclDataType_t nccl_type<float>() { return ncclFloat32; }
template <> ncclDataType_t nccl_type<double>() { return ncclFloat64; }
template <> ncclDataType_t nccl_type<std::int32_t>() { return ncclInt32; }
template <> ncclDataType_t nccl_type<std::int64_t>() { return ncclInt64; }
template <> ncclDataType_t nccl_type<std::uint32_t>() { return ncclUint32; }
template <> ncclDataType_t nccl_type<std::uint64_t>() { return ncclUint64; }
template <> ncclDataType_t nccl_type<char>() { return ncclChar; }
template <> ncclDataType_t nccl_type<signed char>() { return ncclInt8; }
template <> ncclDataType_t nccl_type<unsigned char>() { return ncclUint8; }

NcclCommunicator::NcclCommunicator(const Communicator& mpi, cudaStream_t stream, WaitMode wait)
    : stream_(stream), wait_(wait), rank_(mpi.rank()), size_(mpi.size()) {
  if (mpi.mpi() == MPI_COMM_NULL)
    throw core::CommError("wlb::comm (NCCL backend): cannot bootstrap from a null MPI communicator");
  ncclUniqueId id{};
  if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", rank_, nullptr);
  mpi.broadcast(reinterpret_cast<char*>(&id), sizeof(id), 0);
  ncclComm_t c = nullptr;
  check_nccl(ncclCommInitRank(&c, size_, id, rank_), "ncclCommInitRank", rank_, nullptr);
  st_ = std::make_shared<State>();
  st_->comm = c;
}

NcclCommunicator::State::~State() {
  if (comm && !aborted) ncclCommDestroy(comm);
}

ncclComm_t NcclCommunicator::nccl() const { return st_ ? st_->comm : nullptr; }

void NcclCommunicator::check_live(const char* what) const {
  if (!st_) throw core::CommError(fmt::format("wlb::comm (NCCL backend): {} called on a null communicator", what));
  if (st_->aborted)
    throw core::CommError(fmt::format(
        "wlb::comm (NCCL backend): {} called on rank {} after the communicator was aborted by an earlier error", what,
        rank_));
  op_ = what;
}

void NcclCommunicator::synchronize() const {
  const char* const op = op_;  // the call being completed names the wait
  check_live("synchronize");
  op_ = *op ? op : "synchronize";
  if (wait_ == WaitMode::Block) {
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", rank_);
    return;
  }
  // The watchdog (comm.timeout_s, yield only): NCCL's standard recovery is
  // ncclCommAbort, which unblocks the stream's kernels; NCCL does not say
  // which ranks are missing (the MPI side channel cannot see inside a kernel).
  const double timeout = wait_timeout(), t0 = core::wall_seconds();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream_);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) check_cuda(e, "cudaStreamQuery", rank_);
    ncclResult_t async = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(st_->comm, &async), "ncclCommGetAsyncError", rank_, st_->comm);
    if (async != ncclSuccess && async != ncclInProgress) {
      const std::string last = ncclGetLastError(st_->comm);
      ncclCommAbort(st_->comm);  // unblocks the stream; the communicator is unusable afterwards
      st_->aborted = true;
      throw core::CommError(fmt::format("wlb::comm (NCCL backend): asynchronous NCCL error on rank {}: {} — {}",
                                        rank_, ncclGetErrorString(async), last));
    }
    if (timeout > 0 && core::wall_seconds() - t0 > timeout) {
      ncclCommAbort(st_->comm);
      st_->aborted = true;
      throw core::CommError(fmt::format(
          "communication timeout: {} on the NCCL communicator (this rank is {} of {}) has not completed after "
          "{:.0f} s (comm.timeout_s={:g}): communicator aborted (ncclCommAbort); NCCL does not report which ranks "
          "did not arrive — see the other ranks' messages",
          op_, rank_, size_, core::wall_seconds() - t0, timeout));
    }
    sched_yield();
  }
}

template <class T> void NcclCommunicator::allreduce(T* data, std::size_t count, ReduceOp op) const {
  check_live("allreduce");
  check_nccl(ncclAllReduce(data, data, count, nccl_type<T>(), to_nccl(op), st_->comm, stream_), "ncclAllReduce",
             rank_, st_->comm);
  synchronize();
}

template <class T> void NcclCommunicator::broadcast(T* data, std::size_t count, int root) const {
  check_live("broadcast");
  if (root < 0 || root >= size_)
    throw core::CommError(fmt::format("wlb::comm (NCCL backend): broadcast root {} out of range [0, {})", root, size_));
  check_nccl(ncclBroadcast(data, data, count, nccl_type<T>(), root, st_->comm, stream_), "ncclBroadcast", rank_,
             st_->comm);
  synchronize();
}

template <class T> void NcclCommunicator::allgather(const T* send, T* recv, std::size_t count) const {
  check_live("allgather");
  check_nccl(ncclAllGather(send, recv, count, nccl_type<T>(), st_->comm, stream_), "ncclAllGather", rank_,
             st_->comm);
  synchronize();
}

template <class T>
void NcclCommunicator::allgatherv(const T* send, std::size_t send_count, T* recv, const std::vector<int>& recv_counts,
                                  const std::vector<int>& displs) const {
  check_live("allgatherv");
  if (static_cast<int>(recv_counts.size()) != size_ || static_cast<int>(displs.size()) != size_)
    throw core::CommError(fmt::format(
        "wlb::comm (NCCL backend): allgatherv: recv_counts ({}) and displs ({}) need one entry per rank ({})",
        recv_counts.size(), displs.size(), size_));
  if (recv_counts[rank_] < 0 || static_cast<std::size_t>(recv_counts[rank_]) != send_count)
    throw core::CommError(fmt::format("wlb::comm (NCCL backend): allgatherv on rank {}: send_count {} != "
                                      "recv_counts[{}] = {}",
                                      rank_, send_count, rank_, recv_counts[rank_]));
  check_nccl(ncclGroupStart(), "ncclGroupStart", rank_, st_->comm);
  for (int r = 0; r < size_; ++r) {
    if (recv_counts[r] < 0 || displs[r] < 0)
      throw core::CommError("wlb::comm (NCCL backend): allgatherv: negative count or displacement");
    T* dst = recv + displs[r];
    const T* src = r == rank_ ? send : dst;
    check_nccl(ncclBroadcast(src, dst, static_cast<std::size_t>(recv_counts[r]), nccl_type<T>(), r, st_->comm,
                             stream_),
               "ncclBroadcast (allgatherv)", rank_, st_->comm);
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd", rank_, st_->comm);
  synchronize();
}

template <class T> void NcclCommunicator::reduce_scatter(const T* send, T* recv, std::size_t count) const {
  check_live("reduce_scatter");
  check_nccl(ncclReduceScatter(send, recv, count, nccl_type<T>(), ncclSum, st_->comm, stream_),
             "ncclReduceScatter", rank_, st_->comm);
  synchronize();
}

template <class T>
void NcclCommunicator::reduce_scatterv(const T* send, T* recv, const std::vector<int>& recv_counts) const {
  check_live("reduce_scatterv");
  if (static_cast<int>(recv_counts.size()) != size_)
    throw core::CommError(fmt::format("wlb::comm (NCCL backend): reduce_scatterv: recv_counts has {} entries, "
                                      "needs one per rank ({})",
                                      recv_counts.size(), size_));
  for (int c : recv_counts)
    if (c < 0) throw core::CommError("wlb::comm (NCCL backend): reduce_scatterv: negative count");
  check_nccl(ncclGroupStart(), "ncclGroupStart", rank_, st_->comm);
  std::size_t off = 0;
  for (int r = 0; r < size_; ++r) {
    check_nccl(ncclReduce(send + off, recv, static_cast<std::size_t>(recv_counts[r]), nccl_type<T>(), ncclSum, r,
                          st_->comm, stream_),
               "ncclReduce (reduce_scatterv)", rank_, st_->comm);
    off += static_cast<std::size_t>(recv_counts[r]);
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd", rank_, st_->comm);
  synchronize();
}

template <class T>
void NcclCommunicator::alltoallv(const T* send, const std::vector<int>& send_counts,
                                 const std::vector<int>& send_displs, T* recv, const std::vector<int>& recv_counts,
                                 const std::vector<int>& recv_displs) const {
  check_live("alltoallv");
  // Checked before ncclGroupStart: a throw inside the group would leave it open.
  for (const auto* v : {&send_counts, &send_displs, &recv_counts, &recv_displs}) {
    if (static_cast<int>(v->size()) != size_)
      throw core::CommError(fmt::format("wlb::comm (NCCL backend): alltoallv on rank {}: {} counts/displacements "
                                        "for a group of {} ranks",
                                        rank_, v->size(), size_));
    for (int x : *v)
      if (x < 0)
        throw core::CommError(fmt::format(
            "wlb::comm (NCCL backend): alltoallv on rank {}: negative count or displacement {}", rank_, x));
  }
  // One group: NCCL schedules all sends and receives together, so no pair
  // waits on another (posted one by one, a ring of blocking sends would
  // deadlock). Zero counts are skipped on both sides alike: send_counts[p]
  // here is recv_counts[rank()] on p. The self part is a send/recv pair too.
  check_nccl(ncclGroupStart(), "ncclGroupStart", rank_, st_->comm);
  for (int p = 0; p < size_; ++p) {
    if (send_counts[p] > 0)
      check_nccl(ncclSend(send + send_displs[p], static_cast<std::size_t>(send_counts[p]), nccl_type<T>(), p,
                          st_->comm, stream_),
                 "ncclSend (alltoallv)", rank_, st_->comm);
    if (recv_counts[p] > 0)
      check_nccl(ncclRecv(recv + recv_displs[p], static_cast<std::size_t>(recv_counts[p]), nccl_type<T>(), p,
                          st_->comm, stream_),
                 "ncclRecv (alltoallv)", rank_, st_->comm);
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd", rank_, st_->comm);
  synchronize();
}

template <class T> void NcclCommunicator::send(const T* data, std::size_t count, int dest) const {
  check_live("send");
  if (dest < 0 || dest >= size_)
    throw core::CommError(fmt::format("wlb::comm (NCCL backend): send destination {} out of range [0, {})", dest,
                                      size_));
  check_nccl(ncclSend(data, count, nccl_type<T>(), dest, st_->comm, stream_), "ncclSend", rank_, st_->comm);
  synchronize();
}

template <class T> void NcclCommunicator::recv(T* data, std::size_t count, int src) const {
  check_live("recv");
  if (src < 0 || src >= size_)
    throw core::CommError(fmt::format("wlb::comm (NCCL backend): recv source {} out of range [0, {})", src, size_));
  check_nccl(ncclRecv(data, count, nccl_type<T>(), src, st_->comm, stream_), "ncclRecv", rank_, st_->comm);
  synchronize();
}

#define WLB4D_NCCL_INSTANTIATE(T)                                                                          \
  template void NcclCommunicator::allreduce<T>(T*, std::size_t, ReduceOp) const;                           \
  template void NcclCommunicator::broadcast<T>(T*, std::size_t, int) const;                                \
  template void NcclCommunicator::allgather<T>(const T*, T*, std::size_t) const;                           \
  template void NcclCommunicator::allgatherv<T>(const T*, std::size_t, T*, const std::vector<int>&,        \
                                                const std::vector<int>&) const;                            \
  template void NcclCommunicator::reduce_scatter<T>(const T*, T*, std::size_t) const;                      \
  template void NcclCommunicator::reduce_scatterv<T>(const T*, T*, const std::vector<int>&) const;         \
  template void NcclCommunicator::alltoallv<T>(const T*, const std::vector<int>&, const std::vector<int>&, \
                                               T*, const std::vector<int>&, const std::vector<int>&) const;  \
  template void NcclCommunicator::send<T>(const T*, std::size_t, int) const;                               \
  template void NcclCommunicator::recv<T>(T*, std::size_t, int) const;

WLB4D_NCCL_INSTANTIATE(float)
WLB4D_NCCL_INSTANTIATE(double)
WLB4D_NCCL_INSTANTIATE(std::int32_t)
WLB4D_NCCL_INSTANTIATE(std::int64_t)
WLB4D_NCCL_INSTANTIATE(std::uint32_t)
WLB4D_NCCL_INSTANTIATE(std::uint64_t)
WLB4D_NCCL_INSTANTIATE(char)
WLB4D_NCCL_INSTANTIATE(signed char)
WLB4D_NCCL_INSTANTIATE(unsigned char)
#undef WLB4D_NCCL_INSTANTIATE

namespace {
class NcclDeviceCollectives final : public DeviceCollectives {
 public:
  explicit NcclDeviceCollectives(NcclCommunicator c) : c_(std::move(c)) {}
  const char* name() const override { return "nccl"; }
  void allreduce(float* d, std::size_t n, ReduceOp op) const override { c_.allreduce(d, n, op); }
  void allreduce(double* d, std::size_t n, ReduceOp op) const override { c_.allreduce(d, n, op); }
  void allgatherv(const float* s, std::size_t sn, float* r, const std::vector<int>& counts,
                  const std::vector<int>& displs) const override {
    c_.allgatherv(s, sn, r, counts, displs);
  }
  void reduce_scatterv(const float* s, float* r, const std::vector<int>& counts) const override {
    c_.reduce_scatterv(s, r, counts);
  }
  void alltoallv(const float* s, const std::vector<int>& sc, const std::vector<int>& sd, float* r,
                 const std::vector<int>& rc, const std::vector<int>& rd) const override {
    c_.alltoallv(s, sc, sd, r, rc, rd);
  }
  void send(const float* d, std::size_t n, int dest) const override { c_.send(d, n, dest); }
  void recv(float* d, std::size_t n, int src) const override { c_.recv(d, n, src); }
  std::shared_ptr<const DeviceCollectives> make_for(const Communicator& sub) const override {
    return make_nccl_collectives(sub);
  }

 private:
  NcclCommunicator c_;
};
}  // namespace

std::shared_ptr<const DeviceCollectives> make_nccl_collectives(const Communicator& mpi) {
  return std::make_shared<NcclDeviceCollectives>(NcclCommunicator(mpi, nullptr, mpi.wait_mode()));
}

}  // namespace wlb::comm

#endif  // WLB4D_HAVE_NCCL
