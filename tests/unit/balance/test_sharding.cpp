// CP sharding: exact partitions, Llama-3 chunk pairing, per-document balance,
// short documents, adaptive choice.
#include "wlb4d/balance/sharding.hpp"
#include "wlb4d/core/error.hpp"

#include "balance_test_util.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

using namespace wlb::balance;

namespace {
MicroBatch mb_of(const std::vector<std::int64_t>& lens) {
  MicroBatch mb;
  std::int64_t id = 0;
  for (auto l : lens) mb.spans.push_back(Span{id++, 0, l});
  return mb;
}

void expect_partition(const MicroBatch& mb, int cp, Sharding s) {
  const auto tok = shard_tokens(mb, cp, s);
  ASSERT_EQ(static_cast<int>(tok.size()), cp);
  std::vector<int> seen(static_cast<std::size_t>(mb.tokens()), 0);
  for (const auto& r : tok) {
    EXPECT_TRUE(std::is_sorted(r.begin(), r.end()));
    for (auto t : r) {
      ASSERT_GE(t, 0);
      ASSERT_LT(t, mb.tokens());
      seen[static_cast<std::size_t>(t)]++;
    }
  }
  for (std::size_t t = 0; t < seen.size(); ++t) ASSERT_EQ(seen[t], 1) << "token " << t;
  // Pieces agree with the token lists and stay inside their spans.
  const auto pcs = shard_pieces(mb, cp, s);
  const auto cu = mb.cu_seqlens();
  for (int r = 0; r < cp; ++r) {
    std::vector<std::int64_t> from_pieces;
    for (const auto& p : pcs[r]) {
      ASSERT_GE(p.length, 1);
      ASSERT_EQ(cu[p.span] + p.prefix, p.mb_start);
      ASSERT_LE(p.prefix + p.length, mb.spans[p.span].length);
      for (std::int64_t k = 0; k < p.length; ++k) from_pieces.push_back(p.mb_start + k);
    }
    EXPECT_EQ(from_pieces, tok[r]);
  }
}
}  // namespace

