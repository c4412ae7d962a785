// The ragged layout, graph key and bucketing of the cuDNN attention kernel
// (attention_ragged.hpp). Host code, compiled on every build.
#include "wlb4d/model/attention_ragged.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace wlb::model {

int bucket_batch(int n) {
  if (n <= 0) return 0;
  int b = 1;
  while (b < n) b *= 2;
  return b;
}

int bucket_seq_len(int n) {
  if (n <= 0) return 0;
  int s = 64;
  while (s < n) s *= 2;
  return s;
}

std::int64_t bucket_total_rows(std::int64_t n) {
  if (n <= 0) return 0;
  std::int64_t s = 256;
  while (s < n) s *= 2;
  return s;
}

RaggedAttention ragged_attention(const std::int32_t* kv_lo, const std::int32_t* kv_hi, int T, int S,
                                 std::int64_t max_row_elems) {
  if (T < 0 || S < 0) throw std::invalid_argument("ragged_attention: T and S must be non-negative");
  RaggedAttention r;
  r.T = T;
  r.S = S;
  r.q_entry.assign(T, -1);
  r.q_pos.assign(T, -1);
  r.q_row.assign(T, -1);
  int prev_hi = -2;
  bool open = false;
  for (int i = 0; i < T; ++i) {
    const int lo = std::max(kv_lo[i], 0);
    const int hi = std::min(kv_hi[i], S - 1);
    if (lo > hi) {  // a row with no key
      open = false;
      continue;
    }
    if (open && lo == r.segments.back().kv_begin && hi == prev_hi + 1) {
      auto& s = r.segments.back();
      ++s.q_len;
      ++s.kv_len;
    } else {
      r.segments.push_back(RaggedSegment{i, 1, lo, hi - lo + 1});
      open = true;
    }
    prev_hi = hi;
    r.q_entry[i] = static_cast<std::int32_t>(r.segments.size() - 1);
    r.q_pos[i] = r.segments.back().q_len - 1;
  }
  const int n = static_cast<int>(r.segments.size());
  if (n == 0) {
    r.key_rows_begin.assign(static_cast<std::size_t>(S) + 1, 0);
    return r;
  }
  std::int64_t q_rows = 0, kv_rows = 0;
  for (const auto& s : r.segments) {
    r.max_q = std::max(r.max_q, s.q_len);
    r.max_kv = std::max(r.max_kv, s.kv_len);
    q_rows += s.q_len;
    kv_rows += s.kv_len;
  }
  r.batch = bucket_batch(n);
  r.s_q = bucket_seq_len(r.max_q);
  r.s_kv = bucket_seq_len(r.max_kv);
  r.q_rows = q_rows + 1;  // + the padding entries' zero row
  r.kv_rows = kv_rows + 1;
  r.total_q = bucket_total_rows(r.q_rows);
  r.total_kv = bucket_total_rows(r.kv_rows);
  if (max_row_elems > 0 && std::max(r.q_rows, r.kv_rows) * max_row_elems > std::numeric_limits<std::int32_t>::max())
    throw std::invalid_argument("ragged_attention: " + std::to_string(std::max(r.q_rows, r.kv_rows)) +
                                " packed rows of " + std::to_string(max_row_elems) +
                                " elements exceed cuDNN's int32 ragged offsets");

  r.seq_len_q.assign(r.batch, 1);
  r.seq_len_kv.assign(r.batch, 1);
  r.q_row_offset.assign(static_cast<std::size_t>(r.batch) + 1, r.q_rows - 1);
  r.kv_row_offset.assign(static_cast<std::size_t>(r.batch) + 1, r.kv_rows - 1);
  r.q_row_offset[r.batch] = r.q_rows;
  r.kv_row_offset[r.batch] = r.kv_rows;
  r.q_src.assign(r.q_rows, -1);
  r.kv_src.assign(r.kv_rows, -1);
  std::vector<std::int32_t> count(S, 0);
  std::int64_t qr = 0, kr = 0;
  for (int b = 0; b < n; ++b) {
    const auto& s = r.segments[b];
    r.seq_len_q[b] = s.q_len;
    r.seq_len_kv[b] = s.kv_len;
    r.q_row_offset[b] = qr;
    r.kv_row_offset[b] = kr;
    for (int p = 0; p < s.q_len; ++p) {
      r.q_src[qr] = s.q_begin + p;
      r.q_row[s.q_begin + p] = static_cast<std::int32_t>(qr);
      ++qr;
    }
    for (int c = 0; c < s.kv_len; ++c) {
      r.kv_src[kr++] = s.kv_begin + c;
      ++count[s.kv_begin + c];
    }
  }
  // CSR of the packed key rows per key, in entry order (a fixed order: the
  // dK/dV sums are deterministic).
  r.key_rows_begin.assign(static_cast<std::size_t>(S) + 1, 0);
  for (int j = 0; j < S; ++j) r.key_rows_begin[j + 1] = r.key_rows_begin[j] + count[j];
  r.key_rows.assign(static_cast<std::size_t>(kv_rows), 0);
  std::vector<std::int32_t> fill(r.key_rows_begin.begin(), r.key_rows_begin.end() - 1);
  for (std::int64_t row = 0; row < kv_rows; ++row) r.key_rows[fill[r.kv_src[row]]++] = static_cast<std::int32_t>(row);
  return r;
}

std::string SdpaGraphKey::str() const {
  return std::string(backward ? "bwd" : "fwd") + " b=" + std::to_string(batch) + " s_q=" + std::to_string(s_q) +
         " s_kv=" + std::to_string(s_kv) +
         (backward ? " rows=" + std::to_string(total_q) + "/" + std::to_string(total_kv) : std::string()) + " hq=" + std::to_string(heads_q) + " hkv=" + std::to_string(heads_kv) +
         " d=" + std::to_string(head_dim);
}

std::size_t SdpaGraphKeyHash::operator()(const SdpaGraphKey& k) const {
  std::size_t h = 1469598103934665603ull;
  for (std::int64_t v : {std::int64_t(k.batch), std::int64_t(k.s_q), std::int64_t(k.s_kv), k.total_q, k.total_kv,
                         std::int64_t(k.heads_q),
                         std::int64_t(k.heads_kv), std::int64_t(k.head_dim), std::int64_t(k.backward)})
    h = (h ^ static_cast<std::size_t>(v)) * 1099511628211ull;
  return h;
}

SdpaGraphKey sdpa_graph_key(const RaggedAttention& r, int heads_q, int heads_kv, int head_dim, bool backward) {
  if (r.batch <= 0) throw std::invalid_argument("sdpa_graph_key: the call has no attending query (batch 0)");
  return SdpaGraphKey{r.batch,   r.s_q,    r.s_kv,   backward ? r.total_q : 0, backward ? r.total_kv : 0,
                      heads_q, heads_kv, head_dim, backward};
}

}  // namespace wlb::model
