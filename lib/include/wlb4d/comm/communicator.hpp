#pragma once
/// \file communicator.hpp
/// \brief wlb::comm — every collective and point-to-point message of wlb4d.
///
/// The model, pipeline and optimizer never call MPI directly (DESIGN §1, §4);
/// they call a Communicator bound to one axis of the process grid. Two
/// backends share this interface: MPI (host buffers; always built) and NCCL
/// (device buffers; built with WLB4D_ENABLE_CUDA).
///
/// Waiting: with WaitMode::Yield the MPI backend posts nonblocking calls and
/// completes them with MPI_Test + sched_yield(), so oversubscribed ranks give
/// up their core instead of busy-polling (MPICH: 16 ranks on 2 cores, 200
/// allreduces of 256 KB: 63 s blocking vs 0.8 s polite, DESIGN §4); after
/// 200 µs without completion it also sleeps between polls (20 µs doubling to
/// 200 µs), so long-idle ranks (pipeline bubbles) leave the cores to workers.
///
/// Device buffers: the *_device calls (and the View conveniences for Views
/// whose memory the host cannot access) go to the attached DeviceCollectives
/// (NCCL, see attach_device and grid::ProcessGrid::use_backend); without one
/// they use MPI, which is right on host backends where device == host, and
/// stage through host buffers where the host cannot reach MemSpace (a CUDA
/// build without NCCL: a device pointer never reaches MPI). Device-resident
/// with a backend: allreduce, allgatherv, reduce_scatterv, alltoallv and
/// point-to-point send/recv (the last matched by order, not tag).
/// WaitMode::Block uses plain blocking calls (dedicated nodes).
///
/// All buffers are contiguous Kokkos Views (any rank, LayoutRight) in MemSpace
/// or HostSpace; element counts and displacements are in elements.
/// Errors: every call throws wlb::core::CommError with the MPI error text.
///
/// Implementation notes (lib/src/comm/communicator.cpp):
/// - Wrapping a communicator sets MPI_ERRORS_RETURN on it (also on
///   MPI_COMM_WORLD/SELF through world()/self()), so MPI failures come back as
///   codes that are translated with MPI_Error_string into CommError.
/// - MPI counts are `int`. allreduce, broadcast, send and recv split a buffer of
///   more than INT_MAX elements into consecutive messages (both sides split the
///   same way). allgather/reduce_scatter with a per-rank count > INT_MAX and
///   allgatherv with send_count > INT_MAX throw CommError.
/// - recv checks that the message had exactly `count` elements (CommError
///   otherwise): message sizes are known from the step plan, a mismatch is a bug.
/// - allreduce is in place (MPI_IN_PLACE). reduce_scatter(v) always sums.
/// - A default-constructed Communicator (or one wrapping MPI_COMM_NULL) throws
///   CommError on every call.
/// - Explicitly instantiated for float, double, int32_t, int64_t, uint32_t,
///   uint64_t, char, signed char (int8_t) and unsigned char (uint8_t). MPI has
///   no reductions on `char` (MPI_CHAR is text); use int8_t/uint8_t to reduce bytes.

#include "wlb4d/core/types.hpp"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace wlb::comm {

class Communicator;
class Request;

enum class WaitMode { Yield, Block };
enum class ReduceOp { Sum, Max, Min };

