// wlb4d-plan — cluster-scale planner/simulator (DESIGN §1, §6): compares the
// packers and CP shardings of a deck's [plan] section on a sampled document
// stream, with the pipeline simulated action by action. No MPI run needed
// (rank 0 does the work if launched under mpiexec).
//
//   wlb4d-plan DECK [--section.key=value ...] [--csv FILE]
//   wlb4d-plan DECK --search [--top N] [--write-deck FILE]   (DESIGN §11, plan/search.hpp)
//   wlb4d-plan --devices ["CUDA DEVICE NAME"]   the device table (core/device_table.hpp) as CSV
#include "tool_version.hpp"
#include "wlb4d/balance/doc_source.hpp"
#include "wlb4d/plan/search.hpp"
#include "wlb4d/plan/simulate.hpp"
#include "wlb4d/core/config.hpp"
#include "wlb4d/core/device_table.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/mpi_main.hpp"
#include "wlb4d/core/version.hpp"
#include "wlb4d/data/h5util.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {
namespace fs = std::filesystem;
using wlb::core::ConfigError;
using wlb::core::DataError;

// plan.lengths: absolute, else relative to the deck's directory, else to the CWD.
std::string resolve(const std::string& path, const std::string& deck) {
  if (path.empty()) throw ConfigError("plan.lengths must name a JSON length array or an HDF5 token dataset");
  const fs::path p(path);
  if (p.is_relative() && !deck.empty()) {
    const fs::path beside = fs::path(deck).parent_path() / p;
    if (fs::exists(beside)) return beside.string();
  }
  return path;
}

// Document lengths from an HDF5 token dataset's /doc_offsets (DESIGN §7).
std::vector<std::int64_t> lengths_from_hdf5(const std::string& path) {
  namespace h5 = wlb::data::h5;
  std::vector<std::uint64_t> off;
  std::string why;
  try {
    const h5::Quiet quiet;
    const h5::Handle f(h5::check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path, "cannot open"));
    off = h5::read_1d_u64(f.get(), "/doc_offsets", path);  // after h5::check_stored: no 2^40-entry read
  } catch (const DataError& e) {
    off.clear();
    why = std::string(" (") + e.what() + ")";
  }
  if (off.size() < 2)
    throw DataError("plan.lengths='" + path + "': cannot read a 1-D /doc_offsets (n_docs+1) from it" + why);
  std::vector<std::int64_t> len;
  for (std::size_t i = 1; i < off.size(); ++i) {
    if (off[i] <= off[i - 1]) throw DataError("plan.lengths='" + path + "': /doc_offsets must increase strictly");
    len.push_back(static_cast<std::int64_t>(off[i] - off[i - 1]));
  }
  return len;
}
}  // namespace

