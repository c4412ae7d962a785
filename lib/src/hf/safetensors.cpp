/// \file safetensors.cpp
/// \brief safetensors reader/writer (see the header for the format).
#include "wlb4d/hf/safetensors.hpp"

#include "wlb4d/core/error.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include <fcntl.h>
#include <unistd.h>

namespace wlb::hf {

using core::CheckpointError;
using core::InternalError;
namespace fs = std::filesystem;

const char* dtype_name(Dtype d) {
  switch (d) {
    case Dtype::F32: return "F32";
    case Dtype::BF16: return "BF16";
    case Dtype::F16: return "F16";
  }
  return "?";
}

std::size_t dtype_size(Dtype d) { return d == Dtype::F32 ? 4 : 2; }

std::uint64_t numel(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (auto d : shape) n *= std::uint64_t(d);
  return n;
}

std::uint64_t tensor_bytes(Dtype d, const std::vector<std::int64_t>& shape) { return numel(shape) * dtype_size(d); }

namespace {

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Element sizes of every dtype safetensors defines (safetensors/src/tensor.rs
// Dtype), so a file with, e.g., an I64 buffer is validated and listed even
// though wlb4d does not convert it.
int known_dtype_size(const std::string& d) {
  static const std::map<std::string, int> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  const auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

}  // namespace

std::uint16_t float_to_bf16(float x) {
  const std::uint32_t u = bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x0040u);  // NaN: keep it quiet
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);                       // ties to even
  return std::uint16_t((u + rounding) >> 16);
}

float bf16_to_float(std::uint16_t h) { return float_of(std::uint32_t(h) << 16); }

std::uint16_t float_to_f16(float x) {
  const std::uint32_t u = bits_of(x);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return std::uint16_t(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  const int e = int(a >> 23) - 127;                             // unbiased exponent
  if (e >= -14) {                                               // normal binary16
    // 13 mantissa bits dropped; ties to even on the kept part.
    std::uint32_t m = a & 0x7fffffu;
    std::uint32_t h = (std::uint32_t(e + 15) << 10) | (m >> 13);
    const std::uint32_t rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is correct
    return std::uint16_t(sign | h);
  }
  if (e < -25) return sign;  // below half the smallest subnormal (2^-25): zero
  // Subnormal: value = m' * 2^-24 with m' = full mantissa (with hidden 1) >> shift.
  const std::uint32_t full = (a & 0x7fffffu) | 0x800000u;
  const int shift = -e - 1;  // e = -15 -> 14 ... e = -25 -> 24
  std::uint32_t h = full >> shift;
  const std::uint32_t rest = full & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return std::uint16_t(sign | h);
}

float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return float_of(sign | 0x7f800000u | (m << 13));  // inf / NaN
  if (e != 0) return float_of(sign | ((e + 112u) << 23) | (m << 13));
  // zero or subnormal: m * 2^-24, exact in fp32
  const float v = float(m) * float_of(0x33800000u);  // 2^-24
  return float_of(sign | bits_of(v));
}

// ---------------------------------------------------------------- writer

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<TensorSpec> specs,
                                     std::map<std::string, std::string> metadata)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), specs_(std::move(specs)) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  std::uint64_t off = 0;
  for (const auto& s : specs_) {
    if (s.name.empty() || s.name == "__metadata__" || !seen.insert(s.name).second)
      throw CheckpointError(path_ + ": tensor name '" + s.name + "' is empty, reserved or repeated");
    for (auto d : s.shape)
      if (d < 0) throw CheckpointError(path_ + ": tensor '" + s.name + "' has a negative dimension");
    const std::uint64_t b = tensor_bytes(s.dtype, s.shape);
    header[s.name] = {{"dtype", dtype_name(s.dtype)}, {"shape", s.shape}, {"data_offsets", {off, off + b}}};
    off += b;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data buffer starts 8-byte aligned
  out_.open(tmp_, std::ios::binary | std::ios::trunc);
  if (!out_) throw CheckpointError(tmp_ + ": cannot create (" + std::strerror(errno) + ")");
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(std::uint64_t(text.size()) >> (8 * i));
  out_.write(reinterpret_cast<const char*>(len), 8);
  out_.write(text.data(), std::streamsize(text.size()));
  if (!out_) throw CheckpointError(tmp_ + ": write failed (" + std::strerror(errno) + ")");
}

