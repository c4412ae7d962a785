// wlb4d-prep logic: options, corpus -> split -> tokenizer -> datasets (prep.hpp).
#include "wlb4d/data/prep.hpp"

#include "wlb4d/core/error.hpp"
#include "wlb4d/core/fault.hpp"
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
#include <atomic>
#include <exception>
#include <filesystem>
#include <future>
#include <thread>
#include <time.h>
#include <unistd.h>
#include <memory>
#include <sstream>
#include <stdexcept>

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
      ("threads", po::value<int>()->default_value(0),
       "encoding threads, each with its own copy of the tokenizer (0: all hardware threads); "
       "the output does not depend on it")
      ("shard-tokens", po::value<std::int64_t>()->default_value(0),
       "write OUT-00000.h5, OUT-00001.h5, ... of about this many tokens each (documents are not cut; 0: one "
       "file); read them with data.train = OUT-*.h5")
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

/// OUT.h5 -> OUT-00007.h5 (shard 7); OUT without .h5 -> OUT-00007.h5.
std::string shard_path(const std::string& out, std::int64_t i) {
  const bool h5 = out.size() > 3 && out.compare(out.size() - 3, 3, ".h5") == 0;
  return fmt::format("{}-{:05d}.h5", h5 ? out.substr(0, out.size() - 3) : out, i);
}

/// Encodes documents with one tokenizer per thread (thread 0 uses `tok`).
class ParallelEncoder {
 public:
  ParallelEncoder(const Tokenizer& tok, int threads) : tok_(tok) {
    for (int t = 1; t < threads; ++t) copies_.push_back(make_tokenizer(tok.name(), tok.model(), "wlb4d-prep", tok.eos_id()));
  }
  int threads() const { return 1 + static_cast<int>(copies_.size()); }
  /// CPU seconds the encoding threads spent encoding (CLOCK_THREAD_CPUTIME_ID), all together.
  double cpu_seconds() const { return cpu_s_; }
  /// ids[i] = encode(*docs[begin + i]) for i < end - begin.
  void encode(const std::vector<const std::string*>& docs, std::size_t begin, std::size_t end,
              std::vector<std::vector<token_t>>& ids) const {
    ids.resize(end - begin);
    run(begin, end, [&](const Tokenizer& tk, std::size_t i) { ids[i - begin] = tk.encode(*docs[i]); });
  }
  /// Fine-tuning records: ids[i] and masks[i] of (*segs[begin + i]), each
  /// segment encoded on its own so that no token spans a prompt/response
  /// boundary; the mask is 1 on target segments' tokens, and the EOS is a
  /// target when the record ends with one (the model learns to stop).
  void encode(const std::vector<const SegmentedDoc*>& segs, std::size_t begin, std::size_t end,
              std::vector<std::vector<token_t>>& ids, std::vector<std::vector<std::uint8_t>>& masks) const {
    ids.resize(end - begin);
    masks.resize(end - begin);
    run(begin, end, [&](const Tokenizer& tk, std::size_t i) {
      auto& v = ids[i - begin];
      auto& m = masks[i - begin];
      v.clear();
      m.clear();
      bool last_target = false;
      for (const auto& g : *segs[i]) {
        if (g.text.empty()) continue;
        const auto part = tk.encode(g.text);
        v.insert(v.end(), part.begin(), part.end());
        m.insert(m.end(), part.size(), g.target ? 1 : 0);
        last_target = g.target;
      }
      m.push_back(last_target ? 1 : 0);
    });
  }

 private:
  /// f(tokenizer, i) for every i in [begin, end), spread over the threads
  /// (each with its own tokenizer); the first error is rethrown.
  template <class F>
  void run(std::size_t begin, std::size_t end, F f) const {
    if (threads() == 1 || end - begin < 2) {
      const double c0 = thread_cpu_seconds();
      for (std::size_t i = begin; i < end; ++i) f(tok_, i);
      cpu_s_ += thread_cpu_seconds() - c0;
      return;
    }
    std::atomic<std::size_t> next{begin};
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(threads()));
    std::vector<double> cpu(static_cast<std::size_t>(threads()), 0.0);
    auto work = [&](int t) {
      const Tokenizer& tk = t == 0 ? tok_ : *copies_[std::size_t(t - 1)];
      const double c0 = thread_cpu_seconds();
      try {
        for (std::size_t i; (i = next.fetch_add(1)) < end;) f(tk, i);
      } catch (...) {
        errors[std::size_t(t)] = std::current_exception();
        next = end;
      }
      cpu[std::size_t(t)] = thread_cpu_seconds() - c0;
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads(); ++t) pool.emplace_back(work, t);
    work(0);
    for (auto& th : pool) th.join();
    for (double c : cpu) cpu_s_ += c;
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
  }
  static double thread_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
  const Tokenizer& tok_;
  std::vector<std::unique_ptr<Tokenizer>> copies_;
  mutable double cpu_s_ = 0;
};

