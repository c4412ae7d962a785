#pragma once
/// \file param_shapes.hpp
/// \brief The model's tensor table from its ModelConfig alone: every
/// trainable tensor's name, global shape and tensor-parallel shard dimension,
/// in the fixed order of model/params.hpp (embed.weight; per layer L
/// attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down; final_norm;
/// lm_head, absent when cfg.tie_embeddings: the head is embed.weight).
/// Nothing is allocated.
///
/// Why in core: it is the contract between the model, which allocates these
/// tensors (model::ParamRegistry builds its list from it), and the checkpoint
/// format, which checks a file's tensor list against the model record it
/// carries (io never includes model). Shapes are row-major [out][in] as
/// torch.nn.Linear (y = x·Wᵀ): wq [Hq·D][d], wk/wv [Hkv·D][d], wo [d][Hq·D],
/// w_gate/w_up [F][d], w_down [d][F], embed/lm_head [V][d], norms [d].

#include <cstdint>
#include <string>
#include <vector>

#include "wlb4d/core/config.hpp"

namespace wlb::core {

/// One tensor of the full model (no storage).
struct ParamShape {
  std::string name;
  std::vector<std::int64_t> global_shape;  ///< [n] or [rows][cols] (elements)
  int shard_dim = -1;                      ///< TP-sharded dimension: 0, 1, or -1 (replicated)
  int layer = -1;                          ///< transformer layer L of "layers.L.*"; -1 embedding/head
};

/// The full model's tensors in the fixed order (file comment) for a
/// vocabulary of `vocab` rows. No validation: callers check cfg first
/// (heads >= 1, d_model % heads == 0) or use model::validate_shard().
std::vector<ParamShape> param_shapes(const ModelConfig& cfg, std::int64_t vocab);

}  // namespace wlb::core
