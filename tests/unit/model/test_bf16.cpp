// train.precision = bf16 in the model (bf16_gemm.hpp, transformer.hpp).
//
// 1. The bf16 GEMMs against an independent naive computation: the operands
//    rounded with core::round_to_bf16, products summed in double. The only
//    difference allowed is fp32 accumulation: |err| ≤ γ_K·Σ|a·b| + 1 ulp of
//    the output, γ_K = K·2^-24/(1 − K·2^-24) (Higham, "Accuracy and
//    Stability of Numerical Algorithms", 2nd ed., eq. 3.5).
// 2. Each GEMM of a linear layer (forward y, dX, dW) in bf16 against fp32:
//    rounding each operand to bf16 makes each product a·b(1 + ε_a)(1 + ε_b)
//    with |ε| ≤ u = 2^-8, so |y_bf16 − y_fp32| ≤ (2u + u²)·Σ|a·b| element by
//    element (worst case, any data). For independent random data the errors
//    of a K-long dot product add like a random walk (√K) while y grows like
//    √K too, so the relative Frobenius error is ≈ √(2/3)·u ≈ 0.82u whatever
//    K is (ε uniform in ±u: variance u²/3 per operand; measured 0.6u, RNE
//    errors are mostly below u); the test allows 2u.
// 3. The whole model (2 layers, 3 documents) in bf16 against fp32: loss and
//    every parameter gradient. Errors of ~0.8u per GEMM compound over the
//    n ≈ 20 GEMMs a gradient passes through (forward and backward): about
//    √n·0.8u ≈ 3.6u; the test allows 1e-2 on the loss (relative) and 8u
//    relative Frobenius per gradient tensor, 16u for the tiny norm weights'
//    gradients.
// 4. The weight copies are refreshed after an update (mark_weights_updated /
//    zero_grad) and a bf16 overflow (a master weight finite in fp32 whose bf16
//    copy is inf) reaches the NaN/inf check, which names step and tensor.
#include "test_util.hpp"
#include "wlb4d/core/bf16.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/grid/process_grid.hpp"
#include "wlb4d/model/bf16_gemm.hpp"
#include "wlb4d/model/layers.hpp"
#include "wlb4d/model/transformer.hpp"
#include "wlb4d/optim/optimizer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace wlb;
using namespace wlb::model;
using namespace wlb::test;

namespace {

constexpr double kU = core::kBf16UnitRoundoff;

std::vector<double> rounded(const std::vector<double>& v) {
  std::vector<double> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = double(core::round_to_bf16(float(v[i])));
  return r;
}

double gamma(std::int64_t K) {
  const double k = double(K) * std::ldexp(1.0, -24);
  return k / (1 - k);
}

// Naive C[M][N] = beta·C0 + Σ_k A(m,k)·B(k,n), accessors as lambdas; also Σ|A·B|.
template <class FA, class FB>
void naive(std::int64_t M, std::int64_t N, std::int64_t K, FA a, FB b, const std::vector<double>& c0, double beta,
           std::vector<double>& c, std::vector<double>& abs) {
  c.assign(std::size_t(M * N), 0);
  abs.assign(std::size_t(M * N), 0);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double s = 0, sa = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        s += a(m, k) * b(k, n);
        sa += std::fabs(a(m, k) * b(k, n));
      }
      c[m * N + n] = s + beta * c0[m * N + n];
      abs[m * N + n] = sa + std::fabs(beta * c0[m * N + n]);
    }
}

void expect_within_accumulation(const std::vector<double>& got, const std::vector<double>& ref,
                                const std::vector<double>& abs, std::int64_t K, const char* what) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = gamma(K + 1) * abs[i] + std::ldexp(std::fabs(ref[i]), -23) + 1e-30;
    ASSERT_LE(std::fabs(got[i] - ref[i]), tol) << what << "[" << i << "] got " << got[i] << " ref " << ref[i];
  }
}

