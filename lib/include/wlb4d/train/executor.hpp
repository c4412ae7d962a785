#pragma once
/// \file executor.hpp
/// \brief Runs one rank's share of a step: its pipeline action list
/// (pipeline/schedule.hpp) over its model chunks, with the point-to-point
/// messages of pipeline parallelism and the K/V all-gather of context
/// parallelism.
///
/// Per micro-batch i of this DP replica, this rank holds the CP shard of
/// tokens given by balance::shard_tokens (cp = 1: all tokens). Every rank
/// knows every micro-batch's shape from the plan, so messages are sized
/// without extra traffic: an activation or gradient message of micro-batch i
/// is [T_i][d] floats, T_i = tokens of this rank's CP shard. T_i may be 0 (a
/// micro-batch shorter than 2·cp): the rank still runs the micro-batch so it
/// takes part in every layer's K/V exchange, and sends/receives 0 floats.
///
/// pp = 1 with virtual stages > 1: the chunk hand-offs are local (the
/// schedule holds no message for them); the executor passes activations and
/// gradients between its chunks directly.
///
/// Context parallelism (DESIGN §5, WLB-LLM §5): per layer, K and V of the
/// local tokens are all-gathered over the CP group and permuted into the
/// micro-batch's packed order, local queries attend with kv ranges in that
/// order (document-causal), and dK/dV are permuted back and reduce-scattered.

#include "wlb4d/balance/plan.hpp"
#include "wlb4d/core/config.hpp"
#include "wlb4d/grid/process_grid.hpp"
#include "wlb4d/io/timing_log.hpp"
#include "wlb4d/model/transformer.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace wlb::data {
class TokenDataset;
}

namespace wlb::train {

class CpKvExchange;

class Executor {
 public:
  /// Builds this rank's model chunks (virtual stages) with their layers,
  /// initialised from train.seed. \throws core::ConfigError for bad layouts.
  Executor(const core::Config& cfg, const grid::ProcessGrid& grid, std::int64_t vocab);
  ~Executor();

  /// Local model chunks, index = virtual stage.
  std::vector<std::unique_ptr<model::Transformer<float>>>& chunks() { return chunks_; }

  /// Reads and stages this rank's slice of each micro-batch (CP shard per
  /// `sharding`). Reuses device buffers (grow-only).
  void load(const data::TokenDataset& ds, const std::vector<balance::MicroBatch>& mbs,
            const std::vector<balance::Sharding>& sharding);

  /// Runs the loaded micro-batches through the schedule. With backward=false
  /// only forwards run (evaluation) and no gradient changes. Gradients
  /// accumulate into the chunks' registries scaled by grad_scale.
  /// Adds forward/backward/p2p/CP times to rec.
  /// \return Σ CE over this rank's target tokens (last stage; 0 elsewhere).
  double run(bool backward, double grad_scale, io::TimingRecord& rec);

  /// Tokens this rank processed in the loaded micro-batches.
  std::int64_t local_tokens() const { return local_tokens_; }

 private:
  const core::Config& cfg_;
  const grid::ProcessGrid& grid_;
  std::int64_t cap_ = 0;
  int slots_ = 1;
  std::vector<std::unique_ptr<model::Transformer<float>>> chunks_;
  std::shared_ptr<CpKvExchange> kvx_;
  struct Loaded;
  std::unique_ptr<Loaded> loaded_;
  /// Host staging of pipeline messages when model buffers are device memory
  /// (grow-only, so the steady state allocates nothing).
  HostView1<float> pp_host_;
  HostView1<float> staging(std::int64_t n) {
    if (std::int64_t(pp_host_.extent(0)) < n)
      pp_host_ = HostView1<float>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pp_host"), n);
    return Kokkos::subview(pp_host_, std::pair<std::int64_t, std::int64_t>(0, n));
  }
  std::int64_t local_tokens_ = 0;
};

}  // namespace wlb::train
