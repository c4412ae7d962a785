// Layer kernels (layers.hpp): forwards against naive host loops, backwards
// against central finite differences in fp64 (relative error ≤ 1e-6).
#include "test_util.hpp"
#include "wlb4d/model/layers.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

using namespace wlb;
using namespace wlb::model;
using namespace wlb::test;

namespace {

IntVec make_ints(const std::vector<int>& v) {
  IntVec d("ints", v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i) h(i) = v[i];
  Kokkos::deep_copy(d, h);
  return d;
}

}  // namespace

TEST(ModelLayers, LinearForwardAndFiniteDifferences) {
  std::mt19937_64 rng(1);
  const int T = 5, in = 7, out = 4;
  View2<double> x("x", T, in), w("w", out, in), y("y", T, out), dx("dx", T, in), dw("dw", out, in);
  fill_normal(x, rng);
  fill_normal(w, rng);
  linear_forward(x, w, y);
  const auto hx = host_vec(x), hw = host_vec(w), hy = host_vec(y);
  for (int t = 0; t < T; ++t)
    for (int o = 0; o < out; ++o) {
      double s = 0;
      for (int i = 0; i < in; ++i) s += hx[t * in + i] * hw[o * in + i];
      EXPECT_NEAR(hy[t * out + o], s, 1e-12);
    }
  std::vector<double> r(T * out);
  for (auto& v : r) v = std::normal_distribution<double>()(rng);
  View2<double> dy("dy", T, out);
  {
    auto h = Kokkos::create_mirror_view(dy);
    for (int i = 0; i < T * out; ++i) h.data()[i] = r[i];
    Kokkos::deep_copy(dy, h);
  }
  fill_normal(dw, rng);  // dW accumulates: start from a non-zero value
  const auto dw0 = host_vec(dw);
  linear_backward(x, w, dy, dx, dw);
  auto gdw = host_vec(dw);
  for (std::size_t i = 0; i < gdw.size(); ++i) gdw[i] -= dw0[i];
  auto loss = [&] {
    linear_forward(x, w, y);
    return dot(r, y);
  };
  fd_check("linear dx", x, host_vec(dx), sample(T * in, 12, rng), loss);
  fd_check("linear dW", w, gdw, sample(out * in, 12, rng), loss);

  // beta accumulation of dx
  View2<double> dx2("dx2", T, in);
  Kokkos::deep_copy(dx2, 1.0);
  linear_backward(x, w, dy, dx2, View2<double>("dw2", out, in), 1.0);
  const auto a = host_vec(dx), b = host_vec(dx2);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i] + 1.0, 1e-12);

  EXPECT_THROW(linear_forward(x, View2<double>("bad", out, in + 1), y), std::invalid_argument);
}

TEST(ModelLayers, EmbeddingVocabParallelAndFiniteDifferences) {
  std::mt19937_64 rng(2);
  // This rank holds vocabulary rows [4, 9) of a 12-row table; ids outside give 0.
  const int T = 8, d = 3, v0 = 4, vl = 5;
  const std::vector<int> ids = {4, 8, 2, 5, 5, 11, 8, 0};
  auto dids = make_ints(ids);
  View2<double> table("table", vl, d), out("out", T, d), dtable("dtable", vl, d);
  fill_normal(table, rng);
  embedding_forward(dids, T, v0, table, out);
  const auto ht = host_vec(table), ho = host_vec(out);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < d; ++j) {
      const int r = ids[t] - v0;
      const double want = (r >= 0 && r < vl) ? ht[r * d + j] : 0.0;
      EXPECT_EQ(ho[t * d + j], want);
    }
  std::vector<double> r(T * d);
  for (auto& v : r) v = std::normal_distribution<double>()(rng);
  View2<double> dout("dout", T, d);
  {
    auto h = Kokkos::create_mirror_view(dout);
    for (int i = 0; i < T * d; ++i) h.data()[i] = r[i];
    Kokkos::deep_copy(dout, h);
  }
  embedding_backward(dids, T, v0, dout, dtable);
  auto loss = [&] {
    embedding_forward(dids, T, v0, table, out);
    return dot(r, out);
  };
  std::vector<std::size_t> all(vl * d);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  fd_check("embedding dtable", table, host_vec(dtable), all, loss);
}

