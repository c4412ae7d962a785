#pragma once
/// \file trainer.hpp
/// \brief The training loop (DESIGN §2): plan → local batch → pipeline of
/// forward/backward → gradient reduction over DP×CP → clip → AdamW → records.
///
/// One Trainer per rank; every rank of the grid constructs it with the same
/// deck. Each step, every rank computes the same StepPlan (balance), takes its
/// DP replica's micro-batches and its CP shard of each, and runs its pipeline
/// stage. Loss = Σ CE over all target tokens of the step / their count
/// (DESIGN §3), so it does not depend on how tokens are spread over ranks.

#include "wlb4d/balance/cost_model.hpp"
#include "wlb4d/balance/packer.hpp"
#include "wlb4d/core/config.hpp"
#include "wlb4d/grid/process_grid.hpp"
#include "wlb4d/io/timing_log.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace wlb::train {

/// What one optimizer step produced (identical on every rank).
struct StepResult {
  std::int64_t step = 0;
  double loss = 0;            ///< token-level mean CE of the step (nats)
  double grad_norm = 0;       ///< global L2 norm before clipping
  double lr = 0;
  std::int64_t tokens = 0;    ///< tokens of the whole step
  std::int64_t target_tokens = 0;
  double seconds = 0;         ///< wall time of the step (max over ranks)
  double model_flops = 0;     ///< FLOP of the step (model::model_flops)
  double val_loss = -1;       ///< validation loss when evaluated this step
  /// Consumed samples: documents drawn from the training stream so far, all
  /// starts together (epoch x documents per epoch + position, from the
  /// checkpointed stream state). With packing a sample is a document, not a
  /// fixed-length sequence: a document waiting in a wlb outlier queue counts
  /// from the step that drew it; one cut across micro-batches counts once.
  std::int64_t samples = 0;
  bool skipped = false;       ///< the loss-spike guard skipped this step's update (train.skip_spike_z)
  double z_loss = 0, z_grad = 0;  ///< the guard's z-scores of the loss and grad norm (0: not judged)
  std::int64_t skipped_steps = 0;  ///< updates skipped so far by the loss-spike guard (all starts)
  /// data.train blending n > 1 sources: the step's tokens per source (from
  /// its plan) and the tokens drawn from each so far; empty otherwise.
  std::vector<std::int64_t> source_tokens, source_drawn;
  io::TimingRecord record;    ///< this rank's timing record
};

class Trainer {
 public:
  /// Opens the datasets, builds the model shard of this rank, the optimizer
  /// state and the packer. \throws core::ConfigError, core::DataError.
  Trainer(const core::Config& cfg, const grid::ProcessGrid& grid);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Runs one optimizer step (collective over the grid).
  /// \throws core::NumericsError if the loss or a gradient is NaN/inf,
  ///         naming the step and the tensor.
  StepResult step();

  /// Runs steps until train.steps, printing one line per print_every steps
  /// on rank 0 and appending timing records. Returns the last result.
  StepResult run();

  /// Validation loss (token-level mean CE) over the first eval_tokens tokens
  /// of the validation set, packed by the fixed packer. Collective.
  /// \throws core::ConfigError if data.val is empty.
  double evaluate();

  std::int64_t current_step() const;
  /// Gathers the full (global-shape) value of a parameter onto every rank —
  /// for tests comparing layouts. Collective over the world.
  std::vector<float> gather_parameter(const std::string& name) const;
  /// Names of every parameter of the model (all stages), in a fixed order.
  std::vector<std::string> parameter_names() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wlb::train
