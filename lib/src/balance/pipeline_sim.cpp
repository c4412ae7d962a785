// Event simulation of pipeline schedules (see pipeline_sim.hpp).
#include "wlb4d/balance/pipeline_sim.hpp"

#include "wlb4d/core/error.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace wlb::balance {

using core::ConfigError;

std::vector<std::vector<Action>> schedule_order(const std::string& schedule, int pp, int v, int m) {
  if (pp < 1 || v < 1 || m < 1)
    throw ConfigError("pipeline simulation: pp, virtual_stages and micro-batches must be >= 1");
  if ((schedule == "gpipe" || schedule == "1f1b") && v != 1)
    throw ConfigError("parallel.schedule=" + schedule + " needs parallel.virtual_stages=1");
  std::vector<std::vector<Action>> order(static_cast<std::size_t>(pp));
  if (schedule == "gpipe") {
    for (auto& o : order) {
      for (int i = 0; i < m; ++i) o.push_back({0, i, Phase::Forward});
      for (int i = 0; i < m; ++i) o.push_back({0, i, Phase::Backward});
    }
  } else if (schedule == "bfs") {
    for (auto& o : order) {
      for (int c = 0; c < v; ++c)
        for (int i = 0; i < m; ++i) o.push_back({c, i, Phase::Forward});
      for (int c = v - 1; c >= 0; --c)
        for (int i = 0; i < m; ++i) o.push_back({c, i, Phase::Backward});
    }
  } else if (schedule == "1f1b" || schedule == "interleaved") {
    if (v > 1 && m % pp != 0)
      throw ConfigError("parallel.schedule=interleaved needs micro-batches per replica (" + std::to_string(m) +
                        ") to be a multiple of parallel.pp=" + std::to_string(pp));
    const int total = m * v;
    auto fwd = [&](int j) {
      if (v == 1) return Action{0, j, Phase::Forward};
      return Action{(j / pp) % v, (j / (pp * v)) * pp + j % pp, Phase::Forward};
    };
    auto bwd = [&](int j) {
      if (v == 1) return Action{0, j, Phase::Backward};
      return Action{v - 1 - (j / pp) % v, (j / (pp * v)) * pp + j % pp, Phase::Backward};
    };
    for (int d = 0; d < pp; ++d) {
      const int warm = v == 1 ? std::min(pp - d - 1, total) : std::min((pp - d - 1) * 2 + (v - 1) * pp, total);
      auto& o = order[static_cast<std::size_t>(d)];
      for (int j = 0; j < warm; ++j) o.push_back(fwd(j));
      for (int k = 0; k < total - warm; ++k) {
        o.push_back(fwd(warm + k));
        o.push_back(bwd(k));
      }
      for (int k = total - warm; k < total; ++k) o.push_back(bwd(k));
    }
  } else {
    throw ConfigError("parallel.schedule='" + schedule + "' must be gpipe, 1f1b, interleaved or bfs");
  }
  return order;
}

PipelineResult simulate_pipeline(const std::string& schedule, int pp, int v, const PipelineTimes& t) {
  const int K = pp * v;
  if (static_cast<int>(t.fwd.size()) != K || static_cast<int>(t.bwd.size()) != K || t.fwd.empty())
    throw ConfigError("pipeline simulation: durations need pp*virtual_stages = " + std::to_string(K) + " stages");
  const int m = static_cast<int>(t.fwd[0].size());
  for (int k = 0; k < K; ++k)
    if (static_cast<int>(t.fwd[k].size()) != m || static_cast<int>(t.bwd[k].size()) != m)
      throw ConfigError("pipeline simulation: every stage needs one duration per micro-batch");
  if (!t.p2p.empty() && static_cast<int>(t.p2p.size()) != m)
    throw ConfigError("pipeline simulation: p2p needs one time per micro-batch");
  const auto order = schedule_order(schedule, pp, v, m);
  constexpr double kNotDone = -1;
  std::vector<std::vector<double>> f_end(K, std::vector<double>(m, kNotDone)), b_end = f_end;
  auto p2p = [&](int i) { return t.p2p.empty() ? 0.0 : t.p2p[static_cast<std::size_t>(i)]; };
  std::vector<std::size_t> next(pp, 0);
  std::vector<double> free_at(pp, 0.0);
  PipelineResult res;
  res.busy.assign(pp, 0.0);
  std::size_t remaining = 0;
  for (const auto& o : order) remaining += o.size();
  while (remaining > 0) {
    bool progress = false;
    for (int d = 0; d < pp; ++d) {
      auto& ptr = next[static_cast<std::size_t>(d)];
      const auto& o = order[static_cast<std::size_t>(d)];
      while (ptr < o.size()) {
        const Action& a = o[ptr];
        const int k = a.chunk * pp + d, i = a.micro_batch;
        double ready = 0;
        if (a.phase == Phase::Forward) {
          if (k > 0) {
            if (f_end[k - 1][i] == kNotDone) break;
            ready = f_end[k - 1][i] + p2p(i);
          }
        } else if (k == K - 1) {
          if (f_end[k][i] == kNotDone) break;
          ready = f_end[k][i];
        } else {
          if (b_end[k + 1][i] == kNotDone) break;
          ready = b_end[k + 1][i] + p2p(i);
        }
        const double dur = a.phase == Phase::Forward ? t.fwd[k][i] : t.bwd[k][i];
        const double start = std::max(free_at[d], ready);
        const double end = start + dur;
        (a.phase == Phase::Forward ? f_end : b_end)[k][i] = end;
        free_at[d] = end;
        res.busy[d] += dur;
        res.makespan = std::max(res.makespan, end);
        ++ptr;
        --remaining;
        progress = true;
      }
    }
    if (!progress) throw std::logic_error("pipeline simulation: schedule '" + schedule + "' deadlocked");
  }
  double busy = 0;
  for (double b : res.busy) busy += b;
  res.bubble_fraction = res.makespan > 0 ? 1.0 - busy / (pp * res.makespan) : 0.0;
  return res;
}

}  // namespace wlb::balance
