// wlb::comm::Communicator — MPI backend (host buffers).
//
// WaitMode::Yield posts nonblocking calls and completes them with
// MPI_Test + sched_yield(); WaitMode::Block uses the blocking calls.
// Every MPI return code is checked (MPI_ERRORS_RETURN is set on every wrapped
// communicator) and turned into wlb::core::CommError with MPI_Error_string.

#include "wlb4d/comm/communicator.hpp"

#include "wlb4d/core/bf16.hpp"
#include "wlb4d/core/clock.hpp"
#include "wlb4d/core/error.hpp"

#include <fmt/format.h>
#include <sched.h>

#include <array>
#include <atomic>
#include <string>
#include <vector>
#include <ctime>
#include <climits>
#include <cstdint>
#include <cstring>
#include <algorithm>

namespace wlb::comm {

namespace {

std::atomic<std::size_t> g_max_elems{static_cast<std::size_t>(INT_MAX)};

// Process CPU seconds spent inside communication calls (both wait modes), so
// callers can take communication out of CPU-time measurements of compute.
std::atomic<double> g_comm_cpu{0.0};
struct CommCpuScope {
  double c0 = core::process_cpu_seconds();
  ~CommCpuScope() {
    const double dc = core::process_cpu_seconds() - c0;
    double cur = g_comm_cpu.load(std::memory_order_relaxed);
    while (!g_comm_cpu.compare_exchange_weak(cur, cur + dc, std::memory_order_relaxed)) {
    }
  }
};

std::string mpi_error_text(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return fmt::format("MPI error code {}", code);
  return std::string(buf, static_cast<std::size_t>(len));
}

MPI_Op to_mpi(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  throw core::CommError("wlb::comm: unknown ReduceOp");
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

bool mpi_finalized() {
  int f = 0;
  MPI_Finalized(&f);
  return f != 0;
}

}  // namespace

// ---- datatypes ------------------------------------------------------------------

template <> MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <> MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }
template <> MPI_Datatype mpi_type<std::int32_t>() { return MPI_INT32_T; }
template <> MPI_Datatype mpi_type<std::int64_t>() { return MPI_INT64_T; }
template <> MPI_Datatype mpi_type<std::uint32_t>() { return MPI_UINT32_T; }
template <> MPI_Datatype mpi_type<std::uint64_t>() { return MPI_UINT64_T; }
template <> MPI_Datatype mpi_type<char>() { return MPI_CHAR; }
template <> MPI_Datatype mpi_type<signed char>() { return MPI_INT8_T; }
template <> MPI_Datatype mpi_type<unsigned char>() { return MPI_UINT8_T; }

// ---- error plumbing -------------------------------------------------------------

namespace {
/// Throws CommError if rc is not MPI_SUCCESS. `who` is "rank r of n".
void check_rc(int rc, const char* call, int rank, int size) {
  if (rc == MPI_SUCCESS) return;
  throw core::CommError(fmt::format("wlb::comm: {} failed on rank {} of {}: {}", call, rank, size,
                                    mpi_error_text(rc)));
}

/// Calls that cannot be split (one count per rank) must fit one MPI message.
void check_count_int(std::size_t count, const char* call, int rank, int size) {
  const std::size_t lim = g_max_elems.load();  // INT_MAX unless lowered by the test hook
  if (count > lim)
    throw core::CommError(fmt::format(
        "wlb::comm: {} on rank {} of {}: count {} elements exceeds the MPI message limit ({} elements, "
        "MPI counts are int); split the buffer into calls of at most {} elements",
        call, rank, size, count, lim, lim));
}

/// The checks reduce_scatterv and ireduce_scatterv share: one count per rank,
/// none negative, their sum an MPI int. Returns this rank's displacement
/// (elements before its range). \throws core::CommError naming `call`.
std::int64_t scatter_displacement(const std::vector<int>& recv_counts, const char* call, int rank, int size) {
  if (static_cast<int>(recv_counts.size()) != size)
    throw core::CommError(fmt::format("wlb::comm: {} on rank {} of {}: recv_counts has {} entries, "
                                      "needs one per rank",
                                      call, rank, size, recv_counts.size()));
  std::int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    if (recv_counts[r] < 0)
      throw core::CommError(fmt::format("wlb::comm: {}: negative recv_counts[{}] = {}", call, r, recv_counts[r]));
    total += recv_counts[r];
  }
  check_count_int(static_cast<std::size_t>(total), fmt::format("{} (sum of recv_counts)", call).c_str(), rank, size);
  std::int64_t displ = 0;
  for (int r = 0; r < rank; ++r) displ += recv_counts[r];
  return displ;
}

/// The checks of ialltoallv and ialltoallv_device: four vectors of one entry
/// per rank, none negative. \throws core::CommError naming `call`.
void check_alltoallv_args(const char* call, int size, int rank, const std::vector<int>& send_counts,
                          const std::vector<int>& send_displs, const std::vector<int>& recv_counts,
                          const std::vector<int>& recv_displs) {
  const std::size_t n = static_cast<std::size_t>(size);
  for (const auto* v : {&send_counts, &send_displs, &recv_counts, &recv_displs}) {
    if (v->size() != n)
      throw core::CommError(fmt::format("{}: {} counts/displacements for a group of {} ranks (rank {})", call,
                                        v->size(), n, rank));
    for (int x : *v)
      if (x < 0) throw core::CommError(fmt::format("{}: negative count or displacement {} (rank {})", call, x, rank));
  }
}
}  // namespace

