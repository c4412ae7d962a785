// The KV-cache decoder against a naive fp64 forward written here from the
// Llama equations (embedding, RMSNorm, RoPE half-split pairs, GQA softmax
// attention, SwiGLU, head), against a full recompute of the prefix at every
// position, and chunked prefill against one forward; and the sampler's
// argmax, reproducibility, top-k / top-p sets and drawing frequencies.
#include "test_util.hpp"
#include "wlb4d/core/param_shapes.hpp"
#include "wlb4d/infer/decoder.hpp"
#include "wlb4d/infer/sampling.hpp"
#include "wlb4d/model/layers.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

namespace {

using namespace wlb;

struct Weights {
  std::map<std::string, std::vector<float>> t;
  infer::WeightSource source() const {
    return [this](const std::string& name, const std::vector<std::int64_t>&) { return t.at(name); };
  }
};

Weights random_weights(const core::ModelConfig& m, std::int64_t V, std::uint64_t seed) {
  Weights w;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const auto& p : core::param_shapes(m, V)) {
    std::int64_t n = 1;
    for (auto e : p.global_shape) n *= e;
    auto& v = w.t[p.name];
    v.resize(std::size_t(n));
    const bool norm = p.global_shape.size() == 1;
    for (auto& x : v) x = norm ? 1.0f + 0.2f * nd(rng) : 0.3f * nd(rng);
  }
  return w;
}

/// Logits [V] after the last token of `ids` (positions 0..n-1), in double.
std::vector<double> naive_logits(const core::ModelConfig& m, std::int64_t vocab, const Weights& w,
                                 const std::vector<std::int32_t>& ids) {
  using Vd = std::vector<double>;
  const std::size_t d = std::size_t(m.d_model), D = std::size_t(m.head_dim()), Hq = std::size_t(m.heads),
                    Hkv = std::size_t(m.kv_heads), F = std::size_t(m.ffn_hidden), V = std::size_t(vocab);
  const std::size_t n = ids.size();
  const auto W = [&](const std::string& s) -> const std::vector<float>& { return w.t.at(s); };
  const auto matvec = [](const std::vector<float>& M, const Vd& x, std::size_t rows) {
    const std::size_t cols = x.size();
    Vd y(rows, 0.0);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) y[r] += double(M[r * cols + c]) * x[c];
    return y;
  };
  const auto norm = [&](const Vd& x, const std::vector<float>& g) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / double(x.size()) + m.norm_eps);
    Vd y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * double(g[i]);
    return y;
  };
  const auto freq = model::rope_inv_freq(std::int64_t(D), m);  // the table itself: RopeLlama3ScalingMatchesMetasRule
  const auto rope = [&](Vd& v, std::size_t heads, std::size_t pos) {  // half-split pairs (i, i + D/2)
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t i = 0; i < D / 2; ++i) {
        const double a = double(pos) * freq[i];
        const double x0 = v[h * D + i], x1 = v[h * D + i + D / 2];
        v[h * D + i] = x0 * std::cos(a) - x1 * std::sin(a);
        v[h * D + i + D / 2] = x1 * std::cos(a) + x0 * std::sin(a);
      }
  };
  std::vector<Vd> x(n, Vd(d));
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t j = 0; j < d; ++j) x[t][j] = W("embed.weight")[std::size_t(ids[t]) * d + j];
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    std::vector<Vd> q(n), k(n), v(n);
    for (std::size_t t = 0; t < n; ++t) {
      const Vd a = norm(x[t], W(p + "attn_norm.weight"));
      q[t] = matvec(W(p + "attn.wq"), a, Hq * D);
      k[t] = matvec(W(p + "attn.wk"), a, Hkv * D);
      v[t] = matvec(W(p + "attn.wv"), a, Hkv * D);
      rope(q[t], Hq, t);
      rope(k[t], Hkv, t);
    }
    for (std::size_t t = 0; t < n; ++t) {
      Vd o(Hq * D, 0.0);
      for (std::size_t h = 0; h < Hq; ++h) {
        const std::size_t g = h / (Hq / Hkv);  // GQA: query head h reads kv head h / (Hq/Hkv)
        Vd sc(t + 1);
        double mx = -1e300;
        for (std::size_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (std::size_t i = 0; i < D; ++i) dot += q[t][h * D + i] * k[j][g * D + i];
          sc[j] = dot / std::sqrt(double(D));
          mx = std::max(mx, sc[j]);
        }
        double z = 0;
        for (auto& e : sc) z += e = std::exp(e - mx);
        for (std::size_t j = 0; j <= t; ++j)
          for (std::size_t i = 0; i < D; ++i) o[h * D + i] += sc[j] / z * v[j][g * D + i];
      }
      const Vd y = matvec(W(p + "attn.wo"), o, d);
      for (std::size_t j = 0; j < d; ++j) x[t][j] += y[j];
    }
    for (std::size_t t = 0; t < n; ++t) {
      const Vd a = norm(x[t], W(p + "mlp_norm.weight"));
      const Vd gt = matvec(W(p + "mlp.w_gate"), a, F), up = matvec(W(p + "mlp.w_up"), a, F);
      Vd hh(F);
      for (std::size_t f = 0; f < F; ++f) hh[f] = gt[f] / (1 + std::exp(-gt[f])) * up[f];
      const Vd y = matvec(W(p + "mlp.w_down"), hh, d);
      for (std::size_t j = 0; j < d; ++j) x[t][j] += y[j];
    }
  }
  const Vd last = norm(x.back(), W("final_norm.weight"));
  return matvec(W(m.tie_embeddings ? "embed.weight" : "lm_head.weight"), last, V);
}

