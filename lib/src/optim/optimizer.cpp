// The optimizer step of one rank. See optimizer.hpp.
#include "wlb4d/optim/optimizer.hpp"

#include "wlb4d/core/bf16.hpp"
#include "wlb4d/core/clock.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/optim/adamw.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>
#include <utility>

namespace wlb::optim {

// Kernels in free functions of a named namespace (nvcc: an extended lambda
// needs an enclosing function with external linkage, not a private member).
namespace grad_bf16_detail {
void round_to_bits(const float* g, std::int64_t n, std::uint16_t* b) {
  Kokkos::parallel_for(
      "wlb::optim::grad_to_bf16", Kokkos::RangePolicy<ExecSpace>(0, n),
      KOKKOS_LAMBDA(const std::int64_t i) { b[i] = core::float_to_bf16(g[i]); });
}
void widen_bits(const std::uint16_t* b, std::int64_t n, float* g) {
  Kokkos::parallel_for(
      "wlb::optim::grad_from_bf16", Kokkos::RangePolicy<ExecSpace>(0, n),
      KOKKOS_LAMBDA(const std::int64_t i) { g[i] = core::bf16_to_float(b[i]); });
}
}  // namespace grad_bf16_detail

namespace {
constexpr bool kHostReadsMemSpace = Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible;
using grad_bf16_detail::round_to_bits;
using grad_bf16_detail::widen_bits;
}  // namespace

Optimizer::Optimizer(const core::OptimConfig& cfg, int total_steps, const grid::ProcessGrid& grid,
                     std::vector<model::ParamRegistry<float>*> chunks, int zero, double bucket_mib, bool bf16_reduce)
    : bf16_reduce_(bf16_reduce), cfg_(cfg), total_steps_(total_steps), grid_(grid), chunks_(std::move(chunks)),
      zero_(zero) {
  if (zero != 0 && zero != 1)
    throw core::ConfigError("parallel.zero=" + std::to_string(zero) + " must be 0 or 1");
  if (bf16_reduce && zero != 0)
    throw core::ConfigError("comm.grad_reduce_dtype=bf16 needs parallel.zero=0 (got parallel.zero=" +
                            std::to_string(zero) + "): ZeRO-1's reduce-scatter has no bf16 variant");
  if (bf16_reduce && grid_.dpcp().size() > 1) {
    std::int64_t n = 0;
    for (const auto* c : chunks_) n = std::max(n, c->local_numel());
    red16_ = View1<std::uint16_t>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "optim::grad_bf16"), n);
    if (!kHostReadsMemSpace)
      red16_h_ = HostView1<std::uint16_t>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "optim::grad_bf16_host"), n);
    bucket_mib = 0;  // one reduction after the backward
  }
  if (!(bucket_mib >= 0))
    throw core::ConfigError("comm.bucket_mib=" + std::to_string(bucket_mib) + " must be >= 0");
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
    if (zero == 1 && G > 1) grad_shard_.emplace_back(Kokkos::view_alloc(Kokkos::WithoutInitializing, "optim::grad_shard"), n);
    shards_.push_back(std::move(sh));
  }
  // Tied embeddings across stages: the ranks holding embed.weight (pp rank 0,
  // and P-1 as the head) form the embedding group. Collective over pp.
  if (!chunks_.empty() && chunks_[0]->config().tie_embeddings && grid_.pp().size() > 1) {
    for (std::size_t c = 0; c < chunks_.size(); ++c)
      if (const auto* p = chunks_[c]->find("embed.weight")) tied_ = p, tied_chunk_ = c;
    embed_group_ = grid_.pp().split(tied_ ? 0 : comm::Communicator::kNoColor, grid_.pp().rank());
  }
  // Buckets: whole tensors in reverse registry order, each closed once it
  // holds at least bucket_mib MiB (the last one may be smaller).
  const auto cap = std::int64_t(std::ceil(bucket_mib * 1024.0 * 1024.0 / double(sizeof(float))));
  buckets_.resize(chunks_.size());
  next_bucket_.assign(chunks_.size(), 0);
  if (bucket_mib > 0 && grid_.dpcp().size() > 1)
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      const std::int64_t N = chunks_[c]->local_numel();
      std::int64_t end = N;
      std::vector<std::int64_t> starts;  // param offsets, descending
      for (const auto& p : *chunks_[c]) starts.push_back(std::int64_t(p.offset));
      std::reverse(starts.begin(), starts.end());
      for (std::size_t i = 0; i < starts.size(); ++i) {
        const std::int64_t b = starts[i];
        if (end - b < cap && i + 1 < starts.size()) continue;
        if (end > b) buckets_[c].push_back({b, end, {}});
        end = b;
      }
      if (end > 0) buckets_[c].push_back({0, end, {}});  // elements before the first tensor (none today)
      if (zero_ == 1)
        for (auto& bk : buckets_[c]) {
          const auto& sh = shards_[c];
          for (std::size_t r = 0; r < sh.counts.size(); ++r) {
            const std::int64_t lo = std::max<std::int64_t>(bk.begin, sh.displs[r]);
            const std::int64_t hi = std::min<std::int64_t>(bk.end, std::int64_t(sh.displs[r]) + sh.counts[r]);
            bk.counts.push_back(int(std::max<std::int64_t>(0, hi - lo)));
          }
        }
    }
}

std::vector<std::pair<std::int64_t, std::int64_t>> Optimizer::buckets(std::size_t c) const {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (const auto& b : buckets_.at(c)) out.emplace_back(b.begin, b.end);
  return out;
}

