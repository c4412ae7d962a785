// wlb4d-generate — text from a checkpoint, on one rank (infer/decoder.hpp):
//   wlb4d-generate CKPT [--prompt TEXT | --prompt-ids "ID ..."] [--max-new-tokens N]
//                  [--temperature T] [--top-k K] [--top-p P] [--seed S] [--greedy] [--ids]
// Tokens are encoded and decoded with the tokenizer the checkpoint carries;
// the continuation goes to stdout, the speed (prefill and decode tokens/s)
// to stderr.
#include "tool_version.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/mpi_main.hpp"
#include "wlb4d/core/version.hpp"
#include "wlb4d/data/tokenizer.hpp"
#include "wlb4d/infer/decoder.hpp"
#include "wlb4d/infer/sampling.hpp"
#include "wlb4d/io/checkpoint.hpp"

#include <boost/program_options.hpp>

#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace po = boost::program_options;

namespace {

const char* const kUsage =
    "usage: wlb4d-generate CKPT [options]\n"
    "  CKPT is a checkpoint file or directory (its 'latest'); the text is encoded and decoded\n"
    "  with the tokenizer it carries. The continuation goes to stdout, tokens/s to stderr.\n";

int run(int argc, char** argv) {
  po::options_description opts("options");
  opts.add_options()("help,h", "this help")("version", "program version")(
      "prompt", po::value<std::string>()->default_value(""),
      "text to continue (empty: start a new document after the end-of-document token)")(
      "prompt-ids", po::value<std::string>(), "token ids to continue, space separated (instead of --prompt)")(
      "max-new-tokens", po::value<int>()->default_value(64), "tokens to generate at most (stops at end-of-document)")(
      "temperature", po::value<double>()->default_value(1.0), "softmax temperature (> 0; 0: greedy)")(
      "top-k", po::value<int>()->default_value(0), "sample among the k most likely tokens (0: all)")(
      "top-p", po::value<double>()->default_value(1.0), "nucleus: the most likely tokens reaching this mass (0, 1]")(
      "seed", po::value<unsigned long long>()->default_value(0), "sampling seed (the same seed, the same text)")(
      "greedy", po::bool_switch(), "always the most likely token (argmax)")(
      "ids", po::bool_switch(), "also print the generated token ids (a line 'ids: ...')")(
      "chunk", po::value<long long>()->default_value(128), "prefill chunk (tokens per forward)");
  po::options_description hidden;
  hidden.add_options()("checkpoint", po::value<std::string>());
  po::options_description all;
  all.add(opts).add(hidden);
  po::positional_options_description pos;
  pos.add("checkpoint", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "wlb4d-generate: error: %s\n%s", e.what(), kUsage);
    std::cerr << opts;
    return 2;
  }
  if (vm.count("help")) {
    std::printf("wlb4d-generate %s (%s)\n%s", wlb::core::kVersion, wlb::core::kGitSha, kUsage);
    std::cout << opts;
    return 0;
  }
  if (vm.count("version")) {
    std::printf("%s", tool_version("wlb4d-generate").c_str());
    return 0;
  }
  if (!vm.count("checkpoint")) {
    std::fprintf(stderr, "wlb4d-generate: error: no checkpoint given\n%s", kUsage);
    std::cerr << opts;
    return 2;
  }
  const int max_new = vm["max-new-tokens"].as<int>();
  if (max_new < 1) throw wlb::core::ConfigError("--max-new-tokens " + std::to_string(max_new) + " must be >= 1");
  wlb::infer::SamplingOptions so;
  so.temperature = vm["temperature"].as<double>();
  so.top_k = vm["top-k"].as<int>();
  so.top_p = vm["top-p"].as<double>();
  so.seed = vm["seed"].as<unsigned long long>();
  so.greedy = vm["greedy"].as<bool>();
  std::unique_ptr<wlb::infer::Sampler> sampler;
  try {
    sampler = std::make_unique<wlb::infer::Sampler>(so);
  } catch (const std::invalid_argument& e) {
    throw wlb::core::ConfigError(std::string("--temperature/--top-k/--top-p: ") + e.what());
  }