/// A parallel batch: at most this many documents, and it ends at the
/// document that brings its text to kBatchBytes or more — enough to keep
/// the threads busy, few enough that two batches' ids (one written, one
/// encoded) stay small next to the corpus, and several per split for MPI
/// ranks to share.
constexpr std::size_t kEncodeBatch = 4096;
constexpr std::size_t kBatchBytes = std::size_t(2) << 20;

/// The batches of a split: batch k is documents [starts[k], starts[k + 1]).
std::vector<std::size_t> batch_starts(const std::vector<const std::string*>& docs) {
  std::vector<std::size_t> b{0};
  std::size_t bytes = 0, count = 0;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    bytes += docs[i]->size();
    if ((++count >= kEncodeBatch || bytes >= kBatchBytes) && i + 1 < docs.size()) {
      b.push_back(i + 1);
      bytes = count = 0;
    }
  }
  b.push_back(docs.size());
  return b;
}

// ---- MPI ranks: collective failure and the batches' messages --------------

/// An error as (kind, text): 2 ConfigError, 1 DataError, 3 anything else.
int error_kind(const std::exception_ptr& e, std::string& msg) {
  try {
    std::rethrow_exception(e);
  } catch (const ConfigError& x) {
    msg = x.what();
    return 2;
  } catch (const DataError& x) {
    msg = x.what();
    return 1;
  } catch (const std::exception& x) {
    msg = x.what();
    return 3;
  } catch (...) {
    msg = "an unknown exception";
    return 3;
  }
}

[[noreturn]] void throw_kind(int kind, const std::string& msg) {
  if (kind == 2) throw ConfigError(msg);
  if (kind == 1) throw DataError(msg);
  throw std::runtime_error(msg);
}

std::exception_ptr make_kind(int kind, const std::string& msg) {
  try {
    throw_kind(kind, msg);
  } catch (...) {
    return std::current_exception();
  }
}

/// Collective: when any rank of c passes an error, every rank throws the
/// lowest failing rank's (same type, same text). Serial (c null): rethrows e.
void agree(const comm::Communicator* c, const std::exception_ptr& e) {
  if (!c) {
    if (e) std::rethrow_exception(e);
    return;
  }
  std::int32_t first = e ? c->rank() : c->size();
  c->allreduce(&first, 1, comm::ReduceOp::Min);
  if (first == c->size()) return;
  std::string msg;
  std::int32_t kind = 0;
  if (c->rank() == first) kind = error_kind(e, msg);
  std::int64_t len = static_cast<std::int64_t>(msg.size());
  c->broadcast(&kind, 1, first);
  c->broadcast(&len, 1, first);
  msg.resize(static_cast<std::size_t>(len));
  if (len > 0) c->broadcast(msg.data(), msg.size(), first);
  throw_kind(kind, msg);
}

/// Runs f on every rank, then agree(): a failure anywhere fails all ranks alike.
template <class F>
void collectively(const comm::Communicator* c, F f) {
  std::exception_ptr e;
  try {
    f();
  } catch (...) {
    e = std::current_exception();
  }
  agree(c, e);
}

struct Batch {
  std::vector<std::vector<token_t>> ids;
  std::vector<std::vector<std::uint8_t>> masks;  // --sft: ids[i].size() + 1 (EOS) each
};

// Every batch k of a split owned by rank r > 0 is one message sequence from
// r to rank 0, even after a failure (then an error), so that rank 0, which
// receives every batch in order, never waits for a message that never comes.
constexpr int kTagHeader = 7101, kTagLengths = 7102, kTagTokens = 7103, kTagMask = 7104, kTagText = 7105;