void Communicator::check_live(const char* what) const {
  if (comm_ == MPI_COMM_NULL)
    throw core::CommError(fmt::format("wlb::comm: {} called on a null communicator", what));
  op_ = what;
  peer_ = -1;
}

namespace {
std::atomic<double> g_wait_timeout{0.0};
}  // namespace

void set_wait_timeout(double seconds) { g_wait_timeout.store(seconds > 0 ? seconds : 0.0); }
double wait_timeout() { return g_wait_timeout.load(); }

// ---- construction ---------------------------------------------------------------

Communicator::Communicator(MPI_Comm comm, WaitMode wait, bool owns) : comm_(comm), wait_(wait) {
  if (comm == MPI_COMM_NULL) return;  // a null handle: every call throws
  int init = 0;
  MPI_Initialized(&init);
  if (!init || mpi_finalized())
    throw core::CommError("wlb::comm: Communicator created while MPI is not initialized (or already finalized)");
  check_rc(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", -1, -1);
  check_rc(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", -1, -1);
  check_rc(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", rank_, -1);
  if (owns) {
    owner_ = std::shared_ptr<MPI_Comm>(new MPI_Comm(comm), [](MPI_Comm* c) {
      // Freed when the last copy dies; after MPI_Finalize there is nothing to free.
      if (*c != MPI_COMM_NULL && *c != MPI_COMM_WORLD && *c != MPI_COMM_SELF && !mpi_finalized())
        MPI_Comm_free(c);
      delete c;
    });
  }
}

double comm_cpu_seconds() { return g_comm_cpu.load(std::memory_order_relaxed); }

Communicator Communicator::self(WaitMode wait) { return Communicator(MPI_COMM_SELF, wait, false); }
Communicator Communicator::world(WaitMode wait) { return Communicator(MPI_COMM_WORLD, wait, false); }

// ---- waiting --------------------------------------------------------------------

void Communicator::wait(MPI_Request& req) const { wait(req, MPI_STATUS_IGNORE); }

void Communicator::wait(MPI_Request& req, MPI_Status* status) const {
  if (wait_ == WaitMode::Block) {
    check_rc(MPI_Wait(&req, status), "MPI_Wait", rank_, size_);
    return;
  }
  // Poll with sched_yield() for the first kSpinSeconds (a message in flight
  // completes within it), then also sleep between polls, doubling from 20 µs
  // to kMaxSleep: a rank idle for long (a pipeline bubble, rank 0 calibrating)
  // must not take CPU from the ranks doing the work, which sched_yield alone
  // does not prevent when every core has several yielding ranks.
  constexpr double kSpinSeconds = 2e-4;
  constexpr long kMaxSleepNs = 200000;
  // A rank waiting this long answers the watchdog queries of a timed-out
  // rank of the group (after the spin phase: no cost to short waits).
  constexpr double kAnswerAfterSeconds = 0.5;
  int flag = 0;
  double t0 = -1;
  long sleep_ns = 20000;
  const double timeout = wait_timeout();
  for (;;) {
    check_rc(MPI_Test(&req, &flag, status), "MPI_Test", rank_, size_);
    if (flag) return;
    sched_yield();  // give the core to an oversubscribed neighbour
    const double t = core::wall_seconds();
    if (t0 < 0) t0 = t;
    if (timeout > 0 && t - t0 > kAnswerAfterSeconds) answer_watchdog_queries();
    if (timeout > 0 && t - t0 > timeout) throw core::CommError(timeout_message(t - t0, timeout));
    if (t - t0 > kSpinSeconds) {
      timespec ts{0, sleep_ns};
      nanosleep(&ts, nullptr);
      sleep_ns = std::min(2 * sleep_ns, kMaxSleepNs);
    }
  }
}

// ---- watchdog side channel ------------------------------------------------------

namespace {
constexpr int kOpChars = 32;  // operation names are short literals ("allreduce")

/// Polls `req` for at most `seconds` (never blocks); true if it completed.
bool test_for(MPI_Request& req, double seconds) {
  const double t0 = core::wall_seconds();
  int flag = 0;
  for (;;) {
    if (MPI_Test(&req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (flag) return true;
    if (core::wall_seconds() - t0 > seconds) return false;
    sched_yield();
  }
}

/// Drops a request that may never complete: cancel (local for a receive),
/// then free it if the cancellation does not complete at once.
void drop(MPI_Request& req) {
  if (req == MPI_REQUEST_NULL) return;
  MPI_Cancel(&req);
  if (!test_for(req, 0.01) && req != MPI_REQUEST_NULL) MPI_Request_free(&req);
}
}  // namespace

void Communicator::answer_watchdog_queries() const {
  for (;;) {
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    if (MPI_Improbe(MPI_ANY_SOURCE, kWatchdogQueryTag, comm_, &flag, &msg, &st) != MPI_SUCCESS || !flag) return;
    // Static: should a receive not complete, a late write lands in it, not
    // in a dead stack frame (the content is not used).
    static char query[kOpChars];
    MPI_Request r = MPI_REQUEST_NULL;
    if (MPI_Imrecv(query, kOpChars, MPI_CHAR, &msg, &r) != MPI_SUCCESS) return;
    if (!test_for(r, 1.0)) drop(r);  // a matched small message: arrives at once
    // The answer is sent from op_'s literal (static storage), so the request
    // can be freed without waiting: nothing on this side can hang on it.
    MPI_Request a = MPI_REQUEST_NULL;
    const int n = int(std::min<std::size_t>(std::strlen(op_) + 1, kOpChars));
    if (MPI_Isend(const_cast<char*>(op_), n, MPI_CHAR, st.MPI_SOURCE, kWatchdogAnswerTag, comm_, &a) == MPI_SUCCESS)
      MPI_Request_free(&a);
  }
}

std::string Communicator::timeout_message(double waited, double timeout) const {
  std::string msg = fmt::format("communication timeout: {} on the {} group (this rank is {} of {}) has not completed "
                                "after {:.0f} s (comm.timeout_s={:g})",
                                op_, name_, rank_, size_, waited, timeout);
  // World ranks of the group's ranks (local calls).
  const auto n_ranks = static_cast<std::size_t>(size_);
  std::vector<int> mine(n_ranks), world(n_ranks, -1);
  for (int r = 0; r < size_; ++r) mine[std::size_t(r)] = r;
  MPI_Group g = MPI_GROUP_NULL, wg = MPI_GROUP_NULL;
  if (MPI_Comm_group(comm_, &g) == MPI_SUCCESS && MPI_Comm_group(MPI_COMM_WORLD, &wg) == MPI_SUCCESS)
    MPI_Group_translate_ranks(g, size_, mine.data(), wg, world.data());
  if (g != MPI_GROUP_NULL) MPI_Group_free(&g);
  if (wg != MPI_GROUP_NULL) MPI_Group_free(&wg);
  const auto who = [&](int r) { return fmt::format("{} (world rank {})", r, world[std::size_t(r)]); };
  if (peer_ >= 0)
    return msg + fmt::format(": its peer, rank {} of the group, did not arrive (stopped, crashed or stuck)",
                             who(peer_));
  // Ask the others (see set_wait_timeout), answering their questions meanwhile.
  std::vector<MPI_Request> answers(n_ranks, MPI_REQUEST_NULL);
  // Leaked on purpose: a receive whose cancellation comes too late may still
  // write into it (this runs once per process, right before the abort).
  auto& ops = *new std::vector<std::array<char, kOpChars>>(n_ranks);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Request q = MPI_REQUEST_NULL;
    const int n = int(std::min<std::size_t>(std::strlen(op_) + 1, kOpChars));
    if (MPI_Isend(const_cast<char*>(op_), n, MPI_CHAR, r, kWatchdogQueryTag, comm_, &q) == MPI_SUCCESS)
      MPI_Request_free(&q);
    ops[std::size_t(r)].fill(0);
    MPI_Irecv(ops[std::size_t(r)].data(), kOpChars, MPI_CHAR, r, kWatchdogAnswerTag, comm_, &answers[std::size_t(r)]);
  }
  const double grace = std::min(2.0, timeout), t0 = core::wall_seconds();
  std::vector<bool> answered(n_ranks, false);
  int left = size_ - 1;
  while (left > 0 && core::wall_seconds() - t0 < grace) {
    for (int r = 0; r < size_; ++r) {
      int flag = 0;
      auto& a = answers[std::size_t(r)];
      if (r == rank_ || answered[std::size_t(r)] || a == MPI_REQUEST_NULL) continue;
      if (MPI_Test(&a, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
        answered[std::size_t(r)] = true;
        --left;
      }
    }
    answer_watchdog_queries();
    timespec ts{0, 200000};
    nanosleep(&ts, nullptr);
  }
  std::string missing, waiting;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (!answered[std::size_t(r)]) {
      drop(answers[std::size_t(r)]);
      missing += (missing.empty() ? "" : ", ") + who(r);
    } else {
      ops[std::size_t(r)].back() = 0;
      waiting += fmt::format("{}{} in {}", waiting.empty() ? "" : ", ", who(r), ops[std::size_t(r)].data());
    }
  }
  if (!missing.empty())
    msg += fmt::format(": rank{} {} of the group did not arrive (no answer within {:g} s: stopped, crashed, or busy "
                       "outside this group)",
                       missing.find(',') == std::string::npos ? "" : "s", missing, grace);
  else
    msg += ": every other rank of the group is waiting too (a lost message or a stuck network)";
  if (!waiting.empty()) msg += "; waiting: " + waiting;
  return msg;
}

// ---- collectives ----------------------------------------------------------------

template <class T> void Communicator::allreduce(T* data, std::size_t count, ReduceOp op) const {
  check_live("allreduce");
  const CommCpuScope cpu_scope;
  const MPI_Datatype type = mpi_type<T>();
  const MPI_Op mop = to_mpi(op);
  const std::size_t lim = g_max_elems.load();
  for (std::size_t off = 0; off < count; off += lim) {
    const int n = static_cast<int>(std::min(lim, count - off));
    if (wait_ == WaitMode::Block) {
      const int rc = MPI_Allreduce(MPI_IN_PLACE, data + off, n, type, mop, comm_);
      if (rc != MPI_SUCCESS) check_rc(rc, fmt::format("MPI_Allreduce({})", op_name(op)).c_str(), rank_, size_);
    } else {
      MPI_Request req;
      const int rc = MPI_Iallreduce(MPI_IN_PLACE, data + off, n, type, mop, comm_, &req);
      if (rc != MPI_SUCCESS) check_rc(rc, fmt::format("MPI_Iallreduce({})", op_name(op)).c_str(), rank_, size_);
      wait(req);
    }
  }
}

namespace {
// MPI user reduction: inout[i] = bf16(fp32(in[i]) + fp32(inout[i])), RNE.
void bf16_sum_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = core::float_to_bf16(core::bf16_to_float(a[i]) + core::bf16_to_float(b[i]));
}
MPI_Op bf16_sum_op() {
  static MPI_Op op = [] {
    MPI_Op o;
    const int rc = MPI_Op_create(&bf16_sum_fn, /*commute=*/1, &o);
    if (rc != MPI_SUCCESS) throw core::CommError("wlb::comm: MPI_Op_create(bf16 sum): " + mpi_error_text(rc));
    return o;
  }();
  return op;
}
}  // namespace

void Communicator::allreduce_bf16_sum(std::uint16_t* data, std::size_t count) const {
  check_live("allreduce_bf16_sum");
  const CommCpuScope cpu_scope;
  const MPI_Op mop = bf16_sum_op();
  const std::size_t lim = g_max_elems.load();
  for (std::size_t off = 0; off < count; off += lim) {
    const int n = static_cast<int>(std::min(lim, count - off));
    if (wait_ == WaitMode::Block) {
      const int rc = MPI_Allreduce(MPI_IN_PLACE, data + off, n, MPI_UINT16_T, mop, comm_);
      if (rc != MPI_SUCCESS) check_rc(rc, "MPI_Allreduce(bf16 sum)", rank_, size_);
    } else {
      MPI_Request req;
      const int rc = MPI_Iallreduce(MPI_IN_PLACE, data + off, n, MPI_UINT16_T, mop, comm_, &req);
      if (rc != MPI_SUCCESS) check_rc(rc, "MPI_Iallreduce(bf16 sum)", rank_, size_);
      wait(req);
    }
  }
}

template <class T> void Communicator::broadcast(T* data, std::size_t count, int root) const {
  check_live("broadcast");
  const CommCpuScope cpu_scope;
  if (root < 0 || root >= size_)
    throw core::CommError(fmt::format("wlb::comm: broadcast root {} out of range [0, {})", root, size_));
  const MPI_Datatype type = mpi_type<T>();
  const std::size_t lim = g_max_elems.load();
  for (std::size_t off = 0; off < count; off += lim) {
    const int n = static_cast<int>(std::min(lim, count - off));
    if (wait_ == WaitMode::Block) {
      check_rc(MPI_Bcast(data + off, n, type, root, comm_), "MPI_Bcast", rank_, size_);
    } else {
      MPI_Request req;
      check_rc(MPI_Ibcast(data + off, n, type, root, comm_, &req), "MPI_Ibcast", rank_, size_);
      wait(req);
    }
  }
}

template <class T> void Communicator::allgather(const T* send, T* recv, std::size_t count) const {
  check_live("allgather");
  const CommCpuScope cpu_scope;
  check_count_int(count, "allgather", rank_, size_);
  const MPI_Datatype type = mpi_type<T>();
  const int n = static_cast<int>(count);
  if (wait_ == WaitMode::Block) {
    check_rc(MPI_Allgather(send, n, type, recv, n, type, comm_), "MPI_Allgather", rank_, size_);
  } else {
    MPI_Request req;
    check_rc(MPI_Iallgather(send, n, type, recv, n, type, comm_, &req), "MPI_Iallgather", rank_, size_);
    wait(req);
  }
}

template <class T>
void Communicator::allgatherv(const T* send, std::size_t send_count, T* recv, const std::vector<int>& recv_counts,
                              const std::vector<int>& displs) const {
  check_live("allgatherv");
  const CommCpuScope cpu_scope;
  if (static_cast<int>(recv_counts.size()) != size_ || static_cast<int>(displs.size()) != size_)
    throw core::CommError(fmt::format(
        "wlb::comm: allgatherv on rank {} of {}: recv_counts ({}) and displs ({}) must have one entry per rank",
        rank_, size_, recv_counts.size(), displs.size()));
  for (int r = 0; r < size_; ++r)
    if (recv_counts[r] < 0 || displs[r] < 0)
      throw core::CommError(fmt::format("wlb::comm: allgatherv: negative count/displacement for rank {} ({}, {})",
                                        r, recv_counts[r], displs[r]));
  check_count_int(send_count, "allgatherv", rank_, size_);
  if (static_cast<std::size_t>(recv_counts[rank_]) != send_count)
    throw core::CommError(fmt::format("wlb::comm: allgatherv on rank {} of {}: send_count {} != recv_counts[{}] = {}",
                                      rank_, size_, send_count, rank_, recv_counts[rank_]));
  const MPI_Datatype type = mpi_type<T>();
  const int n = static_cast<int>(send_count);
  const void* sendbuf = send == recv + displs[rank_] ? MPI_IN_PLACE : static_cast<const void*>(send);
  if (wait_ == WaitMode::Block) {
    check_rc(MPI_Allgatherv(sendbuf, n, type, recv, recv_counts.data(), displs.data(), type, comm_), "MPI_Allgatherv",
             rank_, size_);
  } else {
    MPI_Request req;
    check_rc(MPI_Iallgatherv(sendbuf, n, type, recv, recv_counts.data(), displs.data(), type, comm_, &req),
             "MPI_Iallgatherv", rank_, size_);
    wait(req);
  }
}

template <class T> void Communicator::reduce_scatter(const T* send, T* recv, std::size_t count) const {
  check_live("reduce_scatter");
  const CommCpuScope cpu_scope;
  check_count_int(count, "reduce_scatter", rank_, size_);
  const MPI_Datatype type = mpi_type<T>();
  const int n = static_cast<int>(count);
  if (wait_ == WaitMode::Block) {
    check_rc(MPI_Reduce_scatter_block(send, recv, n, type, MPI_SUM, comm_), "MPI_Reduce_scatter_block", rank_,
             size_);
  } else {
    MPI_Request req;
    check_rc(MPI_Ireduce_scatter_block(send, recv, n, type, MPI_SUM, comm_, &req), "MPI_Ireduce_scatter_block",
             rank_, size_);
    wait(req);
  }
}

template <class T>
void Communicator::reduce_scatterv(const T* send, T* recv, const std::vector<int>& recv_counts) const {
  check_live("reduce_scatterv");
  const CommCpuScope cpu_scope;
  const std::int64_t displ = scatter_displacement(recv_counts, "reduce_scatterv", rank_, size_);
  const MPI_Datatype type = mpi_type<T>();
  // In place (recv inside send): the sum is received into a scratch of this
  // rank's count and copied into its range afterwards, never with
  // MPI_IN_PLACE (why: reduce_scatterv in communicator.hpp).
  const bool in_place = recv == send + displ;
  std::vector<T> scratch(in_place ? static_cast<std::size_t>(recv_counts[rank_]) : 0);
  T* const recvbuf = in_place ? scratch.data() : recv;
  if (wait_ == WaitMode::Block) {
    check_rc(MPI_Reduce_scatter(send, recvbuf, recv_counts.data(), type, MPI_SUM, comm_), "MPI_Reduce_scatter",
             rank_, size_);
  } else {
    MPI_Request req;
    check_rc(MPI_Ireduce_scatter(send, recvbuf, recv_counts.data(), type, MPI_SUM, comm_, &req),
             "MPI_Ireduce_scatter", rank_, size_);
    wait(req);
  }
  if (in_place && !scratch.empty()) std::memcpy(recv, scratch.data(), sizeof(T) * scratch.size());
}

// ---- nonblocking collectives -----------------------------------------------------

template <class T> Request Communicator::iallreduce(T* data, std::size_t count, ReduceOp op) const {
  check_live("iallreduce");
  const CommCpuScope cpu_scope;
  Request r;
  r.comm_ = *this;
  r.op_ = "iallreduce";
  r.t_start_ = core::wall_seconds();
  const MPI_Datatype type = mpi_type<T>();
  const MPI_Op mop = to_mpi(op);
  const std::size_t lim = g_max_elems.load();
  for (std::size_t off = 0; off < count; off += lim) {
    const int n = static_cast<int>(std::min(lim, count - off));
    MPI_Request req;
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, data + off, n, type, mop, comm_, &req);
    if (rc != MPI_SUCCESS) check_rc(rc, fmt::format("MPI_Iallreduce({})", op_name(op)).c_str(), rank_, size_);
    r.pending_.push_back(req);
  }
  if (r.pending_.empty()) r.t_done_ = r.t_start_;
  return r;
}

template <class T>
Request Communicator::ireduce_scatterv(const T* send, T* recv, const std::vector<int>& recv_counts) const {
  check_live("ireduce_scatterv");
  const CommCpuScope cpu_scope;
  const std::int64_t displ = scatter_displacement(recv_counts, "ireduce_scatterv", rank_, size_);
  const bool in_place = recv == send + displ;  // as reduce_scatterv: through a scratch, never MPI_IN_PLACE
  const auto mine = static_cast<std::size_t>(recv_counts[rank_]);
  Request r;
  r.comm_ = *this;
  r.op_ = "ireduce_scatterv";
  r.counts_ = std::make_shared<std::vector<int>>(recv_counts);
  r.t_start_ = core::wall_seconds();
  // The scratch lives in the completion step, which the Request keeps until
  // MPI is done with it.
  auto scratch = in_place ? std::make_shared<std::vector<T>>(mine) : nullptr;
  MPI_Request req;
  check_rc(MPI_Ireduce_scatter(send, in_place ? scratch->data() : recv, r.counts_->data(), mpi_type<T>(), MPI_SUM,
                               comm_, &req),
           "MPI_Ireduce_scatter", rank_, size_);
  r.pending_.push_back(req);
  if (in_place && mine > 0)
    r.on_complete_ = [recv, scratch] { std::memcpy(recv, scratch->data(), sizeof(T) * scratch->size()); };
  return r;
}

template <class T>
Request Communicator::ialltoallv(const T* send, const std::vector<int>& send_counts,
                                const std::vector<int>& send_displs, T* recv, const std::vector<int>& recv_counts,
                                const std::vector<int>& recv_displs) const {
  check_live("ialltoallv");
  check_alltoallv_args("ialltoallv", size_, rank_, send_counts, send_displs, recv_counts, recv_displs);
  const std::size_t n = static_cast<std::size_t>(size_);
  const CommCpuScope cpu_scope;
  Request r;
  r.comm_ = *this;
  r.op_ = "ialltoallv";
  r.counts_ = std::make_shared<std::vector<int>>();
  for (const auto* v : {&send_counts, &send_displs, &recv_counts, &recv_displs})
    r.counts_->insert(r.counts_->end(), v->begin(), v->end());
  const int* c = r.counts_->data();
  r.t_start_ = core::wall_seconds();
  MPI_Request req;
  check_rc(MPI_Ialltoallv(send, c, c + n, mpi_type<T>(), recv, c + 2 * n, c + 3 * n, mpi_type<T>(), comm_, &req),
           "MPI_Ialltoallv", rank_, size_);
  r.pending_.push_back(req);
  return r;
}

// With NCCL attached, or with device memory and no NCCL (comm.backend=mpi on a
// CUDA build: host staging, which must complete before the staging buffers are
// reused), the collective runs at the call and the Request is already complete.
Request Communicator::iallreduce_device(float* data, std::size_t count, ReduceOp op) const {
  if (!device_ && kHostReachesMemSpace) return iallreduce(data, count, op);
  Request r;
  r.t_start_ = core::wall_seconds();
  allreduce_device(data, count, op);
  r.t_done_ = core::wall_seconds();
  return r;
}

Request Communicator::ireduce_scatterv_device(const float* send, float* recv, const std::vector<int>& counts) const {
  if (!device_ && kHostReachesMemSpace) return ireduce_scatterv(send, recv, counts);
  Request r;
  r.t_start_ = core::wall_seconds();
  reduce_scatterv_device(send, recv, counts);
  r.t_done_ = core::wall_seconds();
  return r;
}

Request Communicator::ialltoallv_device(const float* send, const std::vector<int>& send_counts,
                                       const std::vector<int>& send_displs, float* recv,
                                       const std::vector<int>& recv_counts,
                                       const std::vector<int>& recv_displs) const {
  if (!device_ && kHostReachesMemSpace)
    return ialltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs);
  check_live("ialltoallv_device");
  check_alltoallv_args("ialltoallv_device", size_, rank_, send_counts, send_displs, recv_counts, recv_displs);
  Request r;
  r.t_start_ = core::wall_seconds();
  if (device_) {
    device_->alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs);
  } else {
    // CUDA build without NCCL: MPICH must not see device pointers.
    const std::size_t ns = recv_extent(send_counts, send_displs), nr = recv_extent(recv_counts, recv_displs);
    float* hs = host_stage<float>(0, ns);
    float* hr = host_stage<float>(1, nr);
    stage_copy(hs, send, ns, true);
    ialltoallv(static_cast<const float*>(hs), send_counts, send_displs, hr, recv_counts, recv_displs).wait();
    stage_copy(recv, static_cast<const float*>(hr), nr, false);
  }
  r.t_done_ = core::wall_seconds();
  return r;
}

