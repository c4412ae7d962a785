// wlb4d — the training driver: MPI + Kokkos start-up, deck, process grid, Trainer.
#include "tool_version.hpp"
#include "wlb4d/core/attention_kernel.hpp"
#include "wlb4d/core/blas_info.hpp"
#include "wlb4d/core/config.hpp"
#include "wlb4d/core/signals.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/fault.hpp"
#include "wlb4d/core/log.hpp"
#include "wlb4d/core/mpi_main.hpp"
#include "wlb4d/core/version.hpp"
#include "wlb4d/comm/phase_watch.hpp"
#include "wlb4d/grid/process_grid.hpp"
#include "wlb4d/model/attention.hpp"
#include "wlb4d/model/bf16_gemm.hpp"
#include "wlb4d/train/trainer.hpp"

#include <Kokkos_Core.hpp>

#include <cstdio>

namespace {
/// --check: the deck (already validated by the parser) and the layout for the
/// rank count; reads nothing else (no dataset, no checkpoint). 0 or ConfigError.
int check_only(const wlb::core::CommandLine& cl) {
  using namespace wlb::core;
  const int ranks = cl.check_ranks > 0 ? cl.check_ranks : world_size();
  validate_world(cl.config, ranks);
  const auto& p = cl.config.parallel;
  const auto& m = cl.config.model;
  const AttentionKernelChoice attn =
      resolve_attention_kernel(m.attention_kernel, m.head_dim(), cl.config.train.precision, cudnn_attention_built());
  if (world_rank() == 0)
    std::printf("wlb4d --check: deck %s OK for %d ranks: dp=%d pp=%d cp=%d tp=%d (schedule %s, packer %s, "
                "attention kernel %s: %s)\n",
                cl.config.deck_path.empty() ? "(defaults)" : cl.config.deck_path.c_str(), ranks, p.dp, p.pp, p.cp,
                p.tp, p.schedule.c_str(), cl.config.balance.packer.c_str(), attn.kernel.c_str(), attn.why.c_str());
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  return wlb::core::mpi_main(argc, argv, [](int ac, char** av) {
    using namespace wlb;
    if (ac == 1) {  // no deck and no key: a user asking what to do, not a run of the defaults
      if (core::world_rank() == 0)
        std::fprintf(stderr,
                     "Usage: wlb4d DECK.ini [--section.key=value ...] [--print-config] [--check] [--help]\n"
                     "  e.g. scripts/quickstart.sh, or: mpiexec -n 8 build/app/wlb4d inputs/quickstart.ini\n"
                     "  wlb4d --help lists every deck key.\n");
      return 2;
    }
    core::install_stop_handlers();  // first: a stop during start-up is deferred, not fatal
    core::check_fault_env();        // tests' WLB4D_FAULT: a typo fails every rank now, not mid-run
    core::CommandLine cl = core::parse_command_line(ac, av);
    const int rank = core::world_rank();
    if (cl.help) {
      if (rank == 0) std::printf("wlb4d %s (%s)\n%s", core::kVersion, core::kGitSha, core::deck_help().c_str());
      return 0;
    }
    if (cl.version) {
      if (rank == 0) std::printf("%s", tool_version("wlb4d").c_str());
      return 0;
    }
    if (!cl.extra.empty()) throw core::ConfigError("unknown command-line argument '" + cl.extra.front() + "'");
    if (cl.print_config) {
      if (rank == 0) std::printf("%s", core::to_ini(cl.config).c_str());
      return 0;
    }
    if (cl.check) return check_only(cl);
    const core::Config& cfg = cl.config;
    core::validate_world(cfg, core::world_size());
    core::init_logging(rank, cfg.log.level);
    const auto& p = cfg.parallel;
    grid::ProcessGrid grid(p.dp, p.pp, p.cp, p.tp,
                           cfg.comm.wait == "block" ? comm::WaitMode::Block : comm::WaitMode::Yield);
    grid.use_backend(cfg.comm.backend);  // before the Trainer copies the communicators
    comm::set_wait_timeout(cfg.comm.wait == "yield" ? cfg.comm.timeout_s : 0.0);
    // The same bound for checkpoint I/O, which waits inside MPI-IO (phase_watch.hpp);
    // it also ends a stopped rank of this host when the job is aborted.
    comm::init_phase_watch(grid.world());
    spdlog::info("wlb4d {} ({}) | deck {} | {} rank{}: dp={} pp={} cp={} tp={} | schedule {} | packer {} | sharding {}"
                 " | recompute {} | zero {} | sequence parallel {} | kokkos {} | device collectives {}",
                 core::kVersion, core::kGitSha, cfg.deck_path.empty() ? "(defaults)" : cfg.deck_path,
                 grid.world_size(), grid.world_size() == 1 ? "" : "s", p.dp, p.pp, p.cp, p.tp, p.schedule, cfg.balance.packer, cfg.balance.sharding,
                 cfg.model.recompute, p.zero, p.sequence_parallel ? "on" : "off", ExecSpace::name(),
                 grid.dpcp().device_backend());
    const auto blas = core::probe_blas();  // the GEMMs' kernel: a generic one costs 4-7x
    spdlog::info("{}", blas.summary());
    model::select_attention_kernel(cfg.model.attention_kernel, cfg.model.head_dim(), cfg.train.precision);
    spdlog::info("{}", model::attention_summary());
    if (const auto advice = blas.advice(); !advice.empty() && rank == 0) spdlog::warn("{}", advice);
    if (const auto advice = blas.thread_advice(); !advice.empty() && rank == 0) spdlog::warn("{}", advice);
    if (cfg.comm.wait == "block" && cfg.comm.timeout_s > 0 && rank == 0)
      spdlog::warn("comm.timeout_s={:g} has no effect with comm.wait=block: a blocking MPI call cannot be timed, so "
                   "a stopped rank hangs the job; use comm.wait=yield for the watchdog",
                   cfg.comm.timeout_s);
    spdlog::info("precision {}{}", cfg.train.precision,
                 cfg.train.precision == "bf16" ? " | " + model::bf16_gemm_summary() : std::string());
    if (p.print_coords) std::printf("%s\n", grid.describe().c_str());
    train::Trainer trainer(cfg, grid);
    trainer.run();
    if (const auto report = model::attention_cache_report(); !report.empty()) spdlog::info("{}", report);
    return 0;
  });
}
