// Cost model (docs/wlb-llm.md §2.1 Eq. 2, §3.4–3.5) and its calibration.
#include "wlb4d/balance/cost_model.hpp"

#include "wlb4d/balance/sharding.hpp"
#include "wlb4d/core/device_table.hpp"
#include "wlb4d/core/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>

namespace wlb::balance {

double CostModel::latency(const MicroBatch& mb) const {
  double t = c;
  for (const auto& s : mb.spans) t += span_cost(s.length);
  return t;
}

double CostModel::attention_piece(std::int64_t p, std::int64_t q) const {
  if (q <= 0) return 0.0;
  const std::int64_t t = std::max<std::int64_t>(tile, 1);
  const std::int64_t padded = (q + t - 1) / t * t;
  const double eff = padded < 2 * t ? small_tile_efficiency : 1.0;
  return b * static_cast<double>(padded) * static_cast<double>(2 * p + q) / eff;
}

std::vector<double> CostModel::rank_attention(const MicroBatch& mb, int cp, Sharding sharding) const {
  const auto pieces = shard_pieces(mb, cp, sharding);
  std::vector<double> out(cp, 0.0);
  for (int r = 0; r < cp; ++r)
    for (const auto& pc : pieces[r]) out[r] += attention_piece(pc.prefix, pc.length);
  return out;
}

std::vector<double> CostModel::rank_latencies(const MicroBatch& mb, int cp, Sharding sharding) const {
  const auto pieces = shard_pieces(mb, cp, sharding);
  std::vector<double> out(cp, c);
  for (int r = 0; r < cp; ++r) {
    std::int64_t tokens = 0;
    for (const auto& pc : pieces[r]) {
      tokens += pc.length;
      out[r] += attention_piece(pc.prefix, pc.length);
    }
    out[r] += a * static_cast<double>(tokens);
  }
  return out;
}

double CostModel::latency(const MicroBatch& mb, int cp, Sharding sharding) const {
  const auto v = rank_latencies(mb, cp, sharding);
  return *std::max_element(v.begin(), v.end());
}

double CostModel::breakpoint() const {
  return b > 0 ? a / b : std::numeric_limits<double>::infinity();
}

bool CostModel::uses_deck_coefficients(const core::BalanceConfig& bc) {
  return !bc.calibrate && (bc.cost_a > 0 || bc.cost_b > 0);
}

double CostModel::gemm_flops_per_s(const core::Config& cfg) {
  return core::gemm_flops(cfg);
}

CostModel CostModel::from_config(const core::Config& cfg) {
  const auto& bc = cfg.balance;
  if (!uses_deck_coefficients(bc))
    return from_model(cfg.model, cfg.parallel.tp, gemm_flops_per_s(cfg), cfg.plan.attention_efficiency);
  CostModel m;
  m.a = bc.cost_a;
  m.b = bc.cost_b;
  m.c = bc.cost_c;
  return m;
}

std::string CostModel::calibration_problem() const {
  auto num = [](double v) { return fmt::format("{:.3e}", v); };
  if (!std::isfinite(a) || !std::isfinite(b) || !std::isfinite(c))
    return "a = " + num(a) + ", b = " + num(b) + ", c = " + num(c) + " are not all finite";
  if (!(b > 0))
    return "the quadratic (attention) term b = " + num(b) +
           " is not positive (breakpoint infinite): the timings did not grow with the documents' squared lengths";
  if (!(a > 0))
    return "the linear term a = " + num(a) + " is not positive (breakpoint 0): the timings did not grow with tokens";
  if (c < 0) return "the per-micro-batch constant c = " + num(c) + " is negative";
  // Finite and positive above, but a/b may still overflow or round to 0.
  const double bp = breakpoint();
  if (!std::isfinite(bp) || !(bp > 0)) return "the breakpoint a/b = " + num(bp) + " tokens is not finite and positive";
  return {};
}

CostModel CostModel::from_model(const core::ModelConfig& model, int tp, double flops_per_s,
                                double attention_efficiency) {
  if (tp < 1) throw core::ConfigError("cost model: parallel.tp=" + std::to_string(tp) + " must be >= 1");
  if (!(flops_per_s > 0))
    throw core::ConfigError("cost model: plan.flops_per_s=" + std::to_string(flops_per_s) + " must be > 0");
  if (!(attention_efficiency > 0))
    throw core::ConfigError("cost model: attention efficiency must be > 0");
  const double hd = model.head_dim();
  const double p_layer = double(model.layer_matmul_params());
  CostModel m;
  m.a = 3.0 * 2.0 * p_layer / tp / flops_per_s;
  m.b = 3.5 * 2.0 * (model.heads * hd) / tp / (attention_efficiency * flops_per_s);
  m.c = 0;
  return m;
}

namespace {

// Least squares over the columns in `use` (bit 0: c, 1: a, 2: b), scaled.
// Returns false if the normal matrix is singular.
bool solve_subset(const std::vector<Sample>& s, unsigned use, std::array<double, 3>& coef, double& rss) {
  std::array<int, 3> cols{};
  int n = 0;
  for (int j = 0; j < 3; ++j)
    if (use & (1u << j)) cols[n++] = j;
  auto x = [](const Sample& q, int j) { return j == 0 ? 1.0 : (j == 1 ? q.sum_d : q.sum_d2); };
  std::array<double, 3> scale{1, 1, 1};
  for (int k = 0; k < n; ++k) {
    double mx = 0;
    for (const auto& q : s) mx = std::max(mx, std::fabs(x(q, cols[k])));
    if (mx == 0) return false;
    scale[k] = mx;
  }
  double A[3][4] = {};
  for (const auto& q : s) {
    double row[3];
    for (int k = 0; k < n; ++k) row[k] = x(q, cols[k]) / scale[k];
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) A[i][j] += row[i] * row[j];
      A[i][n] += row[i] * q.seconds;
    }
  }
  double trace = 0;
  for (int i = 0; i < n; ++i) trace += A[i][i];
  // Gaussian elimination with partial pivoting.
  for (int i = 0; i < n; ++i) {
    int piv = i;
    for (int r = i + 1; r < n; ++r)
      if (std::fabs(A[r][i]) > std::fabs(A[piv][i])) piv = r;
    if (std::fabs(A[piv][i]) <= 1e-12 * trace) return false;
    if (piv != i)
      for (int j = 0; j <= n; ++j) std::swap(A[i][j], A[piv][j]);
    for (int r = 0; r < n; ++r) {
      if (r == i) continue;
      const double f = A[r][i] / A[i][i];
      for (int j = i; j <= n; ++j) A[r][j] -= f * A[i][j];
    }
  }
  coef = {0, 0, 0};
  for (int k = 0; k < n; ++k) coef[cols[k]] = A[k][n] / A[k][k] / scale[k];
  rss = 0;
  for (const auto& q : s) {
    const double e = q.seconds - (coef[0] + coef[1] * q.sum_d + coef[2] * q.sum_d2);
    rss += e * e;
  }
  return true;
}

}  // namespace