void Communicator::send_device(const float* data, std::size_t count, int dest, int tag) const {
  if (!device_) {
    if constexpr (kHostReachesMemSpace) {
      send(data, count, dest, tag);
    } else {
      float* h = host_stage<float>(0, count);
      stage_copy(h, data, count, true);
      send(static_cast<const float*>(h), count, dest, tag);
    }
    return;
  }
  check_live("send_device");
  if (dest < 0 || dest >= size_)
    throw core::CommError(fmt::format("wlb::comm: send_device from rank {}: destination {} out of range [0, {})",
                                      rank_, dest, size_));
  device_->send(data, count, dest);
}

void Communicator::recv_device(float* data, std::size_t count, int src, int tag) const {
  if (!device_) {
    if constexpr (kHostReachesMemSpace) {
      recv(data, count, src, tag);
    } else {
      float* h = host_stage<float>(0, count);
      recv(h, count, src, tag);
      stage_copy(data, static_cast<const float*>(h), count, false);
    }
    return;
  }
  check_live("recv_device");
  if (src < 0 || src >= size_)
    throw core::CommError(
        fmt::format("wlb::comm: recv_device on rank {}: source {} out of range [0, {})", rank_, src, size_));
  device_->recv(data, count, src);
}

Request::Request(Request&& o) noexcept { *this = std::move(o); }

