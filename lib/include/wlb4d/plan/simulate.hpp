#pragma once
/// \file simulate.hpp
/// \brief The cluster-scale planner/simulator behind wlb4d-plan: runs every
/// packer × CP sharding of the deck's [plan] section over plan.steps steps of
/// a sampled document stream, and estimates each step's time with the cost
/// model, an α–β communication model and an action-by-action simulation of
/// the trainer's own pipeline action lists (schedule.hpp: the lists
/// build_all_schedules() gives the executor, run by simulate_schedule() with
/// eager sends). It is an area of its own (plan, namespace wlb::plan), above
/// pipeline and balance, because it needs both the packers and the one
/// schedule implementation, and because nothing the trainer runs needs it.
///
/// Step-time model (all seconds; per DP replica, then the max over replicas,
/// since the gradient reduction synchronises them):
///   * per layer and micro-batch, CP rank r: linear work c + a·tokens_r and
///     attention attn_r (CostModel::rank_latencies); forward = linear/3 +
///     attn/3.5, backward = the rest (GEMM backward = 2× forward, FA2
///     backward ≈ 2.5× forward, docs/wlb-llm.md §3.5), split into B =
///     linear/3 + attn·2.5/3.5 (input gradients) and W = linear/3 (weight
///     gradients); the CP group waits for its slowest rank (max over r, each
///     part separately);
///   * CP all-gather of K and V per layer forward (and reduce-scatter of dK,
///     dV backward), ring: (cp−1)·(α + β·bytes_per_rank), bytes_per_rank =
///     tokens/cp · 2·max(1, kv_heads/tp)·head_dim · 2 bytes (bf16);
///   * stage k of K = pp·virtual_stages holds ⌊layers/K⌋ layers, the first
///     layers mod K stages one more; embedding and LM head are not modelled
///     (the vocabulary comes from the dataset);
///   * PP p2p per micro-batch and stage boundary: α + β·tokens/(cp·tp)·
///     d_model·2 bytes (sequence-parallel activations, bf16);
///   * the schedule is parallel.schedule: the executor's action lists
///     (planner_action_lists), simulated action by action; a message takes
///     its micro-batch's p2p time at the receiver and does not hold the
///     sender (nonblocking sends);
///   * plus the gradient all-reduce over the dp·cp group of this stage's
///     layer parameters (bf16, ring: 2(g−1)·α + 2(g−1)/g·bytes·β).
/// TP collectives are taken as overlapped with compute (paper §6) and not
/// charged.

#include "wlb4d/balance/cost_model.hpp"
#include "wlb4d/balance/metrics.hpp"
#include "wlb4d/balance/plan.hpp"
#include "wlb4d/core/config.hpp"
#include "wlb4d/pipeline/memory_model.hpp"
#include "wlb4d/pipeline/schedule.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace wlb::plan {

using balance::CostModel;
using balance::RunMetrics;
using balance::StepPlan;

/// Sustained GEMM FLOP/s per device at the deck's train.precision
/// (core::gemm_flops: plan.flops_per_s / flops_per_s_bf16 when given, else
/// plan.device's peak x plan.gemm_efficiency).
double plan_gemm_flops(const core::Config& cfg);

/// The peak FLOP/s per device that MFU divides by: log.peak_tflops when > 0,
/// else plan.device's peak at train.precision (core/device_table.hpp); 0
/// when neither is known (no MFU is printed then).
double plan_peak_flops(const core::Config& cfg);

/// One line naming the device the planner models: plan.device and its peak at
/// train.precision, the GEMM rate and the memory budget with where each came
/// from (a key given, the device table, or the fallback), and why there is
/// no MFU when no peak is known. Ends with a newline.
std::string device_line(const core::Config& cfg);

/// The simulator's cost model, CostModel::from_config(cfg) as the trainer's
/// default: the deck's balance.cost_a/b/c when given (balance.calibrate=false),
/// else CostModel::from_model(model, tp, plan_gemm_flops(cfg)) (an H100-like
/// FLOP profile; attention at 60% of the GEMM rate, plan.attention_efficiency).
/// \throws core::ConfigError.
CostModel plan_cost_model(const core::Config& cfg);

/// The action lists (one per pipeline rank) the planner simulates for m
/// micro-batches per replica: exactly the lists the trainer's executor runs
/// (pipeline::training_action_list) for the deck's schedule and layout.
/// \throws core::ConfigError as build_all_schedules.
std::vector<std::vector<pipeline::Action>> planner_action_lists(const core::ParallelConfig& par, int m);

