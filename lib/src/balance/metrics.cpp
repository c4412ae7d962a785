#include "wlb4d/balance/metrics.hpp"

#include "wlb4d/balance/sharding.hpp"
#include "wlb4d/core/error.hpp"

#include <algorithm>
#include <string>

namespace wlb::balance {
namespace {
double max_over_mean(const std::vector<double>& v) {
  if (v.empty()) return 1.0;
  double mx = 0, sum = 0;
  for (double x : v) {
    mx = std::max(mx, x);
    sum += x;
  }
  return sum > 0 ? mx * static_cast<double>(v.size()) / sum : 1.0;
}
}  // namespace

StepMetrics step_metrics(const StepPlan& plan, const CostModel& cost, int cp) {
  if (cp < 1) throw core::ConfigError("metrics: parallel.cp=" + std::to_string(cp) + " must be >= 1");
  StepMetrics m;
  m.step = plan.step;
  m.tokens = plan.tokens;
  m.target_tokens = plan.target_tokens;
  m.micro_batches = plan.num_micro_batches();
  std::vector<double> attn, lat, replica;
  double cp_sum = 0;
  for (std::size_t r = 0; r < plan.micro_batches.size(); ++r) {
    double rep = 0;
    for (std::size_t i = 0; i < plan.micro_batches[r].size(); ++i) {
      const auto& mb = plan.micro_batches[r][i];
      const Sharding sh = i < plan.sharding[r].size() ? plan.sharding[r][i] : Sharding::Sequence;
      double d2 = 0;
      for (const auto& s : mb.spans) d2 += static_cast<double>(s.length) * static_cast<double>(s.length);
      attn.push_back(d2);
      const double l = cost.latency(mb, cp, sh);
      lat.push_back(l);
      rep += l;
      const double ci = max_over_mean(causal_work(mb, cp, sh));
      cp_sum += ci;
      m.cp_imbalance_max = std::max(m.cp_imbalance_max, ci);
    }
    replica.push_back(rep);
  }
  m.attention_imbalance = max_over_mean(attn);
  m.latency_imbalance = max_over_mean(lat);
  m.replica_imbalance = max_over_mean(replica);
  m.cp_imbalance = lat.empty() ? 1.0 : cp_sum / static_cast<double>(lat.size());
  m.mean_delay_steps = plan.tokens > 0 ? static_cast<double>(plan.delay_token_steps) / static_cast<double>(plan.tokens) : 0.0;
  m.max_delay_steps = plan.max_delay_steps;
  return m;
}

RunMetrics summarize(const std::vector<StepMetrics>& steps) {
  RunMetrics r;
  r.steps = static_cast<std::int64_t>(steps.size());
  if (steps.empty()) return r;
  double a = 0, l = 0, rep = 0, c = 0, delay = 0, tok = 0;
  for (const auto& s : steps) {
    a += s.attention_imbalance;
    l += s.latency_imbalance;
    rep += s.replica_imbalance;
    c += s.cp_imbalance;
    delay += s.mean_delay_steps * static_cast<double>(s.tokens);
    tok += static_cast<double>(s.tokens);
    r.max_delay_steps = std::max(r.max_delay_steps, s.max_delay_steps);
  }
  const double n = static_cast<double>(steps.size());
  r.attention_imbalance = a / n;
  r.latency_imbalance = l / n;
  r.replica_imbalance = rep / n;
  r.cp_imbalance = c / n;
  r.mean_delay_steps = tok > 0 ? delay / tok : 0.0;
  r.tokens_per_step = tok / n;
  return r;
}

}  // namespace wlb::balance
