// The measured-memory counter (core/memory.hpp): Kokkos allocations counted
// per space against the sizes the test itself allocates.
#include "wlb4d/core/memory.hpp"
#include "wlb4d/core/types.hpp"

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

namespace {
using namespace wlb;

std::int64_t current(const std::string& space) {
  for (const auto& s : core::memory_usage())
    if (s.space == space) return s.current;
  return 0;
}

TEST(MemoryTracker, CountsViewsAndTheirFreesPerSpace) {
  core::install_memory_tracker();
  core::install_memory_tracker();  // idempotent
  ASSERT_TRUE(core::memory_tracker_installed());
  const std::string host = Kokkos::HostSpace::name();
  const std::int64_t before = current(host);
  core::reset_memory_peak();
  {
    Kokkos::View<float*, Kokkos::HostSpace> a("a", 1 << 18);  // 1 MiB
    EXPECT_EQ(current(host) - before, 1 << 20);
    {
      Kokkos::View<double*, Kokkos::HostSpace> b(Kokkos::view_alloc(Kokkos::WithoutInitializing, "b"), 1000);
      EXPECT_EQ(current(host) - before, (1 << 20) + 8000);
      auto m = Kokkos::create_mirror_view(a);  // same space: no allocation
      EXPECT_EQ(current(host) - before, (1 << 20) + 8000);
      Kokkos::View<float*, Kokkos::HostSpace> window(a.data(), 100);  // unmanaged: not counted
      EXPECT_EQ(current(host) - before, (1 << 20) + 8000);
    }
    EXPECT_EQ(current(host) - before, 1 << 20);
  }
  EXPECT_EQ(current(host), before);
  EXPECT_GE(core::kokkos_peak_bytes(host), before + (1 << 20) + 8000);
  EXPECT_GE(core::kokkos_peak_bytes(), core::kokkos_peak_bytes(host));
  core::reset_memory_peak();
  EXPECT_EQ(core::kokkos_peak_bytes(host), before);
}

TEST(MemoryTracker, HostFigures) {
  EXPECT_GT(core::peak_rss_bytes(), 0);
  EXPECT_GT(core::available_host_bytes(), 0);
  EXPECT_EQ(core::format_bytes(17), "17 B");
  EXPECT_EQ(core::format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(core::format_bytes(3.0 * 1024 * 1024 * 1024), "3.00 GiB");
}

}  // namespace