void send_batch(const comm::Communicator& c, const Batch& b, bool sft) {
  std::vector<std::int64_t> len;
  std::vector<token_t> flat;
  std::vector<std::uint8_t> mflat;
  for (std::size_t i = 0; i < b.ids.size(); ++i) {
    len.push_back(static_cast<std::int64_t>(b.ids[i].size()));
    flat.insert(flat.end(), b.ids[i].begin(), b.ids[i].end());
    if (sft) mflat.insert(mflat.end(), b.masks[i].begin(), b.masks[i].end());
  }
  std::int64_t h[4] = {0, static_cast<std::int64_t>(len.size()), static_cast<std::int64_t>(flat.size()),
                       static_cast<std::int64_t>(mflat.size())};
  c.send(h, 4, 0, kTagHeader);
  if (!len.empty()) c.send(len.data(), len.size(), 0, kTagLengths);
  if (!flat.empty()) c.send(flat.data(), flat.size(), 0, kTagTokens);
  if (!mflat.empty()) c.send(mflat.data(), mflat.size(), 0, kTagMask);
}

void send_error(const comm::Communicator& c, const std::exception_ptr& e) {
  std::string msg;
  const int kind = error_kind(e, msg);
  std::int64_t h[4] = {1, kind, static_cast<std::int64_t>(msg.size()), 0};
  c.send(h, 4, 0, kTagHeader);
  if (!msg.empty()) c.send(msg.data(), msg.size(), 0, kTagText);
}

/// Rank 0: batch from `src` into b, or its error into `failed` (if none yet).
void recv_batch(const comm::Communicator& c, int src, Batch& b, std::exception_ptr& failed) {
  std::int64_t h[4] = {0, 0, 0, 0};
  c.recv(h, 4, src, kTagHeader);
  if (h[0] != 0) {
    std::string msg(static_cast<std::size_t>(h[2]), '\0');
    if (!msg.empty()) c.recv(msg.data(), msg.size(), src, kTagText);
    if (!failed) failed = make_kind(int(h[1]), msg);
    return;
  }
  std::vector<std::int64_t> len(static_cast<std::size_t>(h[1]));
  std::vector<token_t> flat(static_cast<std::size_t>(h[2]));
  std::vector<std::uint8_t> mflat(static_cast<std::size_t>(h[3]));
  if (!len.empty()) c.recv(len.data(), len.size(), src, kTagLengths);
  if (!flat.empty()) c.recv(flat.data(), flat.size(), src, kTagTokens);
  if (!mflat.empty()) c.recv(mflat.data(), mflat.size(), src, kTagMask);
  b.ids.assign(len.size(), {});
  b.masks.assign(mflat.empty() ? 0 : len.size(), {});
  std::size_t at = 0, mat = 0;
  for (std::size_t i = 0; i < len.size(); ++i) {
    const auto n = static_cast<std::size_t>(len[i]);
    b.ids[i].assign(flat.begin() + std::ptrdiff_t(at), flat.begin() + std::ptrdiff_t(at + n));
    at += n;
    if (!mflat.empty()) {
      b.masks[i].assign(mflat.begin() + std::ptrdiff_t(mat), mflat.begin() + std::ptrdiff_t(mat + n + 1));
      mat += n + 1;
    }
  }
}

