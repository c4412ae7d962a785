#pragma once
/// \file layers.hpp
/// \brief Forward and hand-written backward kernels of the Llama-style decoder
/// layers other than attention (attention.hpp): linear, token embedding,
/// RMSNorm, RoPE, SwiGLU and vocab-parallel cross-entropy.
///
/// Conventions shared by every function here:
/// - All Views are LayoutRight in the default memory space (core/types.hpp).
///   `T` is the number of tokens of the micro-batch, always passed
///   explicitly: a View may be longer than T (workspaces have a capacity);
///   only rows [0, T) are read or written.
/// - Backward functions *accumulate* parameter gradients (dW += ...), so the
///   gradients of several micro-batches add up; input gradients are
///   overwritten unless the function says otherwise.
/// - Templated on Scalar; instantiated for float and double in layers.cpp.
/// - Kernels are deterministic: no atomics; reductions over tokens run in a
///   fixed order per output element, so a rerun gives bit-identical results.
/// - Errors: std::invalid_argument for inconsistent shapes (checked on the
///   host before launching); wlb::core::CommError from the TP collectives.

#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/core/config.hpp"
#include "wlb4d/core/types.hpp"

#include <cstdint>
#include <vector>

namespace wlb::model {

// ---- linear (GEMM through KokkosBlas::gemm) -------------------------------------

/// y[T][out] = beta·y + x[T][in] · W[out][in]ᵀ  (no bias; W row-major [out][in]
/// as torch.nn.Linear). FLOP: 2·T·in·out. Unlike the other kernels, the GEMMs
/// take exact extents (T = x.extent(0)): pass Views of exactly T rows.
/// \throws std::invalid_argument on mismatched extents.
template <class Scalar>
void linear_forward(const View2<Scalar>& x, const View2<Scalar>& w, const View2<Scalar>& y,
                    Scalar beta = Scalar(0));

/// Backward of linear_forward for upstream gradient dy[T][out]:
///   dx[T][in] = beta_dx·dx + dy · W          (skipped when dx is empty)
///   dW[out][in] += dyᵀ · x                   (always accumulates)
/// FLOP: 4·T·in·out.
template <class Scalar>
void linear_backward(const View2<Scalar>& x, const View2<Scalar>& w, const View2<Scalar>& dy,
                     const View2<Scalar>& dx, const View2<Scalar>& dw, Scalar beta_dx = Scalar(0));

/// The two halves of linear_backward, for the split backward of zero-bubble
/// pipeline schedules (Qi et al. 2024, arXiv 2401.10241, §2: B needs dx, W
/// needs x and dy). linear_backward = linear_backward_input then
/// linear_backward_weight, the same GEMMs, so the results are bit-identical.
///   dx[T][in] = beta_dx·dx + dy[T][out] · W[out][in]          FLOP 2·T·in·out
template <class Scalar>
void linear_backward_input(const View2<Scalar>& w, const View2<Scalar>& dy, const View2<Scalar>& dx,
                           Scalar beta_dx = Scalar(0));
///   dW[out][in] += dy[T][out]ᵀ · x[T][in]                     FLOP 2·T·in·out
template <class Scalar>
void linear_backward_weight(const View2<Scalar>& x, const View2<Scalar>& dy, const View2<Scalar>& dw);

// ---- token embedding (vocab-parallel) --------------------------------------------

/// out[t][:] = table[ids[t] − v0][:] if v0 ≤ ids[t] < v0 + table.extent(0),
/// else 0. This rank holds vocabulary rows [v0, v0+Vl) of the [V][d] table;
/// the caller all-reduces `out` over TP to obtain the full embedding
/// (Megatron-LM VocabParallelEmbedding, Shoeybi et al. 2019).
template <class Scalar>
void embedding_forward(const IntVec& ids, std::int64_t T, std::int64_t v0, const View2<Scalar>& table,
                       const View2<Scalar>& out);

/// dtable[id − v0][:] += dout[t][:] for every t whose id is in this rank's range.
/// Race-free without atomics: one work item per embedding column loops over
/// the tokens in order (deterministic on any backend).
template <class Scalar>
void embedding_backward(const IntVec& ids, std::int64_t T, std::int64_t v0, const View2<Scalar>& dout,
                        const View2<Scalar>& dtable);

// ---- RMSNorm (Zhang & Sennrich 2019, eq. 4) ----------------------------------------

/// y[t][j] = x[t][j] · rstd[t] · w[j],  rstd[t] = 1/sqrt(mean_j x[t][j]² + eps).
/// Saves rstd [T] for the backward.
template <class Scalar>
void rmsnorm_forward(const View2<Scalar>& x, std::int64_t T, const View1<Scalar>& w, double eps,
                     const View2<Scalar>& y, const View1<Scalar>& rstd);

/// With g = w∘dy:  dx = rstd·g − rstd³·x·(g·x)/d   and   dw[j] += Σ_t dy[t][j]·x[t][j]·rstd[t].
/// \param accumulate_dx dx += (true) or dx = (false); accumulation lets the
///        residual branch's gradient be added in place.
template <class Scalar>
void rmsnorm_backward(const View2<Scalar>& x, std::int64_t T, const View1<Scalar>& w,
                      const View1<Scalar>& rstd, const View2<Scalar>& dy, const View2<Scalar>& dx,
                      const View1<Scalar>& dw, bool accumulate_dx);

// ---- RoPE (Su et al. 2021, RoFormer eq. 34) ------------------------------------------

/// The D/2 rotation frequencies of a head of D dims (radians per position),
/// computed on the host in double:
///   none:   inv_freq[i] = theta^(−2i/D)
///   llama3: Llama 3.1's long-context scaling (HF transformers
///           `_compute_llama3_parameters`, modeling_rope_utils.py), with
///           wavelen = 2π/inv_freq, L = rope_original_max_position:
///             wavelen < L/high_freq_factor  -> inv_freq           (kept)
///             wavelen > L/low_freq_factor   -> inv_freq / factor  (scaled)
///             between: (1−s)·inv_freq/factor + s·inv_freq,
///                      s = (L/wavelen − low_freq_factor) / (high_freq_factor − low_freq_factor)
/// \throws std::invalid_argument for an odd D or an unknown rope_scaling.
std::vector<double> rope_inv_freq(std::int64_t D, const core::ModelConfig& m);

/// rope_inv_freq copied into a device View [D/2].
View1<double> rope_inv_freq_view(std::int64_t D, const core::ModelConfig& m);

/// Rotary position embedding, in place, on x[T][H][D] (D even).
/// Pairing: **half-split** (the HF/Meta Llama convention "rotate_half"): element
/// i pairs with i + D/2 for i < D/2, with angle pos[t]·inv_freq[i]:
///   x'_i       = x_i·cos − x_{i+D/2}·sin
///   x'_{i+D/2} = x_{i+D/2}·cos + x_i·sin
/// Angles are computed in double (positions up to 1e6 keep full fp32 accuracy).
/// Positions are given per token (they restart at 0 in every document).
/// \param inv_freq [D/2] frequencies from rope_inv_freq_view.
/// \param inverse rotate by −angle: this is the backward (the rotation is
///        orthogonal, so dx = Rᵀ·dy = R(−angle)·dy).
template <class Scalar>
void rope_apply(const View3<Scalar>& x, std::int64_t T, const IntVec& pos, const View1<double>& inv_freq,
                bool inverse);

// ---- SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer", eq. 6) --------------
//
// Host builds evaluate the fp32 exponentials of SwiGLU and the cross-entropy
// (and of the attention softmax) eight at a time with a vectorised expf
// (lib/src/model/vexp.hpp: ≤ 2 ulp; e^x = 0 below x = −87.33 instead of a
// subnormal); device builds and fp64 use kmath::exp.

/// h[t][f] = silu(g[t][f]) · u[t][f],  silu(z) = z·σ(z).
template <class Scalar>
void swiglu_forward(const View2<Scalar>& g, const View2<Scalar>& u, std::int64_t T, const View2<Scalar>& h);

/// dg = dh·u·σ(g)·(1 + g·(1−σ(g))),  du = dh·silu(g). dg/du overwritten.
template <class Scalar>
void swiglu_backward(const View2<Scalar>& g, const View2<Scalar>& u, const View2<Scalar>& dh, std::int64_t T,
                     const View2<Scalar>& dg, const View2<Scalar>& du);

// ---- vocab-parallel cross-entropy (Megatron-LM, Shoeybi et al. 2019 §3) -------------

/// Cross-entropy of logits[T][Vl] (this rank holds vocabulary columns
/// [v0, v0+Vl)) against labels[T] (global ids; −1 = no target).
/// Steps: local row max → TP all-reduce(max); Σexp(logit−max) and the target
/// logit → one TP all-reduce(sum) of a [2][T] buffer; loss_t = log Σexp + max −
/// logit[label]. Collectives run only when tp.size() > 1.
/// \param lse [T] output: log Σ_v exp(logit) over the *global* vocabulary,
///        saved for cross_entropy_backward.
/// \param scratch [≥ 3·T] temporary (no allocation here).
/// \param vl_real columns [0, vl_real) of this shard are real tokens; the rest
///        (vocabulary padding, possibly the whole shard) are left out of the
///        max and Σexp, so the loss equals the unpadded model's. −1: all.
/// \return Σ_t loss_t over tokens with a target (not a mean), identical on
///         every TP rank.
template <class Scalar>
double cross_entropy_forward(const View2<Scalar>& logits, const IntVec& labels, std::int64_t T,
                             std::int64_t v0, const comm::Communicator& tp, const View1<Scalar>& lse,
                             const View1<Scalar>& scratch, std::int64_t vl_real = -1);

/// dlogits[t][v] = (softmax(logits)[t][v] − [v0+v == labels[t]]) · grad_scale
/// for tokens with a target, 0 for tokens without. `dlogits` may alias
/// `logits` (in place). grad_scale = 1/(target tokens of the whole step) makes
/// the per-micro-batch gradients sum to the gradient of the step's mean loss.
/// Padded columns (v >= vl_real, see cross_entropy_forward) get dlogits 0.
template <class Scalar>
void cross_entropy_backward(const View2<Scalar>& logits, const IntVec& labels, std::int64_t T,
                            std::int64_t v0, const View1<Scalar>& lse, double grad_scale,
                            const View2<Scalar>& dlogits, std::int64_t vl_real = -1);

// ---- small helpers -------------------------------------------------------------------

/// y[0:T][:] += x[0:T][:]  (residual add).
template <class Scalar>
void add_inplace(const View2<Scalar>& y, const View2<Scalar>& x, std::int64_t T);

}  // namespace wlb::model