/// Collectives on device buffers (float/double; counts in elements), the
/// interface an accelerator backend implements (NCCL: nccl_communicator.hpp,
/// make_nccl_collectives). Collective over the same ranks, in the same rank
/// order, as the Communicator it is attached to. Every call is complete when
/// it returns (the buffers may be reused). Errors: core::CommError.
class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  virtual const char* name() const = 0;
  virtual void allreduce(float* data, std::size_t count, ReduceOp op) const = 0;
  virtual void allreduce(double* data, std::size_t count, ReduceOp op) const = 0;
  virtual void allgatherv(const float* send, std::size_t send_count, float* recv, const std::vector<int>& counts,
                          const std::vector<int>& displs) const = 0;
  virtual void reduce_scatterv(const float* send, float* recv, const std::vector<int>& counts) const = 0;
  /// All-to-all with per-peer counts, as Communicator::ialltoallv (one entry
  /// per rank in each vector, elements; zero counts allowed), blocking.
  virtual void alltoallv(const float* send, const std::vector<int>& send_counts, const std::vector<int>& send_displs,
                         float* recv, const std::vector<int>& recv_counts,
                         const std::vector<int>& recv_displs) const = 0;
  /// Point to point, blocking until the transfer is done. No tags: the k-th
  /// send from rank a to rank b matches the k-th receive at b from a (NCCL's
  /// matching), so callers must post them in the same order on both sides,
  /// and with the same count (a mismatch is not detected).
  virtual void send(const float* data, std::size_t count, int dest) const = 0;
  virtual void recv(float* data, std::size_t count, int src) const = 0;
  /// A backend of the same kind over the ranks of `sub` (a communicator made
  /// from the one this is attached to, e.g. by Communicator::split), to
  /// attach to `sub`. Collective over `sub`.
  virtual std::shared_ptr<const DeviceCollectives> make_for(const Communicator& sub) const = 0;
};

/// Process CPU seconds spent so far inside Communicator operations (all
/// communicators of this process, both wait modes; polling and MPI's own
/// reduction arithmetic included). Monotonic; take differences around a
/// region to remove communication from its CPU time (pipeline::Executor's
/// compute CPU time).
double comm_cpu_seconds();

/// Collective watchdog (comm.timeout_s): a polite wait (WaitMode::Yield)
/// that has not completed after `seconds` throws core::CommError naming the
/// operation, the group (Communicator::name), this rank and the wait — a rank
/// of the group stopped, crashed or is stuck — so the job ends (mpi_main
/// aborts every rank) instead of hanging. 0 disables it; WaitMode::Block
/// waits inside MPI and has no watchdog (wlb4d warns). Process-wide; default 0
/// until the trainer sets the deck's value.
///
/// The ranks that did not arrive: for send/recv the message names the peer.
/// For a collective the timed-out rank asks every other rank of the group on
/// a side channel (point-to-point on the same communicator, reserved tags
/// kWatchdogQueryTag/kWatchdogAnswerTag; MPI keeps them apart from the
/// collectives) and collects answers for min(2 s, timeout): a rank that has
/// been waiting on this communicator for more than 0.5 s answers with the
/// operation it waits in (it polls for queries in its own wait loop); a rank
/// that does not answer is not waiting on this group (stopped, crashed, or
/// busy elsewhere) and is named as not arrived, with its world rank. This
/// cannot hang: only nonblocking calls with bounded polls, and the
/// unanswered requests are cancelled; the job is aborted right after.
void set_wait_timeout(double seconds);
double wait_timeout();

/// Tags reserved for the watchdog's side channel (send/recv refuse them).
/// MPI guarantees MPI_TAG_UB >= 32767.
inline constexpr int kWatchdogQueryTag = 32766;
inline constexpr int kWatchdogAnswerTag = 32767;

/// A communicator over one group of ranks (one grid axis, or DP×CP).
/// Copyable handle; the underlying MPI_Comm is owned by whoever created it
/// (ProcessGrid) unless created with `owns = true`.
class Communicator {
 public:
  Communicator() = default;
  /// Wraps an MPI communicator. \param owns free it when the last copy dies.
  Communicator(MPI_Comm comm, WaitMode wait = WaitMode::Yield, bool owns = false);

  /// A one-rank communicator over MPI_COMM_SELF (single-rank code paths, tests).
  static Communicator self(WaitMode wait = WaitMode::Yield);
  /// MPI_COMM_WORLD (not owned).
  static Communicator world(WaitMode wait = WaitMode::Yield);

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm mpi() const { return comm_; }
  WaitMode wait_mode() const { return wait_; }
  /// The group's name in messages ("TP", "CP", "DP", "PP", "DP×CP", "world";
  /// grid::ProcessGrid names its axes). Default "MPI communicator".
  const std::string& name() const { return name_; }
  void set_name(std::string n) { name_ = std::move(n); }

