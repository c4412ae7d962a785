// Element-wise and reduction kernels of the model (wlb::model) at
// the GPT-2-small shapes of one 1024-token micro-batch (d_model 768, 12 heads
// of 64, SwiGLU hidden 2048, vocabulary 50304), fp32.
// Counters: "GB/s" = bytes the kernel must move (each array read or written
// once per pass it needs) / time; BM_stream_triad (a = b + s·c over 3 × 128 MiB)
// is the one-core memory bandwidth they are compared with (scripts/bench.sh
// prints the shares). "Gexp/s" = exponentials per second where the kernel is
// exp-bound (SwiGLU, cross-entropy).
#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/model/layers.hpp"
#include "wlb4d/optim/adamw.hpp"

#include <benchmark/benchmark.h>

#include <random>
#include <string>

namespace {

constexpr std::int64_t kT = 1024, kD = 768, kH = 12, kHd = 64, kF = 2048, kV = 50304;

template <class V>
void fill(const V& v, float sd, unsigned seed) {
  auto h = Kokkos::create_mirror_view(v);
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, sd);
  for (std::size_t i = 0; i < h.span(); ++i) h.data()[i] = n(rng);
  Kokkos::deep_copy(v, h);
}

void counters(benchmark::State& st, double bytes, double exps = 0) {
  st.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  // Every benchmark sets both counters (CSV output needs the same columns; 0: n/a).
  st.counters["Gexp/s"] = benchmark::Counter(exps * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_stream_triad(benchmark::State& st) {
  const std::int64_t n = 32 << 20;
  wlb::Vec a("a", n), b("b", n), c("c", n);
  Kokkos::deep_copy(b, 1.f);
  Kokkos::deep_copy(c, 2.f);
  for (auto _ : st) {
    Kokkos::parallel_for(
        "triad", Kokkos::RangePolicy<wlb::ExecSpace>(0, n), KOKKOS_LAMBDA(const std::int64_t i) { a(i) = b(i) + 3.f * c(i); });
    Kokkos::fence();
  }
  counters(st, 12.0 * n);
}

void BM_rmsnorm_fwd(benchmark::State& st) {
  wlb::Mat x("x", kT, kD), y("y", kT, kD);
  wlb::Vec w("w", kD), r("rstd", kT);
  fill(x, 1.f, 1);
  Kokkos::deep_copy(w, 1.f);
  for (auto _ : st) {
    wlb::model::rmsnorm_forward(x, kT, w, 1e-5, y, r);
    Kokkos::fence();
  }
  counters(st, 8.0 * kT * kD);
}

void BM_rmsnorm_bwd(benchmark::State& st) {
  wlb::Mat x("x", kT, kD), y("y", kT, kD), dy("dy", kT, kD), dx("dx", kT, kD);
  wlb::Vec w("w", kD), r("rstd", kT), dw("dw", kD);
  fill(x, 1.f, 1);
  fill(dy, 1.f, 2);
  Kokkos::deep_copy(w, 1.f);
  wlb::model::rmsnorm_forward(x, kT, w, 1e-5, y, r);
  for (auto _ : st) {
    wlb::model::rmsnorm_backward(x, kT, w, r, dy, dx, dw, true);
    Kokkos::fence();
  }
  counters(st, 4.0 * 6 * kT * kD);  // dw: dy, x; dx: dy, x, dx (read + write)
}

void BM_rope(benchmark::State& st) {
  wlb::View3<float> q("q", kT, kH, kHd);
  wlb::IntVec pos("pos", kT);
  fill(q, 1.f, 3);
  Kokkos::parallel_for(
      "pos", Kokkos::RangePolicy<wlb::ExecSpace>(0, kT), KOKKOS_LAMBDA(const std::int64_t t) { pos(t) = std::int32_t(t); });
  const auto freq = wlb::model::rope_inv_freq_view(kHd, wlb::core::ModelConfig{});
  bool inv = false;
  for (auto _ : st) {
    wlb::model::rope_apply(q, kT, pos, freq, inv);
    inv = !inv;
    Kokkos::fence();
  }
  counters(st, 8.0 * kT * kH * kHd);
}

void BM_swiglu_fwd(benchmark::State& st) {
  wlb::Mat g("g", kT, kF), u("u", kT, kF), h("h", kT, kF);
  fill(g, 1.f, 4);
  fill(u, 1.f, 5);
  for (auto _ : st) {
    wlb::model::swiglu_forward(g, u, kT, h);
    Kokkos::fence();
  }
  counters(st, 12.0 * kT * kF, double(kT * kF));
}

void BM_swiglu_bwd(benchmark::State& st) {
  wlb::Mat g("g", kT, kF), u("u", kT, kF), dh("dh", kT, kF), dg("dg", kT, kF), du("du", kT, kF);
  fill(g, 1.f, 4);
  fill(u, 1.f, 5);
  fill(dh, 1.f, 6);
  for (auto _ : st) {
    wlb::model::swiglu_backward(g, u, dh, kT, dg, du);
    Kokkos::fence();
  }
  counters(st, 20.0 * kT * kF, double(kT * kF));
}

// Forward (max, Σ exp: two reads of the logits) and the in-place backward
// (one read, one write), as the model runs them on one rank.
void BM_cross_entropy(benchmark::State& st) {
  wlb::Mat logits("logits", kT, kV);
  wlb::IntVec labels("labels", kT);
  wlb::Vec lse("lse", kT), scr("scratch", 3 * kT);
  wlb::comm::Communicator self;
  Kokkos::parallel_for(
      "labels", Kokkos::RangePolicy<wlb::ExecSpace>(0, kT),
      KOKKOS_LAMBDA(const std::int64_t t) { labels(t) = std::int32_t((t * 7919) % kV); });
  for (auto _ : st) {
    st.PauseTiming();
    fill(logits, 2.f, 7);
    st.ResumeTiming();
    benchmark::DoNotOptimize(wlb::model::cross_entropy_forward(logits, labels, kT, 0, self, lse, scr));
    wlb::model::cross_entropy_backward(logits, labels, kT, 0, lse, 1.0 / kT, logits);
    Kokkos::fence();
  }
  counters(st, 16.0 * kT * kV, 2.0 * kT * kV);
}

}  // namespace

// Optimizer passes over 32 Mi parameters (a GPT-2-small stage's
// order of magnitude): the global-norm reduction reads g (4 B/element); AdamW
// reads θ, g, m, v and writes θ, m, v (28 B/element). "GB/s" against the
// triad is the share of the bandwidth bound.
void BM_optim_sum_of_squares(benchmark::State& st) {
  const std::int64_t n = 32 << 20;
  wlb::Vec g("g", n);
  fill(g, 1e-2f, 5);
  double sink = 0;
  for (auto _ : st) {
    sink += wlb::optim::sum_of_squares(g);
    benchmark::DoNotOptimize(sink);
  }
  counters(st, 4.0 * n);
}

void BM_optim_adamw(benchmark::State& st) {
  const std::int64_t n = 32 << 20;
  wlb::Vec p("p", n), g("g", n), m("m", n), v("v", n);
  fill(p, 2e-2f, 6);
  fill(g, 1e-2f, 7);
  wlb::optim::AdamWStep s;
  s.lr = 1e-4;
  s.weight_decay = 0.1;
  for (auto _ : st) {
    wlb::optim::adamw_update(p, g, m, v, s);
    Kokkos::fence();
    ++s.t;
  }
  counters(st, 28.0 * n);
}

BENCHMARK(BM_stream_triad)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_rmsnorm_fwd)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_rmsnorm_bwd)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_rope)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_swiglu_fwd)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_swiglu_bwd)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_cross_entropy)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_optim_sum_of_squares)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_optim_adamw)->Unit(benchmark::kMillisecond)->UseRealTime();
