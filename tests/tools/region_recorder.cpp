// A minimal Kokkos Tools library (the tool interface of Kokkos 3.x and 4.x:
// extern "C" kokkosp_* entry points found by dlsym, loaded through
// KOKKOS_TOOLS_LIBS or, on Kokkos 3, KOKKOS_PROFILE_LIBRARY). It stands in
// for kokkos-tools' nvtx-connector, which turns the same push/pop calls into
// NVTX ranges, where no GPU and no Nsight Systems are at hand: each region
// whose name starts with "wlb4d:" is written, one line per push, as the path
// of the wlb4d regions open around it ("wlb4d:step/wlb4d:plan"), to the file
// $WLB4D_REGION_LOG.<pid>. Unbalanced pops are written as "UNBALANCED".
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <unistd.h>

namespace {
std::vector<std::string> g_stack;  // every open region, tools' and libraries' too
std::FILE* g_out = nullptr;

std::string wlb4d_path() {
  std::string p;
  for (const auto& n : g_stack)
    if (n.rfind("wlb4d:", 0) == 0) p += (p.empty() ? "" : "/") + n;
  return p;
}
}  // namespace

extern "C" void kokkosp_init_library(const int, const std::uint64_t, const std::uint32_t, void*) {
  const char* base = std::getenv("WLB4D_REGION_LOG");
  if (base) g_out = std::fopen((std::string(base) + "." + std::to_string(::getpid())).c_str(), "w");
}

extern "C" void kokkosp_finalize_library() {
  if (!g_out) return;
  if (!g_stack.empty()) std::fprintf(g_out, "UNBALANCED %zu regions still open\n", g_stack.size());
  std::fclose(g_out);
  g_out = nullptr;
}

extern "C" void kokkosp_push_profile_region(const char* name) {
  g_stack.emplace_back(name);
  if (g_out && g_stack.back().rfind("wlb4d:", 0) == 0) std::fprintf(g_out, "%s\n", wlb4d_path().c_str());
}

extern "C" void kokkosp_pop_profile_region() {
  if (g_stack.empty()) {
    if (g_out) std::fprintf(g_out, "UNBALANCED pop\n");
    return;
  }
  g_stack.pop_back();
}
