#pragma once
/// \file doc_source.hpp
/// \brief The document stream a Packer draws from, and two sources for
/// simulation and tests (the trainer adapts data::DocumentStream to DocSource).

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace wlb::balance {

/// One document of the stream: its dataset id and length (tokens, >= 1).
struct Doc {
  std::int64_t doc_id = 0;
  std::int64_t length = 0;
};

/// An infinite stream of documents; epochs are the source's business.
/// Packers call next() only inside plan_step, in a deterministic order, so a
/// source restored to the same position yields the same plan.
class DocSource {
 public:
  virtual ~DocSource();
  /// The next document. A length < 1 makes the packer throw core::DataError.
  virtual Doc next() = 0;
};

/// Cycles through a fixed list of lengths: draw n gives lengths[n % size]
/// with doc_id = n (so ids are unique across epochs). For tests.
class VectorDocSource final : public DocSource {
 public:
  /// \throws core::DataError if lengths is empty.
  explicit VectorDocSource(std::vector<std::int64_t> lengths);
  Doc next() override;
  std::int64_t drawn() const { return drawn_; }  ///< documents returned so far
  void seek(std::int64_t n) { drawn_ = n; }       ///< position after n draws
 private:
  std::vector<std::int64_t> lengths_;
  std::int64_t drawn_ = 0;
};

/// I.i.d. draws (with replacement) from an empirical length distribution,
/// seeded: draw n has doc_id = n. Lengths above `clip` (tokens; 0: none) are
/// clipped. Reproducible across platforms (mt19937_64, multiply-shift index).
class SampledDocSource final : public DocSource {
 public:
  /// \throws core::DataError if lengths is empty or holds a length < 1.
  SampledDocSource(std::vector<std::int64_t> lengths, std::uint64_t seed, std::int64_t clip = 0);
  Doc next() override;
  std::int64_t drawn() const { return drawn_; }
  /// Restores the position after n draws (replays the generator).
  void seek(std::int64_t n);
 private:
  std::vector<std::int64_t> lengths_;
  std::uint64_t seed_;
  std::int64_t clip_;
  std::mt19937_64 rng_;
  std::int64_t drawn_ = 0;
};

/// Reads a JSON array of positive integers (document lengths in tokens), e.g.
/// dist_wlbllm.json. \throws core::DataError if the file is missing, is not a
/// regular file (checked before it is opened), is not a JSON array of
/// integers >= 1, or is empty.
std::vector<std::int64_t> load_lengths_json(const std::string& path);

/// `n` lengths drawn i.i.d. from `lengths` with `seed` (for threshold tuning).
std::vector<std::int64_t> sample_lengths(const std::vector<std::int64_t>& lengths, std::size_t n,
                                         std::uint64_t seed);

}  // namespace wlb::balance
