#pragma once
/// \file sampling.hpp
/// \brief Choosing the next token from logits, and the generation loop.
///
/// Sampling (Holtzman et al. 2020, "The Curious Case of Neural Text
/// Degeneration", §3.1 for top-p; top-k as Fan et al. 2018): logits /
/// temperature, keep the k largest (top_k > 0), softmax, keep the smallest
/// set of most probable tokens whose probability reaches top_p (top_p < 1),
/// renormalise, draw. Ties in the ordering go to the lower id, and the draw
/// uses a 64-bit Mersenne Twister seeded with `seed` and 53-bit uniforms, so
/// a seeded sample is reproducible on every platform. greedy (or temperature
/// 0) takes the argmax (lowest id among equal logits).

#include "wlb4d/infer/decoder.hpp"

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace wlb::infer {

struct SamplingOptions {
  double temperature = 1.0;  ///< > 0; 0 means greedy
  int top_k = 0;             ///< 0: all tokens
  double top_p = 1.0;        ///< (0, 1]; 1: no nucleus cut
  bool greedy = false;       ///< argmax, ignoring the three above
  std::uint64_t seed = 0;
};

class Sampler {
 public:
  /// \throws std::invalid_argument for temperature < 0, top_k < 0 or top_p outside (0, 1].
  explicit Sampler(const SamplingOptions& o);
  /// The next token id from logits [V].
  std::int32_t next(const std::vector<float>& logits);

 private:
  SamplingOptions o_;
  std::mt19937_64 rng_;
};

struct Generation {
  std::vector<std::int32_t> tokens;  ///< the new tokens (the stop token included when it ended the run)
  bool stopped = false;              ///< ended at the stop token (not at max_new_tokens or the context)
  std::int64_t prompt_tokens = 0;
  double prefill_seconds = 0;        ///< the prompt's forward
  double decode_seconds = 0;         ///< every later forward and draw
};

/// `text` as one printable log line: valid UTF-8 is kept, newline and tab
/// become \\n and \\t, other control bytes and bytes of invalid UTF-8 (an
/// early model's byte-level output) become \\xNN.
std::string printable(std::string_view text);

/// Feeds `prompt` (non-empty) and draws up to max_new_tokens tokens, one
/// forward of one token each, stopping after `stop_id` (>= 0) or when the
/// cache is full; `on_token` sees each token as it is drawn.
Generation generate(Decoder& dec, const std::vector<std::int32_t>& prompt, int max_new_tokens, Sampler& sampler,
                    std::int32_t stop_id, const std::function<void(std::int32_t)>& on_token = {});

}  // namespace wlb::infer
