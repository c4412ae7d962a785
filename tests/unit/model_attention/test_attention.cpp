// Tests of wlb::model::attention_forward / attention_backward (the
// document-masked FlashAttention kernel):
// against a naive fp64 masked softmax written here with plain loops, central
// finite differences, document isolation, empty rows, float vs double, and a
// printed (not asserted) micro-timing.
#include "wlb4d/model/attention.hpp"

#include "attention/tiled.hpp"  // internal: the tiled kernel with an explicit tile shape

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using wlb::View1;
using wlb::View2;
using wlb::View3;
using namespace wlb::model;
namespace tiled = wlb::model::attn_impl::tiled;

/// A problem in host vectors: q [T][Hq][D], k/v [S][Hkv][D], inclusive ranges.
struct Problem {
  int T = 0, S = 0, Hq = 1, Hkv = 1, D = 1;
  std::vector<int> lo, hi;
  std::vector<double> q, k, v, dout;
  double scale = 1.0;
  std::size_t qi(int i, int h, int d) const { return (std::size_t(i) * Hq + h) * D + d; }
  std::size_t ki(int j, int h, int d) const { return (std::size_t(j) * Hkv + h) * D + d; }
};

/// Document-causal mask of a packed batch (kv_lo = document start, kv_hi = i).
Problem packed(const std::vector<int>& doc_lens, int Hq, int Hkv, int D, unsigned seed) {
  Problem p;
  p.Hq = Hq;
  p.Hkv = Hkv;
  p.D = D;
  int start = 0;
  for (int len : doc_lens) {
    for (int i = start; i < start + len; ++i) {
      p.lo.push_back(start);
      p.hi.push_back(i);
    }
    start += len;
  }
  p.T = p.S = start;
  p.scale = 1.0 / std::sqrt(double(D));
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  auto fill = [&](std::vector<double>& x, std::size_t n) {
    x.resize(n);
    for (auto& e : x) e = nd(rng);
  };
  fill(p.q, std::size_t(p.T) * Hq * D);
  fill(p.k, std::size_t(p.S) * Hkv * D);
  fill(p.v, std::size_t(p.S) * Hkv * D);
  fill(p.dout, std::size_t(p.T) * Hq * D);
  return p;
}

struct Result {
  std::vector<double> out, lse, dq, dk, dv;
};

// --------------------------------------------------------------- reference --

