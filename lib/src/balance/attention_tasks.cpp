#include "wlb4d/balance/attention_tasks.hpp"

#include "wlb4d/core/error.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <tuple>

namespace wlb::balance {
namespace {
using core::ConfigError;

double imbalance(const std::vector<double>& v) {
  if (v.empty()) return 1.0;
  const double total = std::accumulate(v.begin(), v.end(), 0.0);
  if (total <= 0) return 1.0;
  return *std::max_element(v.begin(), v.end()) / (total / static_cast<double>(v.size()));
}
}  // namespace

double AttentionAssignment::imbalance_before() const { return imbalance(cost_before); }
double AttentionAssignment::imbalance_after() const { return imbalance(cost_after); }

std::vector<AttentionTask> make_attention_tasks(const std::vector<std::vector<Piece>>& pieces,
                                                const std::vector<int>& replica_of, const CostModel& cost,
                                                std::int64_t task_tokens) {
  if (task_tokens < 1) throw ConfigError("attention tasks: task_tokens must be >= 1, got " + std::to_string(task_tokens));
  if (pieces.size() != replica_of.size())
    throw ConfigError("attention tasks: " + std::to_string(pieces.size()) + " ranks of pieces but " +
                      std::to_string(replica_of.size()) + " replica entries");
  // Whole attention tiles per task: a task that splits a tile pays its padding twice.
  const std::int64_t tile = std::max<std::int64_t>(1, cost.tile);
  const std::int64_t step = (task_tokens + tile - 1) / tile * tile;
  std::vector<AttentionTask> tasks;
  for (std::size_t r = 0; r < pieces.size(); ++r) {
    std::int64_t row = 0;  // pieces are in micro-batch order, so rows follow piece lengths
    for (const Piece& p : pieces[r]) {
      for (std::int64_t off = 0; off < p.length; off += step) {
        AttentionTask t;
        t.home = static_cast<int>(r);
        t.replica = replica_of[r];
        t.span = p.span;
        t.prefix = p.prefix + off;
        t.length = std::min(step, p.length - off);
        t.cost = cost.attention_piece(t.prefix, t.length);
        t.row = row + off;
        t.mb_start = p.mb_start + off;
        tasks.push_back(t);
      }
      row += p.length;
    }
  }
  return tasks;
}

AttentionAssignment assign_attention_tasks(const std::vector<AttentionTask>& tasks, int ranks,
                                           const std::vector<int>& replica_of, const AttentionTraffic& traffic,
                                           double tolerance) {
  if (ranks < 1) throw ConfigError("attention assignment: ranks must be >= 1, got " + std::to_string(ranks));
  if (static_cast<int>(replica_of.size()) != ranks)
    throw ConfigError("attention assignment: replica_of has " + std::to_string(replica_of.size()) +
                      " entries for " + std::to_string(ranks) + " ranks");
  if (!(tolerance >= 0)) throw ConfigError("attention assignment: tolerance must be >= 0");
  const std::size_t R = static_cast<std::size_t>(ranks);
  AttentionAssignment a;
  a.owner.resize(tasks.size());
  a.cost_before.assign(R, 0.0);
  a.bytes_in.assign(R, 0.0);
  std::vector<std::vector<std::size_t>> home_tasks(R);
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const int h = tasks[i].home;
    if (h < 0 || h >= ranks)
      throw ConfigError("attention assignment: task " + std::to_string(i) + " has home " + std::to_string(h) +
                        " outside [0, " + std::to_string(ranks) + ")");
    a.owner[i] = h;
    a.cost_before[static_cast<std::size_t>(h)] += tasks[i].cost;
    home_tasks[static_cast<std::size_t>(h)].push_back(i);
  }
  std::vector<double> load = a.cost_before;
  const double mean = std::accumulate(load.begin(), load.end(), 0.0) / static_cast<double>(R);
  // Longest key range already sent per (replica, span, destination).
  std::map<std::tuple<int, std::int32_t, int>, std::int64_t> keys_at;
  auto move_bytes = [&](const AttentionTask& t, int dst) {
    double b = traffic.query_row * static_cast<double>(t.length);
    if (replica_of[static_cast<std::size_t>(dst)] != t.replica) {
      const auto it = keys_at.find({t.replica, t.span, dst});
      const std::int64_t have = it == keys_at.end() ? 0 : it->second;
      b += traffic.key_row * static_cast<double>(std::max<std::int64_t>(0, t.key_rows() - have));
    }
    return b;
  };
  std::vector<char> moved(tasks.size(), 0);
  for (std::size_t iter = 0; iter <= tasks.size(); ++iter) {
    const auto src = static_cast<std::size_t>(std::max_element(load.begin(), load.end()) - load.begin());
    const auto dst = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    if (src == dst || load[src] <= (1.0 + tolerance) * mean) break;
    const double fit = std::min(load[src] - mean, mean - load[dst]);
    const double gap = load[src] - load[dst];
    std::size_t best = tasks.size();
    double best_ratio = -1, best_max = std::numeric_limits<double>::infinity();
    // Pass 1: tasks that fit surplus and deficit, most seconds per byte.
    for (std::size_t i : home_tasks[src]) {
      if (moved[i] || tasks[i].cost <= 0 || tasks[i].cost > fit) continue;
      const double b = move_bytes(tasks[i], static_cast<int>(dst));
      const double ratio = b > 0 ? tasks[i].cost / b : std::numeric_limits<double>::infinity();
      if (ratio > best_ratio || (ratio == best_ratio && tasks[i].cost > tasks[best].cost)) {
        best = i;
        best_ratio = ratio;
      }
    }
    // Pass 2: none fits: the task that lowers max(load[src], load[dst]) most
    // — by more than rounding (a task costing the whole gap would only swap
    // the two ranks and move bytes for nothing).
    if (best == tasks.size()) {
      const double min_gain = 1e-6 * load[src];
      for (std::size_t i : home_tasks[src]) {
        if (moved[i] || tasks[i].cost <= 0 || tasks[i].cost >= gap) continue;
        const double m = std::max(load[src] - tasks[i].cost, load[dst] + tasks[i].cost);
        if (m < best_max && load[src] - m > min_gain) {
          best = i;
          best_max = m;
        }
      }
    }
    if (best == tasks.size()) break;
    const AttentionTask& t = tasks[best];
    const double b = move_bytes(t, static_cast<int>(dst));
    if (replica_of[dst] != t.replica) {
      std::int64_t& have = keys_at[{t.replica, t.span, static_cast<int>(dst)}];
      have = std::max(have, t.key_rows());
    }
    a.bytes += b;
    a.bytes_in[dst] += b;
    a.owner[best] = static_cast<int>(dst);
    moved[best] = 1;
    ++a.moved;
    load[src] -= t.cost;
    load[dst] += t.cost;
  }
  a.cost_after = load;
  return a;
}

