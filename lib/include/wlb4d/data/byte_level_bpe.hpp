#pragma once
/// \file byte_level_bpe.hpp
/// \brief Byte-level BPE tokenizers read from a Hugging Face `tokenizer.json`
/// (GPT-2, GPT-NeoX, Llama 3, Qwen-style vocabularies): the dataset's
/// `tokenizer` attribute is "hf-bpe" and /tokenizer/model holds the
/// tokenizer.json bytes unchanged (docs/data.md "Tokenizers").
///
/// Algorithm. Byte-pair encoding (Sennrich, Haddow and Birch, "Neural Machine
/// Translation of Rare Words with Subword Units", ACL 2016) over bytes, as
/// GPT-2 introduced it (Radford et al. 2019, openai/gpt-2 encoder.py): the
/// text is cut into pre-tokens by regular expressions, each pre-token's UTF-8
/// bytes become the characters of GPT-2's `bytes_to_unicode` alphabet (so
/// every byte string has a spelling in the vocabulary and no <unk> exists),
/// and the BPE merges are applied inside each pre-token, lowest merge rank
/// first; equal ranks left to right. This is the order of Hugging Face's
/// tokenizers crate (models/bpe/word.rs `merge_all`), which defines the ids a
/// tokenizer.json means; tests/tools/hf_bpe_peer.sh compares with it.
///
/// Encoding, step by step, as the tokenizers crate applies a tokenizer.json:
/// 1. Invalid UTF-8 becomes U+FFFD (one per maximal invalid sequence:
///    corpus.hpp repair_utf8): HF's tokenizers accept only valid UTF-8.
/// 2. `pre_tokenizer`: a `ByteLevel`, or a `Sequence` of `Split` steps
///    followed by one `ByteLevel` (Llama 3). `Split` = {pattern: {Regex: R}
///    or {String: S}, behavior: "Isolated", invert: any (Isolated keeps
///    matches and the text between them, so invert changes nothing)}: every
///    piece is cut into its matches and the gaps between them. `ByteLevel` =
///    {add_prefix_space: a space is put before every piece that does not
///    start with one; use_regex: pieces are cut by GPT-2's pattern
///    `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`}.
///    Regexes are matched by PCRE2 (UTF + Unicode properties, JIT-compiled
///    when the library has a JIT), each on its piece alone (lookarounds do
///    not see past it), as Oniguruma does in the tokenizers crate.
/// 3. `model` (type "BPE"): the pre-token's bytes as alphabet characters;
///    with `ignore_merges` true (Llama 3) a pre-token that is itself in the
///    vocabulary is that one token; otherwise the merges run as above.
///    Results are cached per pre-token (up to kCacheEntries pre-tokens of at
///    most kCacheWordBytes bytes).
/// Added tokens are not searched for in the text: "<|endoftext|>" inside a
/// document is encoded as the characters it consists of (HF's tokenizers
/// would emit the special id; tiktoken's encode() refuses such text). So a
/// document can never contain EOS, and what a document says stays text.
/// encode() adds no special tokens (no BOS, no post_processor template) and
/// ignores `truncation` and `padding`; the dataset writer appends EOS after
/// every document.
///
/// Decoding (`decoder` ByteLevel): each token's characters map back to bytes
/// through the alphabet; a token with a character outside it (an added
/// token such as "<|begin_of_text|>" is inside it, one such as "<→>" is
/// not) contributes its own UTF-8 bytes, as the crate's ByteLevel decoder
/// does. The bytes are concatenated and returned as they are (an id sequence
/// cut inside a character keeps the partial bytes; HF would show U+FFFD).
/// EOS is dropped (Tokenizer interface). decode(encode(t)) == t for every
/// valid UTF-8 text t.
///
/// Special ids. vocab_size = 1 + the largest id of `model.vocab` and
/// `added_tokens` (ids without a token are legal and refused by decode()).
/// EOS: ByteLevelBpeOptions::eos_token / eos_id when given, else the first
/// special added token whose content is one of kEosCandidates
/// ("<|end_of_text|>" Llama 3, "<|endoftext|>" GPT-2/NeoX/Qwen, "</s>",
/// "<eos>"). BOS: the first special added token among kBosCandidates
/// ("<|begin_of_text|>", "<|startoftext|>", "<s>", "<bos>"), else -1;
/// wlb4d never prepends it (exported configs carry it).
///
/// Refused, each with a core::DataError naming the origin (file or dataset),
/// the field and the rule: text that is not JSON; a `model.type` other than
/// "BPE"; a missing or malformed `model.vocab` (object of string -> id >= 0,
/// ids unique) or `model.merges` ("a b" strings or ["a", "b"] pairs whose
/// parts and concatenation are all in the vocabulary); a
/// `continuing_subword_prefix` / `end_of_word_suffix` other than null or "";
/// `dropout` > 0 (sampled merges: not reproducible); a `normalizer` other
/// than null; a `pre_tokenizer` other than the shapes above (missing, other
/// types, other Split behaviours, ByteLevel not last); a regex PCRE2 does not
/// compile (its message and offset); a `decoder` other than ByteLevel; a
/// vocabulary without a token for each of the 256 byte characters; an added
/// token with `special` false (HF matches those inside text, which wlb4d
/// does not do), with an id held by a different vocabulary token, or two
/// added tokens on one id; no EOS found by the rule, or a named EOS that is
/// not a special added token.