/// Naive masked softmax attention and its backward, fp64, O(T·S) memory per head.
Result reference(const Problem& p) {
  Result r;
  const int T = p.T, S = p.S, Hq = p.Hq, D = p.D, G = p.Hq / p.Hkv;
  r.out.assign(std::size_t(T) * Hq * D, 0.0);
  r.dq.assign(r.out.size(), 0.0);
  r.lse.assign(std::size_t(Hq) * T, -std::numeric_limits<double>::infinity());
  r.dk.assign(std::size_t(S) * p.Hkv * D, 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  std::vector<double> P(S), dP(S);
  for (int h = 0; h < Hq; ++h) {
    const int hk = h / G;
    for (int i = 0; i < T; ++i) {
      const int lo = std::max(p.lo[i], 0), hi = std::min(p.hi[i], S - 1);
      if (lo > hi) continue;
      double m = -std::numeric_limits<double>::infinity();
      for (int j = lo; j <= hi; ++j) {
        double s = 0;
        for (int d = 0; d < D; ++d) s += p.q[p.qi(i, h, d)] * p.k[p.ki(j, hk, d)];
        P[j] = s * p.scale;
        m = std::max(m, P[j]);
      }
      double l = 0;
      for (int j = lo; j <= hi; ++j) l += (P[j] = std::exp(P[j] - m));
      for (int j = lo; j <= hi; ++j) P[j] /= l;
      r.lse[std::size_t(h) * T + i] = m + std::log(l);
      for (int j = lo; j <= hi; ++j)
        for (int d = 0; d < D; ++d) r.out[p.qi(i, h, d)] += P[j] * p.v[p.ki(j, hk, d)];
      // backward: dP = dO·vᵀ, dS = P∘(dP - Σ P∘dP), dq = scale dS k, dk = scale dSᵀ q
      double Di = 0;
      for (int j = lo; j <= hi; ++j) {
        dP[j] = 0;
        for (int d = 0; d < D; ++d) dP[j] += p.dout[p.qi(i, h, d)] * p.v[p.ki(j, hk, d)];
        Di += P[j] * dP[j];
      }
      for (int j = lo; j <= hi; ++j) {
        const double dS = P[j] * (dP[j] - Di);
        for (int d = 0; d < D; ++d) {
          r.dv[p.ki(j, hk, d)] += P[j] * p.dout[p.qi(i, h, d)];
          r.dq[p.qi(i, h, d)] += p.scale * dS * p.k[p.ki(j, hk, d)];
          r.dk[p.ki(j, hk, d)] += p.scale * dS * p.q[p.qi(i, h, d)];
        }
      }
    }
  }
  return r;
}

// ---------------------------------------------------------------- kernels --

template <class Scalar>
View3<Scalar> to_view3(const std::vector<double>& x, int n0, int n1, int n2, const char* name) {
  View3<Scalar> v(std::string(name), n0, n1, n2);
  auto h = Kokkos::create_mirror_view(v);
  for (int a = 0; a < n0; ++a)
    for (int b = 0; b < n1; ++b)
      for (int c = 0; c < n2; ++c) h(a, b, c) = Scalar(x[(std::size_t(a) * n1 + b) * n2 + c]);
  Kokkos::deep_copy(v, h);
  return v;
}

View1<std::int32_t> to_view1(const std::vector<int>& x, const char* name) {
  View1<std::int32_t> v(std::string(name), x.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < x.size(); ++i) h(i) = x[i];
  Kokkos::deep_copy(v, h);
  return v;
}

template <class V>
std::vector<double> to_vec(const V& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::vector<double> x(h.span());
  for (std::size_t n = 0; n < h.span(); ++n) x[n] = double(h.data()[n]);
  return x;
}

/// Runs the library kernels on p (forward and, if wanted, backward); with a
/// tile shape, the tiled kernel with that shape instead (tiled.hpp test hook).
template <class Scalar>
Result run(const Problem& p, bool with_backward = true, tiled::Shape shape = {}) {
  const bool hook = shape.bq > 0;
  const wlb::model::attn_impl::Dims dm{p.T, p.S, p.Hq, p.Hkv, p.D};
  auto q = to_view3<Scalar>(p.q, p.T, p.Hq, p.D, "q");
  auto k = to_view3<Scalar>(p.k, p.S, p.Hkv, p.D, "k");
  auto v = to_view3<Scalar>(p.v, p.S, p.Hkv, p.D, "v");
  auto lo = to_view1(p.lo, "kv_lo"), hi = to_view1(p.hi, "kv_hi");
  View3<Scalar> out("out", p.T, p.Hq, p.D);
  View2<Scalar> lse("lse", p.Hq, p.T);
  if (hook)
    tiled::forward<Scalar>(shape, q, k, v, lo, hi, Scalar(p.scale), out, lse, dm);
  else
    attention_forward(q, k, v, lo, hi, Scalar(p.scale), out, lse);
  Result r;
  r.out = to_vec(out);
  r.lse = to_vec(lse);
  if (with_backward) {
    auto dout = to_view3<Scalar>(p.dout, p.T, p.Hq, p.D, "dout");
    // Poison the outputs: the kernel must overwrite, not accumulate.
    View3<Scalar> dq("dq", p.T, p.Hq, p.D), dk("dk", p.S, p.Hkv, p.D), dv("dv", p.S, p.Hkv, p.D);
    Kokkos::deep_copy(dq, Scalar(7));
    Kokkos::deep_copy(dk, Scalar(7));
    Kokkos::deep_copy(dv, Scalar(7));
    if (hook)
      tiled::backward<Scalar>(shape, q, k, v, out, dout, lse, lo, hi, Scalar(p.scale), dq, dk, dv, dm);
    else
      attention_backward(q, k, v, out, dout, lse, lo, hi, Scalar(p.scale), dq, dk, dv);
    r.dq = to_vec(dq);
    r.dk = to_vec(dk);
    r.dv = to_vec(dv);
  }
  return r;
}

/// max |a-b| / max(1, max|b|), after checking both are NaN-free.
double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 1;
  for (std::size_t n = 0; n < a.size(); ++n) {
    EXPECT_FALSE(std::isnan(a[n])) << "NaN at " << n;
    if (std::isinf(a[n]) || std::isinf(b[n])) {
      EXPECT_EQ(a[n], b[n]) << "at " << n;
      continue;
    }
    num = std::max(num, std::fabs(a[n] - b[n]));
    den = std::max(den, std::fabs(b[n]));
  }
  return num / den;
}

