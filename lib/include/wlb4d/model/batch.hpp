#pragma once
/// \file batch.hpp
/// \brief The per-micro-batch input of the model (device Views) and the helper
/// that builds it from a packed micro-batch's cu_seqlens (balance/plan.hpp).
///
/// A packed micro-batch of T tokens holds N documents (spans) with
/// cu_seqlens = [0, d_0, d_0+d_1, …, T]. For token i of the document starting
/// at s (DESIGN §2 step 3, §5):
///   positions[i] = i − s                   (RoPE positions restart at 0)
///   labels[i]    = ids[i+1] if i+1 is in the same document, else −1
///   kv_lo[i]     = s,  kv_hi[i] = i         (document-causal mask, inclusive)

#include "wlb4d/core/types.hpp"

#include <cstdint>
#include <vector>

namespace wlb::model {

/// Device inputs of one micro-batch. Views may be longer than `tokens`
/// (they are reused, grow-only); only [0, tokens) is meaningful.
struct MicroBatchInput {
  std::int64_t tokens = 0;         ///< T
  std::int64_t target_tokens = 0;  ///< #{i : labels[i] >= 0}
  std::int64_t attention_pairs = 0;  ///< Σ_i (kv_hi[i] − kv_lo[i] + 1): (query, key) pairs per head
  IntVec token_ids;  ///< [T] vocabulary ids (read by the first stage; empty if not given)
  IntVec labels;     ///< [T] next-token targets, −1 = none (read by the last stage; empty if not given)
  IntVec positions;  ///< [T] RoPE positions
  IntVec kv_lo;      ///< [T] first key each query attends (inclusive)
  IntVec kv_hi;      ///< [T] last key each query attends (inclusive)
};

/// Fills `mb` for the micro-batch with the given cu_seqlens (N+1 prefix sums in
/// tokens, starting at 0, strictly increasing) and token ids (T of them, or
/// empty for a stage that needs neither ids nor labels). Views are reallocated
/// only when T exceeds their extent, so a steady-state loop does not allocate
/// device memory.
/// \throws std::invalid_argument if cu_seqlens is malformed, ids has neither 0
///         nor T entries, or an id is >= 2^31.
void fill_micro_batch(MicroBatchInput& mb, const std::vector<std::int64_t>& cu_seqlens,
                      const std::vector<token_t>& ids);

/// Same as fill_micro_batch into a new MicroBatchInput.
MicroBatchInput make_micro_batch(const std::vector<std::int64_t>& cu_seqlens, const std::vector<token_t>& ids);

}  // namespace wlb::model
