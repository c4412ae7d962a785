#include "wlb4d/train/calibrate.hpp"

#include "wlb4d/core/clock.hpp"
#include "wlb4d/core/fault.hpp"
#include "wlb4d/model/transformer.hpp"

#include <Kokkos_Core.hpp>

#include <fmt/format.h>

#include <algorithm>

namespace wlb::train {

RunCostModel untimed_cost_model(const core::Config& cfg) {
  RunCostModel r;
  r.cost = balance::CostModel::from_config(cfg);
  r.source = balance::CostModel::uses_deck_coefficients(cfg.balance) ? kCostDeck : kCostFlops;
  return r;
}

RunCostModel accept_calibration(const core::Config& cfg, const balance::CostModel& fitted) {
  const std::string why = fitted.calibration_problem();
  if (why.empty()) return {fitted, kCostCalibrated, {}};
  core::Config flops = cfg;  // the deck's cost_a/b are not looked at under calibrate=true
  flops.balance.calibrate = true;
  RunCostModel r{balance::CostModel::from_config(flops), kCostFlopsFallback, {}};
  r.warning = fmt::format(
      "balance.calibrate=true: the calibration is degenerate ({}; fit a = {:.3e} s/token, b = {:.3e} s/token^2, "
      "c = {:.3e} s): planning with the FLOP-count model instead (a = {:.3e}, b = {:.3e}, breakpoint {:.0f} "
      "tokens), as balance.calibrate=false does; the node was probably busy while timing",
      why, fitted.a, fitted.b, fitted.c, r.cost.a, r.cost.b, r.cost.breakpoint());
  return r;
}

std::optional<RunCostModel> reuse_calibration(const core::Config& cfg, const std::string& source,
                                              const balance::CostModel& saved) {
  if (source == kCostCalibrated) return accept_calibration(cfg, saved);
  if (source == kCostFlopsFallback) {  // damaged constants: the FLOP-count model afresh, with the warning
    if (!saved.calibration_problem().empty()) return accept_calibration(cfg, saved);
    return RunCostModel{saved, kCostFlopsFallback, {}};
  }
  return std::nullopt;
}

Calibration calibrate_cost_model(const core::ModelConfig& model, std::int64_t max_tokens,
                                 const comm::Communicator& world, int repeats) {
  Calibration cal;
  std::vector<double> flat;  // a, b, c, then (sum_d, sum_d2, seconds) triples
  if (world.rank() == 0) {
    core::ModelConfig one = model;
    one.layers = 1;
    model::ModelShard sh;
    sh.layer_begin = 0;
    sh.layer_end = 1;
    sh.embedding = false;
    sh.head = false;
    const std::int64_t vocab = 2;  // no embedding/head in this shard: vocab is irrelevant
    model::Transformer<float> layer(one, vocab, sh, comm::Communicator::self(), 1, max_tokens);
    layer.params().init_parameters(7);
    const std::int64_t d = model.d_model;
    View2<float> x("calib_x", max_tokens, d), dy("calib_dy", max_tokens, d);
    Kokkos::deep_copy(x, 0.1f);
    Kokkos::deep_copy(dy, 1e-3f);
    for (std::int64_t T : {max_tokens / 4, max_tokens / 2, max_tokens}) {  // three lengths separate a from c
      for (std::int64_t ndocs : {1, 4, 16, 64}) {
        if (T / ndocs < 1) continue;
        std::vector<std::int64_t> cu{0};
        for (std::int64_t i = 0; i < ndocs; ++i) cu.push_back(i + 1 == ndocs ? T : cu.back() + T / ndocs);
        auto mb = model::make_micro_batch(cu, {});
        double best = 1e300;
        for (int r = 0; r < repeats + 1; ++r) {  // first run warms caches and BLAS
          Kokkos::fence();
          const double w0 = core::wall_seconds(), c0 = core::process_cpu_seconds();
          layer.forward(0, mb, x);
          layer.backward(0, mb, dy, 1.0);
          Kokkos::fence();
          // min(wall, CPU): CPU time when ranks outnumber cores (wall then counts
          // other ranks' slices), wall time when kernels use several threads
          // (CPU time then sums them) or wait on a device.
          const double s = std::min(core::wall_seconds() - w0, core::process_cpu_seconds() - c0);
          if (r > 0) best = std::min(best, s);
        }
        balance::Sample smp;
        for (std::size_t i = 0; i + 1 < cu.size(); ++i) {
          const double len = double(cu[i + 1] - cu[i]);
          smp.sum_d += len;
          smp.sum_d2 += len * len;
        }
        smp.seconds = best * core::fault_calibration_scale(std::int64_t(cal.samples.size()));  // tests only
        cal.samples.push_back(smp);
      }
    }
    cal.cost = balance::fit(cal.samples);
    flat = {cal.cost.a, cal.cost.b, cal.cost.c};
    for (const auto& s : cal.samples) flat.insert(flat.end(), {s.sum_d, s.sum_d2, s.seconds});
  }
  std::int64_t n = std::int64_t(flat.size());
  world.broadcast(&n, 1, 0);
  flat.resize(std::size_t(n));
  world.broadcast(flat.data(), flat.size(), 0);
  cal.cost.a = flat[0];
  cal.cost.b = flat[1];
  cal.cost.c = flat[2];
  cal.samples.clear();
  for (std::size_t i = 3; i + 2 < flat.size(); i += 3) cal.samples.push_back({flat[i], flat[i + 1], flat[i + 2]});
  return cal;
}

}  // namespace wlb::train
