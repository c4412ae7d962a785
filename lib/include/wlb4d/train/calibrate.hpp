#pragma once
/// \file calibrate.hpp
/// \brief Start-up calibration of the balancing cost model (WLB-LLM §4.1,
/// docs/wlb-llm.md §2.1): time this build's own transformer layer
/// (forward + backward) on micro-batches of known Σd and Σd², and fit
/// seconds ≈ c + a·Σd + b·Σd² per layer with balance::fit.
///
/// Timing runs on world rank 0 only and the coefficients are broadcast, so
/// every rank plans with the same cost model (plans must be identical). Each
/// sample is min(wall, process CPU) seconds, so the fit is not inflated when
/// the node is oversubscribed (the other ranks wait politely meanwhile).

#include "wlb4d/balance/cost_model.hpp"
#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/core/config.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace wlb::train {

/// Measured samples and the fitted model.
struct Calibration {
  std::vector<balance::Sample> samples;  ///< per-layer seconds per shape
  balance::CostModel cost;
};

/// Sources of the run's cost model (io::CheckpointInfo::cost_source).
inline constexpr const char* kCostFlops = "flops";                  ///< FLOP-count model (the default)
inline constexpr const char* kCostDeck = "deck";                    ///< balance.cost_a/b/c
inline constexpr const char* kCostCalibrated = "calibrated";        ///< timed (balance.calibrate=true)
inline constexpr const char* kCostFlopsFallback = "flops-fallback";  ///< calibration degenerate: FLOP-count model

/// The run's balancing cost model and where it came from.
struct RunCostModel {
  balance::CostModel cost;
  std::string source;   ///< one of kCost* above
  std::string warning;  ///< non-empty: why a calibration was not planned with (the caller prints it)
};

/// The untimed model, CostModel::from_config(cfg): source kCostDeck when the
/// deck gives cost_a/cost_b (balance.calibrate=false), else kCostFlops.
/// \throws core::ConfigError as CostModel::from_model.
RunCostModel untimed_cost_model(const core::Config& cfg);

/// A calibration's fit, checked before anything is planned with it: the fit
/// itself (kCostCalibrated) when CostModel::calibration_problem() is empty;
/// else the FLOP-count model (kCostFlopsFallback, what balance.calibrate=false
/// plans with) and a warning naming the fit and the problem. A fallback, not
/// a refusal: the balancer changes where documents go, never what is trained,
/// and a degenerate fit comes from the machine's state at start-up (load),
/// which no deck edit can fix; the warning makes it loud, and the checkpoint
/// records the fallback so that a resume plans the same.
RunCostModel accept_calibration(const core::Config& cfg, const balance::CostModel& fitted);

/// For a resume with balance.calibrate=true: the cost model saved in the
/// checkpoint (`source`, `saved`: io::CheckpointInfo cost_*), so that the
/// resumed run plans as the uninterrupted one. kCostCalibrated:
/// accept_calibration(saved) (checked again, so damaged constants fall back
/// with a warning); kCostFlopsFallback: `saved` as it is; anything else (a
/// checkpoint of a run that did not calibrate, or none stored): nullopt, and
/// the caller calibrates now.
std::optional<RunCostModel> reuse_calibration(const core::Config& cfg, const std::string& source,
                                              const balance::CostModel& saved);

/// Times one layer of `model` (tp = 1, no embedding/head) on packed
/// micro-batches of `max_tokens`, `max_tokens/2` and `max_tokens/4` tokens cut into 1, 4, 16
/// and 64 equal documents; best of `repeats` runs per shape. Collective over
/// `world` (rank 0 measures, everyone receives the result). Tests:
/// WLB4D_FAULT=calib_load scales one sample's seconds (core/fault.hpp).
/// \throws core::DataError if the fit fails.
Calibration calibrate_cost_model(const core::ModelConfig& model, std::int64_t max_tokens,
                                 const comm::Communicator& world, int repeats = 2);

}  // namespace wlb::train
