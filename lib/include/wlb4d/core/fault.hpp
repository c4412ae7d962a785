#pragma once
/// \file fault.hpp
/// \brief Deterministic fault injection for tests (not a deck key): the
/// environment variable WLB4D_FAULT names one fault, so crash, stall and
/// timeout tests do not race a poller that sends signals.
///
///   WLB4D_FAULT=stall:rank=R:step=S   world rank R stops making progress (it
///                                     sleeps, as under SIGSTOP) when it
///                                     reaches fault point "step" at step S
///                                     (0-based).
///   WLB4D_FAULT=ckpt_write:rank=R:after_bytes=N
///                                     checkpoint writes of world rank R fail
///                                     as on a full disk (ENOSPC) once the
///                                     tensor bytes it has written in this
///                                     process would exceed N; deterministic
///                                     mid-write "no space left on device".
///
/// A malformed value is reported once on stderr and ignored. Unset (the
/// normal case) costs one getenv at the first call.

#include <cstdint>

namespace wlb::core {

/// Called by the trainer at the start of every step (`phase` "step").
void fault_point(const char* phase, int world_rank, std::int64_t step);

/// True when WLB4D_FAULT=ckpt_write:rank=R:after_bytes=N names this rank and
/// `bytes_after` (its checkpoint tensor bytes in this process, including the
/// write about to be made) exceeds N: the caller then fails that write with
/// ENOSPC's message.
bool fault_write_fails(int world_rank, std::uint64_t bytes_after);

}  // namespace wlb::core
