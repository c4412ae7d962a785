// Phase deadline (phase_watch.hpp): a thread that ends the job when a phase
// outside wlb::comm's waits (checkpoint I/O) makes no progress.
#include "wlb4d/comm/phase_watch.hpp"

#include "wlb4d/core/clock.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/mpi_main.hpp"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <new>
#include <sstream>
#include <thread>

#include <signal.h>
#include <unistd.h>

namespace wlb::comm {

namespace {

/// One rank's entry on the node-shared board. Lock-free atomics work across
/// processes; the text fields are written before the release store of
/// `since` and only ever shown in a message (a torn read is cosmetic).
struct Slot {
  std::atomic<std::int64_t> pid{0};
  std::atomic<std::int64_t> start_time{0};  // /proc/<pid>/stat field 22: tells a reused pid apart
  std::atomic<std::int64_t> world_rank{-1};
  std::atomic<std::int64_t> seq{0};         // phases entered so far (the same sequence on every rank)
  std::atomic<std::int64_t> inside{0};      // 1 while in phase `seq`
  std::atomic<double> since{0};             // wall time of the last progress
  char label[160] = {0};
};

struct Watch {
  bool init = false;
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Win win = MPI_WIN_NULL;
  Slot* slots = nullptr;
  int local = 0, nlocal = 0, world_size = 1, world_rank = 0;
  std::thread thread;
  std::mutex m;
  std::condition_variable cv;
  bool stop = false;
  // The current phase (under m).
  bool armed = false;
  std::string phase, target;
  double last = 0;
  std::int64_t seq = 0;
  std::function<std::string()> on_timeout;
};

Watch& watch() {
  static Watch* w = new Watch;  // leaked on purpose: the thread may outlive static destruction
  return *w;
}

/// /proc/<pid>/stat: state letter and start time (field 22); false if gone.
bool proc_stat(std::int64_t pid, char* state, std::int64_t* start) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!in || !std::getline(in, text)) return false;
  const auto close = text.rfind(')');  // the command name may hold spaces and ')'
  if (close == std::string::npos) return false;
  std::istringstream rest(text.substr(close + 1));
  std::string field;
  rest >> field;
  *state = field.empty() ? '?' : field[0];
  for (int i = 4; i <= 22 && rest >> field; ++i)
    if (i == 22) *start = std::stoll(field);
  return true;
}

/// The peer in slot i is still the rank registered there (not a reused pid).
bool same_process(const Slot& s, char* state) {
  std::int64_t start = -1;
  return s.pid.load() > 0 && proc_stat(s.pid.load(), state, &start) && start == s.start_time.load();
}

void copy_label(char* dst, std::size_t n, const std::string& src) {
  const std::size_t k = std::min(n - 1, src.size());
  std::memcpy(dst, src.data(), k);
  dst[k] = 0;
}

