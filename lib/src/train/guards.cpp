// Loss-spike guard and straggler flag. See guards.hpp.
#include "wlb4d/train/guards.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

namespace wlb::train {

namespace {
/// z of x against values v (population std, summed oldest first); 0 when std is 0.
double z_score(const std::vector<double>& v, double x) {
  double sum = 0;
  for (double a : v) sum += a;
  const double mean = sum / double(v.size());
  double ss = 0;
  for (double a : v) ss += (a - mean) * (a - mean);
  const double sd = std::sqrt(ss / double(v.size()));
  return sd > 0 ? (x - mean) / sd : 0.0;
}
}  // namespace

SpikeGuard::SpikeGuard(double z_max, int window, int warmup)
    : z_max_(z_max), window_(std::size_t(std::max(window, 2))), warmup_(std::size_t(std::max(warmup, 2))) {}

SpikeDecision SpikeGuard::observe(double loss, double grad_norm) {
  SpikeDecision d;
  if (loss_.size() >= warmup_) {
    d.judged = true;
    d.z_loss = z_score(loss_, loss);
    d.z_grad = z_score(grad_, grad_norm);
    d.skip = d.z_loss > z_max_ || d.z_grad > z_max_;
  }
  loss_.push_back(loss);
  grad_.push_back(grad_norm);
  if (loss_.size() > window_) {
    loss_.erase(loss_.begin());
    grad_.erase(grad_.begin());
  }
  return d;
}

std::vector<double> SpikeGuard::window_pairs() const {
  std::vector<double> p;
  p.reserve(2 * loss_.size());
  for (std::size_t i = 0; i < loss_.size(); ++i) {
    p.push_back(loss_[i]);
    p.push_back(grad_[i]);
  }
  return p;
}

void SpikeGuard::restore(const std::vector<double>& pairs) {
  if (pairs.size() % 2 != 0)
    throw std::invalid_argument("spike guard window: " + std::to_string(pairs.size()) +
                                " values, expected (loss, grad norm) pairs");
  loss_.clear();
  grad_.clear();
  const std::size_t n = pairs.size() / 2, from = n > window_ ? n - window_ : 0;
  for (std::size_t i = from; i < n; ++i) {
    loss_.push_back(pairs[2 * i]);
    grad_.push_back(pairs[2 * i + 1]);
  }
}

StragglerFlag::StragglerFlag(double factor, int steps) : factor_(factor), steps_(std::max(steps, 1)) {}

std::vector<Straggler> StragglerFlag::observe(const std::vector<io::TimingRecord>& all,
                                              std::vector<Straggler>* newly) {
  // Groups: ranks of one pipeline stage, unless every stage has one rank.
  std::map<int, std::vector<double>> by_stage;
  int max_rank = -1;
  for (const auto& r : all) {
    by_stage[r.pp].push_back(r.time[io::kForward] + r.time[io::kBackward]);
    max_rank = std::max(max_rank, int(r.rank));
  }
  bool singletons = true;
  for (const auto& [pp, v] : by_stage) singletons = singletons && v.size() == 1;
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  std::map<int, double> med;
  if (singletons) {
    std::vector<double> every;
    for (const auto& [pp, v] : by_stage) every.push_back(v.front());
    const double m = median(every);
    for (const auto& [pp, v] : by_stage) med[pp] = m;
  } else {
    for (const auto& [pp, v] : by_stage) med[pp] = median(v);
  }
  if (int(streak_.size()) <= max_rank) streak_.resize(std::size_t(max_rank) + 1, 0);
  std::vector<Straggler> out;
  for (const auto& r : all) {
    const double c = r.time[io::kForward] + r.time[io::kBackward], m = med[r.pp];
    const bool slow = all.size() > 1 && m > 0 && c > factor_ * m;
    int& s = streak_[std::size_t(r.rank)];
    s = slow ? s + 1 : 0;
    if (s >= steps_) {
      out.push_back({int(r.rank), c / m, s});
      if (newly && s == steps_) newly->push_back(out.back());
    }
  }
  std::sort(out.begin(), out.end(), [](const Straggler& a, const Straggler& b) { return a.rank < b.rank; });
  return out;
}

std::string format_stragglers(const std::vector<Straggler>& s) {
  if (s.empty()) return {};
  std::string t = " | straggler";
  for (std::size_t i = 0; i < s.size(); ++i)
    t += fmt::format("{} r{} {:.1f}x ({} steps)", i ? "," : "", s[i].rank, s[i].ratio, s[i].steps);
  return t;
}

}  // namespace wlb::train