/// Writes one split: documents docs (or, for fine-tuning, the records segs
/// with their loss mask), as one file or as shards of about shard_tokens.
/// With ranks (c not null), batch k is encoded by rank k mod size and
/// written by rank 0 (the others return an empty summary). Rank 0 throws the
/// first error of any rank's batch or of its writing after every batch's
/// message has arrived.
SplitSummary write_split(const std::string& path, const std::vector<const std::string*>& docs,
                         const std::vector<const SegmentedDoc*>* segs, const ParallelEncoder& enc,
                         const Tokenizer& tok, const std::string& source, std::int64_t shard_tokens,
                         TmpOutputs& tmp, const comm::Communicator* c) {
  const int rank = c ? c->rank() : 0, size = c ? c->size() : 1;
  const std::vector<std::size_t> starts = batch_starts(docs);
  const std::size_t nb = starts.size() - 1;
  auto next_own = [&](std::size_t from) {
    while (from < nb && int(from % std::size_t(size)) != rank) ++from;
    return from;
  };
  auto encode = [&enc, &docs, segs, &starts, rank](std::size_t k, Batch& b) {
    if (core::fault_prep_encode_fails(rank, static_cast<long long>(k)))
      throw DataError(fmt::format("rank {}: batch {} (documents {}-{}) failed to encode (WLB4D_FAULT=prep_encode)",
                                  rank, k, starts[k], starts[k + 1] - 1));
    if (segs)
      enc.encode(*segs, starts[k], starts[k + 1], b.ids, b.masks);
    else
      enc.encode(docs, starts[k], starts[k + 1], b.ids);
  };
  SplitSummary s;
  if (rank != 0) {
    // Encode this rank's batches; send each to rank 0 while the next is encoded.
    std::exception_ptr failed;
    Batch cur, next;
    std::size_t k = next_own(0);
    if (k < nb) {
      try {
        encode(k, cur);
      } catch (...) {
        failed = std::current_exception();
      }
    }
    while (k < nb) {
      const std::size_t kn = next_own(k + 1);
      std::future<void> ahead;
      if (kn < nb && !failed) ahead = std::async(std::launch::async, [&encode, &next, kn] { encode(kn, next); });
      if (failed)
        send_error(*c, failed);
      else
        send_batch(*c, cur, segs != nullptr);
      if (ahead.valid()) {
        try {
          ahead.get();
        } catch (...) {
          failed = std::current_exception();
        }
      }
      std::swap(cur, next);
      k = kn;
    }
    return s;
  }

  std::unique_ptr<TokenDatasetWriter> w;
  std::int64_t docs_done = 0, tokens_done = 0, targets_done = 0;
  auto close = [&] {
    if (!w) return;
    w->finish();
    docs_done += w->num_docs();
    tokens_done += w->num_tokens();
    targets_done += w->loss_targets();
    w.reset();
  };
  TokenDatasetWriter::Options wo;
  wo.loss_mask = segs != nullptr;  // every shard carries its own /loss_mask
  auto open = [&] {
    const std::string p = shard_tokens > 0 ? shard_path(path, std::int64_t(s.shards.size())) : path;
    if (shard_tokens > 0) s.shards.push_back(p);
    w = std::make_unique<TokenDatasetWriter>(tmp.add(p), tok.name(), tok.vocab_size(), tok.eos_id(), source,
                                             tok.model(), wo);
  };
  std::vector<std::int64_t> lengths;
  lengths.reserve(docs.size());
  // Rank 0's own batches are encoded (on the encoder's threads) while the
  // batch before is written; the other ranks' arrive in order.
  std::exception_ptr failed;
  Batch own, cur;
  std::future<void> ahead;
  auto launch = [&](std::size_t from) {
    const std::size_t k = next_own(from);
    if (k < nb) ahead = std::async(std::launch::async, [&encode, &own, k] { encode(k, own); });
  };
  try {
    open();
  } catch (...) {
    failed = std::current_exception();
  }
  if (!failed) launch(0);
  for (std::size_t k = 0; k < nb; ++k) {
    if (int(k % std::size_t(size)) == 0) {
      if (!ahead.valid()) continue;  // after a failure: nothing encoded, nothing to receive
      try {
        ahead.get();  // rethrows an encoding error
      } catch (...) {
        if (!failed) failed = std::current_exception();
      }
      cur = std::move(own);
      own = Batch{};
      if (!failed) launch(k + 1);
    } else {
      recv_batch(*c, int(k % std::size_t(size)), cur, failed);
    }
    if (failed) continue;
    try {
      for (std::size_t i = 0; i < cur.ids.size(); ++i) {
        if (!w) open();
        lengths.push_back(static_cast<std::int64_t>(cur.ids[i].size()) + 1);
        if (segs)
          w->append(cur.ids[i], cur.masks[i]);
        else
          w->append(cur.ids[i]);
        if (shard_tokens > 0 && w->num_tokens() >= shard_tokens) close();
      }
    } catch (...) {
      failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  close();
  std::sort(lengths.begin(), lengths.end());
  s.path = shard_tokens > 0 ? shard_path(path, 0).substr(0, shard_path(path, 0).size() - 8) + "*.h5" : path;
  s.docs = docs_done;
  s.tokens = tokens_done;
  s.loss_targets = targets_done;
  s.p50 = percentile(lengths, 50);
  s.p90 = percentile(lengths, 90);
  s.p99 = percentile(lengths, 99);
  s.max = lengths.empty() ? 0 : lengths.back();
  return s;
}

/// Ranks of c on this host (by host name), for --threads 0.
int ranks_on_this_host(const comm::Communicator& c) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::uint64_t h = 1469598103934665603ull;
  for (const char* p = host; *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
  std::vector<std::uint64_t> all(static_cast<std::size_t>(c.size()));
  c.allgather(&h, all.data(), 1);
  return static_cast<int>(std::count(all.begin(), all.end(), h));
}

/// Shards OUT-NNNNN.h5 beyond the `written` ones of this run (an earlier,
/// longer run's): removed, so that OUT-*.h5 names this run's shards only.
int remove_stale_shards(const std::string& out, std::size_t written) {
  int removed = 0;
  for (std::int64_t i = std::int64_t(written);; ++i) {
    std::error_code ec;
    if (!std::filesystem::remove(shard_path(out, i), ec)) break;
    ++removed;
  }
  return removed;
}

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
     << "                  [--seed S] [--max-docs N] [--threads N] [--shard-tokens T] [--json-keys K1,K2]\n"
     << "                  [--txt-split file|blank-line|line] [--sft]\n\n"
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
     << "  into --val-output; both files keep the corpus order.\n"
     << "MPI: `mpiexec -n N wlb4d-prep ...` encodes batch k on rank k mod N and writes on rank 0: the\n"
     << "  same datasets as one rank; errors are printed once (rank 0), every rank exits alike.\n";
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
  o.threads = vm["threads"].as<int>();
  o.shard_tokens = vm["shard-tokens"].as<std::int64_t>();
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
  if (o.threads < 0)
    throw ConfigError("--threads " + std::to_string(o.threads) + " must be >= 0 (0: all hardware threads)");
  if (o.shard_tokens < 0)
    throw ConfigError("--shard-tokens " + std::to_string(o.shard_tokens) + " must be >= 0 (0: one file)");
  refuse_input_as_output(o);
}

std::int64_t percentile(const std::vector<std::int64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  auto n = static_cast<double>(sorted.size());
  auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * n));
  rank = std::clamp<std::size_t>(rank, 1, sorted.size());
  return sorted[rank - 1];
}

