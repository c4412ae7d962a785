#pragma once
/// \file pipeline_sim.hpp
/// \brief A small, self-contained event simulation of pipeline schedules with
/// per-micro-batch, per-stage durations, for the planner/simulator wlb4d-plan
/// (reference/wlb-llm.md §1.2 "propagation": variable micro-batches on PP).
/// Independent of wlb::pipeline (balance sits below pipeline, DESIGN §1).
///
/// Model: pp devices; with v virtual stages (model chunks) per device there
/// are K = pp·v stages, stage k on device k mod pp (Megatron's interleaving).
/// F(k,i) needs F(k−1,i) plus one p2p transfer; B(k,i) needs B(k+1,i) plus one
/// p2p transfer (B(K−1,i) needs F(K−1,i)). A device runs its actions one at a
/// time in schedule order, each as soon as its input is ready. Transfers do
/// not occupy the device (asynchronous p2p). Times in seconds.

#include <string>
#include <vector>

namespace wlb::balance {

enum class Phase { Forward, Backward };

/// One action of a device: chunk c (virtual stage c·pp + device) of micro-batch i.
struct Action {
  int chunk = 0;
  int micro_batch = 0;
  Phase phase = Phase::Forward;
};

/// The per-device action order of a schedule with m micro-batches:
///   * gpipe: all forwards, then all backwards (v = 1);
///   * 1f1b: pp−d−1 warm-up forwards on device d, then alternate F/B, then
///     the remaining backwards (v = 1; PipeDream-Flush / Megatron);
///   * interleaved: Megatron's interleaved 1F1B (warm-up (pp−d−1)·2 +
///     (v−1)·pp; needs m a multiple of pp when v > 1);
///   * bfs: breadth-first — every micro-batch through chunk 0, then chunk 1,
///     …; backwards in reverse chunk order.
/// \throws core::ConfigError for an unknown schedule, pp/v/m < 1, v > 1 with
///         gpipe/1f1b, or interleaved with v > 1 and m % pp != 0.
std::vector<std::vector<Action>> schedule_order(const std::string& schedule, int pp, int virtual_stages, int m);

/// Durations: fwd[k][i], bwd[k][i] of stage k (0..K−1) and micro-batch i
/// (seconds); p2p[i]: one stage-to-stage transfer of micro-batch i (seconds;
/// empty: 0), the same for activations and gradients.
struct PipelineTimes {
  std::vector<std::vector<double>> fwd, bwd;
  std::vector<double> p2p;
};

struct PipelineResult {
  double makespan = 0;              ///< first start to last end (seconds)
  std::vector<double> busy;         ///< per device, time spent computing (seconds)
  double bubble_fraction = 0;       ///< 1 − Σ busy / (pp · makespan)
};

/// Runs the schedule. \throws core::ConfigError if the times' shapes do not
/// match (K = pp·v rows, m columns) or schedule_order throws.
PipelineResult simulate_pipeline(const std::string& schedule, int pp, int virtual_stages, const PipelineTimes& t);

}  // namespace wlb::balance