void expect_matches(const Result& got, const Result& ref, double tol) {
  EXPECT_LE(rel_err(got.out, ref.out), tol) << "out";
  EXPECT_LE(rel_err(got.lse, ref.lse), tol) << "lse";
  EXPECT_LE(rel_err(got.dq, ref.dq), tol) << "dq";
  EXPECT_LE(rel_err(got.dk, ref.dk), tol) << "dk";
  EXPECT_LE(rel_err(got.dv, ref.dv), tol) << "dv";
}

// ------------------------------------------------------------------ tests --

TEST(Attention, DocumentsGqaMatchReference) {
  // lengths 1, 2, odd, a full tile, tile+1, longer than two tiles; D not a
  // multiple of the SIMD block.
  const auto p = packed({1, 2, 37, 64, 65, 150, 5}, 4, 2, 24, 11);
  expect_matches(run<double>(p), reference(p), 1e-12);
}

// Every supported head dim (32, 64, 80, 128) against every GQA ratio
// (Hq/Hkv = 1, 2, 4, 8), documents that start and end inside 64-token blocks
// and one longer than two blocks, plus empty rows: each tile path of both
// host kernels (portable and BLAS tiles, see CMakeLists) against the naive fp64 softmax.
TEST(Attention, HeadDimsAndGqaRatiosMatchReference) {
  for (int D : {32, 64, 80, 128})
    for (int ratio : {1, 2, 4, 8}) {
      const int Hkv = ratio == 8 ? 1 : 2;
      Problem p = packed({3, 61, 1, 140, 29}, ratio * Hkv, Hkv, D, unsigned(100 + D + ratio));
      for (int i : {0, 70, 71, 200}) {  // empty rows, one of them inside a document
        p.lo[i] = i + 1;
        p.hi[i] = i;
      }
      SCOPED_TRACE("D=" + std::to_string(D) + " Hq/Hkv=" + std::to_string(ratio));
      expect_matches(run<double>(p), reference(p), 1e-12);
    }
}

// Context-parallel key ranges (queries a subset of the keys, ranges that are
// neither document-causal nor contiguous with their neighbours) at D = 128, GQA 4.
TEST(Attention, ContextParallelRangesD128Gqa4) {
  Problem p = packed({257}, 8, 2, 128, 77);
  std::mt19937 rng(8);
  for (int i = 0; i < p.T; ++i) {
    switch (i % 4) {
      case 0: p.lo[i] = 0; p.hi[i] = p.S - 1; break;                    // all keys
      case 1: p.lo[i] = int(rng() % p.S); p.hi[i] = int(rng() % p.S); break;  // maybe empty
      case 2: p.lo[i] = i - 100; p.hi[i] = i + 100; break;              // clamped both sides
      default: p.lo[i] = 64; p.hi[i] = 64; break;                       // one key
    }
  }
  expect_matches(run<double>(p), reference(p), 1e-12);
}

// Race-free and deterministic: two runs give the same bits.
TEST(Attention, RepeatedRunsAreBitIdentical) {
  const auto p = packed({100, 300, 17}, 8, 2, 64, 88);
  const Result a = run<float>(p), b = run<float>(p);
  for (auto m : {&Result::out, &Result::lse, &Result::dq, &Result::dk, &Result::dv}) {
    ASSERT_EQ((a.*m).size(), (b.*m).size());
    for (std::size_t n = 0; n < (a.*m).size(); ++n) ASSERT_EQ((a.*m)[n], (b.*m)[n]) << n;
  }
}

