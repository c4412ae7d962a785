#pragma once
/// \file batch.hpp
/// \brief The per-micro-batch input of the model (device Views) and the one
/// builder of it from a packed micro-batch's cu_seqlens (balance/plan.hpp):
/// host vectors first (optionally only this CP rank's tokens), then one
/// grow-only upload.
///
/// A packed micro-batch of T tokens holds N documents (spans) with
/// cu_seqlens = [0, d_0, d_0+d_1, …, T]. For token i of the document starting
/// at s (DESIGN §2 step 3, §5):
///   positions[i] = i − s                   (RoPE positions restart at 0)
///   labels[i]    = ids[i+1] if i+1 is in the same document (and, with a
///                  loss mask, mask[i+1] = 1: a fine-tuning target), else −1
///   kv_lo[i]     = s,  kv_hi[i] = i         (document-causal mask, inclusive)
/// Indices i, s, kv_lo and kv_hi are in packed (whole micro-batch) order, also
/// for a CP rank that holds only some tokens: under CP the keys are
/// all-gathered and permuted back into that order (DESIGN §5).

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

/// Host form of one rank's slice of a micro-batch (int32 per token, in the
/// order of this rank's tokens).
struct HostMicroBatch {
  std::vector<std::int32_t> token_ids, labels, positions, kv_lo, kv_hi;
  bool has_ids = false;              ///< ids (and labels) were given, even for 0 local tokens
  std::int64_t target_tokens = 0;    ///< #{i : labels[i] >= 0}
  std::int64_t attention_pairs = 0;  ///< Σ_i (kv_hi[i] − kv_lo[i] + 1)
  std::int64_t size() const { return std::int64_t(positions.size()); }
};

/// Builds the host slice for the packed micro-batch with the given cu_seqlens
/// (N+1 prefix sums in tokens, from 0, strictly increasing) and token ids (T
/// of them, or empty for a stage that needs neither ids nor labels). `local`:
/// the packed indices this rank holds (sorted ascending; may be empty — a CP
/// rank without tokens); nullptr = all T tokens. `loss_mask`: T values 0/1 in
/// packed order (data/dataset.hpp's /loss_mask of the spans), 0 = token is
/// not a target; nullptr = every next token is. The mask is applied before
/// CP sharding picks the local tokens, so every layout sees the same labels.
/// \throws std::invalid_argument if cu_seqlens is malformed, ids has neither 0
///         nor T entries, an id is >= 2^31, a local index is outside [0, T),
///         or loss_mask has other than T entries.
HostMicroBatch build_host_micro_batch(const std::vector<std::int64_t>& cu_seqlens, const std::vector<token_t>& ids,
                                      const std::vector<std::int64_t>* local = nullptr,
                                      const std::vector<std::uint8_t>* loss_mask = nullptr);

/// Copies a host slice into `mb`'s device Views (reallocated only when the
/// slice is longer than their extent: a steady-state loop allocates nothing).
void upload_micro_batch(MicroBatchInput& mb, const HostMicroBatch& h);

/// Grow-only upload of an int32 host vector into a device View (extent >= 1).
void upload_ints(IntVec& dst, const std::vector<std::int32_t>& src, const char* label);

/// Fills `mb` for the micro-batch with the given cu_seqlens (N+1 prefix sums in
/// tokens, starting at 0, strictly increasing) and token ids (T of them, or
/// empty for a stage that needs neither ids nor labels). Views are reallocated
/// only when T exceeds their extent, so a steady-state loop does not allocate
/// device memory. upload_micro_batch(mb, build_host_micro_batch(cu, ids)).
/// \throws std::invalid_argument as build_host_micro_batch.
void fill_micro_batch(MicroBatchInput& mb, const std::vector<std::int64_t>& cu_seqlens,
                      const std::vector<token_t>& ids);

/// Same as fill_micro_batch into a new MicroBatchInput.
MicroBatchInput make_micro_batch(const std::vector<std::int64_t>& cu_seqlens, const std::vector<token_t>& ids);

}  // namespace wlb::model
