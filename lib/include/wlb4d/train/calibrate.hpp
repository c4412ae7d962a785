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
#include <vector>

namespace wlb::train {

/// Measured samples and the fitted model.
struct Calibration {
  std::vector<balance::Sample> samples;  ///< per-layer seconds per shape
  balance::CostModel cost;
};

/// Times one layer of `model` (tp = 1, no embedding/head) on packed
/// micro-batches of `max_tokens`, `max_tokens/2` and `max_tokens/4` tokens cut into 1, 4, 16
/// and 64 equal documents; best of `repeats` runs per shape. Collective over
/// `world` (rank 0 measures, everyone receives the result).
/// \throws core::DataError if the fit fails.
Calibration calibrate_cost_model(const core::ModelConfig& model, std::int64_t max_tokens,
                                 const comm::Communicator& world, int repeats = 2);

}  // namespace wlb::train
