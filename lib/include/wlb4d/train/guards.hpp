#pragma once
/// \file guards.hpp
/// \brief Guards of a long run: the loss-spike guard (train.skip_spike_z)
/// and the straggler flag (log.straggler_factor). Pure bookkeeping over
/// values every rank already has; the trainer makes the decisions collective.
///
/// Loss-spike guard (llm.c's outlier detector, train_gpt2.cu
/// `skip_update_lossz` / `skip_update_gradz`; Megatron-LM's skip of spiky
/// iterations): the guard keeps the last `window` values of the step loss
/// (mean cross-entropy per token, nats, reduced over the ranks) and of the
/// global gradient L2 norm (before clipping). Once it holds at least
/// `warmup` of them, a step whose
///     z = (x - mean) / std     (population std over the window, oldest first)
/// exceeds `z_max` for the loss or for the grad norm is a spike: its optimizer
/// update is skipped (weights and AdamW moments unchanged; the step counter,
/// the LR schedule and the data stream go on). One-sided: a drop is never a
/// spike. Every step's values enter the window after the judgement, skipped
/// ones included (as llm.c), so a lasting level shift is accepted again once
/// the window has seen it. A window of identical values (std 0) judges nothing.
/// Deterministic: the sums run over the window in a fixed order, so equal
/// inputs (the reduced loss and norm, equal on every rank) give the same
/// decision, and the window restored from a checkpoint decides as the
/// uninterrupted run did.
///
/// Straggler flag: after each step, a rank whose compute time (forward +
/// backward wall seconds, the step line's "compute", io::TimingRecord) exceeds `factor` times
/// the median over its group for `steps` consecutive steps is named. The
/// group of a rank is the ranks of its pipeline stage (same layers on other
/// tokens); when every stage has one rank (dp = cp = tp = 1), the world. In a
/// group of two the median is the mean of the two. Rank 0 only; not an abort.

#include "wlb4d/io/timing_log.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace wlb::train {

/// What the spike guard decided for one step.
struct SpikeDecision {
  bool judged = false;  ///< the window held >= warmup values (else never a spike)
  bool skip = false;    ///< z_loss > z_max or z_grad > z_max
  double z_loss = 0, z_grad = 0;  ///< the step's z-scores (0 when not judged)
};

class SpikeGuard {
 public:
  /// \param z_max train.skip_spike_z (> 0, in standard deviations; 0 means
  ///        the trainer builds no guard)
  /// \param window train.skip_spike_window (>= 2): values kept (steps)
  /// \param warmup train.skip_spike_warmup (2 <= warmup <= window): values
  ///        needed before the first judgement (steps)
  /// Does not throw: the deck rules check the ranges; a window or warmup
  /// below 2 is taken as 2 (a std needs two values).
  SpikeGuard(double z_max, int window, int warmup);

  /// Judges a step's loss (nats per token) and grad norm (L2, before
  /// clipping) against the window, then adds them to it. Call once per step
  /// with the same values on every rank (the reduced ones), so every rank
  /// decides alike.
  SpikeDecision observe(double loss, double grad_norm);

  /// Checkpoint state: the window as (loss, grad norm) pairs, oldest first,
  /// flattened [l0, g0, l1, g1, ...] (2 x size() values).
  std::vector<double> window_pairs() const;
  /// Restores the window from window_pairs() of a checkpoint; a checkpoint
  /// written with a larger window keeps its newest `window` pairs.
  /// \throws std::invalid_argument on an odd length.
  void restore(const std::vector<double>& pairs);
  /// Steps in the window now (<= window).
  std::size_t size() const { return loss_.size(); }

 private:
  double z_max_;
  std::size_t window_, warmup_;
  std::vector<double> loss_, grad_;  // oldest first
};

/// One rank named by the straggler flag.
struct Straggler {
  int rank = 0;
  double ratio = 0;  ///< compute time / group median, this step
  int steps = 0;     ///< consecutive steps above the factor (>= the flag's steps)
};

class StragglerFlag {
 public:
  /// \param factor log.straggler_factor (> 1, dimensionless: compute time / group median)
  /// \param steps log.straggler_steps (>= 1): consecutive slow steps to name a rank
  /// Does not throw (the deck rules check the ranges; steps < 1 is taken as 1).
  StragglerFlag(double factor, int steps);

  /// One step's timing records of every rank, in any order (each record
  /// carries its rank and pipeline stage; io::TimingLog::append gathers them
  /// on rank 0). Returns
  /// the ranks slow for >= `steps` consecutive steps now, by rank; `newly`
  /// (when given) receives those named for the first time in this streak.
  std::vector<Straggler> observe(const std::vector<io::TimingRecord>& all, std::vector<Straggler>* newly = nullptr);

 private:
  double factor_;
  int steps_;
  std::vector<int> streak_;  // per world rank
};

/// " | straggler r3 2.4x (5 steps), r5 1.8x (3 steps)" for the step line ("" when none).
std::string format_stragglers(const std::vector<Straggler>& s);

}  // namespace wlb::train
