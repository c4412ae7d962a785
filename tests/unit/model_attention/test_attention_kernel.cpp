// The cuDNN attention kernel's host side, and the kernel selection, on the CPU:
// the ragged layout (checked against the mask it came from, entry by entry,
// by rebuilding the bottom-right causal mask cuDNN applies), the graph-key
// bucketing, the plan cache's hits, misses and evictions, and
// model.attention_kernel applied through select_attention_kernel.
#include "wlb4d/core/attention_kernel.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/model/attention.hpp"
#include "wlb4d/model/attention_ragged.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace wlb::model;

namespace {

struct Mask {
  int S = 0;
  std::vector<std::int32_t> lo, hi;
  int T() const { return static_cast<int>(lo.size()); }
};

// Document starts of a packed sequence of documents with these lengths.
std::vector<int> cu_seqlens(const std::vector<int>& lens) {
  std::vector<int> cu{0};
  for (int l : lens) cu.push_back(cu.back() + l);
  return cu;
}

// The document-causal mask of a rank's queries in global key order: every
// position in `positions`, attending its document's first token up to itself.
Mask doc_causal(const std::vector<int>& lens, const std::vector<int>& positions) {
  const auto cu = cu_seqlens(lens);
  Mask m;
  m.S = cu.back();
  for (int pos : positions) {
    const int d = static_cast<int>(std::upper_bound(cu.begin(), cu.end(), pos) - cu.begin()) - 1;
    m.lo.push_back(cu[d]);
    m.hi.push_back(pos);
  }
  return m;
}

// The query positions of CP rank r of cp under per-sequence sharding: chunks r
// and 2cp-1-r of the S tokens cut in 2cp chunks (DESIGN §5).
std::vector<int> cp_sequence_shard(int S, int cp, int r) {
  std::vector<int> pos;
  auto chunk = [&](int c) {
    const int b = static_cast<int>(static_cast<long>(S) * c / (2 * cp));
    const int e = static_cast<int>(static_cast<long>(S) * (c + 1) / (2 * cp));
    for (int i = b; i < e; ++i) pos.push_back(i);
  };
  chunk(r);
  chunk(2 * cp - 1 - r);
  return pos;
}

// Rebuilds, for every query, the set of keys it attends under the ragged
// layout (bottom-right causal mask within its entry, keys through kv_src) and
// compares with the mask it came from; checks the maps' consistency.
void expect_same_mask(const Mask& m, const RaggedAttention& r) {
  ASSERT_EQ(r.T, m.T());
  ASSERT_EQ(r.S, m.S);
  const int n = static_cast<int>(r.segments.size());
  if (n == 0) {
    EXPECT_EQ(r.batch, 0);
  } else {
    EXPECT_GE(r.batch, n);
    EXPECT_EQ(r.batch & (r.batch - 1), 0) << "batch is a power of two";
    EXPECT_LT(r.batch, 2 * n);
    ASSERT_EQ(static_cast<int>(r.seq_len_q.size()), r.batch);
    ASSERT_EQ(static_cast<int>(r.q_row_offset.size()), r.batch + 1);
    EXPECT_EQ(r.q_row_offset[r.batch], r.q_rows);
    EXPECT_EQ(r.kv_row_offset[r.batch], r.kv_rows);
    for (int b = 0; b < r.batch; ++b) {
      EXPECT_LE(r.seq_len_q[b], r.s_q);
      EXPECT_LE(r.seq_len_kv[b], r.s_kv);
      EXPECT_GE(r.seq_len_kv[b], r.seq_len_q[b]);
      if (b >= n) {  // padding: one zero row attending one zero row
        EXPECT_EQ(r.seq_len_q[b], 1);
        EXPECT_EQ(r.seq_len_kv[b], 1);
        EXPECT_EQ(r.q_src[r.q_row_offset[b]], -1);
        EXPECT_EQ(r.kv_src[r.kv_row_offset[b]], -1);
      } else {
        EXPECT_LE(r.q_row_offset[b] + r.seq_len_q[b], r.q_rows - 1);
        EXPECT_LE(r.kv_row_offset[b] + r.seq_len_kv[b], r.kv_rows - 1);
      }
    }
  }
  std::vector<int> seen_rows(r.kv_rows > 0 ? r.kv_rows - 1 : 0, 0);
  for (int j = 0; j < m.S; ++j)
    for (int t = r.key_rows_begin[j]; t < r.key_rows_begin[j + 1]; ++t) {
      EXPECT_EQ(r.kv_src[r.key_rows[t]], j);
      ++seen_rows[r.key_rows[t]];
      if (t > r.key_rows_begin[j]) {
        EXPECT_LT(r.key_rows[t - 1], r.key_rows[t]) << "entry order";
      }
    }
  for (int c : seen_rows) EXPECT_EQ(c, 1) << "every packed key row is some key's, once";
  for (int i = 0; i < m.T(); ++i) {
    std::set<int> want;
    for (int j = std::max(m.lo[i], 0); j <= std::min(m.hi[i], m.S - 1); ++j) want.insert(j);
    std::set<int> got;
    if (r.q_row[i] >= 0) {
      EXPECT_EQ(r.q_src[r.q_row[i]], i);
      const int e = r.q_entry[i], p = r.q_pos[i];
      ASSERT_GE(e, 0);
      ASSERT_LT(e, n);
      EXPECT_EQ(r.q_row[i], r.q_row_offset[e] + p);
      for (int c = 0; c <= r.seq_len_kv[e] - r.seq_len_q[e] + p; ++c) got.insert(r.kv_src[r.kv_row_offset[e] + c]);
    } else {
      EXPECT_EQ(r.q_entry[i], -1);
    }
    EXPECT_EQ(got, want) << "query " << i;
  }
}

RaggedAttention ragged(const Mask& m) { return ragged_attention(m.lo.data(), m.hi.data(), m.T(), m.S); }

}  // namespace

