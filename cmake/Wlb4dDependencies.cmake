# Finds every third-party dependency of wlb4d and wraps the irregular ones
# behind project targets:
#   wlb4d::kokkos         Kokkos core (Debian 3.4 target repaired; Spack 4.x untouched)
#   wlb4d::kokkoskernels  KokkosKernels (Debian exports variables, Spack a target)
#   wlb4d::sentencepiece  sentencepiece via pkg-config
#   wlb4d::pcre2          PCRE2 (8-bit) via pkg-config, else find_library
#   wlb4d::nccl           NCCL (only with WLB4D_ENABLE_CUDA)
#   wlb4d::cublas         cuBLAS for the bf16 GEMMs (only with WLB4D_ENABLE_CUDA)

# ---- MPI ------------------------------------------------------------------
find_package(MPI REQUIRED COMPONENTS C CXX)   # C: HDF5 is a C library

# ---- Kokkos -----------------------------------------------------------------
find_package(Kokkos 3.4 REQUIRED)
# Debian 12 (libtrilinos-kokkos-dev 13.2.0-4) exports Kokkos::kokkos with
# INTERFACE_INCLUDE_DIRECTORIES=/usr/lib/include, which does not exist; the
# headers live in Kokkos_INCLUDE_DIRS (/usr/include/trilinos). Repair only when
# the recorded path is missing, so a Spack Kokkos 4.x target is left alone.
get_target_property(_wlb4d_kk_inc Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
set(_wlb4d_kk_broken FALSE)
foreach(_d IN LISTS _wlb4d_kk_inc)
  if(NOT _d MATCHES "^\\$<" AND NOT EXISTS "${_d}")
    set(_wlb4d_kk_broken TRUE)
  endif()
endforeach()
if(_wlb4d_kk_broken)
  message(STATUS "wlb4d: repairing Kokkos::kokkos include dirs (${_wlb4d_kk_inc} -> ${Kokkos_INCLUDE_DIRS})")
  set_target_properties(Kokkos::kokkos PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${Kokkos_INCLUDE_DIRS}")
endif()
add_library(wlb4d_kokkos INTERFACE)
target_link_libraries(wlb4d_kokkos INTERFACE Kokkos::kokkos)
add_library(wlb4d::kokkos ALIAS wlb4d_kokkos)
kokkos_check(DEVICES Cuda RETURN_VALUE WLB4D_KOKKOS_HAS_CUDA)
if(WLB4D_ENABLE_CUDA AND NOT WLB4D_KOKKOS_HAS_CUDA)
  message(WARNING "WLB4D_ENABLE_CUDA=ON but Kokkos ${Kokkos_VERSION} has no CUDA backend: "
                  "kernels run on the host; only the NCCL backend of wlb::comm is compiled for CUDA.")
endif()
message(STATUS "wlb4d: Kokkos ${Kokkos_VERSION} devices: ${Kokkos_DEVICES}")

# ---- KokkosKernels ------------------------------------------------------------
find_package(KokkosKernels REQUIRED)          # Debian ships no version file: no version here
add_library(wlb4d_kokkoskernels INTERFACE)
if(TARGET Kokkos::kokkoskernels)
  target_link_libraries(wlb4d_kokkoskernels INTERFACE Kokkos::kokkoskernels)
else()
  target_include_directories(wlb4d_kokkoskernels SYSTEM INTERFACE ${KokkosKernels_INCLUDE_DIRS})
  target_link_libraries(wlb4d_kokkoskernels INTERFACE ${KokkosKernels_LIBRARIES} ${KokkosKernels_TPL_LIBRARIES})
endif()
target_link_libraries(wlb4d_kokkoskernels INTERFACE wlb4d::kokkos)
add_library(wlb4d::kokkoskernels ALIAS wlb4d_kokkoskernels)

# ---- parallel HDF5 --------------------------------------------------------------
set(HDF5_PREFER_PARALLEL TRUE)
find_package(HDF5 REQUIRED COMPONENTS C)
if(NOT HDF5_IS_PARALLEL)
  message(FATAL_ERROR "wlb4d needs parallel HDF5 (MPI-IO) for collective checkpoints; "
                      "found a serial HDF5 (${HDF5_C_COMPILER_EXECUTABLE}). "
                      "Debian: apt-get install libhdf5-mpich-dev; Spack: hdf5+mpi.")
endif()
add_library(wlb4d_hdf5 INTERFACE)
if(TARGET HDF5::HDF5)
  target_link_libraries(wlb4d_hdf5 INTERFACE HDF5::HDF5)
else()
  target_include_directories(wlb4d_hdf5 SYSTEM INTERFACE ${HDF5_C_INCLUDE_DIRS} ${HDF5_INCLUDE_DIRS})
  target_link_libraries(wlb4d_hdf5 INTERFACE ${HDF5_C_LIBRARIES} ${HDF5_LIBRARIES})
  target_compile_definitions(wlb4d_hdf5 INTERFACE ${HDF5_C_DEFINITIONS} ${HDF5_DEFINITIONS})
endif()
add_library(wlb4d::hdf5 ALIAS wlb4d_hdf5)

# ---- Boost.Program_options, spdlog/fmt, nlohmann_json ---------------------------
find_package(Boost 1.74 REQUIRED COMPONENTS program_options)
find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)

# ---- sentencepiece (no CMake config upstream) ------------------------------------
find_package(PkgConfig REQUIRED)
pkg_check_modules(SPM REQUIRED IMPORTED_TARGET sentencepiece)
add_library(wlb4d_sentencepiece INTERFACE)
target_link_libraries(wlb4d_sentencepiece INTERFACE PkgConfig::SPM)
add_library(wlb4d::sentencepiece ALIAS wlb4d_sentencepiece)

# ---- PCRE2 (the byte-level BPE pre-tokenizer regexes: Unicode properties, JIT) ----
# pkg-config libpcre2-8 (Debian libpcre2-dev, Spack pcre2); a PCRE2 without
# its .pc file (built by hand) is found by header and library instead.
pkg_check_modules(PCRE2 QUIET IMPORTED_TARGET libpcre2-8)
add_library(wlb4d_pcre2 INTERFACE)
if(PCRE2_FOUND)
  target_link_libraries(wlb4d_pcre2 INTERFACE PkgConfig::PCRE2)
  message(STATUS "wlb4d: PCRE2 ${PCRE2_VERSION} (pkg-config libpcre2-8)")
else()
  find_path(WLB4D_PCRE2_INCLUDE_DIR pcre2.h)
  find_library(WLB4D_PCRE2_LIBRARY NAMES pcre2-8)
  if(NOT WLB4D_PCRE2_INCLUDE_DIR OR NOT WLB4D_PCRE2_LIBRARY)
    message(FATAL_ERROR "wlb4d needs PCRE2 (8-bit library, pcre2.h) for Hugging Face byte-level BPE tokenizers; "
                        "neither pkg-config libpcre2-8 nor pcre2.h + libpcre2-8 was found. "
                        "Debian: apt-get install libpcre2-dev; Spack: pcre2.")
  endif()
  target_include_directories(wlb4d_pcre2 SYSTEM INTERFACE ${WLB4D_PCRE2_INCLUDE_DIR})
  target_link_libraries(wlb4d_pcre2 INTERFACE ${WLB4D_PCRE2_LIBRARY})
  message(STATUS "wlb4d: PCRE2 ${WLB4D_PCRE2_LIBRARY}")
endif()
# pcre2.h declares one code-unit width's API per translation unit.
target_compile_definitions(wlb4d_pcre2 INTERFACE PCRE2_CODE_UNIT_WIDTH=8)
add_library(wlb4d::pcre2 ALIAS wlb4d_pcre2)

# ---- CUDA / NCCL (GPU path only) -------------------------------------------------
if(WLB4D_ENABLE_CUDA)
  find_package(CUDAToolkit REQUIRED)
  find_package(NCCL REQUIRED)
  add_library(wlb4d_nccl INTERFACE)
  target_link_libraries(wlb4d_nccl INTERFACE NCCL::NCCL CUDA::cudart)
  add_library(wlb4d::nccl ALIAS wlb4d_nccl)
  # cuBLAS directly (not only through Kokkos Kernels): the bf16 GEMMs call
  # cublasGemmEx, which Kokkos Kernels 4.7 does not reach for bhalf_t.
  add_library(wlb4d_cublas INTERFACE)
  target_link_libraries(wlb4d_cublas INTERFACE CUDA::cublas CUDA::cudart)
  target_compile_definitions(wlb4d_cublas INTERFACE WLB4D_HAVE_CUBLAS=1)
  add_library(wlb4d::cublas ALIAS wlb4d_cublas)
endif()

# ---- cuDNN + cudnn-frontend (model.attention_kernel = cudnn) ---------------------
#   wlb4d::cudnn          cuDNN (libcudnn, the 9.x loader) and cudnn-frontend's
#                         header-only C++ API; defines WLB4D_HAVE_CUDNN=1
# Found, not fetched: cudnn.h/libcudnn in CUDNN_ROOT or the CUDA toolkit (cuDNN
# 9.19 ships inside CUDA 13's toolkit here), cudnn_frontend.h in
# CUDNN_FRONTEND_DIR (its include/ folder or the folder above it).
if(WLB4D_ENABLE_CUDNN)
  if(NOT WLB4D_ENABLE_CUDA)
    message(FATAL_ERROR "WLB4D_ENABLE_CUDNN=ON needs WLB4D_ENABLE_CUDA=ON (cuDNN's attention runs on the GPU)")
  endif()
  # Default: the vendored release archive next to the checkout (../shared/vendor,
  # see its README), extracted once into the build tree.
  set(_cfe_archive "${PROJECT_SOURCE_DIR}/../shared/vendor/cudnn-frontend-1.23.0.tar.gz")
  set(_cfe_default "${CMAKE_BINARY_DIR}/_deps/cudnn-frontend-1.23.0/cudnn-frontend")
  set(CUDNN_FRONTEND_DIR "${_cfe_default}" CACHE PATH
      "cudnn-frontend checkout or extracted archive (the folder holding include/cudnn_frontend.h)")
  if(CUDNN_FRONTEND_DIR STREQUAL _cfe_default AND NOT EXISTS "${_cfe_default}/include/cudnn_frontend.h"
     AND EXISTS "${_cfe_archive}")
    file(ARCHIVE_EXTRACT INPUT "${_cfe_archive}" DESTINATION "${CMAKE_BINARY_DIR}/_deps/cudnn-frontend-1.23.0")
  endif()
  find_path(WLB4D_CUDNN_INCLUDE_DIR cudnn.h
            HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
  find_library(WLB4D_CUDNN_LIBRARY cudnn
               HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib64 lib)
  find_path(WLB4D_CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
            HINTS ${CUDNN_FRONTEND_DIR} PATH_SUFFIXES include NO_DEFAULT_PATH)
  if(NOT WLB4D_CUDNN_INCLUDE_DIR OR NOT WLB4D_CUDNN_LIBRARY)
    message(FATAL_ERROR "WLB4D_ENABLE_CUDNN: cuDNN not found (cudnn.h: ${WLB4D_CUDNN_INCLUDE_DIR}, libcudnn: "
                        "${WLB4D_CUDNN_LIBRARY}); set CUDNN_ROOT to its prefix")
  endif()
  if(NOT WLB4D_CUDNN_FRONTEND_INCLUDE_DIR)
    message(FATAL_ERROR "WLB4D_ENABLE_CUDNN: cudnn_frontend.h not found under CUDNN_FRONTEND_DIR="
                        "${CUDNN_FRONTEND_DIR}; extract ../shared/vendor/cudnn-frontend-1.23.0.tar.gz there or "
                        "point CUDNN_FRONTEND_DIR at a cudnn-frontend checkout")
  endif()
  add_library(wlb4d_cudnn INTERFACE)
  target_include_directories(wlb4d_cudnn SYSTEM INTERFACE ${WLB4D_CUDNN_INCLUDE_DIR} ${WLB4D_CUDNN_FRONTEND_INCLUDE_DIR})
  # NVRTC: cudnn-frontend 1.23's experimental kernel loader (compile_and_load_kernel,
  # instantiated by its headers) calls nvrtc*; without it the cuDNN build does not link.
  target_link_libraries(wlb4d_cudnn INTERFACE ${WLB4D_CUDNN_LIBRARY} CUDA::cudart CUDA::nvrtc ${CMAKE_DL_LIBS})
  add_library(wlb4d::cudnn ALIAS wlb4d_cudnn)
  message(STATUS "wlb4d: cuDNN ${WLB4D_CUDNN_LIBRARY}, cudnn-frontend ${WLB4D_CUDNN_FRONTEND_INCLUDE_DIR}")
endif()

# ---- tests ---------------------------------------------------------------------
if(WLB4D_ENABLE_TESTS)
  find_package(GTest REQUIRED)
endif()
if(WLB4D_ENABLE_BENCH)
  find_package(benchmark QUIET)
  if(NOT benchmark_FOUND)
    set(WLB4D_ENABLE_BENCH OFF)
  endif()
endif()
# Post-processing scripts need h5py/matplotlib, which only the system python has.
if(NOT Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python3_EXECUTABLE /usr/bin/python3)
endif()
find_package(Python3 COMPONENTS Interpreter)
