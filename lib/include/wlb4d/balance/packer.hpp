#pragma once
/// \file packer.hpp
/// \brief Packers: which documents form which micro-batch in which step, and
/// on which DP replica (DESIGN §2 step 2, §6; docs/wlb-llm.md §1.5, §2).
///
/// Common rules of all packers:
///   * **Token budget.** Each step takes exactly B = train.micro_batches ×
///     train.max_seq_len tokens from the DocSource, in stream order; the
///     document that crosses the budget is cut, and its tail (a span with
///     offset > 0) is taken first by the next step (packer state). fixed and
///     greedy run exactly these B tokens in the step; wlb may hold some back
///     (outlier queues, leftovers) and run them later, so its executed tokens
///     per step vary around B.
///   * **Exactly once.** Every drawn token is trained exactly once: the spans
///     of all steps tile every drawn document exactly, across save_state /
///     load_state too.
///   * **Shape.** Every DP replica gets micro_batches/dp micro-batches; no
///     micro-batch is empty; none exceeds its cap (max_seq_len for fixed and
///     greedy, which fill each to exactly max_seq_len; max_tokens for wlb).
///   * **Sharding.** StepPlan::sharding is the deck's balance.sharding, or per
///     micro-batch choose_sharding() for "adaptive".
///
/// Kinds:
///   * `fixed` — the usual baseline ("Plain-4D", §1.5): concatenate the
///     budget's documents in stream order and cut every max_seq_len tokens; a
///     cut document continues in the next micro-batch (and step). Micro-batch
///     i (in stream order) goes to DP replica i / (micro_batches/dp) —
///     contiguous blocks.
///   * `greedy` — the paper's Fixed-4D baseline (§4.2, Table 2 "Fixed-Len
///     Greedy, 1 global batch"): the budget's documents sorted by length,
///     descending; each goes to the lowest-cost micro-batch (Eq. 2 cost) that
///     still has room; if it is longer than that room, it fills the room and
///     its remainder (a span with offset > 0) is placed again the same way.
///     All micro-batches end at exactly max_seq_len tokens. Greedy keeps long
///     documents whole where stream-order cutting would split them (and so
///     cut their d² cost), so the step keeps the stream-order cut (as fixed)
///     instead whenever that has the cheaper slowest micro-batch: greedy's
///     slowest micro-batch is never slower than fixed's. Micro-batches are then dealt to DP replicas
///     by cost (longest-processing-time first, micro_batches/dp each).
///   * `wlb` — Algorithm 1 (§2.4, paper §4.3) with multi-level outlier queues
///     (§2.3) and a bounded wait:
///       1. the step's budget B is drawn; documents longer than the context
///          window (max_seq_len) are cut into pieces of <= max_seq_len (a
///          micro-batch may hold up to S_max = max_tokens >= max_seq_len
///          tokens of several documents, docs/wlb-llm.md §2.2);
///       2. a piece with d >= L_1 goes to outlier queue i (L_i <= d < L_{i+1});
///          others are new documents;
///       3. a queue holding >= N = micro_batches pieces releases its N oldest
///          (FIFO) into the new documents;
///       4. every piece that has waited balance.max_delay steps (queued,
///          left over, just released from a queue, or — for max_delay = 0 —
///          just drawn) is *forced* into this step;
///       5. placement order: forced (longest first), then last step's
///          leftovers (their order), then new documents (longest first). Each
///          goes to the micro-batch of least Eq. 2 workload if it fits
///          (tokens + d <= S_max), else to the shortest micro-batch if it fits,
///          else it is left over to the next step — except forced pieces,
///          which are split over the micro-batches with the most room (their
///          total never exceeds the capacity N·S_max >= B, since a step's
///          inflow is B);
///       6. an empty micro-batch (possible when nearly everything is queued)
///          takes the oldest queued piece, or half of the largest span;
///       7. micro-batches are dealt to DP replicas by cost as in greedy.
///     Hence no piece waits more than max_delay steps (max_delay = 0: no
///     waiting at all). Thresholds: balance.outlier_thresholds (token counts),
///     "none" (no queues), or "auto" (choose_outlier_thresholds, §2.3's
///     offline procedure on a sample of document lengths).

#include "wlb4d/balance/cost_model.hpp"
#include "wlb4d/balance/doc_source.hpp"
#include "wlb4d/balance/plan.hpp"
#include "wlb4d/core/config.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace wlb::balance {

/// A packer's settings, resolved from the deck (or set directly by tests and
/// the simulator).
struct PackerParams {
  std::string kind = "fixed";         ///< fixed | greedy | wlb
  int micro_batches = 4;              ///< N: micro-batches per step over all replicas (train.micro_batches)
  int dp = 1;                         ///< DP replicas; must divide micro_batches
  int cp = 1;                         ///< CP group size (for sharding)
  std::string sharding = "sequence";  ///< sequence | document | adaptive
  std::int64_t max_seq_len = 256;     ///< S (tokens): fixed/greedy micro-batch length; B = N·S per step
  std::int64_t max_tokens = 0;        ///< S_max (tokens) of a wlb micro-batch; 0: max_seq_len
  int max_delay = 4;                  ///< wlb: most steps a piece may wait (steps)
  std::vector<std::int64_t> thresholds;  ///< wlb: ascending outlier thresholds L_1 < L_2 < … (tokens); empty: no queues