[[noreturn]] void fire(Watch& w, double timeout) {
  const double now = core::wall_seconds();
  std::string msg = fmt::format("{} of {}: no progress for {:.0f} s (comm.timeout_s={:g}); this rank (world rank {}) "
                                "last reported: {}",
                                w.phase, w.target, now - w.last, timeout, w.world_rank,
                                w.slots ? w.slots[w.local].label : "?");
  std::string behind;
  for (int i = 0; i < w.nlocal; ++i) {
    if (i == w.local) continue;
    const Slot& s = w.slots[i];
    char state = '?';
    const bool alive = same_process(s, &state);
    const bool stopped = alive && (state == 'T' || state == 't');
    const std::int64_t seq = s.seq.load(std::memory_order_acquire);
    const bool inside = s.inside.load(std::memory_order_acquire) != 0;
    if (seq > w.seq || (seq == w.seq && !inside)) continue;  // finished this phase
    char label[sizeof s.label];
    std::memcpy(label, s.label, sizeof label);
    label[sizeof label - 1] = 0;
    const std::string who = fmt::format("world rank {} (pid {}{})", s.world_rank.load(), s.pid.load(),
                                        !alive ? ", gone" : stopped ? ", stopped: SIGSTOP or a debugger" : "");
    behind += (behind.empty() ? "" : "; ") +
              (seq < w.seq ? who + " has not reached the " + w.phase
                           : fmt::format("{} last reported: {} ({:.0f} s ago)", who, label, now - s.since.load()));
  }
  msg += behind.empty() ? "; every other rank of this host has finished the " + w.phase
                        : "; not finished: " + behind;
  if (w.world_size > w.nlocal)
    msg += fmt::format(" ({} rank(s) on other hosts are not visible from here)", w.world_size - w.nlocal);
  std::string note;
  if (w.on_timeout) {
    try {
      note = w.on_timeout();
    } catch (...) {
    }
  }
  // Said before the SIGKILL: the process manager ends this rank too as soon
  // as it sees the stopped one die, possibly before a later print.
  const std::string stopped = stopped_peers();
  msg += "; ending the job";
  if (!stopped.empty()) msg += " (SIGKILL sent to the stopped " + stopped + ")";
  if (!note.empty()) msg += "; " + note;
  std::fprintf(stderr, "[r%d] wlb4d: error: %s\n", w.world_rank, msg.c_str());
  // The process manager ends this rank as soon as it sees the stopped one
  // die, and drops what it has not yet read from this rank's pipes: let it
  // read the message first.
  core::wait_output_forwarded(2.0);
  end_stopped_peers();
  // MPI_THREAD_FUNNELED: the main thread is blocked inside MPI (that is why
  // we are here); MPI_Abort only tells the process manager to end the job.
  MPI_Abort(MPI_COMM_WORLD, 1);
  _exit(1);
}

void run(Watch& w) {
  std::unique_lock<std::mutex> lk(w.m);
  while (!w.stop) {
    w.cv.wait_for(lk, std::chrono::milliseconds(200));
    if (w.stop) break;
    const double timeout = wait_timeout();
    if (w.armed && timeout > 0 && core::wall_seconds() - w.last > timeout) fire(w, timeout);
  }
}

/// MPI_COMM_SELF's attribute is deleted first thing in MPI_Finalize: stop
/// the thread and free the board while MPI is alive.
int on_finalize(MPI_Comm, int, void*, void*) {
  Watch& w = watch();
  {
    std::lock_guard<std::mutex> lk(w.m);
    w.stop = true;
  }
  w.cv.notify_all();
  if (w.thread.joinable()) w.thread.join();
  if (w.win != MPI_WIN_NULL) MPI_Win_free(&w.win);
  if (w.node != MPI_COMM_NULL) MPI_Comm_free(&w.node);
  w.slots = nullptr;
  w.init = false;
  return MPI_SUCCESS;
}

void before_abort() {
  const std::string stopped = stopped_peers();  // said first, as in fire()
  if (stopped.empty()) return;
  std::fprintf(stderr, "[r%d] wlb4d: sending SIGKILL to the stopped %s of this host (a stopped process never handles "
                       "the abort's SIGTERM and would outlive the job)\n",
               watch().world_rank, stopped.c_str());
  core::wait_output_forwarded(2.0);
  end_stopped_peers();
}

}  // namespace

