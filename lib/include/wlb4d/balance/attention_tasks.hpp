#pragma once
/// \file attention_tasks.hpp
/// \brief Core-attention disaggregation, the plan side (DistCA:
/// Zhuang, Chen et al., "Efficient Long-context Language Model Training by
/// Core Attention Disaggregation", arXiv 2510.18121, §3–4).
///
/// Core attention softmax(QKᵀ)V has no parameters: after a layer's QKV
/// projection, the attention of a micro-batch is a set of *tasks* (a block
/// of query rows of one span × that span's causal key range [0, prefix+length))
/// that any rank can compute if it receives the task's Q rows and K/V rows and
/// returns O and the log-sum-exp. The *attention group* is the DP×CP group of
/// one pipeline stage: every rank of it reaches a layer in the same schedule
/// slot, each with its own micro-batch (DP) or CP shard of one. This file cuts
/// the group's query pieces into tasks and assigns them so that every rank
/// gets about the same attention cost, moving as few bytes as it can. It sees
/// no model: the caller gives the bytes a query row and a key row cost.
///
/// Units: tokens for rows, seconds for costs (CostModel::attention_piece),
/// bytes for traffic. Everything is deterministic (no hashing, no clocks):
/// every rank computing the plan gets the same assignment.
#include "wlb4d/balance/cost_model.hpp"
#include "wlb4d/balance/sharding.hpp"

#include <cstdint>
#include <vector>

namespace wlb::balance {

/// One core-attention task: query rows [prefix, prefix+length) of span `span`
/// of the micro-batch of `replica`, attending keys [0, prefix+length) of that
/// span (causal, document-masked).
struct AttentionTask {
  int home = 0;               ///< rank of the attention group that holds the Q rows
  int replica = 0;            ///< micro-batch (DP replica) the span belongs to
  std::int32_t span = 0;      ///< index into that MicroBatch::spans
  std::int64_t prefix = 0;    ///< query rows start here inside the span (tokens)
  std::int64_t length = 0;    ///< query rows (tokens, >= 1)
  double cost = 0;            ///< CostModel::attention_piece(prefix, length) (seconds)
  std::int64_t row = 0;       ///< first query row among home's own query rows (its CP shard, in order)
  std::int64_t mb_start = 0;  ///< index of the first query row in the micro-batch (packed order)
  /// Micro-batch index of the span's first token: the task's keys are
  /// [key_begin(), key_begin() + key_rows()) in packed order.
  std::int64_t key_begin() const { return mb_start - prefix; }
  std::int64_t key_rows() const { return prefix + length; }
};

/// The attention group's query pieces cut into tasks of at most
/// `task_tokens` query rows (rounded up to a multiple of cost.tile), in rank
/// order, each rank's in piece order. pieces[r] are rank r's pieces
/// (shard_pieces of its replica's micro-batch), replica_of[r] its replica.
/// \throws core::ConfigError if task_tokens < 1 or the sizes differ.
std::vector<AttentionTask> make_attention_tasks(const std::vector<std::vector<Piece>>& pieces,
                                                const std::vector<int>& replica_of, const CostModel& cost,
                                                std::int64_t task_tokens);

/// What a task's move costs in traffic (bytes per row, forward + backward):
/// `query_row` for the Q row out, O + log-sum-exp back, dO out and dQ back;
/// `key_row` for a K and V row out and their dK, dV back. K/V rows are sent
/// once per (replica, span, destination) — the longest key range moved there
/// — and not at all to a rank of the same replica (after the CP all-gather
/// of the layer every CP rank of a replica holds the whole micro-batch's K/V).
struct AttentionTraffic {
  double query_row = 0;  ///< bytes per moved query row
  double key_row = 0;    ///< bytes per K/V row a destination needs
};

/// The assignment of an attention group's tasks.
struct AttentionAssignment {
  std::vector<int> owner;            ///< rank computing each task (size = tasks)
  std::vector<double> cost_before;   ///< attention seconds per rank, all tasks at home
  std::vector<double> cost_after;    ///< attention seconds per rank after the moves
  double bytes = 0;                  ///< traffic of the moves (bytes, forward + backward)
  std::vector<double> bytes_in;      ///< per rank: bytes it receives and sends back for imported tasks
  std::int64_t moved = 0;            ///< tasks computed away from home
  /// max/mean of cost_before and cost_after (1 = perfect; 1 when all are 0).
  double imbalance_before() const;
  double imbalance_after() const;
};

/// Communication-aware greedy (DistCA §4.2, in its simplest form): while the
/// most loaded rank is above (1 + tolerance) × the mean, move one of its
/// home tasks to the least loaded rank, choosing among the tasks whose cost
/// fits both the donor's surplus and the receiver's deficit the one with the
/// most seconds per byte moved (so the fewest bytes reach the target); when
/// none fits, the task that lowers max(donor, receiver) most. Stops when no
/// move lowers that maximum. The result is within (1 + tolerance) of the
/// mean, or within one task's cost of it (tasks are the granularity).
/// \throws core::ConfigError if ranks < 1, a task's home is outside
/// [0, ranks), replica_of has another size, or tolerance < 0.
AttentionAssignment assign_attention_tasks(const std::vector<AttentionTask>& tasks, int ranks,
                                           const std::vector<int>& replica_of, const AttentionTraffic& traffic,
                                           double tolerance);

/// Disaggregation of one step plan, slot by slot: slot j is micro-batch j of
/// every replica that has one (the ranks of an attention group reach it in
/// the same schedule slot). Group rank of (replica d, CP rank c) = d·cp + c.
struct SlotAttention {
  std::vector<int> replicas;        ///< replicas taking part (those with > j micro-batches)
  std::vector<double> cost_before;  ///< per group rank: attention seconds per layer, local
  std::vector<double> cost_after;   ///< per group rank: after the assignment
  std::vector<double> cost_home;    ///< per group rank: cost of its own tasks it keeps (hides the exchange)
  std::vector<double> bytes_in;     ///< per group rank: bytes imported (forward + backward), per layer
  std::int64_t moved = 0;           ///< tasks computed away from home
};
/// The plan's micro_batches/sharding disaggregated with make_attention_tasks
/// (task_tokens) and assign_attention_tasks (traffic, tolerance), per slot.
/// 	hrows core::ConfigError as those, or if cp < 1.
std::vector<SlotAttention> disaggregate_step(const StepPlan& plan, int cp, const CostModel& cost,
                                             const AttentionTraffic& traffic, std::int64_t task_tokens,
                                             double tolerance);

}  // namespace wlb::balance
