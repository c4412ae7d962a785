#pragma once
/// \file h5util.hpp
/// \brief HDF5 helpers of the data area, also used by io's checkpoints: an
/// RAII handle, HDF5's error reason, and small typed attribute/dataset
/// accessors. Every failure of the accessors becomes a wlb::core::DataError
/// whose message names the file and object and carries HDF5's own reason.

#include "wlb4d/core/error.hpp"

#include <hdf5.h>

#include <cstdint>
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

/// Innermost descriptions of HDF5's current error stack ("" when empty),
/// e.g. "truncated file: eof = 1024, ...". Clears the stack.
std::string last_error();

/// Throws DataError("<file>: <what>: <HDF5 reason>") when id < 0.
hid_t check(hid_t id, const std::string& file, const std::string& what);
void check_status(herr_t st, const std::string& file, const std::string& what);

/// Does the link `name` exist under loc (no error printed when it does not)?
bool exists(hid_t loc, const std::string& name);

// --- attributes (scalar) ---
void write_attr_string(hid_t loc, const std::string& name, const std::string& value,
                       const std::string& file);
void write_attr_i64(hid_t loc, const std::string& name, std::int64_t value, const std::string& file);
bool has_attr(hid_t loc, const std::string& name);
/// Reads a scalar string attribute (fixed or variable length).
std::string read_attr_string(hid_t loc, const std::string& name, const std::string& file);
/// Reads a scalar integer attribute of any integer type.
std::int64_t read_attr_i64(hid_t loc, const std::string& name, const std::string& file);

}  // namespace wlb::data::h5