SafetensorsWriter::~SafetensorsWriter() {
  if (!done_) {
    out_.close();
    std::error_code ec;
    fs::remove(tmp_, ec);
  }
}

void SafetensorsWriter::write(const std::string& name, const float* x, std::size_t n) {
  if (next_ >= specs_.size() || specs_[next_].name != name)
    throw InternalError(path_ + ": tensor '" + name + "' written out of the header's order");
  const TensorSpec& s = specs_[next_];
  if (n != numel(s.shape))
    throw InternalError(path_ + ": tensor '" + name + "' given " + std::to_string(n) + " values, its shape holds " +
                        std::to_string(numel(s.shape)));
  // Converted in blocks: the copy costs a few MB, not a second tensor.
  constexpr std::size_t kBlock = 1 << 20;
  std::vector<unsigned char> buf;
  for (std::size_t i0 = 0; i0 < n; i0 += kBlock) {
    const std::size_t m = std::min(kBlock, n - i0);
    buf.resize(m * dtype_size(s.dtype));
    for (std::size_t i = 0; i < m; ++i) {
      const float v = x[i0 + i];
      if (s.dtype == Dtype::F32) {
        const std::uint32_t u = bits_of(v);
        for (int k = 0; k < 4; ++k) buf[4 * i + k] = static_cast<unsigned char>(u >> (8 * k));
      } else {
        const std::uint16_t h = s.dtype == Dtype::BF16 ? float_to_bf16(v) : float_to_f16(v);
        buf[2 * i] = static_cast<unsigned char>(h);
        buf[2 * i + 1] = static_cast<unsigned char>(h >> 8);
      }
    }
    out_.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(buf.size()));
    if (!out_) throw CheckpointError(tmp_ + ": write of tensor '" + name + "' failed (" + std::strerror(errno) + ")");
  }
  ++next_;
}

void SafetensorsWriter::finish() {
  if (next_ != specs_.size())
    throw InternalError(path_ + ": finished with tensor '" + specs_[next_].name + "' and later ones unwritten");
  out_.flush();
  if (!out_) throw CheckpointError(tmp_ + ": write failed (" + std::strerror(errno) + ")");
  out_.close();
  // fsync before the rename, so that a crash cannot leave a renamed but empty file.
  const int fd = ::open(tmp_.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    throw CheckpointError(tmp_ + ": fsync failed (" + why + ")");
  }
  ::close(fd);
  std::error_code ec;
  fs::rename(tmp_, path_, ec);
  if (ec) throw CheckpointError(tmp_ + ": cannot rename to " + path_ + " (" + ec.message() + ")");
  done_ = true;
}

