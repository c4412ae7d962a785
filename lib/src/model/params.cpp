// Parameter registry and layout-independent initialisation (params.hpp).
#include "wlb4d/model/params.hpp"

#include "wlb4d/core/hash.hpp"
#include "wlb4d/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace wlb::model {

namespace {

using core::fnv1a;
using core::splitmix64;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void cfg_rule(bool ok, const std::string& msg) {
  if (!ok) throw core::ConfigError(msg);
}

}  // namespace

std::pair<std::int64_t, std::int64_t> split_range(std::int64_t n, int parts, int rank) {
  if (parts < 1 || rank < 0 || rank >= parts)
    throw std::invalid_argument("wlb::model::split_range: rank " + std::to_string(rank) + " of " +
                                std::to_string(parts) + " parts is out of range");
  const std::int64_t base = n / parts, rem = n % parts;
  const std::int64_t off = rank * base + std::min<std::int64_t>(rank, rem);
  return {off, base + (rank < rem ? 1 : 0)};
}

void validate_shard(const core::ModelConfig& cfg, std::int64_t vocab, const ModelShard& s) {
  const std::string tp = "parallel.tp=" + std::to_string(s.tp_size);
  cfg_rule(cfg.layers >= 1, "model.layers=" + std::to_string(cfg.layers) + " must be >= 1");
  cfg_rule(cfg.heads >= 1 && cfg.d_model % cfg.heads == 0,
           "model.heads=" + std::to_string(cfg.heads) + " must divide model.d_model=" + std::to_string(cfg.d_model));
  cfg_rule(cfg.head_dim() % 2 == 0, "head_dim = model.d_model/model.heads = " + std::to_string(cfg.head_dim()) +
                                        " must be even (RoPE rotates pairs)");
  cfg_rule(cfg.kv_heads >= 1 && cfg.heads % cfg.kv_heads == 0,
           "model.kv_heads=" + std::to_string(cfg.kv_heads) + " must divide model.heads=" + std::to_string(cfg.heads));
  cfg_rule(s.tp_size >= 1 && s.tp_rank >= 0 && s.tp_rank < s.tp_size,
           "tp rank " + std::to_string(s.tp_rank) + " is outside " + tp);
  cfg_rule(cfg.heads % s.tp_size == 0, tp + " must divide model.heads=" + std::to_string(cfg.heads));
  cfg_rule(cfg.kv_heads % s.tp_size == 0, tp + " must divide model.kv_heads=" + std::to_string(cfg.kv_heads));
  cfg_rule(vocab >= s.tp_size, "vocab_size=" + std::to_string(vocab) + " must be >= " + tp);
  cfg_rule(cfg.ffn_hidden >= s.tp_size, "model.ffn_hidden=" + std::to_string(cfg.ffn_hidden) + " must be >= " + tp);
  const int le = s.layer_end < 0 ? cfg.layers : s.layer_end;
  cfg_rule(s.layer_begin >= 0 && s.layer_begin < le && le <= cfg.layers,
           "pipeline stage layers [" + std::to_string(s.layer_begin) + ", " + std::to_string(le) +
               ") must be a non-empty range within model.layers=" + std::to_string(cfg.layers));
}