#include "wlb4d/data/tokenizer.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace wlb::data {

/// GPT-2's byte-to-unicode alphabet (openai/gpt-2 encoder.py bytes_to_unicode):
/// the UTF-8 text of the character byte b stands for in byte-level BPE
/// vocabularies: printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') as
/// themselves, the other 68 bytes as U+0100 + n in byte order (' ' -> 'Ġ',
/// '\n' -> 'Ċ').
std::string byte_level_char(int b);

/// Which token ends a document (and, with a dataset, which one did).
struct ByteLevelBpeOptions {
  std::string eos_token;  ///< content of the EOS token ("" = the rule above)
  int eos_id = -1;        ///< or its id, e.g. a dataset's eos_id attribute (-1 = the rule)
};

class ByteLevelBpeTokenizer final : public Tokenizer {
 public:
  /// The dataset/checkpoint `tokenizer` attribute of this tokenizer.
  static constexpr const char* kName = "hf-bpe";
  /// The largest tokenizer.json load() reads (Llama 3's is 9 MB).
  static constexpr std::uintmax_t kMaxFileBytes = std::uintmax_t{1} << 30;
  /// Pre-tokens whose ids are kept for reuse; further ones are not cached.
  static constexpr std::size_t kCacheEntries = std::size_t{1} << 18;
  /// Longer pre-tokens are not cached.
  static constexpr std::size_t kCacheWordBytes = 256;
  static constexpr std::array<const char*, 4> kEosCandidates = {"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"};
  static constexpr std::array<const char*, 4> kBosCandidates = {"<|begin_of_text|>", "<|startoftext|>", "<s>",
                                                                "<bos>"};

  /// Builds the tokenizer from the text of a tokenizer.json.
  /// \param origin names the source in error messages (a file, a dataset).
  /// \throws core::DataError for every refusal listed in the file notes.
  static std::unique_ptr<ByteLevelBpeTokenizer> from_json(const std::string& json, const std::string& origin,
                                                          const ByteLevelBpeOptions& opts = {});
  /// Reads a tokenizer.json file. \throws core::DataError (missing,
  /// unreadable, not a regular file of at most kMaxFileBytes, or refused).
  static std::unique_ptr<ByteLevelBpeTokenizer> load(const std::string& path, const ByteLevelBpeOptions& opts = {});

  ~ByteLevelBpeTokenizer() override;
  std::string name() const override { return kName; }
  int vocab_size() const override;
  int eos_id() const override;
  int bos_id() const override;
  /// The text of an id as tokenizer.json spells it ("Ġthe", "<|endoftext|>").
  /// \throws core::DataError for an id outside [0, vocab_size) or without a token.
  std::string token(int id) const;
  /// The id of a vocabulary or added token's text, -1 when there is none.
  int token_id(std::string_view text) const;
  std::size_t num_merges() const;
  /// Whether the pre-tokenizer regexes run JIT-compiled (PCRE2 built with JIT).
  bool jit() const;
  /// Thread-safe: concurrent calls share the pre-token cache under a mutex.
  std::vector<token_t> encode(std::string_view text) const override;
  using Tokenizer::decode;
  /// \throws core::DataError for an id >= vocab_size or without a token.
  std::string decode(const token_t* ids, std::size_t n) const override;
  /// The tokenizer.json text it was built from (stored in /tokenizer/model).
  std::string model() const override;

 private:
  ByteLevelBpeTokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wlb::data