  // ---- raw-pointer core (count in elements) ------------------------------------
  template <class T> void allreduce(T* data, std::size_t count, ReduceOp op = ReduceOp::Sum) const;
  /// In-place sum of bf16 values (their bits, core/bf16.hpp; host buffers):
  /// a user MPI_Op on MPI_UINT16_T whose every pairwise sum is formed in fp32
  /// and rounded to nearest even, so with 2 ranks the result is
  /// round(a + b), with more the order of MPI's reduction tree decides the
  /// roundings (identical on every rank: MPI's result is one buffer). Half
  /// the bytes of an fp32 allreduce (the gradient reduction option
  /// comm.grad_reduce_dtype = bf16).
  void allreduce_bf16_sum(std::uint16_t* data, std::size_t count) const;
  template <class T> void broadcast(T* data, std::size_t count, int root) const;
  /// Gathers `count` elements from every rank into recv (size()*count), rank order.
  template <class T> void allgather(const T* send, T* recv, std::size_t count) const;
  /// Variable-count all-gather: recv_counts[r] elements from rank r, at displs[r].
  /// In place when send == recv + displs[rank()] (MPI_IN_PLACE; NCCL's
  /// broadcast is in place at its root): this rank's part is already there.
  template <class T>
  void allgatherv(const T* send, std::size_t send_count, T* recv, const std::vector<int>& recv_counts,
                  const std::vector<int>& displs) const;
  /// Sum-reduce `send` (size()*count) and scatter: rank r gets block r (count elements).
  template <class T> void reduce_scatter(const T* send, T* recv, std::size_t count) const;
  /// Variable-count reduce-scatter: rank r receives recv_counts[r] elements,
  /// the sum over ranks of send[displs[r] .. displs[r]+recv_counts[r]),
  /// displs[r] = Σ_{q<r} recv_counts[q].
  /// In place when recv == send + displs[rank()] (host buffers): the sum lands
  /// in this rank's own range of `send`; the other ranges are unchanged.
  /// In place costs a scratch of recv_counts[rank()] elements and one copy:
  /// MPI_IN_PLACE is not used, because MPICH 4's pairwise reduce-scatter
  /// (large messages) then moves the result from recv + displs[rank()] to
  /// recv with an overlapping memcpy and aborts ("memcpy argument memory
  /// ranges overlap") whenever 0 < displs[rank()] < recv_counts[rank()] —
  /// the uneven counts of a ZeRO-1 gradient bucket. Callers that reduce every
  /// step (optim::Optimizer) pass their own receive buffer instead.
  template <class T>
  void reduce_scatterv(const T* send, T* recv, const std::vector<int>& recv_counts) const;

  // ---- nonblocking (started now, completed by Request::test / wait) ----------
  /// As allreduce (in place, sum/max/min), started nonblocking: the buffer
  /// must stay untouched until the Request completes. More than
  /// max_message_elements() are split into several MPI requests (one Request).
  /// Every rank of the group must start its nonblocking and blocking
  /// collectives on this communicator in the same order (MPI's rule).
  template <class T> Request iallreduce(T* data, std::size_t count, ReduceOp op = ReduceOp::Sum) const;
  /// As reduce_scatterv (sum; in place when recv == send + displs[rank()]),
  /// started nonblocking; recv_counts is copied into the Request (MPI reads it
  /// until completion). In place, the result is received into a scratch the
  /// Request owns and copied into this rank's range when it completes.
  template <class T>
  Request ireduce_scatterv(const T* send, T* recv, const std::vector<int>& recv_counts) const;
  /// All-to-all with per-peer counts (MPI_Ialltoallv), started nonblocking:
  /// rank r's send[send_displs[p], +send_counts[p]) arrives at peer p in its
  /// recv[recv_displs[r], +recv_counts[r]). Counts and displacements are in
  /// elements, one per rank of the group; they are copied into the Request.
  /// Both buffers must stay untouched until the Request completes. Host
  /// memory (or memory MPI can read: host builds); device buffers go through
  /// ialltoallv_device. Used by the core-attention exchange
  /// (model/ca_exchange.hpp).
  /// \throws core::CommError if a vector has not one entry per rank, an
  /// entry is negative, or MPI fails.
  template <class T>
  Request ialltoallv(const T* send, const std::vector<int>& send_counts, const std::vector<int>& send_displs,
                     T* recv, const std::vector<int>& recv_counts, const std::vector<int>& recv_displs) const;
  template <class T> void send(const T* data, std::size_t count, int dest, int tag) const;
  template <class T> void recv(T* data, std::size_t count, int src, int tag) const;
  void barrier() const;

