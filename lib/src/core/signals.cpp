#include "wlb4d/core/signals.hpp"

#include <csignal>

namespace wlb::core {
namespace {
volatile std::sig_atomic_t g_signal = 0;
extern "C" void wlb4d_on_stop(int sig) { g_signal = sig; }
}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = wlb4d_on_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // let blocking calls (MPI progress, I/O) continue
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);  // Ctrl-C: the same graceful stop
}

int stop_signal() { return g_signal; }
void clear_stop_signal() { g_signal = 0; }

}  // namespace wlb::core
