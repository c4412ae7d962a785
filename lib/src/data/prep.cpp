// wlb4d-prep logic: options, corpus -> split -> tokenizer -> datasets (prep.hpp).
#include "wlb4d/data/prep.hpp"

#include "wlb4d/core/error.hpp"
#include "wlb4d/data/byte_level_bpe.hpp"
#include "wlb4d/data/document_stream.hpp"
#include "wlb4d/data/dataset.hpp"
#include "wlb4d/data/tokenizer.hpp"

#include <boost/program_options.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>

namespace wlb::data {

using core::ConfigError;
using core::DataError;
namespace po = boost::program_options;

namespace {

po::options_description prep_options() {
  po::options_description o("wlb4d-prep options");
  o.add_options()
      ("help,h", "print this help")
      ("version", "print the version, git hash, Kokkos, MPI and HDF5 versions and the build type")
      ("input,i", po::value<std::vector<std::string>>()->composing(),
       "corpus file or directory (repeatable): .jsonl, .jsonl.xz, .txt, .txt.xz")
      ("output,o", po::value<std::string>(), "training dataset to write (HDF5, e.g. train.h5)")
      ("tokenizer", po::value<std::string>()->default_value("bytes"),
       "bytes | sentencepiece | FILE.json (a Hugging Face tokenizer.json: byte-level BPE, e.g. GPT-2, Llama 3)")
      ("eos-token", po::value<std::string>(),
       "with a tokenizer.json: the special added token that ends every document (default: the first of "
       "<|end_of_text|>, <|endoftext|>, </s>, <eos> among its added_tokens)")
      ("vocab-size", po::value<int>()->default_value(8192),
       "sentencepiece BPE vocabulary to train (>= 300; ignored with --spm-model)")
      ("spm-model", po::value<std::string>(), "use this sentencepiece .model instead of training one")
      ("val-fraction", po::value<double>()->default_value(0.0),
       "fraction of documents written to --val-output, in [0, 1)")
      ("val-output", po::value<std::string>(), "validation dataset to write (HDF5)")
      ("seed", po::value<std::string>()->default_value("1234"),
       "seed of the train/validation split (unsigned integer)")
      ("max-docs", po::value<std::int64_t>()->default_value(-1), "use only the first N documents (-1: all)")
      ("json-keys", po::value<std::string>(),
       "comma-separated JSONL fields to read (default text): each field that holds a string is one document, "
       "in this order; with --sft, the PROMPT,RESPONSE fields (default prompt,response)")
      ("txt-split", po::value<std::string>()->default_value("file"),
       "how .txt files become documents: file (the whole file), blank-line (every paragraph: lines up to a "
       "blank line), line (every non-blank line)")
      ("sft", po::bool_switch(),
       "fine-tuning records (prompt/response or chat \"messages\"): write a loss mask so that training takes "
       "the loss on the response / assistant turns only (docs/data.md)");
  return o;
}

// --seed as text: Boost would wrap "-1" to 18446744073709551615.
std::uint64_t parse_seed(const std::string& v) {
  bool digits = !v.empty() && v.size() <= 20;
  for (char ch : v) digits = digits && ch >= '0' && ch <= '9';
  errno = 0;
  const unsigned long long x = digits ? std::strtoull(v.c_str(), nullptr, 10) : 0;
  if (!digits || errno == ERANGE)
    throw ConfigError("--seed '" + v + "' must be an unsigned integer in [0, 18446744073709551615]");
  return static_cast<std::uint64_t>(x);
}

// Refuses an output that is one of the inputs (same inode): the corpus would be
// overwritten by the dataset.
void refuse_input_as_output(const PrepOptions& o) {
  for (const std::string* out : {&o.output, &o.val_output}) {
    if (out->empty()) continue;
    for (const auto& in : o.inputs) {
      std::error_code ec;
      if (std::filesystem::equivalent(in, *out, ec))
        throw ConfigError("" + std::string(out == &o.output ? "--output" : "--val-output") + " '" +
                          *out + "' is the same file as --input '" + in +
                          "': refusing to overwrite the corpus (write the dataset elsewhere)");
    }
  }
  std::error_code ec;
  if (!o.val_output.empty() && std::filesystem::equivalent(o.output, o.val_output, ec))
    throw ConfigError("--val-output '" + o.val_output + "' is the same file as --output '" + o.output +
                      "'");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

SplitSummary write_split(const std::string& path, const std::vector<const std::string*>& docs,
                         const Tokenizer& tok, const std::string& source,
                         const std::vector<const SegmentedDoc*>* segs = nullptr) {
  TokenDatasetWriter::Options wo;
  wo.loss_mask = segs != nullptr;
  TokenDatasetWriter w(path, tok.name(), tok.vocab_size(), tok.eos_id(), source, tok.model(), wo);
  std::vector<std::int64_t> lengths;
  lengths.reserve(docs.size());
  std::vector<token_t> ids;
  std::vector<std::uint8_t> mask;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    if (segs) {
      // Each segment encoded on its own: no token spans a prompt/response boundary.
      ids.clear();
      mask.clear();
      bool last_target = false;
      for (const auto& g : *(*segs)[i]) {
        if (g.text.empty()) continue;
        const auto part = tok.encode(g.text);
        ids.insert(ids.end(), part.begin(), part.end());
        mask.insert(mask.end(), part.size(), g.target ? 1 : 0);
        last_target = g.target;
      }
      mask.push_back(last_target ? 1 : 0);  // EOS: learnt when the document ends with a response
      w.append(ids, mask);
    } else {
      ids = tok.encode(*docs[i]);
      w.append(ids);
    }
    lengths.push_back(static_cast<std::int64_t>(ids.size()) + 1);
  }
  w.finish();
  std::sort(lengths.begin(), lengths.end());
  SplitSummary s;
  s.path = path;
  s.docs = w.num_docs();
  s.tokens = w.num_tokens();
  s.loss_targets = w.loss_targets();
  s.p50 = percentile(lengths, 50);
  s.p90 = percentile(lengths, 90);
  s.p99 = percentile(lengths, 99);
  s.max = lengths.empty() ? 0 : lengths.back();
  return s;
}

// Outputs written under OUT.tmp, renamed onto OUT by commit(); removed when
// the run fails before.
struct TmpOutputs {
  std::vector<std::pair<std::string, std::string>> files;  // (tmp, final)
  std::string add(const std::string& final_path) {
    files.emplace_back(final_path + ".tmp", final_path);
    return files.back().first;
  }
  void commit() {
    for (auto& [tmp, final_path] : files) {
      std::error_code ec;
      std::filesystem::rename(tmp, final_path, ec);
      if (ec) throw DataError(tmp + ": cannot rename to " + final_path + " (" + ec.message() + ")");
      tmp.clear();
    }
  }
  ~TmpOutputs() {
    for (const auto& f : files) {
      std::error_code ec;
      if (!f.first.empty()) std::filesystem::remove(f.first, ec);
    }
  }
};

std::string human_bytes(std::int64_t b) {
  if (b < 10 * 1024) return fmt::format("{} B", b);
  if (b < 10 * 1024 * 1024) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{:.1f} MiB", b / (1024.0 * 1024.0));
}

}  // namespace

std::string prep_help() {
  std::ostringstream os;
  os << "wlb4d-prep: text corpus -> HDF5 token dataset (docs/data.md)\n\n"
     << "usage: wlb4d-prep --input FILE_OR_DIR [--input ...] --output OUT.h5\n"
     << "                  [--tokenizer bytes|sentencepiece|TOKENIZER.json] [--vocab-size N] [--spm-model FILE.model]\n"
     << "                  [--eos-token TEXT] [--val-fraction F --val-output VAL.h5]\n"
     << "                  [--seed S] [--max-docs N] [--json-keys K1,K2] [--txt-split file|blank-line|line] [--sft]\n\n"
     << prep_options() << "\n"
     << "Inputs: *.jsonl / *.jsonl.xz hold one JSON object per line, the document is its \"text\"\n"
     << "  (--json-keys k1,k2: one document per listed field holding a string, in that order);\n"
     << "  *.txt / *.txt.xz are cut by --txt-split (default file: one document per file); a directory\n"
     << "  is searched recursively for these (sorted by path, other files ignored); .xz is read\n"
     << "  through `xz -dc`.\n"
     << "Rules: a line that is not a JSON object is an error (file:line); a line without any of the\n"
     << "  fields is skipped and counted; empty or whitespace-only documents are skipped and counted;\n"
     << "  invalid UTF-8 is replaced by U+FFFD (one per invalid sequence; such documents are counted).\n"
     << "  Documents keep their boundaries; each ends with EOS in the dataset.\n"
     << "Tokenizers: bytes = UTF-8 bytes 0..255 + EOS 256 (vocab 257); sentencepiece = BPE trained on\n"
     << "  the training split (identity normalisation, byte fallback: exact round trip), stored in\n"
     << "  the dataset at /tokenizer/model; TOKENIZER.json = a Hugging Face byte-level BPE (GPT-2,\n"
     << "  Llama 3, ...: model BPE, pre_tokenizer ByteLevel or Split + ByteLevel, decoder ByteLevel),\n"
     << "  stored unchanged at /tokenizer/model (tokenizer hf-bpe). Special-token text inside a\n"
     << "  document stays text; EOS is --eos-token, else the first special added token among\n"
     << "  <|end_of_text|>, <|endoftext|>, </s>, <eos>.\n"
     << "Fine-tuning (--sft): each line is {\"prompt\", \"response\"} (or the --json-keys PROMPT,RESPONSE\n"
     << "  fields) or {\"messages\": [{\"role\", \"content\"}, ...]} (rendered \"<|role|>\\n\" content \"\\n\");\n"
     << "  the dataset gets /loss_mask: only the response / assistant tokens (and the EOS after a final\n"
     << "  response) are loss targets. A record without a non-blank response or assistant turn is an\n"
     << "  error (file:line).\n"
     << "Split: by document, a seeded permutation puts round(F * N) documents (at least 1 when F > 0)\n"
     << "  into --val-output; both files keep the corpus order.\n";
  return os.str();
}

bool is_hf_tokenizer(const std::string& tokenizer) {
  return tokenizer.size() > 5 && tokenizer.compare(tokenizer.size() - 5, 5, ".json") == 0;
}

PrepOptions parse_prep_args(int argc, const char* const* argv) {
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(prep_options()).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError(std::string(e.what()) + " (see --help)");
  }
  PrepOptions o;
  if (vm.count("help") || vm.count("version")) {
    o.help = vm.count("help") > 0;
    o.version = vm.count("version") > 0;
    return o;
  }
  if (vm.count("input")) o.inputs = vm["input"].as<std::vector<std::string>>();
  if (vm.count("output")) o.output = vm["output"].as<std::string>();
  o.tokenizer = vm["tokenizer"].as<std::string>();
  if (vm.count("eos-token")) o.eos_token = vm["eos-token"].as<std::string>();
  o.vocab_size = vm["vocab-size"].as<int>();
  if (vm.count("spm-model")) o.spm_model = vm["spm-model"].as<std::string>();
  o.val_fraction = vm["val-fraction"].as<double>();
  if (vm.count("val-output")) o.val_output = vm["val-output"].as<std::string>();
  o.seed = parse_seed(vm["seed"].as<std::string>());
  o.max_docs = vm["max-docs"].as<std::int64_t>();
  if (vm.count("json-keys")) {
    const std::string v = vm["json-keys"].as<std::string>();
    std::size_t b = 0;
    while (true) {
      const std::size_t e = v.find(',', b);
      o.json_keys.push_back(v.substr(b, e == std::string::npos ? std::string::npos : e - b));
      if (e == std::string::npos) break;
      b = e + 1;
    }
    for (const auto& k : o.json_keys)
      if (k.empty()) throw ConfigError("--json-keys '" + v + "' holds an empty field name (expected k1,k2,...)");
  }
  o.txt_split = vm["txt-split"].as<std::string>();
  parse_txt_split(o.txt_split);  // validates
  o.sft = vm["sft"].as<bool>();
  if (o.sft && !o.json_keys.empty() && o.json_keys.size() != 2)
    throw ConfigError("--json-keys with --sft names the PROMPT,RESPONSE fields: exactly 2 (got " +
                      std::to_string(o.json_keys.size()) + ")");
  return o;
}

