/// \file attention.cpp
/// \brief Document-masked FlashAttention-2 forward/backward (see attention.hpp):
/// the shape checks and the choice of backend. The kernels live one backend
/// per file in attention/ behind the interface of attention/backend.hpp:
/// kokkos_tiled.cpp (portable Kokkos team kernels, every execution space) and
/// host_blas.cpp (host: tile products through the BLAS).

#include "wlb4d/model/attention.hpp"

#include "wlb4d/core/attention_kernel.hpp"
#include "wlb4d/core/blas_info.hpp"

#include "attention/backend.hpp"

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace wlb::model {
namespace attn_impl {

template <class Scalar>
Dims check_dims(const char* fn, const View3<const Scalar>& q, const View3<const Scalar>& k,
                const View3<const Scalar>& v, const View1<const std::int32_t>& kv_lo,
                const View1<const std::int32_t>& kv_hi) {
  auto fail = [fn](const std::string& what) {
    throw std::invalid_argument(std::string(fn) + ": " + what);
  };
  Dims d{static_cast<int>(q.extent(0)), static_cast<int>(k.extent(0)),
         static_cast<int>(q.extent(1)), static_cast<int>(k.extent(1)),
         static_cast<int>(q.extent(2))};
  if (k.extent(2) != q.extent(2) || v.extent(2) != q.extent(2))
    fail("head dim D differs between q, k, v (" + std::to_string(q.extent(2)) + ", " +
         std::to_string(k.extent(2)) + ", " + std::to_string(v.extent(2)) + ")");
  if (v.extent(0) != k.extent(0) || v.extent(1) != k.extent(1))
    fail("v must have the shape [S][Hkv][D] of k");
  if (d.Hkv <= 0 || d.Hq % d.Hkv != 0)
    fail("query heads Hq=" + std::to_string(d.Hq) + " must be a positive multiple of kv heads Hkv=" +
         std::to_string(d.Hkv));
  if (d.D <= 0) fail("head dim D must be positive");
  if (kv_lo.extent(0) != q.extent(0) || kv_hi.extent(0) != q.extent(0))
    fail("kv_lo and kv_hi must have one entry per query token (T=" + std::to_string(d.T) + ")");
  return d;
}

template <class V, class W>
void check_same3(const char* fn, const char* name, const V& x, const W& ref, const char* refname) {
  if (x.extent(0) != ref.extent(0) || x.extent(1) != ref.extent(1) || x.extent(2) != ref.extent(2))
    throw std::invalid_argument(std::string(fn) + ": " + name + " must have the shape of " +
                                refname);
}

#ifdef WLB4D_ATTN_HOST_BLAS
/// Whether the host path hands the tile products to the BLAS. Measured
/// (bench/attention_bench, 1 x 1024 tokens, D = 64, 4 heads, one core, CPU
/// time): the portable kernel (AVX2 register blocks) 52 ms whatever the BLAS;
/// BLAS tiles 82 ms with OpenBLAS's generic SSE3 kernel (Prescott, the one
/// Debian 12's OpenBLAS falls back to on CPUs newer than itself) and 24 ms
/// with its SkylakeX kernel. So the BLAS is used unless OpenBLAS reports a
/// kernel whose SIMD level is below the portable kernel's; decided once per
/// process (the same environment always takes the same path).
/// The environment variable WLB4D_ATTENTION_PATH=portable|blas overrides
/// the choice (to compare both paths on one machine, as WLB4D_NO_SBGEMM does
/// for the bf16 GEMMs); auto or unset: the rule above.
inline bool host_blas_tiles() {
#ifdef WLB4D_ATTENTION_FORCE_BLAS
  return true;
#else
#if defined(__AVX2__)
  constexpr core::SimdLevel portable = core::SimdLevel::Avx2;
#elif defined(__AVX__)
  constexpr core::SimdLevel portable = core::SimdLevel::Avx;
#else
  constexpr core::SimdLevel portable = core::SimdLevel::Sse;
#endif
  static const bool use = [] {
    const char* e = std::getenv("WLB4D_ATTENTION_PATH");
    const std::string v = e ? e : "";
    if (v == "portable") return false;
    if (v == "blas") return true;
    if (!v.empty() && v != "auto")
      throw std::invalid_argument("WLB4D_ATTENTION_PATH=" + v +
                                  ": must be auto, portable or blas (the attention kernel's host path)");
    const core::BlasInfo b = core::probe_blas();
    return !b.openblas || b.kernel == core::SimdLevel::Unknown || b.kernel >= portable;
  }();
  return use;
#endif
}
#endif

/// The kernel selected by select_attention_kernel (model.attention_kernel);
/// portable until it is called. One per process: every call of a run uses it.
struct Selection {
  bool cudnn = false;
  std::string why = "default: portable until model.attention_kernel is applied";
};
inline Selection& selection() {
  static Selection s;
  return s;
}

/// Whether this call runs cuDNN: selected, fp32, and a head dim it takes
/// (checked once at selection for the model's head dim; a call with another
/// head dim runs the portable kernel).
template <class Scalar>
bool use_cudnn(const Dims& dm) {
#ifdef WLB4D_HAVE_CUDNN
  return std::is_same<Scalar, float>::value && selection().cudnn && core::cudnn_head_dim_issue(dm.D).empty();
#else
  (void)dm;
  return false;
#endif
}

}  // namespace attn_impl

// ------------------------------------------------------------ public API --

core::AttentionKernelChoice select_attention_kernel(const std::string& requested, int head_dim,
                                                    const std::string& precision) {
  core::AttentionKernelChoice c =
      core::resolve_attention_kernel(requested, head_dim, precision, core::cudnn_attention_built());
  attn_impl::selection().cudnn = c.kernel == "cudnn";
  attn_impl::selection().why = c.why;
  return c;
}

std::string attention_kernel_in_use() { return attn_impl::selection().cudnn ? "cudnn" : "portable"; }

template <class Scalar>
void attention_forward(no_deduce_t<CView3<Scalar>> q, no_deduce_t<CView3<Scalar>> k,
                       no_deduce_t<CView3<Scalar>> v, CView1<std::int32_t> kv_lo,
                       CView1<std::int32_t> kv_hi, no_deduce_t<Scalar> scale, View3<Scalar> out,
                       View2<Scalar> lse) {
  using namespace attn_impl;
  const Dims dm = check_dims("attention_forward", q, k, v, kv_lo, kv_hi);
  check_same3("attention_forward", "out", out, q, "q [T][Hq][D]");
  if (lse.extent(0) != q.extent(1) || lse.extent(1) != q.extent(0))
    throw std::invalid_argument("attention_forward: lse must be [Hq][T]");
  if (dm.T == 0 || dm.Hq == 0) return;
#ifdef WLB4D_HAVE_CUDNN
  if constexpr (std::is_same<Scalar, float>::value) {
    if (use_cudnn<Scalar>(dm)) return cudnn_sdpa::forward(q, k, v, kv_lo, kv_hi, scale, out, lse, dm);
  }
#endif
#ifdef WLB4D_ATTN_HOST_BLAS
  if (host_blas_tiles()) return host_blas::forward<Scalar>(q, k, v, kv_lo, kv_hi, scale, out, lse, dm);
#endif
  tiled::forward<Scalar>(q, k, v, kv_lo, kv_hi, scale, out, lse, dm);
}

template <class Scalar>
void attention_backward(no_deduce_t<CView3<Scalar>> q, no_deduce_t<CView3<Scalar>> k,
                        no_deduce_t<CView3<Scalar>> v, no_deduce_t<CView3<Scalar>> out,
                        no_deduce_t<CView3<Scalar>> dout, no_deduce_t<CView2<Scalar>> lse,
                        CView1<std::int32_t> kv_lo, CView1<std::int32_t> kv_hi,
                        no_deduce_t<Scalar> scale, View3<Scalar> dq, View3<Scalar> dk,
                        View3<Scalar> dv) {
  using namespace attn_impl;
  const char* fn = "attention_backward";
  const Dims dm = check_dims(fn, q, k, v, kv_lo, kv_hi);
  check_same3(fn, "out", out, q, "q [T][Hq][D]");
  check_same3(fn, "dout", dout, q, "q [T][Hq][D]");
  check_same3(fn, "dq", dq, q, "q [T][Hq][D]");
  check_same3(fn, "dk", dk, k, "k [S][Hkv][D]");
  check_same3(fn, "dv", dv, k, "k [S][Hkv][D]");
  if (lse.extent(0) != q.extent(1) || lse.extent(1) != q.extent(0))
    throw std::invalid_argument("attention_backward: lse must be [Hq][T]");
#ifdef WLB4D_HAVE_CUDNN
  if constexpr (std::is_same<Scalar, float>::value) {
    if (use_cudnn<Scalar>(dm))
      return cudnn_sdpa::backward(q, k, v, out, dout, lse, kv_lo, kv_hi, scale, dq, dk, dv, dm);
  }
#endif
#ifdef WLB4D_ATTN_HOST_BLAS
  if (host_blas_tiles())
    return host_blas::backward<Scalar>(q, k, v, out, dout, lse, kv_lo, kv_hi, scale, dq, dk, dv, dm);
#endif
  tiled::backward<Scalar>(q, k, v, out, dout, lse, kv_lo, kv_hi, scale, dq, dk, dv, dm);
}

double attention_flops_forward(HostCIntVec kv_lo, HostCIntVec kv_hi, std::int64_t num_keys,
                               int heads_q, int head_dim) {
  if (kv_lo.extent(0) != kv_hi.extent(0))
    throw std::invalid_argument("attention_flops_forward: kv_lo and kv_hi differ in length");
  if (num_keys < 0 || heads_q < 0 || head_dim < 0)
    throw std::invalid_argument("attention_flops_forward: sizes must be non-negative");
  double pairs = 0;
  for (std::size_t i = 0; i < kv_lo.extent(0); ++i) {
    const std::int64_t lo = kv_lo(i) < 0 ? 0 : kv_lo(i);
    const std::int64_t hi = kv_hi(i) > num_keys - 1 ? num_keys - 1 : kv_hi(i);
    if (hi >= lo) pairs += static_cast<double>(hi - lo + 1);
  }
  return 4.0 * head_dim * heads_q * pairs;
}

double attention_flops_forward_backward(HostCIntVec kv_lo, HostCIntVec kv_hi,
                                        std::int64_t num_keys, int heads_q, int head_dim) {
  return (1.0 + kAttentionBackwardFlopFactor) *
         attention_flops_forward(kv_lo, kv_hi, num_keys, heads_q, head_dim);
}

std::int64_t attention_nondeterministic_graphs() {
#ifdef WLB4D_HAVE_CUDNN
  return attn_impl::cudnn_sdpa::nondeterministic_graphs();
#else
  return 0;
#endif
}

std::string attention_cache_report() {
#ifdef WLB4D_HAVE_CUDNN
  return attn_impl::cudnn_sdpa::cache_report();
#else
  return "";
#endif
}

std::string attention_summary() {
  const std::string why = " [" + attn_impl::selection().why + "]";
#ifdef WLB4D_HAVE_CUDNN
  if (attn_impl::selection().cudnn)
    return "attention: cuDNN fused SDPA, " + attn_impl::cudnn_sdpa::versions() +
           " (bf16 operands, fp32 statistics, ragged documents, bottom-right causal)" + why;
#endif
  return attention_portable_summary() + why;
}

std::string attention_portable_summary() {
  const AttentionTiles tiled = attn_impl::tiled::tiles<float>(64);
#ifdef WLB4D_ATTN_HOST_BLAS
  const char* e = std::getenv("WLB4D_ATTENTION_PATH");
  const std::string why = e && *e && std::string(e) != "auto" ? std::string(", WLB4D_ATTENTION_PATH=") + e : "";
  if (attn_impl::host_blas_tiles()) {
    const AttentionTiles host = attn_impl::host_blas::tiles<float>(64);
    return "attention: portable kernel, host BLAS path: tile products via the BLAS (" +
           std::to_string(host.queries) + " x " + std::to_string(host.keys) +
           " blocks, FA-2 backward with 5 GEMMs" + why + ")";
  }
  return "attention: portable team kernel (" + std::to_string(tiled.queries) + " x " + std::to_string(tiled.keys) +
         " tiles" + (why.empty() ? "; the BLAS kernel " + core::probe_blas().core + " is below its SIMD level" : why) +
         ")";
#else
  return "attention: portable team kernel on " + std::string(ExecSpace::name()) + " (" +
         std::to_string(tiled.queries) + " x " + std::to_string(tiled.keys) + " tiles)";
#endif
}

template <class Scalar>
AttentionTiles attention_tiles(int head_dim) {
#ifdef WLB4D_ATTN_HOST_BLAS
  if (attn_impl::host_blas_tiles()) return attn_impl::host_blas::tiles<Scalar>(head_dim);
#endif
  return attn_impl::tiled::tiles<Scalar>(head_dim);
}

#define WLB4D_INSTANTIATE_ATTENTION(S)                                                        \
  template void attention_forward<S>(CView3<S>, CView3<S>, CView3<S>, CView1<std::int32_t>,  \
                                     CView1<std::int32_t>, S, View3<S>, View2<S>);           \
  template void attention_backward<S>(CView3<S>, CView3<S>, CView3<S>, CView3<S>, CView3<S>, \
                                      CView2<S>, CView1<std::int32_t>, CView1<std::int32_t>, \
                                      S, View3<S>, View3<S>, View3<S>);              \
  template AttentionTiles attention_tiles<S>(int);
WLB4D_INSTANTIATE_ATTENTION(float)
WLB4D_INSTANTIATE_ATTENTION(double)
#undef WLB4D_INSTANTIATE_ATTENTION

}  // namespace wlb::model
