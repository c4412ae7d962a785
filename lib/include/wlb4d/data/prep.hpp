#pragma once
/// \file prep.hpp
/// \brief Corpus -> HDF5 token dataset(s): the logic behind `wlb4d-prep`.
///
/// Steps: read the corpus (corpus.hpp rules), keep the first max_docs
/// documents, split them by document into train/validation with a seeded
/// permutation, build the tokenizer (bytes; or sentencepiece trained on the
/// training documents, or loaded from --spm-model; or a byte-level BPE from a
/// Hugging Face tokenizer.json, byte_level_bpe.hpp), encode and write each
/// split with TokenDatasetWriter.
///
/// Parallel encoding (--threads N): documents are encoded in batches by N
/// threads, each with its own copy of the tokenizer (rebuilt from its
/// model, make_tokenizer), and written in corpus order by one writer (the
/// next batch is encoded while one is written), so the datasets hold the
/// same documents, tokens and attributes for any N.
/// Shards (--shard-tokens T): OUT.h5 becomes OUT-00000.h5, OUT-00001.h5, ...,
/// a new file starting after the document that brings the current one to T
/// tokens or more (documents are never cut); read them back as one stream
/// with data.train = OUT-*.h5. Shards OUT-NNNNN.h5 left by an earlier run
/// beyond the last one written are removed.
///
/// MPI ranks (`mpiexec -n N wlb4d-prep ...`, run_prep with a communicator):
/// every rank reads the corpus and makes the same split; the tokenizer is
/// built on every rank (sentencepiece is trained on rank 0 only and its
/// model broadcast). Each split is cut into batches (at most 4,096
/// documents and about 2 MiB of text, in corpus order); batch k is encoded
/// by rank k mod N (on its --threads threads) and sent to rank 0, which
/// writes every batch in order (and encodes its own while it writes). So
/// the datasets are those of one rank, byte for byte apart from the
/// writer's version field: the same batches, the same documents, shards,
/// masks and attributes. Failures are collective: the first failing
/// rank's error (by rank) is broadcast and thrown on every rank, with the
/// same type and text (wlb4d-prep prints it once, from rank 0); no rank is
/// left waiting.

#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/data/corpus.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace wlb::data {

struct PrepOptions {
  std::vector<std::string> inputs;  ///< files or directories (corpus.hpp)
  std::string output;               ///< training dataset (.h5)
  std::string tokenizer = "bytes";  ///< "bytes" | "sentencepiece" | a tokenizer.json path (is_hf_tokenizer)
  std::string eos_token;            ///< tokenizer.json only: the EOS token's text ("" = the rule)
  int vocab_size = 8192;            ///< sentencepiece training vocabulary
  std::string spm_model;            ///< existing .model instead of training
  double val_fraction = 0.0;        ///< fraction of documents for validation, [0, 1)
  std::string val_output;           ///< validation dataset (required when val_fraction > 0)
  std::uint64_t seed = 1234;        ///< split (and sentencepiece sampling) seed
  std::int64_t max_docs = -1;       ///< first N documents only (< 0: all)
  int threads = 0;                  ///< encoding threads (0: std::thread::hardware_concurrency())
  std::int64_t shard_tokens = 0;    ///< > 0: write shards OUT-00000.h5, ... of about this many tokens
  std::vector<std::string> json_keys;  ///< --json-keys (empty: "text"; with sft: prompt,response)
  std::string txt_split = "file";     ///< --txt-split: file | blank-line | line (corpus.hpp TxtSplit)
  bool sft = false;                   ///< --sft: fine-tuning records, written with a loss mask
  bool help = false;                ///< --help was given
  bool version = false;             ///< --version was given
};

/// True when --tokenizer names a Hugging Face tokenizer.json: a path ending in ".json".
bool is_hf_tokenizer(const std::string& tokenizer);

/// Parses wlb4d-prep's command line (Boost.Program_options) and validates it.
/// \throws core::ConfigError naming the option and the rule.
PrepOptions parse_prep_args(int argc, const char* const* argv);
/// The --help text, including the corpus rules.
std::string prep_help();

/// One written dataset. Lengths are in tokens, including EOS; percentiles by
/// nearest rank.
struct SplitSummary {
  std::string path;                 ///< the file, or the shards' glob (OUT-*.h5)
  std::vector<std::string> shards;  ///< the shard files written (empty: one file)
  std::int64_t docs = 0, tokens = 0;
  std::int64_t p50 = 0, p90 = 0, p99 = 0, max = 0;
  std::int64_t loss_targets = 0;  ///< --sft: targets with loss mask 1 (dataset.hpp)
};

struct PrepSummary {
  CorpusStats corpus;
  std::string tokenizer;
  int vocab_size = 0;
  int eos_id = 0;
  bool sft = false;       ///< written with a loss mask
  std::string json_keys;  ///< the JSONL fields read, quoted ("\"text\"")
  std::string eos_token;  ///< the EOS token's text (hf-bpe only: it was chosen; "" otherwise)
  SplitSummary train;
  bool has_val = false;
  SplitSummary val;
  double read_s = 0, tokenizer_s = 0, write_s = 0, total_s = 0;  ///< wall seconds
  int threads = 1;  ///< encoding threads used (per rank)
  int ranks = 1;    ///< MPI ranks that encoded
  double encode_cpu_s = 0;  ///< CPU seconds of the encoding threads of all ranks (per-core rate = bytes / it)
};

/// Runs the whole preparation in this process (no MPI call).
/// \throws core::ConfigError for invalid options, core::DataError for input,
///         tokenizer or output failures (and when no document is left).
PrepSummary run_prep(const PrepOptions& opts);
/// Runs it on the ranks of `comm` (collective: every rank calls it with the
/// same options); rank 0 writes the outputs. opts.threads = 0 means the
/// hardware threads divided by the ranks on this host. Rank 0 returns the
/// whole summary (encode_cpu_s summed over the ranks); the others return
/// the corpus, tokenizer, ranks, threads and encode_cpu_s fields, with
/// empty splits (rank 0 alone writes and counts them).
/// \throws on every rank, the same exception (ConfigError, DataError, or
///         std::runtime_error for anything else) with the first failing
///         rank's text.
PrepSummary run_prep(const PrepOptions& opts, const comm::Communicator& comm);

/// Nearest-rank percentile (p in (0, 100]) of sorted values; 0 when empty.
std::int64_t percentile(const std::vector<std::int64_t>& sorted, double p);

/// The summary wlb4d-prep prints (several lines, each starting "wlb4d-prep:").
std::string format_summary(const PrepSummary& s);

}  // namespace wlb::data
