// wlb4d-prep — text corpus (JSONL / .jsonl.xz / .txt / directories) -> HDF5
// token dataset(s) for wlb4d (DESIGN §7, docs/data.md). Runs alone or as
// `mpiexec -n N wlb4d-prep ...`: the ranks share the encoding and rank 0
// writes (prep.hpp). The logic lives in wlb::data (prep.hpp); this is the
// thin driver: MPI start-up, and every message said once, by rank 0 (a
// failure reaches every rank as the same exception, prep.hpp), with the same
// exit status on every rank: 0 ok, 1 data error, 2 bad options.
#include "tool_version.hpp"
#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/version.hpp"
#include "wlb4d/data/prep.hpp"

#include <mpi.h>

#include <cstdio>
#include <exception>

namespace {

int run(int argc, char** argv, int rank) {
  using namespace wlb;
  try {
    data::PrepOptions opts = data::parse_prep_args(argc, argv);  // the same on every rank
    if (opts.version) {
      if (rank == 0) std::printf("%s", tool_version("wlb4d-prep").c_str());
      return 0;
    }
    if (opts.help) {
      if (rank == 0)
        std::printf("wlb4d-prep %s (%s)\n%s", core::kVersion, core::kGitSha, data::prep_help().c_str());
      return 0;
    }
    const comm::Communicator world = comm::Communicator::world();
    data::PrepSummary s = data::run_prep(opts, world);
    if (rank == 0) std::fputs(data::format_summary(s).c_str(), stdout);
    return 0;
  } catch (const core::ConfigError& e) {
    if (rank == 0) std::fprintf(stderr, "wlb4d-prep: error: %s\n", e.what());
    return 2;
  } catch (const core::DataError& e) {
    if (rank == 0) std::fprintf(stderr, "wlb4d-prep: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    if (rank == 0) std::fprintf(stderr, "wlb4d-prep: unexpected error: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);  // only the main thread calls MPI
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int code = run(argc, argv, rank);
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Finalize();
  return code;
}
