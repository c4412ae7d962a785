/// \file sampling.cpp
/// \brief Temperature / top-k / top-p sampling and the generation loop (sampling.hpp).
#include "wlb4d/infer/sampling.hpp"

#include "wlb4d/core/clock.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace wlb::infer {

Sampler::Sampler(const SamplingOptions& o) : o_(o), rng_(o.seed) {
  if (!(o.temperature >= 0)) throw std::invalid_argument("temperature must be >= 0");
  if (o.top_k < 0) throw std::invalid_argument("top_k must be >= 0");
  if (!(o.top_p > 0 && o.top_p <= 1)) throw std::invalid_argument("top_p must be in (0, 1]");
}

std::int32_t Sampler::next(const std::vector<float>& logits) {
  if (logits.empty()) throw std::invalid_argument("Sampler::next: no logits");
  const auto n = std::int32_t(logits.size());
  if (o_.greedy || o_.temperature == 0) {
    std::int32_t best = 0;
    for (std::int32_t i = 1; i < n; ++i)
      if (logits[std::size_t(i)] > logits[std::size_t(best)]) best = i;  // first of equals: lowest id
    return best;
  }
  // Candidates by descending logit, ties to the lower id.
  std::vector<std::int32_t> idx(static_cast<std::size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  const auto by_logit = [&](std::int32_t a, std::int32_t b) {
    const float la = logits[std::size_t(a)], lb = logits[std::size_t(b)];
    return la != lb ? la > lb : a < b;
  };
  std::size_t keep = idx.size();
  if (o_.top_k > 0 && std::size_t(o_.top_k) < keep) {
    keep = std::size_t(o_.top_k);
    std::partial_sort(idx.begin(), idx.begin() + std::ptrdiff_t(keep), idx.end(), by_logit);
  } else {
    std::sort(idx.begin(), idx.end(), by_logit);
  }
  idx.resize(keep);
  // Softmax of logit / temperature over the candidates, in double.
  std::vector<double> p(keep);
  const double top = logits[std::size_t(idx[0])];
  double sum = 0;
  for (std::size_t i = 0; i < keep; ++i) sum += p[i] = std::exp((logits[std::size_t(idx[i])] - top) / o_.temperature);
  for (auto& x : p) x /= sum;
  if (o_.top_p < 1) {  // the smallest prefix reaching top_p
    double c = 0;
    std::size_t k = 0;
    while (k < keep && c < o_.top_p) c += p[k++];
    keep = std::max<std::size_t>(k, 1);
    p.resize(keep);
    sum = std::accumulate(p.begin(), p.end(), 0.0);
    for (auto& x : p) x /= sum;
  }
  const double r = double(rng_() >> 11) * 0x1.0p-53;  // uniform [0, 1), 53 bits
  double c = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    c += p[i];
    if (r < c) return idx[i];
  }
  return idx[keep - 1];  // rounding left r above the last cumulative sum
}

std::string printable(std::string_view text) {
  std::string out;
  const auto hex = [&](unsigned char b) {
    static const char* const digits = "0123456789abcdef";
    out += "\\x";
    out += digits[b >> 4];
    out += digits[b & 15];
  };
  for (std::size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b == '\n' || b == '\t') {
      out += b == '\n' ? "\\n" : "\\t";
      ++i;
      continue;
    }
    if (b < 0x20 || b == 0x7f) {
      hex(b);
      ++i;
      continue;
    }
    // UTF-8 sequence length from the lead byte (RFC 3629; no overlongs, no surrogates checked beyond shape).
    const std::size_t len = b < 0x80 ? 1 : (b >> 5) == 6 && b >= 0xc2 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 && b <= 0xf4 ? 4 : 0;
    bool ok = len > 0 && i + len <= text.size();
    for (std::size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(text[i + k]) >> 6) == 2;
    if (!ok) {
      hex(b);
      ++i;
      continue;
    }
    out.append(text.substr(i, len));
    i += len;
  }
  return out;
}

Generation generate(Decoder& dec, const std::vector<std::int32_t>& prompt, int max_new_tokens, Sampler& sampler,
                    std::int32_t stop_id, const std::function<void(std::int32_t)>& on_token) {
  Generation out;
  out.prompt_tokens = std::int64_t(prompt.size());
  double t0 = core::wall_seconds();
  std::vector<float> logits = dec.feed(prompt);
  out.prefill_seconds = core::wall_seconds() - t0;
  t0 = core::wall_seconds();
  for (int i = 0; i < max_new_tokens; ++i) {
    const std::int32_t t = sampler.next(logits);
    out.tokens.push_back(t);
    if (on_token) on_token(t);
    if (t == stop_id) {
      out.stopped = true;
      break;
    }
    if (i + 1 == max_new_tokens || dec.position() >= dec.max_context()) break;
    logits = dec.feed({t});
  }
  out.decode_seconds = core::wall_seconds() - t0;
  return out;
}

}  // namespace wlb::infer
