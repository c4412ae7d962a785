// Shards and blends: resolving a split's files, and weighted document streams (blend.hpp).
#include "wlb4d/data/blend.hpp"

#include "wlb4d/core/error.hpp"
#include "wlb4d/core/hash.hpp"
#include "wlb4d/data/dataset.hpp"

#include <glob.h>

#include <algorithm>

namespace wlb::data {

using core::DataError;

ResolvedSources resolve_sources(const std::string& key, const std::vector<core::SourceSpec>& specs) {
  ResolvedSources r;
  double total = 0;
  for (const auto& s : specs) total += s.weight;
  r.first_file.push_back(0);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::string name;
    for (const auto& p : specs[i].paths) {
      name += (name.empty() ? "" : " ") + p;
      if (!core::is_glob(p)) {
        r.files.push_back(p);
        continue;
      }
      glob_t g{};
      const int rc = ::glob(p.c_str(), 0, nullptr, &g);
      std::vector<std::string> found;
      if (rc == 0)
        for (std::size_t k = 0; k < g.gl_pathc; ++k) found.push_back(g.gl_pathv[k]);
      globfree(&g);
      if (found.empty())
        throw DataError(key + ": source " + std::to_string(i + 1) + ": '" + p +
                        "' matches no file (a glob must match at least one token dataset file)");
      std::sort(found.begin(), found.end());
      r.files.insert(r.files.end(), found.begin(), found.end());
    }
    r.first_file.push_back(static_cast<std::int64_t>(r.files.size()));
    r.weights.push_back(specs[i].weight / total);
    r.names.push_back(name);
  }
  return r;
}

BlendedStream::BlendedStream(const TokenDataset& ds, std::vector<std::int64_t> source_first_doc,
                             std::vector<double> weights, std::uint64_t seed, bool shuffle, std::int64_t max_docs)
    : first_doc_(std::move(source_first_doc)), weights_(std::move(weights)) {
  const std::size_t n = weights_.size();
  if (n == 0 || first_doc_.size() != n + 1)
    throw DataError("BlendedStream: " + std::to_string(n) + " weights and " + std::to_string(first_doc_.size()) +
                    " source boundaries (expected weights + 1)");
  double total = 0;
  for (double w : weights_) {
    if (!(w > 0)) throw DataError("BlendedStream: a source weight must be > 0");
    total += w;
  }
  for (double& w : weights_) w /= total;
  for (std::size_t s = 0; s < n; ++s) {
    std::int64_t docs = first_doc_[s + 1] - first_doc_[s];
    if (docs < 1)
      throw DataError(ds.path() + ": source " + std::to_string(s + 1) + " of the blend holds no documents");
    if (max_docs >= 0 && max_docs < docs) docs = max_docs;
    // Source 0 keeps train.seed, so one source is the stream of one file.
    const std::uint64_t sseed = s == 0 ? seed : core::splitmix64(seed + (std::uint64_t(s) << 32));
    streams_.emplace_back(ds, first_doc_[s], docs, sseed, shuffle);
  }
  tokens_.assign(n, 0);
  docs_.assign(n, 0);
}

DocumentStream::Doc BlendedStream::next() {
  std::size_t best = 0;
  if (streams_.size() > 1) {
    double total = 0;
    for (auto t : tokens_) total += double(t);
    double best_gap = 0;
    for (std::size_t s = 0; s < streams_.size(); ++s) {
      const double gap = weights_[s] * total - double(tokens_[s]);
      if (s == 0 || gap > best_gap) {
        best = s;
        best_gap = gap;
      }
    }
  }
  const auto d = streams_[best].next();
  tokens_[best] += d.length;
  docs_[best] += 1;
  return d;
}

int BlendedStream::source_of(std::int64_t doc) const {
  const auto it = std::upper_bound(first_doc_.begin(), first_doc_.end(), doc);
  return std::clamp(static_cast<int>(it - first_doc_.begin()) - 1, 0, num_sources() - 1);
}

BlendedStream::State BlendedStream::state() const {
  State st;
  for (const auto& s : streams_) st.streams.push_back(s.state());
  st.tokens = tokens_;
  st.docs = docs_;
  return st;
}

void BlendedStream::restore(const State& st) {
  const std::size_t n = streams_.size();
  if (st.streams.size() != n || st.tokens.size() != n || st.docs.size() != n)
    throw DataError("the saved data stream has " + std::to_string(st.streams.size()) + " sources, this blend " +
                    std::to_string(n) + " (data.train must name the same sources to resume)");
  for (std::size_t s = 0; s < n; ++s) streams_[s].restore(st.streams[s]);
  tokens_ = st.tokens;
  docs_ = st.docs;
}

std::vector<std::int64_t> BlendedStream::save() const {
  std::vector<std::int64_t> v{static_cast<std::int64_t>(streams_.size())};
  for (std::size_t s = 0; s < streams_.size(); ++s) {
    const auto st = streams_[s].state();
    v.insert(v.end(), {st.epoch, st.position, tokens_[s], docs_[s]});
  }
  return v;
}

void BlendedStream::load(const std::vector<std::int64_t>& v) {
  if (v.empty() || v[0] < 1 || v.size() != std::size_t(1 + 4 * v[0]))
    throw DataError("the saved data stream state has " + std::to_string(v.size()) +
                    " values, not 1 + 4 per source (a damaged checkpoint?)");
  State st;
  for (std::int64_t s = 0; s < v[0]; ++s) {
    const auto* p = v.data() + 1 + 4 * s;
    st.streams.push_back({p[0], p[1]});
    st.tokens.push_back(p[2]);
    st.docs.push_back(p[3]);
  }
  restore(st);
}

}  // namespace wlb::data
