#pragma once
/// \file batch.hpp
/// \brief Materialise one rank's slice of a planned micro-batch (DESIGN §2
/// step 3): input ids, labels, RoPE positions and attention key ranges.
///
/// Conventions (all per token, in the order of this rank's tokens):
///  - tokens[i]    : token id (int32).
///  - labels[i]    : the next token of the same span, or -1 when i is the last
///                   token of its span (labels never cross a span boundary; a
///                   document cut into pieces loses one target per cut).
///  - positions[i] : offset of the token inside its span (RoPE restarts at 0).
///  - kv_lo/kv_hi  : inclusive range of keys token i attends to, as indices
///                   into the micro-batch in global (packed) order: the start
///                   of its span and its own index (document-causal mask).
///  - global_index : the token's index in the packed micro-batch (for CP the
///                   keys are all-gathered and permuted back to this order).

#include "wlb4d/balance/plan.hpp"
#include "wlb4d/core/types.hpp"

#include <cstdint>
#include <vector>

namespace wlb::data {
class TokenDataset;
}

namespace wlb::train {

struct HostBatch {
  std::vector<std::int32_t> tokens, labels, positions, kv_lo, kv_hi;
  std::vector<std::int64_t> global_index;
  std::int64_t mb_tokens = 0;       ///< tokens of the whole micro-batch (all CP ranks)
  std::int64_t target_tokens = 0;   ///< labels != -1 on this rank
  std::int64_t size() const { return std::int64_t(tokens.size()); }
};

/// Builds the whole micro-batch (cp = 1).
/// \throws core::DataError if a span lies outside its document.
HostBatch build_batch(const data::TokenDataset& ds, const balance::MicroBatch& mb);

/// Builds the slice of `mb` made of the micro-batch token indices `mine`
/// (sorted ascending; may be empty: a CP rank with no tokens).
/// \throws core::DataError if a span lies outside its document.
HostBatch build_batch(const data::TokenDataset& ds, const balance::MicroBatch& mb,
                      const std::vector<std::int64_t>& mine);

/// Σ over spans of d² (tokens²): the attention work of a micro-batch.
double attention_work(const balance::MicroBatch& mb);

}  // namespace wlb::train
