// Measured memory: Kokkos Tools allocation callbacks, getrusage, /proc/meminfo.
// See memory.hpp.
#include "wlb4d/core/memory.hpp"

#include <Kokkos_Core.hpp>

#include <fmt/format.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <unordered_map>

namespace wlb::core {

namespace {

struct Tracker {
  std::mutex mu;
  std::map<std::string, MemorySpaceUsage> spaces;
  // Sizes of the allocations counted, by address: a free of an allocation
  // made before install (or by another tool) is ignored.
  std::unordered_map<const void*, std::pair<std::string, std::int64_t>> live;
};

Tracker& tracker() {
  static Tracker* t = new Tracker;  // never destroyed: frees may arrive during static destruction
  return *t;
}

std::atomic<bool> g_installed{false};

void wlb_on_allocate(const Kokkos_Profiling_SpaceHandle handle, const char* label, const void* ptr,
                                const uint64_t size) {
  auto& t = tracker();
  const std::lock_guard<std::mutex> lock(t.mu);
  auto& s = t.spaces[handle.name];
  if (s.space.empty()) s.space = handle.name;
  s.current += std::int64_t(size);
  s.peak = std::max(s.peak, s.current);
  ++s.allocations;
  t.live[ptr] = {s.space, std::int64_t(size)};
  static const bool trace = std::getenv("WLB4D_MEMORY_TRACE") != nullptr;  // debugging the memory model
  if (trace) std::fprintf(stderr, "memory: +%llu %s %s (now %lld)\n", (unsigned long long)size, label, handle.name,
                          (long long)s.current);
}

void wlb_on_deallocate(const Kokkos_Profiling_SpaceHandle, const char*, const void* ptr, const uint64_t) {
  auto& t = tracker();
  const std::lock_guard<std::mutex> lock(t.mu);
  const auto it = t.live.find(ptr);
  if (it == t.live.end()) return;
  t.spaces[it->second.first].current -= it->second.second;
  t.live.erase(it);
}

}  // namespace

void install_memory_tracker() {
  if (g_installed.exchange(true)) return;
  Kokkos::Tools::Experimental::set_allocate_data_callback(wlb_on_allocate);
  Kokkos::Tools::Experimental::set_deallocate_data_callback(wlb_on_deallocate);
}

bool memory_tracker_installed() { return g_installed.load(); }

std::vector<MemorySpaceUsage> memory_usage() {
  auto& t = tracker();
  const std::lock_guard<std::mutex> lock(t.mu);
  std::vector<MemorySpaceUsage> out;
  for (const auto& kv : t.spaces) out.push_back(kv.second);
  return out;
}

std::int64_t kokkos_peak_bytes(const std::string& space) {
  std::int64_t p = 0;
  for (const auto& s : memory_usage())
    if (space.empty() || s.space == space) p = std::max(p, s.peak);
  return p;
}

void reset_memory_peak() {
  auto& t = tracker();
  const std::lock_guard<std::mutex> lock(t.mu);
  for (auto& kv : t.spaces) kv.second.peak = kv.second.current;
}

std::int64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return std::int64_t(ru.ru_maxrss) * 1024;  // Linux: KiB
}

namespace {
/// A /proc/meminfo field in bytes ("MemAvailable:", "MemTotal:"), else the
/// sysconf page count `pages_name` times the page size, else -1.
std::int64_t meminfo_bytes(const char* field, int pages_name) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::int64_t value = 0;
  std::string unit;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == field) return value * 1024;  // kB
  }
  const long pages = sysconf(pages_name), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) return std::int64_t(pages) * std::int64_t(page);
  return -1;
}
}  // namespace

std::int64_t available_host_bytes() { return meminfo_bytes("MemAvailable:", _SC_AVPHYS_PAGES); }

std::int64_t total_host_bytes() { return meminfo_bytes("MemTotal:", _SC_PHYS_PAGES); }

std::string format_bytes(double b) {
  const double a = b < 0 ? -b : b;
  if (a >= 1024.0 * 1024 * 1024 * 1024) return fmt::format("{:.2f} TiB", b / (1024.0 * 1024 * 1024 * 1024));
  if (a >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (a >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  if (a >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{:.0f} B", b);
}

}  // namespace wlb::core
