#pragma once
/// \file blend.hpp
/// \brief Shards and blends (DESIGN §13, docs/data.md "Shards and blends"):
/// the files of a split key resolved, and the document stream over weighted
/// sources.
///
/// A split (core::parse_sources) is a list of sources, each a weight and a
/// list of files or glob patterns. The files of all sources open as one
/// TokenDataset (source by source, each source's files in order), so every
/// source is a contiguous range of document ids and the packer, the planner
/// and the executor see documents exactly as for one file.
///
/// BlendedStream draws documents from the sources by weight, in tokens, as
/// Megatron-LM's blended dataset does with samples (megatron/core/datasets/
/// helpers.cpp, build_blending_indices): before every draw the source whose
/// share of the tokens drawn so far is furthest below its weight,
///   argmax_s  w_s · T − t_s     (T = Σ t_s; ties: the lowest s),
/// gives its next document. No randomness: the same on every rank and
/// platform. Each source is its own DocumentStream (own epochs, own seeded
/// reshuffle per epoch; source 0 uses train.seed as a single file always
/// did, source s > 0 splitmix64(seed + s·2^32)), and the blend's state —
/// every source's epoch and position and tokens/documents drawn — is what a
/// checkpoint stores, so a resume on any layout continues the same sequence.

#include "wlb4d/core/sources.hpp"
#include "wlb4d/data/document_stream.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace wlb::data {

class TokenDataset;

/// A split's files, resolved.
struct ResolvedSources {
  std::vector<std::string> files;       ///< every file, source by source
  std::vector<std::int64_t> first_file; ///< n+1 entries: source s is files [first_file[s], first_file[s+1])
  std::vector<double> weights;          ///< normalised to sum 1
  std::vector<std::string> names;       ///< a source's paths as written in the deck, joined by ' '
};

/// Expands glob patterns (`*`, `?`, `[`: glob(3), matches sorted by path) and
/// keeps plain paths as written (a missing one is reported by the open).
/// \throws core::DataError "<key>: source N: 'PATTERN' matches no file".
ResolvedSources resolve_sources(const std::string& key, const std::vector<core::SourceSpec>& specs);

class BlendedStream {
 public:
  struct State {
    std::vector<DocumentStream::State> streams;  ///< per source
    std::vector<std::int64_t> tokens;            ///< tokens drawn per source
    std::vector<std::int64_t> docs;              ///< documents drawn per source
    bool operator==(const State& o) const { return streams == o.streams && tokens == o.tokens && docs == o.docs; }
  };
  /// \param source_first_doc n+1 document boundaries in ds: source s is
  ///        documents [source_first_doc[s], source_first_doc[s+1]).
  /// \param weights n weights > 0 (normalised here).
  /// \param max_docs each source uses only its first max_docs documents (< 0: all).
  /// \throws core::DataError when a source is empty or the arguments disagree.
  BlendedStream(const TokenDataset& ds, std::vector<std::int64_t> source_first_doc, std::vector<double> weights,
                std::uint64_t seed, bool shuffle, std::int64_t max_docs = -1);

  /// The next document (id in ds's numbering, length).
  DocumentStream::Doc next();
  int num_sources() const { return static_cast<int>(streams_.size()); }
  /// The source holding document doc of ds. Never throws: a doc outside
  /// [source_first_doc[0], source_first_doc[n]) is clamped to the first or
  /// last source.
  int source_of(std::int64_t doc) const;
  /// Tokens drawn so far per source (n entries; whole documents as next()
  /// returned them, counted in tokens, across epochs and restores).
  const std::vector<std::int64_t>& tokens_drawn() const { return tokens_; }
  /// The sampling weights, normalised to sum 1 (n entries).
  const std::vector<double>& weights() const { return weights_; }
  /// Source s's stream (its epoch, documents per epoch).
  const DocumentStream& stream(int s) const { return streams_.at(std::size_t(s)); }

  State state() const;
  /// \throws core::DataError when s has another number of sources or a position outside its source.
  void restore(const State& s);
  /// State as 1 + 4·n int64s for a checkpoint (/state/data_sources): n, then
  /// per source its epoch, position, tokens drawn and documents drawn.
  std::vector<std::int64_t> save() const;
  /// Restores save()'s form.
  /// \throws core::DataError when v is not 1 + 4·v[0] values, when v[0]
  ///         differs from num_sources() (the checkpoint blends another number
  ///         of sources), or when a position lies outside its source.
  void load(const std::vector<std::int64_t>& v);

 private:
  std::vector<DocumentStream> streams_;
  std::vector<std::int64_t> first_doc_;
  std::vector<double> weights_;
  std::vector<std::int64_t> tokens_, docs_;
};

}  // namespace wlb::data
