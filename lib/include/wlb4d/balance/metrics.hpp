#pragma once
/// \file metrics.hpp
/// \brief Per-step balance metrics (DESIGN §6; docs/wlb-llm.md §1.3,
/// §1.4, §2.3, §7 item 6). Logged by the trainer every step and reported by
/// wlb4d-plan.

#include "wlb4d/balance/cost_model.hpp"
#include "wlb4d/balance/plan.hpp"

#include <cstdint>
#include <vector>

namespace wlb::balance {

/// Balance of one StepPlan. Ratios are >= 1 (1 = perfect; 1 for an empty step).
struct StepMetrics {
  std::int64_t step = 0;
  std::int64_t tokens = 0;          ///< tokens in the step (all replicas)
  std::int64_t target_tokens = 0;   ///< loss denominator of the step
  std::int64_t micro_batches = 0;   ///< over all replicas
  /// ID_attn (§1.4 (1), paper §3.3): max / mean over the step's micro-batches
  /// of Σ d² over their spans.
  double attention_imbalance = 1;
  /// ID_lat (§1.4 (2), paper §7.4 Table 2): Max_Latency × n / Total_Latency
  /// over the step's n micro-batches, with each micro-batch's per-layer
  /// latency from the cost model under its CP sharding (max over CP ranks).
  /// Equals the paper's Max × PP_size / Total when n = PP_size (its DP = 1
  /// setup); for DP > 1 it is max/mean over all micro-batches.
  double latency_imbalance = 1;
  /// max / mean over DP replicas of their summed micro-batch latency.
  double replica_imbalance = 1;
  /// CP-rank imbalance (§1.3): max / mean over CP ranks of exact causal work
  /// (causal_work), averaged over the step's micro-batches; and its maximum.
  double cp_imbalance = 1;
  double cp_imbalance_max = 1;
  /// Outlier delay (§2.3): token-weighted mean wait of the step's tokens and
  /// the longest wait of any span (steps).
  double mean_delay_steps = 0;
  std::int64_t max_delay_steps = 0;
};

/// Metrics of one plan for a CP group of size cp (>= 1).
/// \throws core::ConfigError if cp < 1.
StepMetrics step_metrics(const StepPlan& plan, const CostModel& cost, int cp);

/// Means over steps of the ratios, the run's token-weighted mean delay, the
/// largest delay, and mean tokens per step.
struct RunMetrics {
  std::int64_t steps = 0;
  double attention_imbalance = 1, latency_imbalance = 1, replica_imbalance = 1, cp_imbalance = 1;
  double mean_delay_steps = 0;
  std::int64_t max_delay_steps = 0;
  double tokens_per_step = 0;
};
RunMetrics summarize(const std::vector<StepMetrics>& steps);

}  // namespace wlb::balance
