// DocumentStream: seeded per-epoch permutations (document_stream.hpp).
#include "wlb4d/data/document_stream.hpp"

#include "wlb4d/core/hash.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/data/dataset.hpp"

#include <limits>
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

/// Fisher-Yates, back to front, over ids of type T (the same draws for any T).
template <class T> void shuffle_ids(std::vector<T>& order, std::uint64_t seed) {
  std::mt19937_64 g(splitmix64(seed));
  for (std::size_t i = order.size(); i > 1; --i) {
    std::size_t j = static_cast<std::size_t>(bounded(g, i));
    std::swap(order[i - 1], order[j]);
  }
}

}  // namespace

std::vector<std::int64_t> seeded_permutation(std::int64_t n, std::uint64_t seed) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n < 0 ? 0 : n));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  shuffle_ids(order, seed);
  return order;
}

DocumentStream::DocumentStream(std::int64_t num_docs, std::vector<std::int64_t> lengths, std::uint64_t seed,
                               bool shuffle, std::int64_t max_docs)
    : seed_(seed), shuffle_(shuffle) {
  if (static_cast<std::int64_t>(lengths.size()) != num_docs)
    throw DataError("DocumentStream: lengths has " + std::to_string(lengths.size()) +
                    " entries, expected num_docs = " + std::to_string(num_docs));
  if (max_docs >= 0 && max_docs < num_docs) lengths.resize(static_cast<std::size_t>(max_docs));
  own_lengths_.reserve(lengths.size());
  for (auto l : lengths) {
    if (l < 0 || l > std::int64_t(std::numeric_limits<std::uint32_t>::max()))
      throw DataError("DocumentStream: a document length of " + std::to_string(l) + " is outside [0, 2^32)");
    own_lengths_.push_back(static_cast<std::uint32_t>(l));
  }
  lengths_ = own_lengths_.data();
  n_ = static_cast<std::int64_t>(own_lengths_.size());
  if (n_ == 0)
    throw DataError("DocumentStream: no documents (num_docs = " + std::to_string(num_docs) +
                    ", max_docs = " + std::to_string(max_docs) + ")");
  init();
}

DocumentStream::DocumentStream(const TokenDataset& ds, std::uint64_t seed, bool shuffle, std::int64_t max_docs)
    : DocumentStream(ds, 0, max_docs >= 0 && max_docs < ds.num_docs() ? max_docs : ds.num_docs(), seed, shuffle) {}

DocumentStream::DocumentStream(const TokenDataset& ds, std::int64_t first_doc, std::int64_t num_docs,
                               std::uint64_t seed, bool shuffle)
    : first_(first_doc), n_(num_docs), seed_(seed), shuffle_(shuffle) {
  if (num_docs < 1 || first_doc < 0 || first_doc + num_docs > ds.num_docs())
    throw DataError("DocumentStream: no documents, or documents [" + std::to_string(first_doc) + ", " +
                    std::to_string(first_doc + num_docs) + ") outside " + ds.path() + "'s " +
                    std::to_string(ds.num_docs()));
  lengths_ = ds.doc_lengths().data() + first_doc;
  init();
}

void DocumentStream::init() {
  if (n_ > std::int64_t(std::numeric_limits<std::uint32_t>::max()))
    throw DataError("DocumentStream: " + std::to_string(n_) + " documents, more than 2^32-1 in one stream");
  start_epoch(0);
}

std::vector<std::int64_t> DocumentStream::epoch_order(std::int64_t e) const {
  if (shuffle_) return seeded_permutation(docs_per_epoch(), seed_ + static_cast<std::uint64_t>(e));
  std::vector<std::int64_t> order(static_cast<std::size_t>(n_));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  return order;
}

void DocumentStream::start_epoch(std::int64_t e) {
  epoch_ = e;
  pos_ = 0;
  if (!shuffle_) return;
  order_.resize(static_cast<std::size_t>(n_));
  std::iota(order_.begin(), order_.end(), std::uint32_t{0});
  shuffle_ids(order_, seed_ + static_cast<std::uint64_t>(e));
}

DocumentStream::Doc DocumentStream::peek() const {
  const std::int64_t id = shuffle_ ? std::int64_t(order_[static_cast<std::size_t>(pos_)]) : pos_;
  return {first_ + id, std::int64_t(lengths_[static_cast<std::size_t>(id)])};
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
