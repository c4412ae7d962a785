#pragma once
/// \file document_stream.hpp
/// \brief Seeded, reproducible walk over a dataset's documents (DESIGN §2.1).
///
/// Epoch e visits documents 0..n-1 (n = num_docs, or max_docs when smaller)
/// exactly once each: in id order when shuffle is false, otherwise in the
/// permutation drawn by a Fisher-Yates shuffle driven by std::mt19937_64
/// seeded with splitmix64(seed + e) and an unbiased bounded draw written here
/// (std::shuffle / std::uniform_int_distribution differ between standard
/// libraries; this does not). After the last document of an epoch the next
/// epoch starts. The position in the stream is State {epoch, position}: two
/// int64 that a checkpoint stores; restore(state) continues exactly there.
///
/// Memory: the lengths are borrowed from the dataset (or held as uint32 when
/// given as a vector) and an epoch's order is uint32: 4 bytes a document
/// (8 with the dataset's lengths). At most 2^32-1 documents a stream.

#include <cstdint>
#include <vector>

namespace wlb::data {

class TokenDataset;

/// A permutation of 0..n-1 drawn by Fisher-Yates from std::mt19937_64 seeded
/// with splitmix64(seed), with a portable unbiased bounded draw: the same on
/// every platform and standard library. Used for epochs and for the
/// train/validation split of wlb4d-prep.
std::vector<std::int64_t> seeded_permutation(std::int64_t n, std::uint64_t seed);

class DocumentStream {
 public:
  /// One document of the stream: its id in the dataset and its length in
  /// tokens (including EOS).
  struct Doc {
    std::int64_t doc_id = 0;
    std::int64_t length = 0;
    bool operator==(const Doc& o) const { return doc_id == o.doc_id && length == o.length; }
  };
  /// Where the stream stands: `position` documents of epoch `epoch` were
  /// already returned (0 <= position < docs_per_epoch()).
  struct State {
    std::int64_t epoch = 0;
    std::int64_t position = 0;
    bool operator==(const State& o) const { return epoch == o.epoch && position == o.position; }
  };

  /// \param lengths tokens per document, size num_docs.
  /// \param max_docs use only documents [0, max_docs) (< 0 or >= num_docs: all).
  /// \throws core::DataError when num_docs < 1 (after max_docs) or lengths.size() != num_docs.
  DocumentStream(std::int64_t num_docs, std::vector<std::int64_t> lengths, std::uint64_t seed, bool shuffle,
                 std::int64_t max_docs = -1);
  /// Same, with the lengths of dataset ds (borrowed: ds must outlive the stream).
  DocumentStream(const TokenDataset& ds, std::uint64_t seed, bool shuffle, std::int64_t max_docs = -1);
  /// Documents [first_doc, first_doc + num_docs) of ds (a source of a blend):
  /// next() returns their ids in ds's numbering. Lengths borrowed from ds.
  /// \throws core::DataError when the range is empty or leaves ds.
  DocumentStream(const TokenDataset& ds, std::int64_t first_doc, std::int64_t num_docs, std::uint64_t seed,
                 bool shuffle);

  DocumentStream(const DocumentStream&) = delete;  // lengths_ may point into own_lengths_
  DocumentStream& operator=(const DocumentStream&) = delete;
  DocumentStream(DocumentStream&&) noexcept = default;  // a vector's move keeps its buffer
  DocumentStream& operator=(DocumentStream&&) noexcept = default;

  /// The next document; rolls over into the next epoch after the last one.
  Doc next();
  /// The document next() would return, without advancing.
  Doc peek() const;
  State state() const { return {epoch_, pos_}; }
  /// Continues from s (as saved by state()) — same seed/shuffle/max_docs assumed.
  /// \throws core::DataError when s.epoch < 0 or s.position is outside [0, docs_per_epoch()).
  void restore(const State& s);

  std::int64_t docs_per_epoch() const { return n_; }
  /// The id of the stream's first document (0 unless a sub-range of a dataset).
  std::int64_t first_doc() const { return first_; }
  std::int64_t epoch() const { return epoch_; }
  std::uint64_t seed() const { return seed_; }
  bool shuffled() const { return shuffle_; }
  /// The visiting order of epoch e (a permutation of 0..docs_per_epoch()-1).
  std::vector<std::int64_t> epoch_order(std::int64_t e) const;

 private:
  void init();
  void start_epoch(std::int64_t e);
  std::vector<std::uint32_t> own_lengths_;  // when constructed from a vector
  const std::uint32_t* lengths_ = nullptr;  // lengths of documents first_ .. first_+n_-1
  std::int64_t first_ = 0;
  std::int64_t n_ = 0;
  std::uint64_t seed_;
  bool shuffle_;
  std::int64_t epoch_ = 0;
  std::int64_t pos_ = 0;
  std::vector<std::uint32_t> order_;  // empty: id order (unshuffled)
};

}  // namespace wlb::data