void expect_close(const std::vector<float>& a, const std::vector<double>& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double scale = 0;
  for (double v : b) scale = std::max(scale, std::fabs(v));
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol * scale) << what << " logit " << i;
}

struct Case {
  const char* name;
  bool tied;
  bool llama3;
};

class DecoderVsNaive : public ::testing::TestWithParam<Case> {};

TEST_P(DecoderVsNaive, EveryPositionMatchesTheEquations) {
  auto m = test::tiny_model(2, 16, 4, 2, 24);
  m.tie_embeddings = GetParam().tied;
  if (GetParam().llama3) {
    m.rope_scaling = "llama3";
    m.rope_theta = 500000;
    m.rope_factor = 8;
    m.rope_original_max_position = 8;  // every band acts within these 24 positions
  }
  const std::int64_t V = 40, Vreal = 37;
  const auto w = random_weights(m, V, 11);
  std::vector<std::int32_t> ids;
  std::mt19937 rng(5);
  for (int i = 0; i < 24; ++i) ids.push_back(std::int32_t(rng() % Vreal));
  infer::Decoder dec(m, V, Vreal, 32, w.source(), 5);  // prefill chunks of 5
  // Incremental: one token at a time through the cache.
  for (std::size_t p = 0; p < ids.size(); ++p) {
    const auto got = dec.feed({ids[p]});
    auto want = naive_logits(m, V, w, std::vector<std::int32_t>(ids.begin(), ids.begin() + std::ptrdiff_t(p) + 1));
    want.resize(std::size_t(Vreal));  // padding rows are not returned
    expect_close(got, want, 2e-5, "position " + std::to_string(p));
  }
  EXPECT_EQ(dec.position(), 24);
  // The whole prefix at once (5 chunks), and a recompute of a shorter prefix after reset().
  dec.reset();
  auto full = naive_logits(m, V, w, ids);
  full.resize(std::size_t(Vreal));
  expect_close(dec.feed(ids), full, 2e-5, "prefill of 24 tokens");
  EXPECT_THROW(dec.feed(std::vector<std::int32_t>(9, 1)), std::length_error);  // 24 + 9 > 32
  EXPECT_THROW(dec.feed({Vreal}), std::invalid_argument);                      // a padding id
}

INSTANTIATE_TEST_SUITE_P(Models, DecoderVsNaive,
                         ::testing::Values(Case{"untied", false, false}, Case{"tied_llama3", true, true}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Decoder, CachedDecodingEqualsRecomputingThePrefix) {
  const auto m = test::tiny_model(3, 32, 4, 1, 40);
  const std::int64_t V = 50;
  const auto w = random_weights(m, V, 3);
  std::vector<std::int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(std::int32_t((i * 7 + 3) % V));
  infer::Decoder inc(m, V, V, 64, w.source()), full(m, V, V, 64, w.source());
  for (std::size_t p = 0; p < ids.size(); ++p) {
    const auto a = inc.feed({ids[p]});
    full.reset();
    const auto b = full.feed(std::vector<std::int32_t>(ids.begin(), ids.begin() + std::ptrdiff_t(p) + 1));
    double scale = 0;
    for (float x : b) scale = std::max(scale, double(std::fabs(x)));
    for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5 * scale) << "position " << p;
  }
}