namespace {

PrepSummary run_prep_on(const PrepOptions& o, const comm::Communicator* c) {
  const int rank = c ? c->rank() : 0, size = c ? c->size() : 1;
  const auto t0 = std::chrono::steady_clock::now();
  PrepSummary s;
  s.ranks = size;
  std::vector<std::string> docs;
  std::vector<SegmentedDoc> segs;  // --sft: every document's segments (docs[i] is their text)
  std::int64_t n = 0, n_val = 0;
  std::vector<const std::string*> train, val;
  std::vector<const SegmentedDoc*> train_segs, val_segs;
  std::unique_ptr<Tokenizer> tok;
  const bool spm_train = o.tokenizer == "sentencepiece" && o.spm_model.empty();
  std::chrono::steady_clock::time_point t1;
  // Options, corpus, split and tokenizer: every rank does the same (only
  // rank 0 trains sentencepiece and creates the output directories).
  collectively(c, [&] {
    core::check_fault_env();  // a malformed WLB4D_FAULT fails here, on every rank alike
    validate(o);
    if (rank == 0)
      for (const std::string* out : {&o.output, &o.val_output}) {  // create missing parent directories
        auto parent = std::filesystem::path(*out).parent_path();
        std::error_code ec;
        if (!out->empty() && !parent.empty()) std::filesystem::create_directories(parent, ec);
        if (ec) throw DataError(*out + ": cannot create its directory (" + ec.message() + ")");
      }
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
    n = static_cast<std::int64_t>(docs.size());
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
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      (is_val[k] ? val : train).push_back(&docs[k]);
      if (o.sft) (is_val[k] ? val_segs : train_segs).push_back(&segs[k]);
    }

    t1 = std::chrono::steady_clock::now();
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
    } else if (rank == 0) {
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
  });
  if (spm_train && size > 1) {  // rank 0's trained model, to every rank
    std::string model = rank == 0 ? tok->model() : std::string();
    std::int64_t len = static_cast<std::int64_t>(model.size());
    c->broadcast(&len, 1, 0);
    model.resize(static_cast<std::size_t>(len));
    c->broadcast(model.data(), model.size(), 0);
    collectively(c, [&] {
      if (rank != 0) tok = make_tokenizer("sentencepiece", model, "wlb4d-prep (rank 0's trained model)");
    });
  }
  s.sft = o.sft;
  s.tokenizer = tok->name();
  s.vocab_size = tok->vocab_size();
  s.eos_id = tok->eos_id();