TEST(AttentionRagged, PackedDocumentsAreOneEntryEach) {
  const std::vector<int> lens = {5, 1, 1, 130, 7, 1};
  std::vector<int> all(145);
  for (int i = 0; i < 145; ++i) all[i] = i;
  const Mask m = doc_causal(lens, all);
  const RaggedAttention r = ragged(m);
  ASSERT_EQ(r.segments.size(), lens.size());
  for (std::size_t d = 0; d < lens.size(); ++d) {
    EXPECT_EQ(r.segments[d].q_len, lens[d]);
    EXPECT_EQ(r.segments[d].kv_len, lens[d]);  // no CP: keys = the document
  }
  EXPECT_EQ(r.batch, 8);
  EXPECT_EQ(r.max_q, 130);
  EXPECT_EQ(r.s_q, 256);
  EXPECT_EQ(r.s_kv, 256);
  EXPECT_EQ(r.q_rows, 146);  // 145 tokens + the padding row
  EXPECT_EQ(r.kv_rows, 146);
  expect_same_mask(m, r);
}

TEST(AttentionRagged, ContextParallelShardsAttendTheirDocumentsPrefix) {
  const std::vector<int> lens = {40, 1, 3, 200, 17, 1, 90};
  const int S = cu_seqlens(lens).back();
  for (int cp : {1, 2, 3, 4})
    for (int r = 0; r < cp; ++r) {
      const Mask m = doc_causal(lens, cp_sequence_shard(S, cp, r));
      const RaggedAttention ra = ragged(m);
      expect_same_mask(m, ra);
      // Keys of two chunks of one document are copied per entry: Σ kv_len <= 2 S.
      EXPECT_LE(ra.kv_rows - 1, 2 * S);
    }
}

TEST(AttentionRagged, PerDocumentShardingAndEdgeCases) {
  // Per-document sharding: each document cut in 2cp chunks, rank r takes r and 2cp-1-r.
  const std::vector<int> lens = {9, 1, 33, 2};
  const auto cu = cu_seqlens(lens);
  const int cp = 2;
  for (int r = 0; r < cp; ++r) {
    std::vector<int> pos;
    for (std::size_t d = 0; d < lens.size(); ++d)
      for (int c : {r, 2 * cp - 1 - r})
        for (int i = cu[d] + lens[d] * c / (2 * cp); i < cu[d] + lens[d] * (c + 1) / (2 * cp); ++i) pos.push_back(i);
    expect_same_mask(doc_causal(lens, pos), ragged(doc_causal(lens, pos)));
  }
  // An empty CP shard (T = 0), T = 1, a length-1 micro-batch, S = 0.
  const Mask empty = doc_causal({4}, {});
  const RaggedAttention re = ragged(empty);
  EXPECT_EQ(re.batch, 0);
  EXPECT_EQ(re.q_rows, 0);
  expect_same_mask(empty, re);
  expect_same_mask(doc_causal({4, 6}, {7}), ragged(doc_causal({4, 6}, {7})));
  expect_same_mask(doc_causal({1}, {0}), ragged(doc_causal({1}, {0})));
  Mask none;
  none.S = 0;
  none.lo = {0, 0};
  none.hi = {0, 3};
  const RaggedAttention rn = ragged(none);
  EXPECT_EQ(rn.batch, 0);
  expect_same_mask(none, rn);
}

