// DocumentStream: seeded per-epoch permutations (document_stream.hpp).
#include "wlb4d/data/document_stream.hpp"

#include "wlb4d/core/hash.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/data/dataset.hpp"

#include <numeric>
#include <random>

namespace wlb::data {

using core::DataError;

namespace {

using core::splitmix64;

/// Uniform integer in [0, bound) by rejection (no modulo bias); mt19937_64
/// output is specified exactly by the standard, so this is portable.
std::uint64_t bounded(std::mt19937_64& g, std::uint64_t bound) {
  const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % bound);  // multiple of bound
  std::uint64_t r;
  do r = g(); while (r >= limit);
  return r % bound;
}

std::vector<std::int64_t> lengths_of(const TokenDataset& ds) {
  std::vector<std::int64_t> l(static_cast<std::size_t>(ds.num_docs()));
  const auto& off = ds.doc_offsets();
  for (std::size_t i = 0; i < l.size(); ++i) l[i] = static_cast<std::int64_t>(off[i + 1] - off[i]);
  return l;
}

}  // namespace

std::vector<std::int64_t> seeded_permutation(std::int64_t n, std::uint64_t seed) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n < 0 ? 0 : n));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::mt19937_64 g(splitmix64(seed));
  for (std::size_t i = order.size(); i > 1; --i) {  // Fisher-Yates, back to front
    std::size_t j = static_cast<std::size_t>(bounded(g, i));
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

DocumentStream::DocumentStream(std::int64_t num_docs, std::vector<std::int64_t> lengths, std::uint64_t seed,
                               bool shuffle, std::int64_t max_docs)
    : lengths_(std::move(lengths)), seed_(seed), shuffle_(shuffle) {
  if (static_cast<std::int64_t>(lengths_.size()) != num_docs)
    throw DataError("DocumentStream: lengths has " + std::to_string(lengths_.size()) +
                    " entries, expected num_docs = " + std::to_string(num_docs));
  if (max_docs >= 0 && max_docs < num_docs) lengths_.resize(static_cast<std::size_t>(max_docs));
  if (lengths_.empty())
    throw DataError("DocumentStream: no documents (num_docs = " + std::to_string(num_docs) +
                    ", max_docs = " + std::to_string(max_docs) + ")");
  start_epoch(0);
}

DocumentStream::DocumentStream(const TokenDataset& ds, std::uint64_t seed, bool shuffle, std::int64_t max_docs)
    : DocumentStream(ds.num_docs(), lengths_of(ds), seed, shuffle, max_docs) {}

std::vector<std::int64_t> DocumentStream::epoch_order(std::int64_t e) const {
  if (shuffle_) return seeded_permutation(docs_per_epoch(), seed_ + static_cast<std::uint64_t>(e));
  std::vector<std::int64_t> order(lengths_.size());
  std::iota(order.begin(), order.end(), std::int64_t{0});
  return order;
}

void DocumentStream::start_epoch(std::int64_t e) {
  epoch_ = e;
  pos_ = 0;
  order_ = epoch_order(e);
}

DocumentStream::Doc DocumentStream::peek() const {
  std::int64_t id = order_[static_cast<std::size_t>(pos_)];
  return {id, lengths_[static_cast<std::size_t>(id)]};
}

DocumentStream::Doc DocumentStream::next() {
  Doc d = peek();
  if (++pos_ == docs_per_epoch()) start_epoch(epoch_ + 1);
  return d;
}

void DocumentStream::restore(const State& s) {
  if (s.epoch < 0 || s.position < 0 || s.position >= docs_per_epoch())
    throw DataError("DocumentStream::restore: state {epoch " + std::to_string(s.epoch) + ", position " +
                    std::to_string(s.position) + "} outside epoch >= 0, position in [0, " +
                    std::to_string(docs_per_epoch()) + ")");
  if (s.epoch != epoch_) start_epoch(s.epoch);
  pos_ = s.position;
}

}  // namespace wlb::data
