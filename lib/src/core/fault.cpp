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
  long long after_bytes = -1;
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
    if (k == "after_bytes") f.after_bytes = std::atoll(v.c_str());
    pos = next;
  }
  f.active = (f.kind == "stall" && f.rank >= 0 && f.step >= 0) ||
             (f.kind == "ckpt_write" && f.rank >= 0 && f.after_bytes >= 0);
  if (!f.active)
    std::fprintf(stderr,
                 "wlb4d: WLB4D_FAULT='%s' is not stall:rank=R:step=S or ckpt_write:rank=R:after_bytes=N; ignored\n",
                 text);
  return f;
}

const Fault& fault() {
  static const Fault f = parse(std::getenv("WLB4D_FAULT"));
  return f;
}
}  // namespace

void fault_point(const char* phase, int world_rank, std::int64_t step) {
  const Fault& f = fault();
  if (!f.active || f.kind != "stall" || world_rank != f.rank || step != f.step || f.phase != phase) return;
  std::fprintf(stderr, "[r%d] wlb4d: WLB4D_FAULT: stalling at %s %lld\n", world_rank, phase,
               static_cast<long long>(step));
  std::fflush(stderr);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

bool fault_write_fails(int world_rank, std::uint64_t bytes_after) {
  const Fault& f = fault();
  return f.active && f.kind == "ckpt_write" && world_rank == f.rank && bytes_after > std::uint64_t(f.after_bytes);
}

}  // namespace wlb::core