std::vector<SlotAttention> disaggregate_step(const StepPlan& plan, int cp, const CostModel& cost,
                                             const AttentionTraffic& traffic, std::int64_t task_tokens,
                                             double tolerance) {
  if (cp < 1) throw ConfigError("attention disaggregation: cp must be >= 1, got " + std::to_string(cp));
  std::size_t slots = 0;
  for (const auto& r : plan.micro_batches) slots = std::max(slots, r.size());
  std::vector<SlotAttention> out;
  for (std::size_t j = 0; j < slots; ++j) {
    SlotAttention s;
    std::vector<std::vector<Piece>> pieces;
    std::vector<int> replica_of;
    for (std::size_t d = 0; d < plan.micro_batches.size(); ++d) {
      if (plan.micro_batches[d].size() <= j) continue;
      s.replicas.push_back(static_cast<int>(d));
      const Sharding sh = d < plan.sharding.size() && j < plan.sharding[d].size() ? plan.sharding[d][j]
                                                                                   : Sharding::Sequence;
      for (auto& p : shard_pieces(plan.micro_batches[d][j], cp, sh)) {
        pieces.push_back(std::move(p));
        replica_of.push_back(static_cast<int>(d));
      }
    }
    const auto tasks = make_attention_tasks(pieces, replica_of, cost, task_tokens);
    const auto a = assign_attention_tasks(tasks, static_cast<int>(pieces.size()), replica_of, traffic, tolerance);
    s.cost_before = a.cost_before;
    s.cost_after = a.cost_after;
    s.cost_home.assign(pieces.size(), 0.0);
    for (std::size_t i = 0; i < tasks.size(); ++i)
      if (a.owner[i] == tasks[i].home) s.cost_home[static_cast<std::size_t>(tasks[i].home)] += tasks[i].cost;
    s.bytes_in = a.bytes_in;
    s.moved = a.moved;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace wlb::balance
