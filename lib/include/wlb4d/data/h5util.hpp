#pragma once
/// \file h5util.hpp
/// \brief The one HDF5 helper layer of wlb4d (data's token datasets, io's
/// checkpoints and timing logs, wlb4d-plan): an RAII handle, HDF5's error
/// reason, silencing of HDF5's own error printing, and small typed
/// attribute/dataset accessors.
///
/// Errors: every helper that can fail throws `Err` (a template parameter,
/// default core::DataError; io passes core::CheckpointError) with the message
/// "<file>: <what>[ (HDF5: <reason>)]". `file` is whatever names the object
/// to the user: a path ("tokens.h5") or a phrase ("checkpoint step_1.h5").
/// Any Err constructible from a std::string works.

#include "wlb4d/core/error.hpp"

#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace wlb::data::h5 {

/// Owns one hid_t and closes it with the matching H5?close.
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  ~Handle() { reset(); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  /// Closes now (with the matching H5?close); false if the close failed,
  /// which for a file opened with MPI-IO is a failed collective close.
  bool reset() noexcept;

 private:
  hid_t id_ = H5I_INVALID_HID;
};

/// The HDF5 library of this platform is built without thread safety
/// (H5_HAVE_THREADSAFE undefined), so one thread at a time may call it. A
/// process with a second HDF5 thread (the asynchronous checkpoint writer,
/// io/checkpoint.hpp) holds this lock around every group of HDF5 calls of
/// both threads: the training thread's token reads and timing-log appends,
/// and the writer's steps (one dataset at a time). Recursive; uncontended
/// (one thread) it costs an atomic operation.
std::recursive_mutex& api_mutex();
using ApiLock = std::lock_guard<std::recursive_mutex>;

/// Silences HDF5's automatic error printing for the lifetime of the object
/// (our messages carry the reason instead); restores the previous handler.
class Quiet {
 public:
  Quiet();
  ~Quiet();
  Quiet(const Quiet&) = delete;
  Quiet& operator=(const Quiet&) = delete;

 private:
  H5E_auto2_t fn_ = nullptr;
  void* data_ = nullptr;
};

/// Innermost descriptions of HDF5's current error stack ("" when empty),
/// e.g. "truncated file: eof = 1024, ...". Clears the stack.
std::string last_error();
/// last_error() as " (HDF5: <reason>)", or "" when the stack is empty. Clears the stack.
std::string reason();

/// Throws Err(message): the error factory the helpers below are built on.
template <class Err> [[noreturn]] void raise(const std::string& message) { throw Err(message); }
using Raise = void (*)(const std::string&);

/// Throws Err("<file>: <what> (HDF5: <reason>)") when id < 0; returns id.
template <class Err = core::DataError>
hid_t check(hid_t id, const std::string& file, const std::string& what) {
  if (id < 0) raise<Err>(file + ": " + what + reason());
  return id;
}
/// As check, for an herr_t status.
template <class Err = core::DataError>
void check_status(herr_t st, const std::string& file, const std::string& what) {
  if (st < 0) raise<Err>(file + ": " + what + reason());
}

/// Does the object `name` (relative or absolute, e.g. "/optim/m/x") exist
/// under loc? Every path component is checked; nothing is printed.
bool exists(hid_t loc, const std::string& name);
/// Does loc carry the attribute `name`? (nothing printed)
bool has_attr(hid_t loc, const std::string& name);

/// How the attribute helpers word a failure. Data files:
/// "wrong schema: missing root attribute 'x'", "... attribute 'x' must be a
/// string", "cannot create attribute 'x'". Checkpoints (their messages
/// predate this layer): "missing root attribute 'x'", "attribute 'x' is not
/// a string", "is not an integer attribute", "cannot write attribute x".
enum class Wording { Data, Checkpoint };

/// How a string attribute is stored.
enum class StrKind {
  FixedUtf8,     ///< fixed length (max(1, size)), null-padded, UTF-8 (token datasets)
  FixedAscii,    ///< fixed length (max(1, size)), null-terminated, ASCII (timing logs)
  VariableUtf8,  ///< variable length, UTF-8 (checkpoints; h5py reads str, no size limit)
};

namespace detail {
void write_attr_string(hid_t loc, const std::string& name, const std::string& value, const std::string& file,
                       StrKind kind, Wording w, Raise fail);
void write_attr(hid_t loc, const std::string& name, hid_t type, const void* values, hsize_t n, bool scalar,
                const std::string& file, Wording w, Raise fail);
std::string read_attr_string(hid_t loc, const std::string& name, const std::string& file, Wording w, Raise fail);
std::vector<std::int64_t> read_attr_i64s(hid_t loc, const std::string& name, const std::string& file, Wording w,
                                         Raise fail);
std::int64_t read_attr_i64(hid_t loc, const std::string& name, const std::string& file, Wording w, Raise fail);
std::vector<std::uint64_t> read_1d_u64(hid_t loc, const std::string& name, const std::string& file, Raise fail);
void check_stored(hid_t dset, const std::string& name, const std::string& file, Raise fail);
}  // namespace detail

