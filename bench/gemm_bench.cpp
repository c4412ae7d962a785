// SGEMM through KokkosBlas::gemm at the model's shapes: the peak every other
// figure is compared with. Counter "GFLOPs" = 2·M·N·K / time.
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
}  // namespace

// (tokens, out, in): square peak probe, GPT-2-small QKV/MLP, quickstart MLP.
BENCHMARK(BM_sgemm)->Args({1024, 1024, 1024})->Args({4096, 2304, 768})->Args({4096, 3072, 768})
    ->Args({4096, 768, 3072})->Args({1024, 688, 256})->Args({1024, 256, 688})->Unit(benchmark::kMillisecond)
    ->UseRealTime();
