#pragma once
/// \file log.hpp
/// \brief spdlog set-up: rank 0 logs at the deck's level, other ranks only
/// warnings and errors, every line tagged with the world rank.

#include <spdlog/spdlog.h>

#include <string>

namespace wlb::core {

/// Configures the default spdlog logger for this rank.
/// \param rank world rank (-1: not under MPI)
/// \param level trace|debug|info|warn|error (log.level)
void init_logging(int rank, const std::string& level = "info");

}  // namespace wlb::core
