// AdamW against a hand-computed update; the LR schedule's end points.
#include "wlb4d/optim/adamw.hpp"

#include <gtest/gtest.h>

#include <random>

#include <cmath>

using namespace wlb;

TEST(AdamW, MatchesHandComputedUpdateOnThreeElements) {
  Vec p("p", 3), g("g", 3), m("m", 3), v("v", 3);
  auto ph = Kokkos::create_mirror_view(p);
  auto gh = Kokkos::create_mirror_view(g);
  ph(0) = 1.0f; ph(1) = -2.0f; ph(2) = 0.5f;
  gh(0) = 0.1f; gh(1) = -0.3f; gh(2) = 2.0f;
  Kokkos::deep_copy(p, ph);
  Kokkos::deep_copy(g, gh);
  Kokkos::deep_copy(m, 0.0f);
  Kokkos::deep_copy(v, 0.0f);
  optim::AdamWStep s;
  s.lr = 0.01; s.beta1 = 0.9; s.beta2 = 0.95; s.eps = 1e-8; s.weight_decay = 0.1; s.grad_scale = 0.5;
  // Two steps, checked against the formula evaluated in double by hand.
  double P[3] = {1.0, -2.0, 0.5}, G[3] = {0.1, -0.3, 2.0}, M[3] = {0, 0, 0}, V[3] = {0, 0, 0};
  for (long t = 1; t <= 2; ++t) {
    s.t = t;
    optim::adamw_update(p, g, m, v, s);
    for (int i = 0; i < 3; ++i) {
      double gi = G[i] * 0.5;
      M[i] = 0.9 * M[i] + 0.1 * gi;
      V[i] = 0.95 * V[i] + 0.05 * gi * gi;
      double mh = M[i] / (1 - std::pow(0.9, t)), vh = V[i] / (1 - std::pow(0.95, t));
      P[i] = P[i] - 0.01 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * P[i]);
    }
  }
  Kokkos::deep_copy(ph, p);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(ph(i), P[i], 1e-6) << i;
  // First step of Adam moves each element by ~lr (sign of g) plus decay: sanity.
  EXPECT_LT(ph(2), 0.5f);
  EXPECT_GT(ph(1), -2.0f);
}

TEST(AdamW, SumOfSquaresAndClip) {
  Vec g("g", 4);
  auto gh = Kokkos::create_mirror_view(g);
  gh(0) = 3; gh(1) = 4; gh(2) = 0; gh(3) = 0;
  Kokkos::deep_copy(g, gh);
  EXPECT_DOUBLE_EQ(optim::sum_of_squares(g), 25.0);
  EXPECT_NEAR(optim::clip_factor(5.0, 1.0), 0.2, 1e-6);
  EXPECT_DOUBLE_EQ(optim::clip_factor(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(optim::clip_factor(50.0, 0.0), 1.0);
}

// The blocked host reduction of the gradient norm against a naive long-double sum, for
// spans that are and are not multiples of its 16 lanes and 4096-element
// blocks, on a subview at an odd offset (as the optimizer calls it), twice.
TEST(AdamW, SumOfSquaresMatchesANaiveSumAndIsDeterministic) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (std::int64_t n : {0, 1, 7, 16, 17, 4095, 4096, 4097, 100003}) {
    Vec all("all", std::size_t(n + 5));
    auto h = Kokkos::create_mirror_view(all);
    for (std::size_t i = 0; i < h.span(); ++i) h(i) = nd(rng) * (i % 97 == 0 ? 1e3f : 1.f);
    Kokkos::deep_copy(all, h);
    const auto sub = Kokkos::subview(all, std::make_pair(std::size_t(3), std::size_t(3 + n)));
    long double ref = 0;
    for (std::int64_t i = 0; i < n; ++i) ref += (long double)h(std::size_t(3 + i)) * (long double)h(std::size_t(3 + i));
    const double a = optim::sum_of_squares(sub), b = optim::sum_of_squares(sub);
    EXPECT_NEAR(a, double(ref), 1e-14 * double(ref)) << "n = " << n;
    EXPECT_EQ(a, b) << "n = " << n;
  }
}

TEST(LRSchedule, WarmupAndEndValues) {
  core::OptimConfig o;
  o.lr = 1e-3; o.min_lr = 1e-4; o.warmup_steps = 10;
  const int total = 100;
  EXPECT_NEAR(optim::lr_at(o, 0, total), 1e-4, 1e-12);   // lr/warmup
  EXPECT_NEAR(optim::lr_at(o, 4, total), 5e-4, 1e-12);
  EXPECT_NEAR(optim::lr_at(o, 9, total), 1e-3, 1e-12);   // peak at the end of warm-up
  EXPECT_NEAR(optim::lr_at(o, 10, total), 1e-3, 1e-12);  // cosine starts at the peak
  EXPECT_NEAR(optim::lr_at(o, 99, total), 1e-4, 1e-12);  // ends at min_lr
  EXPECT_NEAR(optim::lr_at(o, 150, total), 1e-4, 1e-12);
  // Monotone decay after warm-up, midpoint halfway between.
  const int mid = 10 + (total - 1 - 10) / 2;
  EXPECT_NEAR(optim::lr_at(o, mid, total), 0.5 * (1e-3 + 1e-4), 2e-5);
  for (int s = 10; s < 99; ++s) EXPECT_GE(optim::lr_at(o, s, total), optim::lr_at(o, s + 1, total));
}