Request& Request::operator=(Request&& o) noexcept {
  if (this != &o) {
    if (!done()) {
      try {
        wait();
      } catch (...) {
      }
    }
    comm_ = std::move(o.comm_);
    pending_ = std::move(o.pending_);
    counts_ = std::move(o.counts_);
    on_complete_ = std::move(o.on_complete_);
    op_ = o.op_;
    t_start_ = o.t_start_;
    t_done_ = o.t_done_;
    waited_ = o.waited_;
    o.pending_.clear();
    o.on_complete_ = nullptr;
  }
  return *this;
}

Request::~Request() {
  if (done() || mpi_finalized()) return;
  try {
    wait();
  } catch (...) {  // a destructor must not throw; the error was (or will be) reported elsewhere
  }
}

void Request::finish() {
  pending_.clear();
  t_done_ = core::wall_seconds();
  if (on_complete_) on_complete_();
  on_complete_ = nullptr;
  counts_.reset();
}

bool Request::test() {
  if (done()) return true;
  const CommCpuScope cpu_scope;
  while (!pending_.empty()) {
    int flag = 0;
    check_rc(MPI_Test(&pending_.front(), &flag, MPI_STATUS_IGNORE), "MPI_Test", comm_->rank(), comm_->size());
    if (!flag) return false;
    pending_.erase(pending_.begin());
  }
  finish();
  return true;
}

