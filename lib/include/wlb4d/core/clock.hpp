#pragma once
/// \file clock.hpp
/// \brief Wall and CPU clocks used by the timing log (seconds, double).
///
/// Wall time measures what a user waits for; CPU time measures the work a
/// rank did. On an oversubscribed node (more ranks than cores, e.g. 8 ranks
/// on 2 cores) wall time per rank is mostly time-slicing, while CPU time of
/// the process still reflects the rank's own work — which is what the
/// balancer's measured imbalance (max/mean compute over ranks) must compare.

#include <chrono>
#include <ctime>

namespace wlb::core {

/// Monotonic wall clock (seconds since an arbitrary epoch).
inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// An interval of wall_seconds() (start, end): one collective of a traced
/// step (model::TpRegion, model::CpKvExchange span logs, log.trace_step).
struct TimeSpan {
  double t0 = 0, t1 = 0;
};

/// CPU time of the whole process, all threads, user + system (seconds).
/// Counts BLAS/OpenMP worker threads too; idle-spinning pools inflate it.
inline double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace wlb::core