double init_normal(std::uint64_t seed, const std::string& name, std::uint64_t index) {
  const std::uint64_t key = splitmix64(seed ^ splitmix64(fnv1a(name)));
  const double two53 = 9007199254740992.0;
  const double u1 = (double(splitmix64(key + 2 * index) >> 11) + 0.5) / two53;
  const double u2 = double(splitmix64(key + 2 * index + 1) >> 11) / two53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// ---- Param ---------------------------------------------------------------------------

template <class Scalar>
std::int64_t Param<Scalar>::local_numel() const {
  std::int64_t n = 1;
  for (auto e : local_shape) n *= e;
  return n;
}

template <class Scalar>
std::int64_t Param<Scalar>::global_numel() const {
  std::int64_t n = 1;
  for (auto e : global_shape) n *= e;
  return n;
}

template <class Scalar>
View2<Scalar> Param<Scalar>::value2() const {
  const std::int64_t r = local_shape.size() == 2 ? local_shape[0] : 1;
  return View2<Scalar>(value.data(), r, local_shape.back());
}

template <class Scalar>
View2<Scalar> Param<Scalar>::grad2() const {
  const std::int64_t r = local_shape.size() == 2 ? local_shape[0] : 1;
  return View2<Scalar>(grad.data(), r, local_shape.back());
}

template <class Scalar>
std::int64_t Param<Scalar>::global_index(std::int64_t i) const {
  if (local_shape.size() == 1) return i + (shard_dim == 0 ? shard_offset : 0);
  const std::int64_t lc = local_shape[1];
  std::int64_t r = i / lc, c = i % lc;
  if (shard_dim == 0) r += shard_offset;
  if (shard_dim == 1) c += shard_offset;
  return r * global_shape[1] + c;
}

// ---- ParamRegistry -------------------------------------------------------------------------

template <class Scalar>
ParamRegistry<Scalar>::ParamRegistry(const core::ModelConfig& cfg, std::int64_t vocab, const ModelShard& shard)
    : cfg_(cfg), vocab_(vocab), shard_(shard) {
  validate_shard(cfg, vocab, shard);
  if (shard_.layer_end < 0) shard_.layer_end = cfg.layers;
  const int p = shard.tp_size, r = shard.tp_rank;
  // Every sharded dimension splits by split_range: for heads this is the
  // whole-head split (validate_shard: tp divides heads and kv_heads).
  for (auto& s : param_shapes(cfg, vocab)) {
    const bool tied_head = cfg.tie_embeddings && shard.head && s.name == "embed.weight";
    const bool mine = s.layer >= 0 ? (s.layer >= shard_.layer_begin && s.layer < shard_.layer_end)
                                   : (s.name == "embed.weight" ? shard.embedding || tied_head : shard.head);
    if (!mine) continue;
    Param<Scalar> P;
    P.name = std::move(s.name);
    P.global_shape = s.global_shape;
    P.local_shape = s.global_shape;
    P.shard_dim = s.shard_dim;
    if (s.shard_dim >= 0) {
      const auto range = split_range(s.global_shape[std::size_t(s.shard_dim)], p, r);
      P.shard_offset = range.first;
      P.local_shape[std::size_t(s.shard_dim)] = range.second;
    }
    P.decay = P.global_shape.size() == 2;
    P.tp_replicated = s.shard_dim < 0;
    P.tied_replica = tied_head && !shard.embedding;
    params_.push_back(std::move(P));
  }
  std::size_t total = 0;
  for (auto& P : params_) {
    P.offset = total;
    total += std::size_t(P.local_numel());
  }
  values_ = View1<Scalar>("wlb::model::param_values", total);
  grads_ = View1<Scalar>("wlb::model::param_grads", total);
  for (auto& P : params_) {
    P.value = View1<Scalar>(values_.data() + P.offset, P.local_numel());
    P.grad = View1<Scalar>(grads_.data() + P.offset, P.local_numel());
  }
}

template <class Scalar>
const Param<Scalar>* ParamRegistry<Scalar>::find(const std::string& name) const {
  for (const auto& P : params_)
    if (P.name == name) return &P;
  return nullptr;
}

template <class Scalar>
Param<Scalar>* ParamRegistry<Scalar>::find(const std::string& name) {
  for (auto& P : params_)
    if (P.name == name) return &P;
  return nullptr;
}

template <class Scalar>
const Param<Scalar>& ParamRegistry<Scalar>::at(const std::string& name) const {
  const auto* p = find(name);
  if (!p) throw std::out_of_range("wlb::model::ParamRegistry: this rank holds no parameter '" + name + "'");
  return *p;
}

template <class Scalar>
Param<Scalar>& ParamRegistry<Scalar>::at(const std::string& name) {
  auto* p = find(name);
  if (!p) throw std::out_of_range("wlb::model::ParamRegistry: this rank holds no parameter '" + name + "'");
  return *p;
}

template <class Scalar>
void ParamRegistry<Scalar>::zero_grad() const {
  Kokkos::deep_copy(grads_, Scalar(0));
}

template <class Scalar>
void ParamRegistry<Scalar>::init_parameters(std::uint64_t seed) {
  auto host = Kokkos::create_mirror_view(values_);
  const double resid_scale = 1.0 / std::sqrt(2.0 * cfg_.layers);
  for (const auto& P : params_) {
    const std::int64_t n = P.local_numel();
    if (P.global_shape.size() == 1) {  // norm weights
      for (std::int64_t i = 0; i < n; ++i) host(P.offset + i) = Scalar(1);
      continue;
    }
    const bool resid = ends_with(P.name, ".attn.wo") || ends_with(P.name, ".mlp.w_down");
    const double std_dev = cfg_.init_std * (resid ? resid_scale : 1.0);
    for (std::int64_t i = 0; i < n; ++i)
      host(P.offset + i) = Scalar(std_dev * init_normal(seed, P.name, std::uint64_t(P.global_index(i))));
  }
  Kokkos::deep_copy(values_, host);
}

template struct Param<float>;
template struct Param<double>;
template class ParamRegistry<float>;
template class ParamRegistry<double>;

}  // namespace wlb::model
