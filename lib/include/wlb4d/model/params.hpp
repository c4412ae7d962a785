#pragma once
/// \file params.hpp
/// \brief The parameter registry: every trainable tensor of the model with its
/// global shape, this rank's shard, its value and gradient storage, and the
/// flags the optimizer, the gradient reduction and the checkpoint need.
///
/// Names and global shapes (V vocab, d d_model, D head_dim = d/heads,
/// Hq heads, Hkv kv_heads, F ffn_hidden; matrices row-major [out][in] as
/// torch.nn.Linear, y = x·Wᵀ):
///
///   embed.weight                 [V][d]        shard dim 0 (vocab rows)   decay
///   layers.L.attn_norm.weight    [d]           replicated over TP
///   layers.L.attn.wq             [Hq·D][d]     shard dim 0 (column-par.)  decay
///   layers.L.attn.wk             [Hkv·D][d]    shard dim 0 (column-par.)  decay
///   layers.L.attn.wv             [Hkv·D][d]    shard dim 0 (column-par.)  decay
///   layers.L.attn.wo             [d][Hq·D]     shard dim 1 (row-par.)     decay
///   layers.L.mlp_norm.weight     [d]           replicated over TP
///   layers.L.mlp.w_gate          [F][d]        shard dim 0 (column-par.)  decay
///   layers.L.mlp.w_up            [F][d]        shard dim 0 (column-par.)  decay
///   layers.L.mlp.w_down          [d][F]        shard dim 1 (row-par.)     decay
///   final_norm.weight            [d]           replicated over TP
///   lm_head.weight               [V][d]        shard dim 0 (vocab rows)   decay
///
/// Order: exactly the order above, layer by layer. It is the same for every
/// layout; a pipeline stage holds a contiguous subsequence of it.
///
/// TP split of a dimension of size n over p ranks (split_range): rank r gets
/// n/p + (r < n%p) elements starting at r·(n/p) + min(r, n%p), so uneven
/// shards are legal (vocab 97 on tp=2: 49 + 48). Heads split whole: rank r
/// holds query heads [r·Hq/p, (r+1)·Hq/p) and kv heads [r·Hkv/p, ...); this
/// needs p | Hq and p | Hkv. F may split unevenly (the deck needs F >= p,
/// core::validate; layout equivalence tests cover F = 47 on tp = 2, 50 on 4).
///
/// Storage: all values of this rank live in one contiguous View1 (values()),
/// all gradients in another (grads()), in registry order; each Param's
/// value/grad Views are unmanaged windows into them (local row-major), so a
/// gradient all-reduce can send one buffer and the optimizer can walk tensors.
///
/// Initialisation (init_parameters) is independent of the layout: the value
/// of every element is a pure function of (seed, parameter name, global
/// row-major flat index), see init_normal(). Any shard of any TP/PP layout
/// therefore holds exactly the values of the same elements of the 1-rank
/// model.

#include "wlb4d/core/config.hpp"
#include "wlb4d/core/param_shapes.hpp"
#include "wlb4d/core/types.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace wlb::model {

/// Which part of the model a rank holds: layers [layer_begin, layer_end) and,
/// optionally, the embedding (first pipeline stage) and the final norm + LM
/// head (last stage), TP shard tp_rank of tp_size.
struct ModelShard {
  int layer_begin = 0;
  int layer_end = -1;      ///< -1: all layers (ModelConfig::layers)
  bool embedding = true;   ///< holds embed.weight
  bool head = true;        ///< holds final_norm.weight and lm_head.weight (tied: embed.weight)
  int tp_rank = 0;
  int tp_size = 1;
};

/// [offset, offset+count) of part `rank` when n elements split over `parts`
/// (the first n % parts parts get one more). \throws std::invalid_argument if
/// parts < 1 or rank is out of range.
std::pair<std::int64_t, std::int64_t> split_range(std::int64_t n, int parts, int rank);

/// Checks that cfg/vocab can be sharded as `shard` asks: d_model % heads == 0,
/// head_dim even (RoPE), heads % kv_heads == 0, heads % tp == 0,
/// kv_heads % tp == 0, vocab >= tp, ffn_hidden >= tp, 0 <= layer_begin <
/// layer_end <= layers (an empty stage is an error).
/// \throws wlb::core::ConfigError naming the key and the rule.
void validate_shard(const core::ModelConfig& cfg, std::int64_t vocab, const ModelShard& shard);

/// One tensor of the full model as the table above describes it (no
/// storage), and the full model's tensors in that order: the table lives in
/// core (core/param_shapes.hpp) because the checkpoint format checks files
/// against it without including the model.
using core::ParamShape;
using core::param_shapes;

