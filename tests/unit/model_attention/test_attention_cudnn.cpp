// cuDNN's fused attention (model.attention_kernel = cudnn) against the portable
// kernel's fp32 reference, forward and backward, on variable-length document
// batches: length-1 documents, CP shards of documents (bottom-right causal),
// an empty CP shard, T = 1, GQA, head dims 64 and 128. Label gpu: built on
// CUDA + cuDNN builds only and run on a GPU.
//
// Tolerance, derived (not tuned). Both kernels get the same bf16-rounded
// q, k, v, dout, so the products q·k are exact in fp32 on both sides and only
// what cuDNN rounds to bf16 inside differs, each rounding a relative error of
// at most u = 2^-8 (bf16 keeps 8 significant bits; round to nearest):
//   out_i  = Σ_j P_ij v_j / l_i with P cast to bf16 for the P·V product, then
//            out rounded to bf16:  |Δout_id| <= u Σ_j P_ij |v_jd| + u |out_id|
//   dv_j   = Σ_i P_ij dout_i, P cast to bf16, dv rounded, summed over the
//            entries holding j:     |Δdv_jd| <= 2u Σ_i P_ij |dout_id|
//   dS_ij  = P_ij (dP_ij - D_i), D_i = Σ_d dout_id out_id from a bf16 out:
//            |ΔD_i| <= u Σ_d |dout_id out_id|, dS cast to bf16:
//            |ΔdS_ij| <= u |dS_ij| + P_ij |ΔD_i|
//   dq_i   = scale Σ_j dS_ij k_j, rounded:  |Δdq_id| <= scale Σ_j |ΔdS_ij||k_jd| + u |dq_id|
//   dk_j   = scale Σ_i dS_ij q_i per entry, each entry's part rounded, then
//            summed over the entries holding j (a CP shard holding two chunks
//            of one document has two; their parts may cancel, so the rounding
//            term is u Σ_e |dk_e| <= u scale Σ_i |dS_ij||q_id|, not u |dk_jd|):
//            |Δdk_jd| <= scale Σ_i (|ΔdS_ij| + u |dS_ij|) |q_id|
//   lse_i  only fp32 summation order and exp: |Δlse| <= 2^-16 (1 + |lse|)
// The sums are formed in fp64 on the host from the same inputs (an independent
// naive attention); each bound is doubled for the fp32 accumulations on both
// sides (2^-24 per term, far below u) and the order of the terms.
#include "wlb4d/core/attention_kernel.hpp"
#include "wlb4d/core/bf16.hpp"
#include "wlb4d/model/attention.hpp"

#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

using namespace wlb;
using namespace wlb::model;

namespace {

constexpr double kU = 1.0 / 256;  // bf16 unit roundoff (2^-8)

struct Case {
  std::string name;
  std::vector<int> lens;  // document lengths of the packed micro-batch (S = their sum)
  int cp = 1, rank = 0;   // per-sequence CP sharding: this rank's chunks r and 2cp-1-r
  int hq = 4, hkv = 4, d = 64;
  int only_query = -1;    // >= 0: T = 1, this one query position
  bool empty = false;     // an empty CP shard: T = 0
};

struct Host {
  int T = 0, S = 0, hq = 0, hkv = 0, d = 0;
  std::vector<int> lo, hi;
  std::vector<float> q, k, v, dout;  // bf16-rounded values
  float scale = 0;
};

Host make(const Case& c, unsigned seed) {
  Host h;
  h.hq = c.hq;
  h.hkv = c.hkv;
  h.d = c.d;
  std::vector<int> cu{0};
  for (int l : c.lens) cu.push_back(cu.back() + l);
  h.S = cu.back();
  std::vector<int> pos;
  if (c.only_query >= 0) {
    pos.push_back(c.only_query);
  } else if (!c.empty) {
    for (int ch : {c.rank, 2 * c.cp - 1 - c.rank}) {
      if (c.cp == 1 && ch == 1) break;  // no CP: chunk 0 is everything
      const int n = c.cp == 1 ? 1 : 2 * c.cp;
      for (int i = h.S * ch / n; i < h.S * (ch + 1) / n; ++i) pos.push_back(i);
    }
  }
  h.T = static_cast<int>(pos.size());
  for (int p : pos) {
    const int doc = static_cast<int>(std::upper_bound(cu.begin(), cu.end(), p) - cu.begin()) - 1;
    h.lo.push_back(cu[doc]);
    h.hi.push_back(p);
  }
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& x, std::size_t n) {
    x.resize(n);
    for (auto& e : x) e = core::round_to_bf16(nd(rng));
  };
  fill(h.q, std::size_t(h.T) * h.hq * h.d);
  fill(h.k, std::size_t(h.S) * h.hkv * h.d);
  fill(h.v, std::size_t(h.S) * h.hkv * h.d);
  fill(h.dout, std::size_t(h.T) * h.hq * h.d);
  h.scale = 1.0f / std::sqrt(static_cast<float>(h.d));
  return h;
}