void Request::wait() {
  if (done()) return;
  const CommCpuScope cpu_scope;
  const double t0 = core::wall_seconds();
  comm_->op_ = op_;
  for (auto& req : pending_) comm_->wait(req);
  waited_ += core::wall_seconds() - t0;
  finish();
}

// ---- point to point -------------------------------------------------------------

template <class T> void Communicator::send(const T* data, std::size_t count, int dest, int tag) const {
  check_live("send");
  const CommCpuScope cpu_scope;
  if (dest < 0 || dest >= size_)
    throw core::CommError(fmt::format("wlb::comm: send from rank {}: destination {} out of range [0, {})", rank_,
                                      dest, size_));
  if (tag >= kWatchdogQueryTag)
    throw core::CommError(fmt::format("wlb::comm: send tag {} is reserved for the watchdog (use < {})", tag,
                                      kWatchdogQueryTag));
  peer_ = dest;
  const MPI_Datatype type = mpi_type<T>();
  const std::size_t lim = g_max_elems.load();
  std::size_t off = 0;
  do {  // a zero-length message is still one message (the receiver expects it)
    const int n = static_cast<int>(std::min(lim, count - off));
    if (wait_ == WaitMode::Block) {
      check_rc(MPI_Send(data + off, n, type, dest, tag, comm_), "MPI_Send", rank_, size_);
    } else {
      MPI_Request req;
      check_rc(MPI_Isend(data + off, n, type, dest, tag, comm_, &req), "MPI_Isend", rank_, size_);
      wait(req);
    }
    off += static_cast<std::size_t>(n);
  } while (off < count);
}

