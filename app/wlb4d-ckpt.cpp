// wlb4d-ckpt — wlb4d checkpoints (io/checkpoint.hpp) without a run:
//   wlb4d-ckpt inspect FILE   header, training state, tensors (global shape, L2 norm), deck text
//   wlb4d-ckpt verify FILE    reads every dataset (Fletcher32 checked); exit 1 naming the bad one
//   wlb4d-ckpt export-hf FILE OUTDIR [--dtype bf16|fp32] [--max-shard-size 5GB]
//                             a Hugging Face LlamaForCausalLM directory (hf/llama_export.hpp)
//   wlb4d-ckpt import-hf HFDIR OUT.h5 [--vocab-size N]
//                             a weights-only checkpoint of a Hugging Face Llama (hf/llama_import.hpp)
// Serial: the file is opened read-only with HDF5's default driver, no MPI run needed.
#include "tool_version.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/version.hpp"
#include "wlb4d/hf/llama_export.hpp"
#include "wlb4d/hf/llama_import.hpp"
#include "wlb4d/io/checkpoint.hpp"

#include <boost/program_options.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace {

const char* const kUsage =
    "usage: wlb4d-ckpt inspect FILE   print step, writer layout, program version, dataset identity,\n"
    "                                 training state, every tensor (global shape, L2 norm) and the deck\n"
    "       wlb4d-ckpt verify FILE    read every dataset so every Fletcher32 checksum is checked;\n"
    "                                 exit 0 if the checkpoint is intact, 1 naming the bad dataset\n"
    "       wlb4d-ckpt export-hf FILE OUTDIR [--dtype bf16|fp32] [--max-shard-size SIZE]\n"
    "                                 write a Hugging Face LlamaForCausalLM directory (config.json,\n"
    "                                 safetensors weights in bf16 (default) or fp32, sharded at SIZE\n"
    "                                 of tensor data (default 5GB; units B, KB, MB, GB, KiB, MiB, GiB),\n"
    "                                 the tokenizer files); OUTDIR must be new or empty\n"
    "       wlb4d-ckpt import-hf HFDIR OUT.h5 [--vocab-size N]\n"
    "                                 write a weights-only checkpoint (step 0) of a Hugging Face Llama\n"
    "                                 directory (config.json, safetensors in bf16/fp16/fp32, tokenizer)\n"
    "                                 and print the deck's [model] section; start training from it with\n"
    "                                 checkpoint.init_from = OUT.h5. --vocab-size pads the vocabulary\n"
    "       wlb4d-ckpt --help | --version\n"
    "FILE is a checkpoint (e.g. checkpoints/step_000100.h5) or a checkpoint directory (its 'latest').\n";

std::string fmt_g(double x) {
  char b[40];
  const auto r = std::to_chars(b, b + sizeof b, x);  // shortest round-trip: 1e-05, not 1.0000000000000001e-05
  return std::string(b, r.ptr);
}

/// A directory stands for the newest checkpoint its `latest` names.
std::string resolve(const std::string& arg) {
  const auto listed = wlb::io::list_checkpoints(arg);
  return listed.empty() ? arg : listed.front();
}