  /// Collective over this communicator (MPI_Comm_split): the ranks passing
  /// the same color >= 0 form one new communicator, ordered by (key, rank);
  /// a rank passing color < 0 (kNoColor, MPI_UNDEFINED) joins none and gets
  /// std::nullopt. The new communicator is owned (freed with its last copy)
  /// and waits in this one's WaitMode. MPI has no nonblocking split, so under
  /// WaitMode::Yield the ranks first meet in a polite barrier; the blocking
  /// split then finds them all there and does not busy-poll.
  static constexpr int kNoColor = -1;
  std::optional<Communicator> split(int color, int key) const;

  // ---- device buffers (model activations, gradients) ---------------------------
  /// Attaches the backend used for device buffers (nullptr: MPI for all).
  /// Copies made afterwards share it; split() does not pass it on (see
  /// DeviceCollectives::make_for).
  void attach_device(std::shared_ptr<const DeviceCollectives> d) { device_ = std::move(d); }
  /// The attached device backend (nullptr: none).
  const std::shared_ptr<const DeviceCollectives>& device() const { return device_; }
  bool has_device() const { return device_ != nullptr; }
  /// The attached device backend's name, or "mpi".
  const char* device_backend() const { return device_ ? device_->name() : "mpi"; }
  /// As allreduce/allgatherv/reduce_scatterv, on buffers in MemSpace: through
  /// the attached DeviceCollectives; without one, MPI — directly where the
  /// host can access MemSpace (host builds), else through host staging
  /// buffers (comm.backend=mpi on a CUDA build: MPICH is not CUDA-aware, so
  /// device pointers must not reach it; the copies cost 2 × count elements
  /// over PCIe/C2C per call, which is why GPU runs use NCCL).
  template <class T> void allreduce_device(T* data, std::size_t count, ReduceOp op = ReduceOp::Sum) const {
    if (device_) {
      device_->allreduce(data, count, op);
    } else if constexpr (kHostReachesMemSpace) {
      allreduce(data, count, op);
    } else {
      T* h = host_stage<T>(0, count);
      stage_copy(h, static_cast<const T*>(data), count, true);
      allreduce(h, count, op);
      stage_copy(data, static_cast<const T*>(h), count, false);
    }
  }
  void allgatherv_device(const float* send, std::size_t send_count, float* recv, const std::vector<int>& counts,
                         const std::vector<int>& displs) const {
    if (device_) {
      device_->allgatherv(send, send_count, recv, counts, displs);
    } else if constexpr (kHostReachesMemSpace) {
      allgatherv(send, send_count, recv, counts, displs);
    } else {
      const std::size_t n = recv_extent(counts, displs);
      float* hs = host_stage<float>(0, send_count);
      float* hr = host_stage<float>(1, n);
      stage_copy(hs, send, send_count, true);
      allgatherv(hs, send_count, hr, counts, displs);
      stage_copy(recv, static_cast<const float*>(hr), n, false);
    }
  }
  void reduce_scatterv_device(const float* send, float* recv, const std::vector<int>& counts) const {
    if (device_) {
      device_->reduce_scatterv(send, recv, counts);
    } else if constexpr (kHostReachesMemSpace) {
      reduce_scatterv(send, recv, counts);
    } else {
      std::size_t total = 0;
      for (int c : counts) total += static_cast<std::size_t>(c);
      const std::size_t mine = static_cast<std::size_t>(counts.at(static_cast<std::size_t>(rank_)));
      float* hs = host_stage<float>(0, total);
      float* hr = host_stage<float>(1, mine);
      stage_copy(hs, send, total, true);
      reduce_scatterv(hs, hr, counts);
      stage_copy(recv, static_cast<const float*>(hr), mine, false);
    }
  }
  /// Nonblocking forms of allreduce_device / reduce_scatterv_device. With an
  /// attached DeviceCollectives (NCCL) the collective runs at the call (its
  /// interface synchronises the stream) and the Request is already complete,
  /// so the numbers and the order are those of the blocking path; without
  /// one they are iallreduce / ireduce_scatterv (MPI) where the host reaches
  /// MemSpace, else the host-staged blocking path (complete at the call).
  Request iallreduce_device(float* data, std::size_t count, ReduceOp op = ReduceOp::Sum) const;
  Request ireduce_scatterv_device(const float* send, float* recv, const std::vector<int>& counts) const;
  /// As ialltoallv, on buffers in MemSpace (send[send_displs[p], +send_counts[p])
  /// to peer p, recv[recv_displs[r], +recv_counts[r]) from peer r; elements).
  /// With an attached DeviceCollectives (NCCL) the all-to-all runs at the
  /// call, device to device, and the Request is already complete; without
  /// one it is ialltoallv (MPI, nonblocking) where the host reaches MemSpace,
  /// else staged through host buffers (send: its extent max(displ + count);
  /// recv likewise), complete at the call.
  /// 	hrows core::CommError as ialltoallv (a vector without one entry per
  ///         rank, a negative entry) or from the backend.
  Request ialltoallv_device(const float* send, const std::vector<int>& send_counts,
                            const std::vector<int>& send_displs, float* recv, const std::vector<int>& recv_counts,
                            const std::vector<int>& recv_displs) const;
  /// Point to point on `count` elements in MemSpace. With an attached
  /// DeviceCollectives (NCCL) the tag is not sent: messages between two
  /// ranks match in posting order (see DeviceCollectives::send), and the
  /// receive does not check the count; without one, send/recv with the tag
  /// (MPI, checked count), through a host buffer where the host cannot reach
  /// MemSpace. 	hrows core::CommError (peer out of range, reserved tag, MPI
  /// or backend failure).
  void send_device(const float* data, std::size_t count, int dest, int tag) const;
  void recv_device(float* data, std::size_t count, int src, int tag) const;

