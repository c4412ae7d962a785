#include "wlb4d/core/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

namespace wlb::core {

void init_logging(int rank, const std::string& level) {
  auto logger = spdlog::stdout_logger_mt("wlb4d-" + std::to_string(rank));
  std::string tag = rank >= 0 ? "[r" + std::to_string(rank) + "] " : "";
  logger->set_pattern(tag + "%^%l%$: %v");
  auto lvl = spdlog::level::from_str(level);
  if (rank > 0 && lvl < spdlog::level::warn) lvl = spdlog::level::warn;
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

}  // namespace wlb::core