template <class T>
View3<T> dev3(const std::vector<float>& x, int a, int b, int c) {
  View3<T> v("t", a, b, c);
  auto m = Kokkos::create_mirror_view(v);
  for (int i = 0; i < a; ++i)
    for (int j = 0; j < b; ++j)
      for (int l = 0; l < c; ++l) m(i, j, l) = x[(std::size_t(i) * b + j) * c + l];
  Kokkos::deep_copy(v, m);
  return v;
}
std::vector<float> host3(const View3<float>& v) {
  auto m = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<float>(m.data(), m.data() + m.size());
}
std::vector<float> host2(const View2<float>& v) {
  auto m = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<float>(m.data(), m.data() + m.size());
}

struct Result {
  std::vector<float> out, lse, dq, dk, dv;
};

// Forward and backward with the kernel `kernel`; the backward gets `out_for_bwd`
// when given (cuDNN's bf16-valued out for both kernels), else its own forward's out.
Result run(const Host& h, const std::string& kernel, const std::vector<float>* out_for_bwd) {
  select_attention_kernel(kernel, h.d, "bf16");
  auto q = dev3<float>(h.q, h.T, h.hq, h.d);
  auto k = dev3<float>(h.k, h.S, h.hkv, h.d);
  auto v = dev3<float>(h.v, h.S, h.hkv, h.d);
  auto dout = dev3<float>(h.dout, h.T, h.hq, h.d);
  View1<std::int32_t> lo("lo", h.T), hi("hi", h.T);
  {
    auto ml = Kokkos::create_mirror_view(lo);
    auto mh = Kokkos::create_mirror_view(hi);
    for (int i = 0; i < h.T; ++i) {
      ml(i) = h.lo[i];
      mh(i) = h.hi[i];
    }
    Kokkos::deep_copy(lo, ml);
    Kokkos::deep_copy(hi, mh);
  }
  View3<float> out("out", h.T, h.hq, h.d), dq("dq", h.T, h.hq, h.d), dk("dk", h.S, h.hkv, h.d),
      dv("dv", h.S, h.hkv, h.d);
  View2<float> lse("lse", h.hq, h.T);
  attention_forward<float>(q, k, v, lo, hi, h.scale, out, lse);
  Result r;
  r.out = host3(out);
  r.lse = host2(lse);
  View3<float> ob = out_for_bwd ? dev3<float>(*out_for_bwd, h.T, h.hq, h.d) : out;
  attention_backward<float>(q, k, v, ob, dout, lse, lo, hi, h.scale, dq, dk, dv);
  r.dq = host3(dq);
  r.dk = host3(dk);
  r.dv = host3(dv);
  select_attention_kernel("portable", h.d, "fp32");
  return r;
}