TEST(Sharding, SequenceIsTheLlama3ChunkPairing) {
  // T = 16, cp = 2: chunks of 4; rank 0 = chunks 0 and 3, rank 1 = chunks 1 and 2.
  const auto mb = mb_of({10, 6});
  const auto tok = shard_tokens(mb, 2, Sharding::Sequence);
  EXPECT_EQ(tok[0], (std::vector<std::int64_t>{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(tok[1], (std::vector<std::int64_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  // Rank 1's chunks 1 and 2 are adjacent: one piece (span 0, prefix 4, 6 tokens),
  // then the head of span 1.
  const auto pcs = shard_pieces(mb, 2, Sharding::Sequence);
  ASSERT_EQ(pcs[1].size(), 2u);
  EXPECT_EQ(pcs[1][0].span, 0);
  EXPECT_EQ(pcs[1][0].prefix, 4);
  EXPECT_EQ(pcs[1][0].length, 6);
  EXPECT_EQ(pcs[1][1].span, 1);
  EXPECT_EQ(pcs[1][1].prefix, 0);
  EXPECT_EQ(pcs[1][1].length, 2);
}

TEST(Sharding, DocumentCutsEverySpan) {
  // Two spans of 8, cp = 2: each cut in 4 slots of 2.
  const auto mb = mb_of({8, 8});
  const auto tok = shard_tokens(mb, 2, Sharding::Document);
  EXPECT_EQ(tok[0], (std::vector<std::int64_t>{0, 1, 6, 7, 8, 9, 14, 15}));
  EXPECT_EQ(tok[1], (std::vector<std::int64_t>{2, 3, 4, 5, 10, 11, 12, 13}));
}

TEST(Sharding, PartitionsPropertyRandom) {
  std::mt19937_64 rng(2024);
  std::uniform_int_distribution<int> nspans(1, 12), len(1, 700), cps(1, 8);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<std::int64_t> lens(static_cast<std::size_t>(nspans(rng)));
    for (auto& l : lens) l = len(rng);
    const int cp = cps(rng);
    const auto mb = mb_of(lens);
    for (auto s : {Sharding::Sequence, Sharding::Document}) {
      expect_partition(mb, cp, s);
      // Token counts per rank differ by at most one, always.
      const auto tok = shard_tokens(mb, cp, s);
      std::size_t mn = SIZE_MAX, mx = 0;
      for (const auto& r : tok) {
        mn = std::min(mn, r.size());
        mx = std::max(mx, r.size());
      }
      EXPECT_LE(mx - mn, 1u);
    }
  }
}

TEST(Sharding, DocumentShardsEqualTokensAndCausalWorkWithinOneToken) {
  // When 2cp divides T: identical token counts, and per-rank causal work
  // (query-key pairs) differs by less than one token's worth (a token of the
  // longest span attends to at most that many keys).
  std::mt19937_64 rng(77);
  std::uniform_int_distribution<int> nspans(1, 16), len(1, 5000);
  const auto real = load_lengths_json(wlb_test::dist_path());
  double worst = 0;
  for (int trial = 0; trial < 900; ++trial) {
    const int cp = std::vector<int>{2, 3, 4, 8, 16}[trial % 5];
    const int ns = trial % 3 == 2 ? 1 : nspans(rng);  // every third: a single span
    std::vector<std::int64_t> lens(static_cast<std::size_t>(ns));
    for (auto& l : lens) l = trial % 2 ? len(rng) : real[rng() % real.size()];
    std::int64_t T = std::accumulate(lens.begin(), lens.end(), std::int64_t{0});
    lens.back() += (2 * cp - T % (2 * cp)) % (2 * cp);
    const auto mb = mb_of(lens);
    const auto tok = shard_tokens(mb, cp, Sharding::Document);
    for (const auto& r : tok) ASSERT_EQ(static_cast<std::int64_t>(r.size()), mb.tokens() / cp);
    const auto w = causal_work(mb, cp, Sharding::Document);
    const auto [mn, mx] = std::minmax_element(w.begin(), w.end());
    const double dmax = static_cast<double>(*std::max_element(lens.begin(), lens.end()));
    // One span: less than one token's worth; several: at most 1.5 tokens' worth.
    EXPECT_LE(*mx - *mn, lens.size() == 1 ? dmax : 1.5 * dmax) << "cp=" << cp << " trial=" << trial;
    worst = std::max(worst, (*mx - *mn) / dmax);
  }
  std::printf("worst causal-work spread: %.3f tokens' worth of the longest span\n", worst);
}

TEST(Sharding, SequenceShardingIsUnbalancedForMixedDocuments) {
  // One long document after a short one: per-sequence chunks leave the rank
  // holding the long document's middle with far more causal work (§1.3).
  const auto mb = mb_of({114688, 16384});
  const auto seq = causal_work(mb, 2, Sharding::Sequence);
  const auto doc = causal_work(mb, 2, Sharding::Document);
  const double seq_ratio = *std::max_element(seq.begin(), seq.end()) / (0.5 * (seq[0] + seq[1]));
  const double doc_ratio = *std::max_element(doc.begin(), doc.end()) / (0.5 * (doc[0] + doc[1]));
  EXPECT_GT(seq_ratio, 1.2);
  EXPECT_LT(doc_ratio, 1.0001);
}

TEST(Sharding, DocumentsShorterThanTwoCp) {
  // 2cp = 8, spans of 1..7 tokens: every token placed, counts equal when divisible.
  const auto mb = mb_of({1, 3, 5, 7, 2, 6});  // 24 tokens
  for (int cp : {4, 6, 12, 24}) {
    expect_partition(mb, cp, Sharding::Document);
    expect_partition(mb, cp, Sharding::Sequence);
  }
  const auto tok = shard_tokens(mb, 4, Sharding::Document);
  for (const auto& r : tok) EXPECT_EQ(r.size(), 6u);
  // A single 1-token document on 4 ranks: one rank holds it, the others nothing.
  const auto one = shard_tokens(mb_of({1}), 4, Sharding::Document);
  EXPECT_EQ(one[0], (std::vector<std::int64_t>{0}));
  for (int r = 1; r < 4; ++r) EXPECT_TRUE(one[r].empty());
}

TEST(Sharding, AdaptivePicksSequenceForManyShortDocsAndDocumentForALongOne) {
  CostModel m;
  m.a = 1e-7;
  m.b = 1e-11;
  // 1024 documents of 128 tokens: per-document shards of 16 tokens waste tiles.
  const auto many = mb_of(std::vector<std::int64_t>(1024, 128));
  EXPECT_EQ(choose_sharding(many, 4, m), Sharding::Sequence);
  // One long document with a short one in front: per-document balances it.
  const auto longdoc = mb_of({8192, 122880});
  EXPECT_EQ(choose_sharding(longdoc, 4, m), Sharding::Document);
  // cp = 1: nothing to choose.
  EXPECT_EQ(choose_sharding(longdoc, 1, m), Sharding::Sequence);
}

TEST(Sharding, Errors) {
  EXPECT_THROW(shard_tokens(mb_of({4}), 0, Sharding::Sequence), wlb::core::ConfigError);
  EXPECT_THROW(parse_sharding("ring"), wlb::core::ConfigError);
  EXPECT_EQ(parse_sharding("document"), Sharding::Document);
  EXPECT_EQ(to_string(Sharding::Sequence), "sequence");
}
