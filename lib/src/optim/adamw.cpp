#include "wlb4d/optim/adamw.hpp"

#include "wlb4d/core/kokkos_compat.hpp"

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

namespace wlb::optim {

double lr_at(const core::OptimConfig& o, int step, int total_steps) {
  if (o.warmup_steps > 0 && step < o.warmup_steps) return o.lr * double(step + 1) / double(o.warmup_steps);
  const int decay_steps = total_steps - 1 - o.warmup_steps;
  if (decay_steps <= 0) return o.lr;
  double progress = double(step - o.warmup_steps) / double(decay_steps);
  if (progress > 1) progress = 1;
  const double pi = 3.14159265358979323846;
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(pi * progress));
}

void adamw_update(const Vec& param, const Vec& grad, const Vec& m, const Vec& v, const AdamWStep& s) {
  if (grad.span() != param.span() || m.span() != param.span() || v.span() != param.span())
    throw std::invalid_argument("adamw_update: parameter, gradient and moment sizes differ");
  const float b1 = float(s.beta1), b2 = float(s.beta2), eps = float(s.eps);
  // Bias corrections folded into the step size, computed in fp64 on the host.
  const double bc1 = 1.0 - std::pow(s.beta1, double(s.t));
  const double bc2 = 1.0 - std::pow(s.beta2, double(s.t));
  const float step_size = float(s.lr / bc1);
  const float inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  const float decay = float(s.lr * s.weight_decay);
  const float gs = float(s.grad_scale);
  Kokkos::parallel_for(
      "wlb::optim::adamw", Kokkos::RangePolicy<ExecSpace>(0, param.span()), KOKKOS_LAMBDA(const int i) {
        const float g = grad(i) * gs;
        const float mi = b1 * m(i) + (1.0f - b1) * g;
        const float vi = b2 * v(i) + (1.0f - b2) * g * g;
        m(i) = mi;
        v(i) = vi;
        const float denom = wlb::kmath::sqrt(vi) * inv_sqrt_bc2 + eps;
        param(i) = param(i) - decay * param(i) - step_size * mi / denom;
      });
}

double sum_of_squares(const Vec& grad) {
  const std::int64_t n = static_cast<std::int64_t>(grad.span());
  double s = 0;
  if constexpr (std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace>) {
    // Host (the grad-norm reduction): one fp64 accumulator is a chain of dependent adds
    // (4 cycles each), ~10x below the memory bound. Blocks of kBlock elements,
    // each summed in kLanes independent accumulators (SIMD) combined by a
    // fixed tree, then blocks combined by the reduction: the order depends
    // only on n (and the thread count under OpenMP), so it is deterministic.
    constexpr std::int64_t kBlock = 4096, kLanes = 16;
    const std::int64_t blocks = (n + kBlock - 1) / kBlock;
    const float* g = grad.data();
    Kokkos::parallel_reduce(
        "wlb::optim::sumsq", Kokkos::RangePolicy<ExecSpace>(0, blocks),
        KOKKOS_LAMBDA(const std::int64_t b, double& acc) {
          const std::int64_t lo = b * kBlock, hi = lo + kBlock < n ? lo + kBlock : n;
          double lane[kLanes] = {};
          std::int64_t i = lo;
          for (; i + kLanes <= hi; i += kLanes)
            for (std::int64_t j = 0; j < kLanes; ++j) lane[j] += double(g[i + j]) * double(g[i + j]);
          for (std::int64_t j = 0; i < hi; ++i, ++j) lane[j] += double(g[i]) * double(g[i]);
          for (std::int64_t w = kLanes / 2; w > 0; w /= 2)
            for (std::int64_t j = 0; j < w; ++j) lane[j] += lane[j + w];
          acc += lane[0];
        },
        s);
  } else {
    Kokkos::parallel_reduce(
        "wlb::optim::sumsq", Kokkos::RangePolicy<ExecSpace>(0, n),
        KOKKOS_LAMBDA(const std::int64_t i, double& acc) { acc += double(grad(i)) * double(grad(i)); }, s);
  }
  return s;
}

double clip_factor(double global_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  double f = max_norm / (global_norm + 1e-6);
  return f < 1.0 ? f : 1.0;
}

}  // namespace wlb::optim