double rel_frobenius(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace

TEST(Bf16Gemm, PathIsReported) {
  const std::string s = bf16_gemm_summary();
  EXPECT_NE(s.find("bf16 GEMM"), std::string::npos) << s;
  // Sbgemm and GemmEx keep bf16 bits (2 bytes); Widen holds the values in fp32 and keeps no weight copy.
  const bool bits = bf16_gemm_path() != Bf16Path::Widen;
  EXPECT_EQ(bf16_operand_bytes(), bits ? 2 : 4);
  EXPECT_EQ(bf16_weight_bytes(), bits ? 2 : 0);
#if defined(KOKKOS_ENABLE_CUDA) && defined(WLB4D_HAVE_CUBLAS)
  EXPECT_EQ(bf16_gemm_path(), Bf16Path::GemmEx) << "a CUDA build with cuBLAS runs cublasGemmEx";
  EXPECT_NE(s.find("cublasGemmEx"), std::string::npos) << s;
#endif
}

TEST(Bf16Gemm, ForwardInputAndWeightGradientsEqualNaiveOnRoundedOperands) {
  std::mt19937_64 rng(3);
  // out > kBf16Block exercises the blocked reduction (dX), the blocked dW and
  // (Widen path) the forward's blocks of output columns, with beta != 0.
  const std::int64_t T = 7, in = 19, out = kBf16Block + 37;
  Mat x("x", T, in), w("w", out, in), y("y", T, out), dy("dy", T, out), dx("dx", T, in), dw("dw", out, in);
  fill_normal(x, rng);
  fill_normal(w, rng);
  fill_normal(y, rng);
  fill_normal(dy, rng);
  fill_normal(dx, rng);
  fill_normal(dw, rng);
  const auto X = host_vec(x), W = host_vec(w), Y0 = host_vec(y), DY = host_vec(dy), DX0 = host_vec(dx),
             DW0 = host_vec(dw);
  const auto Xr = rounded(X), Wr = rounded(W), DYr = rounded(DY);
  Bf16Weight wb(out, in);
  wb.refresh(w);
  auto ws = Bf16Workspace::for_gemm(T, in, out);
  std::vector<double> ref, abs;

  bf16_linear_forward(x, wb, y, 0.5f, ws);
  naive(T, out, in, [&](auto m, auto k) { return Xr[m * in + k]; }, [&](auto k, auto n) { return Wr[n * in + k]; },
        Y0, 0.5, ref, abs);
  expect_within_accumulation(host_vec(y), ref, abs, in, "y");

  bf16_linear_backward_input(wb, dy, dx, 1.0f, ws);
  naive(T, in, out, [&](auto m, auto k) { return DYr[m * out + k]; }, [&](auto k, auto n) { return Wr[k * in + n]; },
        DX0, 1.0, ref, abs);
  expect_within_accumulation(host_vec(dx), ref, abs, out, "dx");

  bf16_linear_backward_weight(x, dy, dw, ws);
  naive(out, in, T, [&](auto m, auto k) { return DYr[k * out + m]; }, [&](auto k, auto n) { return Xr[k * in + n]; },
        DW0, 1.0, ref, abs);
  expect_within_accumulation(host_vec(dw), ref, abs, T, "dW");
  // The fp32 inputs are left as they were (the residual stream stays fp32).
  EXPECT_EQ(host_vec(x), X);
  EXPECT_EQ(host_vec(dy), DY);
}

TEST(Bf16Gemm, RejectsShapesAndWorkspaceOverflow) {
  Mat x("x", 4, 8), y("y", 4, 5);
  Bf16Weight w(5, 8);
  Bf16Workspace small(16, 16, 40);
  EXPECT_THROW(bf16_linear_forward(x, w, y, 0.f, small), std::invalid_argument);  // 32 > 16
  if (bf16_gemm_path() == Bf16Path::Widen) {
    Mat m("m", 5, 8);
    w.refresh(m);
    Bf16Workspace no_w(64, 64, 39);  // a 5 x 8 weight block needs 40
    EXPECT_THROW(bf16_linear_forward(x, w, y, 0.f, no_w), std::invalid_argument);
  }
  Bf16Workspace ws(64, 64, 40);
  Mat bad("bad", 4, 6);
  EXPECT_THROW(bf16_linear_forward(x, w, bad, 0.f, ws), std::invalid_argument);
  EXPECT_THROW(w.refresh(bad), std::invalid_argument);
}

// Per layer (the linear layer is the only one bf16 changes): forward, dX, dW
// in bf16 against the fp32 kernels of layers.hpp at model-like sizes.
TEST(Bf16Layers, LinearForwardAndBackwardWithinTwoUnitRoundoffs) {
  std::mt19937_64 rng(4);
  for (auto [T, in, out] : {std::array<std::int64_t, 3>{64, 256, 512}, {128, 688, 256}, {32, 128, 5000}}) {
    SCOPED_TRACE(testing::Message() << "T=" << T << " in=" << in << " out=" << out);
    Mat x("x", T, in), w("w", out, in), dy("dy", T, out);
    fill_normal(x, rng);
    fill_normal(w, rng, 0.02);
    fill_normal(dy, rng, 1e-3);
    Mat y32("y", T, out), y16("y", T, out), dx32("dx", T, in), dx16("dx", T, in), dw32("dw", out, in),
        dw16("dw", out, in);
    linear_forward(x, w, y32);
    linear_backward(x, w, dy, dx32, dw32);
    Bf16Weight wb(out, in);
    wb.refresh(w);
    auto ws = Bf16Workspace::for_gemm(T, in, out);
    bf16_linear_forward(x, wb, y16, 0.f, ws);
    bf16_linear_backward_input(wb, dy, dx16, 0.f, ws);
    bf16_linear_backward_weight(x, dy, dw16, ws);
    const double ey = rel_frobenius(host_vec(y16), host_vec(y32));
    const double ex = rel_frobenius(host_vec(dx16), host_vec(dx32));
    const double ew = rel_frobenius(host_vec(dw16), host_vec(dw32));
    EXPECT_LE(ey, 2 * kU);
    EXPECT_LE(ex, 2 * kU);
    EXPECT_LE(ew, 2 * kU);
    // Not equal to fp32 either: the bf16 path really rounds (≥ 0.25u).
    EXPECT_GE(ey, 0.25 * kU);
    std::printf("linear T=%ld in=%ld out=%ld: rel. error y %.2e dX %.2e dW %.2e (u = %.2e)\n", long(T), long(in),
                long(out), ey, ex, ew, kU);
  }
}

namespace {

std::vector<token_t> ids(std::int64_t T, std::int64_t V, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> u(0, int(V) - 1);
  std::vector<token_t> r(T);
  for (auto& i : r) i = token_t(u(rng));
  return r;
}

}  // namespace

TEST(Bf16Transformer, WholeModelLossAndGradientsNearFp32) {
  const auto cfg = tiny_model(2, 64, 4, 2, 160);
  const std::int64_t V = 101, T = 96;
  std::mt19937_64 rng(5);
  const auto mb = make_micro_batch({0, 40, 41, 96}, ids(T, V, rng));
  Transformer<float> f32(cfg, V, ModelShard{}, comm::Communicator(), 1, T);
  Transformer<float> b16(cfg, V, ModelShard{}, comm::Communicator(), 1, T, false, 1, true);
  EXPECT_FALSE(f32.bf16());
  EXPECT_TRUE(b16.bf16());
  f32.params().init_parameters(9);
  b16.params().init_parameters(9);
  f32.zero_grad();
  b16.zero_grad();
  const double l32 = f32.forward(0, mb).loss, l16 = b16.forward(0, mb).loss;
  f32.backward(0, mb, {}, 1.0 / double(mb.target_tokens));
  b16.backward(0, mb, {}, 1.0 / double(mb.target_tokens));
  EXPECT_NE(l32, l16);  // bf16 really ran
  EXPECT_LE(std::fabs(l16 - l32) / std::fabs(l32), 1e-2);
  for (std::size_t k = 0; k < f32.params().size(); ++k) {
    const auto& p = f32.params()[k];
    const double e = rel_frobenius(host_vec(b16.params()[k].grad), host_vec(p.grad));
    const double tol = p.global_shape.size() == 1 ? 16 * kU : 8 * kU;
    EXPECT_LE(e, tol) << p.name;
    std::printf("%-28s rel. gradient error %.2e (tolerance %.2e)\n", p.name.c_str(), e, tol);
  }
  // fp64 refuses bf16.
  EXPECT_THROW(Transformer<double>(cfg, V, ModelShard{}, comm::Communicator(), 1, T, false, 1, true),
               std::invalid_argument);
}

TEST(Bf16Transformer, CopiesFollowTheMasterAfterAnUpdate) {
  const auto cfg = tiny_model(2, 64, 4, 2, 160);
  const std::int64_t V = 101, T = 32;
  std::mt19937_64 rng(6);
  const auto mb = make_micro_batch({0, 32}, ids(T, V, rng));
  Transformer<float> a(cfg, V, ModelShard{}, comm::Communicator(), 1, T, false, 1, true);
  Transformer<float> b(cfg, V, ModelShard{}, comm::Communicator(), 1, T, false, 1, true);
  a.params().init_parameters(1);
  b.params().init_parameters(2);
  const double la = a.forward(0, mb).loss;
  a.discard(0);
  // a takes b's masters (an "update"); until marked, a's sbgemm GEMMs use
  // its old copies (the embedding and norm weights are read from the
  // masters). The widen path keeps no copy: its GEMMs round the master they
  // are given, so they follow the update at once.
  Kokkos::deep_copy(a.params().values(), b.params().values());
  const double stale = a.forward(0, mb).loss;
  a.discard(0);
  a.mark_weights_updated();
  const double fresh = a.forward(0, mb).loss;
  a.discard(0);
  EXPECT_NE(fresh, la);
  if (bf16_gemm_path() != Bf16Path::Widen) EXPECT_NE(stale, fresh);  // a kept copy is stale until marked
  else EXPECT_EQ(stale, fresh);
  EXPECT_EQ(fresh, b.forward(0, mb).loss);
  b.discard(0);
}

TEST(Bf16Transformer, OverflowToInfInBf16IsCaughtNamingStepAndTensor) {
  const auto cfg = tiny_model(2, 64, 4, 2, 160);
  const std::int64_t V = 101, T = 32;
  std::mt19937_64 rng(7);
  const auto mb = make_micro_batch({0, 32}, ids(T, V, rng));
  Transformer<float> m(cfg, V, ModelShard{}, comm::Communicator(), 1, T, false, 1, true);
  m.params().init_parameters(3);
  // 3.4e38 is finite in fp32 but above the largest bf16 by more than half an
  // ulp: its bf16 copy is +inf.
  const float big = 3.4e38f;
  ASSERT_TRUE(std::isfinite(big));
  ASSERT_TRUE(std::isinf(core::round_to_bf16(big)));
  poke(m.params().at("layers.1.mlp.w_gate").value, 5, big);
  m.zero_grad();
  m.forward(0, mb);
  m.backward(0, mb, {}, 1.0 / double(mb.target_tokens));
  grid::ProcessGrid g(1, 1, 1, 1, comm::WaitMode::Yield, MPI_COMM_SELF);
  const std::vector<ParamRegistry<float>*> chunks = {&m.params()};
  optim::Optimizer opt(core::OptimConfig{}, 4, g, chunks, 0);
  opt.reduce_gradients();
  try {
    opt.step(6, 1.0);
    ADD_FAILURE() << "a bf16 overflow passed silently";
  } catch (const core::NumericsError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("at step 7 "), std::string::npos) << w;
    EXPECT_NE(w.find("gradient of "), std::string::npos) << w;
  }
}