  // ---- View conveniences (contiguous Views) ------------------------------------
  /// Views the host cannot access (CudaSpace) go through allreduce_device.
  template <class V> void allreduce(const V& v, ReduceOp op = ReduceOp::Sum) const {
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename V::memory_space>::accessible) {
      allreduce(v.data(), v.span(), op);
    } else {
      allreduce_device(v.data(), v.span(), op);
    }
  }
  template <class V> void broadcast(const V& v, int root) const { broadcast(v.data(), v.span(), root); }
  template <class V> void send(const V& v, int dest, int tag) const { send(v.data(), v.span(), dest, tag); }
  template <class V> void recv(const V& v, int src, int tag) const { recv(v.data(), v.span(), src, tag); }

  /// Scalar all-reduce helper.
  template <class T> T allreduce_value(T x, ReduceOp op = ReduceOp::Sum) const {
    allreduce(&x, 1, op);
    return x;
  }

 private:
  static constexpr bool kHostReachesMemSpace =
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible;
  /// Host staging buffer `slot` (0 or 1) of at least count T's: grow-only,
  /// shared by the copies of this Communicator (each call completes before it
  /// returns, so one call's buffers are never in use by another).
  template <class T> T* host_stage(int slot, std::size_t count) const {
    auto& buf = (*stage_)[static_cast<std::size_t>(slot)];
    const std::size_t words = (count * sizeof(T) + sizeof(double) - 1) / sizeof(double);
    if (buf.size() < words) buf.resize(words);
    return reinterpret_cast<T*>(buf.data());
  }
  /// Copies count T's between MemSpace and a host staging buffer.
  template <class T> static void stage_copy(T* dst, const T* src, std::size_t count, bool to_host) {
    using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
    if (to_host) {
      Kokkos::deep_copy(Kokkos::View<T*, Kokkos::HostSpace, Unmanaged>(dst, count),
                        Kokkos::View<const T*, MemSpace, Unmanaged>(src, count));
    } else {
      Kokkos::deep_copy(Kokkos::View<T*, MemSpace, Unmanaged>(dst, count),
                        Kokkos::View<const T*, Kokkos::HostSpace, Unmanaged>(src, count));
    }
  }
  /// Elements an allgatherv writes: max over ranks of displs + counts.
  static std::size_t recv_extent(const std::vector<int>& counts, const std::vector<int>& displs) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < counts.size() && i < displs.size(); ++i)
      n = std::max(n, static_cast<std::size_t>(displs[i]) + static_cast<std::size_t>(counts[i]));
    return n;
  }
  std::shared_ptr<std::array<std::vector<double>, 2>> stage_ = std::make_shared<std::array<std::vector<double>, 2>>();
  friend class Request;
  void wait(MPI_Request& req) const;
  /// As wait(req), filling *status (recv needs the element count).
  void wait(MPI_Request& req, MPI_Status* status) const;
  /// Throws CommError unless this wraps a live communicator.
  void check_live(const char* what) const;
  /// Watchdog side channel (see set_wait_timeout): answers pending queries.
  void answer_watchdog_queries() const;
  /// The timeout message, after asking the group who is waiting.
  std::string timeout_message(double waited, double timeout) const;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_ = "MPI communicator";
  mutable const char* op_ = "";  // the operation being waited for (watchdog message)
  mutable int peer_ = -1;        // its peer (send/recv), -1 for a collective
  std::shared_ptr<MPI_Comm> owner_;
  WaitMode wait_ = WaitMode::Yield;
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<const DeviceCollectives> device_;
};

