/// \file decoder.cpp
/// \brief KV-cache decoder from the training model's kernels (decoder.hpp).
#include "wlb4d/infer/decoder.hpp"

#include "wlb4d/model/attention.hpp"
#include "wlb4d/model/layers.hpp"

#include <cmath>
#include <stdexcept>

namespace wlb::infer {

namespace {

View2<float> window(float* base, std::int64_t rows, std::int64_t cols) { return View2<float>(base, rows, cols); }
View3<float> window3(float* base, std::int64_t a, std::int64_t b, std::int64_t c) { return View3<float>(base, a, b, c); }

}  // namespace

struct Decoder::Impl {
  core::ModelConfig m;
  std::int64_t V = 0, Vreal = 0, ctx = 0, chunk = 0;
  std::int64_t d = 0, D = 0, hq = 0, hkv = 0, F = 0, pos = 0;
  struct Layer {
    View1<float> attn_norm, mlp_norm;
    View2<float> wq, wk, wv, wo, w_gate, w_up, w_down;
    View3<float> k, v;  // cache [ctx][Hkv][D]
  };
  std::vector<Layer> layers;
  View2<float> embed, head;
  View1<float> final_norm;
  View1<double> freq;
  // Workspaces [chunk][width].
  View2<float> x, xn, q, att, tmp, g, u, h, logits;
  View1<float> rstd, lse;
  IntVec ids, positions, kv_lo, kv_hi;

  View2<float> matrix(const WeightSource& w, const std::string& name, std::int64_t rows, std::int64_t cols) {
    const auto host = w(name, {rows, cols});
    if (std::int64_t(host.size()) != rows * cols)
      throw std::invalid_argument("Decoder: tensor " + name + " has " + std::to_string(host.size()) +
                                  " values, its shape [" + std::to_string(rows) + "][" + std::to_string(cols) +
                                  "] needs " + std::to_string(rows * cols));
    View2<float> out(name, rows, cols);
    Kokkos::View<const float**, Layout, HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> hv(host.data(), rows, cols);
    Kokkos::deep_copy(out, hv);
    return out;
  }
  View1<float> vector(const WeightSource& w, const std::string& name, std::int64_t n) {
    const auto host = w(name, {n});
    if (std::int64_t(host.size()) != n)
      throw std::invalid_argument("Decoder: tensor " + name + " has " + std::to_string(host.size()) +
                                  " values, its shape [" + std::to_string(n) + "] needs " + std::to_string(n));
    View1<float> out(name, n);
    Kokkos::View<const float*, Layout, HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> hv(host.data(), n);
    Kokkos::deep_copy(out, hv);
    return out;
  }

