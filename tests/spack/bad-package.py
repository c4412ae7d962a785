# Self-test input of tests/spack/check_spack_recipe.py (ctest spack_recipe_selftest):
# a broken copy of spack/packages/wlb4d/package.py; every marked line holds a
# mistake the checker must report. Never loaded by Spack.
from spack_repo.builtin.build_systems.cmake import CMakePackage
from spack_repo.builtin.build_systems.cuda import CudaPackage
from spack_repo.builtin.build_systems.rocm import ROCmPackage      # not in build_systems

from spack.package import *


class Wlb4d(CMakePackage, CudaPackage, ROCmPackage):
    """wlb4d with mistakes."""

    git = "file:///nonexistent"
    version("main", branch="main")

    variant("openmp", default=False, description="Kokkos OpenMP host backend")

    depends_on("cxx", type="build")
    depends_on("mpich@4.1:")                            # one MPI implementation, no virtual mpi
    depends_on("hdf5@1.14 ~mpi +hl")                    # serial HDF5
    depends_on("boost@1.74: +program_options cxxstd=17")
    depends_on("kokkos@4.6.02:4.7 +serial")             # not spack.yaml's range
    depends_on("kokkos-kernels@4.7 +serial +openblas")  # no such variant; spack.yaml's +blas missing
    depends_on("pytorch")                               # not a Spack package we know
    depends_on("spdlog", when="+mkl")                   # the recipe has no variant mkl
    depends_on("fmt", type="compile")                   # no such dependency type
    extends("python")                                   # not an allowed directive

    with when("+cuda"):
        depends_on("kokkos +cuda")                      # no +wrapper, no +cuda_lambda; nccl missing
        depends_on("kokkos-kernels +cuda +cublas")

    def cmake_args(self):
        return [
            self.define_from_variant("WLB4D_ENABLE_GPU", "cuda"),          # not a project option
            self.define_from_variant("WLB4D_ENABLE_BENCH", "benchmarks"),  # no such variant
        ]
