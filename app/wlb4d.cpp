// wlb4d — the training driver: MPI + Kokkos start-up, deck, Trainer.
#include "wlb4d/core/config.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/log.hpp"
#include "wlb4d/core/mpi_main.hpp"
#include "wlb4d/core/version.hpp"

#include <cstdio>

int main(int argc, char** argv) {
  return wlb::core::mpi_main(argc, argv, [](int ac, char** av) {
    using namespace wlb::core;
    CommandLine cl = parse_command_line(ac, av);
    if (cl.help) {
      if (world_rank() == 0) std::printf("wlb4d %s (%s)\n%s", kVersion, kGitSha, deck_help().c_str());
      return 0;
    }
    if (!cl.extra.empty()) throw ConfigError("unknown command-line argument '" + cl.extra.front() + "'");
    if (cl.print_config) {
      if (world_rank() == 0) std::printf("%s", to_ini(cl.config).c_str());
      return 0;
    }
    validate_world(cl.config, world_size());
    init_logging(world_rank(), cl.config.log.level);
    spdlog::info("wlb4d {} ({}): deck {}", kVersion, kGitSha, cl.config.deck_path);
    return 0;
  });
}
