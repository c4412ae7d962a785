#pragma once
/// \file types.hpp
/// \brief Named Kokkos View aliases and scalar types shared by every area.
///
/// Every View is LayoutRight (row-major): the same order as HDF5 datasets and
/// as the row-major host BLAS call made by KokkosBlas::gemm, so a [rows][cols]
/// tensor can be written, read and multiplied without transposition. Views
/// live in the default memory space of the default execution space (HostSpace
/// on Debian's Serial Kokkos, CudaSpace on a CUDA build).

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace wlb {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;
using HostSpace = Kokkos::HostSpace;
using HostExecSpace = Kokkos::DefaultHostExecutionSpace;
using Layout = Kokkos::LayoutRight;

/// Token ids as stored in the dataset (`/tokens`, uint32).
using token_t = std::uint32_t;

/// Device Views of rank 1..4, row-major.
template <class T> using View1 = Kokkos::View<T*, Layout, MemSpace>;
template <class T> using View2 = Kokkos::View<T**, Layout, MemSpace>;
template <class T> using View3 = Kokkos::View<T***, Layout, MemSpace>;
template <class T> using View4 = Kokkos::View<T****, Layout, MemSpace>;
/// Host Views (staging for I/O and MPI on the host backend).
template <class T> using HostView1 = Kokkos::View<T*, Layout, HostSpace>;
template <class T> using HostView2 = Kokkos::View<T**, Layout, HostSpace>;

/// fp32 model tensors: [n] vectors and [rows][cols] matrices.
using Vec = View1<float>;
using Mat = View2<float>;
/// int32 per-token metadata: token ids, labels (-1 = no target), positions.
using IntVec = View1<std::int32_t>;

}  // namespace wlb