void init_phase_watch(const Communicator& world) {
  Watch& w = watch();
  if (w.init) return;
  world.barrier();  // polite: the blocking calls below then complete at once
  w.world_size = world.size();
  w.world_rank = world.rank();
  // Every rank takes part in both calls, so their outcome is the same on a
  // host; without a shared board (an MPI that cannot) each rank sees only
  // itself: the deadline still ends the job, naming this rank alone.
  void* base = nullptr;
  bool shared = MPI_Comm_split_type(world.mpi(), MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL, &w.node) ==
                MPI_SUCCESS;
  if (shared) {
    MPI_Comm_set_errhandler(w.node, MPI_ERRORS_RETURN);
    MPI_Comm_rank(w.node, &w.local);
    MPI_Comm_size(w.node, &w.nlocal);
    const MPI_Aint bytes = w.local == 0 ? MPI_Aint(sizeof(Slot)) * w.nlocal : 0;
    shared = MPI_Win_allocate_shared(bytes, int(sizeof(Slot)), MPI_INFO_NULL, w.node, &base, &w.win) == MPI_SUCCESS;
  }
  if (shared) {
    MPI_Aint size = 0;
    int disp = 0;
    MPI_Win_shared_query(w.win, 0, &size, &disp, &base);
    w.slots = static_cast<Slot*>(base);
  } else {
    if (w.node != MPI_COMM_NULL) MPI_Comm_free(&w.node);
    w.local = 0;
    w.nlocal = 1;
    w.slots = static_cast<Slot*>(::operator new(sizeof(Slot)));  // leaked with the Watch
  }
  Communicator node(shared ? w.node : MPI_COMM_SELF);
  node.set_name("host");
  if (w.local == 0)
    for (int i = 0; i < w.nlocal; ++i) new (&w.slots[i]) Slot();
  node.barrier();
  Slot& me = w.slots[w.local];
  char state = '?';
  std::int64_t start = -1;
  proc_stat(::getpid(), &state, &start);
  me.start_time.store(start);
  me.world_rank.store(world.rank());
  me.pid.store(::getpid(), std::memory_order_release);
  node.barrier();
  int key = MPI_KEYVAL_INVALID;
  MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, on_finalize, &key, nullptr);
  MPI_Comm_set_attr(MPI_COMM_SELF, key, nullptr);
  core::set_before_abort(before_abort);
  w.init = true;
  w.thread = std::thread([&w] { run(w); });
}

namespace {
/// The stopped ranks of this host ("world rank R (pid P)", comma separated);
/// with `kill`, each is sent SIGKILL and listed only if that succeeded.
std::string visit_stopped_peers(bool kill) {
  Watch& w = watch();
  std::string out;
  if (!w.slots) return out;
  for (int i = 0; i < w.nlocal; ++i) {
    if (i == w.local) continue;
    const Slot& s = w.slots[i];
    char state = '?';
    if (!same_process(s, &state) || (state != 'T' && state != 't')) continue;
    if (!kill || ::kill(pid_t(s.pid.load()), SIGKILL) == 0)
      out += fmt::format("{}world rank {} (pid {})", out.empty() ? "" : ", ", s.world_rank.load(), s.pid.load());
  }
  return out;
}
}  // namespace

std::string stopped_peers() { return visit_stopped_peers(false); }
std::string end_stopped_peers() { return visit_stopped_peers(true); }

PhaseWatch::PhaseWatch(const char* phase, std::string target, std::function<std::string()> on_timeout) {
  Watch& w = watch();
  if (!w.init) return;
  std::lock_guard<std::mutex> lk(w.m);
  w.phase = phase;
  w.target = std::move(target);
  w.on_timeout = std::move(on_timeout);
  w.last = core::wall_seconds();
  ++w.seq;
  Slot& s = w.slots[w.local];
  copy_label(s.label, sizeof s.label, "starting the " + w.phase);
  s.since.store(w.last);
  s.inside.store(1);
  s.seq.store(w.seq, std::memory_order_release);
  w.armed = true;
}

PhaseWatch::~PhaseWatch() {
  Watch& w = watch();
  if (!w.init) return;
  std::lock_guard<std::mutex> lk(w.m);
  w.armed = false;
  w.on_timeout = {};
  w.slots[w.local].inside.store(0, std::memory_order_release);
}

void phase_progress(const std::string& what) {
  Watch& w = watch();
  if (!w.init) return;
  std::lock_guard<std::mutex> lk(w.m);
  if (!w.armed) return;
  w.last = core::wall_seconds();
  Slot& s = w.slots[w.local];
  copy_label(s.label, sizeof s.label, what);
  s.since.store(w.last, std::memory_order_release);
}

}  // namespace wlb::comm
