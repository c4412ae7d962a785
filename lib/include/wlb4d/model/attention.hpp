#pragma once
/// \file attention.hpp
/// \brief Document-masked attention, forward and backward, FlashAttention style.
///
/// Algorithm: FlashAttention-2 (T. Dao, "FlashAttention-2: Faster Attention
/// with Better Parallelism and Work Partitioning", ICLR 2024 / arXiv 2307.08691),
/// Algorithm 1 (forward: tiled, online softmax, saves only the per-row
/// log-sum-exp) and Algorithm 2 (backward: recomputes P from the saved lse,
/// uses D_i = rowsum(dO ∘ O)). The T × S score matrix is never stored; each
/// Kokkos team works on one tile with O(tile) scratch.
///
/// Mask. Query i attends key j iff kv_lo[i] <= j <= kv_hi[i] (inclusive).
/// For a packed micro-batch on one rank (documents given by cu_seqlens) the
/// caller sets kv_lo[i] = first token of i's document and kv_hi[i] = i; this is
/// the document-causal mask of DESIGN §5. With context parallelism the queries
/// are a subset of the (all-gathered) keys and kv_lo/kv_hi are in global key
/// order. Bounds are clamped to [0, S-1]; kv_lo[i] > kv_hi[i] is an empty row.
/// A key tile that no query of a query tile may attend is skipped, so the cost
/// follows Σ_documents d² rather than T·S.
///
/// Race freedom (no atomics). Forward: one team per (query head, query tile).
/// Backward: one team per (kv head, key tile) accumulates dK/dV over the query
/// tiles and the Hq/Hkv query heads that touch it; a second kernel, one team
/// per (query head, query tile), accumulates dQ. S and dP are therefore
/// recomputed once more than in FA-2's atomic-dQ variant (7 tile GEMMs in
/// backward instead of 5), which is the price of a deterministic, atomic-free
/// backward on every backend.
///
/// Layouts. All Views are LayoutRight in the default memory space (types.hpp):
///   q, out, dout, dq : [T][Hq][D]    T = this rank's query tokens
///   k, v, dk, dv     : [S][Hkv][D]   S = keys (S = T without CP)
///   lse              : [Hq][T]       natural-log log-sum-exp of the scaled scores
///   kv_lo, kv_hi     : [T] int32     inclusive key range of each query
/// GQA: query head h reads kv head h / (Hq / Hkv); Hq must be a multiple of Hkv.
/// D (head dim) is any positive size; it is padded to a multiple of 8 (fp32 without AVX,
/// fp64 with AVX), 16 (fp32 with AVX) or 4 (fp64 without AVX) in scratch.
///
/// Units. scale is the softmax temperature applied to q·k (normally
/// 1/sqrt(D)); lse is in the units of scale·q·k (nats).
///
/// Empty rows (no allowed key): out = 0, lse = -infinity, and the backward
/// gives exactly zero dq for that row and no contribution to dk/dv (no NaN).
///
/// Errors. Shape mismatches throw std::invalid_argument naming the argument
/// and the rule. Values of kv_lo/kv_hi are not checked (they live on the
/// device); they are clamped as described above.
///
/// Precision: Scalar = float or double (explicitly instantiated). All
/// arithmetic, including the softmax statistics, is in Scalar.
///
/// Backends: the functions below check shapes and run one of the kernels in
/// lib/src/model/attention/ (one file per backend, one interface:
/// attention/backend.hpp): the portable Kokkos team kernels (every execution
/// space), on a host execution space the BLAS-tile path (see
/// attention_summary()), or, when select_attention_kernel chose it on a
/// CUDA + cuDNN build, cuDNN's fused SDPA for fp32 calls (bf16 operands and
/// fp32 statistics inside; the mask becomes ragged batch entries with a
/// bottom-right causal mask, attention_ragged.hpp). The cuDNN kernel keeps the
/// contract above (out, lse [Hq][T] in nats, empty rows) to bf16 rounding.

#include "wlb4d/core/attention_kernel.hpp"
#include "wlb4d/core/types.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace wlb::model {

namespace detail {
/// Puts a parameter in a non-deduced context, so that Scalar is deduced from
/// the output Views only and non-const input Views convert to const ones.
template <class T> struct NoDeduce { using type = T; };
}  // namespace detail
template <class T> using no_deduce_t = typename detail::NoDeduce<T>::type;

/// Read-only device Views used for attention inputs.
template <class T> using CView1 = View1<const T>;
template <class T> using CView2 = View2<const T>;
template <class T> using CView3 = View3<const T>;
/// Host copy of kv_lo / kv_hi for the FLOP counter.
using HostCIntVec = Kokkos::View<const std::int32_t*, Layout, HostSpace>;

/// Forward pass (FA-2 Alg. 1).
/// \param q      [T][Hq][D]  queries (already RoPE-rotated)
/// \param k, v   [S][Hkv][D] keys / values
/// \param kv_lo, kv_hi [T]   inclusive key range per query (see file comment)
/// \param scale  softmax scale, normally 1/sqrt(D)
/// \param out    [T][Hq][D]  overwritten: softmax(scale·q·kᵀ, masked) · v
/// \param lse    [Hq][T]     overwritten: log Σ_j exp(scale·q_i·k_j); -inf if empty
/// \throws std::invalid_argument on inconsistent extents.
template <class Scalar>
void attention_forward(no_deduce_t<CView3<Scalar>> q, no_deduce_t<CView3<Scalar>> k,
                       no_deduce_t<CView3<Scalar>> v, CView1<std::int32_t> kv_lo,
                       CView1<std::int32_t> kv_hi, no_deduce_t<Scalar> scale, View3<Scalar> out,
                       View2<Scalar> lse);