// --devices [NAME]: the device table as CSV (header, then one row per device),
// or only the row whose match rule accepts the CUDA device name NAME (as
// nvidia-smi --query-gpu=name prints it); exit 1 when none does. No MPI, no
// Kokkos: the GPU bundle's gpu-check.sh reads its MFU peaks from it, so the
// datasheet figures live in one place.
static int print_devices(int argc, char** argv) {
  using namespace wlb::core;
  if (argc > 3) {
    std::fprintf(stderr, "wlb4d-plan: --devices takes at most one CUDA device name\n");
    return 2;
  }
  const char* header = "key,name,fp32_tflops,tf32_tflops,bf16_tflops,memory_gb\n";
  const auto row = [](const DeviceSpec& d) {
    std::printf("%s,%s,%.6g,%.6g,%.6g,%.6g\n", d.key.c_str(), d.name.c_str(), d.fp32_tflops, d.tf32_tflops,
                d.bf16_tflops, d.memory_gb);
  };
  if (argc == 3) {
    const DeviceSpec* d = match_device_name(argv[2]);
    if (!d) {
      std::fprintf(stderr, "wlb4d-plan: the device '%s' is not in the device table (%s)\n", argv[2],
                   device_keys().c_str());
      return 1;
    }
    std::printf("%s", header);
    row(*d);
    return 0;
  }
  std::printf("%s", header);
  for (const auto& d : device_table()) row(d);
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--devices") return print_devices(argc, argv);
  return wlb::core::mpi_main(argc, argv, [](int ac, char** av) {
    using namespace wlb::core;
    if (ac == 1) {  // no deck: what to type, not a plan of the defaults
      if (world_rank() == 0)
        std::fprintf(stderr,
                     "Usage: wlb4d-plan DECK.ini [--section.key=value ...] [--csv FILE]\n"
                     "       wlb4d-plan DECK.ini --search [--top N] [--write-deck FILE]\n"
                     "       wlb4d-plan --devices [NAME]\n"
                     "  e.g. build/app/wlb4d-plan inputs/plan-7b-128k.ini --search\n"
                     "  wlb4d-plan --help lists the deck keys the planner reads.\n");
      return 2;
    }
    // The deck parser takes one positional (the deck): join "--csv FILE" first.
    std::vector<std::string> args(av, av + ac);
    for (std::size_t i = 1; i + 1 < args.size(); ++i) {
      if (args[i] == "--csv" || args[i] == "--top" || args[i] == "--write-deck") {
        args[i] += "=" + args[i + 1];
        args.erase(args.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      }
    }
    std::vector<const char*> argp;
    for (const auto& a : args) argp.push_back(a.c_str());
    CommandLine cl = parse_command_line(static_cast<int>(argp.size()), argp.data());
    std::string csv, write_deck;
    bool search = false;
    int top = 5;
    const char* usage = "wlb4d-plan takes DECK [--csv FILE] or DECK --search [--top N] [--write-deck FILE]";
    for (std::size_t i = 0; i < cl.extra.size(); ++i) {
      const std::string& a = cl.extra[i];
      if (a.rfind("--csv=", 0) == 0) {
        csv = a.substr(6);
      } else if (a == "--search") {
        search = true;
      } else if (a.rfind("--top=", 0) == 0) {
        std::size_t pos = 0;
        try {
          top = std::stoi(a.substr(6), &pos);
        } catch (...) {
          pos = 0;
        }
        if (pos == 0 || pos != a.size() - 6 || top < 1)
          throw ConfigError("--top '" + a.substr(6) + "' must be a count >= 1 (rows of the --search table)");
      } else if (a.rfind("--write-deck=", 0) == 0) {
        write_deck = a.substr(13);
        if (write_deck.empty()) throw ConfigError("--write-deck needs a file name");
      } else {
        throw ConfigError("unknown command-line argument '" + a + "' (" + usage + ")");
      }
    }
    if (!search && (top != 5 || !write_deck.empty()))
      throw ConfigError(std::string("--top and --write-deck need --search (") + usage + ")");
    if (search && !csv.empty()) throw ConfigError(std::string("--csv does not apply to --search (") + usage + ")");
    if (world_rank() != 0) return 0;  // every rank checked the command line; rank 0 simulates
    if (cl.help) {  // only the keys the planner reads
      std::printf("wlb4d-plan %s (%s)\n%s", kVersion, kGitSha,
                  deck_help("usage: wlb4d-plan DECK [--section.key=value ...] [--csv FILE] [--print-config] [--version]\n"
                            "       wlb4d-plan DECK [--section.key=value ...] --search [--top N] [--write-deck FILE]",
                            {"model.layers", "model.d_model", "model.heads", "model.kv_heads", "model.ffn_hidden",
                             "parallel.dp", "parallel.pp", "parallel.cp", "parallel.tp", "parallel.schedule",
                             "parallel.virtual_stages", "train.micro_batches", "train.max_seq_len", "train.seed",
                             "balance.max_tokens", "balance.max_delay", "balance.outlier_thresholds",
                             "balance.calibrate", "balance.cost_", "model.vocab_size", "model.recompute",
                             "parallel.zero", "parallel.sequence_parallel", "plan."})
                      .c_str());
      return 0;
    }
    if (cl.version) {
      std::printf("%s", tool_version("wlb4d-plan").c_str());
      return 0;
    }
    if (cl.print_config) {
      std::printf("%s", to_ini(cl.config).c_str());
      return 0;
    }
    const Config& cfg = cl.config;
    const std::string path = resolve(cfg.plan.lengths, cfg.deck_path);
    const auto ext = fs::path(path).extension().string();
    const auto lengths = (ext == ".h5" || ext == ".hdf5") ? lengths_from_hdf5(path)
                                                          : wlb::balance::load_lengths_json(path);
    std::printf("document lengths: %s (%zu documents)\n", path.c_str(), lengths.size());
    if (search) {
      const auto rep = wlb::plan::search_layouts(cfg, lengths);
      std::printf("%s", wlb::plan::format_search(rep, top).c_str());
      if (!write_deck.empty()) {
        std::ofstream out(write_deck);
        // The best at the deck's global batch (the deck's own row always is).
        const auto* best = wlb::plan::best_at_deck_batch(rep);
        if (!best) best = &rep.ranked.front();
        out << wlb::plan::search_deck(*best, fs::absolute(path).lexically_normal().string());
        if (!out) throw DataError("cannot write --write-deck file '" + write_deck + "'");
        std::printf("wrote %s (%s)\n", write_deck.c_str(), best->label().c_str());
      }
      return 0;
    }
    const auto report = wlb::plan::simulate_plan(cfg, lengths);
    std::printf("%s", wlb::plan::format_table(report, cfg).c_str());
    if (!csv.empty()) {
      std::ofstream out(csv);
      out << wlb::plan::format_csv(report);
      if (!out) throw DataError("cannot write --csv file '" + csv + "'");
      std::printf("wrote %s\n", csv.c_str());
    }
    return 0;
  });
}
