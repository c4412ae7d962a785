#pragma once
/// \file executor.hpp
/// \brief Runs one rank's share of a step: its pipeline action list
/// (schedule.hpp) over its model chunks, with the point-to-point messages of
/// pipeline parallelism; context parallelism through model::CpKvExchange.
///
/// Per micro-batch i of this DP replica, this rank holds the CP shard of
/// tokens given by balance::shard_tokens (cp = 1: all tokens). Every rank
/// knows every micro-batch's shape from the plan, so messages are sized
/// without extra traffic: an activation or gradient message of micro-batch i
/// is [T_i][d] floats (row-major), T_i = tokens of this rank's CP shard. T_i
/// may be 0 (a micro-batch shorter than 2·cp): the rank still runs the
/// micro-batch so it takes part in every layer's K/V exchange, and
/// sends/receives 0 floats. Under sequence parallelism
/// (parallel.sequence_parallel) a message carries only this TP rank's rows of
/// the CP shard, Transformer::residual_rows(T_i): [⌈T_i/tp⌉ or ⌊T_i/tp⌋][d],
/// and the receive buffers are sized to match.
///
/// Transport: with a device backend attached to the PP communicator
/// (comm.backend=nccl) messages go device to device, matched by posting
/// order (no tags; a 0-float message is skipped on both sides — they agree
/// on T_i); the schedules post every pair of stages' messages in the same
/// order on both sides (pipeline/schedule.hpp). Without one, MPI with
/// p2p_tag() tags, through a host buffer when the model buffers are device
/// memory (CUDA build with comm.backend=mpi).
///
/// pp = 1 with virtual stages > 1: the chunk hand-offs are local (the
/// schedule holds no message for them); the executor passes activations and
/// gradients between its chunks directly.
///
/// Workspace slots: each chunk keeps the activations of `slots` micro-batches
/// in flight, slots = micro_batches_in_flight() (memory_model.hpp): the most
/// micro-batches held on one chunk in this rank's action list, from F to W
/// (1F1B p − r on pipeline rank r, ZB-H1 min(p, m), GPipe and BFS m,
/// interleaved as its list says). Each chunk's held micro-batches are
/// consecutive, so slot = mb mod slots never collides. Under ZB-H1 (W
/// delayed) and whenever model.recompute = none, Backward actions run
/// Transformer::backward_input and Weight actions backward_weight, with W
/// stashes wslot = mb mod weight_stashes() (ZB-H1: min(r + 1, m); otherwise
/// one, of zero size without recompute). With recompute, the other schedules
/// run the fused backward() at B (no stash: a stage-level W would need every
/// recomputed layer's operands kept) and their Weight actions do nothing.
/// Both count as backward time.

#include "wlb4d/balance/cost_model.hpp"
#include "wlb4d/balance/plan.hpp"
#include "wlb4d/core/config.hpp"
#include "wlb4d/grid/process_grid.hpp"
#include "wlb4d/model/ca_exchange.hpp"
#include "wlb4d/model/cp_exchange.hpp"
#include "wlb4d/model/transformer.hpp"
#include "wlb4d/pipeline/schedule.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace wlb::data {
class TokenDataset;
}