TEST(Attention, SingleDocumentMhaD64MatchesReference) {
  const auto p = packed({200}, 2, 2, 64, 12);
  expect_matches(run<double>(p), reference(p), 1e-12);
}

TEST(Attention, MqaAndTinyHeadDim) {
  const auto p = packed({3, 70, 1}, 4, 1, 3, 13);
  expect_matches(run<double>(p), reference(p), 1e-12);
}

TEST(Attention, ContextParallelSubsetOfKeys) {
  // S = 300 keys in global order; this rank holds 2 chunks of queries (as the
  // per-sequence CP shard r and 2cp-1-r would), plus arbitrary ranges with
  // gaps, empty rows and out-of-range bounds (clamped).
  Problem p = packed({300}, 4, 2, 16, 14);
  const int S = 300;
  std::vector<int> qpos;
  for (int i = 40; i < 80; ++i) qpos.push_back(i);
  for (int i = 220; i < 260; ++i) qpos.push_back(i);
  std::vector<int> lo, hi;
  std::mt19937 rng(5);
  for (std::size_t n = 0; n < qpos.size(); ++n) {
    const int i = qpos[n];
    switch (n % 5) {
      case 0: lo.push_back(0); hi.push_back(i); break;            // causal, one document
      case 1: lo.push_back(i - 30); hi.push_back(i); break;       // document starting at i-30
      case 2: lo.push_back(int(rng() % S)); hi.push_back(int(rng() % S)); break;  // maybe empty
      case 3: lo.push_back(-5); hi.push_back(S + 10); break;      // clamped to all keys
      default: lo.push_back(i + 1); hi.push_back(i); break;       // empty row
    }
  }
  Problem c = p;
  c.T = int(qpos.size());
  c.S = S;
  c.lo = lo;
  c.hi = hi;
  c.q.assign(std::size_t(c.T) * c.Hq * c.D, 0.0);
  c.dout.assign(c.q.size(), 0.0);
  for (int n = 0; n < c.T; ++n)
    for (int h = 0; h < c.Hq; ++h)
      for (int d = 0; d < c.D; ++d) {
        c.q[c.qi(n, h, d)] = p.q[p.qi(qpos[n], h, d)];
        c.dout[c.qi(n, h, d)] = p.dout[p.qi(qpos[n], h, d)];
      }
  expect_matches(run<double>(c), reference(c), 1e-12);
}

TEST(Attention, FiniteDifferenceGradients) {
  // L = Σ out ∘ G with G = dout; central differences on every input element.
  const auto p = packed({1, 2, 67}, 4, 2, 5, 21);
  const Result an = run<double>(p);
  auto loss = [](const Problem& pp) {
    const Result r = run<double>(pp, false);
    double L = 0;
    for (std::size_t n = 0; n < r.out.size(); ++n) L += r.out[n] * pp.dout[n];
    return L;
  };
  const double eps = 1e-5;
  auto check = [&](std::vector<double> Problem::*x, const std::vector<double>& grad,
                   const char* name) {
    Problem pp = p;
    double num = 0, den = 0;
    for (std::size_t n = 0; n < (pp.*x).size(); ++n) {
      const double x0 = (pp.*x)[n];
      (pp.*x)[n] = x0 + eps;
      const double lp = loss(pp);
      (pp.*x)[n] = x0 - eps;
      const double lm = loss(pp);
      (pp.*x)[n] = x0;
      const double fd = (lp - lm) / (2 * eps);
      num += (fd - grad[n]) * (fd - grad[n]);
      den += grad[n] * grad[n];
    }
    const double rel = std::sqrt(num / den);
    EXPECT_LE(rel, 1e-6) << name;
    std::printf("  finite differences: d%s relative error %.2e\n", name, rel);
  };
  check(&Problem::q, an.dq, "q");
  check(&Problem::k, an.dk, "k");
  check(&Problem::v, an.dv, "v");
}