TEST(Sampler, GreedyTopKTopPAndSeeds) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f, 1.5f};
  infer::SamplingOptions g;
  g.greedy = true;
  EXPECT_EQ(infer::Sampler(g).next(logits), 1);  // ties go to the lower id
  infer::SamplingOptions k1;
  k1.top_k = 1;
  EXPECT_EQ(infer::Sampler(k1).next(logits), 1);
  infer::SamplingOptions p0;
  p0.top_p = 1e-6;
  EXPECT_EQ(infer::Sampler(p0).next(logits), 1);
  infer::SamplingOptions s;
  s.seed = 42;
  infer::Sampler a(s), b(s);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.next(logits), b.next(logits));
  infer::SamplingOptions k2;
  k2.top_k = 3;
  infer::Sampler c(k2);
  for (int i = 0; i < 500; ++i) {
    const int t = c.next(logits);
    ASSERT_TRUE(t == 1 || t == 3 || t == 4) << t;
  }
  EXPECT_THROW(infer::Sampler(infer::SamplingOptions{-1.0, 0, 1.0, false, 0}), std::invalid_argument);
  EXPECT_THROW(infer::Sampler(infer::SamplingOptions{1.0, 0, 0.0, false, 0}), std::invalid_argument);
}

TEST(Sampler, DrawsInProportionToTheTemperedSoftmax) {
  // p ∝ exp(logit / T): logits log(1), log(2), log(3), log(4) at T = 1 give 0.1 .. 0.4;
  // at T = 0.5 the weights square (1, 4, 9, 16)/30. top_p = 0.65 keeps {3, 2} of T = 1 (0.4 + 0.3).
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  const auto freqs = [&](infer::SamplingOptions o) {
    infer::Sampler s(o);
    std::vector<double> f(4, 0.0);
    const int n = 40000;
    for (int i = 0; i < n; ++i) f[std::size_t(s.next(logits))] += 1.0 / n;
    return f;
  };
  infer::SamplingOptions o;
  o.seed = 1;
  const auto f1 = freqs(o);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(f1[std::size_t(i)], 0.1 * (i + 1), 0.012) << i;  // > 4 sigma
  o.temperature = 0.5;
  const auto f2 = freqs(o);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(f2[std::size_t(i)], (i + 1) * (i + 1) / 30.0, 0.012) << i;
  o.temperature = 1.0;
  o.top_p = 0.65;
  const auto f3 = freqs(o);
  EXPECT_EQ(f3[0] + f3[1], 0.0);
  EXPECT_NEAR(f3[3], 4.0 / 7.0, 0.012);
}

TEST(Generate, StopsAtTheStopTokenOrTheBudget) {
  const auto m = test::tiny_model();
  const std::int64_t V = 20;
  const auto w = random_weights(m, V, 9);
  infer::Decoder dec(m, V, V, 16, w.source());
  infer::SamplingOptions g;
  g.greedy = true;
  infer::Sampler s(g);
  std::vector<std::int32_t> seen;
  const auto r = infer::generate(dec, {1, 2, 3}, 5, s, -1, [&](std::int32_t t) { seen.push_back(t); });
  EXPECT_EQ(r.tokens.size(), 5u);
  EXPECT_EQ(seen, r.tokens);
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(dec.position(), 3 + 4);  // the last draw is not fed
  // Stopping at the first greedy token: the same chain, cut after it.
  dec.reset();
  infer::Sampler s2(g);
  const auto r2 = infer::generate(dec, {1, 2, 3}, 5, s2, r.tokens[0]);
  EXPECT_TRUE(r2.stopped);
  EXPECT_EQ(r2.tokens, std::vector<std::int32_t>{r.tokens[0]});
}

}  // namespace

namespace {

TEST(Printable, KeepsUtf8EscapesTheRest) {
  using wlb::infer::printable;
  EXPECT_EQ(printable("abc"), "abc");
  EXPECT_EQ(printable("a\nb\tc"), "a\\nb\\tc");
  EXPECT_EQ(printable("caf\xc3\xa9 \xe2\x82\xac"), "caf\xc3\xa9 \xe2\x82\xac");  // é, €
  EXPECT_EQ(printable(std::string("x\x07y\x01", 4)), "x\\x07y\\x01");
  EXPECT_EQ(printable("\xc3"), "\\xc3");           // a lead byte without its continuation
  EXPECT_EQ(printable("\x80z"), "\\x80z");         // a lone continuation byte
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");  // an overlong lead byte
}

}  // namespace