/// N(0,1) draw for element `index` (global row-major flat index) of the
/// parameter `name` under `seed`: counter-based, no state. Key =
/// SplitMix64(seed ⊕ SplitMix64(FNV-1a-64(name))); two uniforms
/// u1 = (SplitMix64(key + 2·index) >> 11 + ½)·2⁻⁵³ ∈ (0,1),
/// u2 = (SplitMix64(key + 2·index + 1) >> 11)·2⁻⁵³; Box–Muller
/// (Box & Muller 1958) z = sqrt(−2 ln u1)·cos(2π u2). SplitMix64 is the
/// finaliser of Steele, Lea & Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014.
double init_normal(std::uint64_t seed, const std::string& name, std::uint64_t index);

/// One trainable tensor (its local shard on this rank).
template <class Scalar>
struct Param {
  std::string name;
  std::vector<std::int64_t> global_shape;  ///< [n] or [rows][cols] (elements)
  std::vector<std::int64_t> local_shape;   ///< this rank's shard, same rank as global_shape
  int shard_dim = -1;                      ///< TP-sharded dimension: 0, 1, or -1 (replicated)
  std::int64_t shard_offset = 0;           ///< first global index of the shard along shard_dim
  bool decay = false;                      ///< AdamW weight decay applies (matrices only)
  bool tp_replicated = false;              ///< identical copy on every TP rank: count once in norms
  /// embed.weight held by the last pipeline stage (not the first) as the
  /// tied LM head (ModelConfig::tie_embeddings): the same tensor as the first
  /// stage's, kept equal by summing the two gradients (optim::Optimizer)
  /// before the DP reduction. Counted once in norms, written once in
  /// checkpoints (by the first stage), read by both.
  bool tied_replica = false;
  std::size_t offset = 0;                  ///< first element in the registry's flat buffers
  View1<Scalar> value;                     ///< local values, row-major flat (local_numel())
  View1<Scalar> grad;                      ///< local gradient, same layout

  std::int64_t local_numel() const;
  std::int64_t global_numel() const;
  /// value/grad as [rows][cols] (a vector parameter is [1][n]); unmanaged windows.
  View2<Scalar> value2() const;
  View2<Scalar> grad2() const;
  /// Global row-major flat index of local flat element i (host function).
  std::int64_t global_index(std::int64_t local_flat) const;
};

/// The registry of one rank's parameters (see the file comment).
template <class Scalar>
class ParamRegistry {
 public:
  ParamRegistry() = default;
  /// Creates the shard's parameters (values and grads zero).
  /// \throws wlb::core::ConfigError from validate_shard().
  ParamRegistry(const core::ModelConfig& cfg, std::int64_t vocab, const ModelShard& shard);

  std::size_t size() const { return params_.size(); }
  Param<Scalar>& operator[](std::size_t i) { return params_[i]; }
  const Param<Scalar>& operator[](std::size_t i) const { return params_[i]; }
  typename std::vector<Param<Scalar>>::iterator begin() { return params_.begin(); }
  typename std::vector<Param<Scalar>>::iterator end() { return params_.end(); }
  typename std::vector<Param<Scalar>>::const_iterator begin() const { return params_.begin(); }
  typename std::vector<Param<Scalar>>::const_iterator end() const { return params_.end(); }

  /// nullptr if this rank does not hold `name`.
  const Param<Scalar>* find(const std::string& name) const;
  Param<Scalar>* find(const std::string& name);
  /// \throws std::out_of_range naming the parameter if this rank does not hold it.
  const Param<Scalar>& at(const std::string& name) const;
  Param<Scalar>& at(const std::string& name);

  /// All local values / gradients, contiguous, registry order (elements).
  const View1<Scalar>& values() const { return values_; }
  const View1<Scalar>& grads() const { return grads_; }
  std::int64_t local_numel() const { return std::int64_t(values_.extent(0)); }

  /// grad = 0 for every parameter (start of a step).
  void zero_grad() const;

  /// Layout-independent initialisation: matrices (and embeddings) get
  /// init_std·init_normal(seed, name, global index); the residual-branch
  /// outputs wo and w_down are further scaled by 1/sqrt(2·layers) (GPT-2,
  /// Radford et al. 2019 §2.3), so the residual stream's variance does not
  /// grow with depth; norm weights are 1.
  void init_parameters(std::uint64_t seed);

  const core::ModelConfig& config() const { return cfg_; }
  std::int64_t vocab() const { return vocab_; }
  const ModelShard& shard() const { return shard_; }

 private:
  core::ModelConfig cfg_;
  std::int64_t vocab_ = 0;
  ModelShard shard_;
  std::vector<Param<Scalar>> params_;
  View1<Scalar> values_, grads_;
};

}  // namespace wlb::model
