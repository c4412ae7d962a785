// Test fault injection (fault.hpp).
#include "wlb4d/core/fault.hpp"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <unistd.h>

namespace wlb::core {

namespace {
const char* const kForms =
    "expected stall:rank=R:step=S[:phase=step|forward|backward|ckpt_load|ckpt_save][:signal=STOP], "
    "crash:rank=R:step=S[:phase=…][:signal=KILL|ABRT|SEGV], delay:rank=R:phase=P:seconds=N|ms=N[:step=S], "
    "ckpt_write:rank=R:after_bytes=N, ckpt_free:bytes=N, calib_load:sample=K:percent=P, spike:step=S:scale=X or "
    "prep_encode:rank=R:batch=K";

[[noreturn]] void bad(const std::string& text, const std::string& why) {
  throw std::invalid_argument("WLB4D_FAULT='" + text + "': " + why + "; " + kForms);
}

long long to_count(const std::string& text, const std::string& key, const std::string& v) {
  std::size_t used = 0;
  long long x = -1;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v.empty() || used != v.size() || x < 0) bad(text, key + "='" + v + "' is not a non-negative integer");
  return x;
}

struct State {
  FaultSpec spec;
  int rank = -1;
  std::int64_t step = -1;
};

State& state() {
  static State s = [] {
    State st;
    st.spec = parse_fault(std::getenv("WLB4D_FAULT") ? std::getenv("WLB4D_FAULT") : "");
    return st;
  }();
  return s;
}

void fire(const FaultSpec& f, const char* phase, int rank, std::int64_t step) {
  const char* what = f.kind == "crash" ? "crashing" : f.kind == "delay" ? "delaying" : "stalling";
  if (step >= 0)
    std::fprintf(stderr, "[r%d] wlb4d: WLB4D_FAULT: %s at step %lld (fault point %s), pid %d\n", rank, what,
                 static_cast<long long>(step), phase, int(::getpid()));
  else
    std::fprintf(stderr, "[r%d] wlb4d: WLB4D_FAULT: %s at fault point %s, pid %d\n", rank, what, phase,
                 int(::getpid()));
  std::fflush(stderr);
  if (f.kind == "delay") {
    // sleep_for resumes after a signal (EINTR): the delay is the whole time.
    if (f.ms >= 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(f.ms));
    else
      std::this_thread::sleep_for(std::chrono::seconds(f.seconds));
    return;
  }
  if (f.kind == "crash") {
    // Not std::abort's handlers or exit's atexit: the process vanishes the
    // way a lost node does (SIGKILL cannot be caught; ABRT/SEGV default).
    std::signal(f.signal, SIG_DFL);
    ::kill(::getpid(), f.signal);
    _exit(128 + f.signal);
  }
  // signal=STOP: the process really stops, its threads (the phase deadline's
  // included) with it, as under `kill -STOP`; continued, it stalls on.
  if (f.signal == SIGSTOP) ::kill(::getpid(), SIGSTOP);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}
}  // namespace