TEST(AttentionRagged, AnyMaskIsRepresentedExactly) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    Mask m;
    m.S = std::uniform_int_distribution<int>(0, 40)(rng);
    const int T = std::uniform_int_distribution<int>(0, 40)(rng);
    for (int i = 0; i < T; ++i) {  // arbitrary ranges, out of bounds and empty rows included
      const int a = std::uniform_int_distribution<int>(-3, m.S + 2)(rng);
      const int b = std::uniform_int_distribution<int>(-3, m.S + 2)(rng);
      m.lo.push_back(std::min(a, b) + (trial % 5 == 0 ? 1 : 0));
      m.hi.push_back(std::max(a, b));
    }
    expect_same_mask(m, ragged(m));
  }
}

TEST(AttentionRagged, RefusesOffsetsBeyondInt32) {
  const Mask m = doc_causal({1000}, std::vector<int>{0, 1, 2});
  EXPECT_NO_THROW(ragged_attention(m.lo.data(), m.hi.data(), m.T(), m.S, 32 * 128));
  EXPECT_THROW(ragged_attention(m.lo.data(), m.hi.data(), m.T(), m.S, std::int64_t(1) << 30), std::invalid_argument);
}

TEST(AttentionGraphKey, Bucketing) {
  EXPECT_EQ(bucket_batch(0), 0);
  EXPECT_EQ(bucket_batch(1), 1);
  EXPECT_EQ(bucket_batch(3), 4);
  EXPECT_EQ(bucket_batch(64), 64);
  EXPECT_EQ(bucket_batch(65), 128);
  EXPECT_EQ(bucket_seq_len(0), 0);
  EXPECT_EQ(bucket_seq_len(1), 64);
  EXPECT_EQ(bucket_seq_len(64), 64);
  EXPECT_EQ(bucket_seq_len(65), 128);
  EXPECT_EQ(bucket_seq_len(8191), 8192);
  EXPECT_EQ(bucket_seq_len(8193), 16384);
  EXPECT_EQ(bucket_total_rows(0), 0);
  EXPECT_EQ(bucket_total_rows(1), 256);
  EXPECT_EQ(bucket_total_rows(257), 512);
  EXPECT_EQ(bucket_total_rows(std::int64_t(3) << 20), std::int64_t(4) << 20);
  // Micro-batches of different total lengths and document counts share a key
  // when their buckets agree; another head dim, direction or bucket does not.
  std::vector<int> a(300), b(280);
  for (int i = 0; i < 300; ++i) a[i] = i;
  for (int i = 0; i < 280; ++i) b[i] = i;
  const auto ra = ragged(doc_causal({100, 150, 50}, a));
  const auto rb = ragged(doc_causal({200, 79, 1}, b));
  EXPECT_EQ(sdpa_graph_key(ra, 8, 2, 128, false), sdpa_graph_key(rb, 8, 2, 128, false));
  EXPECT_NE(sdpa_graph_key(ra, 8, 2, 128, false), sdpa_graph_key(rb, 8, 2, 128, true));
  EXPECT_NE(sdpa_graph_key(ra, 8, 2, 128, false), sdpa_graph_key(rb, 8, 2, 64, false));
  EXPECT_NE(sdpa_graph_key(ra, 8, 2, 128, false), sdpa_graph_key(rb, 8, 8, 128, false));
  const auto rc = ragged(doc_causal({260, 40}, a));  // a longer document: s 512
  EXPECT_NE(sdpa_graph_key(ra, 8, 2, 128, false), sdpa_graph_key(rc, 8, 2, 128, false));
  EXPECT_EQ(sdpa_graph_key(ra, 8, 2, 128, false).str(), "fwd b=4 s_q=256 s_kv=256 hq=8 hkv=2 d=128");
  EXPECT_EQ(sdpa_graph_key(ra, 8, 2, 128, true).str(), "bwd b=4 s_q=256 s_kv=256 rows=512/512 hq=8 hkv=2 d=128");
  // The total rows are bucketed too: 300 and 280 tokens (+1 padding row) share 512.
  EXPECT_EQ(ra.total_q, 512);
  EXPECT_EQ(rb.total_q, 512);
  std::vector<int> c600(600);
  for (int i = 0; i < 600; ++i) c600[i] = i;
  const auto rd = ragged(doc_causal({200, 200, 200}, c600));  // same b and s buckets, more rows
  EXPECT_EQ(rd.batch, ra.batch);
  EXPECT_EQ(rd.s_q, ra.s_q);
  // Only the backward's workspaces depend on the rows: the forward graph is shared.
  EXPECT_EQ(sdpa_graph_key(ra, 8, 2, 128, false), sdpa_graph_key(rd, 8, 2, 128, false));
  EXPECT_NE(sdpa_graph_key(ra, 8, 2, 128, true), sdpa_graph_key(rd, 8, 2, 128, true));
  EXPECT_THROW(sdpa_graph_key(ragged(doc_causal({4}, {})), 8, 2, 128, false), std::invalid_argument);
}