void Optimizer::start_bucket(std::size_t c, std::size_t k) {
  const auto& bk = buckets_[c][k];
  float* g = chunks_[c]->grads().data();
  Kokkos::fence();  // the backward kernels wrote the bucket
  if (zero_ == 0) {
    inflight_.push_back(grid_.dpcp().iallreduce_device(g + bk.begin, std::size_t(bk.end - bk.begin)));
  } else {  // this rank's part of the bucket, [max(begin, owned begin), ...), lands in grad_shard_
    const auto& sh = shards_[c];
    const std::int64_t mine = std::clamp(bk.begin, sh.begin, sh.end);
    inflight_.push_back(
        grid_.dpcp().ireduce_scatterv_device(g + bk.begin, grad_shard_[c].data() + (mine - sh.begin), bk.counts));
  }
}

void Optimizer::grads_ready(std::size_t c, std::int64_t from) {
  if (c >= buckets_.size()) return;
  auto& k = next_bucket_[c];
  // A bucket holding the tied embedding waits for sum_tied_embedding_grads().
  const auto tied_end =
      tied_ && !tied_summed_ && c == tied_chunk_ ? std::int64_t(tied_->offset) + tied_->local_numel() : -1;
  while (k < buckets_[c].size() && buckets_[c][k].begin >= from && !(buckets_[c][k].begin < tied_end))
    start_bucket(c, k++);
  progress();
}

void Optimizer::progress() {
  for (auto& r : inflight_) r.test();
}

void Optimizer::take_reduced_shards() {
  if (zero_ != 1 || grid_.dpcp().size() <= 1) return;
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    const auto& sh = shards_[c];
    Kokkos::deep_copy(Kokkos::subview(chunks_[c]->grads(), std::make_pair(std::size_t(sh.begin), std::size_t(sh.end))),
                      grad_shard_[c]);
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

void Optimizer::sum_tied_embedding_grads() {
  if (!embed_group_) return;
  Kokkos::fence();
  embed_group_->allreduce(tied_->grad);
  tied_summed_ = true;
}

void Optimizer::reduce_gradients() {
  dp_in_flight_s_ = dp_exposed_s_ = 0;
  sum_tied_embedding_grads();  // before the DP reduction: it is linear, so the order is free
  if (grid_.dpcp().size() <= 1) {
    tied_summed_ = false;
    return;
  }
  bool bucketed = false;
  for (const auto& b : buckets_) bucketed |= !b.empty();
  if (bucketed) {
    for (std::size_t c = 0; c < chunks_.size(); ++c) grads_ready(c, 0);
    for (auto& r : inflight_) r.wait();
    // In flight: the union of [started, completed] over the buckets.
    std::vector<std::pair<double, double>> iv;
    for (const auto& r : inflight_) {
      iv.emplace_back(r.started(), r.completed());
      dp_exposed_s_ += r.waited();
    }
    std::sort(iv.begin(), iv.end());
    double lo = 0, hi = -1;
    for (const auto& [a, b] : iv) {
      if (a > hi) {
        if (hi > lo) dp_in_flight_s_ += hi - lo;
        lo = a;
        hi = b;
      } else {
        hi = std::max(hi, b);
      }
    }
    if (hi > lo) dp_in_flight_s_ += hi - lo;
    inflight_.clear();
    std::fill(next_bucket_.begin(), next_bucket_.end(), std::size_t(0));
    tied_summed_ = false;
    take_reduced_shards();
    return;
  }
  Kokkos::fence();
  const double t0 = core::wall_seconds();
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    const auto& g = chunks_[c]->grads();
    if (bf16_reduce_) {
      const std::int64_t n = std::int64_t(g.extent(0));
      round_to_bits(g.data(), n, red16_.data());
      Kokkos::fence();
      if (kHostReadsMemSpace) {
        grid_.dpcp().allreduce_bf16_sum(red16_.data(), std::size_t(n));
      } else {  // device build without a bf16 NCCL path here: through the host copy
        const auto d = Kokkos::subview(red16_, std::make_pair(std::int64_t(0), n));
        const auto h = Kokkos::subview(red16_h_, std::make_pair(std::int64_t(0), n));
        Kokkos::deep_copy(h, d);
        grid_.dpcp().allreduce_bf16_sum(h.data(), std::size_t(n));
        Kokkos::deep_copy(d, h);
      }
      widen_bits(red16_.data(), n, g.data());
      continue;
    }
    if (zero_ == 0) {
      grid_.dpcp().allreduce(g);
    } else {
      grid_.dpcp().reduce_scatterv_device(g.data(), grad_shard_[c].data(), shards_[c].counts);
    }
  }
  tied_summed_ = false;
  take_reduced_shards();
  Kokkos::fence();
  dp_in_flight_s_ = dp_exposed_s_ = core::wall_seconds() - t0;
}

double Optimizer::global_grad_norm() const {
  double sumsq = 0;
  for (std::size_t c = 0; c < chunks_.size(); ++c)
    for_each_owned(c, [&](const model::Param<float>& p, std::int64_t lo, std::int64_t hi) {
      if (p.tp_replicated && grid_.tp_rank() != 0) return;
      if (p.tied_replica) return;  // the first stage counts embed.weight
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

UpdateResult Optimizer::step(std::int64_t step, double loss, const std::function<bool(const UpdateResult&)>& skip) {
  UpdateResult r;
  r.grad_norm = global_grad_norm();
  check_finite(step, loss, r.grad_norm);
  r.lr = lr_at(cfg_, int(step), total_steps_);
  r.clip_factor = clip_factor(r.grad_norm, cfg_.grad_clip);
  if (skip && skip(r)) {
    r.skipped = true;
    return r;
  }
  apply_adamw(step, r.lr, r.clip_factor);
  allgather_parameters();
  return r;
}

}  // namespace wlb::optim