/// One link of the α–β model: a message of n bytes takes alpha_s + n·beta_s_per_byte seconds.
struct Link {
  double alpha_s = 0;          ///< seconds per message
  double beta_s_per_byte = 0;  ///< seconds per byte
};

/// What simulate_step_time charges besides the cost model's compute: the
/// link of each axis's group, and two terms the classic model leaves out.
struct StepModel {
  Link tp, cp, pp, dp;  ///< TP collectives, CP K/V gathers, PP p2p, DP×CP gradient reduction
  /// Charge the TP collectives (else taken as overlapped, paper §6): per
  /// layer and micro-batch two ring all-reduces of T/cp·d_model bf16
  /// activations forward and two backward, 2(tp−1)·(α + β·bytes/tp) each
  /// (under SP an all-gather + reduce-scatter pair moves the same bytes);
  /// full recompute re-runs the forward's two.
  bool tp_comm = false;
  /// Charge recompute: model.recompute = full re-runs each layer's forward
  /// (compute, CP gather and TP collectives) inside B; selective re-runs only
  /// element-wise work the GEMM/attention cost model has no term for (0).
  bool recompute = false;
  /// Matmul parameters of the LM head (vocabulary · d_model) charged on the
  /// last chunk at the layers' per-parameter rate (cost.a / layer_matmul_params
  /// per token: forward, B and W a third each); 0: not modelled (classic).
  double head_params = 0;
  /// Core-attention disaggregation (balance/attention_tasks.hpp):
  /// every slot's attention is balanced over the stage's DP×CP group
  /// (balance::disaggregate_step, ca_task_tokens, ca_tolerance), each rank's
  /// CP attention replaced by its assigned cost, and each layer pays the
  /// exchange α + β·(bytes of the rank that imports most), half forward,
  /// half backward, less what DistCA's ping-pong hides: on each CP rank the
  /// exposed part of a pass is max(0, half − the pass's attention time of
  /// the rank's own kept tasks), as model/ca_exchange.hpp runs it.
  /// Bytes per row in bf16: a query row moves Q, O, dO, dQ (Hq/tp·head_dim
  /// each) and the log-sum-exp (4 B per head); a key row K, V, dK, dV
  /// (max(1, kv_heads/tp)·head_dim each). The link is the DP×CP group's.
  bool disaggregated_attention = false;
  std::int64_t ca_task_tokens = 1024;
  double ca_tolerance = 0.02;
  /// The classic wlb4d-plan model: every axis on plan.alpha_s/plan.beta_s_per_byte,
  /// TP overlapped, recompute not charged.
  static StepModel uniform(const core::Config& cfg);
  /// The search's model (DESIGN §11): ranks in grid order (TP innermost, then
  /// CP, DP, PP) fill nodes of plan.devices_per_node; an axis whose group (for
  /// PP: the whole pipeline) fits one node uses plan.intra_alpha_s/
  /// intra_beta_s_per_byte, else plan.alpha_s/beta_s_per_byte; TP comm,
  /// recompute and the LM head (plan_vocab) charged.
  static StepModel cluster(const core::Config& cfg);
};

/// Simulated time of one step of `plan` (seconds), its pipeline bubble and
/// the communication it charged (seconds per pipeline rank, averaged over
/// the pipeline's ranks, of the slowest replica; dp_s is serial after the
/// pipeline).
struct StepTime {
  double seconds = 0;
  double bubble_fraction = 0;  ///< of the slowest replica
  double tp_s = 0, cp_s = 0, pp_s = 0, dp_s = 0;
  /// Disaggregated attention only: attention imbalance of the group's ranks
  /// (max/mean, mean over slots) before and after the assignment, and the
  /// exchange's bytes per layer (Σ over slots of the most-importing rank's).
  double ca_imbalance_before = 1, ca_imbalance_after = 1, ca_bytes_per_layer = 0;
};
/// \throws core::ConfigError for an invalid layout or schedule.
StepTime simulate_step_time(const StepPlan& plan, const core::Config& cfg, const CostModel& cost);
/// The same with explicit links (StepModel::uniform(cfg) gives the overload above).
StepTime simulate_step_time(const StepPlan& plan, const core::Config& cfg, const CostModel& cost,
                            const StepModel& model);