  std::string inputs;
  for (const auto& in : o.inputs) inputs += (inputs.empty() ? "" : ",") + in;
  std::string src = inputs;
  if (n_val > 0) src += fmt::format(" (train split: {} of {} documents, val_fraction {}, seed {})", train.size(), n, o.val_fraction, o.seed);
  // Both outputs are written as OUT.tmp and renamed only when both are
  // complete: a failure leaves existing outputs untouched and no partial file.
  TmpOutputs tmp;
  const int hw = std::max(1, int(std::thread::hardware_concurrency()));
  const int threads = o.threads > 0 ? o.threads : c ? std::max(1, hw / ranks_on_this_host(*c)) : hw;
  std::unique_ptr<ParallelEncoder> enc;
  collectively(c, [&] { enc = std::make_unique<ParallelEncoder>(*tok, threads); });  // the copies' load counts as tokenizer time
  s.threads = enc->threads();
  s.tokenizer_s = seconds_since(t1);
  const auto t2 = std::chrono::steady_clock::now();
  collectively(c, [&] {
    s.train = write_split(o.output, train, o.sft ? &train_segs : nullptr, *enc, *tok, src, o.shard_tokens, tmp, c);
  });
  if (n_val > 0) {
    s.has_val = true;
    collectively(c, [&] {
      s.val = write_split(o.val_output, val, o.sft ? &val_segs : nullptr, *enc, *tok,
                          fmt::format("{} (validation split: {} of {} documents, val_fraction {}, seed {})", inputs,
                                      val.size(), n, o.val_fraction, o.seed),
                          o.shard_tokens, tmp, c);
    });
  }
  s.encode_cpu_s = enc->cpu_seconds();
  if (c) c->allreduce(&s.encode_cpu_s, 1, comm::ReduceOp::Sum);
  collectively(c, [&] {
    if (rank != 0) return;
    tmp.commit();
    if (o.shard_tokens > 0) {
      remove_stale_shards(o.output, s.train.shards.size());
      if (s.has_val) remove_stale_shards(o.val_output, s.val.shards.size());
    }
  });
  s.write_s = seconds_since(t2);
  s.total_s = seconds_since(t0);
  return s;
}

}  // namespace

PrepSummary run_prep(const PrepOptions& o) { return run_prep_on(o, nullptr); }

PrepSummary run_prep(const PrepOptions& o, const comm::Communicator& comm) { return run_prep_on(o, &comm); }

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
        "wlb4d-prep: {} {}{}: {} documents, {} tokens; document length (tokens) p50 {} p90 {} p99 {} max {}\n", name,
        x.path, x.shards.empty() ? std::string() : fmt::format(" ({} shards)", x.shards.size()), x.docs, x.tokens,
        x.p50, x.p90, x.p99, x.max);
    if (s.sft)
      out += fmt::format("wlb4d-prep: {} loss mask: {} of {} targets trained ({:.1f}%; response / assistant tokens "
                         "and their EOS)\n",
                         name, x.loss_targets, x.tokens - x.docs,
                         x.tokens > x.docs ? 100.0 * double(x.loss_targets) / double(x.tokens - x.docs) : 0.0);
  };
  line("train", s.train);
  if (s.has_val) line("val", s.val);
  out += fmt::format(
      "wlb4d-prep: time {:.2f} s (read {:.2f} s, tokenizer {:.2f} s, encode+write {:.2f} s: {:.1f} MB/s on {}{} "
      "thread{}; encoding {:.1f} MB per CPU-second)\n",
      s.total_s, s.read_s, s.tokenizer_s, s.write_s, s.write_s > 0 ? double(c.bytes) / s.write_s * 1e-6 : 0.0,
      s.ranks > 1 ? fmt::format("{} ranks x ", s.ranks) : std::string(), s.threads, s.threads == 1 ? "" : "s",
      s.encode_cpu_s > 0 ? double(c.bytes) / s.encode_cpu_s * 1e-6 : 0.0);
  return out;
}

}  // namespace wlb::data
