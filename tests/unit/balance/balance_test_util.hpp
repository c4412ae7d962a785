#pragma once
// Helpers shared by the balance unit tests.
#include "wlb4d/balance/doc_source.hpp"
#include "wlb4d/balance/plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace wlb_test {

inline std::string dist_path() { return std::string(WLB4D_SOURCE_DIR) + "/inputs/dist/dist_wlbllm.json"; }

// Long-tailed synthetic lengths: mostly lognormal short documents, 3% of
// documents near the context window.
inline std::vector<std::int64_t> long_tail_lengths(std::size_t n, std::int64_t window, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> body(7.0, 1.0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<std::int64_t> out(n);
  for (auto& x : out) {
    if (u(rng) < 0.03) {
      x = static_cast<std::int64_t>(window * (0.25 + 0.75 * u(rng)));
    } else {
      x = std::max<std::int64_t>(1, std::min<std::int64_t>(window, static_cast<std::int64_t>(body(rng))));
    }
  }
  return out;
}

// Collects trained spans per document.
struct Coverage {
  std::map<std::int64_t, std::vector<std::pair<std::int64_t, std::int64_t>>> spans;  // doc -> (offset, length)
  void add(const wlb::balance::Span& s) { spans[s.doc_id].push_back({s.offset, s.length}); }
  void add(const wlb::balance::StepPlan& p) {
    for (const auto& r : p.micro_batches)
      for (const auto& mb : r)
        for (const auto& s : mb.spans) add(s);
  }
  // Every document id < n_drawn with length len(id) is tiled exactly once.
  template <class LenOf>
  void expect_exact_tiling(std::int64_t n_drawn, LenOf len) const {
    ASSERT_EQ(static_cast<std::int64_t>(spans.size()), n_drawn) << "documents seen != documents drawn";
    for (const auto& [doc, v] : spans) {
      ASSERT_LT(doc, n_drawn);
      auto w = v;
      std::sort(w.begin(), w.end());
      std::int64_t at = 0;
      for (const auto& [off, l] : w) {
        ASSERT_GE(l, 1) << "doc " << doc;
        ASSERT_EQ(off, at) << "doc " << doc << ": gap or overlap at offset " << at;
        at += l;
      }
      ASSERT_EQ(at, len(doc)) << "doc " << doc << " not covered exactly";
    }
  }
};

}  // namespace wlb_test
