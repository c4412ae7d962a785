// TensorBoard event files: TFRecord framing around hand-encoded protobuf
// Events (tensorboard.hpp has the format and its sources).
#include "wlb4d/io/tensorboard.hpp"

#include "wlb4d/core/error.hpp"

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace wlb::io {

namespace {

using core::DataError;

constexpr const char* kKey = "log.tensorboard_dir";

/// Byte-at-a-time table of the reflected Castagnoli polynomial: a record is
/// a few hundred bytes per step, so the table is plenty (no SSE4.2 path).
const std::array<std::uint32_t, 256>& crc_table() {
  static const std::array<std::uint32_t, 256> t = [] {
    std::array<std::uint32_t, 256> a{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      a[i] = c;
    }
    return a;
  }();
  return t;
}

// ---- protobuf wire format (little-endian fixed-width, base-128 varints) ----
enum Wire : std::uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(std::uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(std::uint8_t(v)));
}
void put_key(std::string& out, std::uint32_t field, Wire w) { put_varint(out, (std::uint64_t(field) << 3) | w); }
void put_le(std::string& out, std::uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char(std::uint8_t(bits >> (8 * i))));
}
void put_double(std::string& out, std::uint32_t field, double v) {
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed64);
  put_le(out, bits, 8);
}
void put_float(std::string& out, std::uint32_t field, float v) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed32);
  put_le(out, bits, 4);
}
void put_bytes(std::string& out, std::uint32_t field, const std::string& b) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, b.size());
  out += b;
}
/// Event fields 1 and 2. proto3 omits a zero step; TensorBoard reads a
/// missing step as 0, so writing it only when non-zero changes nothing.
std::string event_head(double wall_time, std::int64_t step) {
  std::string e;
  put_double(e, 1, wall_time);
  if (step != 0) {
    put_key(e, 2, kVarint);
    put_varint(e, std::uint64_t(step));  // int64: two's complement as a 64-bit varint
  }
  return e;
}

/// "'a/b' is not a directory" style reason, or "" when `dir` now exists as a directory.
std::string make_dirs(const std::string& dir) {
  std::string prefix;
  std::size_t pos = 0;
  while (pos <= dir.size()) {
    const std::size_t next = dir.find('/', pos);
    const std::size_t end = next == std::string::npos ? dir.size() : next;
    prefix = dir.substr(0, end);
    pos = end + 1;
    if (prefix.empty() || prefix == "." || prefix == "..") continue;  // "/" root, or relative markers
    struct stat st {};
    if (::stat(prefix.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) return "'" + prefix + "' is not a directory";
      continue;
    }
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST)
      return "cannot create directory '" + prefix + "': " + std::strerror(errno);
  }
  return "";
}

std::string host_name() {
  char h[256] = {};
  if (::gethostname(h, sizeof h - 1) != 0 || h[0] == '\0') return "localhost";
  std::string s(h);
  for (auto& c : s)
    if (c == '/') c = '_';  // never a path separator in the file name
  return s;
}

/// As the other log paths' messages: key='path': the rule: (then the cause).
std::string rule_prefix(const std::string& dir) {
  return std::string(kKey) + "='" + dir + "': must be a directory rank 0 can create and write: ";
}

/// make_dirs, then "" when `dir` is a directory, else the reason.
std::string usable_dir(const std::string& dir) {
  if (const std::string why = make_dirs(dir); !why.empty()) return why;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return "not a directory";
  return "";
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc) {
  const auto& t = crc_table();
  const auto* p = static_cast<const std::uint8_t*>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < n; ++i) crc = t[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

std::uint32_t masked_crc32c(const void* data, std::size_t n) {
  const std::uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord(const std::string& payload) {
  std::string len;
  put_le(len, payload.size(), 8);
  std::string out = len;
  put_le(out, masked_crc32c(len.data(), len.size()), 4);
  out += payload;
  put_le(out, masked_crc32c(payload.data(), payload.size()), 4);
  return out;
}

std::string event_file_version(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string event_session_start(double wall_time, std::int64_t step) {
  std::string log;
  put_key(log, 1, kVarint);
  put_varint(log, 1);  // SessionLog.SessionStatus START
  std::string e = event_head(wall_time, step);
  put_bytes(e, 7, log);
  return e;
}

std::string event_scalars(double wall_time, std::int64_t step, const std::vector<ScalarValue>& values) {
  std::string summary;
  for (const auto& v : values) {
    std::string value;
    put_bytes(value, 1, v.tag);
    put_float(value, 2, float(v.value));
    put_bytes(summary, 1, value);
  }
  std::string e = event_head(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  const std::string pre = rule_prefix(dir);
  if (const std::string why = usable_dir(dir); !why.empty()) throw DataError(pre + why);
  path_ = (dir.back() == '/' ? dir : dir + "/") + "events.out.tfevents." + std::to_string(std::time(nullptr)) + "." +
          host_name() + "." + std::to_string(::getpid()) + ".wlb4d";
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw DataError(pre + "cannot create event file '" + path_ + "': " + std::strerror(errno));
  f_ = ::fdopen(fd, "wb");
  if (!f_) {
    const int e = errno;
    ::close(fd);
    throw DataError(pre + "cannot open event file '" + path_ + "': " + std::strerror(e));
  }
  write(event_file_version(unix_seconds()));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::write(const std::string& payload) {
  const std::string rec = tfrecord(payload);
  errno = 0;
  if (std::fwrite(rec.data(), 1, rec.size(), f_) != rec.size() || std::fflush(f_) != 0)
    throw DataError(std::string(kKey) + ": writing '" + path_ + "' failed: " +
                    (errno ? std::strerror(errno) : "short write"));
}

void TensorBoardWriter::session_start(std::int64_t step) { write(event_session_start(unix_seconds(), step)); }

void TensorBoardWriter::add_scalars(std::int64_t step, const std::vector<ScalarValue>& values) {
  write(event_scalars(unix_seconds(), step, values));
}

void check_tensorboard_dir(const std::string& dir, const comm::Communicator& world) {
  if (dir.empty()) return;
  std::string err;
  if (world.rank() == 0) {
    std::string why = usable_dir(dir);
    if (why.empty()) {
      // access(W_OK) misses read-only mounts for root: create a file.
      const std::string probe = (dir.back() == '/' ? dir : dir + "/") + ".wlb4d-probe-" + std::to_string(::getpid());
      const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0) {
        why = "cannot create a file in it: " + std::string(std::strerror(errno));
      } else {
        ::close(fd);
        ::unlink(probe.c_str());
      }
    }
    if (!why.empty()) err = rule_prefix(dir) + why;
  }
  err = comm::agree(world, err);
  if (!err.empty()) throw DataError(err);
}

std::unique_ptr<TensorBoardWriter> open_tensorboard(const std::string& dir, const comm::Communicator& world) {
  if (dir.empty()) return nullptr;
  std::unique_ptr<TensorBoardWriter> w;
  std::string err;
  if (world.rank() == 0) {
    try {
      w = std::make_unique<TensorBoardWriter>(dir);
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  err = comm::agree(world, err);
  if (!err.empty()) throw DataError(err);
  return w;
}

}  // namespace wlb::io
