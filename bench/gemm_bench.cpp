// SGEMM through KokkosBlas::gemm at the model's shapes: the peak every other
// figure is compared with. Counter "GFLOPs" = 2·M·N·K / time.
//
// BM_sgemm (y = x·Wᵀ, "N","T") is what scripts/bench.sh takes the peak from.
// BM_sgemm_linear measures the three GEMMs of a linear layer at the
// GPT-2-small shapes of one 1024-token micro-batch, as linear_forward /
// linear_backward issue them (arg 3: 0 = forward y = x·Wᵀ (N,T),
// 1 = dx = dy·W (N,N), 2 = dW += dyᵀ·x (T,N, beta 1), 3 = the same in blocks of 4096 rows of dW); args 0-2 are
// (tokens, out, in) of the layer. Its names start with BM_sgemm_linear so
// scripts/bench.sh's peak (max over rows starting with BM_sgemm) includes them.
#include "wlb4d/core/types.hpp"

#include <KokkosBlas3_gemm.hpp>
#include <benchmark/benchmark.h>

namespace {
void BM_sgemm(benchmark::State& st) {
  const int M = int(st.range(0)), N = int(st.range(1)), K = int(st.range(2));
  wlb::Mat A("A", M, K), B("B", N, K), C("C", M, N);
  Kokkos::deep_copy(A, 0.01f);
  Kokkos::deep_copy(B, 0.02f);
  for (auto _ : st) {
    KokkosBlas::gemm("N", "T", 1.0f, A, B, 0.0f, C);  // y = x·Wᵀ, the linear layer's forward
    Kokkos::fence();
  }
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * M * N * K * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_sgemm_linear(benchmark::State& st) {
  const int T = int(st.range(0)), O = int(st.range(1)), I = int(st.range(2)), which = int(st.range(3));
  wlb::Mat x("x", T, I), w("w", O, I), y("y", T, O), dw("dw", O, I);
  Kokkos::deep_copy(x, 0.01f);
  Kokkos::deep_copy(w, 0.02f);
  Kokkos::deep_copy(y, 0.03f);
  for (auto _ : st) {
    if (which == 0) KokkosBlas::gemm("N", "T", 1.0f, x, w, 0.0f, y);
    else if (which == 1) KokkosBlas::gemm("N", "N", 1.0f, y, w, 0.0f, x);
    else if (which == 2) KokkosBlas::gemm("T", "N", 1.0f, y, x, 1.0f, dw);
    else {  // 3: dW += dyᵀ·x in blocks of 4096 output rows (column blocks of dy)
      for (int o0 = 0; o0 < O; o0 += 4096) {
        const int o1 = o0 + 4096 < O ? o0 + 4096 : O;
        KokkosBlas::gemm("T", "N", 1.0f, Kokkos::subview(y, Kokkos::ALL, std::make_pair(o0, o1)), x, 1.0f,
                         Kokkos::subview(dw, std::make_pair(o0, o1), Kokkos::ALL));
      }
    }
    Kokkos::fence();
  }
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * T * O * I * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
}  // namespace

// (tokens, out, in): square peak probe, GPT-2-small QKV/MLP, quickstart MLP.
BENCHMARK(BM_sgemm)->Args({1024, 1024, 1024})->Args({4096, 2304, 768})->Args({4096, 3072, 768})
    ->Args({4096, 768, 3072})->Args({1024, 688, 256})->Args({1024, 256, 688})->Unit(benchmark::kMillisecond)
    ->UseRealTime();
// GPT-2-small linear layers of one 1024-token micro-batch: attention projections,
// SwiGLU gate/up, SwiGLU down, LM head; each as forward, dx and dW.
BENCHMARK(BM_sgemm_linear)
    ->ArgsProduct({{1024}, {768}, {768}, {0, 1, 2}})
    ->ArgsProduct({{1024}, {2048}, {768}, {0, 1, 2}})
    ->ArgsProduct({{1024}, {768}, {2048}, {0, 1, 2}})
    ->ArgsProduct({{1024}, {50304}, {768}, {0, 1, 2, 3}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