TEST(Attention, DocumentsAreIsolated) {
  // Changing every input of document B leaves document A's outputs and dq
  // bit-for-bit unchanged (masked entries are exact zeros, never exp(-inf)·x).
  const std::vector<int> lens = {30, 50, 70};  // B = the middle one, shares tiles with A and C
  Problem p = packed(lens, 4, 2, 16, 31);
  Problem p2 = p;
  std::mt19937 rng(99);
  std::normal_distribution<double> nd(0.0, 10.0);
  for (int i = 30; i < 80; ++i)
    for (int d = 0; d < p.D; ++d) {
      for (int h = 0; h < p.Hq; ++h) {
        p2.q[p.qi(i, h, d)] = nd(rng);
        p2.dout[p.qi(i, h, d)] = nd(rng);
      }
      for (int h = 0; h < p.Hkv; ++h) {
        p2.k[p.ki(i, h, d)] = nd(rng);
        p2.v[p.ki(i, h, d)] = nd(rng);
      }
    }
  const Result a = run<double>(p), b = run<double>(p2);
  for (int i = 0; i < p.T; ++i) {
    if (i >= 30 && i < 80) continue;
    for (int h = 0; h < p.Hq; ++h) {
      EXPECT_EQ(a.lse[std::size_t(h) * p.T + i], b.lse[std::size_t(h) * p.T + i]);
      for (int d = 0; d < p.D; ++d) {
        EXPECT_EQ(a.out[p.qi(i, h, d)], b.out[p.qi(i, h, d)]) << "token " << i;
        EXPECT_EQ(a.dq[p.qi(i, h, d)], b.dq[p.qi(i, h, d)]) << "token " << i;
      }
    }
    for (int h = 0; h < p.Hkv; ++h)
      for (int d = 0; d < p.D; ++d) {
        EXPECT_EQ(a.dk[p.ki(i, h, d)], b.dk[p.ki(i, h, d)]) << "token " << i;
        EXPECT_EQ(a.dv[p.ki(i, h, d)], b.dv[p.ki(i, h, d)]) << "token " << i;
      }
  }
}

TEST(Attention, EmptyRowsGiveZerosNotNaN) {
  Problem p = packed({40, 90}, 4, 2, 16, 41);
  // Empty some rows; key 5 and key 100 then have no query attending them.
  for (int i : {0, 3, 17, 63, 64, 100, 129}) {
    p.lo[i] = i + 1;
    p.hi[i] = i;
  }
  const Result r = run<double>(p), ref = reference(p);
  expect_matches(r, ref, 1e-12);
  for (int i : {0, 3, 17, 63, 64, 100, 129})
    for (int h = 0; h < p.Hq; ++h) {
      EXPECT_TRUE(std::isinf(r.lse[std::size_t(h) * p.T + i]) && r.lse[std::size_t(h) * p.T + i] < 0);
      for (int d = 0; d < p.D; ++d) {
        EXPECT_EQ(r.out[p.qi(i, h, d)], 0.0);
        EXPECT_EQ(r.dq[p.qi(i, h, d)], 0.0);
      }
    }

  // Every row empty: all outputs and gradients are exactly zero.
  for (int i = 0; i < p.T; ++i) {
    p.lo[i] = 1;
    p.hi[i] = 0;
  }
  const Result z = run<double>(p);
  for (const auto* x : {&z.out, &z.dq, &z.dk, &z.dv})
    for (double e : *x) ASSERT_EQ(e, 0.0);
}

TEST(Attention, FloatMatchesDoubleReference) {
  const auto p = packed({1, 2, 37, 130, 64}, 4, 2, 32, 51);
  const Result r = run<float>(p), ref = reference(p);
  expect_matches(r, ref, 1e-4);
  const auto p128 = packed({200, 90}, 4, 1, 128, 52);
  expect_matches(run<float>(p128), reference(p128), 1e-4);
}

