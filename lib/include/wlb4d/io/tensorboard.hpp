#pragma once
/// \file tensorboard.hpp
/// \brief TensorBoard scalars (log.tensorboard_dir): an event file that
/// stock TensorBoard reads (`tensorboard --logdir DIR`), written by rank 0,
/// one record per step, flushed after each (a run that dies keeps its curve).
///
/// File: DIR/events.out.tfevents.<unix time>.<hostname>.<pid>.wlb4d, a new
/// one per start of the trainer (TensorBoard reads every file of DIR whose
/// name contains "tfevents", in name order, as one run). No TensorFlow or
/// protobuf library is used: both layers are encoded here from their
/// documentation.
///
/// Framing (TFRecord; https://www.tensorflow.org/tutorials/load_data/tfrecord,
/// "TFRecords format details"), one record per Event, integers little-endian:
///   uint64 length | uint32 masked_crc32c(length bytes) | payload |
///   uint32 masked_crc32c(payload)
/// masked_crc = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32), crc the
/// CRC-32C (Castagnoli) of the bytes.
///
/// Payload: a protobuf `Event` (tensorboard/compat/proto/event.proto;
/// summary.proto), in the protobuf wire format
/// (https://protobuf.dev/programming-guides/encoding/): varints, fixed64,
/// fixed32 and length-delimited fields, fields in number order:
///   Event      { double wall_time = 1; int64 step = 2;
///                oneof { string file_version = 3; Summary summary = 5;
///                        SessionLog session_log = 7; } }
///   Summary    { repeated Value value = 1; }
///   Value      { string tag = 1; float simple_value = 2; }
///   SessionLog { SessionStatus status = 1; }   (START = 1)
/// Records of a file: Event{wall_time, file_version = "brain.Event:2"}, then
/// Event{wall_time, step, session_log{START}} (the first step this start
/// runs: TensorBoard's event accumulator treats a later START in a run as a
/// restart and drops that run's points at steps >= it, so a resume from an
/// older checkpoint replaces the steps it runs again instead of zig-zagging;
/// the first START of a run is ignored), then one Event{wall_time, step,
/// summary} per step. wall_time: seconds since the Unix epoch (UTC).

#include "wlb4d/comm/communicator.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace wlb::io {

/// CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial value and
/// final XOR 0xFFFFFFFF), as iSCSI (RFC 3720 §B.4) and TFRecord use it;
/// crc32c("123456789") = 0xE3069283. `crc` continues an earlier value
/// (crc32c(a+b) = crc32c(b, crc32c(a))).
std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0);

/// TFRecord's masked CRC of `n` bytes: ((c >> 15) | (c << 17)) + 0xa282ead8, c = crc32c.
std::uint32_t masked_crc32c(const void* data, std::size_t n);

/// One TFRecord around `payload` (see the file comment).
std::string tfrecord(const std::string& payload);

/// One scalar of a step: TensorBoard's tag ("train/loss") and value.
struct ScalarValue {
  std::string tag;
  double value = 0;  ///< stored as float (simple_value)
};

/// Encoded Event messages (payloads of tfrecord()).
std::string event_file_version(double wall_time);
std::string event_session_start(double wall_time, std::int64_t step);
std::string event_scalars(double wall_time, std::int64_t step, const std::vector<ScalarValue>& values);

/// Seconds since the Unix epoch, now (Event.wall_time).
double unix_seconds();

/// The event file of one start (serial; the trainer opens it on rank 0).
class TensorBoardWriter {
 public:
  /// Creates `dir` (and its parents) when missing and a new event file in it
  /// (see the file comment), and writes the file_version record.
  /// \throws core::DataError naming log.tensorboard_dir, the rule and the
  ///         cause, e.g. "log.tensorboard_dir='runs/x/tb': must be a
  ///         directory rank 0 can create and write: 'runs/x' is not a
  ///         directory" or "...: cannot create event file '...': Permission
  ///         denied".
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// The event file's path.
  const std::string& path() const { return path_; }
  /// Writes Event{step, session_log{START}} and flushes.
  void session_start(std::int64_t step);
  /// Writes one Event with the step's scalars (non-finite values included,
  /// TensorBoard shows them as NaN/inf) and flushes.
  /// \throws core::DataError "log.tensorboard_dir: writing '<file>' failed: <errno text>".
  void add_scalars(std::int64_t step, const std::vector<ScalarValue>& values);

 private:
  void write(const std::string& payload);
  std::string path_;
  std::FILE* f_ = nullptr;
};

/// Start-up check (collective over `world`; rank 0 looks), before the
/// trainer's calibration and checkpoint load: creates `dir` (and its
/// parents) when missing and probes that it takes a new file (created and
/// removed), so that an unusable directory fails in seconds and no event
/// file is left by a run refused later at start-up. Empty `dir`: nothing.
/// \throws core::DataError on every rank, as TensorBoardWriter's constructor.
void check_tensorboard_dir(const std::string& dir, const comm::Communicator& world);

/// Collective over `world`: rank 0 opens a TensorBoardWriter on `dir` and
/// returns it; the other ranks get nullptr. Empty `dir`: nullptr everywhere.
/// \throws core::DataError on every rank with rank 0's message when it cannot.
std::unique_ptr<TensorBoardWriter> open_tensorboard(const std::string& dir, const comm::Communicator& world);

}  // namespace wlb::io