/// A started nonblocking collective (Communicator::iallreduce,
/// ireduce_scatterv and their _device forms). Move-only; a default-constructed
/// Request is complete. test() and wait() go through the communicator's wait
/// mode (polite MPI_Test + sched_yield loop, its watchdog) and add their CPU
/// time to comm_cpu_seconds(). Destroying an incomplete Request waits for it
/// (MPI forbids abandoning a collective's buffers), swallowing errors.
///
/// Progress (DESIGN §10): MPICH has no progress thread unless
/// MPIR_CVAR_ASYNC_PROGRESS=1, so a started collective advances only inside
/// MPI calls; callers test() outstanding requests between pieces of compute.
///
/// Timing (wall seconds, core::wall_seconds): started() when posted,
/// completed() when a test()/wait() first saw it complete (an upper bound of
/// the true completion), waited() the seconds spent inside wait() (the
/// exposed part; in flight = completed - started >= waited).
class Request {
 public:
  Request() = default;
  Request(Request&& o) noexcept;
  Request& operator=(Request&& o) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  /// True once complete (then the completion step, e.g. the in-place move of
  /// ireduce_scatterv, has run). Never blocks. \throws core::CommError.
  bool test();
  /// Waits until complete. \throws core::CommError (watchdog included).
  void wait();
  bool done() const { return pending_.empty(); }
  double started() const { return t_start_; }
  double completed() const { return t_done_; }
  double waited() const { return waited_; }

 private:
  friend class Communicator;
  void finish();
  std::optional<Communicator> comm_;   // for its wait mode, watchdog and name
  std::vector<MPI_Request> pending_;   // outstanding MPI requests (empty: done)
  std::shared_ptr<std::vector<int>> counts_;  // kept alive for MPI until completion
  std::function<void()> on_complete_;
  const char* op_ = "";
  double t_start_ = 0, t_done_ = 0, waited_ = 0;
};

// ---- small collective protocols ------------------------------------------------

/// Collective first-error agreement: every rank of c passes its own error
/// message ("" for none). Returns "" on every rank when no rank has one;
/// otherwise the message of the lowest rank that has one, on every rank.
/// Lets all ranks throw the same error together (DESIGN §3).
std::string agree(const Communicator& c, const std::string& local);

/// Collective broadcast of a string: returns rank `root`'s `s` on every rank
/// (the other ranks' `s` is ignored).
std::string bcast_string(const Communicator& c, std::string s, int root);

/// MPI datatype of T (float, double, int32, int64, uint32, uint64, char,
/// int8/signed char, uint8/unsigned char). Other types do not link.
template <class T> MPI_Datatype mpi_type();

namespace detail {
/// Largest element count sent in one MPI call (default INT_MAX). Test hook:
/// lowering it exercises the > INT_MAX splitting path with small buffers.
/// Must be set identically on every rank. \throws CommError if 0 or > INT_MAX.
void set_max_message_elements(std::size_t n);
std::size_t max_message_elements();
}  // namespace detail

}  // namespace wlb::comm
