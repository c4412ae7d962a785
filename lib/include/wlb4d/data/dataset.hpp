#pragma once
/// \file dataset.hpp
/// \brief The HDF5 token dataset (DESIGN §7, docs/data.md): writer and reader.
///
/// Layout (format "wlb4d-tokens", format_version 1):
/// - `/tokens`      uint32 [num_tokens], chunked: every document's tokens
///                  followed by EOS, documents concatenated in order.
/// - `/doc_offsets` uint64 [num_docs + 1]: document d is
///                  tokens[doc_offsets[d], doc_offsets[d+1]) (its EOS last);
///                  doc_offsets[0] = 0, strictly increasing, last = num_tokens.
/// - `/tokenizer/model` uint8 [n]: the tokenizer's model (group attribute
///                  `type`): a serialized sentencepiece model
///                  ("sentencepiece-bpe", tokenizer = "sentencepiece") or
///                  the text of a Hugging Face tokenizer.json
///                  ("hf-tokenizer-json", tokenizer = "hf-bpe"); absent for bytes.
/// - `/loss_mask`   uint8 [num_tokens], optional (fine-tuning datasets,
///                  `wlb4d-prep --sft`): aligned with /tokens, chunked like it,
///                  with HDF5's Fletcher32 filter (a corrupt chunk fails on
///                  read). loss_mask[j] = 1: token j is a loss target (the
///                  model is trained to predict it from the tokens before
///                  it); 0: it is input only. A document's first token is
///                  never a target (nothing precedes it). Root attribute
///                  loss_targets (int): the count of targets with mask 1.
///                  Without /loss_mask every next token of the same document
///                  is a target.
/// - root attributes: format (string), format_version (int), vocab_size (int),
///   eos_id (int), tokenizer ("bytes" | "sentencepiece" | "hf-bpe"), source (string),
///   num_docs, num_tokens (int, informational), writer (string),
///   max_token_id (int: the largest id in /tokens, EOS included) and
///   tokens_fnv1a64 (string, 16 hex digits: FNV-1a 64 over /tokens as
///   little-endian uint32 bytes, core/hash.hpp). The last two are absent in
///   datasets written before they existed.
/// - Written by wlb4d-prep since sharded prep (additive, format_version stays 1): /tokens and
///   /doc_offsets carry HDF5's Fletcher32 filter (a checksum per chunk that
///   HDF5 verifies on every read).
///
/// Integrity (both open()s): max_token_id < vocab_size at open. Files with
/// the Fletcher32 filter: nothing more at open (O(1) in the token count); a
/// chunk that fails its checksum fails the read that touches it, naming the
/// file, the chunk's token range and its documents. Files without it but
/// with tokens_fnv1a64 (an older wlb4d-prep): one pass over /tokens at open
/// (16 MiB reads, O(tokens); collective open: by rank 0) checking every id
/// and the checksum. Files with neither: every read span's ids are checked
/// against vocab_size only (has_checksum() false: the trainer warns).
///
/// Memory: document lengths are held as uint32 (4 bytes a document) with a
/// uint64 offset every 64 documents (doc_offset() adds at most 63 lengths):
/// 4.1 bytes a document, about 0.41 GB at 100 M documents (docs/data.md has
/// the measurement). /doc_offsets is read in 8 MiB windows.
///
/// Several files (shards) open as one dataset: documents and tokens are
/// numbered in file order; every file must have the same tokenizer,
/// vocab_size, eos_id and tokenizer model.

#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/core/types.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace wlb::data {

inline constexpr const char* kTokenFormat = "wlb4d-tokens";
inline constexpr int kTokenFormatVersion = 1;

