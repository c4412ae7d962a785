#pragma once
/// \file llama_export.hpp
/// \brief A wlb4d checkpoint as a Hugging Face `LlamaForCausalLM` directory
/// (`wlb4d-ckpt export-hf`), which `transformers` loads with no code of ours.
///
/// ## What is written (OUTDIR)
///   config.json             LlamaConfig: architectures ["LlamaForCausalLM"],
///                           model_type "llama", hidden_size, intermediate_size,
///                           num_attention_heads, num_key_value_heads, head_dim,
///                           num_hidden_layers, rms_norm_eps, rope_theta,
///                           rope_scaling (null, or the llama3 parameters),
///                           max_position_embeddings
///                           (the deck's train.max_seq_len), vocab_size (the
///                           tokenizer's: padding trimmed), tie_word_embeddings
///                           (model.tie_embeddings: then no lm_head.weight),
///                           bos/eos_token_id, hidden_act "silu",
///                           attention_bias/mlp_bias false, torch_dtype.
///   generation_config.json  bos/eos ids.
///   model.safetensors       the weights (one file), or model-0000k-of-0000n
///                           .safetensors shards of at most max_shard_bytes of
///                           tensor data each plus model.safetensors.index.json
///                           (metadata.total_size, weight_map); every file's
///                           __metadata__ is {"format": "pt"} (transformers
///                           refuses other files).
///   tokenizer files         sentencepiece: tokenizer.model (the checkpoint's
///                           model, byte for byte), tokenizer_config.json
///                           (LlamaTokenizer, no BOS/EOS added: wlb4d's
///                           documents start without BOS and end with EOS),
///                           special_tokens_map.json. bytes: tokenizer.json, a
///                           byte-level BPE without merges whose 256 base
///                           tokens are the bytes (GPT-2's byte-to-unicode
///                           alphabet, id = byte value) and EOS = 256 an added
///                           special token, so every byte string encodes to its
///                           bytes and decodes back; tokenizer_config.json and
///                           special_tokens_map.json name the EOS. hf-bpe:
///                           the tokenizer.json the data was prepared with,
///                           byte for byte; tokenizer_config.json and
///                           special_tokens_map.json name its EOS (and BOS).
///
/// ## Tensor names and layout
/// wlb4d stores Linear weights row-major [out][in] as torch.nn.Linear, and
/// applies RoPE to q/k with the half-split pairing of HF's `rotate_half`
/// (model/layers.hpp), with heads contiguous in the rows of wq/wk. So every
/// tensor is copied as it is, under HF's name (no q/k row permutation,
/// unlike Meta's interleaved-pair checkpoints):
///   embed.weight                 model.embed_tokens.weight     [V][d]
///   layers.L.attn_norm.weight    model.layers.L.input_layernorm.weight
///   layers.L.attn.wq|wk|wv|wo    model.layers.L.self_attn.{q,k,v,o}_proj.weight
///   layers.L.mlp_norm.weight     model.layers.L.post_attention_layernorm.weight
///   layers.L.mlp.w_gate|w_up|w_down  model.layers.L.mlp.{gate,up,down}_proj.weight
///   final_norm.weight            model.norm.weight
///   lm_head.weight               lm_head.weight                [V][d]
/// V: embed and lm_head keep their first tokenizer_vocab rows; the rows of
/// model.vocab_size above it are padding no token id reaches.
///
/// ## Memory and atomicity
/// Tensors stream one at a time (io::read_model_tensor): the peak is about
/// one fp32 tensor plus its converted copy, never the model. The directory is
/// written as OUTDIR.tmp-<pid> and renamed when complete, so a failed export
/// leaves no partial OUTDIR.

#include "wlb4d/hf/safetensors.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace wlb::hf {

/// HF's name of a wlb4d parameter ("layers.3.attn.wq" ->
/// "model.layers.3.self_attn.q_proj.weight").
/// \throws core::InternalError for a name outside core::param_shapes().
std::string hf_tensor_name(const std::string& wlb_name);

struct ExportOptions {
  Dtype dtype = Dtype::BF16;                      ///< BF16 (default, as HF's Llama releases) or F32
  std::uint64_t max_shard_bytes = 5000000000ULL;  ///< tensor bytes per shard (HF's "5GB")
};

struct ExportReport {
  std::string outdir;
  std::vector<std::string> files;   ///< every file written, relative to outdir
  std::uint64_t tensor_bytes = 0;   ///< the weights' bytes in the safetensors files
  std::int64_t vocab = 0;           ///< exported vocab_size (tokenizer's)
  std::int64_t padded_vocab = 0;    ///< the checkpoint's rows (vocab + trimmed padding)
  std::uint64_t largest_tensor_bytes = 0;  ///< fp32 bytes of the largest tensor read
  int shards = 0;
};

/// Writes the HF directory of checkpoint `checkpoint` into `outdir`, which
/// must not exist (or be an empty directory).
/// \throws core::CheckpointError naming the checkpoint (unreadable, damaged,
///         or without a tokenizer record: written before checkpoints carried
///         the tokenizer) or naming outdir (exists and is not empty, cannot
///         be written).
ExportReport export_llama(const std::string& checkpoint, const std::string& outdir, const ExportOptions& opts);

}  // namespace wlb::hf