FaultSpec parse_fault(const std::string& text) {
  FaultSpec f;
  if (text.empty()) return f;
  const auto colon = text.find(':');
  f.kind = text.substr(0, colon);
  if (f.kind != "stall" && f.kind != "crash" && f.kind != "delay" && f.kind != "ckpt_write" && f.kind != "ckpt_free" &&
      f.kind != "calib_load" && f.kind != "spike" && f.kind != "prep_encode")
    bad(text, "unknown kind '" + f.kind + "'");
  std::size_t pos = colon;
  while (pos != std::string::npos) {
    const auto next = text.find(':', pos + 1);
    const std::string kv = text.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
    const auto eq = kv.find('=');
    if (eq == std::string::npos) bad(text, "'" + kv + "' is not key=value");
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    const bool step_kind = f.kind == "stall" || f.kind == "crash" || f.kind == "delay";
    if (k == "rank" && f.kind != "ckpt_free" && f.kind != "calib_load" && f.kind != "spike") {
      f.rank = int(to_count(text, k, v));
    } else if (k == "step" && (step_kind || f.kind == "spike")) {
      f.step = to_count(text, k, v);
    } else if (k == "phase" && step_kind) {
      if (v != "step" && v != "forward" && v != "backward" && v != "calibrate" && v != "ckpt_load" &&
          v != "ckpt_save")
        bad(text, "phase='" + v + "' is not step, forward, backward, calibrate, ckpt_load or ckpt_save");
      f.phase = v;
    } else if (k == "signal" && f.kind == "stall") {
      if (v != "STOP") bad(text, "signal='" + v + "' is not STOP (the only signal of a stall)");
      f.signal = SIGSTOP;
    } else if (k == "signal" && f.kind == "crash") {
      if (v == "KILL") f.signal = SIGKILL;
      else if (v == "ABRT") f.signal = SIGABRT;
      else if (v == "SEGV") f.signal = SIGSEGV;
      else bad(text, "signal='" + v + "' is not KILL, ABRT or SEGV");
    } else if (k == "seconds" && f.kind == "delay") {
      f.seconds = to_count(text, k, v);
    } else if (k == "ms" && f.kind == "delay") {
      f.ms = to_count(text, k, v);
    } else if (k == "scale" && f.kind == "spike") {
      f.scale = to_count(text, k, v);
    } else if (k == "after_bytes" && f.kind == "ckpt_write") {
      f.after_bytes = to_count(text, k, v);
    } else if (k == "bytes" && f.kind == "ckpt_free") {
      f.free_bytes = to_count(text, k, v);
    } else if (k == "sample" && f.kind == "calib_load") {
      f.sample = to_count(text, k, v);
    } else if (k == "percent" && f.kind == "calib_load") {
      f.percent = to_count(text, k, v);
    } else if (k == "batch" && f.kind == "prep_encode") {
      f.batch = to_count(text, k, v);
    } else {
      bad(text, "'" + k + "' is not a field of " + f.kind);
    }
    pos = next;
  }
  if (f.kind != "ckpt_free" && f.kind != "calib_load" && f.kind != "spike" && f.rank < 0)
    bad(text, f.kind + " needs rank=R");
  if (f.kind == "spike" && (f.step < 0 || f.scale < 1)) bad(text, "spike needs step=S and scale=X (X >= 1)");
  if (f.kind == "calib_load" && (f.sample < 0 || f.percent < 0))
    bad(text, "calib_load needs sample=K and percent=P");
  // ckpt_load and calibrate happen once per start, outside any step.
  const bool once = f.phase == "ckpt_load" || f.phase == "calibrate";
  if ((f.kind == "stall" || f.kind == "crash") && f.step < 0 && !once)
    bad(text, f.kind + " needs step=S (except at phase ckpt_load or calibrate)");
  if (f.kind == "delay" && f.seconds < 0 && f.ms < 0) bad(text, "delay needs seconds=N (or ms=N)");
  if (f.kind == "delay" && f.seconds >= 0 && f.ms >= 0) bad(text, "delay takes seconds=N or ms=N, not both");
  if (f.kind == "ckpt_write" && f.after_bytes < 0) bad(text, "ckpt_write needs after_bytes=N");
  if (f.kind == "ckpt_free" && f.free_bytes < 0) bad(text, "ckpt_free needs bytes=N");
  if (f.kind == "prep_encode" && f.batch < 0) bad(text, "prep_encode needs batch=K");
  return f;
}

void check_fault_env() { (void)state(); }

static bool matches(const FaultSpec& f, const char* phase, int rank, std::int64_t step) {
  return (f.kind == "stall" || f.kind == "crash" || f.kind == "delay") && rank == f.rank &&
         (f.step < 0 || step == f.step) && f.phase == phase;
}

void fault_point(const char* phase, int world_rank, std::int64_t step) {
  State& s = state();
  if (std::string(phase) == "step") {
    s.rank = world_rank;
    s.step = step;
  }
  if (matches(s.spec, phase, world_rank, step)) fire(s.spec, phase, world_rank, step);
}

void fault_point(const char* phase) {
  State& s = state();
  if (matches(s.spec, phase, s.rank, s.step)) fire(s.spec, phase, s.rank, s.step);
}

bool fault_write_fails(int world_rank, std::uint64_t bytes_after) {
  const FaultSpec& f = state().spec;
  return f.kind == "ckpt_write" && world_rank == f.rank && bytes_after > std::uint64_t(f.after_bytes);
}

long long fault_free_bytes() {
  const FaultSpec& f = state().spec;
  return f.kind == "ckpt_free" ? f.free_bytes : -1;
}

double fault_loss_scale(std::int64_t step) {
  const FaultSpec& f = state().spec;
  return f.kind == "spike" && step == f.step ? double(f.scale) : 1.0;
}

bool fault_prep_encode_fails(int world_rank, long long batch) {
  const FaultSpec& f = state().spec;
  return f.kind == "prep_encode" && world_rank == f.rank && batch == f.batch;
}

double fault_calibration_scale(long long sample) {
  const FaultSpec& f = state().spec;
  return f.kind == "calib_load" && sample == f.sample ? double(f.percent) / 100.0 : 1.0;
}

}  // namespace wlb::core
