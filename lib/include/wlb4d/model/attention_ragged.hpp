#pragma once
/// \file attention_ragged.hpp
/// \brief The host side of the cuDNN attention kernel: an attention call's
/// document-causal mask as cuDNN's ragged ("THD") variable-length layout, the
/// bucketed shape key of the SDPA graph, and the cache of built graphs.
///
/// Host code only (no cuDNN, no device): the cuDNN kernel
/// (lib/src/model/attention/cudnn_sdpa.cpp) and its CPU tests share it.
///
/// From kv_lo/kv_hi to ragged batch entries. attention.hpp's mask lets query i
/// attend keys kv_lo[i]..kv_hi[i]; for the document-causal mask that is its
/// document's first token up to itself, in global key order (with CP the keys
/// are all-gathered and a rank's queries are one or two chunks of each
/// document). A *segment* is a maximal run of consecutive queries with the
/// same kv_lo whose kv_hi grows by one per query: the part of one document
/// that one CP chunk holds (a whole document without CP). In cuDNN's SDPA a
/// segment is one batch entry with seq_len_q = its queries and seq_len_kv =
/// the keys its last query attends, under the causal mask with bottom-right
/// alignment (query p of the entry attends keys 0..seq_len_kv - seq_len_q + p):
/// exactly the prefix of its document up to itself. Any mask of attention.hpp
/// is representable (at worst one query per entry); rows with no key are left
/// out of the entries and get out = 0, lse = -inf.
///
/// Packing. cuDNN reads each entry at a ragged offset (cudnn-frontend
/// Tensor_attributes::set_ragged_offset: the element offset of entry b, an
/// int32 tensor [b+1][1][1][1]; the samples' "THD" layout): queries are packed
/// in segment order (the query order, empty rows dropped); keys are copied
/// per segment (a key that two chunks of one rank attend is copied twice, so
/// the backward's dK/dV of two entries never overlap and are summed here in a
/// fixed order, which keeps the backward deterministic).
///
/// Bucketing. A WLB-packed micro-batch has its own number of documents and
/// lengths every time, and a cuDNN graph is built for fixed dims (b, h, s_q,
/// s_kv, d): building one costs milliseconds to seconds. The graph's b is the
/// segment count rounded up to a power of two and its s_q, s_kv the longest
/// segment's lengths rounded up to a power of two (at least 64); the padding
/// entries are empty trailing documents (one zero query row attending one zero
/// key row after the packed data, whose outputs are discarded). Lengths below
/// the bucket are the padding mask's per-entry seq_len_q/seq_len_kv. The total
/// packed rows, rounded up to a power of two (at least 256), bound the
/// backward's workspace (max_total_seq_len_q/kv) and size the buffers. A run
/// therefore builds a few graphs per power of two of its shapes and reuses them.
///
/// Sources: cuDNN developer guide, "Scaled Dot Product Attention" (ragged
/// offsets, padding mask, bottom-right causal alignment); cudnn-frontend 1.23
/// include/cudnn_frontend/node/sdpa_support_surface.h and its SDPA samples.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace wlb::model {

/// One batch entry of the ragged layout (see the file comment).
struct RaggedSegment {
  int q_begin = 0;   ///< first query of the run (index into the T queries)
  int q_len = 0;     ///< queries (>= 1)
  int kv_begin = 0;  ///< the keys' first index (into the S keys): the run's kv_lo
  int kv_len = 0;    ///< keys its last query attends (>= q_len)
};

/// An attention call's mask in the ragged layout, with the maps the device
/// kernels use to pack q, k, v and to unpack out, lse, dq, dk, dv. Sizes are
/// element counts; "rows" are token rows of heads × head-dim elements.
struct RaggedAttention {
  int T = 0, S = 0;                    ///< queries and keys of the call
  std::vector<RaggedSegment> segments; ///< the real entries, in query order
  int max_q = 0, max_kv = 0;           ///< longest real entry (queries, keys); 0 when none
  int batch = 0;                       ///< graph b: bucket_batch(segments.size()); 0 when no segment
  int s_q = 0, s_kv = 0;               ///< graph s_q, s_kv: bucket_seq_len(max_q), bucket_seq_len(max_kv)
  std::int64_t q_rows = 0;             ///< packed query rows: Σ q_len + 1 padding row (0 when no segment)
  std::int64_t kv_rows = 0;            ///< packed key rows: Σ kv_len + 1 padding row (0 when no segment)
  /// Bucketed packed rows, bucket_total_rows(q_rows) and (kv_rows): the
  /// backward graph's max_total_seq_len_q/kv (its workspace bound) and the
  /// size the packed buffers are allocated at.
  std::int64_t total_q = 0, total_kv = 0;
  std::vector<std::int32_t> seq_len_q, seq_len_kv;  ///< [batch] per entry (padding entries: 1 and 1)
  std::vector<std::int64_t> q_row_offset;   ///< [batch + 1] first packed query row of each entry (padding entries: q_rows - 1); last = q_rows
  std::vector<std::int64_t> kv_row_offset;  ///< [batch + 1] first packed key row of each entry (padding entries: kv_rows - 1); last = kv_rows
  std::vector<std::int32_t> q_src;   ///< [q_rows] query held by each packed query row (-1: the padding row)
  std::vector<std::int32_t> kv_src;  ///< [kv_rows] key held by each packed key row (-1: the padding row)
  std::vector<std::int32_t> q_entry; ///< [T] batch entry of query i (-1: a row with no key)
  std::vector<std::int32_t> q_pos;   ///< [T] position of query i in its entry (-1: a row with no key)
  std::vector<std::int32_t> q_row;   ///< [T] packed query row of query i (-1: a row with no key)
  /// dK/dV gather (CSR over the S keys): the packed key rows holding key j are
  /// key_rows[key_rows_begin[j] .. key_rows_begin[j+1]), in entry order.
  std::vector<std::int32_t> key_rows_begin;  ///< [S + 1]
  std::vector<std::int32_t> key_rows;        ///< [Σ kv_len]
};