// ---------------------------------------------------------------- reader

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  const auto fail = [&](const std::string& why) { throw CheckpointError(path_ + ": " + why); };
  std::ifstream in(path_, std::ios::binary);
  if (!in) fail(std::string("cannot open (") + std::strerror(errno) + ")");
  std::error_code ec;
  const std::uint64_t file_size = fs::file_size(path_, ec);
  if (ec) fail("cannot stat (" + ec.message() + ")");
  if (file_size < 8) fail("too short for a safetensors file (" + std::to_string(file_size) + " bytes, header length alone is 8)");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(len[i]) << (8 * i);
  if (n > 100000000ULL || n > file_size - 8)
    fail("header length " + std::to_string(n) + " exceeds the file (" + std::to_string(file_size) +
         " bytes) or safetensors' 100 MB limit: not a safetensors file, or truncated");
  std::string text(std::size_t(n), '\0');
  in.read(text.data(), std::streamsize(n));
  if (!in) fail("cannot read the header");
  data_start_ = 8 + n;
  const std::uint64_t buffer = file_size - data_start_;

  // Top-level duplicate names would silently keep the last entry in nlohmann;
  // the callback sees every key at depth 1 first.
  std::set<std::string> keys;
  std::string dup;
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(text, [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& v) {
      if (ev == nlohmann::json::parse_event_t::key && depth == 1 && v.is_string() &&
          !keys.insert(v.get<std::string>()).second && dup.empty())
        dup = v.get<std::string>();
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!dup.empty()) fail("header names tensor '" + dup + "' twice");
  if (!h.is_object()) fail("header is not a JSON object");
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail("__metadata__ is not an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail("__metadata__['" + m.key() + "'] is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const auto bad = [&](const std::string& why) { fail("tensor '" + name + "': " + why); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      bad("entry needs dtype, shape and data_offsets");
    TensorInfo t;
    t.name = name;
    if (!v["dtype"].is_string()) bad("dtype is not a string");
    t.dtype = v["dtype"].get<std::string>();
    const int es = known_dtype_size(t.dtype);
    if (es == 0) bad("unknown dtype '" + t.dtype + "'");
    if (!v["shape"].is_array()) bad("shape is not an array");
    std::uint64_t count = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0) bad("shape holds a value that is not a non-negative integer");
      const auto dim = std::uint64_t(d.get<std::int64_t>());
      if (dim != 0 && count > (std::uint64_t(1) << 62) / dim) bad("shape's element count overflows");
      count *= dim;
      t.shape.push_back(d.get<std::int64_t>());
    }
    const auto& o = v["data_offsets"];
    if (!o.is_array() || o.size() != 2 || !o[0].is_number_unsigned() || !o[1].is_number_unsigned())
      bad("data_offsets is not two non-negative integers");
    t.begin = o[0].get<std::uint64_t>();
    t.end = o[1].get<std::uint64_t>();
    if (t.end < t.begin) bad("data_offsets end before they begin");
    if (t.end - t.begin != count * std::uint64_t(es))
      bad("data_offsets span " + std::to_string(t.end - t.begin) + " bytes but " + t.dtype + " of its shape needs " +
          std::to_string(count * std::uint64_t(es)));
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  std::uint64_t at = 0;
  for (const auto& t : tensors_) {
    if (t.begin != at)
      fail("tensor '" + t.name + "' starts at byte " + std::to_string(t.begin) + " of the data buffer, expected " +
           std::to_string(at) + " (tensors must tile the buffer: " + (t.begin < at ? "overlap" : "gap") + ")");
    at = t.end;
  }
  if (at != buffer)
    fail("tensors cover " + std::to_string(at) + " bytes of data but the file holds " + std::to_string(buffer) +
         (at > buffer ? " (truncated)" : " (trailing bytes)"));
  for (std::size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<float> SafetensorsFile::read(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) throw CheckpointError(path_ + ": no tensor '" + name + "'");
  if (t->dtype != "F32" && t->dtype != "BF16" && t->dtype != "F16")
    throw CheckpointError(path_ + ": tensor '" + name + "' has dtype " + t->dtype +
                          "; wlb4d reads F32, BF16 and F16 weights");
  const std::size_t es = t->dtype == "F32" ? 4 : 2;
  const std::size_t n = std::size_t((t->end - t->begin) / es);
  std::vector<float> out(n);
  std::ifstream in(path_, std::ios::binary);
  in.seekg(std::streamoff(data_start_ + t->begin));
  constexpr std::size_t kBlock = 1 << 20;
  std::vector<unsigned char> buf;
  for (std::size_t i0 = 0; i0 < n; i0 += kBlock) {
    const std::size_t m = std::min(kBlock, n - i0);
    buf.resize(m * es);
    in.read(reinterpret_cast<char*>(buf.data()), std::streamsize(buf.size()));
    if (!in) throw CheckpointError(path_ + ": read of tensor '" + name + "' failed (file changed or truncated?)");
    for (std::size_t i = 0; i < m; ++i) {
      const unsigned char* b = &buf[i * es];
      if (es == 4) {
        out[i0 + i] = float_of(std::uint32_t(b[0]) | std::uint32_t(b[1]) << 8 | std::uint32_t(b[2]) << 16 |
                               std::uint32_t(b[3]) << 24);
      } else {
        const std::uint16_t h = std::uint16_t(b[0] | b[1] << 8);
        out[i0 + i] = t->dtype == "BF16" ? bf16_to_float(h) : f16_to_float(h);
      }
    }
  }
  return out;
}

}  // namespace wlb::hf