/// Read-only view of a token dataset: one file or several shard files read
/// as one. Holds the HDF5 files open (RAII; movable, not copyable). Document
/// lengths are loaded at open; tokens are read on demand, only the requested
/// hyperslab.
///
/// Errors: every failure throws core::DataError naming the file, the dataset
/// and the rule (missing file; not HDF5 / truncated; missing dataset or
/// attribute; wrong dtype or rank; offsets not starting at 0, not strictly
/// increasing or not ending at num_tokens, a document of 2^32 tokens or
/// more; max_token_id >= vocab_size; a tokens_fnv1a64 mismatch at open
/// (files without Fletcher32); shards with different tokenizers or
/// vocabularies; a token >= vocab_size or a chunk failing its Fletcher32
/// checksum on read (file, chunk token range and documents named); a span
/// outside the document or dataset).
class TokenDataset {
 public:
  /// Serial open: each rank opens the file read-only itself (no MPI needed).
  static TokenDataset open(const std::string& path);
  /// Collective open with the MPI-IO driver: every rank of comm must call it
  /// (and destroy the object) together. Rank 0 reads /doc_offsets and
  /// broadcasts them; a schema error is thrown on every rank. Later reads are
  /// independent (any rank may read any span at any time).
  static TokenDataset open(const std::string& path, const comm::Communicator& comm);
  /// Several files (shards) read as one dataset, in the given order
  /// (serial / collective as above).
  static TokenDataset open(const std::vector<std::string>& paths);
  static TokenDataset open(const std::vector<std::string>& paths, const comm::Communicator& comm);

  TokenDataset(TokenDataset&&) noexcept;
  TokenDataset& operator=(TokenDataset&&) noexcept;
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;
  ~TokenDataset();

  std::int64_t num_docs() const;
  std::int64_t num_tokens() const;
  int vocab_size() const;
  int eos_id() const;
  /// "bytes", "sentencepiece" or "hf-bpe".
  const std::string& tokenizer() const;
  /// The path given to open(); for several files "FIRST (and N more files)".
  const std::string& path() const;
  /// The `source` attribute (what the dataset was prepared from).
  const std::string& source() const;
  /// Token offset of document doc (0 <= doc <= num_docs(); num_docs() gives
  /// num_tokens()). O(64). \throws DataError when doc is out of range.
  std::int64_t doc_offset(std::int64_t doc) const;
  /// Tokens of every document (EOS included), num_docs() entries, as held in memory.
  const std::vector<std::uint32_t>& doc_lengths() const;
  /// Bytes held for the document lengths and the offset index.
  std::size_t index_bytes() const;
  /// The files, in document order; file i holds documents
  /// [file_first_doc(i), file_first_doc(i+1)) (file_first_doc(num_files()) = num_docs()).
  std::int64_t num_files() const;
  const std::string& file_path(std::int64_t i) const;
  std::int64_t file_first_doc(std::int64_t i) const;
  /// Tokens of document doc, including its EOS. \throws DataError when doc is out of range.
  std::int64_t doc_length(std::int64_t doc) const;
  /// Reads tokens [offset, offset+length) of document doc into out[0, length).
  /// \throws DataError when the span leaves the document or a token >= vocab_size.
  void read(std::int64_t doc, std::int64_t offset, std::int64_t length, token_t* out) const;
  /// Reads global tokens [begin, begin+count) (may cross documents) into out.
  /// \throws DataError when the range leaves [0, num_tokens) or a token >= vocab_size.
  void read_tokens(std::int64_t begin, std::int64_t count, token_t* out) const;
  /// "path=<abs path>;size=<bytes>;mtime=<ns>;docs=<n>;tokens=<n>;offsets_fnv1a=<hex>"
  /// (several files: one such entry each, joined by '|'): stored in
  /// checkpoints to detect a changed dataset on resume. O(num_docs) once, then cached.
  std::string identity() const;
  /// An identity() string without its path= and mtime= fields: what stays
  /// when the same files are copied, moved or touched (e.g. staged to a
  /// node-local disk). Two datasets with equal content identities have the
  /// same sizes, documents, tokens and document offsets. Never throws; a
  /// string not in identity()'s form is returned as it is.
  static std::string content_identity(const std::string& identity);
  /// /tokenizer/model: a serialized sentencepiece model or a tokenizer.json's
  /// text ("" for the bytes tokenizer); read at open.
  std::string tokenizer_model() const;
  /// Every file carries a checksum: the Fletcher32 filter or tokens_fnv1a64;
  /// false when one was written before wlb4d-prep stored either.
  bool has_checksum() const;
  /// Every file's /tokens carries the Fletcher32 filter (nothing read at open).
  bool chunk_checksums() const;
  /// Some file carries /loss_mask (fine-tuning data). In a set of files that
  /// mixes both kinds (a blend of pretraining text and fine-tuning records),
  /// the documents of a file without /loss_mask train on every target.
  bool has_loss_mask() const;
  /// Reads loss_mask [offset, offset+length) of document doc into out (1 for
  /// every token when the document's file has no /loss_mask).
  /// \throws DataError when the span leaves the document, the read fails
  ///         (Fletcher32 mismatch) or a value is not 0 or 1.
  void read_loss_mask(std::int64_t doc, std::int64_t offset, std::int64_t length, std::uint8_t* out) const;
  /// Loss targets of the span [offset, offset+length) of document doc read as
  /// one sequence: positions i < length-1 whose next token is a target, i.e.
  /// Σ loss_mask[offset+1 .. offset+length) (length-1 without /loss_mask).
  std::int64_t span_targets(std::int64_t doc, std::int64_t offset, std::int64_t length) const;
  /// Σ over the files of root attribute loss_targets, num_tokens - num_docs
  /// for a file without /loss_mask (-1 when a masked file lacks the attribute).
  std::int64_t loss_targets() const;

