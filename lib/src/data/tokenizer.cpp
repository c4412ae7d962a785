// Byte and SentencePiece tokenizers (see tokenizer.hpp).
#include "wlb4d/data/tokenizer.hpp"

#include "wlb4d/core/error.hpp"
#include "wlb4d/data/byte_level_bpe.hpp"

#include "model_file.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

namespace wlb::data {

using core::DataError;

// ---------------------------------------------------------------- bytes

std::vector<token_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<token_t> ids(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const token_t* ids, std::size_t n) const {
  std::string s;
  s.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (ids[i] < 256) {
      s.push_back(static_cast<char>(ids[i]));
    } else if (ids[i] != static_cast<token_t>(kEos)) {
      throw DataError("bytes tokenizer: id " + std::to_string(ids[i]) + " at position " +
                      std::to_string(i) + " is not below vocab_size 257");
    }
  }
  return s;
}

// ---------------------------------------------------------------- sentencepiece

struct SentencePieceTokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

SentencePieceTokenizer::SentencePieceTokenizer() : impl_(std::make_unique<Impl>()) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

namespace {

/// Feeds documents to the trainer line by line, cutting lines longer than
/// kMaxLine bytes at a UTF-8 character boundary.
class DocLines final : public sentencepiece::SentenceIterator {
 public:
  static constexpr std::size_t kMaxLine = 4096;
  explicit DocLines(const std::vector<std::string>& docs) : docs_(docs) { advance(); }
  bool done() const override { return doc_ >= docs_.size(); }
  void Next() override { advance(); }
  const std::string& value() const override { return cur_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void advance() {
    while (doc_ < docs_.size()) {
      const std::string& d = docs_[doc_];
      if (pos_ >= d.size()) {
        ++doc_;
        pos_ = 0;
        continue;
      }
      std::size_t nl = d.find('\n', pos_);
      std::size_t end = nl == std::string::npos ? d.size() : nl;
      if (end - pos_ > kMaxLine) {
        end = pos_ + kMaxLine;
        while (end > pos_ && (static_cast<unsigned char>(d[end]) & 0xC0) == 0x80) --end;
        if (end == pos_) end = pos_ + kMaxLine;  // not UTF-8: cut anywhere
      }
      cur_.assign(d, pos_, end - pos_);
      pos_ = (end < d.size() && d[end] == '\n') ? end + 1 : end;
      if (!cur_.empty()) return;
    }
    cur_.clear();
  }
  const std::vector<std::string>& docs_;
  std::size_t doc_ = 0, pos_ = 0;
  std::string cur_;
};

}  // namespace

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::train(
    const std::vector<std::string>& docs, const SpmTrainOptions& opts) {
  if (opts.vocab_size < 300)
    throw DataError("sentencepiece: vocab_size " + std::to_string(opts.vocab_size) +
                    " too small (needs >= 300: 256 byte pieces + specials + characters)");
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(opts.vocab_size)},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"split_digits", "true"},
      {"user_defined_symbols", "\n,\t"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"character_coverage", "0.9995"},
      {"input_sentence_size", std::to_string(opts.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", std::to_string(DocLines::kMaxLine)},
      {"num_threads", std::to_string(opts.num_threads)},
      {"minloglevel", "2"},
  };
  DocLines lines(docs);
  if (lines.done()) throw DataError("sentencepiece: cannot train on an empty corpus");
  std::string model;
  auto st = sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
  if (!st.ok())
    throw DataError("sentencepiece: training a BPE model of vocab_size " +
                    std::to_string(opts.vocab_size) + " failed: " + st.ToString());
  return from_serialized(model, "trained model");
}

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::from_serialized(
    const std::string& model, const std::string& origin) {
  std::unique_ptr<SentencePieceTokenizer> t(new SentencePieceTokenizer());
  auto st = t->impl_->sp.LoadFromSerializedProto(model);
  if (!st.ok())
    throw DataError(origin + ": not a valid sentencepiece model (" + st.ToString() + ")");
  if (t->impl_->sp.eos_id() < 0)
    throw DataError(origin + ": sentencepiece model has no EOS piece (train with eos_id >= 0)");
  t->model_ = model;
  return t;
}

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::load(const std::string& path) {
  return from_serialized(detail::read_model_file(path, "sentencepiece model file", kMaxModelBytes), path);
}

namespace detail {

std::string read_model_file(const std::string& path, const std::string& what, std::uintmax_t max_bytes) {
  namespace fs = std::filesystem;
  const std::string limit = max_bytes == (std::uintmax_t{1} << 30) ? "1 GiB" : std::to_string(max_bytes) + " bytes";
  std::error_code ec;
  const auto st = fs::status(path, ec);  // follows symlinks
  if (!ec && fs::exists(st) && !fs::is_regular_file(st))
    throw DataError(path + ": " + what + " is not a regular file (a device, FIFO or directory); " +
                    "it must be a regular file of at most " + limit);
  if (!ec && fs::is_regular_file(st)) {
    const auto size = fs::file_size(path, ec);
    if (!ec && size > max_bytes)
      throw DataError(path + ": " + what + " is " + std::to_string(size) +
                      " bytes; it must be a regular file of at most " + limit);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": cannot open " + what);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace detail

int SentencePieceTokenizer::vocab_size() const { return impl_->sp.GetPieceSize(); }
int SentencePieceTokenizer::eos_id() const { return impl_->sp.eos_id(); }
int SentencePieceTokenizer::bos_id() const { return impl_->sp.bos_id(); }
int SentencePieceTokenizer::unk_id() const { return impl_->sp.unk_id(); }
std::string SentencePieceTokenizer::piece(int id) const {
  if (id < 0 || id >= vocab_size())
    throw DataError("sentencepiece: id " + std::to_string(id) + " is outside the vocabulary [0, " +
                    std::to_string(vocab_size()) + ")");
  return impl_->sp.IdToPiece(id);
}

std::vector<token_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  auto st = impl_->sp.Encode(text, &ids);
  if (!st.ok()) throw DataError("sentencepiece: encode failed: " + st.ToString());
  return std::vector<token_t>(ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::decode(const token_t* ids, std::size_t n) const {
  const int v = vocab_size();
  std::vector<int> in;
  in.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (ids[i] >= static_cast<token_t>(v))
      throw DataError("sentencepiece tokenizer: id " + std::to_string(ids[i]) + " at position " +
                      std::to_string(i) + " is not below vocab_size " + std::to_string(v));
    in.push_back(static_cast<int>(ids[i]));
  }
  std::string out;
  auto st = impl_->sp.Decode(in, &out);
  if (!st.ok()) throw DataError("sentencepiece: decode failed: " + st.ToString());
  return out;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& model,
                                          const std::string& origin, int eos_id) {
  if (name == "bytes") return std::make_unique<ByteTokenizer>();
  if (name == "sentencepiece") return SentencePieceTokenizer::from_serialized(model, origin);
  if (name == ByteLevelBpeTokenizer::kName) {
    // The EOS of a byte-level BPE tokenizer is a choice made when the data
    // was prepared (--eos-token): the recorded id is the one to use.
    ByteLevelBpeOptions o;
    o.eos_id = eos_id;
    return ByteLevelBpeTokenizer::from_json(model, origin, o);
  }
  throw DataError(origin + ": unknown tokenizer '" + name + "' (expected bytes, sentencepiece or " +
                  ByteLevelBpeTokenizer::kName + ")");
}

}  // namespace wlb::data
