// Test fault injection (fault.hpp).
#include "wlb4d/core/fault.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace wlb::core {

namespace {
struct Fault {
  bool active = false;
  std::string kind, phase = "step";
  int rank = -1;
  std::int64_t step = -1;
};

Fault parse(const char* text) {
  Fault f;
  if (!text || !*text) return f;
  std::string s(text);
  const auto colon = s.find(':');
  f.kind = s.substr(0, colon);
  std::size_t pos = colon;
  while (pos != std::string::npos) {
    const auto next = s.find(':', pos + 1);
    const std::string kv = s.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
    const auto eq = kv.find('=');
    const std::string k = kv.substr(0, eq), v = eq == std::string::npos ? "" : kv.substr(eq + 1);
    if (k == "rank") f.rank = std::atoi(v.c_str());
    if (k == "step") f.step = std::atoll(v.c_str());
    if (k == "phase") f.phase = v;
    pos = next;
  }
  f.active = f.kind == "stall" && f.rank >= 0 && f.step >= 0;
  if (!f.active) std::fprintf(stderr, "wlb4d: WLB4D_FAULT='%s' is not stall:rank=R:step=S; ignored\n", text);
  return f;
}
}  // namespace

void fault_point(const char* phase, int world_rank, std::int64_t step) {
  static const Fault f = parse(std::getenv("WLB4D_FAULT"));
  if (!f.active || world_rank != f.rank || step != f.step || f.phase != phase) return;
  std::fprintf(stderr, "[r%d] wlb4d: WLB4D_FAULT: stalling at %s %lld\n", world_rank, phase,
               static_cast<long long>(step));
  std::fflush(stderr);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace wlb::core