/// The ragged form of the mask kv_lo/kv_hi (attention.hpp: query i attends keys
/// max(kv_lo[i], 0)..min(kv_hi[i], S-1); an empty range is a row with no key).
/// \param kv_lo, kv_hi host arrays of T entries (key indices, 0-based, in
///   the global key order of the call)
/// \param max_row_elems elements of one packed row, heads × head dim (the
///   larger of the query and key rows'); 0 skips the int32 check below
/// \throws std::invalid_argument if T or S is negative, or if a packed element
///   offset (rows × heads × head dim) could exceed int32 for heads × head dim
///   up to `max_row_elems` (cuDNN's ragged offsets are int32).
RaggedAttention ragged_attention(const std::int32_t* kv_lo, const std::int32_t* kv_hi, int T, int S,
                                 std::int64_t max_row_elems = 0);

/// The graph's batch dim for n segments: the next power of two >= n (n >= 1); 0 for 0.
int bucket_batch(int n);
/// The graph's sequence dim for a longest entry of n tokens: the next power of
/// two >= max(n, 64); 0 for 0.
int bucket_seq_len(int n);

/// The packed token rows of a call rounded up to a power of two (at least
/// 256); 0 for 0.
std::int64_t bucket_total_rows(std::int64_t n);

/// What a cuDNN SDPA graph is built for: the bucketed dims, the heads and head
/// dim of this rank's call, and the direction. Equal keys share a graph.
struct SdpaGraphKey {
  int batch = 0, s_q = 0, s_kv = 0;  ///< bucketed b, s_q, s_kv
  /// Bucketed packed rows (RaggedAttention::total_q/kv) for the backward, whose
  /// max_total_seq_len sizes its workspaces; 0 for the forward, which does not
  /// use them (so calls that differ only there share a forward graph).
  std::int64_t total_q = 0, total_kv = 0;
  int heads_q = 0, heads_kv = 0;     ///< Hq, Hkv (GQA: Hq a multiple of Hkv)
  int head_dim = 0;                  ///< D
  bool backward = false;             ///< the backward graph (dQ, dK, dV) instead of the forward (O, stats)
  friend bool operator==(const SdpaGraphKey& a, const SdpaGraphKey& b) {
    return a.batch == b.batch && a.s_q == b.s_q && a.s_kv == b.s_kv && a.total_q == b.total_q &&
           a.total_kv == b.total_kv && a.heads_q == b.heads_q &&
           a.heads_kv == b.heads_kv && a.head_dim == b.head_dim && a.backward == b.backward;
  }
  friend bool operator!=(const SdpaGraphKey& a, const SdpaGraphKey& b) { return !(a == b); }
  std::string str() const;  ///< "bwd b=8 s_q=1024 s_kv=2048 rows=4096/8192 hq=8 hkv=2 d=128" (no rows= for fwd)
};
struct SdpaGraphKeyHash {
  std::size_t operator()(const SdpaGraphKey& k) const;
};

/// The key of the graph that runs `r` (r.batch > 0).
/// \throws std::invalid_argument when r.batch is 0 (no query attends a key:
///   the kernel writes out = 0, lse = -inf without a graph).
SdpaGraphKey sdpa_graph_key(const RaggedAttention& r, int heads_q, int heads_kv, int head_dim, bool backward);

/// Built graphs by key, least recently used evicted past `capacity`. Plan is
/// whatever the kernel keeps (a cudnn-frontend graph and its workspace size);
/// build() makes one on a miss. Not thread-safe (one per rank and thread).
/// LRU because a run's shapes drift (WLB packing, growing documents) while a
/// few buckets stay hot; 64 graphs bound the memory the plans hold.
template <class Plan>
class SdpaPlanCache {
 public:
  explicit SdpaPlanCache(std::size_t capacity = 64) : capacity_(capacity < 1 ? 1 : capacity) {}
  /// The plan for `key`, built by `build()` (returning Plan) on a miss. The
  /// reference stays valid until a later get() evicts the entry (capacity
  /// misses later at the earliest). An exception of build() propagates and
  /// leaves the cache as it was.
  template <class Build>
  Plan& get(const SdpaGraphKey& key, Build&& build) {
    auto it = index_.find(key);
    if (it != index_.end()) {
      ++hits_;
      order_.splice(order_.begin(), order_, it->second);
      return it->second->second;
    }
    ++misses_;
    Plan plan = build();  // may throw: nothing is inserted then
    order_.emplace_front(key, std::move(plan));
    index_[key] = order_.begin();
    if (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
      ++evictions_;
    }
    return order_.front().second;
  }
  bool contains(const SdpaGraphKey& key) const { return index_.count(key) != 0; }
  std::size_t size() const { return order_.size(); }
  std::size_t hits() const { return hits_; }
  std::size_t misses() const { return misses_; }
  std::size_t evictions() const { return evictions_; }

 private:
  std::size_t capacity_;
  std::list<std::pair<SdpaGraphKey, Plan>> order_;  // most recently used first
  std::unordered_map<SdpaGraphKey, typename std::list<std::pair<SdpaGraphKey, Plan>>::iterator, SdpaGraphKeyHash>
      index_;
  std::size_t hits_ = 0, misses_ = 0, evictions_ = 0;
};

}  // namespace wlb::model
