#include "wlb4d/core/mpi_main.hpp"

#include "wlb4d/core/error.hpp"

#include <Kokkos_Core.hpp>

#include "wlb4d/core/memory.hpp"
#include <mpi.h>

#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <vector>

namespace wlb::core {

namespace {
std::atomic<void (*)()> g_before_abort{nullptr};
// The program's name for messages ("wlb4d-plan: error: ..."): argv[0]'s file name.
std::string g_program = "wlb4d";
}  // namespace

void set_before_abort(void (*fn)()) { g_before_abort.store(fn); }
void run_before_abort() {
  if (auto fn = g_before_abort.load()) fn();
}

void wait_output_forwarded(double max_seconds) {
  std::fflush(stdout);
  std::fflush(stderr);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(max_seconds);
  for (const int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat st{};
    if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) continue;
    int pending = 0;
    while (ioctl(fd, FIONREAD, &pending) == 0 && pending > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

namespace {
int g_thread_provided = MPI_THREAD_SINGLE;
// FNV-1a: the deck error's text, compared over ranks without sending it.
std::uint64_t text_hash(const char* s) {
  std::uint64_t h = 1469598103934665603ull;
  for (; *s; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 1099511628211ull;
  return h;
}

/// True when every rank of comm reaches this call within 3 s (each after an
/// error of its own); false when one does not (it still runs, or waits in a
/// collective, so the job must be aborted).
bool every_rank_failed(MPI_Comm comm) {
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Ibarrier(comm, &req);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  int done = 0;
  while (!done) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

/// Says an error once: true when every rank of comm failed with the same
/// text within 5 s (the lowest rank, 0, has printed it as "KIND: text"),
/// false when they differ or a rank did not arrive (the caller prints its
/// own and aborts).
bool said_once(MPI_Comm comm, int rank, const char* kind, const char* what) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  if (size == 1) {
    std::fprintf(stderr, "[r%d] %s: %s: %s\n", rank, g_program.c_str(), kind, what);
    return true;
  }
  // {min hash, -max hash} over ranks: equal texts everywhere iff min = max.
  const auto h = static_cast<long long>(text_hash(what) >> 1);
  long long in[2] = {h, -h}, out[2] = {0, 0};
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Iallreduce(in, out, 2, MPI_LONG_LONG, MPI_MIN, comm, &req);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int done = 0;
  while (!done) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) break;
    if (std::chrono::steady_clock::now() > deadline) return false;  // a rank did not fail: abort
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (out[0] != -out[1]) return false;  // the ranks differ: each says its own
  if (rank == 0) std::fprintf(stderr, "[r0] %s: %s: %s\n", g_program.c_str(), kind, what);
  return true;
}
}  // namespace


bool mpi_thread_multiple() { return g_thread_provided == MPI_THREAD_MULTIPLE; }

const char* mpi_thread_level_name() {
  switch (g_thread_provided) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown MPI thread level";
  }
}

int mpi_main(int argc, char** argv, const std::function<int(int, char**)>& body) {
  if (argc > 0 && argv[0] && *argv[0]) {
    g_program = argv[0];
    if (const auto slash = g_program.rfind('/'); slash != std::string::npos) g_program.erase(0, slash + 1);
  }
  int provided = 0;
  // MULTIPLE for the asynchronous checkpoint writer (checkpoint.async); the
  // trainer falls back to synchronous saves where it is not provided.
  const char* want = std::getenv("WLB4D_MPI_THREADS");
  const bool funneled = want && std::strcmp(want, "funneled") == 0;
  MPI_Init_thread(&argc, &argv, funneled ? MPI_THREAD_FUNNELED : MPI_THREAD_MULTIPLE, &provided);
  g_thread_provided = provided;
  const int rank = world_rank();
  int code = 0;
  bool abort_job = false;
  // A communicator of its own for the end-of-run agreement on a deck error
  // (below): ranks that did not fail may be inside a collective of the
  // world communicator, and a second collective there would be erroneous.
  MPI_Comm agree_comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &agree_comm);
  // Kokkos prints its own help for --help: keep --help/-h from it (ours comes
  // first; Kokkos' help is under --kokkos-help, which prints it and exits 0).
  bool our_help = false, kokkos_help = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h"))) {
      our_help = true;
      continue;
    }
    kokkos_help = kokkos_help || (i > 0 && !std::strcmp(argv[i], "--kokkos-help"));
    args.push_back(argv[i]);
  }
  int kargc = static_cast<int>(args.size());
  args.push_back(nullptr);
  Kokkos::initialize(kargc, args.data());  // removes the --kokkos-* flags it knows
  install_memory_tracker();  // the measured peak (memory.hpp) counts from here
  args.resize(static_cast<std::size_t>(kargc));
  if (our_help) args.push_back(const_cast<char*>("--help"));
  const int body_argc = static_cast<int>(args.size());
  args.push_back(nullptr);
  try {
    if (!kokkos_help) code = body(body_argc, args.data());
  } catch (const InternalError& e) {
    std::fprintf(stderr, "[r%d] %s: internal error (a bug in wlb4d, please report it): %s\n", rank, g_program.c_str(), e.what());
    code = 3;
    abort_job = true;
  } catch (const std::exception& e) {
    // Bad input that every rank meets the same way (a deck error, a missing
    // dataset or checkpoint, a world-size mismatch) is said once, by the
    // lowest rank, when every rank agrees on the text within a bounded wait;
    // the ranks then finalize together and exit with the code (2 for a deck
    // error, 1 otherwise). Otherwise each rank says its own and the job is
    // ended below (a rank that did not fail would wait forever for the others).
    const bool deck = dynamic_cast<const ConfigError*>(&e) != nullptr;
    code = deck ? 2 : 1;
    const char* kind = deck ? "deck error" : "error";
    if (!said_once(agree_comm, rank, kind, e.what())) {
      std::fprintf(stderr, "[r%d] %s: %s: %s\n", rank, g_program.c_str(), kind, e.what());
      abort_job = world_size() > 1;
    }
  }
  std::fflush(stderr);
  std::fflush(stdout);
  if (abort_job && world_size() > 1) {
    // The messages reach mpiexec before the job is torn down.
    wait_output_forwarded(2.0);
    // Every rank failed (a bad dataset, a full disk: each has said why):
    // none waits in a collective, so each ends alone with the code, and
    // mpiexec ends the job without MPI_Abort's banner under our messages.
    if (every_rank_failed(agree_comm)) std::_Exit(code);
    // Give ranks that fail the same way a moment to print their own message
    // before the abort tears the job down.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    run_before_abort();  // e.g. a stopped rank of this host, which the abort's SIGTERM would not end
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  MPI_Comm_free(&agree_comm);
  Kokkos::finalize();
  MPI_Finalize();
  return code;
}

}  // namespace wlb::core
