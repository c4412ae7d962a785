#pragma once
/// \file tokenizer.hpp
/// \brief Text <-> token ids. Three tokenizers (docs/data.md):
///
/// - `bytes`: every UTF-8 byte is its own token, ids 0..255, plus one special
///   token EOS = 256; vocab_size = 257. No training, no model, exact round trip
///   of any byte string; ~4x more tokens than a subword tokenizer on English.
/// - `sentencepiece`: a BPE model trained with SentencePieceTrainer on the
///   corpus (or loaded from a .model file). Trained with identity
///   normalisation, no whitespace folding, no dummy prefix and byte fallback,
///   so decode(encode(t)) == t for every valid UTF-8 text t (invalid UTF-8
///   becomes U+FFFD). ids: 0 = <unk>, 1 = <s>, 2 = </s> (EOS), then "\n" and
///   "\t" as user-defined pieces, the 256 byte pieces <0x00>..<0xFF>, then the
///   merges. The serialized model is stored in the dataset at /tokenizer/model.
/// - `hf-bpe`: a byte-level BPE read from a Hugging Face tokenizer.json
///   (GPT-2, Llama 3, ...; byte_level_bpe.hpp). The tokenizer.json bytes are
///   stored in the dataset at /tokenizer/model.
///
/// encode() never appends EOS; the dataset writer appends it to every document.
/// decode() drops EOS (and sentencepiece's other control ids).

#include "wlb4d/core/types.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace wlb::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// "bytes", "sentencepiece" or "hf-bpe" (the dataset's `tokenizer` attribute).
  virtual std::string name() const = 0;
  /// Number of ids; every id is in [0, vocab_size).
  virtual int vocab_size() const = 0;
  /// The end-of-document id appended after every document.
  virtual int eos_id() const = 0;
  /// The beginning-of-sequence id, -1 when the tokenizer has none (bytes).
  /// wlb4d never prepends it to documents; exported configs carry it.
  virtual int bos_id() const = 0;
  /// Encodes text (any bytes; see the class notes for invalid UTF-8). No EOS.
  virtual std::vector<token_t> encode(std::string_view text) const = 0;
  /// Decodes ids [ids, ids+n); EOS is dropped.
  /// \throws core::DataError for an id >= vocab_size().
  virtual std::string decode(const token_t* ids, std::size_t n) const = 0;
  std::string decode(const std::vector<token_t>& ids) const { return decode(ids.data(), ids.size()); }
  /// Serialized model ("" for bytes).
  virtual std::string model() const = 0;
};

/// UTF-8 bytes 0..255 + EOS = 256 (vocab 257).
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int kEos = 256;
  static constexpr int kVocab = 257;
  std::string name() const override { return "bytes"; }
  int vocab_size() const override { return kVocab; }
  int eos_id() const override { return kEos; }
  int bos_id() const override { return -1; }
  std::vector<token_t> encode(std::string_view text) const override;
  using Tokenizer::decode;
  std::string decode(const token_t* ids, std::size_t n) const override;
  std::string model() const override { return {}; }
};

/// Options of SentencePieceTokenizer::train.
struct SpmTrainOptions {
  int vocab_size = 8192;        ///< requested vocabulary (>= 256 + 5 + the corpus' characters)
  int num_threads = 2;          ///< trainer threads
  std::int64_t max_sentences = 2'000'000;  ///< training lines sampled at most (input_sentence_size)
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  /// Trains a BPE model on docs. Documents are cut at newlines into training
  /// lines of at most 4096 bytes (sentencepiece skips longer lines).
  /// \throws core::DataError when training fails (e.g. vocab_size too small for
  ///         the corpus' characters: SentencePiece's message is included).
  static std::unique_ptr<SentencePieceTokenizer> train(const std::vector<std::string>& docs,
                                                       const SpmTrainOptions& opts);
  /// Loads a serialized model (the bytes of a .model file or of /tokenizer/model).
  /// \param origin names the source in error messages.
  /// \throws core::DataError when the bytes are not a sentencepiece model or the
  ///         model has no EOS piece.
  static std::unique_ptr<SentencePieceTokenizer> from_serialized(const std::string& model,
                                                                 const std::string& origin);
  /// Loads a .model file. \throws core::DataError (missing/unreadable/invalid, or
  ///         not a regular file of at most kMaxModelBytes: checked before the read).
  static std::unique_ptr<SentencePieceTokenizer> load(const std::string& path);
  /// The largest model file load() reads (1 GiB; real models are a few MiB).
  static constexpr std::uintmax_t kMaxModelBytes = std::uintmax_t{1} << 30;

  ~SentencePieceTokenizer() override;
  std::string name() const override { return "sentencepiece"; }
  int vocab_size() const override;
  int eos_id() const override;
  int bos_id() const override;  ///< the model's <s> (-1 if it has none)
  int unk_id() const;           ///< the model's <unk> (-1 if it has none)
  /// The piece of an id ("<s>", "</s>", "▁the", "<0x0A>", ...).
  /// \throws core::DataError for an id outside [0, vocab_size).
  std::string piece(int id) const;
  std::vector<token_t> encode(std::string_view text) const override;
  using Tokenizer::decode;
  std::string decode(const token_t* ids, std::size_t n) const override;
  std::string model() const override { return model_; }

 private:
  SentencePieceTokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string model_;
};

/// The tokenizer a dataset (or checkpoint) was written with: name is its
/// `tokenizer` attribute, model its /tokenizer/model bytes ("" for bytes),
/// eos_id its eos_id attribute (-1: not known). hf-bpe takes its EOS from
/// eos_id (byte_level_bpe.hpp: the rule when -1); bytes and sentencepiece
/// have a fixed EOS and ignore it (tests write bytes datasets with other
/// vocabularies and EOS ids).
/// \throws core::DataError for an unknown name, an invalid model, or an
///         hf-bpe eos_id that is not a special added token's.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& model,
                                          const std::string& origin = "tokenizer", int eos_id = -1);

}  // namespace wlb::data
