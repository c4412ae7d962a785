// Document-masked FlashAttention-2 forward and backward (wlb::model).
// Counter "GFLOPs" = FLOPs / time with the FA-2 convention: forward 4·D·Hq·(allowed
// (i, j) pairs), backward 2.5 × forward (the kernel itself recomputes S and dP once
// more, 7 tile matmuls instead of 5, to stay atomic-free).
// Args: (number of documents, tokens per document, heads, head dim).
//
// BM_attention_lengths: one packed micro-batch of T tokens whose documents'
// lengths are drawn (seeded) from a length sample: WLB4D_BENCH_LENGTHS, else
// the source tree's inputs/dist/dist_prolong.json (DistCA's ProLong sample);
// a document longer than what is left of T is cut, as the fixed packer
// does. Args (T, Hq, Hkv, D, kernel): kernel 0 is the portable kernel, 1
// cuDNN's fused SDPA (model.attention_kernel = cudnn; skipped on a build
// without it), measured side by side in one run. Counters: TFLOPs (forward +
// backward, pairs counted per document), first_call_ms (the untimed first
// forward + backward: with cuDNN it builds the graphs, so it less the
// per-iteration time is the plan build cost) and, with WLB4D_PEAK_TFLOPS set
// (the device's dense bf16 peak), peak_share = TFLOPs / peak.
#include "wlb4d/balance/doc_source.hpp"
#include "wlb4d/core/attention_kernel.hpp"
#include "wlb4d/model/attention.hpp"

#include <KokkosBlas3_gemm.hpp>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

struct Case {
  wlb::View3<float> q, k, v, out, dout, dq, dk, dv;
  wlb::View2<float> lse;
  wlb::IntVec lo, hi;
  float scale = 1.0f;
  double flops_fwd = 0;

  Case(int docs, int len, int H, int D) : Case(std::vector<int>(std::size_t(docs), len), H, H, D) {}

  // Documents of `lens` tokens packed back to back; Hq query heads over Hkv
  // key/value heads (GQA).
  Case(const std::vector<int>& lens, int Hq, int Hkv, int D) {
    int T = 0;
    for (int l : lens) T += l;
    q = wlb::View3<float>(std::string("q"), T, Hq, D);
    k = wlb::View3<float>(std::string("k"), T, Hkv, D);
    v = wlb::View3<float>(std::string("v"), T, Hkv, D);
    dout = wlb::View3<float>(std::string("dout"), T, Hq, D);
    out = wlb::View3<float>(std::string("out"), T, Hq, D);
    dq = wlb::View3<float>(std::string("dq"), T, Hq, D);
    dk = wlb::View3<float>(std::string("dk"), T, Hkv, D);
    dv = wlb::View3<float>(std::string("dv"), T, Hkv, D);
    lse = wlb::View2<float>(std::string("lse"), Hq, T);
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
    for (int d = 0, start = 0; d < int(lens.size()); start += lens[d++])
      for (int i = start; i < start + lens[d]; ++i) {  // document-causal mask of a packed batch
        hlo(i) = start;
        hhi(i) = i;
      }
    Kokkos::deep_copy(lo, hlo);
    Kokkos::deep_copy(hi, hhi);
    scale = 1.0f / std::sqrt(float(D));
    flops_fwd = wlb::model::attention_flops_forward(hlo, hhi, T, Hq, D);
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

#ifndef WLB4D_BENCH_DEFAULT_LENGTHS
#define WLB4D_BENCH_DEFAULT_LENGTHS "inputs/dist/dist_prolong.json"
#endif

// T tokens of documents drawn from the length sample (file comment), seed 1.
std::vector<int> sampled_lengths(int T) {
  const char* env = std::getenv("WLB4D_BENCH_LENGTHS");
  const std::string path = env && *env ? env : WLB4D_BENCH_DEFAULT_LENGTHS;
  const std::vector<std::int64_t> sample = wlb::balance::load_lengths_json(path);
  std::mt19937_64 g(1);
  std::vector<int> lens;
  for (int left = T; left > 0;) {
    const int l = int(std::min<std::int64_t>(sample[g() % sample.size()], left));
    lens.push_back(l);
    left -= l;
  }
  return lens;
}

void BM_attention_lengths(benchmark::State& st) {
  const int T = int(st.range(0)), Hq = int(st.range(1)), Hkv = int(st.range(2)), D = int(st.range(3));
  const bool cudnn = st.range(4) == 1;
  if (cudnn && !wlb::core::cudnn_attention_built()) {
    st.SkipWithError("this build has no cuDNN attention (-DWLB4D_ENABLE_CUDNN=ON)");
    return;
  }
  const std::vector<int> lens = sampled_lengths(T);
  wlb::model::select_attention_kernel(cudnn ? "cudnn" : "portable", D, cudnn ? "bf16" : "fp32");
  Case c(lens, Hq, Hkv, D);
  // The first call builds and caches cuDNN's graphs, outside the timed loop;
  // first_call_ms minus the per-iteration time is what building them cost.
  const auto w0 = std::chrono::steady_clock::now();
  c.forward();
  c.backward();
  Kokkos::fence();
  const double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count();
  const double flops = (1.0 + wlb::model::kAttentionBackwardFlopFactor) * c.flops_fwd;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : st) {
    c.forward();
    c.backward();
    Kokkos::fence();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  wlb::model::select_attention_kernel("portable", D, "fp32");
  const double tflops = secs > 0 ? flops * double(st.iterations()) / secs * 1e-12 : 0.0;
  st.counters["TFLOPs"] = tflops;
  st.counters["docs"] = double(lens.size());
  st.counters["first_call_ms"] = first_ms;
  if (const char* peak = std::getenv("WLB4D_PEAK_TFLOPS"); peak && std::atof(peak) > 0)
    st.counters["peak_share"] = tflops / std::atof(peak);
  st.SetLabel(cudnn ? "cudnn" : "portable");
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
// ProLong-length documents in one micro-batch, bench-1b-8k's heads (16 over 8,
// D = 128) and Llama-3.2-1B's (32 over 8, D = 64); portable, then cuDNN.
// The 8192-token rows are for a GPU (scripts/gpu-bundle/gpu-check.sh):
// filter with --benchmark_filter on a CPU.
BENCHMARK(BM_attention_lengths)
    ->ArgNames({"T", "Hq", "Hkv", "D", "cudnn"})
    ->Args({1024, 4, 2, 64, 0})
    ->Args({8192, 16, 8, 128, 0})->Args({8192, 16, 8, 128, 1})
    ->Args({8192, 32, 8, 64, 0})->Args({8192, 32, 8, 64, 1})
    ->Unit(benchmark::kMillisecond)->UseRealTime();
