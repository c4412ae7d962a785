#pragma once
/// \file adamw.hpp
/// \brief AdamW with fp32 state, global-norm gradient clipping, and the
/// learning-rate schedule (linear warm-up, then cosine decay to min_lr).
///
/// AdamW: Loshchilov & Hutter, "Decoupled Weight Decay Regularization",
/// ICLR 2019, Alg. 2. With bias correction (Kingma & Ba 2015, Alg. 1):
///   m ← β1·m + (1−β1)·g,   v ← β2·v + (1−β2)·g²
///   m̂ = m/(1−β1^t),       v̂ = v/(1−β2^t)
///   θ ← θ − lr·( m̂/(√v̂ + ε) + wd·θ )        (wd = 0 for non-matrix tensors)
/// The gradient g has already been scaled by the clip factor.

#include "wlb4d/core/config.hpp"
#include "wlb4d/core/types.hpp"

namespace wlb::optim {

/// Learning rate at optimizer step `step` (0-based): linear warm-up from
/// lr/warmup to lr over warmup_steps steps, then cosine decay from lr to
/// min_lr, reaching min_lr at step total_steps−1 (and staying there).
/// \param total_steps train.steps
double lr_at(const core::OptimConfig& o, int step, int total_steps);

/// Hyper-parameters of one update (lr already scheduled, wd already chosen
/// per tensor: 0 for norms).
struct AdamWStep {
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0;
  double grad_scale = 1;  ///< multiplies g (the clip factor min(1, max_norm/‖g‖))
  long t = 1;             ///< 1-based step count for bias correction
};

/// In-place AdamW update of one tensor, all Views of equal span (elements).
/// \throws std::invalid_argument if spans differ.
void adamw_update(const Vec& param, const Vec& grad, const Vec& m, const Vec& v, const AdamWStep& s);

/// Σ g² of one tensor (fp64 accumulation). Deterministic: on the host the
/// summation order depends only on the span (4096-element blocks of 16
/// lanes, combined in a fixed tree; under OpenMP also on the thread count);
/// on a device it is Kokkos' reduction over elements.
double sum_of_squares(const Vec& grad);

/// Clip factor for a global gradient norm: min(1, max_norm/(norm+1e-6));
/// max_norm = 0 disables clipping (returns 1).
double clip_factor(double global_norm, double max_norm);

}  // namespace wlb::optim