template <class T> void Communicator::recv(T* data, std::size_t count, int src, int tag) const {
  check_live("recv");
  const CommCpuScope cpu_scope;
  if (src < 0 || src >= size_)
    throw core::CommError(
        fmt::format("wlb::comm: recv on rank {}: source {} out of range [0, {})", rank_, src, size_));
  if (tag >= kWatchdogQueryTag)
    throw core::CommError(fmt::format("wlb::comm: recv tag {} is reserved for the watchdog (use < {})", tag,
                                      kWatchdogQueryTag));
  peer_ = src;
  const MPI_Datatype type = mpi_type<T>();
  const std::size_t lim = g_max_elems.load();
  std::size_t off = 0;
  do {
    const int n = static_cast<int>(std::min(lim, count - off));
    MPI_Status status;
    if (wait_ == WaitMode::Block) {
      check_rc(MPI_Recv(data + off, n, type, src, tag, comm_, &status), "MPI_Recv", rank_, size_);
    } else {
      MPI_Request req;
      check_rc(MPI_Irecv(data + off, n, type, src, tag, comm_, &req), "MPI_Irecv", rank_, size_);
      wait(req, &status);
    }
    int got = 0;
    check_rc(MPI_Get_count(&status, type, &got), "MPI_Get_count", rank_, size_);
    if (got != n)
      throw core::CommError(fmt::format(
          "wlb::comm: recv on rank {} of {} from rank {} (tag {}): expected {} elements, the message had {}", rank_,
          size_, src, tag, n, got));
    off += static_cast<std::size_t>(n);
  } while (off < count);
}