 private:
  struct Impl;
  explicit TokenDataset(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Writes a token dataset serially, streaming: documents are appended one by
/// one and the file is written as `<path>.tmp`, renamed to `<path>` by
/// finish() (so a crash never leaves a file that looks complete).
class TokenDatasetWriter {
 public:
  struct Options {
    std::int64_t chunk_tokens = 1 << 16;  ///< /tokens chunk: 64 Ki tokens = 256 KiB
    bool loss_mask = false;               ///< also write /loss_mask (append(tokens, mask))
  };
  /// \param tokenizer "bytes", "sentencepiece" or "hf-bpe"; model is the
  ///        serialized sentencepiece model or the tokenizer.json text
  ///        (Tokenizer::model(); required unless bytes, "" for bytes).
  /// \throws DataError when the file cannot be created or arguments are invalid.
  TokenDatasetWriter(const std::string& path, const std::string& tokenizer, int vocab_size, int eos_id,
                     const std::string& source, const std::string& model);
  TokenDatasetWriter(const std::string& path, const std::string& tokenizer, int vocab_size, int eos_id,
                     const std::string& source, const std::string& model, const Options& opts);
  /// Abandons an unfinished file (removes `<path>.tmp`).
  ~TokenDatasetWriter();
  TokenDatasetWriter(const TokenDatasetWriter&) = delete;
  TokenDatasetWriter& operator=(const TokenDatasetWriter&) = delete;

  /// Appends one document: its tokens, then EOS. tokens must not contain EOS
  /// and every id must be < vocab_size. \throws DataError otherwise.
  void append(const std::vector<token_t>& tokens);
  /// Appends one document with its loss mask: mask holds tokens.size()+1
  /// values 0/1, the last for EOS (dataset.hpp's /loss_mask). Needs
  /// Options::loss_mask (append(tokens) then writes all ones).
  /// \throws DataError as append(tokens), or for a mask of another length or
  ///         value, or without Options::loss_mask.
  void append(const std::vector<token_t>& tokens, const std::vector<std::uint8_t>& mask);
  /// Targets with mask 1 so far (dataset.hpp's loss_targets; 0 without Options::loss_mask).
  std::int64_t loss_targets() const;
  /// Writes /doc_offsets and the count attributes, closes and renames.
  void finish();
  std::int64_t num_docs() const;
  std::int64_t num_tokens() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wlb::data