namespace wlb::pipeline {

/// Start and end of one action of a traced run() (log.trace_step): wall
/// seconds of core::wall_seconds() (steady clock), so t0/t1 of ranks on one
/// node share an origin; t1 - t0 includes the fences that close the action.
struct ActionTiming {
  Action action;
  double t0 = 0, t1 = 0;
};

/// One TP collective or CP exchange inside an action of a traced run():
/// its exposed interval (core::wall_seconds(), as ActionTiming) and the
/// action it ran in.
struct CommTiming {
  enum Kind { Tp, Cp } kind = Tp;
  int micro_batch = 0, virtual_stage = 0;  ///< of the action it ran in
  double t0 = 0, t1 = 0;
};

/// What one run() measured on this rank (seconds are wall time unless noted).
struct RunStats {
  double loss_sum = 0;       ///< Σ CE over this rank's target tokens (nats; last stage, 0 elsewhere)
  double forward_s = 0;      ///< forward compute, TP/CP communication excluded
  double backward_s = 0;     ///< backward compute, TP/CP communication excluded
  double p2p_s = 0;          ///< pipeline sends and receives (including waiting)
  double tp_comm_s = 0;      ///< TP all-reduces inside forward/backward (waited: the exposed part)
  double tp_overlapped_s = 0;  ///< TP reductions in flight beyond their wait (fused backward, dW GEMMs running)
  double cp_comm_s = 0;      ///< CP K/V all-gathers and dK/dV reduce-scatters
  double compute_cpu_s = 0;  ///< process CPU seconds of forward/backward minus CPU spent in comm
  /// With run(..., trace = true): one entry per action of this rank's action
  /// list, in execution order (messages included); empty otherwise.
  std::vector<ActionTiming> trace;
  /// With trace = true: every TP collective (model::TpRegion) and CP
  /// exchange (model::CpKvExchange) of the run, in execution order; each
  /// lies inside its action's [t0, t1].
  std::vector<CommTiming> comm_trace;
};

/// Gradient-reduction hooks of a training run (the trainer binds them to
/// optim::Optimizer::grads_ready / progress; the pipeline area cannot see the
/// optimizer). During each chunk's last gradient action of the step (its last
/// Weight action when B and W run apart, else its last Backward) the chunk's
/// Transformer reports ready(chunk, from) per layer
/// (model::Transformer::set_grads_ready_hook), and after that action the
/// executor reports ready(chunk, 0): the chunk's gradients are final.
/// progress() is called after every action (MPICH has no progress thread by
/// default: a started collective advances only inside MPI calls). Both are
/// called in the same order on every rank of a DP×CP group (same action
/// list). Empty functions: not called.
struct GradHooks {
  std::function<void(std::size_t chunk, std::int64_t from)> ready;
  std::function<void()> progress;
};

class Executor {
 public:
  /// Builds this rank's model chunks (virtual stages) with their layers,
  /// initialised from train.seed. Keeps a copy of `cfg`.
  /// \throws core::ConfigError for layouts the schedule rejects (e.g. fewer
  ///         layers than p·v chunks, interleaved with m % p != 0).
  Executor(const core::Config& cfg, const grid::ProcessGrid& grid, std::int64_t vocab);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  /// Local model chunks, index = virtual stage.
  std::vector<std::unique_ptr<model::Transformer<float>>>& chunks() { return chunks_; }

  /// Reads and stages this rank's slice of each micro-batch (CP shard per
  /// `sharding`, one entry per micro-batch). Reuses device buffers (grow-only).
  /// \throws core::DataError if a span lies outside its document;
  ///         core::InternalError if a micro-batch exceeds the capacity
  ///         max(train.max_seq_len, balance.max_tokens) tokens.
  /// With `plan` (the whole step plan, identical on every rank) and
  /// disaggregated attention enabled, also assigns each micro-batch's
  /// core-attention tasks over the attention group (DP×CP of this stage):
  /// balance::make_attention_tasks + assign_attention_tasks, micro-batch j of
  /// every replica forming slot j. Without `plan` (evaluation) attention stays local.
  void load(const data::TokenDataset& ds, const std::vector<balance::MicroBatch>& mbs,
            const std::vector<balance::Sharding>& sharding, const balance::StepPlan* plan = nullptr);

  /// balance.attention = disaggregated: core attention of every layer is
  /// balanced over the DP×CP group (model::CoreAttentionExchange on a
  /// communicator of its own). `cost` must be identical on every rank (the
  /// packer's). Collective over DP×CP (communicator split). No-op when the
  /// group has one rank.
  void enable_disaggregated_attention(const balance::CostModel& cost);

  /// Core-attention disaggregation of the loaded step (zeros when off).
  struct AttentionStats {
    double cost_before = 0, cost_after = 0;  ///< this rank's attention cost, all tasks home / assigned (s per layer, Σ slots)
    double group_max_before = 0, group_max_after = 0;  ///< Σ over slots of the group's most loaded rank (s per layer)
    double group_mean = 0;                   ///< Σ over slots of the group's mean rank cost (s per layer)
    std::int64_t moved = 0;                  ///< tasks of the group computed away from home (Σ slots)
    double imbalance_before() const { return group_mean > 0 ? group_max_before / group_mean : 1.0; }
    double imbalance_after() const { return group_mean > 0 ? group_max_after / group_mean : 1.0; }
  };
  const AttentionStats& attention_stats() const { return ca_plan_stats_; }
  /// The exchange's measured traffic and waits since the last call (then reset).
  model::CaStats take_attention_exchange_stats();
  bool disaggregated_attention() const { return cax_ != nullptr; }

