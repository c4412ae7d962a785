// The model's tensor table. See param_shapes.hpp.
#include "wlb4d/core/param_shapes.hpp"

namespace wlb::core {

std::vector<ParamShape> param_shapes(const ModelConfig& cfg, std::int64_t vocab) {
  const std::int64_t d = cfg.d_model, D = cfg.head_dim(), F = cfg.ffn_hidden;
  const std::int64_t q = std::int64_t(cfg.heads) * D, kv = std::int64_t(cfg.kv_heads) * D;
  std::vector<ParamShape> out;
  out.reserve(std::size_t(cfg.layers) * 9 + 3);
  out.push_back({"embed.weight", {vocab, d}, 0, -1});
  for (int l = 0; l < cfg.layers; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    out.push_back({pre + "attn_norm.weight", {d}, -1, l});
    out.push_back({pre + "attn.wq", {q, d}, 0, l});
    out.push_back({pre + "attn.wk", {kv, d}, 0, l});
    out.push_back({pre + "attn.wv", {kv, d}, 0, l});
    out.push_back({pre + "attn.wo", {d, q}, 1, l});
    out.push_back({pre + "mlp_norm.weight", {d}, -1, l});
    out.push_back({pre + "mlp.w_gate", {F, d}, 0, l});
    out.push_back({pre + "mlp.w_up", {F, d}, 0, l});
    out.push_back({pre + "mlp.w_down", {d, F}, 1, l});
  }
  out.push_back({"final_norm.weight", {d}, -1, -1});
  if (!cfg.tie_embeddings) out.push_back({"lm_head.weight", {vocab, d}, 0, -1});
  return out;
}

}  // namespace wlb::core
