#pragma once
/// \file llama_import.hpp
/// \brief A Hugging Face Llama directory as a wlb4d checkpoint
/// (`wlb4d-ckpt import-hf`): weights only, step 0, to start training from
/// with checkpoint.init_from on any layout.
///
/// ## What is read (HFDIR)
///   config.json   LlamaConfig. Required: hidden_size, intermediate_size,
///                 num_attention_heads, num_hidden_layers, vocab_size.
///                 Defaults as transformers' LlamaConfig: num_key_value_heads
///                 = num_attention_heads, rms_norm_eps 1e-6, rope_theta
///                 10000, tie_word_embeddings false, hidden_act silu,
///                 initializer_range 0.02 (model.init_std), max_position_embeddings
///                 2048 (kept as the stored deck's train.max_seq_len, so an
///                 export of the import writes the same config.json).
///                 Refused, naming the field: model_type other than "llama",
///                 architectures without LlamaForCausalLM, hidden_act other
///                 than silu, attention_bias or mlp_bias true, head_dim other
///                 than hidden_size / num_attention_heads, rope_scaling other
///                 than null or rope_type "llama3" (whose factor,
///                 low_freq_factor, high_freq_factor and
///                 original_max_position_embeddings become model.rope_*).
///                 tie_word_embeddings true becomes model.tie_embeddings.
///   weights       model.safetensors, or model.safetensors.index.json and the
///                 shards its weight_map names; F32, BF16 or F16 (converted to
///                 fp32 exactly). Every tensor of the model must be present at
///                 its shape (names and layout: llama_export.hpp; no q/k
///                 permutation); rotary_emb.inv_freq buffers of older files
///                 and the lm_head.weight some tied models still store are
///                 ignored (as transformers does); any other tensor is
///                 refused (never a silent partial import).
///   tokenizer     tokenizer.model (sentencepiece) is stored in the checkpoint
///                 with its special ids; a tokenizer.json that is wlb4d's own
///                 byte tokenizer (a byte-level BPE without merges over the
///                 256 bytes, export-hf) is stored as `bytes`; another
///                 tokenizer.json that data::ByteLevelBpeTokenizer reads
///                 (GPT-2's, Llama 3's byte-level BPE) is stored as `hf-bpe`,
///                 byte for byte, with EOS = tokenizer_config.json's
///                 eos_token when that is a special added token, else the
///                 EOS rule of data/byte_level_bpe.hpp; any other is not
///                 stored (a warning says why): train on data prepared with it.
///
/// ## Memory
/// One tensor at a time (hf::SafetensorsFile::read, io::save_weights_checkpoint).

#include <cstdint>
#include <string>

#include "wlb4d/core/config.hpp"

namespace wlb::hf {

struct ImportOptions {
  /// Rows of embed/lm_head in the checkpoint (0: config.json's vocab_size);
  /// larger pads with zero rows (model.vocab_size padding, e.g. to a multiple
  /// of 64); smaller is refused.
  std::int64_t vocab_size = 0;
};

struct ImportReport {
  core::ModelConfig model;          ///< the deck's [model] section for this checkpoint
  std::int64_t vocab = 0;           ///< rows of embed/lm_head written
  std::int64_t hf_vocab = 0;        ///< config.json's vocab_size
  std::string tokenizer;            ///< "bytes", "sentencepiece", "hf-bpe" or "" (not stored)
  std::string tokenizer_note;       ///< why no tokenizer was stored ("" if one was)
  int files = 0;                    ///< safetensors files read
  std::uint64_t largest_tensor_bytes = 0;  ///< fp32 bytes of the largest tensor
  std::string model_section;        ///< "[model]\nlayers = ...\n..." to paste into a deck
};

/// Reads `hfdir` and writes the weights-only checkpoint `out_h5` (written as
/// out_h5.tmp and renamed; an existing out_h5 is refused).
/// \throws core::CheckpointError naming the file and the field or tensor and
///         the rule (a missing shard or tensor, a wrong shape or dtype, a
///         header that lies about its offsets, truncated data, an
///         unsupported config field, vocab_size smaller than config.json's).
ImportReport import_llama(const std::string& hfdir, const std::string& out_h5, const ImportOptions& opts = {});

}  // namespace wlb::hf