// The derived bounds (file comment) from a naive fp64 attention on the host.
struct Bounds {
  std::vector<double> out, dq, dk, dv;
};
Bounds bounds(const Host& h, const Result& ref) {
  const int G = h.hq / h.hkv, D = h.d;
  Bounds b;
  b.out.assign(ref.out.size(), 0);
  b.dq.assign(ref.dq.size(), 0);
  b.dk.assign(ref.dk.size(), 0);
  b.dv.assign(ref.dv.size(), 0);
  auto Q = [&](int i, int hh, int e) { return double(h.q[(std::size_t(i) * h.hq + hh) * D + e]); };
  auto K = [&](int j, int g, int e) { return double(h.k[(std::size_t(j) * h.hkv + g) * D + e]); };
  auto V = [&](int j, int g, int e) { return double(h.v[(std::size_t(j) * h.hkv + g) * D + e]); };
  auto dO = [&](int i, int hh, int e) { return double(h.dout[(std::size_t(i) * h.hq + hh) * D + e]); };
  for (int hh = 0; hh < h.hq; ++hh) {
    const int g = hh / G;
    for (int i = 0; i < h.T; ++i) {
      const int lo = std::max(h.lo[i], 0), hi = std::min(h.hi[i], h.S - 1);
      if (lo > hi) continue;
      std::vector<double> s(hi - lo + 1), p(hi - lo + 1);
      double mx = -1e300;
      for (int j = lo; j <= hi; ++j) {
        double x = 0;
        for (int e = 0; e < D; ++e) x += Q(i, hh, e) * K(j, g, e);
        s[j - lo] = x * h.scale;
        mx = std::max(mx, s[j - lo]);
      }
      double l = 0;
      for (auto& x : s) l += std::exp(x - mx);
      std::vector<double> o(D, 0.0);
      for (int j = lo; j <= hi; ++j) {
        p[j - lo] = std::exp(s[j - lo] - mx) / l;
        for (int e = 0; e < D; ++e) o[e] += p[j - lo] * V(j, g, e);
      }
      double Di = 0, dD = 0;
      for (int e = 0; e < D; ++e) {
        Di += dO(i, hh, e) * o[e];
        dD += std::abs(dO(i, hh, e) * o[e]);
      }
      dD *= kU;  // |ΔD_i|
      for (int e = 0; e < D; ++e) {
        double pv = 0;
        for (int j = lo; j <= hi; ++j) pv += p[j - lo] * std::abs(V(j, g, e));
        b.out[(std::size_t(i) * h.hq + hh) * D + e] += kU * pv + kU * std::abs(o[e]);
      }
      for (int j = lo; j <= hi; ++j) {
        const double P = p[j - lo];
        double dp = 0;
        for (int e = 0; e < D; ++e) dp += dO(i, hh, e) * V(j, g, e);
        const double dS = P * (dp - Di);
        const double ddS = kU * std::abs(dS) + P * dD;
        for (int e = 0; e < D; ++e) {
          b.dv[(std::size_t(j) * h.hkv + g) * D + e] += 2 * kU * P * std::abs(dO(i, hh, e));
          b.dq[(std::size_t(i) * h.hq + hh) * D + e] += h.scale * ddS * std::abs(K(j, g, e));
          b.dk[(std::size_t(j) * h.hkv + g) * D + e] += h.scale * (ddS + kU * std::abs(dS)) * std::abs(Q(i, hh, e));
        }
      }
    }
  }
  for (std::size_t x = 0; x < b.dq.size(); ++x) b.dq[x] += kU * std::abs(ref.dq[x]);
  for (auto* v : {&b.out, &b.dq, &b.dk, &b.dv})
    for (auto& x : *v) x = 2 * x + 1e-6;
  return b;
}

void expect_within(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                   const std::vector<double>& tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (std::size_t x = 0; x < got.size(); ++x) {
    const double err = std::abs(double(got[x]) - double(want[x]));
    if (!(err <= tol[x]) && bad++ < 5)
      ADD_FAILURE() << what << "[" << x << "]: cudnn " << got[x] << " reference " << want[x] << " error " << err
                    << " > bound " << tol[x];
  }
  EXPECT_EQ(bad, 0) << what << ": elements beyond the bf16 bound";
}