TEST(AttentionGraphKey, PlanCacheHitsMissesAndEvicts) {
  SdpaPlanCache<int> cache(2);
  int builds = 0;
  auto build = [&] { return ++builds; };
  const SdpaGraphKey k1{4, 256, 256, 512, 512, 8, 2, 128, false}, k2{4, 256, 256, 512, 512, 8, 2, 128, true},
      k3{8, 256, 256, 512, 512, 8, 2, 128, false};
  EXPECT_EQ(cache.get(k1, build), 1);
  EXPECT_EQ(cache.get(k1, build), 1);
  EXPECT_EQ(cache.get(k2, build), 2);
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_EQ(cache.misses(), 2u);
  EXPECT_EQ(cache.get(k1, build), 1);  // k1 most recent: k2 goes next
  EXPECT_EQ(cache.get(k3, build), 3);
  EXPECT_EQ(cache.evictions(), 1u);
  EXPECT_TRUE(cache.contains(k1));
  EXPECT_FALSE(cache.contains(k2));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.get(k2, build), 4);  // rebuilt after eviction
  EXPECT_EQ(builds, 4);
  // A build that throws inserts nothing.
  const SdpaGraphKey k4{16, 64, 64, 256, 256, 1, 1, 64, false};
  EXPECT_THROW(cache.get(k4, []() -> int { throw std::runtime_error("no engine"); }), std::runtime_error);
  EXPECT_FALSE(cache.contains(k4));
}

TEST(AttentionSelection, AppliesTheDeckKey) {
  EXPECT_EQ(attention_kernel_in_use(), "portable");  // before any selection
  auto c = select_attention_kernel("portable", 64, "fp32");
  EXPECT_EQ(c.kernel, "portable");
  EXPECT_EQ(attention_kernel_in_use(), "portable");
  EXPECT_NE(attention_summary().find("[model.attention_kernel=portable]"), std::string::npos) << attention_summary();
  c = select_attention_kernel("auto", 36, "bf16");  // a head dim cuDNN does not take: portable on every build
  EXPECT_EQ(c.kernel, "portable");
  EXPECT_EQ(attention_kernel_in_use(), "portable");
  if (wlb::core::cudnn_attention_built()) {
    EXPECT_NE(c.why.find("falls back from cuDNN"), std::string::npos) << c.why;
    EXPECT_EQ(select_attention_kernel("cudnn", 128, "bf16").kernel, "cudnn");
    EXPECT_EQ(attention_kernel_in_use(), "cudnn");
    EXPECT_NE(attention_summary().find("attention: cuDNN fused SDPA"), std::string::npos) << attention_summary();
  } else {
    EXPECT_THROW(select_attention_kernel("cudnn", 128, "bf16"), wlb::core::ConfigError);
    EXPECT_EQ(attention_kernel_in_use(), "portable");  // a refused selection changes nothing
    EXPECT_NE(attention_summary().find("auto: this build has no cuDNN"), std::string::npos) << attention_summary();
  }
  select_attention_kernel("portable", 64, "fp32");
}
