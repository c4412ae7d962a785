# Spack recipe for wlb4d (ctest spack_recipe checks it without Spack: every
# package, variant and CMake option named here must exist, and the dependency
# constraints must agree with ../../../spack.yaml).
#
#   spack repo add spack
#   spack install wlb4d+cuda cuda_arch=90          # GPU nodes (H100/H200)
#   spack install wlb4d+openmp                     # CPU nodes, hybrid MPI + OpenMP
#   spack install --test=root wlb4d                # also builds and runs ctest -LE gpu
#
# Sources: spack/spack-packages (builtin) recipes of kokkos, kokkos-kernels,
# hdf5, nccl, mpich (see tests/spack/spack_packages.json for the commits).
import os

from spack_repo.builtin.build_systems.cmake import CMakePackage
from spack_repo.builtin.build_systems.cuda import CudaPackage

from spack.package import *

# The checkout this recipe lives in: spack/packages/wlb4d/package.py -> top.
_CHECKOUT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)


class Wlb4d(CMakePackage, CudaPackage):
    """4D-parallel (dp, pp, cp, tp) training of Llama-style models with WLB-LLM
    document balancing, on MPI and Kokkos (CPU or CUDA + NCCL)."""

    # The project has no public URL yet, so there is no `homepage` and no
    # `maintainers` (Spack wants GitHub handles): the checkout is the home,
    # its README.md the documentation. Add both when the repository is
    # published; `spack info wlb4d` then links them.
    license("BSD-3-Clause")  # ../../../LICENSE

    # No releases: `main` is the branch of the checkout that holds this
    # recipe. `spack develop --path . wlb4d@main` builds the working tree.
    git = "file://" + _CHECKOUT
    version("main", branch="main")

    variant("openmp", default=False, description="Kokkos OpenMP host backend (hybrid MPI + OpenMP)")
    variant("bench", default=False, description="Google Benchmark kernels in bench/")
    variant("native", default=False,
            description="-march=native host kernels (WLB4D_NATIVE_ARCH; off: portable across nodes)")
    variant("cudnn", default=False,
            description="cuDNN fused attention through cudnn-frontend (model.attention_kernel=cudnn; needs +cuda)")
    variant("scripts", default=False,
            description="Python, h5py and matplotlib at run time for scripts/plot_timing.py")

    depends_on("c", type="build")                  # HDF5 and MPI are C libraries
    depends_on("cxx", type="build")
    depends_on("cmake@3.22:", type="build")
    depends_on("pkgconfig", type="build")          # sentencepiece and pcre2 are found with pkg-config

    # Any MPI: mpich is only the default provider (spack.yaml packages:all:providers),
    # so a site's cray-mpich or openmpi external concretizes.
    depends_on("mpi")
    depends_on("hdf5@1.14 +mpi +hl")               # collective checkpoints (parallel HDF5)
    depends_on("boost@1.74: +program_options cxxstd=17")
    depends_on("kokkos@4.7.02:4.7 +serial")        # CUDA 13 needs kokkos@4.7.01: (recipe conflict)
    depends_on("kokkos-kernels@4.7 +serial +blas scalars=float,double")   # KokkosBlas::gemm
    depends_on("sentencepiece")
    depends_on("pcre2@10.30: +jit")                # byte-level BPE (tokenizer.json) pre-tokenizer regexes
    depends_on("spdlog")
    depends_on("fmt")
    depends_on("nlohmann-json@3.10:")
    depends_on("googletest", type="test")
    depends_on("benchmark", when="+bench")

    with when("+openmp"):
        depends_on("kokkos +openmp")
        depends_on("kokkos-kernels +openmp")

    with when("+cuda"):
        # kokkos +cuda with GCC needs nvcc_wrapper; kokkos-kernels@4 +cuda needs
        # kokkos +cuda_lambda; kokkos takes exactly one cuda_arch.
        depends_on("kokkos +cuda +wrapper +cuda_lambda")
        depends_on("kokkos-kernels +cuda +cublas")
        depends_on("nccl +cuda")                   # NCCL backend of wlb::comm
    for _arch in CudaPackage.cuda_arch_values:
        depends_on(f"kokkos +cuda cuda_arch={_arch}", when=f"+cuda cuda_arch={_arch}")
        depends_on(f"kokkos-kernels +cuda cuda_arch={_arch}", when=f"+cuda cuda_arch={_arch}")
        depends_on(f"nccl +cuda cuda_arch={_arch}", when=f"+cuda cuda_arch={_arch}")
    conflicts("cuda_arch=none", when="+cuda", msg="wlb4d+cuda: give one cuda_arch (e.g. cuda_arch=90)")
    # cuDNN's SDPA with ragged offsets, a padding mask and bottom-right causal
    # alignment on Hopper needs cuDNN 9.10 or newer (cudnn-frontend 1.23
    # sdpa_support_surface.h). cudnn-frontend itself is header-only and not a
    # Spack package: CUDNN_FRONTEND_DIR in the environment names its checkout.
    conflicts("+cudnn", when="~cuda", msg="wlb4d+cudnn: cuDNN's attention runs on the GPU; add +cuda")
    depends_on("cudnn@9.10:", when="+cudnn")

    with when("+scripts"):
        depends_on("python@3.8:", type="run")
        depends_on("py-h5py +mpi", type="run")
        depends_on("py-matplotlib", type="run")

    def cmake_args(self):
        args = [
            self.define_from_variant("WLB4D_ENABLE_CUDA", "cuda"),
            self.define_from_variant("WLB4D_ENABLE_BENCH", "bench"),
            self.define_from_variant("WLB4D_NATIVE_ARCH", "native"),
            self.define("WLB4D_ENABLE_TESTS", self.run_tests),
            self.define("WLB4D_WERROR", False),
        ]
        if self.spec.satisfies("+cuda"):
            # nvcc_wrapper as the C++ compiler, as for other Kokkos dependents.
            args.append(self.define("CMAKE_CXX_COMPILER", self["kokkos"].kokkos_cxx))
            args.append(self.define("NCCL_ROOT", self.spec["nccl"].prefix))
        args.append(self.define_from_variant("WLB4D_ENABLE_CUDNN", "cudnn"))
        if self.spec.satisfies("+cudnn"):
            args.append(self.define("CUDNN_ROOT", self.spec["cudnn"].prefix))
            if os.environ.get("CUDNN_FRONTEND_DIR"):
                args.append(self.define("CUDNN_FRONTEND_DIR", os.environ["CUDNN_FRONTEND_DIR"]))
        return args

    def check(self):
        # The GPU tests need a device; the Slurm tests a slurmctld (they skip).
        with working_dir(self.build_directory):
            ctest("--output-on-failure", "-LE", "gpu")