CostModel fit(const std::vector<Sample>& samples) {
  if (samples.empty()) throw core::DataError("cost model fit: no timing samples");
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const auto& q = samples[i];
    if (!std::isfinite(q.sum_d) || !std::isfinite(q.sum_d2) || !std::isfinite(q.seconds) || q.sum_d < 0 ||
        q.sum_d2 < 0 || q.seconds < 0)
      throw core::DataError("cost model fit: sample " + std::to_string(i) +
                            " must have finite, non-negative sum_d, sum_d2 and seconds");
  }
  bool found = false;
  double best_rss = 0;
  int best_n = 0;
  std::array<double, 3> best{};
  for (unsigned use = 1; use < 8; ++use) {
    std::array<double, 3> coef{};
    double rss = 0;
    if (!solve_subset(samples, use, coef, rss)) continue;
    if (coef[0] < 0 || coef[1] < 0 || coef[2] < 0) continue;
    const int n = __builtin_popcount(use);
    // Lowest residual; a larger subset must win by more than rounding.
    const bool better = !found || rss < best_rss * (1 - 1e-9) ||
                        (rss <= best_rss * (1 + 1e-9) && n < best_n);
    if (better) {
      found = true;
      best_rss = rss;
      best_n = n;
      best = coef;
    }
  }
  if (!found)
    throw core::DataError("cost model fit: the samples do not determine any of c, a, b (need varied Σd, Σd²)");
  CostModel m;
  m.c = best[0];
  m.a = best[1];
  m.b = best[2];
  return m;
}

}  // namespace wlb::balance
