#pragma once
/// \file profiling.hpp
/// \brief Named regions for profilers: Kokkos Tools' push/pop region
/// (Kokkos::Profiling::pushRegion / popRegion, the same in Kokkos 3.4 and
/// 4.x). Under kokkos-tools' nvtx-connector
/// (KOKKOS_TOOLS_LIBS=.../libkp_nvtx_connector.so) each region is an NVTX
/// range on the rank's timeline in Nsight Systems; under another tool (e.g.
/// the space-time stack) a node of its region tree. The trainer names its
/// step phases ("wlb4d:plan", "wlb4d:forward_backward", ...) and the
/// pipeline its actions ("wlb4d:F", ...): README "Watching a run".
///
/// Cost without a tool: one call that finds no region callback (the name is
/// not even copied); cheap next to a step's kernels.

#include <Kokkos_Core.hpp>

namespace wlb::core {

/// A region from construction to destruction (scopes nest: regions must).
class ProfileRegion {
 public:
  /// `name` must outlive nothing: it is copied by the tool, if one is loaded.
  explicit ProfileRegion(const char* name) : on_(Kokkos::Profiling::profileLibraryLoaded()) {
    if (on_) Kokkos::Profiling::pushRegion(name);
  }
  ~ProfileRegion() {
    if (on_) Kokkos::Profiling::popRegion();
  }
  ProfileRegion(const ProfileRegion&) = delete;
  ProfileRegion& operator=(const ProfileRegion&) = delete;

 private:
  bool on_;
};

}  // namespace wlb::core
