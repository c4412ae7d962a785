// wlb4d-ckpt — look inside wlb4d checkpoints (io/checkpoint.hpp) without a run:
//   wlb4d-ckpt inspect FILE   header, training state, tensors (global shape, L2 norm), deck text
//   wlb4d-ckpt verify FILE    reads every dataset (Fletcher32 checked); exit 1 naming the bad one
// Serial: the file is opened read-only with HDF5's default driver, no MPI run needed.
#include "tool_version.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/version.hpp"
#include "wlb4d/io/checkpoint.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

namespace {

const char* const kUsage =
    "usage: wlb4d-ckpt inspect FILE   print step, writer layout, program version, dataset identity,\n"
    "                                 training state, every tensor (global shape, L2 norm) and the deck\n"
    "       wlb4d-ckpt verify FILE    read every dataset so every Fletcher32 checksum is checked;\n"
    "                                 exit 0 if the checkpoint is intact, 1 naming the bad dataset\n"
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
  std::printf("format           %s version %d\n", io::kCheckpointFormat, io::kCheckpointFormatVersion);
  std::printf("step             %lld (steps completed; the next step to run)\n", static_cast<long long>(info.step));
  std::printf("tokens_seen      %lld\n", static_cast<long long>(info.tokens_seen));
  std::printf("written by       wlb4d %s (git %s) on layout dp=%d pp=%d cp=%d tp=%d\n", info.program_version.c_str(),
              info.git_sha.c_str(), info.layout[0], info.layout[1], info.layout[2], info.layout[3]);
  std::printf("model            vocab=%lld layers=%d d_model=%d heads=%d kv_heads=%d ffn_hidden=%d\n",
              static_cast<long long>(info.vocab), info.model.layers, info.model.d_model, info.model.heads,
              info.model.kv_heads, info.model.ffn_hidden);
  std::printf("dataset          %s\n", info.dataset_identity.c_str());
  std::printf("data stream      epoch %lld position %lld\n", static_cast<long long>(st.stream_epoch),
              static_cast<long long>(st.stream_position));
  std::printf("packer state     %zu int64\n", st.packer_state.size());
  std::printf("seed             %llu\n", static_cast<unsigned long long>(st.seed));
  if (std::isnan(st.last_loss))
    std::printf("last loss        not stored\n");
  else
    std::printf("last loss        %.6f (training loss of step %lld)\n", st.last_loss, static_cast<long long>(info.step));
  std::printf("model identity   rope_theta=%s norm_eps=%s\n",
              info.has_rope_norm ? fmt_g(info.model.rope_theta).c_str() : "(not stored)",
              info.has_rope_norm ? fmt_g(info.model.norm_eps).c_str() : "(not stored)");
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
  std::printf("wlb4d-ckpt: %s: OK (step %lld, %zu tensors x 3 datasets + /state verified; %s)\n", path.c_str(),
              static_cast<long long>(info.step), info.tensors.size(), digest);
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
  if (argc != 3 || (std::strcmp(argv[1], "inspect") != 0 && std::strcmp(argv[1], "verify") != 0)) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  try {
    const std::string path = resolve(argv[2]);
    return std::strcmp(argv[1], "inspect") == 0 ? inspect(path) : verify(path);
  } catch (const wlb::core::CheckpointError& e) {
    std::fprintf(stderr, "wlb4d-ckpt: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wlb4d-ckpt: unexpected error: %s\n", e.what());
    return 1;
  }
}