TEST(Attention, ShapeErrorsThrow) {
  View3<double> q("q", 8, 4, 16), k("k", 8, 2, 16), v("v", 8, 2, 16), out("out", 8, 4, 16);
  View3<double> k3("k3", 8, 3, 16), vD("vD", 8, 2, 8);
  View2<double> lse("lse", 4, 8), lse_bad("lse_bad", 8, 4);
  View1<std::int32_t> lo("lo", 8), hi("hi", 8), hi7("hi7", 7);
  EXPECT_THROW(attention_forward(q, k, v, lo, hi, 0.25, out, lse_bad), std::invalid_argument);
  EXPECT_THROW(attention_forward(q, k3, k3, lo, hi, 0.25, out, lse), std::invalid_argument);
  EXPECT_THROW(attention_forward(q, k, vD, lo, hi, 0.25, out, lse), std::invalid_argument);
  EXPECT_THROW(attention_forward(q, k, v, lo, hi7, 0.25, out, lse), std::invalid_argument);
  EXPECT_NO_THROW(attention_forward(q, k, v, lo, hi, 0.25, out, lse));
}

// Tile shapes per execution space (attention/tiled.hpp): on a GPU every fp32
// kernel's team scratch for D <= 64 and D = 128 must fit the default 48 KiB
// per team (on-chip level 0); on the host the 64 × 64 tiles may use any amount.
TEST(Attention, TilesFitTheTeamScratchOfTheSpace) {
  const AttentionTiles t64 = attention_tiles<float>(64);
  EXPECT_GT(t64.forward_bytes, 0u);
  EXPECT_GE(t64.dq_bytes, t64.forward_bytes);
  EXPECT_EQ(t64.queries % 4, 0);
  EXPECT_EQ(t64.keys % 8, 0);
#if defined(KOKKOS_ENABLE_CUDA)
  if (std::is_same<wlb::ExecSpace, Kokkos::Cuda>::value) {
    // The budget is this GPU's level-0 maximum as Kokkos reports it (Kokkos
    // >= 4.6: 48 KiB less a team-reduction reserve), capped at 48 KiB: every
    // fp32 kernel must fit it, i.e. none falls back to global memory.
    const std::size_t limit = std::min<std::size_t>(48 * 1024, t64.level0_max_bytes);
    EXPECT_EQ(t64.queries, 32);
    EXPECT_EQ(t64.keys, limit >= 48 * 1024 ? 16 : 8);
    EXPECT_LE(t64.forward_bytes, limit);
    EXPECT_LE(t64.dkdv_bytes, limit);
    EXPECT_LE(t64.dq_bytes, limit);
    const AttentionTiles t128 = attention_tiles<float>(128);  // Llama's head dim: smaller tiles
    EXPECT_EQ(t128.queries, 16);
    EXPECT_EQ(t128.keys, 8);
    EXPECT_LE(t128.forward_bytes, limit);
    EXPECT_LE(t128.dkdv_bytes, limit);
    EXPECT_LE(t128.dq_bytes, limit);
    return;
  }
#endif
  EXPECT_EQ(t64.queries, 64);
  EXPECT_EQ(t64.keys, 64);
  const AttentionTiles t128 = attention_tiles<float>(128);  // the host keeps 64 x 64 at every head dim
  EXPECT_EQ(t128.queries, 64);
  EXPECT_EQ(t128.keys, 64);
}

// The CUDA tile shapes (tiled.hpp) run here on the host execution space
// through the test hook: the same kernel code as on the GPU, at tile sizes
// the host never takes itself. Documents of length 1, shorter than a key tile,
// exactly one, longer than a query tile and than two, empty rows, GQA 2 and 4,
// head dims that need no padding (64, 128) and one that does (24).
TEST(Attention, CudaTileShapesOnTheHostMatchReference) {
  for (const tiled::Shape s : tiled::kCudaTiles)
    for (int D : {64, 128, 24})
      for (int ratio : {2, 4}) {
        Problem p = packed({1, 5, 8, 1, 17, 33, 70, 2}, 2 * ratio, 2, D, unsigned(300 + D + ratio));
        for (int i : {2, 40, 136}) {  // empty rows inside documents
          p.lo[i] = i + 1;
          p.hi[i] = i;
        }
        SCOPED_TRACE(std::to_string(s.bq) + " x " + std::to_string(s.bk) + " tiles, D=" + std::to_string(D) +
                     " Hq/Hkv=" + std::to_string(ratio));
        const Result ref = reference(p);
        expect_matches(run<double>(p, true, s), ref, 1e-12);
        expect_matches(run<float>(p, true, s), ref, 1e-4);
      }
  EXPECT_EQ(tiled::tiles_for<float>(128), tiled::kHostTiles);  // the host's own choice is untouched
  EXPECT_THROW(run<float>(packed({4}, 1, 1, 8, 1), true, tiled::Shape{8, 8}), std::invalid_argument);
}