static void validate(const PrepOptions& o) {
  if (o.inputs.empty()) throw ConfigError("--input is required (a corpus file or directory)");
  if (o.output.empty()) throw ConfigError("--output is required (the dataset to write)");
  const bool hf = is_hf_tokenizer(o.tokenizer);
  if (o.tokenizer != "bytes" && o.tokenizer != "sentencepiece" && !hf)
    throw ConfigError("--tokenizer '" + o.tokenizer +
                      "' must be bytes, sentencepiece or a Hugging Face tokenizer.json (a path ending in .json)");
  if (o.tokenizer != "sentencepiece" && !o.spm_model.empty())
    throw ConfigError("--spm-model needs --tokenizer sentencepiece");
  if (!hf && !o.eos_token.empty())
    throw ConfigError("--eos-token needs --tokenizer TOKENIZER.json (bytes and sentencepiece have a fixed EOS)");
  if (o.tokenizer == "sentencepiece" && o.spm_model.empty() && o.vocab_size < 300)
    throw ConfigError("--vocab-size " + std::to_string(o.vocab_size) +
                      " must be >= 300 (256 byte pieces + specials + characters)");
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0))
    throw ConfigError("--val-fraction " + std::to_string(o.val_fraction) + " must be in [0, 1)");
  if (o.val_fraction > 0.0 && o.val_output.empty())
    throw ConfigError("--val-fraction > 0 needs --val-output");
  if (o.val_fraction == 0.0 && !o.val_output.empty())
    throw ConfigError("--val-output needs --val-fraction > 0");
  if (!o.val_output.empty() && o.val_output == o.output)
    throw ConfigError("--val-output must differ from --output");
  if (o.max_docs == 0 || o.max_docs < -1)
    throw ConfigError("--max-docs " + std::to_string(o.max_docs) + " must be >= 1 (or -1: all)");
  refuse_input_as_output(o);
}