  std::int64_t cap() const { return max_tokens > 0 ? max_tokens : max_seq_len; }
  std::int64_t step_budget() const { return static_cast<std::int64_t>(micro_batches) * max_seq_len; }

  /// From [train], [parallel] and [balance]; thresholds are left empty for
  /// "auto" (resolve with choose_outlier_thresholds). \throws core::ConfigError.
  static PackerParams from_config(const core::Config& cfg);
  /// \throws core::ConfigError naming the broken rule (kind, dp | N, S >= 1,
  /// S_max >= S, cp >= 1, thresholds ascending and >= 1, sharding name).
  void validate() const;
};

/// Plans steps. Not thread-safe; one per trainer.
class Packer {
 public:
  virtual ~Packer();
  /// Plans step `step` (any increasing numbering; delays are step differences),
  /// drawing from `src` (see file comment). Fills micro_batches, sharding,
  /// tokens, target_tokens and the delay fields of StepPlan.
  /// \throws core::DataError if the source yields a length < 1.
  virtual StepPlan plan_step(std::int64_t step, DocSource& src) = 0;
  /// Carry-over, queued and left-over pieces (doc_id, offset, length,
  /// arrival step) and the resolved thresholds, as int64s for checkpoints.
  virtual std::vector<std::int64_t> save_state() const = 0;
  /// Restores save_state()'s output; with the DocSource restored to the same
  /// position, later plans are identical. \throws core::CheckpointError if the
  /// state is malformed or from another packer kind.
  virtual void load_state(const std::vector<std::int64_t>& state) = 0;
  virtual const PackerParams& params() const = 0;
  /// Pieces drawn from the source but not yet planned (carry-over tail,
  /// queued outliers, leftovers), in no particular order. Trained spans of all
  /// past steps plus these tile every drawn document exactly.
  virtual std::vector<Span> pending() const = 0;
};

/// The fixed packing as a function (the one implementation the `fixed`
/// packer and the trainer's validation batches share): the spans in order,
/// concatenated and cut every max_seq_len tokens; a span crossing a boundary
/// continues in the next micro-batch. Every micro-batch holds exactly
/// max_seq_len tokens but the last, which holds the rest (none when spans is
/// empty). \throws core::ConfigError if max_seq_len < 1.
std::vector<MicroBatch> pack_in_order(const std::vector<Span>& spans, std::int64_t max_seq_len);

/// A packer from explicit settings. \throws core::ConfigError (validate()).
std::unique_ptr<Packer> make_packer(const PackerParams& params, const CostModel& cost);

/// A packer from the deck. `length_sample` (document lengths, tokens) is
/// needed only for balance.packer=wlb with outlier_thresholds=auto: pass a few
/// thousand lengths of the training data (e.g. from its /doc_offsets).
/// \throws core::ConfigError on bad settings, or for auto thresholds with an
///         empty sample.
std::unique_ptr<Packer> make_packer(const core::Config& cfg, const CostModel& cost,
                                    const std::vector<std::int64_t>& length_sample = {});

/// Parses balance.outlier_thresholds: "none" -> {}, "2048 8192" -> {2048, 8192}.
/// \throws core::ConfigError for "auto" (use choose_outlier_thresholds) or a bad list.
std::vector<std::int64_t> parse_thresholds(const std::string& text);

/// One candidate of the threshold search.
struct ThresholdTrial {
  std::vector<std::int64_t> thresholds;
  double imbalance = 0;   ///< mean over steps of max/mean Eq. 2 latency over micro-batches
  double mean_delay = 0;  ///< token-weighted mean wait (steps)
};

/// The offline tuning of §2.3: simulates the wlb packer for `steps` steps on
/// the sample (cycled in order) for every ascending set of 0–3 thresholds
/// drawn from {S_max/32, S_max/16, S_max/8, S_max/4, S_max/2}, and returns
/// the set with the lowest imbalance among those whose mean delay is <=
/// max_mean_delay (steps); sets within 0.5% of that imbalance are ranked by
/// lower mean delay, then fewer queues. `trials`, if given, receives every
/// candidate's numbers. \throws core::ConfigError if the sample is empty.
std::vector<std::int64_t> choose_outlier_thresholds(const std::vector<std::int64_t>& sample,
                                                    const PackerParams& params, const CostModel& cost,
                                                    int steps = 64, double max_mean_delay = 1.0,
                                                    std::vector<ThresholdTrial>* trials = nullptr);

/// Deals micro-batches (with costs) to dp replicas, count/dp each, balancing
/// the summed cost: longest-processing-time first onto the least-loaded
/// replica that still has a free slot. Returns, per replica, the indices of
/// its micro-batches (in dealing order). \throws core::ConfigError if dp does
/// not divide costs.size().
std::vector<std::vector<std::size_t>> assign_to_replicas(const std::vector<double>& costs, int dp);

}  // namespace wlb::balance
