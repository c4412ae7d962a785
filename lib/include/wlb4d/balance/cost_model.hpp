#pragma once
/// \file cost_model.hpp
/// \brief Latency model of one micro-batch per transformer layer, forward +
/// backward (docs/wlb-llm.md §2.1, paper §4.1 Eq. 2), with the effect of
/// CP sharding on the attention term (§3.3–3.5).
///
/// Units: tokens for lengths, seconds for latencies. All latencies are *per
/// layer*, forward + backward, on one device of the (tp) group.
///
/// Planning form (Eq. 2, additive over spans; what packers balance):
///
///     latency(mb) = c + Σ_spans [ a·d + b·d² ]
///
///   * a·d : W_l(d), GEMMs / element-wise / collectives, linear in tokens;
///   * b·d²: W_a(d), causal attention of a span of d tokens (the span is its
///           own document under the document-causal mask);
///   * c   : per-micro-batch constant (launch overheads, fixed-size work).
///
/// CP form (what one CP rank of a cp-sized group runs; the group waits for the
/// slowest rank at the K/V all-gather of every layer):
///
///     rank_latency_r = c + a·tokens_r + Σ_{query pieces on r} attn(p, q)
///     attn(p, q)     = b · ceil_tile(q) · (2p + q) / eff(ceil_tile(q))
///
/// for a query piece of q tokens at offset p inside its span (it attends to
/// keys [0, p+q) of the span). (2p+q)·q is twice the causal area of the piece,
/// so a whole span (p=0, q=d, d a multiple of the tile) costs b·d², matching
/// Eq. 2. ceil_tile pads q to the attention tile (FlashAttention's 128-token
/// query tile, §3.4) and eff(·) = small_tile_efficiency for padded query
/// lengths below 2 tiles (no TMA multicast on Hopper, §3.4), 1 otherwise —
/// the FLOPs_padded / TFLOPs_achieved(shape) estimate of §3.5.

#include "wlb4d/balance/plan.hpp"
#include "wlb4d/core/config.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace wlb::balance {

/// One timed micro-batch for calibration: Σd and Σd² over its spans (tokens,
/// tokens²) and the measured per-layer forward+backward latency (seconds).
struct Sample {
  double sum_d = 0;
  double sum_d2 = 0;
  double seconds = 0;
};

/// Per-layer forward+backward latency model (see file comment).
struct CostModel {
  double a = 0;  ///< seconds per token per layer (linear term W_l)
  double b = 0;  ///< seconds per token² per layer (causal attention W_a: b·d² per span of d)
  double c = 0;  ///< seconds per micro-batch per layer (constant)
  std::int64_t tile = 128;              ///< attention query tile (tokens), §3.4
  double small_tile_efficiency = 0.75;  ///< relative throughput of query pieces padded to < 2 tiles, §3.4

  /// W_l(d) + W_a(d) of one span of d tokens (seconds), Eq. 2.
  double span_cost(std::int64_t d) const {
    const double x = static_cast<double>(d);
    return a * x + b * x * x;
  }
  /// Eq. 2 latency of a micro-batch (seconds): c + Σ span_cost.
  double latency(const MicroBatch& mb) const;
  /// Eq. 2 latency from the sums (tokens, tokens²) (seconds).
  double latency(double sum_d, double sum_d2) const { return c + a * sum_d + b * sum_d2; }

  /// Attention latency of one query piece: q query tokens at offset p of its
  /// span, attending to keys [0, p+q) (seconds; padded, see file comment).
  double attention_piece(std::int64_t p, std::int64_t q) const;
  /// Per CP rank latency of the micro-batch under `sharding` (seconds), size cp.
  /// \throws core::ConfigError if cp < 1.
  std::vector<double> rank_latencies(const MicroBatch& mb, int cp, Sharding sharding) const;
  /// Per CP rank attention latency only (seconds), size cp.
  std::vector<double> rank_attention(const MicroBatch& mb, int cp, Sharding sharding) const;
  /// max over CP ranks of rank_latencies (seconds): what the CP group takes.
  double latency(const MicroBatch& mb, int cp, Sharding sharding) const;

  /// Length at which a span's attention cost equals its linear cost, a/b
  /// (tokens; docs/wlb-llm.md §2.1 "ATTN_LINEAR_BREAKPOINT"). Infinity if b = 0.
  double breakpoint() const;

  /// The run's cost model when nothing is timed (the default; the same on
  /// any machine, so a seeded run plans the same batches everywhere): the
  /// deck's coefficients balance.cost_a/b/c when uses_deck_coefficients(),
  /// else the FLOP-count profile from_model(cfg.model, parallel.tp,
  /// gemm_flops_per_s(cfg), plan.attention_efficiency). With
  /// balance.calibrate=true this is what the planner uses and what the
  /// trainer falls back to when a calibration is degenerate.
  /// \throws core::ConfigError as from_model.
  static CostModel from_config(const core::Config& cfg);

  /// True when the deck gives the coefficients: balance.calibrate=false and
  /// balance.cost_a or balance.cost_b > 0.
  static bool uses_deck_coefficients(const core::BalanceConfig& bc);

  /// GEMM rate of the FLOP profile (FLOP/s) at train.precision:
  /// core::gemm_flops (plan.flops_per_s / flops_per_s_bf16, else plan.device's
  /// peak x plan.gemm_efficiency, core/device_table.hpp).
  static double gemm_flops_per_s(const core::Config& cfg);

  /// Why a fitted (calibrated) model cannot be planned with, "" if it can:
  /// a, b or c not finite, a <= 0 or b <= 0 (breakpoint 0 or infinite: the
  /// timings did not separate the linear from the attention term, e.g.
  /// under load), c < 0, or a breakpoint a/b that is not finite and positive.
  std::string calibration_problem() const;

  /// FLOP-count profile (docs/wlb-llm.md §2.1 [derived] FLOP parity) for a
  /// Llama-style layer on a tp-way tensor-parallel device sustaining
  /// `flops_per_s` in GEMMs and `attention_efficiency`·flops_per_s in the
  /// attention kernel:
  ///   a = 3 · 2·P_layer/tp / flops_per_s       (fwd 2 FLOP/param/token, bwd 2×fwd)
  ///   b = 3.5 · 2·d_model/tp / (eff·flops_per_s)  (causal fwd 2·d²·H FLOPs, FA2 bwd ≈ 2.5×fwd)
  /// with P_layer = d·(heads+2·kv_heads)·head_dim + heads·head_dim·d + 3·d·ffn_hidden.
  /// c = 0. \throws core::ConfigError if tp < 1 or flops_per_s <= 0.
  static CostModel from_model(const core::ModelConfig& model, int tp, double flops_per_s,
                              double attention_efficiency = 0.6);
};

/// Calibration (docs/wlb-llm.md §2.1 "profile … keep them as fitted α·d² + β·d + γ"):
/// non-negative least squares of seconds ≈ c + a·Σd + b·Σd² over the samples
/// (exact active-set search over the 7 non-empty subsets of {c, a, b}; the
/// dropped coefficients are 0). Columns are scaled before solving.
/// \throws core::DataError if a sample is non-finite or negative, or if no
///         subset of the coefficients is determined by the samples (e.g. none).
CostModel fit(const std::vector<Sample>& samples);

}  // namespace wlb::balance
