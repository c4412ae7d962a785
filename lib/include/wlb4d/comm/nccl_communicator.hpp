#pragma once
/// \file nccl_communicator.hpp
/// \brief wlb::comm::NcclCommunicator — the NCCL backend of wlb::comm (device
/// buffers), built only with WLB4D_ENABLE_CUDA (which defines WLB4D_HAVE_NCCL).
///
/// Same call style as Communicator (communicator.hpp), on CUDA device pointers:
/// every call enqueues its NCCL operation on the communicator's CUDA stream and
/// then waits for the stream:
/// - WaitMode::Yield: cudaStreamQuery + sched_yield() until done, checking
///   ncclCommGetAsyncError on every poll (an asynchronous NCCL failure aborts
///   the communicator and throws instead of hanging);
/// - WaitMode::Block: cudaStreamSynchronize.
/// Counts and displacements are in elements (size_t for NCCL; no INT_MAX limit
/// except the int vectors of the v-variants).
///
/// Bootstrap (collective over the MPI communicator it is built from): rank 0
/// calls ncclGetUniqueId, the id is broadcast with MPI (host buffer), every rank
/// calls ncclCommInitRank(size, id, rank). The calling thread's CUDA device must
/// be selected (cudaSetDevice) before construction; the ranks of one node must
/// use different devices.
///
/// allgatherv, reduce_scatterv and alltoallv have no NCCL primitive: they are
/// one ncclGroupStart/End of ncclBroadcast (one per source rank), of
/// ncclReduce (one per destination rank) and of ncclSend/ncclRecv (one pair
/// per peer) respectively.
///
/// Errors: every call throws wlb::core::CommError with ncclGetErrorString and
/// ncclGetLastError text (or cudaGetErrorString).
/// Ownership: a copyable handle; the ncclComm_t is destroyed with the last copy.
/// After an asynchronous NCCL error the communicator is aborted and every
/// later call throws CommError.
/// The stream is the caller's (not destroyed); nullptr = the legacy default stream.

#if defined(WLB4D_HAVE_NCCL)

#include "wlb4d/comm/communicator.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace wlb::comm {

class NcclCommunicator {
 public:
  NcclCommunicator() = default;
  /// Collective over every rank of `mpi`. \throws CommError (MPI, NCCL or CUDA failure).
  explicit NcclCommunicator(const Communicator& mpi, cudaStream_t stream = nullptr,
                            WaitMode wait = WaitMode::Yield);

  int rank() const { return rank_; }
  int size() const { return size_; }
  ncclComm_t nccl() const;
  cudaStream_t stream() const { return stream_; }
  WaitMode wait_mode() const { return wait_; }

  /// In-place all-reduce of `count` device elements.
  template <class T> void allreduce(T* data, std::size_t count, ReduceOp op = ReduceOp::Sum) const;
  template <class T> void broadcast(T* data, std::size_t count, int root) const;
  /// recv has size()*count elements, rank order.
  template <class T> void allgather(const T* send, T* recv, std::size_t count) const;
  /// recv_counts[r] elements from rank r at recv+displs[r]; send_count == recv_counts[rank()].
  template <class T>
  void allgatherv(const T* send, std::size_t send_count, T* recv, const std::vector<int>& recv_counts,
                  const std::vector<int>& displs) const;
  /// Sum of send (size()*count) over ranks; rank r gets block r (count elements).
  template <class T> void reduce_scatter(const T* send, T* recv, std::size_t count) const;
  /// Rank r gets recv_counts[r] elements: Σ over ranks of the r-th block of send
  /// (blocks contiguous, at the prefix sums of recv_counts).
  template <class T>
  void reduce_scatterv(const T* send, T* recv, const std::vector<int>& recv_counts) const;
  /// All-to-all with per-peer counts (elements, one entry per rank; zero
  /// counts allowed): send[send_displs[p], +send_counts[p]) goes to rank p,
  /// recv[recv_displs[q], +recv_counts[q]) comes from rank q. One
  /// ncclGroupStart/End of an ncclSend and an ncclRecv per peer (the self
  /// part included). \throws CommError on a vector without one entry per
  /// rank or a negative entry (before anything is posted).
  template <class T>
  void alltoallv(const T* send, const std::vector<int>& send_counts, const std::vector<int>& send_displs, T* recv,
                 const std::vector<int>& recv_counts, const std::vector<int>& recv_displs) const;
  /// Point to point (blocks until the peer's matching call has completed the
  /// transfer). No tags: between two ranks the k-th send matches the k-th
  /// receive, and the counts must agree (NCCL does not check them).
  template <class T> void send(const T* data, std::size_t count, int dest) const;
  template <class T> void recv(T* data, std::size_t count, int src) const;
  /// Waits for everything enqueued on stream() (per wait_mode()).
  void synchronize() const;

  template <class V> void allreduce(const V& v, ReduceOp op = ReduceOp::Sum) const {
    allreduce(v.data(), v.span(), op);
  }
  template <class V> void broadcast(const V& v, int root) const { broadcast(v.data(), v.span(), root); }
  template <class V> void send(const V& v, int dest) const { send(v.data(), v.span(), dest); }
  template <class V> void recv(const V& v, int src) const { recv(v.data(), v.span(), src); }

 private:
  void check_live(const char* what) const;
  /// The NCCL communicator, shared by copies: destroyed by the last one, or
  /// aborted (ncclCommAbort) after an asynchronous error.
  struct State {
    ncclComm_t comm = nullptr;
    bool aborted = false;
    ~State();
  };
  std::shared_ptr<State> st_;
  mutable const char* op_ = "";  // the operation being waited for (watchdog message)
  cudaStream_t stream_ = nullptr;
  WaitMode wait_ = WaitMode::Yield;
  int rank_ = 0;
  int size_ = 0;
};

/// NCCL datatype of T (float, double, int32, int64, uint32, uint64, char, int8, uint8).
template <class T> ncclDataType_t nccl_type();

/// A NcclCommunicator over the ranks of `mpi` (same rank order, same wait
/// mode, default stream) as the DeviceCollectives to attach to `mpi`.
/// Collective over `mpi`. \throws CommError as NcclCommunicator's constructor.
std::shared_ptr<const DeviceCollectives> make_nccl_collectives(const Communicator& mpi);

}  // namespace wlb::comm

#endif  // WLB4D_HAVE_NCCL
