#pragma once
/// \file decoder.hpp
/// \brief Autoregressive inference of the Llama model on one rank with an
/// incremental KV cache (`wlb4d-generate`, and the trainer's
/// train.sample_every samples).
///
/// The forward is composed from the training model's own kernels
/// (model/layers.hpp, model/attention.hpp), so the same source runs on the
/// host and on CUDA: embedding_forward, rmsnorm_forward, linear_forward,
/// rope_apply (model::rope_inv_freq, llama3 scaling included),
/// attention_forward, swiglu_forward. feed(tokens) runs the new tokens at
/// positions [position(), position() + n) in chunks of at most
/// `chunk_tokens`; each layer writes their keys and values into the cache
/// (after RoPE) and attends to cache rows [0, own position] through
/// attention_forward's per-query key range (kv_lo = 0, kv_hi = position), so
/// a prefix is never recomputed: a decode step costs O(position) attention
/// and O(parameters) GEMM work.
///
/// Layouts (device, LayoutRight): KV cache of layer l: K and V
/// [max_context][Hkv][D] each (fp32; 2·layers·max_context·Hkv·D·4 bytes);
/// workspaces [chunk][width]. Weights are held in fp32 at their global
/// (unsharded) shapes; the LM head is embed.weight when the model ties them.
///
/// Logits are returned for the tokenizer's ids only ([real_vocab]): rows of
/// model.vocab_size above it are padding no token reaches (as in training).

#include "wlb4d/core/config.hpp"
#include "wlb4d/core/types.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace wlb::infer {

/// The full-model fp32 values of parameter `name` (a core::param_shapes()
/// name), row-major at `shape` (global). E.g. io::read_model_tensor.
using WeightSource = std::function<std::vector<float>(const std::string& name, const std::vector<std::int64_t>& shape)>;

class Decoder {
 public:
  /// \param m          the model (shape, RoPE, norm eps, tie_embeddings)
  /// \param vocab      embedding rows (model.vocab_size, padding included)
  /// \param real_vocab ids [0, real_vocab) are tokens (the tokenizer's vocabulary)
  /// \param max_context KV cache capacity in tokens (positions 0..max_context-1)
  /// \param chunk_tokens longest run of tokens one forward processes (prefill
  ///        is cut into chunks of this size; bounds the workspaces)
  /// \throws std::invalid_argument for a tensor of the wrong size from `weights`
  ///         or inconsistent sizes.
  Decoder(const core::ModelConfig& m, std::int64_t vocab, std::int64_t real_vocab, std::int64_t max_context,
          const WeightSource& weights, std::int64_t chunk_tokens = 128);
  ~Decoder();
  Decoder(Decoder&&) noexcept;
  Decoder& operator=(Decoder&&) noexcept;

  /// Runs `tokens` at the next positions, extends the cache, and returns the
  /// logits [real_vocab] (host) after the last of them.
  /// \throws std::length_error if the cache would exceed max_context;
  ///         std::invalid_argument for an empty list or an id >= real_vocab.
  std::vector<float> feed(const std::vector<std::int32_t>& tokens);
  /// Empties the cache (position 0), keeping the weights.
  void reset();
  std::int64_t position() const;
  std::int64_t max_context() const;
  std::int64_t real_vocab() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wlb::infer
