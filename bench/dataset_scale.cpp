// dataset_scale: the token dataset at cluster scale (docs/data.md, "Open time
// and memory").
//
//   dataset_scale make PATH DOCS TOKENS   writes a synthetic dataset through
//       TokenDatasetWriter (the writer wlb4d-prep uses: Fletcher32 chunks):
//       DOCS documents of 2..2*TOKENS/DOCS-2 tokens (seeded), ids < 257,
//       TOKENS tokens in all (the last document takes the remainder).
//   dataset_scale make-lengths PATH LENGTHS_JSON TOKENS   writes a synthetic
//       dataset whose document lengths (EOS included) are drawn i.i.d.
//       (seeded) from a length sample, a JSON array of token counts such as
//       inputs/dist/dist_prolong.json (balance::load_lengths_json), until
//       TOKENS tokens (the last document is cut to fit); ids < 257. The GPU
//       benchmark's long-document data (scripts/gpu-bundle.sh,
//       inputs/bench-1b-8k.ini): what WLB-LLM balances is the lengths, not
//       the text.
//   dataset_scale open PATH [SHUFFLE]     opens it as the trainer does
//       (TokenDataset::open, then a DocumentStream over it, shuffled unless
//       SHUFFLE is 0) and prints the open time, the stream's construction
//       time, and this process's resident memory before and after (VmRSS,
//       VmHWM from /proc/self/status) against the dataset's own index bytes.
#include "wlb4d/balance/doc_source.hpp"
#include "wlb4d/core/clock.hpp"
#include "wlb4d/data/dataset.hpp"
#include "wlb4d/data/document_stream.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

using namespace wlb;

namespace {
double status_mib(const char* key) {  // "VmRSS" / "VmHWM" from /proc/self/status, in MiB
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::size_t n = std::strlen(key);
  while (std::getline(f, line))
    if (line.compare(0, n, key) == 0 && line[n] == ':') return std::atof(line.c_str() + n + 1) / 1024.0;
  return -1;
}

int make(const std::string& path, long long docs, long long tokens) {
  if (docs < 1 || tokens < 2 * docs) {
    std::fprintf(stderr, "dataset_scale make: need DOCS >= 1 and TOKENS >= 2*DOCS\n");
    return 2;
  }
  const double t0 = core::wall_seconds();
  data::TokenDatasetWriter w(path, "bytes", 257, 256, "dataset_scale synthetic", "");
  std::mt19937_64 g(1234);
  const long long mean = tokens / docs, hi = 2 * mean - 2;  // lengths (EOS included) uniform in [2, hi]
  long long left = tokens;
  std::vector<token_t> doc;
  for (long long d = 0; d < docs; ++d) {
    long long len = d + 1 == docs ? left : 2 + static_cast<long long>(g() % std::uint64_t(hi - 1));
    len = std::min(len, left - 2 * (docs - d - 1));  // leave at least 2 tokens for every later document
    left -= len;
    doc.resize(std::size_t(len - 1));
    for (auto& t : doc) t = static_cast<token_t>(g() & 0xFF);
    w.append(doc);
  }
  w.finish();
  std::printf("dataset_scale: wrote %s: %lld documents, %lld tokens in %.1f s\n", path.c_str(), docs,
              static_cast<long long>(w.num_tokens()), core::wall_seconds() - t0);
  return 0;
}

int make_lengths(const std::string& path, const std::string& lengths_json, long long tokens) {
  const std::vector<std::int64_t> lengths = balance::load_lengths_json(lengths_json);
  if (tokens < 2) {
    std::fprintf(stderr, "dataset_scale make-lengths: need TOKENS >= 2\n");
    return 2;
  }
  const double t0 = core::wall_seconds();
  data::TokenDatasetWriter w(path, "bytes", 257, 256, "dataset_scale synthetic, lengths of " + lengths_json, "");
  std::mt19937_64 g(1234);
  long long left = tokens, docs = 0, longest = 0;
  std::vector<token_t> doc;
  while (left >= 2) {
    long long len = std::max<long long>(2, lengths[g() % lengths.size()]);
    len = std::min(len, left);
    left -= len;
    longest = std::max(longest, len);
    doc.resize(std::size_t(len - 1));
    for (auto& t : doc) t = static_cast<token_t>(g() & 0xFF);
    w.append(doc);
    ++docs;
  }
  w.finish();
  std::printf("dataset_scale: wrote %s: %lld documents (lengths drawn from %s, longest %lld), %lld tokens in %.1f s\n",
              path.c_str(), docs, lengths_json.c_str(), longest, static_cast<long long>(w.num_tokens()),
              core::wall_seconds() - t0);
  return 0;
}

int open(const std::string& path, bool shuffle) {
  const double rss0 = status_mib("VmRSS");
  const double t0 = core::wall_seconds();
  auto ds = data::TokenDataset::open(path);
  const double t1 = core::wall_seconds();
  const double rss1 = status_mib("VmRSS");
  data::DocumentStream stream(ds, 1234, shuffle);
  const double t2 = core::wall_seconds();
  std::int64_t sum = 0;
  for (int i = 0; i < 1000; ++i) sum += stream.next().length;
  std::vector<token_t> buf(std::size_t(ds.doc_length(ds.num_docs() - 1)));
  ds.read(ds.num_docs() - 1, 0, std::int64_t(buf.size()), buf.data());  // the last document, through the index
  const double rss2 = status_mib("VmRSS");
  std::printf("dataset_scale: %s: %lld documents, %lld tokens, Fletcher32 chunks: %s\n", path.c_str(),
              static_cast<long long>(ds.num_docs()), static_cast<long long>(ds.num_tokens()),
              ds.chunk_checksums() ? "yes" : "no");
  std::printf("dataset_scale: open %.2f s; stream (%s) %.2f s\n", t1 - t0, shuffle ? "shuffled" : "in order",
              t2 - t1);
  std::printf("dataset_scale: index %.1f MiB (%.2f bytes a document); RSS %.0f MiB before, %.0f MiB after open, "
              "%.0f MiB with the stream; peak %.0f MiB\n",
              double(ds.index_bytes()) / 1048576.0, double(ds.index_bytes()) / double(ds.num_docs()), rss0, rss1, rss2,
              status_mib("VmHWM"));
  return sum > 0 ? 0 : 1;
}
}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc >= 5 && std::string(argv[1]) == "make") return make(argv[2], std::atoll(argv[3]), std::atoll(argv[4]));
    if (argc >= 5 && std::string(argv[1]) == "make-lengths") return make_lengths(argv[2], argv[3], std::atoll(argv[4]));
    if (argc >= 3 && std::string(argv[1]) == "open") return open(argv[2], argc < 4 || std::string(argv[3]) != "0");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dataset_scale: error: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: dataset_scale make PATH DOCS TOKENS | dataset_scale make-lengths PATH LENGTHS_JSON TOKENS"
                       " | dataset_scale open PATH [SHUFFLE]\n");
  return 2;
}
