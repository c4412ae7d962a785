// Document-masked FlashAttention-2 forward and backward (wlb::model).
// Counter "GFLOPs" = FLOPs / time with the FA-2 convention: forward 4·D·Hq·(allowed
// (i, j) pairs), backward 2.5 × forward (the kernel itself recomputes S and dP once
// more, 7 tile matmuls instead of 5, to stay atomic-free).
// Args: (number of documents, tokens per document, heads, head dim).
#include "wlb4d/model/attention.hpp"

#include <KokkosBlas3_gemm.hpp>
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <string>

namespace {

struct Case {
  wlb::View3<float> q, k, v, out, dout, dq, dk, dv;
  wlb::View2<float> lse;
  wlb::IntVec lo, hi;
  float scale = 1.0f;
  double flops_fwd = 0;

  Case(int docs, int len, int H, int D) {
    const int T = docs * len;
    q = wlb::View3<float>(std::string("q"), T, H, D);
    k = wlb::View3<float>(std::string("k"), T, H, D);
    v = wlb::View3<float>(std::string("v"), T, H, D);
    dout = wlb::View3<float>(std::string("dout"), T, H, D);
    out = wlb::View3<float>(std::string("out"), T, H, D);
    dq = wlb::View3<float>(std::string("dq"), T, H, D);
    dk = wlb::View3<float>(std::string("dk"), T, H, D);
    dv = wlb::View3<float>(std::string("dv"), T, H, D);
    lse = wlb::View2<float>(std::string("lse"), H, T);
    lo = wlb::IntVec(std::string("kv_lo"), T);
    hi = wlb::IntVec(std::string("kv_hi"), T);
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto* x : {&q, &k, &v, &dout}) {
      auto h = Kokkos::create_mirror_view(*x);
      for (std::size_t n = 0; n < h.span(); ++n) h.data()[n] = nd(rng);
      Kokkos::deep_copy(*x, h);
    }
    auto hlo = Kokkos::create_mirror_view(lo);
    auto hhi = Kokkos::create_mirror_view(hi);
    for (int i = 0; i < T; ++i) {  // document-causal mask of a packed batch
      hlo(i) = i / len * len;
      hhi(i) = i;
    }
    Kokkos::deep_copy(lo, hlo);
    Kokkos::deep_copy(hi, hhi);
    scale = 1.0f / std::sqrt(float(D));
    flops_fwd = wlb::model::attention_flops_forward(hlo, hhi, T, H, D);
  }
  void forward() { wlb::model::attention_forward(q, k, v, lo, hi, scale, out, lse); }
  void backward() {
    wlb::model::attention_backward(q, k, v, out, dout, lse, lo, hi, scale, dq, dk, dv);
  }
};

Case make_case(const benchmark::State& st) {
  return Case(int(st.range(0)), int(st.range(1)), int(st.range(2)), int(st.range(3)));
}

void BM_attention_fwd(benchmark::State& st) {
  Case c = make_case(st);
  for (auto _ : st) {
    c.forward();
    Kokkos::fence();
  }
  st.counters["GFLOPs"] =
      benchmark::Counter(c.flops_fwd * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_attention_bwd(benchmark::State& st) {
  Case c = make_case(st);
  c.forward();
  for (auto _ : st) {
    c.backward();
    Kokkos::fence();
  }
  st.counters["GFLOPs"] = benchmark::Counter(
      wlb::model::kAttentionBackwardFlopFactor * c.flops_fwd * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate);
}

void BM_attention_fwd_bwd(benchmark::State& st) {
  Case c = make_case(st);
  for (auto _ : st) {
    c.forward();
    c.backward();
    Kokkos::fence();
  }
  st.counters["GFLOPs"] = benchmark::Counter(
      (1.0 + wlb::model::kAttentionBackwardFlopFactor) * c.flops_fwd * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate);
}

// The SGEMM reference at the attention's shapes, measured by the same binary
// in the same run: the two products of the forward for the full,
// unmasked T × T score matrix of one head, S = Q·Kᵀ (T × T × D, "N","T") and
// O = P·V (T × D × T, "N","N"), through KokkosBlas::gemm (the BLAS). Args (T, D).
// scripts/bench.sh divides BM_attention_fwd_bwd's rate by this one at the same D.
void BM_sgemm_attn_shapes(benchmark::State& st) {
  const int T = int(st.range(0)), D = int(st.range(1));
  wlb::Mat q("q", T, D), k("k", T, D), s("s", T, T), o("o", T, D);
  Kokkos::deep_copy(q, 0.01f);
  Kokkos::deep_copy(k, 0.02f);
  Kokkos::deep_copy(s, 0.03f);
  for (auto _ : st) {
    KokkosBlas::gemm("N", "T", 1.0f, q, k, 0.0f, s);
    KokkosBlas::gemm("N", "N", 1.0f, s, k, 0.0f, o);
    Kokkos::fence();
  }
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * 2.0 * T * T * D * 1e-9,
                                             benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_sgemm_attn_shapes)->Args({1024, 64})->Args({1024, 128})->Unit(benchmark::kMillisecond)
    ->UseRealTime();
// One 1024-token document vs 16 documents of 64 (same tokens, 1/16 of the pairs).
#define WLB4D_ATTN_ARGS ->Args({1, 1024, 4, 64})->Args({16, 64, 4, 64})->Args({1, 1024, 4, 128})
BENCHMARK(BM_attention_fwd) WLB4D_ATTN_ARGS->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_attention_bwd) WLB4D_ATTN_ARGS->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_attention_fwd_bwd) WLB4D_ATTN_ARGS->Unit(benchmark::kMillisecond)->UseRealTime();
