#pragma once
/// \file sharding.hpp
/// \brief CP sharding of one micro-batch over a cp-rank group
/// (docs/wlb-llm.md §3.1, §3.3, §3.5; paper §5.1–5.3, Fig. 9, Fig. 11).
///
/// Both shardings cut into 2·cp contiguous *slots*; CP rank r owns slot r and
/// slot 2cp−1−r (the Llama 3 / Megatron pairing that balances causal work of
/// one document). A rank's tokens are returned as sorted micro-batch token
/// indices (0 .. mb.tokens()-1) and as query *pieces* (runs of consecutive
/// tokens inside one span) — what the attention kernel needs: a piece with
/// prefix p and length q attends to keys [0, p+q) of its span.
///
/// **Sequence** (§3.1): the packed sequence of T tokens is cut into 2·cp slots
/// of ⌊T/2cp⌋ tokens; the T mod 2cp leftover tokens enlarge slots in the order
/// 0, 1, …, cp−1, 2cp−1, 2cp−2, …, cp (i.e. the j-th leftover goes to rank
/// j mod cp), so rank token counts differ by at most 1, and are equal when
/// 2cp divides T.
///
/// **Document** (§3.3, "padding-free remainder"): every span of d tokens is
/// cut into 2·cp contiguous slots of ⌊d/2cp⌋ tokens, and its d mod 2cp
/// leftover tokens are dealt one each to ranks in a rotation that continues
/// across the spans of the micro-batch (the j-th leftover of the micro-batch
/// goes to rank j mod cp). A rank that receives one leftover of a span takes
/// it in its early slot (r) or its late slot (2cp−1−r), whichever gives the
/// smaller spread of accumulated causal work across ranks (local search,
/// starting from early); a rank that receives two takes one in each. Hence:
///   * token counts per rank are equal when 2cp divides T (no padding), and
///     differ by at most 1 otherwise;
///   * causal work per rank (Σ over its pieces of the causal area q·p +
///     q(q+1)/2) differs by less than one token's worth for a micro-batch of
///     one span (a token of a span of d tokens attends to at most d keys),
///     and by at most 1.5 tokens' worth of the longest span for any
///     micro-batch (tested bounds; the leftover placement is a heuristic).
/// Spans shorter than 2·cp are all leftover: some ranks get none of their tokens.
/// A rank's adjacent slots inside one span (e.g. sequence chunks cp−1 and cp,
/// or both slots for cp = 1) are merged into one piece.

#include "wlb4d/balance/cost_model.hpp"
#include "wlb4d/balance/plan.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace wlb::balance {

/// A run of consecutive tokens of one span owned by one CP rank.
struct Piece {
  std::int32_t span = 0;       ///< index into MicroBatch::spans
  std::int64_t prefix = 0;     ///< tokens of the span before the piece (its K/V prefix)
  std::int64_t length = 0;     ///< query tokens (>= 1)
  std::int64_t mb_start = 0;   ///< index of the piece's first token in the micro-batch
};

/// The pieces of every CP rank, each rank's list in micro-batch order.
/// \throws core::ConfigError if cp < 1.
std::vector<std::vector<Piece>> shard_pieces(const MicroBatch& mb, int cp, Sharding sharding);

/// The sorted micro-batch token indices of every CP rank (size cp). Every
/// token index 0..T−1 appears in exactly one rank's list.
/// \throws core::ConfigError if cp < 1.
std::vector<std::vector<std::int64_t>> shard_tokens(const MicroBatch& mb, int cp, Sharding sharding);

/// Exact causal attention work per CP rank: Σ over its pieces of
/// q·p + q(q+1)/2 (query–key pairs, unpadded). Size cp.
std::vector<double> causal_work(const MicroBatch& mb, int cp, Sharding sharding);

/// Adaptive selection (§3.5, paper §5.3): the sharding whose estimated
/// attention latency, max over CP ranks of CostModel::rank_attention
/// (tile-padded, small-tile efficiency), is lower; Sequence on ties (and
/// always for cp = 1, where both are the same).
Sharding choose_sharding(const MicroBatch& mb, int cp, const CostModel& cost);

/// "sequence" / "document".
std::string to_string(Sharding s);
/// Parses "sequence" or "document". \throws core::ConfigError otherwise.
Sharding parse_sharding(const std::string& s);

}  // namespace wlb::balance