// --- attributes ---
/// Scalar string attribute.
template <class Err = core::DataError>
void write_attr_string(hid_t loc, const std::string& name, const std::string& value, const std::string& file,
                       StrKind kind = StrKind::FixedUtf8, Wording w = Wording::Data) {
  detail::write_attr_string(loc, name, value, file, kind, w, &raise<Err>);
}
/// Attribute of n values of `type` (the file and memory type, e.g.
/// H5T_NATIVE_INT64): a scalar when `scalar` (n must be 1), else 1-D [n].
template <class Err = core::DataError>
void write_attr(hid_t loc, const std::string& name, hid_t type, const void* values, hsize_t n, bool scalar,
                const std::string& file, Wording w = Wording::Data) {
  detail::write_attr(loc, name, type, values, n, scalar, file, w, &raise<Err>);
}
/// Scalar int64 attribute.
template <class Err = core::DataError>
void write_attr_i64(hid_t loc, const std::string& name, std::int64_t value, const std::string& file,
                    Wording w = Wording::Data) {
  detail::write_attr(loc, name, H5T_NATIVE_INT64, &value, 1, true, file, w, &raise<Err>);
}
/// Reads a scalar string attribute (fixed or variable length).
template <class Err = core::DataError>
std::string read_attr_string(hid_t loc, const std::string& name, const std::string& file,
                             Wording w = Wording::Data) {
  return detail::read_attr_string(loc, name, file, w, &raise<Err>);
}
/// Reads an integer attribute of any integer type and >= 1 elements.
template <class Err = core::DataError>
std::vector<std::int64_t> read_attr_i64s(hid_t loc, const std::string& name, const std::string& file,
                                         Wording w = Wording::Data) {
  return detail::read_attr_i64s(loc, name, file, w, &raise<Err>);
}
/// Reads a scalar integer attribute of any integer type (Wording::Checkpoint:
/// the first element of an integer array).
template <class Err = core::DataError>
std::int64_t read_attr_i64(hid_t loc, const std::string& name, const std::string& file,
                           Wording w = Wording::Data) {
  return detail::read_attr_i64(loc, name, file, w, &raise<Err>);
}

// --- datasets ---
/// The most a filtered (compressed) dataset may expand: its declared bytes
/// (elements x element size) over the bytes it has stored in the file, and
/// the bytes the file's stored data claim over the bytes the file occupies on
/// disk (a sparse file, or a file system's own compression). deflate's own
/// ceiling is ~1032; token ids and offsets compress far less.
inline constexpr std::uint64_t kMaxStoredExpansion = 1024;

/// Checks that the declared extent of dataset `dset` (`name` in the file
/// named `file` in messages) is backed by the file, using metadata only and
/// before anything is read or allocated in proportion to it: a hostile or
/// damaged file can declare 2^40 elements in a 20 KB file (chunks never
/// written, or a sparse 4 TiB file), which would otherwise be read (fill
/// values, holes) or allocated for hours. Rules (declared = elements x the
/// file type's size, in bytes; stored = H5Dget_storage_size; the file's size
/// and its allocated blocks from stat(2), of the file HDF5 opened):
///   - a non-empty dataset has storage (stored > 0), no more than the file holds;
///   - an unfiltered dataset stores every declared byte (stored >= declared);
///   - a filtered one expands at most kMaxStoredExpansion-fold, and every
///     chunk its extent needs is stored (H5Dget_num_chunks);
///   - stored <= kMaxStoredExpansion x the bytes allocated on disk (skipped
///     when the file system reports none).
/// Compact datasets (at most 64 KiB, inside the object header) pass.
/// Throws Err("<file>: dataset '<name>' declares N elements (B bytes) but ...").
template <class Err = core::DataError>
void check_stored(hid_t dset, const std::string& name, const std::string& file) {
  detail::check_stored(dset, name, file, &raise<Err>);
}

/// Reads a whole 1-D integer dataset as uint64 (e.g. /doc_offsets), after
/// check_stored. Throws Err if it is missing, not 1-D, not backed by the file
/// (check_stored) or unreadable.
template <class Err = core::DataError>
std::vector<std::uint64_t> read_1d_u64(hid_t loc, const std::string& name, const std::string& file) {
  return detail::read_1d_u64(loc, name, file, &raise<Err>);
}

}  // namespace wlb::data::h5