  /// One forward of T <= chunk tokens at positions [pos, pos + T); returns
  /// the last token's logits.
  std::vector<float> forward(const std::int32_t* tok, std::int64_t T) {
    {
      auto hi = Kokkos::create_mirror_view(ids);
      auto hp = Kokkos::create_mirror_view(positions);
      auto hlo = Kokkos::create_mirror_view(kv_lo);
      auto hhi = Kokkos::create_mirror_view(kv_hi);
      for (std::int64_t t = 0; t < T; ++t) {
        hi(t) = tok[t];
        hp(t) = std::int32_t(pos + t);
        hlo(t) = 0;                       // one sequence: every earlier key
        hhi(t) = std::int32_t(pos + t);   // causal: up to its own position
      }
      Kokkos::deep_copy(ids, hi);
      Kokkos::deep_copy(positions, hp);
      Kokkos::deep_copy(kv_lo, hlo);
      Kokkos::deep_copy(kv_hi, hhi);
    }
    const std::int64_t qd = hq * D, kd = hkv * D, S = pos + T;
    const auto X = window(x.data(), T, d), XN = window(xn.data(), T, d), TMP = window(tmp.data(), T, d);
    const auto Q = window(q.data(), T, qd), ATT = window(att.data(), T, qd);
    const auto G = window(g.data(), T, F), U = window(u.data(), T, F), H = window(h.data(), T, F);
    const auto lo = Kokkos::subview(kv_lo, std::make_pair(std::int64_t(0), T));
    const auto hi = Kokkos::subview(kv_hi, std::make_pair(std::int64_t(0), T));
    const float scale = float(1.0 / std::sqrt(double(D)));
    model::embedding_forward(ids, T, 0, embed, X);
    for (auto& L : layers) {
      model::rmsnorm_forward(X, T, L.attn_norm, m.norm_eps, XN, rstd);
      model::linear_forward(XN, L.wq, Q);
      // The new keys and values go straight into their cache rows.
      model::linear_forward(XN, L.wk, window(L.k.data() + pos * kd, T, kd));
      model::linear_forward(XN, L.wv, window(L.v.data() + pos * kd, T, kd));
      model::rope_apply(window3(Q.data(), T, hq, D), T, positions, freq, false);
      model::rope_apply(window3(L.k.data() + pos * kd, T, hkv, D), T, positions, freq, false);
      model::attention_forward<float>(window3(Q.data(), T, hq, D), window3(L.k.data(), S, hkv, D),
                                      window3(L.v.data(), S, hkv, D), lo, hi, scale,
                                      window3(ATT.data(), T, hq, D), window(lse.data(), hq, T));
      model::linear_forward(ATT, L.wo, TMP);
      model::add_inplace(X, TMP, T);
      model::rmsnorm_forward(X, T, L.mlp_norm, m.norm_eps, XN, rstd);
      model::linear_forward(XN, L.w_gate, G);
      model::linear_forward(XN, L.w_up, U);
      model::swiglu_forward(G, U, T, H);
      model::linear_forward(H, L.w_down, TMP);
      model::add_inplace(X, TMP, T);
    }
    // Only the last token's logits are needed.
    const auto last = window(X.data() + (T - 1) * d, 1, d), last_n = window(xn.data(), 1, d);
    model::rmsnorm_forward(last, 1, final_norm, m.norm_eps, last_n, rstd);
    model::linear_forward(last_n, head, logits);
    pos += T;
    auto hl = Kokkos::create_mirror_view_and_copy(HostSpace(), logits);
    return std::vector<float>(hl.data(), hl.data() + Vreal);
  }
};

Decoder::Decoder(const core::ModelConfig& m, std::int64_t vocab, std::int64_t real_vocab, std::int64_t max_context,
                 const WeightSource& weights, std::int64_t chunk_tokens)
    : impl_(std::make_unique<Impl>()) {
  if (real_vocab < 1 || real_vocab > vocab || max_context < 1 || chunk_tokens < 1)
    throw std::invalid_argument("Decoder: need 1 <= real_vocab <= vocab, max_context >= 1, chunk_tokens >= 1");
  Impl& I = *impl_;
  I.m = m;
  I.V = vocab;
  I.Vreal = real_vocab;
  I.ctx = max_context;
  I.chunk = std::min(chunk_tokens, max_context);
  I.d = m.d_model;
  I.D = m.head_dim();
  I.hq = m.heads;
  I.hkv = m.kv_heads;
  I.F = m.ffn_hidden;
  I.freq = model::rope_inv_freq_view(I.D, m);
  const std::int64_t qd = I.hq * I.D, kd = I.hkv * I.D;
  I.embed = I.matrix(weights, "embed.weight", vocab, I.d);
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    Impl::Layer L;
    L.attn_norm = I.vector(weights, p + "attn_norm.weight", I.d);
    L.wq = I.matrix(weights, p + "attn.wq", qd, I.d);
    L.wk = I.matrix(weights, p + "attn.wk", kd, I.d);
    L.wv = I.matrix(weights, p + "attn.wv", kd, I.d);
    L.wo = I.matrix(weights, p + "attn.wo", I.d, qd);
    L.mlp_norm = I.vector(weights, p + "mlp_norm.weight", I.d);
    L.w_gate = I.matrix(weights, p + "mlp.w_gate", I.F, I.d);
    L.w_up = I.matrix(weights, p + "mlp.w_up", I.F, I.d);
    L.w_down = I.matrix(weights, p + "mlp.w_down", I.d, I.F);
    L.k = View3<float>("wlb::infer::k_cache", max_context, I.hkv, I.D);
    L.v = View3<float>("wlb::infer::v_cache", max_context, I.hkv, I.D);
    I.layers.push_back(std::move(L));
  }
  I.final_norm = I.vector(weights, "final_norm.weight", I.d);
  I.head = m.tie_embeddings ? I.embed : I.matrix(weights, "lm_head.weight", vocab, I.d);
  const std::int64_t C = I.chunk;
  I.x = View2<float>("wlb::infer::x", C, I.d);
  I.xn = View2<float>("wlb::infer::xn", C, I.d);
  I.tmp = View2<float>("wlb::infer::tmp", C, I.d);
  I.q = View2<float>("wlb::infer::q", C, qd);
  I.att = View2<float>("wlb::infer::att", C, qd);
  I.g = View2<float>("wlb::infer::gate", C, I.F);
  I.u = View2<float>("wlb::infer::up", C, I.F);
  I.h = View2<float>("wlb::infer::h", C, I.F);
  I.logits = View2<float>("wlb::infer::logits", 1, vocab);
  I.rstd = View1<float>("wlb::infer::rstd", C);
  I.lse = View1<float>("wlb::infer::lse", C * I.hq);
  I.ids = IntVec("wlb::infer::ids", C);
  I.positions = IntVec("wlb::infer::positions", C);
  I.kv_lo = IntVec("wlb::infer::kv_lo", C);
  I.kv_hi = IntVec("wlb::infer::kv_hi", C);
}

Decoder::~Decoder() = default;
Decoder::Decoder(Decoder&&) noexcept = default;
Decoder& Decoder::operator=(Decoder&&) noexcept = default;

std::vector<float> Decoder::feed(const std::vector<std::int32_t>& tokens) {
  Impl& I = *impl_;
  if (tokens.empty()) throw std::invalid_argument("Decoder::feed: no tokens");
  for (auto t : tokens)
    if (t < 0 || t >= I.Vreal)
      throw std::invalid_argument("Decoder::feed: token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                  std::to_string(I.Vreal) + ")");
  if (I.pos + std::int64_t(tokens.size()) > I.ctx)
    throw std::length_error("Decoder::feed: " + std::to_string(I.pos + std::int64_t(tokens.size())) +
                            " tokens exceed the KV cache of " + std::to_string(I.ctx));
  std::vector<float> out;
  for (std::size_t i = 0; i < tokens.size(); i += std::size_t(I.chunk)) {
    const std::int64_t n = std::min<std::int64_t>(I.chunk, std::int64_t(tokens.size() - i));
    out = I.forward(tokens.data() + i, n);
  }
  return out;
}

void Decoder::reset() { impl_->pos = 0; }
std::int64_t Decoder::position() const { return impl_->pos; }
std::int64_t Decoder::max_context() const { return impl_->ctx; }
std::int64_t Decoder::real_vocab() const { return impl_->Vreal; }

}  // namespace wlb::infer
