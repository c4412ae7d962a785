#pragma once
/// \file build_info.hpp
/// \brief What `--version` prints on every tool (wlb4d, wlb4d-prep, wlb4d-plan,
/// wlb4d-ckpt): the program version and git hash, the Kokkos version and its
/// enabled backends, the MPI library, the HDF5 library and the build type.

#include <string>

namespace wlb::core {

/// Several lines, "TOOL VERSION (git SHA)" first. `hdf5` is the HDF5 library's
/// version as the tool sees it (core does not link HDF5; the tools do). Safe
/// before MPI_Init (MPI_Get_library_version may be called then).
std::string version_report(const std::string& tool, const std::string& hdf5);

}  // namespace wlb::core
