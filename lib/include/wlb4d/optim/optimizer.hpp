#pragma once
/// \file optimizer.hpp
/// \brief The optimizer step of one rank (DESIGN §2 step 6): gradient
/// reduction over DP×CP, the global gradient norm, the NaN/inf check, clipping
/// and AdamW over this rank's model chunks, with the AdamW moments it owns.
///
/// One entry point per phase, called by the trainer in this order every step:
/// reduce_gradients() (collective over grid.dpcp()), then step() (collective
/// over grid.tp() and grid.pp()). ZeRO-1 ([I]) replaces the inside of both
/// (reduce-scatter, sharded update, all-gather) behind the same calls.
///
/// Global norm: ‖g‖ = sqrt(Σ over every parameter element of g²), each element
/// counted once: tensors replicated over TP (norm weights) only on tp rank 0,
/// stage sums added over PP; DP×CP replicas hold the same reduced gradient and
/// are not summed. The gradients are the sums over micro-batches already
/// scaled by 1 / (target tokens of the step), so ‖g‖ is the norm of the
/// gradient of the token-level mean loss (DESIGN §3).

#include "wlb4d/core/config.hpp"
#include "wlb4d/core/types.hpp"
#include "wlb4d/grid/process_grid.hpp"
#include "wlb4d/model/params.hpp"

#include <cstdint>
#include <vector>

namespace wlb::optim {

/// What one update did (identical on every rank).
struct UpdateResult {
  double grad_norm = 0;    ///< global L2 norm before clipping
  double clip_factor = 1;  ///< min(1, grad_clip / grad_norm); 1 when clipping is off
  double lr = 0;           ///< learning rate used (optim::lr_at)
};

class Optimizer {
 public:
  /// \param chunks this rank's parameter registries (one per local virtual
  ///        stage); they must outlive the Optimizer. Allocates one fp32 m and
  ///        v per chunk, flat like chunk->values() (elements), zero.
  /// \param total_steps train.steps (the LR schedule's length).
  Optimizer(const core::OptimConfig& cfg, int total_steps, const grid::ProcessGrid& grid,
            std::vector<model::ParamRegistry<float>*> chunks);

  /// Sums every chunk's gradients over the DP×CP group (each replica holds
  /// partial sums of its own tokens). Collective over grid.dpcp(); a no-op on
  /// a group of one.
  void reduce_gradients();

  /// Global gradient norm, NaN/inf check, clip and AdamW of optimizer step
  /// `step` (0-based; bias correction uses step + 1). Collective over
  /// grid.tp() and grid.pp().
  /// \param loss the step's token-level loss (already reduced): checked for
  ///        NaN/inf together with the norm.
  /// \throws core::NumericsError naming the step (step + 1: counted from 1,
  ///         as on the progress lines) and, where a gradient is
  ///         non-finite, the first such tensor on this rank ("gradient of
  ///         layers.0.attn.wq"), else "the loss" or "the global gradient norm".
  UpdateResult step(std::int64_t step, double loss);

  /// Global L2 norm of the current gradients (collective over tp and pp).
  double global_grad_norm() const;

  /// AdamW first and second moments, one flat fp32 View per chunk (the
  /// checkpoint stores them at global shape).
  const std::vector<Vec>& exp_avg() const { return m_; }
  const std::vector<Vec>& exp_avg_sq() const { return v_; }

 private:
  void check_finite(std::int64_t step, double loss, double gnorm) const;
  void apply_adamw(std::int64_t step, double lr, double grad_scale);

  core::OptimConfig cfg_;
  int total_steps_ = 0;
  const grid::ProcessGrid& grid_;
  std::vector<model::ParamRegistry<float>*> chunks_;
  std::vector<Vec> m_, v_;
};

}  // namespace wlb::optim