  std::string path = vm["checkpoint"].as<std::string>();
  const auto listed = wlb::io::list_checkpoints(path);
  if (!listed.empty()) path = listed.front();
  const auto info = wlb::io::read_checkpoint_info(path);
  std::unique_ptr<wlb::data::Tokenizer> tok;
  if (!info.tokenizer.empty())
    tok = wlb::data::make_tokenizer(info.tokenizer, wlb::io::read_checkpoint_tokenizer_model(path), path,
                                    int(info.eos_id));
  const bool by_ids = vm.count("prompt-ids") > 0;
  if (!tok && !by_ids)
    throw wlb::core::CheckpointError("checkpoint " + path + ": carries no tokenizer (written before checkpoints stored "
                                     "it): give the prompt as --prompt-ids and read the ids");
  const std::int64_t real_vocab = info.tokenizer_vocab > 0 ? info.tokenizer_vocab : info.vocab;
  std::vector<std::int32_t> prompt;
  if (by_ids) {
    std::istringstream in(vm["prompt-ids"].as<std::string>());
    long long id;
    while (in >> id) {
      if (id < 0 || id >= real_vocab)
        throw wlb::core::ConfigError("--prompt-ids: " + std::to_string(id) + " is not a token id below " +
                                     std::to_string(real_vocab));
      prompt.push_back(std::int32_t(id));
    }
    if (!in.eof()) throw wlb::core::ConfigError("--prompt-ids: not a list of integers");
  } else {
    for (auto t : tok->encode(vm["prompt"].as<std::string>())) prompt.push_back(std::int32_t(t));
  }
  const std::int32_t eos = std::int32_t(info.eos_id);
  if (prompt.empty()) {  // a new document: after BOS where the tokenizer has one, else after EOS
    const std::int64_t start = info.bos_id >= 0 ? info.bos_id : info.eos_id;
    if (start < 0) throw wlb::core::ConfigError("--prompt is empty and the checkpoint names no BOS/EOS to start from");
    prompt.push_back(std::int32_t(start));
  }

  wlb::infer::Decoder dec(info.model, info.vocab, real_vocab, std::int64_t(prompt.size()) + max_new,
                          [&](const std::string& name, const std::vector<std::int64_t>&) {
                            return wlb::io::read_model_tensor(path, name);
                          },
                          vm["chunk"].as<long long>());
  if (!by_ids && tok) std::printf("%s", vm["prompt"].as<std::string>().c_str());
  const auto g = wlb::infer::generate(dec, prompt, max_new, *sampler, eos);
  std::vector<wlb::token_t> text_ids;
  for (auto t : g.tokens)
    if (t != eos) text_ids.push_back(wlb::token_t(t));
  if (tok) std::printf("%s\n", tok->decode(text_ids.data(), text_ids.size()).c_str());
  if (vm["ids"].as<bool>()) {
    std::printf("ids:");
    for (auto t : g.tokens) std::printf(" %d", t);
    std::printf("\n");
  }
  std::fflush(stdout);
  const double n = double(g.tokens.size());
  std::fprintf(stderr,
               "wlb4d-generate: %s (step %lld): prompt %lld tokens in %.3f s (%.0f tokens/s); %zu new tokens in %.3f s "
               "(%.1f tokens/s, KV cache)%s\n",
               path.c_str(), static_cast<long long>(info.step), static_cast<long long>(g.prompt_tokens),
               g.prefill_seconds, double(g.prompt_tokens) / std::max(g.prefill_seconds, 1e-9), g.tokens.size(),
               g.decode_seconds, n / std::max(g.decode_seconds, 1e-9), g.stopped ? "; stopped at end-of-document" : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return wlb::core::mpi_main(argc, argv, [](int ac, char** av) {
    try {
      return run(ac, av);
    } catch (const wlb::core::ConfigError& e) {
      std::fprintf(stderr, "wlb4d-generate: error: %s\n", e.what());
      return 2;
    } catch (const wlb::core::CheckpointError& e) {
      std::fprintf(stderr, "wlb4d-generate: error: %s\n", e.what());
      return 1;
    } catch (const wlb::core::DataError& e) {
      std::fprintf(stderr, "wlb4d-generate: error: %s\n", e.what());
      return 1;
    }
  });
}
