// The optimizer step of one rank. See optimizer.hpp.
#include "wlb4d/optim/optimizer.hpp"

#include "wlb4d/core/error.hpp"
#include "wlb4d/optim/adamw.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <string>
#include <utility>

namespace wlb::optim {

Optimizer::Optimizer(const core::OptimConfig& cfg, int total_steps, const grid::ProcessGrid& grid,
                     std::vector<model::ParamRegistry<float>*> chunks)
    : cfg_(cfg), total_steps_(total_steps), grid_(grid), chunks_(std::move(chunks)) {
  for (const auto* c : chunks_) {
    m_.emplace_back("adam_m", c->local_numel());
    v_.emplace_back("adam_v", c->local_numel());
  }
}

void Optimizer::reduce_gradients() {
  if (grid_.dpcp().size() <= 1) return;
  for (auto* c : chunks_) grid_.dpcp().allreduce(c->grads());
}

double Optimizer::global_grad_norm() const {
  double sumsq = 0;
  for (const auto* c : chunks_)
    for (const auto& p : *c)
      if (!p.tp_replicated || grid_.tp_rank() == 0) sumsq += sum_of_squares(p.grad);
  sumsq = grid_.tp().allreduce_value(sumsq);
  sumsq = grid_.pp().allreduce_value(sumsq);
  return std::sqrt(sumsq);
}

void Optimizer::check_finite(std::int64_t step, double loss, double gnorm) const {
  if (std::isfinite(loss) && std::isfinite(gnorm)) return;
  std::string where = !std::isfinite(loss) ? "the loss" : "the global gradient norm";
  for (const auto* c : chunks_)
    for (const auto& p : *c)
      if (!std::isfinite(sum_of_squares(p.grad))) {
        where = "gradient of " + p.name;
        break;
      }
  // Steps counted from 1, as on the progress lines.
  throw core::NumericsError("non-finite value at step " + std::to_string(step + 1) + " in " + where + " (loss " +
                            std::to_string(loss) + ", grad norm " + std::to_string(gnorm) + ")");
}

void Optimizer::apply_adamw(std::int64_t step, double lr, double grad_scale) {
  AdamWStep as;
  as.lr = lr;
  as.beta1 = cfg_.beta1;
  as.beta2 = cfg_.beta2;
  as.eps = cfg_.eps;
  as.grad_scale = grad_scale;
  as.t = long(step + 1);
  for (std::size_t c = 0; c < chunks_.size(); ++c)
    for (const auto& p : *chunks_[c]) {
      as.weight_decay = p.decay ? cfg_.weight_decay : 0.0;
      const auto r = std::make_pair(p.offset, p.offset + std::size_t(p.local_numel()));
      adamw_update(p.value, p.grad, Kokkos::subview(m_[c], r), Kokkos::subview(v_[c], r), as);
    }
}

UpdateResult Optimizer::step(std::int64_t step, double loss) {
  UpdateResult r;
  r.grad_norm = global_grad_norm();
  check_finite(step, loss, r.grad_norm);
  r.lr = lr_at(cfg_, int(step), total_steps_);
  r.clip_factor = clip_factor(r.grad_norm, cfg_.grad_clip);
  apply_adamw(step, r.lr, r.clip_factor);
  return r;
}

}  // namespace wlb::optim
