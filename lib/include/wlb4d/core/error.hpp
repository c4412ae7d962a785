#pragma once
/// \file error.hpp
/// \brief Exception types. Every message names the offending key, file or
/// tensor and the rule it broke, so a user can fix the input without reading
/// source (DESIGN §3 "failure is loud and collective").

#include <stdexcept>
#include <string>

namespace wlb::core {

/// A deck key is unknown, malformed, out of range, or breaks a cross-key rule.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A dataset/corpus file is missing, truncated or has the wrong schema.
struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A checkpoint is missing, corrupt (checksum) or does not match the deck.
struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A numerical failure (NaN/inf in loss or gradients) naming step and tensor.
struct NumericsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A communication-layer failure (MPI/NCCL error code translated to text).
struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// An internal invariant of wlb4d failed (a bug, not bad input): a schedule
/// whose action lists disagree, a buffer used before it was filled. Printed
/// as an internal error, never as a deck error.
struct InternalError : std::logic_error {
  using std::logic_error::logic_error;
};

}  // namespace wlb::core