// Team scratch of the CUDA shapes, computed here by the function the kernels
// size their scratch with: every fp32 kernel at D = 64 and D = 128 fits the
// 48 KiB a CUDA block gets without an opt-in (so level-0, on-chip scratch);
// D = 64 keeps 32 x 16, and at D = 128 that shape would not fit (the reason
// for the second shape). The table is the one in kokkos_tiled.cpp's comment.
TEST(Attention, CudaTileShapesFitLevel0Scratch) {
  const std::size_t budget = 48 * 1024;
  EXPECT_EQ(tiled::kCudaScratchBudget, budget);
  auto kib = [](std::size_t b) { return double(b) / 1024.0; };
  for (const tiled::Shape s : tiled::kCudaTiles)
    for (int D : {64, 128}) {
      const tiled::ScratchBytes f = tiled::scratch_bytes<float>(s, D), d = tiled::scratch_bytes<double>(s, D);
      std::printf("  %2d x %2d tiles, D=%3d: fp32 forward %.1f dK/dV %.1f dQ %.1f KiB | "
                  "fp64 forward %.1f dK/dV %.1f dQ %.1f KiB\n",
                  s.bq, s.bk, D, kib(f.forward), kib(f.dkdv), kib(f.dq), kib(d.forward), kib(d.dkdv), kib(d.dq));
    }
  for (int D : {64, 128}) {
    const tiled::Shape s = tiled::cuda_tiles<float>(D);
    const tiled::ScratchBytes b = tiled::scratch_bytes<float>(s, D);
    SCOPED_TRACE("D=" + std::to_string(D) + ": " + std::to_string(s.bq) + " x " + std::to_string(s.bk));
    EXPECT_LE(b.forward, budget);
    EXPECT_LE(b.dkdv, budget);
    EXPECT_LE(b.dq, budget);
  }
  EXPECT_EQ(tiled::cuda_tiles<float>(64), (tiled::Shape{32, 16}));
  EXPECT_NE(tiled::cuda_tiles<float>(128), (tiled::Shape{32, 16}));
  EXPECT_GT(tiled::scratch_bytes<float>(tiled::Shape{32, 16}, 128).max(), budget);
  // Kokkos >= 4.6 reports scratch_size_max(0) = 48 KiB minus its worst-case
  // team-reduction reserve ((1024 + 2) * 8 + 8 bytes) = 40936 on such a GPU,
  // and scratch_level() compares with that: D = 128 fits it too.
  EXPECT_LE(tiled::scratch_bytes<float>(tiled::cuda_tiles<float>(128), 128).max(), std::size_t(40936));
  // Under that budget D = 64 takes 32 x 8 rather than running 32 x 16's dQ
  // kernel in level 1; every fp32 kernel at D = 64 and 128 fits it.
  const std::size_t kokkos46 = 40936;
  EXPECT_GT(tiled::scratch_bytes<float>(tiled::Shape{32, 16}, 64).max(), kokkos46);
  EXPECT_EQ(tiled::cuda_tiles<float>(64, kokkos46), (tiled::Shape{32, 8}));
  for (int D : {64, 128})
    EXPECT_LE(tiled::scratch_bytes<float>(tiled::cuda_tiles<float>(D, kokkos46), D).max(), kokkos46) << "D=" << D;
}