std::int64_t percentile(const std::vector<std::int64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  auto n = static_cast<double>(sorted.size());
  auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * n));
  rank = std::clamp<std::size_t>(rank, 1, sorted.size());
  return sorted[rank - 1];
}

PrepSummary run_prep(const PrepOptions& o) {
  validate(o);
  for (const std::string* out : {&o.output, &o.val_output}) {  // create missing parent directories
    auto parent = std::filesystem::path(*out).parent_path();
    std::error_code ec;
    if (!out->empty() && !parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec) throw DataError(*out + ": cannot create its directory (" + ec.message() + ")");
  }
  const auto t0 = std::chrono::steady_clock::now();
  PrepSummary s;
  std::vector<std::string> docs;
  std::vector<SegmentedDoc> segs;  // --sft: every document's segments (docs[i] is their text)
  if (o.sft) {
    segs = read_sft_corpus(o.inputs, &s.corpus, o.max_docs, o.json_keys.empty() ? "prompt" : o.json_keys[0],
                           o.json_keys.empty() ? "response" : o.json_keys[1]);
    docs.reserve(segs.size());
    for (const auto& d : segs) {
      std::string text;
      for (const auto& g : d) text += g.text;
      docs.push_back(std::move(text));
    }
    s.json_keys = "";
  } else {
    CorpusOptions co;
    if (!o.json_keys.empty()) co.json_keys = o.json_keys;
    co.txt_split = parse_txt_split(o.txt_split);
    docs = read_corpus(o.inputs, &s.corpus, o.max_docs, co);
    s.json_keys.clear();
    for (const auto& k : co.json_keys) s.json_keys += (s.json_keys.empty() ? "\"" : "/\"") + k + "\"";
  }
  s.read_s = seconds_since(t0);
  if (docs.empty() && o.sft) throw DataError("no fine-tuning records in the input (every line was blank)");
  if (docs.empty())
    throw DataError("no documents in the input (" + std::to_string(s.corpus.empty_skipped) +
                    " empty skipped, " + std::to_string(s.corpus.no_text_skipped) + " without " + s.json_keys + ")");

  // Split by document: the first n_val entries of a seeded permutation.
  const auto n = static_cast<std::int64_t>(docs.size());
  std::int64_t n_val = 0;
  if (o.val_fraction > 0.0) {
    n_val = std::llround(o.val_fraction * static_cast<double>(n));
    n_val = std::clamp<std::int64_t>(n_val, 1, n - 1);
    if (n < 2) throw DataError("a validation split needs at least 2 documents (have 1)");
  }
  std::vector<char> is_val(static_cast<std::size_t>(n), 0);
  if (n_val > 0) {
    auto perm = seeded_permutation(n, o.seed);
    for (std::int64_t i = 0; i < n_val; ++i) is_val[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])] = 1;
  }
  std::vector<const std::string*> train, val;
  std::vector<const SegmentedDoc*> train_segs, val_segs;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    (is_val[k] ? val : train).push_back(&docs[k]);
    if (o.sft) (is_val[k] ? val_segs : train_segs).push_back(&segs[k]);
  }

  const auto t1 = std::chrono::steady_clock::now();
  std::unique_ptr<Tokenizer> tok;
  if (o.tokenizer == "bytes") {
    tok = std::make_unique<ByteTokenizer>();
  } else if (is_hf_tokenizer(o.tokenizer)) {
    ByteLevelBpeOptions bo;
    bo.eos_token = o.eos_token;
    auto bpe = ByteLevelBpeTokenizer::load(o.tokenizer, bo);
    s.eos_token = bpe->token(bpe->eos_id());
    tok = std::move(bpe);
  } else if (!o.spm_model.empty()) {
    tok = SentencePieceTokenizer::load(o.spm_model);
  } else {
    SpmTrainOptions so;
    so.vocab_size = o.vocab_size;
    if (n_val == 0) {
      tok = SentencePieceTokenizer::train(docs, so);
    } else {
      std::vector<std::string> tr;
      tr.reserve(train.size());
      for (const auto* d : train) tr.push_back(*d);
      tok = SentencePieceTokenizer::train(tr, so);
    }
  }
  s.tokenizer_s = seconds_since(t1);
  s.sft = o.sft;
  s.tokenizer = tok->name();
  s.vocab_size = tok->vocab_size();
  s.eos_id = tok->eos_id();

  std::string inputs;
  for (const auto& in : o.inputs) inputs += (inputs.empty() ? "" : ",") + in;
  const auto t2 = std::chrono::steady_clock::now();
  std::string src = inputs;
  if (n_val > 0) src += fmt::format(" (train split: {} of {} documents, val_fraction {}, seed {})", train.size(), n, o.val_fraction, o.seed);
  // Both outputs are written as OUT.tmp and renamed only when both are
  // complete: a failure leaves existing outputs untouched and no partial file.
  TmpOutputs tmp;
  s.train = write_split(tmp.add(o.output), train, *tok, src, o.sft ? &train_segs : nullptr);
  if (n_val > 0) {
    s.has_val = true;
    s.val = write_split(tmp.add(o.val_output), val, *tok,
                        fmt::format("{} (validation split: {} of {} documents, val_fraction {}, seed {})", inputs,
                                    val.size(), n, o.val_fraction, o.seed),
                        o.sft ? &val_segs : nullptr);
  }
  tmp.commit();
  s.train.path = o.output;
  if (s.has_val) s.val.path = o.val_output;
  s.write_s = seconds_since(t2);
  s.total_s = seconds_since(t0);
  return s;
}

