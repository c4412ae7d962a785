#pragma once
// --version of the command-line tools: core::version_report plus the HDF5
// library each tool links (core itself does not link HDF5).
#include "wlb4d/core/build_info.hpp"

#include <hdf5.h>

#include <string>

inline std::string tool_version(const char* tool) {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  std::string h5 = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
#if defined(H5_HAVE_PARALLEL)
  h5 += " (parallel)";
#else
  h5 += " (serial)";
#endif
  return wlb::core::version_report(tool, h5);
}
