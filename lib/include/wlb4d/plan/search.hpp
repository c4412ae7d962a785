#pragma once
/// \file search.hpp
/// \brief The layout search behind `wlb4d-plan DECK --search` (DESIGN §11; a
/// Galvatron-style search, Miao et al., PVLDB 16(3) 2023, on this trainer's
/// own schedules): which (dp, pp, cp, tp), schedule, virtual stages,
/// micro-batch count, recompute, ZeRO and sequence parallelism is fastest
/// for the deck's model, cluster description ([plan]) and document lengths,
/// and fits the device memory.
///
/// Candidates, for world = the deck's dp·pp·cp·tp devices: every
/// factorisation world = dp·pp·cp·tp × schedule ∈ {1f1b, gpipe, zb1,
/// interleaved v=2, interleaved v=4, bfs v=2, bfs v=4} × micro-batches ∈
/// plan.search_micro_batches (default: the deck's train.micro_batches) ×
/// model.recompute ∈ {none, selective, full} × parallel.zero ∈ {0, 1} ×
/// parallel.sequence_parallel ∈ {off, on}; every other key is the deck's.
/// A candidate is dropped, in this order and counted by reason, when:
///   1. rejected: core::validate() or core::validate_world() — the trainer's
///      own deck validation — throws (so the search never proposes a layout
///      the trainer refuses, by construction);
///   2. off-node: tp does not divide plan.devices_per_node (TP stays within a
///      node, where the grid puts it);
///   3. symmetric: pp = 1 and a schedule other than 1f1b (one stage runs
///      every schedule as F then B; 1f1b holds the fewest activations);
///   4. over memory: predict_memory_stages()'s largest stage exceeds
///      plan.device_memory_gib;
///   5. dominated: a candidate with the same layout, schedule and
///      micro-batches and a setting the step-time model charges no more for
///      already fits — settings are tried in the order recompute none <
///      selective < full, then (zero, sp) = (0,off) (0,on) (1,off) (1,on)
///      (ZeRO-1 and SP move the same bytes as the all-reduces they replace).
/// The survivors are simulated (simulate_step_time with StepModel::cluster)
/// on plan.search_coarse_steps steps of the deck's packer and sharding over
/// the document lengths (the real WLB planner, step plans cached per (dp,
/// micro-batches, cp, tp)); the best plan.search_refine, and the deck's own
/// setting always, are re-simulated over plan.steps steps and ranked by
/// tokens per second (= by step time when the micro-batch count is fixed).
///
/// When the deck gives cost_a and cost_b (balance.calibrate = false), they
/// are measured at its own tp: a candidate's are scaled by deck tp /
/// candidate tp (the FLOP profile divides by the candidate's tp itself).
///
/// MFU = model::model_flops of the simulated tokens / (step time · world ·
/// peak), peak = plan_peak_flops (log.peak_tflops when > 0, else plan.device's
/// peak at train.precision); -1 (printed "-") when no peak is known — never
/// the sustained GEMM rate the simulation runs at.
///
/// Global batch: every candidate runs train.micro_batches micro-batches of
/// the deck's window, so rows with the deck's micro-batch count train the
/// same global batch in tokens; plan.search_micro_batches may add counts,
/// and the table marks those rows with their batch relative to the deck's.
/// --write-deck writes the best row at the deck's global batch.

#include "wlb4d/core/config.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace wlb::plan {

/// One evaluated candidate.
struct SearchCandidate {
  core::Config cfg;             ///< the deck with this candidate's layout and features
  bool is_deck = false;         ///< the deck's own setting
  bool fits = true;             ///< peak_bytes <= plan.device_memory_gib
  double peak_bytes = 0;        ///< predicted peak per rank, max over pipeline ranks (bytes)
  int steps = 0;                ///< simulated steps behind the numbers below
  double step_time_s = 0;       ///< mean simulated step time (seconds)
  double tokens_per_step = 0;   ///< mean trained tokens per step
  double tokens_per_s = 0;      ///< Σ tokens / Σ step time
  double mfu = -1;              ///< model FLOP/s per device / peak (see the file comment); -1: no peak
  double bubble = 0;            ///< pipeline idle fraction of the slowest replica (mean over steps)
  double tp_share = 0, cp_share = 0, pp_share = 0, dp_share = 0;  ///< of the step time (per rank)
  /// "dp=1 pp=4 cp=2 tp=8 1f1b v=1 m=4 recompute=full zero=1 sp=on".
  std::string label() const;
};

/// How many candidates each stage of the search saw.
struct SearchCounts {
  long enumerated = 0, rejected = 0, off_node = 0, symmetric = 0, over_memory = 0, dominated = 0;
  long coarse = 0;   ///< survivors simulated on plan.search_coarse_steps steps
  long refined = 0;  ///< re-simulated on plan.steps steps
  double seconds = 0;  ///< wall time of the whole search
  std::string first_rejection;  ///< the trainer's message for the first rejected candidate
};

struct SearchReport {
  int world = 0, nodes = 0;
  std::vector<SearchCandidate> ranked;  ///< refined candidates, best first (the deck's among them)
  SearchCandidate deck;                 ///< the deck's own setting (also in ranked)
  SearchCounts counts;
};

/// Every candidate of the file comment for `world` devices that passes
/// rules 1–3 (the trainer's validation, TP within a node, symmetry), in
/// enumeration order; counts (optional) gets the enumerated, rejected,
/// off-node and symmetric tallies. \throws nothing for a bad candidate (it is
/// counted); core::ConfigError for an unparsable plan.search_micro_batches.
std::vector<core::Config> search_candidates(const core::Config& deck, int world, SearchCounts* counts = nullptr);

/// The search of the file comment over `lengths` (document lengths, tokens).
/// \throws core::ConfigError when plan.nodes·plan.devices_per_node is below
///         the deck's world, or for the deck's own invalid setting;
///         core::DataError for an empty length list.
SearchReport search_layouts(const core::Config& deck, const std::vector<std::int64_t>& lengths);

/// The counts line and the top `top` rows (and the deck's row if it is not
/// among them) as a table.
std::string format_search(const SearchReport& report, int top);

/// The best ranked candidate with the deck's train.micro_batches (the
/// deck's global batch), nullptr when none (the deck's own row always is).
const SearchCandidate* best_at_deck_batch(const SearchReport& report);

/// The candidate as a complete deck (core::to_ini, every key) with a header
/// comment of its prediction; `lengths_path` replaces plan.lengths (an
/// absolute path keeps the deck usable from any folder).
std::string search_deck(const SearchCandidate& best, const std::string& lengths_path);

}  // namespace wlb::plan