/// Backward pass (FA-2 Alg. 2, atomic-free split into a dK/dV and a dQ kernel).
/// Allocates nothing: D_i = rowsum(dO ∘ O) is formed inside the kernels' tiles.
/// \param out, lse  the forward's outputs for the same q, k, v, mask, scale
/// \param dout      [T][Hq][D] gradient of the loss w.r.t. out
/// \param dq        [T][Hq][D] overwritten with dL/dq
/// \param dk, dv    [S][Hkv][D] overwritten with dL/dk, dL/dv (keys that no
///                  query attends get 0). With CP the caller reduce-scatters them.
/// \throws std::invalid_argument on inconsistent extents.
template <class Scalar>
void attention_backward(no_deduce_t<CView3<Scalar>> q, no_deduce_t<CView3<Scalar>> k,
                        no_deduce_t<CView3<Scalar>> v, no_deduce_t<CView3<Scalar>> out,
                        no_deduce_t<CView3<Scalar>> dout, no_deduce_t<CView2<Scalar>> lse,
                        CView1<std::int32_t> kv_lo, CView1<std::int32_t> kv_hi,
                        no_deduce_t<Scalar> scale, View3<Scalar> dq, View3<Scalar> dk,
                        View3<Scalar> dv);

/// Tile shape and per-team scratch (bytes) of the three attention kernels on ExecSpace for a
/// head dim (attention/tiled.hpp): 64 × 64 on the host at every head dim; on CUDA the first of
/// 32 queries × 16 keys and 16 × 8 whose three kernels fit the 48 KiB a GPU team gets by default
/// (fp32: 32 × 16 up to D = 64, 16 × 8 at D = 128). A kernel whose bytes exceed
/// level0_max_bytes uses level-1 (global-memory) scratch instead. Host function.
struct AttentionTiles {
  int queries = 0, keys = 0;  ///< tile rows (queries) and columns (keys)
  std::size_t forward_bytes = 0, dkdv_bytes = 0, dq_bytes = 0;
  std::size_t level0_max_bytes = 0;  ///< TeamPolicy::scratch_size_max(0) of ExecSpace
};
template <class Scalar> AttentionTiles attention_tiles(int head_dim);

/// Backward FLOPs per forward FLOP by the usual FlashAttention convention
/// (5 matmuls vs 2). The kernel actually performs 7 tile matmuls (see file
/// comment); GFLOP/s figures use this convention so they compare with FA-2's.
inline constexpr double kAttentionBackwardFlopFactor = 2.5;

/// Forward FLOPs of the two matmuls for the given mask:
/// 4 · D · Hq · #{(i, j) : max(kv_lo[i], 0) <= j <= min(kv_hi[i], S-1)}.
/// Softmax exponentials are not counted (FA-2 convention). Host function.
/// \param num_keys S; \param heads_q Hq; \param head_dim D.
/// \throws std::invalid_argument if kv_lo and kv_hi differ in length or a size is negative.
double attention_flops_forward(HostCIntVec kv_lo, HostCIntVec kv_hi, std::int64_t num_keys,
                               int heads_q, int head_dim);

/// attention_flops_forward × (1 + kAttentionBackwardFlopFactor): forward + backward.
double attention_flops_forward_backward(HostCIntVec kv_lo, HostCIntVec kv_hi,
                                        std::int64_t num_keys, int heads_q, int head_dim);

/// Which kernel the two functions above run in this process, one line for
/// the start-up log: on a host execution space the tile products go to the
/// BLAS (attention.cpp, host_blas_tiles) unless OpenBLAS runs a kernel whose
/// SIMD level is below the portable kernel's (its generic SSE3 "Prescott"
/// fallback), where the portable register-blocked team kernel (the one CUDA
/// runs) is faster. Host function; decided once per process.
std::string attention_summary();

/// The portable kernel's part of attention_summary() (which host path, which
/// tiles), whatever kernel is selected.
std::string attention_portable_summary();

/// Applies model.attention_kernel (auto | portable | cudnn) for this process:
/// resolves it with core::resolve_attention_kernel for the model's head dim
/// and train.precision, and makes the chosen kernel the one attention_forward
/// and attention_backward run from now on (fp32 calls; fp64 calls always run
/// the portable kernel). Until it is called the portable kernel runs, so a
/// library user or a test that never selects gets today's numerics.
/// attention_summary() then names the kernel and why it was chosen.
/// 	hrows core::ConfigError as resolve_attention_kernel does (cudnn on a build
///   without cuDNN, or for a head dim cuDNN does not take).
core::AttentionKernelChoice select_attention_kernel(const std::string& requested, int head_dim,
                                                    const std::string& precision);

/// "portable" or "cudnn": the kernel select_attention_kernel chose (portable before).
std::string attention_kernel_in_use();

/// How many cuDNN backward graphs this process built without cuDNN's
/// deterministic algorithm: where cuDNN refuses it for the shape or device
/// (e.g. ragged layouts on sm_8x/sm_12x with cuDNN >= 9.18.1), or where its
/// workspace would not fit the device (it grows with batch x heads x
/// s_q x s_kv of the bucket). Each is also a warning. 0 on builds without
/// cuDNN, and whenever every backward rerun gives the same bits.
std::int64_t attention_nondeterministic_graphs();

/// After a run: what the cuDNN kernel's graph cache did, e.g. "attention:
/// cuDNN graphs: 12 built in 4310 ms (359 ms each on average), 788 of 800
/// calls served from the cache, 0 evicted; 0 non-deterministic backward
/// graphs". Shape bucketing (attention_ragged.hpp) keeps the count low:
/// each build costs what many calls do. "" where the cuDNN kernel never ran.
std::string attention_cache_report();

}  // namespace wlb::model
