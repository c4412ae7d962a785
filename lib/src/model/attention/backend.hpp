// The attention backends behind attention.hpp (internal header).
//
// attention.cpp checks the shapes (Dims) and picks a backend per call; each
// backend is a namespace of wlb::model::attn_impl with the same three
// functions, defined and instantiated for float and double in its own file:
//
//   template <class Scalar> void forward(q, k, v, kv_lo, kv_hi, scale, out, lse, const Dims&);
//   template <class Scalar> void backward(q, k, v, out, dout, lse, kv_lo, kv_hi, scale, dq, dk, dv,
//                                         const Dims&);
//   template <class Scalar> AttentionTiles tiles(int head_dim);
//
// with attention_forward/attention_backward's contract on checked inputs
// (forward is not called for T = 0 or Hq = 0). Backends:
//   tiled      attention/kokkos_tiled.cpp  portable Kokkos team kernels (every
//              execution space; the one CUDA runs)
//   host_blas  attention/host_blas.cpp     host execution spaces: the tile
//              products go to the BLAS (compiled when WLB4D_ATTN_HOST_BLAS)
//   cudnn_sdpa attention/cudnn_sdpa.cpp    cuDNN's fused SDPA (fp32 only; compiled
//              when WLB4D_HAVE_CUDNN), chosen by model.attention_kernel
// The kernels are free functions of named namespaces with external linkage:
// nvcc accepts no extended lambda in a private member or an unnamed namespace.
#pragma once

#include "wlb4d/core/kokkos_compat.hpp"
#include "wlb4d/model/attention.hpp"

#include <KokkosKernels_config.h>

#include <cstddef>
#include <cstdint>

// Host path (host_blas): the tile products go to the BLAS when the default
// execution space is a host space, KokkosKernels has the BLAS TPL and the BLAS
// kernel is not below the instruction set of the portable kernel
// (host_blas_tiles() in attention.cpp). WLB4D_ATTENTION_PORTABLE compiles the
// portable team kernel only (the one CUDA runs) and WLB4D_ATTENTION_FORCE_BLAS
// the BLAS path whatever the kernel, so the host tests cover both paths.
#if defined(KOKKOSKERNELS_ENABLE_TPL_BLAS) && !defined(WLB4D_ATTENTION_PORTABLE) && \
    !defined(KOKKOS_ENABLE_CUDA) && !defined(KOKKOS_ENABLE_HIP) && !defined(KOKKOS_ENABLE_SYCL) && \
    !defined(KOKKOS_ENABLE_OPENMPTARGET)
#define WLB4D_ATTN_HOST_BLAS 1
#endif

namespace wlb::model::attn_impl {

using Policy = Kokkos::TeamPolicy<ExecSpace>;
using Member = Policy::member_type;
template <class T>
using Scratch = Kokkos::View<T*, ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;

/// Shapes common to forward and backward, checked on the host.
struct Dims {
  int T, S, Hq, Hkv, D;
};

// Larger than any key index; a literal because std::numeric_limits is not
// callable in CUDA device code without --expt-relaxed-constexpr.
constexpr int kNoKey = 0x7fffffff;

/// [min lo, max hi] over the non-empty rows (jmin > jmax if all are empty).
KOKKOS_INLINE_FUNCTION void key_span(const int* lo, const int* hi, int n, int& jmin, int& jmax) {
  jmin = kNoKey;
  jmax = -1;
  for (int r = 0; r < n; ++r) {
    if (lo[r] > hi[r]) continue;
    jmin = wlb::kmath::min(jmin, lo[r]);
    jmax = wlb::kmath::max(jmax, hi[r]);
  }
}

/// Level-0 (fast, on-chip) scratch if the tiles fit, else level 1 (see
/// attention/tiled.hpp and kokkos_tiled.cpp for what fits where).
inline int scratch_level(std::size_t bytes) {
  return bytes <= static_cast<std::size_t>(Policy::scratch_size_max(0)) ? 0 : 1;
}

#define WLB4D_ATTENTION_BACKEND(ns)                                                                           \
  namespace ns {                                                                                              \
  template <class Scalar>                                                                                     \
  void forward(View3<const Scalar> q, View3<const Scalar> k, View3<const Scalar> v,                           \
               View1<const std::int32_t> kv_lo, View1<const std::int32_t> kv_hi, Scalar scale,                \
               View3<Scalar> out, View2<Scalar> lse, const Dims& dm);                                         \
  template <class Scalar>                                                                                     \
  void backward(View3<const Scalar> q, View3<const Scalar> k, View3<const Scalar> v,                          \
                View3<const Scalar> out, View3<const Scalar> dout, View2<const Scalar> lse,                   \
                View1<const std::int32_t> kv_lo, View1<const std::int32_t> kv_hi, Scalar scale,               \
                View3<Scalar> dq, View3<Scalar> dk, View3<Scalar> dv, const Dims& dm);                        \
  template <class Scalar>                                                                                     \
  AttentionTiles tiles(int head_dim);                                                                         \
  }

WLB4D_ATTENTION_BACKEND(tiled)
#ifdef WLB4D_ATTN_HOST_BLAS
WLB4D_ATTENTION_BACKEND(host_blas)
#endif
#undef WLB4D_ATTENTION_BACKEND

#ifdef WLB4D_HAVE_CUDNN
/// cuDNN's fused SDPA through cudnn-frontend (attention/cudnn_sdpa.cpp, built
/// with WLB4D_ENABLE_CUDNN on a CUDA build): fp32 in and out, bf16 operands
/// inside, fp32 statistics. fp32 only (fp64 calls run the tiled kernel); the
/// head dim must pass core::cudnn_head_dim_issue.
namespace cudnn_sdpa {
void forward(View3<const float> q, View3<const float> k, View3<const float> v, View1<const std::int32_t> kv_lo,
             View1<const std::int32_t> kv_hi, float scale, View3<float> out, View2<float> lse, const Dims& dm);
void backward(View3<const float> q, View3<const float> k, View3<const float> v, View3<const float> out,
              View3<const float> dout, View2<const float> lse, View1<const std::int32_t> kv_lo,
              View1<const std::int32_t> kv_hi, float scale, View3<float> dq, View3<float> dk, View3<float> dv,
              const Dims& dm);
/// "cuDNN 9.19.0 (cudnn-frontend 1.23.0)": the library this process loaded.
std::string versions();
/// Backward graphs built without the deterministic algorithm (attention.hpp).
std::int64_t nondeterministic_graphs();
/// attention.hpp's attention_cache_report() ("" before the first call).
std::string cache_report();
}  // namespace cudnn_sdpa
#endif

/// Explicit instantiations of a backend's three functions (in its .cpp).
#define WLB4D_INSTANTIATE_ATTENTION_BACKEND(S)                                                                \
  template void forward<S>(View3<const S>, View3<const S>, View3<const S>, View1<const std::int32_t>,         \
                           View1<const std::int32_t>, S, View3<S>, View2<S>, const Dims&);                    \
  template void backward<S>(View3<const S>, View3<const S>, View3<const S>, View3<const S>, View3<const S>,   \
                            View2<const S>, View1<const std::int32_t>, View1<const std::int32_t>, S,          \
                            View3<S>, View3<S>, View3<S>, const Dims&);                                       \
  template AttentionTiles tiles<S>(int);

}  // namespace wlb::model::attn_impl