void Communicator::barrier() const {
  check_live("barrier");
  const CommCpuScope cpu_scope;
  if (wait_ == WaitMode::Block) {
    check_rc(MPI_Barrier(comm_), "MPI_Barrier", rank_, size_);
  } else {
    MPI_Request req;
    check_rc(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier", rank_, size_);
    wait(req);
  }
}

std::optional<Communicator> Communicator::split(int color, int key) const {
  check_live("split");
  if (wait_ == WaitMode::Yield) barrier();  // wait politely; the split below blocks
  const CommCpuScope cpu_scope;
  MPI_Comm sub = MPI_COMM_NULL;
  check_rc(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "MPI_Comm_split", rank_, size_);
  if (sub == MPI_COMM_NULL) return std::nullopt;
  return Communicator(sub, wait_, /*owns=*/true);
}

// ---- small collective protocols -------------------------------------------------

std::string agree(const Communicator& c, const std::string& local) {
  const int mine = local.empty() ? c.size() : c.rank();
  const int first = c.allreduce_value(mine, ReduceOp::Min);
  if (first == c.size()) return "";
  std::int64_t len = c.rank() == first ? std::int64_t(local.size()) : 0;
  c.broadcast(&len, 1, first);
  std::string msg(std::size_t(len), '\0');
  if (c.rank() == first) msg = local;
  if (len > 0) c.broadcast(msg.data(), std::size_t(len), first);
  return msg;
}

std::string bcast_string(const Communicator& c, std::string s, int root) {
  std::int64_t len = std::int64_t(s.size());
  c.broadcast(&len, 1, root);
  s.resize(std::size_t(len));
  if (len > 0) c.broadcast(s.data(), std::size_t(len), root);
  return s;
}

namespace detail {
void set_max_message_elements(std::size_t n) {
  if (n == 0 || n > static_cast<std::size_t>(INT_MAX))
    throw core::CommError(fmt::format("wlb::comm: max message elements must be in [1, {}] (got {})", INT_MAX, n));
  g_max_elems.store(n);
}
std::size_t max_message_elements() { return g_max_elems.load(); }
}  // namespace detail

// ---- explicit instantiations ----------------------------------------------------

#define WLB4D_COMM_INSTANTIATE(T)                                                                            \
  template void Communicator::allreduce<T>(T*, std::size_t, ReduceOp) const;                                 \
  template void Communicator::broadcast<T>(T*, std::size_t, int) const;                                      \
  template void Communicator::allgather<T>(const T*, T*, std::size_t) const;                                 \
  template void Communicator::allgatherv<T>(const T*, std::size_t, T*, const std::vector<int>&,              \
                                            const std::vector<int>&) const;                                  \
  template void Communicator::reduce_scatter<T>(const T*, T*, std::size_t) const;                            \
  template void Communicator::reduce_scatterv<T>(const T*, T*, const std::vector<int>&) const;               \
  template void Communicator::send<T>(const T*, std::size_t, int, int) const;                                \
  template void Communicator::recv<T>(T*, std::size_t, int, int) const;                                \
  template Request Communicator::iallreduce<T>(T*, std::size_t, ReduceOp) const;                           \
  template Request Communicator::ireduce_scatterv<T>(const T*, T*, const std::vector<int>&) const;         \
  template Request Communicator::ialltoallv<T>(const T*, const std::vector<int>&, const std::vector<int>&, T*,  \
                                               const std::vector<int>&, const std::vector<int>&) const;

WLB4D_COMM_INSTANTIATE(float)
WLB4D_COMM_INSTANTIATE(double)
WLB4D_COMM_INSTANTIATE(std::int32_t)
WLB4D_COMM_INSTANTIATE(std::int64_t)
WLB4D_COMM_INSTANTIATE(std::uint32_t)
WLB4D_COMM_INSTANTIATE(std::uint64_t)
WLB4D_COMM_INSTANTIATE(char)
WLB4D_COMM_INSTANTIATE(signed char)
WLB4D_COMM_INSTANTIATE(unsigned char)
#undef WLB4D_COMM_INSTANTIATE

}  // namespace wlb::comm
