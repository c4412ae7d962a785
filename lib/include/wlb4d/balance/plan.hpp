#pragma once
/// \file plan.hpp
/// \brief The step plan (DESIGN §2 step 2): which document spans form which
/// micro-batch, which DP replica runs it, and how its tokens are cut over CP.
///
/// Every rank computes the same StepPlan from the same inputs (no broadcast).
/// A micro-batch is a packed sequence of *spans*; each span is a whole
/// document or a piece of one, and is treated as its own document for
/// attention, RoPE positions and labels: a span of length d contributes d
/// tokens and d-1 target tokens (its last token has no target; labels never
/// cross a span boundary). cu_seqlens of a micro-batch = prefix sums of its
/// span lengths.

#include <cstdint>
#include <vector>

namespace wlb::balance {

/// A piece of one document: tokens [offset, offset+length) of document doc_id
/// (doc_id indexes the dataset's /doc_offsets). length >= 1.
struct Span {
  std::int64_t doc_id = 0;
  std::int64_t offset = 0;   ///< tokens from the document start
  std::int64_t length = 0;   ///< tokens
  bool operator==(const Span& o) const {
    return doc_id == o.doc_id && offset == o.offset && length == o.length;
  }
};

/// One packed micro-batch.
struct MicroBatch {
  std::vector<Span> spans;
  /// Σ length (tokens).
  std::int64_t tokens() const {
    std::int64_t t = 0;
    for (const auto& s : spans) t += s.length;
    return t;
  }
  /// Σ (length-1): tokens that have a next-token target.
  std::int64_t target_tokens() const {
    std::int64_t t = 0;
    for (const auto& s : spans) t += s.length - 1;
    return t;
  }
  /// cu_seqlens: spans.size()+1 prefix sums, starting at 0 (tokens).
  std::vector<std::int64_t> cu_seqlens() const {
    std::vector<std::int64_t> cu{0};
    for (const auto& s : spans) cu.push_back(cu.back() + s.length);
    return cu;
  }
};

/// CP sharding of one micro-batch (docs/wlb-llm.md §3.1, §3.3).
enum class Sharding { Sequence, Document };

/// The plan of one optimizer step.
struct StepPlan {
  std::int64_t step = 0;
  /// micro_batches[dp_rank][i]: the i-th micro-batch run by DP replica dp_rank.
  /// Every replica runs the same number of micro-batches (pipeline schedules
  /// need it); lengths may differ.
  std::vector<std::vector<MicroBatch>> micro_batches;
  /// sharding[dp_rank][i]: CP sharding of that micro-batch.
  std::vector<std::vector<Sharding>> sharding;
  /// Σ target tokens over the whole step, all replicas: the loss denominator
  /// (DESIGN §3 token-level loss).
  std::int64_t target_tokens = 0;
  /// Σ tokens over the whole step.
  std::int64_t tokens = 0;

  // --- Additions (balance packers fill these; the trainer may log them) ---
  /// Waiting time of this step's spans, token-weighted: Σ over spans of
  /// length × (step − arrival step), in token·steps. A span "arrives" at the
  /// step whose token budget first took it from the DocSource; only the wlb
  /// packer's outlier queues and leftovers make it wait (fixed/greedy: 0).
  /// Mean per-token delay (docs/wlb-llm.md §2.3) = delay_token_steps / tokens.
  std::int64_t delay_token_steps = 0;
  /// Largest wait of any span of this step (steps); wlb guarantees <= balance.max_delay.
  std::int64_t max_delay_steps = 0;
  /// Spans of this step that waited at least one step (count).
  std::int64_t delayed_spans = 0;

  /// Micro-batches over all replicas (count).
  std::int64_t num_micro_batches() const {
    std::int64_t n = 0;
    for (const auto& r : micro_batches) n += static_cast<std::int64_t>(r.size());
    return n;
  }
};

}  // namespace wlb::balance
