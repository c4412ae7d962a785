// CP sharding (docs/wlb-llm.md §3.1, §3.3, §3.5). See sharding.hpp for
// the exact rules.
#include "wlb4d/balance/sharding.hpp"

#include "wlb4d/core/error.hpp"

#include <algorithm>
#include <string>

namespace wlb::balance {
namespace {

void check_cp(int cp) {
  if (cp < 1) throw core::ConfigError("CP sharding: parallel.cp=" + std::to_string(cp) + " must be >= 1");
}

// Rank that owns slot k of 2cp.
int slot_rank(int k, int cp) { return k < cp ? k : 2 * cp - 1 - k; }

// Causal area of a query piece: Σ_{t=p}^{p+q-1} (t+1).
double area(std::int64_t p, std::int64_t q) {
  const double P = static_cast<double>(p), Q = static_cast<double>(q);
  return Q * P + Q * (Q + 1) / 2;
}

// Appends the pieces of slot [begin, end) (micro-batch token indices) split at
// span boundaries; cu = span prefix sums.
void add_range(std::vector<Piece>& out, const std::vector<std::int64_t>& cu, std::int64_t begin,
               std::int64_t end) {
  if (begin >= end) return;
  auto it = std::upper_bound(cu.begin(), cu.end(), begin);
  std::int32_t s = static_cast<std::int32_t>(it - cu.begin()) - 1;
  while (begin < end) {
    const std::int64_t span_end = cu[s + 1];
    const std::int64_t stop = std::min(end, span_end);
    out.push_back(Piece{s, begin - cu[s], stop - begin, begin});
    begin = stop;
    ++s;
  }
}

// Slot sizes of the 2cp slots of a span of d tokens (Document sharding).
// `rot` is the micro-batch-wide leftover rotation, `acc` the causal work each
// rank has accumulated from earlier spans; both are updated.
std::vector<std::int64_t> document_slots(std::int64_t d, int cp, std::int64_t& rot, std::vector<double>& acc) {
  const int n = 2 * cp;
  const std::int64_t q = d / n;
  const int r = static_cast<int>(d % n);
  std::vector<int> got(cp, 0);
  for (int j = 0; j < r; ++j) got[static_cast<std::size_t>((rot + j) % cp)]++;
  rot = (rot + r) % cp;
  std::vector<int> singles;
  for (int k = 0; k < cp; ++k)
    if (got[k] == 1) singles.push_back(k);
  std::vector<char> late(cp, 0);  // single leftover in the late slot?
  auto sizes_of = [&]() {
    std::vector<std::int64_t> sz(n, q);
    for (int k = 0; k < cp; ++k) {
      if (got[k] == 2) {
        sz[k]++;
        sz[n - 1 - k]++;
      } else if (got[k] == 1) {
        sz[late[k] ? n - 1 - k : k]++;
      }
    }
    return sz;
  };
  auto work_with = [&](const std::vector<std::int64_t>& sz) {
    std::vector<double> w = acc;
    std::int64_t p = 0;
    for (int k = 0; k < n; ++k) {
      w[slot_rank(k, cp)] += area(p, sz[k]);
      p += sz[k];
    }
    return w;
  };
  auto spread = [&](const std::vector<double>& w) {
    auto [mn, mx] = std::minmax_element(w.begin(), w.end());
    return *mx - *mn;
  };
  double cur = spread(work_with(sizes_of()));
  for (bool improved = !singles.empty() && cp > 1; improved;) {
    improved = false;
    for (int k : singles) {
      late[k] ^= 1;
      const double v = spread(work_with(sizes_of()));
      if (v < cur) {
        cur = v;
        improved = true;
      } else {
        late[k] ^= 1;
      }
    }
  }
  auto sz = sizes_of();
  acc = work_with(sz);
  return sz;
}

}  // namespace

std::vector<std::vector<Piece>> shard_pieces(const MicroBatch& mb, int cp, Sharding sharding) {
  check_cp(cp);
  const int n = 2 * cp;
  const auto cu = mb.cu_seqlens();
  const std::int64_t T = cu.back();
  std::vector<std::vector<Piece>> out(cp);
  if (sharding == Sharding::Sequence) {
    const std::int64_t base = T / n;
    const int rem = static_cast<int>(T % n);
    std::vector<std::int64_t> sz(n, base);
    // j-th leftover -> rank j mod cp: slots 0..cp-1, then 2cp-1 down to cp.
    for (int j = 0; j < rem; ++j) sz[j < cp ? j : 3 * cp - 1 - j]++;
    std::int64_t start = 0;
    for (int k = 0; k < n; ++k) {
      add_range(out[slot_rank(k, cp)], cu, start, start + sz[k]);
      start += sz[k];
    }
  } else {
    std::int64_t rot = 0;
    std::vector<double> acc(cp, 0.0);
    for (std::size_t s = 0; s < mb.spans.size(); ++s) {
      const std::int64_t d = mb.spans[s].length;
      const auto sz = document_slots(d, cp, rot, acc);
      std::int64_t p = 0;
      for (int k = 0; k < n; ++k) {
        if (sz[k] > 0) out[slot_rank(k, cp)].push_back(Piece{static_cast<std::int32_t>(s), p, sz[k], cu[s] + p});
        p += sz[k];
      }
    }
  }
  for (auto& r : out) {
    std::sort(r.begin(), r.end(), [](const Piece& x, const Piece& y) { return x.mb_start < y.mb_start; });
    // Adjacent slots of one rank inside one span form one query piece.
    std::vector<Piece> merged;
    for (const auto& pc : r) {
      if (!merged.empty() && merged.back().span == pc.span &&
          merged.back().mb_start + merged.back().length == pc.mb_start) {
        merged.back().length += pc.length;
      } else {
        merged.push_back(pc);
      }
    }
    r.swap(merged);
  }
  return out;
}

std::vector<std::vector<std::int64_t>> shard_tokens(const MicroBatch& mb, int cp, Sharding sharding) {
  const auto pieces = shard_pieces(mb, cp, sharding);
  std::vector<std::vector<std::int64_t>> out(cp);
  for (int r = 0; r < cp; ++r) {
    for (const auto& pc : pieces[r])
      for (std::int64_t t = 0; t < pc.length; ++t) out[r].push_back(pc.mb_start + t);
  }
  return out;
}

std::vector<double> causal_work(const MicroBatch& mb, int cp, Sharding sharding) {
  const auto pieces = shard_pieces(mb, cp, sharding);
  std::vector<double> w(cp, 0.0);
  for (int r = 0; r < cp; ++r)
    for (const auto& pc : pieces[r]) w[r] += area(pc.prefix, pc.length);
  return w;
}

Sharding choose_sharding(const MicroBatch& mb, int cp, const CostModel& cost) {
  if (cp <= 1) return Sharding::Sequence;
  const auto seq = cost.rank_attention(mb, cp, Sharding::Sequence);
  const auto doc = cost.rank_attention(mb, cp, Sharding::Document);
  const double s = *std::max_element(seq.begin(), seq.end());
  const double d = *std::max_element(doc.begin(), doc.end());
  return d < s ? Sharding::Document : Sharding::Sequence;
}

std::string to_string(Sharding s) { return s == Sharding::Sequence ? "sequence" : "document"; }

Sharding parse_sharding(const std::string& s) {
  if (s == "sequence") return Sharding::Sequence;
  if (s == "document") return Sharding::Document;
  throw core::ConfigError("CP sharding '" + s + "' must be sequence or document");
}

}  // namespace wlb::balance