  /// Runs the loaded micro-batches through the schedule (collective over the
  /// PP, TP and CP groups). With backward = false only forwards run
  /// (evaluation) and no gradient changes. Gradients accumulate into the
  /// chunks' registries, scaled by grad_scale (1 / target tokens of the step).
  /// With trace = true every action's start and end go into RunStats::trace
  /// (two clock reads per action; off in ordinary steps).
  /// \throws core::InternalError if the action list names a buffer that was
  ///         never filled (a schedule bug); comm errors propagate.
  RunStats run(bool backward, double grad_scale, bool trace = false);

  /// Sets the gradient-reduction hooks of run(backward = true) (see GradHooks).
  void set_grad_hooks(GradHooks h);

  /// Tokens this rank holds in the loaded micro-batches.
  std::int64_t local_tokens() const { return local_tokens_; }
  /// Loss targets among this rank's loaded tokens (labels >= 0; with a loss
  /// mask, the unmasked ones). Summed over DP×CP: the step's loss normaliser.
  std::int64_t local_targets() const { return local_targets_; }

 private:
  struct Loaded;
  std::vector<Action> action_list(bool backward) const;
  void forward(const Action& a, bool backward, RunStats& st);
  void backward(const Action& a, double grad_scale, RunStats& st);
  void weight(const Action& a, RunStats& st);
  void send(const Action& a, RunStats& st);
  void receive(const Action& a, RunStats& st);
  void bind_cp(int micro_batch);
  /// Assigns the loaded micro-batches' attention tasks (load with a plan).
  void plan_attention(const balance::StepPlan& plan);
  /// Rows of micro-batch mb's activation/gradient messages (SP: this TP rank's share).
  std::int64_t hidden_rows(std::size_t mb) const;
  void collect_comm_times(RunStats& st);
  HostView1<float> staging(std::int64_t n);

  core::Config cfg_;  // a copy: a temporary Config passed in must not dangle
  const grid::ProcessGrid& grid_;
  std::int64_t cap_ = 0;
  int slots_ = 1;
  int wslots_ = 0;       // W stashes per chunk (ZB-H1 only)
  bool split_w_ = false;  // Backward runs B only, Weight runs W (ZB-H1)
  std::vector<std::unique_ptr<model::Transformer<float>>> chunks_;
  std::shared_ptr<model::CpKvExchange> kvx_;
  std::shared_ptr<model::CoreAttentionExchange> cax_;  // balance.attention = disaggregated
  std::unique_ptr<balance::CostModel> ca_cost_;
  std::vector<std::shared_ptr<model::CaLayout>> ca_layouts_;  // per micro-batch slot (reused; grow-only)
  std::size_t ca_bound_ = 0;                                  // layouts valid for this load (0: local)
  AttentionStats ca_plan_stats_;
  std::unique_ptr<Loaded> loaded_;
  /// Host staging of pipeline messages when model buffers are device memory
  /// and PP has no device backend (grow-only, so the steady state allocates nothing).
  HostView1<float> pp_host_;
  std::int64_t local_tokens_ = 0;
  std::int64_t local_targets_ = 0;
  GradHooks hooks_;
  int armed_ = -1;  // chunk whose last gradient action is running (its layer reports go to hooks_.ready)
};

/// Reads one rank's slice of a planned micro-batch from the dataset (DESIGN
/// §2 step 3): the ids of every span (model::build_host_micro_batch then
/// takes the `local` packed indices; nullptr = all tokens).
/// \throws core::DataError naming the span and the file if a span lies
///         outside its document.
model::HostMicroBatch read_micro_batch(const data::TokenDataset& ds, const balance::MicroBatch& mb,
                                       const std::vector<std::int64_t>* local = nullptr);

}  // namespace wlb::pipeline
