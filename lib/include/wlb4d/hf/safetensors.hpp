#pragma once
/// \file safetensors.hpp
/// \brief Reading and writing safetensors files, the weight format of Hugging
/// Face checkpoints (https://huggingface.co/docs/safetensors, "Format").
///
/// ## The format
///   bytes 0..7     N, the header's length: unsigned 64-bit little-endian
///   bytes 8..8+N   a UTF-8 JSON object: for each tensor
///                    "name": {"dtype": "BF16"|"F16"|"F32"|...,
///                             "shape": [d0, d1, ...],
///                             "data_offsets": [begin, end]}
///                  and optionally "__metadata__": {string: string}.
///                  The writer pads it with spaces to a multiple of 8 bytes.
///   bytes 8+N..    the byte buffer: every tensor row-major (C order),
///                  little-endian, at [begin, end) relative to the buffer's
///                  start. end - begin = numel * dtype size; the tensors'
///                  ranges tile the buffer with no gap and no overlap.
///
/// Only what a Llama checkpoint uses is converted: F32, BF16 and F16, read
/// into fp32 exactly (every BF16/F16 value is an fp32 value) and written from
/// fp32 with round-to-nearest-even (torch's `.to(torch.bfloat16)`). A file
/// holding other dtypes still opens; reading such a tensor throws.

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace wlb::hf {

/// The element types wlb4d converts (safetensors' names "F32", "BF16", "F16").
enum class Dtype { F32, BF16, F16 };

/// "F32", "BF16", "F16".
const char* dtype_name(Dtype d);
/// Bytes per element: 4, 2, 2.
std::size_t dtype_size(Dtype d);
/// Element count of a shape (1 for a scalar, shape []).
std::uint64_t numel(const std::vector<std::int64_t>& shape);
/// Bytes of a tensor of `shape` stored as `d`.
std::uint64_t tensor_bytes(Dtype d, const std::vector<std::int64_t>& shape);

/// fp32 -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN.
std::uint16_t float_to_bf16(float x);
/// fp32 -> IEEE binary16 bits, round to nearest even, overflow to ±inf,
/// gradual underflow to subnormals; NaN stays a (quiet) NaN.
std::uint16_t float_to_f16(float x);
/// bf16 bits -> fp32 (exact).
float bf16_to_float(std::uint16_t h);
/// binary16 bits -> fp32 (exact, subnormals included).
float f16_to_float(std::uint16_t h);

/// One tensor to be written: its name, stored dtype and shape.
struct TensorSpec {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<std::int64_t> shape;
};

/// Writes one safetensors file, one tensor at a time (never the whole file in
/// memory). The header is fixed at construction from `specs`, whose order is
/// the order of the data in the file; write() must then be called once per
/// tensor in that order. The file is written as `path`.tmp and renamed to
/// `path` by finish() after an fsync, so a failed or abandoned write leaves
/// no partial `path` (the destructor removes the .tmp).
class SafetensorsWriter {
 public:
  /// \throws core::CheckpointError when the file cannot be created, or for a
  ///         duplicate or empty tensor name or a negative dimension
  ///         (core::InternalError would hide a caller's bad name list).
  SafetensorsWriter(std::string path, std::vector<TensorSpec> specs, std::map<std::string, std::string> metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  /// Converts n fp32 values (row-major, n = numel of the tensor's shape) to
  /// the tensor's dtype and appends them.
  /// \throws core::InternalError if `name` is not the next tensor or n is
  ///         not its element count; core::CheckpointError on a write error
  ///         (disk full), naming the file.
  void write(const std::string& name, const float* x, std::size_t n);

  /// Checks every tensor was written, flushes, fsyncs and renames the file
  /// into place. \throws core::CheckpointError (write error) or
  /// core::InternalError (tensors missing).
  void finish();

  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  std::vector<TensorSpec> specs_;
  std::size_t next_ = 0;
  std::ofstream out_;
  bool done_ = false;
};

/// A tensor's entry in a file's header.
struct TensorInfo {
  std::string name;
  std::string dtype;                 ///< as written ("BF16", "F32", "I64", ...)
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  ///< byte range within the data buffer
};

/// An opened safetensors file. The constructor reads and validates the header
/// only; read() fetches one tensor.
class SafetensorsFile {
 public:
  /// Validates the whole layout before any tensor is read: the header length
  /// fits the file (and at most 100 MB, safetensors' own limit), the header is
  /// a JSON object with no duplicate names, every entry has a dtype string, a
  /// shape of non-negative integers and two data_offsets with
  /// end - begin = numel * dtype size (for the dtypes known to safetensors),
  /// and the ranges tile the data buffer exactly (no gap, no overlap, nothing
  /// beyond the file: a truncated file is caught here).
  /// \throws core::CheckpointError naming the file, the tensor and the rule.
  explicit SafetensorsFile(std::string path);

  const std::string& path() const { return path_; }
  /// Tensors in the order of their data in the file.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  /// nullptr when the file has no tensor of that name.
  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  /// The tensor's values as fp32, row-major.
  /// \throws core::CheckpointError for an unknown name, a dtype other than
  ///         F32/BF16/F16, or a read error, naming the file and tensor.
  std::vector<float> read(const std::string& name) const;

 private:
  std::string path_;
  std::uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace wlb::hf