/// One packer × sharding row.
struct PlanRow {
  std::string packer, sharding;
  std::string attention = "local";  ///< local | disaggregated (plan.attention)
  double ca_imbalance_before = 1, ca_imbalance_after = 1;  ///< disaggregated: group-rank attention max/mean
  double ca_bytes_per_layer = 0;  ///< disaggregated: exchange bytes per layer per step (StepTime)
  RunMetrics metrics;
  double step_time_s = 0;       ///< mean simulated step time (seconds)
  double speedup = 1;           ///< step time of fixed+sequence / this row's
  double tokens_per_s = 0;      ///< trained tokens per simulated second
  double bubble_fraction = 0;   ///< mean over steps
  double plan_ms = 0;           ///< mean wall time of plan_step (milliseconds)
  double mem_peak_bytes = 0;    ///< predicted peak per rank, max over ranks (memory_model.hpp)
};

/// One feature setting of the memory table (recompute × ZeRO × SP).
struct MemoryRow {
  std::string setting;          ///< e.g. "recompute=full zero=1 sp=on"
  std::vector<double> stage_bytes;  ///< predicted peak per pipeline rank (TP rank 0)
  double peak_bytes = 0;        ///< max over stages
  bool fits = true;             ///< peak_bytes <= plan.device_memory_gib
  std::string terms;            ///< format_memory() of the largest stage
};

struct PlanReport {
  CostModel cost;
  std::vector<std::int64_t> thresholds;  ///< wlb outlier thresholds used (tokens)
  std::vector<PlanRow> rows;
  std::int64_t vocab = 0;               ///< vocabulary the memory model used
  std::vector<MemoryRow> memory;        ///< the deck's setting first, then the feature settings
};

/// The vocabulary wlb4d-plan assumes: model.vocab_size, or 32000 (Llama 2's)
/// when it is 0 (the planner reads no dataset).
std::int64_t plan_vocab(const core::Config& cfg);

/// Memory table of the deck's layout: the deck's own feature setting, then
/// recompute none/selective/full × parallel.zero 0/1 × sequence parallelism
/// off/on (on only when tp > 1), each with the predicted peak per pipeline
/// rank and whether it fits plan.device_memory_gib.
std::vector<MemoryRow> memory_table(const core::Config& cfg, std::int64_t vocab);

/// Upper bound of the planner's own work (inputs bounded before use): host bytes the simulation
/// of one step holds (the step plan's spans and CP token lists, the action
/// lists of every pipeline rank) for documents of mean length mean_length.
double planner_host_bytes(const core::Config& cfg, double mean_length);

/// The planner's bounds, before any work: planner_host_bytes() must fit the
/// host's MemAvailable and plan.steps × rows × train.micro_batches × tokens
/// must stay within 2e10 simulated tokens (rows: simulated settings).
/// \throws core::ConfigError naming both numbers; core::DataError for an
///         empty length list.
void check_plan_bounds(const core::Config& cfg, const std::vector<std::int64_t>& lengths, double rows);

/// Runs plan.attention × plan.packers × plan.shardings (plus local fixed+sequence as the speedup
/// baseline) for plan.steps steps, documents drawn i.i.d. from `lengths`
/// with train.seed. "auto" thresholds are tuned once on 20,000 lengths.
/// \throws core::ConfigError for unknown packer/sharding names or layouts,
///         and, before any work, when planner_host_bytes() exceeds the host's
///         MemAvailable (both numbers in the message) or plan.steps × rows ×
///         micro_batches × tokens exceeds 2e10 simulated tokens;
///         core::DataError for an empty length list.
PlanReport simulate_plan(const core::Config& cfg, const std::vector<std::int64_t>& lengths);

/// Human-readable table of the report.
std::string format_table(const PlanReport& report, const core::Config& cfg);
/// CSV with header packer,sharding,latency_imbalance,attention_imbalance,
/// step_time_s,speedup,mean_delay_steps,max_delay_steps,cp_imbalance,
/// replica_imbalance,bubble_fraction,tokens_per_step,tokens_per_s,plan_ms,mem_peak_bytes (predicted peak per rank, bytes),
/// attention (local | disaggregated),ca_imbalance_before,ca_imbalance_after,ca_bytes_per_layer.
std::string format_csv(const PlanReport& report);

}  // namespace wlb::plan