int inspect(const std::string& path) {
  using namespace wlb;
  const io::CheckpointInfo info = io::read_checkpoint_info(path);
  const io::TrainState st = io::read_train_state(path);
  std::printf("file             %s\n", path.c_str());
  std::printf("format           %s version %d%s\n", io::kCheckpointFormat, io::kCheckpointFormatVersion,
              info.weights_only ? ", weights only (no optimizer state: start a run from it with checkpoint.init_from)"
                                : "");
  std::printf("step             %lld (steps completed; the next step to run)\n", static_cast<long long>(info.step));
  std::printf("tokens_seen      %lld\n", static_cast<long long>(info.tokens_seen));
  std::printf("written by       wlb4d %s (git %s) on layout dp=%d pp=%d cp=%d tp=%d\n", info.program_version.c_str(),
              info.git_sha.c_str(), info.layout[0], info.layout[1], info.layout[2], info.layout[3]);
  std::printf("model            vocab=%lld layers=%d d_model=%d heads=%d kv_heads=%d ffn_hidden=%d\n",
              static_cast<long long>(info.vocab), info.model.layers, info.model.d_model, info.model.heads,
              info.model.kv_heads, info.model.ffn_hidden);
  std::printf("dataset          %s\n", info.dataset_identity.c_str());
  if (info.tokenizer.empty())
    std::printf("tokenizer        (not stored: written by an older wlb4d)\n");
  else
    std::printf("tokenizer        %s, vocab %lld (model rows %lld), eos %lld, bos %lld\n", info.tokenizer.c_str(),
                static_cast<long long>(info.tokenizer_vocab), static_cast<long long>(info.vocab),
                static_cast<long long>(info.eos_id), static_cast<long long>(info.bos_id));
  std::printf("data stream      epoch %lld position %lld\n", static_cast<long long>(st.stream_epoch),
              static_cast<long long>(st.stream_position));
  // A blend: every source's epoch, position and tokens/documents drawn (/state/data_sources).
  const auto& ds = st.data_sources;
  if (!ds.empty() && ds.size() == std::size_t(1 + 4 * ds[0]))
    for (long long k = 0; k < ds[0]; ++k)
      std::printf("data source %lld    epoch %lld position %lld, drawn %lld tokens in %lld documents\n", k + 1,
                  static_cast<long long>(ds[std::size_t(1 + 4 * k)]), static_cast<long long>(ds[std::size_t(2 + 4 * k)]),
                  static_cast<long long>(ds[std::size_t(3 + 4 * k)]), static_cast<long long>(ds[std::size_t(4 + 4 * k)]));
  std::printf("packer state     %zu int64\n", st.packer_state.size());
  std::printf("seed             %llu\n", static_cast<unsigned long long>(st.seed));
  if (std::isnan(st.last_loss))
    std::printf("last loss        not stored\n");
  else
    std::printf("last loss        %.6f (training loss of step %lld)\n", st.last_loss, static_cast<long long>(info.step));
  if (st.has_guard_state)
    std::printf("skipped steps    %lld (loss-spike guard; window of %zu steps stored)\n",
                static_cast<long long>(st.skipped_steps), st.spike_window.size() / 2);
  else
    std::printf("skipped steps    not stored\n");
  std::printf("model identity   rope_theta=%s norm_eps=%s\n",
              info.has_rope_norm ? fmt_g(info.model.rope_theta).c_str() : "(not stored)",
              info.has_rope_norm ? fmt_g(info.model.norm_eps).c_str() : "(not stored)");
  if (info.model.rope_scaling != "none")
    std::printf("rope scaling     %s factor=%s low_freq_factor=%s high_freq_factor=%s original_max_position=%d\n",
                info.model.rope_scaling.c_str(), fmt_g(info.model.rope_factor).c_str(),
                fmt_g(info.model.rope_low_freq_factor).c_str(), fmt_g(info.model.rope_high_freq_factor).c_str(),
                info.model.rope_original_max_position);
  if (info.cost_source.empty())
    std::printf("cost model       (not stored)\n");
  else
    std::printf("cost model       %s: a=%.6e s/token b=%.6e s/token^2 c=%.6e s per layer\n", info.cost_source.c_str(),
                info.cost_a, info.cost_b, info.cost_c);
  const auto tensors = io::summarize_checkpoint(path);
  std::size_t width = 0;
  for (const auto& t : tensors) width = std::max(width, t.dataset.size());
  std::printf("tensors          %zu datasets (float32, global shape, L2 norm)\n", tensors.size());
  for (const auto& t : tensors)
    std::printf("  %-*s  %-14s  %.6e\n", int(width), t.dataset.c_str(), io::shape_string(t.shape).c_str(), t.l2);
  std::printf("deck:\n%s", info.deck.c_str());
  if (!info.deck.empty() && info.deck.back() != '\n') std::printf("\n");
  return 0;
}

int verify(const std::string& path) {
  const auto r = wlb::io::verify_checkpoint(path);
  const auto info = wlb::io::read_checkpoint_info(path);
  char digest[64];
  if (r.has_digest)
    std::snprintf(digest, sizeof digest, "content digest %#018llx matches", static_cast<unsigned long long>(r.digest));
  else
    std::snprintf(digest, sizeof digest, "no digest (written before /state/digest)");
  std::printf("wlb4d-ckpt: %s: OK (step %lld, %zu tensors x %d datasets + /state verified; %s)\n", path.c_str(),
              static_cast<long long>(info.step), info.tensors.size(), info.weights_only ? 1 : 3, digest);
  return 0;
}

/// "5GB", "500MB", "2GiB", "123" (bytes) -> bytes. \throws core::ConfigError naming --max-shard-size.
std::uint64_t parse_size(const std::string& text) {
  static const std::pair<const char*, std::uint64_t> kUnits[] = {
      {"GiB", 1ULL << 30}, {"MiB", 1ULL << 20}, {"KiB", 1ULL << 10}, {"GB", 1000000000ULL},
      {"MB", 1000000ULL},  {"KB", 1000ULL},     {"B", 1ULL},         {"", 1ULL}};
  double value = 0;
  const char* end = text.data() + text.size();
  const auto r = std::from_chars(text.data(), end, value);
  if (r.ec == std::errc() && value > 0)
    for (const auto& [unit, scale] : kUnits)
      if (std::string(r.ptr, end) == unit && value * double(scale) >= 1 && value * double(scale) < 1e18)
        return std::uint64_t(value * double(scale));
  throw wlb::core::ConfigError("--max-shard-size='" + text +
                               "' is not a positive size (a number with B, KB, MB, GB, KiB, MiB or GiB, e.g. 5GB)");
}