TEST(ModelLayers, RmsNormForwardAndFiniteDifferences) {
  std::mt19937_64 rng(3);
  const int T = 6, d = 10;
  const double eps = 1e-5;
  View2<double> x("x", T, d), y("y", T, d), dx("dx", T, d), dy("dy", T, d);
  View1<double> w("w", d), rstd("rstd", T), dw("dw", d);
  fill_normal(x, rng);
  fill_normal(w, rng, 0.3, 1.0);
  rmsnorm_forward(x, T, w, eps, y, rstd);
  const auto hx = host_vec(x), hw = host_vec(w), hy = host_vec(y);
  for (int t = 0; t < T; ++t) {
    double ss = 0;
    for (int j = 0; j < d; ++j) ss += hx[t * d + j] * hx[t * d + j];
    const double rs = 1.0 / std::sqrt(ss / d + eps);
    for (int j = 0; j < d; ++j) EXPECT_NEAR(hy[t * d + j], hx[t * d + j] * rs * hw[j], 1e-12);
  }
  std::vector<double> r(T * d);
  for (auto& v : r) v = std::normal_distribution<double>()(rng);
  {
    auto h = Kokkos::create_mirror_view(dy);
    for (int i = 0; i < T * d; ++i) h.data()[i] = r[i];
    Kokkos::deep_copy(dy, h);
  }
  rmsnorm_backward(x, T, w, rstd, dy, dx, dw, false);
  auto loss = [&] {
    rmsnorm_forward(x, T, w, eps, y, rstd);
    return dot(r, y);
  };
  fd_check("rmsnorm dx", x, host_vec(dx), sample(T * d, 15, rng), loss);
  std::vector<std::size_t> all(d);
  for (int i = 0; i < d; ++i) all[i] = i;
  fd_check("rmsnorm dw", w, host_vec(dw), all, loss);
  // accumulate_dx adds to what is there
  rmsnorm_forward(x, T, w, eps, y, rstd);
  View2<double> dx2("dx2", T, d);
  Kokkos::deep_copy(dx2, 2.0);
  rmsnorm_backward(x, T, w, rstd, dy, dx2, View1<double>("dw2", d), true);
  const auto a = host_vec(dx), b = host_vec(dx2);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i] + 2.0, 1e-12);
}

TEST(ModelLayers, RopeHalfSplitForwardInverseAndFiniteDifferences) {
  std::mt19937_64 rng(4);
  const int T = 7, H = 2, D = 8;
  const double theta = 10000.0;
  const std::vector<int> pos_h = {0, 1, 2, 0, 1, 0, 5};  // restarts per document
  auto pos = make_ints(pos_h);
  core::ModelConfig mc;
  mc.rope_theta = theta;
  const auto freq = rope_inv_freq_view(D, mc);
  View3<double> x("x", T, H, D), x0("x0", T, H, D);
  fill_normal(x, rng);
  Kokkos::deep_copy(x0, x);
  const auto hx = host_vec(x);
  rope_apply(x, T, pos, freq, false);
  const auto hr = host_vec(x);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < D / 2; ++i) {
        const double ang = pos_h[t] * std::pow(theta, -2.0 * i / D);
        const std::size_t a = (t * H + h) * D + i, b = a + D / 2;
        EXPECT_NEAR(hr[a], hx[a] * std::cos(ang) - hx[b] * std::sin(ang), 1e-12);
        EXPECT_NEAR(hr[b], hx[b] * std::cos(ang) + hx[a] * std::sin(ang), 1e-12);
      }
  rope_apply(x, T, pos, freq, true);
  const auto back = host_vec(x);
  for (std::size_t i = 0; i < back.size(); ++i) EXPECT_NEAR(back[i], hx[i], 1e-12);

  // Backward = inverse rotation of dy; check with finite differences.
  std::vector<double> r(T * H * D);
  for (auto& v : r) v = std::normal_distribution<double>()(rng);
  View3<double> g("g", T, H, D);
  {
    auto h = Kokkos::create_mirror_view(g);
    for (std::size_t i = 0; i < r.size(); ++i) h.data()[i] = r[i];
    Kokkos::deep_copy(g, h);
  }
  rope_apply(g, T, pos, freq, true);
  View3<double> y("y", T, H, D);
  auto loss = [&] {
    Kokkos::deep_copy(y, x0);
    rope_apply(y, T, pos, freq, false);
    return dot(r, y);
  };
  fd_check("rope dx", x0, host_vec(g), sample(T * H * D, 20, rng), loss);
}

