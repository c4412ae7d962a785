#pragma once
/// \file memory.hpp
/// \brief Measured memory of this rank: the high-water mark of Kokkos
/// allocations per memory space (Kokkos Tools allocate/deallocate callbacks,
/// `Kokkos::Tools::Experimental::set_allocate_data_callback`, present in
/// Kokkos 3.4 and 4.x; the same counter sees CUDA device memory), the peak
/// resident set (getrusage), and the memory the host can still give
/// (/proc/meminfo MemAvailable).
///
/// Units: bytes (std::int64_t). The Kokkos figures count the bytes each View
/// asked for (Kokkos' own allocation header not included), managed Views
/// only; unmanaged windows and std::vector are not Kokkos allocations.
/// The pipeline memory model (pipeline/memory_model.hpp) predicts the same
/// quantity, so the two are comparable term by term. With the environment
/// variable WLB4D_MEMORY_TRACE set, every counted allocation is printed to
/// stderr (bytes, View label, space, running total): the way to find the
/// allocation a term misses.

#include <cstdint>
#include <string>
#include <vector>

namespace wlb::core {

/// One memory space as the Kokkos Tools interface names it ("Host", "Cuda",
/// "CudaHostPinned", ...).
struct MemorySpaceUsage {
  std::string space;
  std::int64_t current = 0;      ///< bytes allocated now
  std::int64_t peak = 0;         ///< high-water mark of `current` since install or reset_memory_peak()
  std::int64_t allocations = 0;  ///< allocations counted
};

/// Installs the allocation callbacks (after Kokkos::initialize; idempotent).
/// Allocations made before it are not counted (their frees are ignored).
/// Replaces any callbacks a KOKKOS_TOOLS_LIBS tool set for allocations.
void install_memory_tracker();
bool memory_tracker_installed();

/// Every space seen so far (thread-safe snapshot).
std::vector<MemorySpaceUsage> memory_usage();

/// Peak bytes of Kokkos allocations in the space named `space`; "" = the
/// largest peak over all spaces (the device space on a CUDA build, HostSpace
/// on a host build). 0 if nothing was counted.
std::int64_t kokkos_peak_bytes(const std::string& space = "");

/// Sets every space's peak to its current bytes (e.g. after start-up probes).
void reset_memory_peak();

/// Peak resident set size of this process (getrusage ru_maxrss), bytes.
std::int64_t peak_rss_bytes();

/// MemAvailable of /proc/meminfo (bytes); where it cannot be read,
/// sysconf(_SC_AVPHYS_PAGES)·page size; -1 if neither is known.
std::int64_t available_host_bytes();

/// MemTotal of /proc/meminfo (bytes); where it cannot be read,
/// sysconf(_SC_PHYS_PAGES)·page size; -1 if neither is known.
std::int64_t total_host_bytes();

/// "1.23 GiB", "456.7 MiB", "12.0 KiB", "17 B" (binary prefixes).
std::string format_bytes(double bytes);

}  // namespace wlb::core