TEST(Attention, FlopCount) {
  Kokkos::View<std::int32_t*, wlb::Layout, wlb::HostSpace> lo("lo", 10), hi("hi", 10);
  for (int i = 0; i < 10; ++i) {  // documents of 4 and 6 tokens, causal
    lo(i) = i < 4 ? 0 : 4;
    hi(i) = i;
  }
  const double pairs = 4 * 5 / 2 + 6 * 7 / 2;
  EXPECT_DOUBLE_EQ(attention_flops_forward(lo, hi, 10, 8, 64), 4.0 * 64 * 8 * pairs);
  EXPECT_DOUBLE_EQ(attention_flops_forward_backward(lo, hi, 10, 8, 64), 3.5 * 4.0 * 64 * 8 * pairs);
  hi(9) = 100;  // clamped to S-1 = 9: same count
  EXPECT_DOUBLE_EQ(attention_flops_forward(lo, hi, 10, 8, 64), 4.0 * 64 * 8 * pairs);
}

// ------------------------------------------------------------ micro-timing --

/// Prints fwd / bwd GFLOP/s (FA-2 convention: bwd = 2.5 × fwd FLOPs) for one
/// packed batch. Informational only (the kernel's speed
/// target is not asserted here).
template <class Scalar>
void time_case(const char* label, const std::vector<int>& lens, int H, int D, int reps) {
  const Problem p = packed(lens, H, H, D, 61);
  auto q = to_view3<Scalar>(p.q, p.T, p.Hq, p.D, "q");
  auto k = to_view3<Scalar>(p.k, p.S, p.Hkv, p.D, "k");
  auto v = to_view3<Scalar>(p.v, p.S, p.Hkv, p.D, "v");
  auto dout = to_view3<Scalar>(p.dout, p.T, p.Hq, p.D, "dout");
  auto lo = to_view1(p.lo, "kv_lo"), hi = to_view1(p.hi, "kv_hi");
  View3<Scalar> out("out", p.T, p.Hq, p.D), dq("dq", p.T, p.Hq, p.D), dk("dk", p.S, p.Hkv, p.D),
      dv("dv", p.S, p.Hkv, p.D);
  View2<Scalar> lse("lse", p.Hq, p.T);
  const Scalar scale = Scalar(p.scale);
  // Best of `reps`, wall clock after Kokkos::fence(); the process CPU time is
  // printed too because the 2 CI cores are shared (other builds inflate wall
  // time but not CPU time on the Serial backend).
  double tf = 1e30, tb = 1e30, cf = 1e30, cb = 1e30;
  for (int r = 0; r < reps; ++r) {
    Kokkos::fence();
    Kokkos::Timer timer;
    std::clock_t c0 = std::clock();
    attention_forward(q, k, v, lo, hi, scale, out, lse);
    Kokkos::fence();
    tf = std::min(tf, timer.seconds());
    cf = std::min(cf, double(std::clock() - c0) / CLOCKS_PER_SEC);
    timer.reset();
    c0 = std::clock();
    attention_backward(q, k, v, out, dout, lse, lo, hi, scale, dq, dk, dv);
    Kokkos::fence();
    tb = std::min(tb, timer.seconds());
    cb = std::min(cb, double(std::clock() - c0) / CLOCKS_PER_SEC);
  }
  auto hlo = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), lo);
  auto hhi = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), hi);
  const double ff = attention_flops_forward(hlo, hhi, p.S, p.Hq, p.D);
  const double fb = kAttentionBackwardFlopFactor * ff;
  std::printf("  [timing %s, %s, T=%d H=%d D=%d] wall: fwd %.1f ms %.1f GFLOP/s | bwd %.1f ms "
              "%.1f GFLOP/s | fwd+bwd %.1f GFLOP/s; cpu-time: fwd+bwd %.1f GFLOP/s\n",
              label, sizeof(Scalar) == 4 ? "fp32" : "fp64", p.T, H, D, tf * 1e3, ff / tf * 1e-9,
              tb * 1e3, fb / tb * 1e-9, (ff + fb) / (tf + tb) * 1e-9, (ff + fb) / (cf + cb) * 1e-9);
}

TEST(Attention, MicroTimingPrinted) {
  time_case<float>("1 x 1024", {1024}, 4, 64, 5);
  time_case<float>("16 x 64", std::vector<int>(16, 64), 4, 64, 5);
  time_case<double>("1 x 1024", {1024}, 4, 64, 3);
  SUCCEED();
}

}  // namespace