// Llama 3.1's scaled frequencies, from the rule as Meta's reference states it
// (llama-models apply_scaling), in a different form from rope_inv_freq's:
// high frequencies kept, low ones divided by the factor, a linear blend in
// between. Llama 3.2's values: theta 500000, factor 32, 1, 4, 8192, D 64.
TEST(ModelLayers, RopeLlama3ScalingMatchesMetasRule) {
  core::ModelConfig mc;
  mc.rope_theta = 500000;
  mc.rope_scaling = "llama3";
  mc.rope_factor = 32;
  mc.rope_low_freq_factor = 1;
  mc.rope_high_freq_factor = 4;
  mc.rope_original_max_position = 8192;
  const int D = 64;
  const auto f = rope_inv_freq(D, mc);
  ASSERT_EQ(f.size(), std::size_t(D / 2));
  int kept = 0, scaled = 0, blended = 0;
  for (int i = 0; i < D / 2; ++i) {
    const double base = 1.0 / std::pow(500000.0, double(2 * i) / D);
    const double wavelen = 2 * M_PI / base;
    double want;
    if (wavelen < 8192.0 / 4) {
      want = base, ++kept;
    } else if (wavelen > 8192.0 / 1) {
      want = base / 32, ++scaled;
    } else {
      const double smooth = (8192.0 / wavelen - 1) / (4 - 1);
      want = (1 - smooth) * base / 32 + smooth * base, ++blended;
    }
    EXPECT_NEAR(f[std::size_t(i)], want, 1e-12 * want) << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(scaled, 0);
  EXPECT_GT(blended, 0);
  mc.rope_scaling = "none";
  EXPECT_NEAR(rope_inv_freq(D, mc)[5], 1.0 / std::pow(500000.0, 10.0 / D), 1e-15);
  mc.rope_scaling = "yarn";
  EXPECT_THROW(rope_inv_freq(D, mc), std::invalid_argument);
}

TEST(ModelLayers, SwigluForwardAndFiniteDifferences) {
  std::mt19937_64 rng(5);
  const int T = 4, F = 9;
  View2<double> g("g", T, F), u("u", T, F), h("h", T, F), dh("dh", T, F), dg("dg", T, F), du("du", T, F);
  fill_normal(g, rng, 2.0);
  fill_normal(u, rng);
  swiglu_forward(g, u, T, h);
  const auto hg = host_vec(g), hu = host_vec(u), hh = host_vec(h);
  for (std::size_t i = 0; i < hg.size(); ++i) EXPECT_NEAR(hh[i], hg[i] / (1 + std::exp(-hg[i])) * hu[i], 1e-12);
  std::vector<double> r(T * F);
  for (auto& v : r) v = std::normal_distribution<double>()(rng);
  {
    auto m = Kokkos::create_mirror_view(dh);
    for (std::size_t i = 0; i < r.size(); ++i) m.data()[i] = r[i];
    Kokkos::deep_copy(dh, m);
  }
  swiglu_backward(g, u, dh, T, dg, du);
  auto loss = [&] {
    swiglu_forward(g, u, T, h);
    return dot(r, h);
  };
  fd_check("swiglu dg", g, host_vec(dg), sample(T * F, 15, rng), loss);
  fd_check("swiglu du", u, host_vec(du), sample(T * F, 15, rng), loss);
}

TEST(ModelLayers, LmHeadCrossEntropyForwardAndFiniteDifferences) {
  std::mt19937_64 rng(6);
  const int T = 6, d = 5, V = 11;
  const std::vector<int> lab_h = {3, 10, -1, 0, 7, -1};
  auto labels = make_ints(lab_h);
  View2<double> x("x", T, d), w("w", V, d), logits("logits", T, V), dx("dx", T, d), dw("dw", V, d);
  View1<double> lse("lse", T), scratch("scratch", 3 * T);
  fill_normal(x, rng);
  fill_normal(w, rng);
  const comm::Communicator tp;  // size 1: no collectives
  linear_forward(x, w, logits);
  const double loss = cross_entropy_forward(logits, labels, T, 0, tp, lse, scratch);
  // naive log-softmax
  const auto hl = host_vec(logits);
  double want = 0;
  for (int t = 0; t < T; ++t) {
    if (lab_h[t] < 0) continue;
    double m = -1e300;
    for (int v = 0; v < V; ++v) m = std::max(m, hl[t * V + v]);
    double s = 0;
    for (int v = 0; v < V; ++v) s += std::exp(hl[t * V + v] - m);
    want += std::log(s) + m - hl[t * V + lab_h[t]];
  }
  EXPECT_NEAR(loss, want, 1e-12);

  const double gs = 0.25;  // grad_scale: gradient of gs·Σ CE
  cross_entropy_backward(logits, labels, T, 0, lse, gs, logits);  // in place
  const auto hd = host_vec(logits);
  for (int t = 0; t < T; ++t) {
    if (lab_h[t] < 0) {
      for (int v = 0; v < V; ++v) EXPECT_EQ(hd[t * V + v], 0.0);
    }
  }
  linear_backward(x, w, logits, dx, dw);
  auto f = [&] {
    linear_forward(x, w, logits);
    return gs * cross_entropy_forward(logits, labels, T, 0, tp, lse, scratch);
  };
  fd_check("lm_head+CE dx", x, host_vec(dx), sample(T * d, 15, rng), f);
  fd_check("lm_head+CE dW", w, host_vec(dw), sample(V * d, 20, rng), f);
}

TEST(ModelLayers, CrossEntropyVocabShardsSumToFullOnOneRank) {
  // A vocab shard sees only its own columns: with v0 != 0 the target logit is
  // found at label − v0, and labels outside the shard contribute 0 to z.
  std::mt19937_64 rng(7);
  const int T = 3, V = 9;
  auto labels = make_ints({5, 8, 6});
  View2<double> logits("logits", T, V);
  fill_normal(logits, rng);
  View1<double> lse("lse", T), scratch("scratch", 3 * T);
  const comm::Communicator tp;
  const double full = cross_entropy_forward(logits, labels, T, 0, tp, lse, scratch);
  // Shift: pretend this rank holds vocab [5, 14) and labels are shifted by 5.
  auto labels2 = make_ints({10, 13, 11});
  const double shifted = cross_entropy_forward(logits, labels2, T, 5, tp, lse, scratch);
  EXPECT_NEAR(full, shifted, 1e-12);
}

TEST(ModelLayers, CrossEntropyMasksPaddedColumns) {
  // Columns [vr, V) are vocabulary padding (model.vocab_size): the loss and lse equal
  // those of the first vr columns alone, whatever the padded logits hold, and
  // the padded columns get gradient 0 (float and the host vector path).
  std::mt19937_64 rng(11);
  const int T = 4, V = 21, vr = 13;
  auto labels = make_ints({3, 12, -1, 0});
  View2<float> padded("padded", T, V), real("real", T, vr);
  fill_normal(padded, rng);
  auto hp = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), padded);
  for (int t = 0; t < T; ++t)
    for (int v = vr; v < V; ++v) hp(t, v) = 30.0f + float(v);  // large: they would dominate the softmax
  Kokkos::deep_copy(padded, hp);
  auto hr = Kokkos::create_mirror_view(real);
  for (int t = 0; t < T; ++t)
    for (int v = 0; v < vr; ++v) hr(t, v) = hp(t, v);
  Kokkos::deep_copy(real, hr);
  View1<float> lse_p("lse_p", T), lse_r("lse_r", T), scratch("scratch", 3 * T);
  const comm::Communicator tp;
  const double lp = cross_entropy_forward(padded, labels, T, 0, tp, lse_p, scratch, vr);
  const double lr = cross_entropy_forward(real, labels, T, 0, tp, lse_r, scratch);
  EXPECT_NEAR(lp, lr, 1e-6 * std::fabs(lr));
  EXPECT_LT(lr, 3 * std::log(double(vr)) + 10);  // sanity: not the 30+ of the padded logits
  cross_entropy_backward(padded, labels, T, 0, lse_p, 0.5, padded, vr);
  cross_entropy_backward(real, labels, T, 0, lse_r, 0.5, real);
  Kokkos::deep_copy(hp, padded);
  Kokkos::deep_copy(hr, real);
  for (int t = 0; t < T; ++t) {
    for (int v = 0; v < vr; ++v) EXPECT_NEAR(hp(t, v), hr(t, v), 1e-6) << "t " << t << " v " << v;
    for (int v = vr; v < V; ++v) EXPECT_EQ(hp(t, v), 0.0f) << "padded column " << v << " of token " << t;
  }
  // A shard holding padding only (vr = 0) contributes nothing on its own.
  View1<float> lse0("lse0", T);
  fill_normal(padded, rng);
  EXPECT_EQ(cross_entropy_forward(padded, make_ints({-1, -1, -1, -1}), T, 0, tp, lse0, scratch, 0), 0.0);
}