int export_hf(const std::string& path, const std::vector<std::string>& args) {
  namespace po = boost::program_options;
  std::string outdir, dtype = "bf16", shard = "5GB";
  po::options_description opts("export-hf options");
  opts.add_options()("outdir", po::value(&outdir)->required(), "output directory")(
      "dtype", po::value(&dtype), "bf16 | fp32")("max-shard-size", po::value(&shard), "tensor bytes per file");
  po::positional_options_description pos;
  pos.add("outdir", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(opts).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw wlb::core::ConfigError(std::string("export-hf: ") + e.what());
  }
  wlb::hf::ExportOptions eo;
  if (dtype != "bf16" && dtype != "fp32") throw wlb::core::ConfigError("--dtype='" + dtype + "' is not bf16 or fp32");
  eo.dtype = dtype == "fp32" ? wlb::hf::Dtype::F32 : wlb::hf::Dtype::BF16;
  eo.max_shard_bytes = parse_size(shard);
  const auto rep = wlb::hf::export_llama(path, outdir, eo);
  std::printf("wlb4d-ckpt: exported %s to %s: %d safetensors file(s), %.1f MiB of %s weights, vocab %lld",
              path.c_str(), outdir.c_str(), rep.shards, double(rep.tensor_bytes) / (1 << 20), dtype.c_str(),
              static_cast<long long>(rep.vocab));
  if (rep.padded_vocab != rep.vocab)
    std::printf(" (%lld padding rows trimmed)", static_cast<long long>(rep.padded_vocab - rep.vocab));
  std::printf("; largest tensor %.1f MiB (fp32)\nfiles:", double(rep.largest_tensor_bytes) / (1 << 20));
  for (const auto& f : rep.files) std::printf(" %s", f.c_str());
  std::printf("\n");
  return 0;
}

int import_hf(const std::string& hfdir, const std::vector<std::string>& args) {
  namespace po = boost::program_options;
  std::string out;
  std::int64_t vocab = 0;
  po::options_description opts("import-hf options");
  opts.add_options()("out", po::value(&out)->required(), "checkpoint to write")(
      "vocab-size", po::value(&vocab), "rows of the embedding and LM head (>= config.json's; padding is zero)");
  po::positional_options_description pos;
  pos.add("out", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(opts).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw wlb::core::ConfigError(std::string("import-hf: ") + e.what());
  }
  if (vm.count("vocab-size") && vocab < 1)
    throw wlb::core::ConfigError("--vocab-size=" + std::to_string(vocab) + " is not a positive integer");
  wlb::hf::ImportOptions io;
  io.vocab_size = vocab;
  const auto rep = wlb::hf::import_llama(hfdir, out, io);
  std::printf("wlb4d-ckpt: imported %s to %s (%d safetensors file(s), weights only, step 0; vocab %lld", hfdir.c_str(),
              out.c_str(), rep.files, static_cast<long long>(rep.vocab));
  if (rep.vocab != rep.hf_vocab)
    std::printf(", %lld zero padding rows", static_cast<long long>(rep.vocab - rep.hf_vocab));
  std::printf("; tokenizer %s; largest tensor %.1f MiB)\n", rep.tokenizer.empty() ? "not stored" : rep.tokenizer.c_str(),
              double(rep.largest_tensor_bytes) / (1 << 20));
  if (!rep.tokenizer_note.empty()) std::printf("wlb4d-ckpt: warning: %s\n", rep.tokenizer_note.c_str());
  std::printf("# the deck's model, to train from these weights with checkpoint.init_from = %s\n%s", out.c_str(),
              rep.model_section.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h"))) {
    std::printf("wlb4d-ckpt %s (%s)\n%s", wlb::core::kVersion, wlb::core::kGitSha, kUsage);
    return 0;
  }
  if (argc == 2 && !std::strcmp(argv[1], "--version")) {
    std::printf("%s", tool_version("wlb4d-ckpt").c_str());
    return 0;
  }
  const std::string verb = argc >= 2 ? argv[1] : "";
  const bool with_options = verb == "export-hf" || verb == "import-hf";
  const bool known = verb == "inspect" || verb == "verify" || with_options;
  if (!known || argc < 3 || (!with_options && argc != 3)) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  try {
    if (verb == "import-hf") return import_hf(argv[2], std::vector<std::string>(argv + 3, argv + argc));
    const std::string path = resolve(argv[2]);
    if (verb == "export-hf") return export_hf(path, std::vector<std::string>(argv + 3, argv + argc));
    return verb == "inspect" ? inspect(path) : verify(path);
  } catch (const wlb::core::ConfigError& e) {
    std::fprintf(stderr, "wlb4d-ckpt: error: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const wlb::core::CheckpointError& e) {
    std::fprintf(stderr, "wlb4d-ckpt: error: %s\n", e.what());
    return 1;
  } catch (const wlb::core::DataError& e) {
    std::fprintf(stderr, "wlb4d-ckpt: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wlb4d-ckpt: unexpected error: %s\n", e.what());
    return 1;
  }
}
