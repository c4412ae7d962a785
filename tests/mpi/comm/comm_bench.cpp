// Yield-vs-block benchmark of wlb::comm::Communicator::allreduce (DESIGN §4).
//
//   mpiexec -n 16 ./comm_bench [iters=200] [bytes=262144] [modes=yield,block]
//
// Runs `iters` in-place float allreduces of `bytes` over MPI_COMM_WORLD for
// each wait mode (after one warm-up call and a barrier) and prints, on rank 0,
// the wall time (max over ranks), the time per call, and the result check.
#include "wlb4d/comm/communicator.hpp"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int iters = argc > 1 ? std::atoi(argv[1]) : 200;
  const long bytes = argc > 2 ? std::atol(argv[2]) : 262144;
  const std::string modes = argc > 3 ? argv[3] : "yield,block";
  int rc = 0;
  try {
    const std::size_t n = static_cast<std::size_t>(bytes) / sizeof(float);
    std::vector<float> buf(n);
    for (const char* name : {"yield", "block"}) {
      if (modes.find(name) == std::string::npos) continue;
      const auto mode = std::string(name) == "yield" ? wlb::comm::WaitMode::Yield : wlb::comm::WaitMode::Block;
      auto c = wlb::comm::Communicator::world(mode);
      std::fill(buf.begin(), buf.end(), 1.0f);
      c.allreduce(buf.data(), n);  // warm-up (connection set-up)
      c.barrier();
      std::fill(buf.begin(), buf.end(), 0.0f);
      const double t0 = MPI_Wtime();
      for (int it = 0; it < iters; ++it) {
        buf[0] = 1.0f;  // after the call buf[0] == size; reset keeps values bounded
        c.allreduce(buf.data(), n);
      }
      double dt = MPI_Wtime() - t0, dt_max = 0;
      MPI_Allreduce(&dt, &dt_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      const bool ok = buf[0] == static_cast<float>(c.size()) && buf[n - 1] == 0.0f;
      if (c.rank() == 0)
        std::printf("comm_bench: %-5s ranks=%d iters=%d bytes=%ld  total %.3f s  per call %.3f ms  check %s\n",
                    name, c.size(), iters, bytes, dt_max, 1e3 * dt_max / iters, ok ? "ok" : "FAILED");
      if (!ok) rc = 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_bench: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