std::string format_summary(const PrepSummary& s) {
  std::string out;
  const auto& c = s.corpus;
  if (s.sft)
    out += fmt::format("wlb4d-prep: read {} fine-tuning records ({}) from {} file(s)", c.documents,
                       human_bytes(c.bytes), c.files);
  else
    out += fmt::format("wlb4d-prep: read {} documents ({}) from {} file(s); skipped {} empty, {} without {}",
                       c.documents, human_bytes(c.bytes), c.files, c.empty_skipped, c.no_text_skipped,
                       s.json_keys.empty() ? std::string("\"text\"") : s.json_keys);
  if (c.ignored_files) out += fmt::format(", {} other files ignored", c.ignored_files);
  out += fmt::format("; {} with invalid UTF-8 repaired\n", c.utf8_repaired);
  out += fmt::format("wlb4d-prep: tokenizer {}, vocab_size {}, eos_id {}{}\n", s.tokenizer, s.vocab_size, s.eos_id,
                     s.eos_token.empty() ? "" : " (" + s.eos_token + ")");
  auto line = [&](const char* name, const SplitSummary& x) {
    out += fmt::format(
        "wlb4d-prep: {} {}: {} documents, {} tokens; document length (tokens) p50 {} p90 {} p99 {} max {}\n", name,
        x.path, x.docs, x.tokens, x.p50, x.p90, x.p99, x.max);
    if (s.sft)
      out += fmt::format("wlb4d-prep: {} loss mask: {} of {} targets trained ({:.1f}%; response / assistant tokens "
                         "and their EOS)\n",
                         name, x.loss_targets, x.tokens - x.docs,
                         x.tokens > x.docs ? 100.0 * double(x.loss_targets) / double(x.tokens - x.docs) : 0.0);
  };
  line("train", s.train);
  if (s.has_val) line("val", s.val);
  out += fmt::format("wlb4d-prep: time {:.2f} s (read {:.2f} s, tokenizer {:.2f} s, encode+write {:.2f} s)\n",
                     s.total_s, s.read_s, s.tokenizer_s, s.write_s);
  return out;
}

}  // namespace wlb::data
