// hf_bpe_encode — wlb4d's side of the byte-level BPE comparisons and the
// throughput figure (tests/tools/hf_bpe_peer.sh, docs/data.md).
//
//   hf_bpe_encode TOKENIZER_JSON TEXTS_JSONL [--eos-token T]
//       one line per line of TEXTS_JSONL (its string "text", every line, none
//       skipped): the ids as a JSON array; exit 1 when decode(encode(text))
//       differs from the text (invalid UTF-8 compared after repair_utf8).
//   hf_bpe_encode TOKENIZER_JSON TEXTS_JSONL --bench REPEATS
//       encodes all texts REPEATS times, each time with a freshly loaded
//       tokenizer (an empty pre-token cache, as wlb4d-prep has), on this one
//       thread; prints bytes, tokens and MB/s (10^6 bytes per second) of the
//       fastest and the median pass.
#include "wlb4d/core/error.hpp"
#include "wlb4d/data/byte_level_bpe.hpp"
#include "wlb4d/data/corpus.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::vector<std::string> read_texts(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw wlb::core::DataError(path + ": cannot open");
  std::vector<std::string> texts;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("text") || !j["text"].is_string())
      throw wlb::core::DataError(path + ":" + std::to_string(n) + ": not a JSON object with a string \"text\"");
    texts.push_back(j["text"].get<std::string>());
  }
  return texts;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace wlb::data;
  if (argc < 3) {
    std::fprintf(stderr, "usage: hf_bpe_encode TOKENIZER_JSON TEXTS_JSONL [--eos-token T] [--bench REPEATS]\n");
    return 2;
  }
  try {
    ByteLevelBpeOptions opts;
    int repeats = 0;
    for (int i = 3; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--eos-token" && i + 1 < argc) {
        opts.eos_token = argv[++i];
      } else if (a == "--bench" && i + 1 < argc) {
        repeats = std::max(1, std::atoi(argv[++i]));
      } else {
        std::fprintf(stderr, "hf_bpe_encode: unknown argument '%s'\n", a.c_str());
        return 2;
      }
    }
    const std::vector<std::string> texts = read_texts(argv[2]);
    if (repeats > 0) {
      using clock = std::chrono::steady_clock;
      std::size_t bytes = 0, tokens = 0;
      for (const auto& t : texts) bytes += t.size();
      std::vector<double> secs;
      double load_s = 0;
      bool jit = false;
      for (int r = 0; r < repeats; ++r) {
        const auto t0 = clock::now();
        const auto tok = ByteLevelBpeTokenizer::load(argv[1], opts);
        const auto t1 = clock::now();
        tokens = 0;
        for (const auto& t : texts) tokens += tok->encode(t).size();
        const auto t2 = clock::now();
        load_s = std::chrono::duration<double>(t1 - t0).count();
        secs.push_back(std::chrono::duration<double>(t2 - t1).count());
        jit = tok->jit();
      }
      std::sort(secs.begin(), secs.end());
      const double best = secs.front(), median = secs[secs.size() / 2];
      std::printf(
          "hf_bpe_encode: %zu texts, %zu bytes -> %zu tokens (%.3f bytes/token); load %.2f s; encode best %.3f s "
          "= %.2f MB/s, median %.3f s = %.2f MB/s (%d passes, one thread, fresh cache each, PCRE2 JIT %s)\n",
          texts.size(), bytes, tokens, double(bytes) / double(std::max<std::size_t>(tokens, 1)), load_s, best,
          double(bytes) / best / 1e6, median, double(bytes) / median / 1e6, repeats, jit ? "on" : "off");
      return 0;
    }
    const auto tok = ByteLevelBpeTokenizer::load(argv[1], opts);
    int bad = 0;
    std::ostringstream out;
    for (std::size_t k = 0; k < texts.size(); ++k) {
      const auto ids = tok->encode(texts[k]);
      out << '[';
      for (std::size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
      out << "]\n";
      if (tok->decode(ids) != repair_utf8(texts[k])) {
        std::fprintf(stderr, "hf_bpe_encode: text %zu does not round-trip through encode/decode\n", k + 1);
        ++bad;
      }
    }
    std::cout << out.str();
    return bad ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_bpe_encode: error: %s\n", e.what());
    return 1;
  }
}
