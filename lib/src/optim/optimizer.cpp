// The optimizer step of one rank. See optimizer.hpp.
#include "wlb4d/optim/optimizer.hpp"

#include "wlb4d/core/error.hpp"
#include "wlb4d/optim/adamw.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>
#include <utility>

namespace wlb::optim {

Optimizer::Optimizer(const core::OptimConfig& cfg, int total_steps, const grid::ProcessGrid& grid,
                     std::vector<model::ParamRegistry<float>*> chunks, int zero)
    : cfg_(cfg), total_steps_(total_steps), grid_(grid), chunks_(std::move(chunks)), zero_(zero) {
  if (zero != 0 && zero != 1)
    throw core::ConfigError("parallel.zero=" + std::to_string(zero) + " must be 0 or 1");
  const int G = zero_ == 1 ? grid_.dpcp().size() : 1;
  const int g = zero_ == 1 ? grid_.dpcp().rank() : 0;
  for (const auto* c : chunks_) {
    if (G > 1 && c->local_numel() > std::int64_t(INT_MAX))  // MPI counts and displacements are int
      throw core::ConfigError("parallel.zero=1: a model chunk of " + std::to_string(c->local_numel()) +
                              " parameters on this rank exceeds the 2^31-1 elements one collective can address; "
                              "use more pipeline stages (parallel.pp) or tensor-parallel ranks (parallel.tp)");
    Shard sh;
    for (int r = 0; r < G; ++r) {
      const auto [off, n] = model::split_range(c->local_numel(), G, r);
      sh.counts.push_back(int(n));
      sh.displs.push_back(int(off));
      if (r == g) sh.begin = off, sh.end = off + n;
    }
    const auto n = std::size_t(sh.end - sh.begin);
    m_.emplace_back("adam_m", n);
    v_.emplace_back("adam_v", n);
    shards_.push_back(std::move(sh));
  }
}

template <class F> void Optimizer::for_each_owned(std::size_t c, F&& f) const {
  const auto& sh = shards_[c];
  for (const auto& p : *chunks_[c]) {
    const auto p0 = std::int64_t(p.offset), p1 = p0 + p.local_numel();
    const auto lo = std::max(p0, sh.begin), hi = std::min(p1, sh.end);
    if (lo < hi) f(p, lo, hi);
  }
}

void Optimizer::reduce_gradients() {
  if (grid_.dpcp().size() <= 1) return;
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    const auto& g = chunks_[c]->grads();
    if (zero_ == 0) {
      grid_.dpcp().allreduce(g);
    } else {  // in place: the owned range receives the sum
      grid_.dpcp().reduce_scatterv_device(g.data(), g.data() + shards_[c].begin, shards_[c].counts);
    }
  }
}

double Optimizer::global_grad_norm() const {
  double sumsq = 0;
  for (std::size_t c = 0; c < chunks_.size(); ++c)
    for_each_owned(c, [&](const model::Param<float>& p, std::int64_t lo, std::int64_t hi) {
      if (p.tp_replicated && grid_.tp_rank() != 0) return;
      const auto& all = chunks_[c]->grads();
      sumsq += sum_of_squares(Kokkos::subview(all, std::make_pair(std::size_t(lo), std::size_t(hi))));
    });
  if (zero_ == 1) sumsq = grid_.dpcp().allreduce_value(sumsq);
  sumsq = grid_.tp().allreduce_value(sumsq);
  sumsq = grid_.pp().allreduce_value(sumsq);
  return std::sqrt(sumsq);
}

void Optimizer::check_finite(std::int64_t step, double loss, double gnorm) const {
  if (std::isfinite(loss) && std::isfinite(gnorm)) return;
  std::string where = !std::isfinite(loss) ? "the loss" : "the global gradient norm";
  bool found = false;
  for (std::size_t c = 0; c < chunks_.size() && !found; ++c)
    for_each_owned(c, [&](const model::Param<float>& p, std::int64_t lo, std::int64_t hi) {
      const auto& all = chunks_[c]->grads();
      if (found || std::isfinite(sum_of_squares(Kokkos::subview(all, std::make_pair(std::size_t(lo), std::size_t(hi))))))
        return;
      where = "gradient of " + p.name;
      found = true;
    });
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
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    const auto& values = chunks_[c]->values();
    const auto& grads = chunks_[c]->grads();
    const auto b = shards_[c].begin;
    for_each_owned(c, [&](const model::Param<float>& p, std::int64_t lo, std::int64_t hi) {
      as.weight_decay = p.decay ? cfg_.weight_decay : 0.0;
      const auto r = std::make_pair(std::size_t(lo), std::size_t(hi));
      const auto rs = std::make_pair(std::size_t(lo - b), std::size_t(hi - b));
      adamw_update(Kokkos::subview(values, r), Kokkos::subview(grads, r), Kokkos::subview(m_[c], rs),
                   Kokkos::subview(v_[c], rs), as);
    });
  }
}

void Optimizer::allgather_parameters() const {
  if (zero_ == 0 || grid_.dpcp().size() <= 1) return;
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    const auto& sh = shards_[c];
    float* buf = chunks_[c]->values().data();
    Kokkos::fence();  // the AdamW kernels wrote the owned range
    grid_.dpcp().allgatherv_device(buf + sh.begin, std::size_t(sh.end - sh.begin), buf, sh.counts, sh.displs);
  }
}

UpdateResult Optimizer::step(std::int64_t step, double loss) {
  UpdateResult r;
  r.grad_norm = global_grad_norm();
  check_finite(step, loss, r.grad_norm);
  r.lr = lr_at(cfg_, int(step), total_steps_);
  r.clip_factor = clip_factor(r.grad_norm, cfg_.grad_clip);
  apply_adamw(step, r.lr, r.clip_factor);
  allgather_parameters();
  return r;
}

}  // namespace wlb::optim
