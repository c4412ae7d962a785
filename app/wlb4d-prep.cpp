// wlb4d-prep — text corpus (JSONL / .jsonl.xz / .txt / directories) -> HDF5
// token dataset(s) for wlb4d (DESIGN §7, docs/data.md). Serial: no MPI run
// needed. The logic lives in wlb::data (prep.hpp); this is the thin driver.
#include "tool_version.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/version.hpp"
#include "wlb4d/data/prep.hpp"

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  using namespace wlb;
  try {
    data::PrepOptions opts = data::parse_prep_args(argc, argv);
    if (opts.version) {
      std::printf("%s", tool_version("wlb4d-prep").c_str());
      return 0;
    }
    if (opts.help) {
      std::printf("wlb4d-prep %s (%s)\n%s", core::kVersion, core::kGitSha, data::prep_help().c_str());
      return 0;
    }
    data::PrepSummary s = data::run_prep(opts);
    std::fputs(data::format_summary(s).c_str(), stdout);
    return 0;
  } catch (const core::ConfigError& e) {
    std::fprintf(stderr, "wlb4d-prep: error: %s\n", e.what());
    return 2;
  } catch (const core::DataError& e) {
    std::fprintf(stderr, "wlb4d-prep: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wlb4d-prep: unexpected error: %s\n", e.what());
    return 1;
  }
}