void check_case(const Case& c) {
  SCOPED_TRACE(c.name);
  const Host h = make(c, 1234);
  const Result cud = run(h, "cudnn", nullptr);
  // The reference runs its backward from cuDNN's out (bf16-valued), as cuDNN does.
  const Result ref = run(h, "portable", &cud.out);
  const Bounds b = bounds(h, ref);
  expect_within("out", cud.out, ref.out, b.out);
  std::vector<double> tl(ref.lse.size());
  for (std::size_t x = 0; x < tl.size(); ++x)
    tl[x] = std::isinf(ref.lse[x]) ? 0.0 : std::ldexp(1.0, -16) * (1 + std::abs(ref.lse[x]));
  for (std::size_t x = 0; x < tl.size(); ++x)
    if (std::isinf(ref.lse[x])) {
      EXPECT_TRUE(std::isinf(cud.lse[x]) && cud.lse[x] < 0) << "lse of a row with no key: " << cud.lse[x];
    }
  std::vector<float> cl = cud.lse, rl = ref.lse;
  for (std::size_t x = 0; x < tl.size(); ++x)
    if (std::isinf(rl[x])) cl[x] = rl[x] = 0;
  expect_within("lse", cl, rl, tl);
  expect_within("dq", cud.dq, ref.dq, b.dq);
  expect_within("dk", cud.dk, ref.dk, b.dk);
  expect_within("dv", cud.dv, ref.dv, b.dv);
  // Deterministic backward: a rerun gives the same bits, unless cuDNN refused
  // the deterministic algorithm for this graph (a warning names it; e.g.
  // ragged layouts on sm_8x/sm_12x with cuDNN >= 9.18.1).
  const Result again = run(h, "cudnn", nullptr);
  if (attention_nondeterministic_graphs() > 0) {
    std::printf("%s: cuDNN built a non-deterministic backward (%lld graph(s) so far): no bitwise rerun check\n",
                c.name.c_str(), static_cast<long long>(attention_nondeterministic_graphs()));
    return;
  }
  EXPECT_EQ(again.dq, cud.dq) << "dq differs between two runs";
  EXPECT_EQ(again.dk, cud.dk) << "dk differs between two runs";
  EXPECT_EQ(again.dv, cud.dv) << "dv differs between two runs";
}

}  // namespace

TEST(AttentionCudnn, BuiltAndSelectable) {
  ASSERT_TRUE(core::cudnn_attention_built());
  EXPECT_EQ(select_attention_kernel("cudnn", 128, "bf16").kernel, "cudnn");
  EXPECT_NE(attention_summary().find("cuDNN"), std::string::npos) << attention_summary();
  select_attention_kernel("portable", 128, "fp32");
}

TEST(AttentionCudnn, VariableLengthDocumentsAgainstThePortableKernel) {
  const std::vector<int> docs = {1, 37, 1, 1, 130, 64, 9, 1, 100};
  for (int d : {64, 128})
    for (auto heads : {std::pair<int, int>{4, 4}, std::pair<int, int>{8, 2}}) {
      const std::string tag = " d=" + std::to_string(d) + " hq=" + std::to_string(heads.first) +
                              " hkv=" + std::to_string(heads.second);
      check_case({"packed documents" + tag, docs, 1, 0, heads.first, heads.second, d});
      check_case({"cp=2 rank 0" + tag, docs, 2, 0, heads.first, heads.second, d});
      check_case({"cp=2 rank 1" + tag, docs, 2, 1, heads.first, heads.second, d});
      check_case({"cp=3 rank 1" + tag, docs, 3, 1, heads.first, heads.second, d});
      check_case({"T = 1" + tag, docs, 1, 0, heads.first, heads.second, d, 200});
      check_case({"one length-1 document" + tag, {1}, 1, 0, heads.first, heads.second, d});
      check_case({"empty CP shard" + tag, docs, 2, 0, heads.first, heads.second, d, -1, true});
      // One long document over cp=2: rank 0 holds chunks 0 and 3, so keys of
      // chunk 0 are in two batch entries and their dK/dV parts are summed.
      check_case({"one document, cp=2 rank 0" + tag, {300}, 2, 0, heads.first, heads.second, d});
      check_case({"one document, cp=3 rank 1" + tag, {300}, 3, 1, heads.first, heads.second, d});
    }
}
