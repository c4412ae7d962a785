// The pipeline-stage model (transformer.hpp): whole-model gradients of a
// 2-layer multi-document micro-batch against central finite differences in
// fp64, pipeline-stage inputs/outputs, micro-batch slots, the initial loss,
// the micro-batch builder, the FLOP formula, and a timing probe.
#include "test_util.hpp"
#include "wlb4d/model/attention.hpp"
#include "wlb4d/model/layers.hpp"
#include "wlb4d/model/transformer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

using namespace wlb;
using namespace wlb::model;
using namespace wlb::test;

namespace {

constexpr std::int64_t kVocab = 23;
const std::vector<std::int64_t> kCu = {0, 5, 6, 13};  // documents of 5, 1 and 7 tokens

std::vector<token_t> random_ids(std::int64_t T, std::int64_t V, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> u(0, int(V) - 1);
  std::vector<token_t> ids(T);
  for (auto& i : ids) i = token_t(u(rng));
  return ids;
}

/// Random, non-trivial parameter values (norm weights ≠ 1, matrices large
/// enough that every non-linearity matters).
template <class S>
void randomise(ParamRegistry<S>& reg, std::mt19937_64& rng) {
  for (auto& p : reg) {
    if (p.global_shape.size() == 1)
      fill_normal(p.value, rng, 0.2, 1.0);
    else
      fill_normal(p.value, rng, 0.3);
  }
}

/// Checks `samples` elements of every parameter of `model` against central
/// differences of f().
template <class S>
void check_param_grads(Transformer<S>& model, const std::function<double()>& f, std::mt19937_64& rng,
                       std::size_t samples) {
  for (auto& p : model.params()) {
    const auto g = host_vec(p.grad);
    fd_check(p.name, p.value, g, sample(p.local_numel(), samples, rng), f, 1e-5, 1e-6, 1e-4);
  }
}

}  // namespace

TEST(ModelBatch, BuildsPositionsLabelsAndKeyRanges) {
  const std::vector<token_t> ids = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22};
  const auto mb = make_micro_batch(kCu, ids);
  EXPECT_EQ(mb.tokens, 13);
  EXPECT_EQ(mb.target_tokens, 4 + 0 + 6);
  EXPECT_EQ(mb.attention_pairs, 15 + 1 + 28);
  const auto pos = host_vec(mb.positions), lab = host_vec(mb.labels), lo = host_vec(mb.kv_lo),
             hi = host_vec(mb.kv_hi);
  const std::vector<double> want_pos = {0, 1, 2, 3, 4, 0, 0, 1, 2, 3, 4, 5, 6};
  const std::vector<double> want_lab = {11, 12, 13, 14, -1, -1, 17, 18, 19, 20, 21, 22, -1};
  const std::vector<double> want_lo = {0, 0, 0, 0, 0, 5, 6, 6, 6, 6, 6, 6, 6};
  for (int i = 0; i < 13; ++i) {
    EXPECT_EQ(pos[i], want_pos[i]);
    EXPECT_EQ(lab[i], want_lab[i]);
    EXPECT_EQ(lo[i], want_lo[i]);
    EXPECT_EQ(hi[i], i);
  }
  EXPECT_THROW(make_micro_batch({0, 3, 3}, {}), std::invalid_argument);
  EXPECT_THROW(make_micro_batch({0, 3}, {1, 2}), std::invalid_argument);
  // Grow-only reuse: a smaller micro-batch keeps the Views.
  MicroBatchInput m2 = mb;
  const auto* p = m2.positions.data();
  fill_micro_batch(m2, {0, 4}, {1, 2, 3, 4});
  EXPECT_EQ(m2.positions.data(), p);
  EXPECT_EQ(m2.tokens, 4);
}

TEST(ModelFlops, Formula) {
  const auto c = tiny_model();
  const std::int64_t per_layer = 2 * 16 * 16 + 2 * 16 * 8 + 3 * 16 * 24;
  EXPECT_EQ(matmul_params(c, kVocab), 2 * per_layer + kVocab * 16);
  EXPECT_DOUBLE_EQ(model_flops(c, kVocab, 13, 44),
                   6.0 * double(2 * per_layer + kVocab * 16) * 13 + 12.0 * 2 * 4 * 4 * 44);
}

TEST(ModelTransformer, WholeModelParameterGradientsMatchFiniteDifferences) {
  std::mt19937_64 rng(11);
  const auto cfg = tiny_model();
  Transformer<double> model(cfg, kVocab, ModelShard{}, comm::Communicator(), 1, 16);
  randomise(model.params(), rng);
  const auto mb = make_micro_batch(kCu, random_ids(13, kVocab, rng));
  const double gs = 1.0 / double(mb.target_tokens);
  model.zero_grad();
  const double loss = model.forward(0, mb).loss;
  EXPECT_TRUE(std::isfinite(loss));
  const auto din = model.backward(0, mb, {}, gs);
  EXPECT_EQ(din.data(), nullptr);  // first stage: no input gradient
  auto f = [&] {
    const double l = model.forward(0, mb).loss;
    model.discard(0);
    return gs * l;
  };
  EXPECT_NEAR(f() / gs, loss, 1e-12 * std::fabs(loss));
  check_param_grads(model, f, rng, 8);
}

TEST(ModelTransformer, MiddleStageInputAndParameterGradients) {
  std::mt19937_64 rng(12);
  const auto cfg = tiny_model();
  ModelShard s;
  s.embedding = false;
  s.head = false;
  Transformer<double> model(cfg, kVocab, s, comm::Communicator(), 1, 20);
  randomise(model.params(), rng);
  EXPECT_EQ(model.params().find("embed.weight"), nullptr);
  EXPECT_EQ(model.params().find("lm_head.weight"), nullptr);
  const auto mb = make_micro_batch(kCu, {});  // a middle stage needs no ids
  View2<double> in("in", 13, 16), r_dev("r", 13, 16);
  fill_normal(in, rng);
  fill_normal(r_dev, rng);
  const auto r = host_vec(r_dev);
  model.zero_grad();
  const auto out = model.forward(0, mb, in);
  ASSERT_EQ(out.hidden.extent(0), 13u);
  const auto din = model.backward(0, mb, r_dev);
  ASSERT_EQ(din.extent(0), 13u);
  const auto gin = host_vec(din);
  auto f = [&] {
    const auto o = model.forward(0, mb, in);
    const double v = dot(r, o.hidden);
    model.discard(0);
    return v;
  };
  fd_check("input_hidden", in, gin, sample(13 * 16, 30, rng), f, 1e-5, 1e-6, 1e-4);
  check_param_grads(model, f, rng, 6);
}

TEST(ModelTransformer, LastStageInputGradient) {
  std::mt19937_64 rng(13);
  const auto cfg = tiny_model();
  ModelShard s;
  s.embedding = false;
  s.layer_begin = 1;
  Transformer<double> model(cfg, kVocab, s, comm::Communicator(), 1, 13);
  randomise(model.params(), rng);
  const auto mb = make_micro_batch(kCu, random_ids(13, kVocab, rng));
  View2<double> in("in", 13, 16);
  fill_normal(in, rng);
  model.zero_grad();
  model.forward(0, mb, in);
  const auto gin = host_vec(model.backward(0, mb, {}, 0.5));
  auto f = [&] {
    const double l = model.forward(0, mb, in).loss;
    model.discard(0);
    return 0.5 * l;
  };
  fd_check("input_hidden", in, gin, sample(13 * 16, 30, rng), f, 1e-5, 1e-6, 1e-4);
}

TEST(ModelTransformer, SlotsAreIndependentAndGradientsAccumulate) {
  std::mt19937_64 rng(14);
  const auto cfg = tiny_model();
  Transformer<double> a(cfg, kVocab, ModelShard{}, comm::Communicator(), 2, 13);
  Transformer<double> b(cfg, kVocab, ModelShard{}, comm::Communicator(), 1, 13);
  a.params().init_parameters(3);
  b.params().init_parameters(3);
  const auto mb1 = make_micro_batch(kCu, random_ids(13, kVocab, rng));
  const auto mb2 = make_micro_batch({0, 9}, random_ids(9, kVocab, rng));
  const double gs = 1.0 / double(mb1.target_tokens + mb2.target_tokens);
  a.zero_grad();
  b.zero_grad();
  // Pipelined order (two in flight) vs one at a time.
  const double la1 = a.forward(0, mb1).loss;
  const double la2 = a.forward(1, mb2).loss;
  a.backward(1, mb2, {}, gs);
  a.backward(0, mb1, {}, gs);
  const double lb1 = b.forward(0, mb1).loss;
  b.backward(0, mb1, {}, gs);
  const double lb2 = b.forward(0, mb2).loss;
  b.backward(0, mb2, {}, gs);
  EXPECT_DOUBLE_EQ(la1, lb1);
  EXPECT_DOUBLE_EQ(la2, lb2);
  const auto ga = host_vec(a.params().grads()), gb = host_vec(b.params().grads());
  for (std::size_t i = 0; i < ga.size(); ++i) ASSERT_NEAR(ga[i], gb[i], 1e-13 + 1e-12 * std::fabs(gb[i])) << i;
  // Misuse is loud.
  EXPECT_THROW(a.backward(0, mb1, {}, gs), std::logic_error);
  a.forward(0, mb1);
  EXPECT_THROW(a.forward(0, mb1), std::logic_error);
  EXPECT_THROW(a.backward(0, mb2, {}, gs), std::invalid_argument);
  a.discard(0);
  EXPECT_THROW(a.forward(0, make_micro_batch({0, 14}, random_ids(14, kVocab, rng))), std::invalid_argument);
}

TEST(ModelTransformer, InitialLossIsLogVocabInFloat) {
  std::mt19937_64 rng(15);
  core::ModelConfig cfg;
  cfg.layers = 2;
  cfg.d_model = 64;
  cfg.heads = 4;
  cfg.kv_heads = 2;
  cfg.ffn_hidden = 172;
  cfg.init_std = 0.02;
  const std::int64_t V = 256;
  Transformer<float> model(cfg, V, ModelShard{}, comm::Communicator(), 1, 128);
  model.params().init_parameters(1234);
  const auto mb = make_micro_batch({0, 50, 128}, random_ids(128, V, rng));
  const double loss = model.forward(0, mb).loss / double(mb.target_tokens);
  model.discard(0);
  EXPECT_NEAR(loss, std::log(double(V)), 0.1);
}

TEST(ModelTransformer, TimingFourLayersD256T256Float) {
  std::mt19937_64 rng(16);
  core::ModelConfig cfg;  // defaults: 4 layers, d 256, 8 heads, 4 kv heads, F 688
  const std::int64_t V = 256, T = 256;
  Transformer<float> model(cfg, V, ModelShard{}, comm::Communicator(), 1, T);
  model.params().init_parameters(1);
  const auto mb = make_micro_batch({0, 100, 180, 256}, random_ids(T, V, rng));
  model.zero_grad();
  model.forward(0, mb);
  model.backward(0, mb, {}, 1.0 / mb.target_tokens);  // warm-up
  const int reps = 3;
  Kokkos::Timer timer;
  double fwd = 0;
  for (int i = 0; i < reps; ++i) {
    Kokkos::Timer tf;
    model.forward(0, mb);
    Kokkos::fence();
    fwd += tf.seconds();
    model.backward(0, mb, {}, 1.0 / mb.target_tokens);
  }
  Kokkos::fence();
  const double s = timer.seconds() / reps;
  const double flops = model_flops(cfg, V, T, mb.attention_pairs);
  std::printf("[timing] 4 layers d=256 T=256 float: forward %.1f ms, forward+backward %.1f ms, %.2f GFLOP/s\n",
              1e3 * fwd / reps, 1e3 * s, flops / s / 1e9);
  // Context for the number above: the same shapes' attention kernel and one
  // GEMM alone (both single-threaded here).
  View3<float> q("q", T, 8, 32), k("k", T, 4, 32), o("o", T, 8, 32);
  View2<float> lse("lse", 8, T);
  fill_normal(q, rng);
  fill_normal(k, rng);
  Kokkos::Timer ta;
  for (int i = 0; i < reps; ++i)
    attention_forward<float>(q, k, k, mb.kv_lo, mb.kv_hi, 1.0f / std::sqrt(32.0f), o, lse);
  Kokkos::fence();
  const double att = ta.seconds() / reps;
  View2<float> x("x", T, 256), w("w", 688, 256), y("y", T, 688);
  Kokkos::Timer tg;
  for (int i = 0; i < reps; ++i) linear_forward(x, w, y);
  Kokkos::fence();
  const double gemm = tg.seconds() / reps;
  std::printf("[timing] attention forward (one layer) %.2f ms; GEMM 256x256x688 %.3f ms = %.1f GFLOP/s\n",
              1e3 * att, 1e3 * gemm, 2.0 * T * 256 * 688 / gemm / 1e9);
  EXPECT_GT(s, 0.0);
}

// Split backward (zero-bubble schedules): B of several micro-batches
// first, a forward of another micro-batch in between, W's later — against the
// fused backward() one micro-batch at a time. Same GEMMs on the same operands
// in the same per-parameter order: bit-identical parameter and input gradients,
// for every recompute mode (W stashes) and for a middle stage and a whole model.
TEST(ModelTransformer, SplitBackwardWithDelayedWeightIsBitIdenticalToFused) {
  for (const char* rc : {"none", "selective", "full"})
    for (bool whole : {true, false}) {
      SCOPED_TRACE(testing::Message() << "recompute=" << rc << (whole ? " whole model" : " middle stage"));
      auto cfg = tiny_model();
      cfg.recompute = rc;
      ModelShard s;
      s.embedding = s.head = whole;
      std::mt19937_64 rng(21);
      Transformer<float> fused(cfg, kVocab, s, comm::Communicator(), 3, 13);
      Transformer<float> split(cfg, kVocab, s, comm::Communicator(), 3, 13, false, 3);
      fused.params().init_parameters(5);
      split.params().init_parameters(5);
      const std::vector<MicroBatchInput> mbs = {make_micro_batch(kCu, random_ids(13, kVocab, rng)),
                                                make_micro_batch({0, 9}, random_ids(9, kVocab, rng)),
                                                make_micro_batch({0, 4, 12}, random_ids(12, kVocab, rng))};
      std::vector<View2<float>> in, dout;
      for (const auto& mb : mbs) {
        in.emplace_back("in", mb.tokens, 16);
        dout.emplace_back("dout", mb.tokens, 16);
        fill_normal(in.back(), rng);
        fill_normal(dout.back(), rng);
      }
      const double gs = 1.0 / 30;
      auto input_grad = [&](const View2<float>& g) { return whole ? std::vector<double>{} : host_vec(g); };
      fused.zero_grad();
      split.zero_grad();
      // Fused: F0 F1 B0W0 F2 B1W1 B2W2.
      std::vector<std::vector<double>> gf(3), gz(3);
      fused.forward(0, mbs[0], in[0]);
      fused.forward(1, mbs[1], in[1]);
      gf[0] = input_grad(fused.backward(0, mbs[0], dout[0], gs));
      fused.forward(2, mbs[2], in[2]);
      gf[1] = input_grad(fused.backward(1, mbs[1], dout[1], gs));
      gf[2] = input_grad(fused.backward(2, mbs[2], dout[2], gs));
      // Split, ZB-H1 style: F0 F1 B0 F2 B1 W0 B2 W1 W2.
      split.forward(0, mbs[0], in[0]);
      split.forward(1, mbs[1], in[1]);
      gz[0] = input_grad(split.backward_input(0, 0, mbs[0], dout[0], gs));
      split.forward(2, mbs[2], in[2]);
      gz[1] = input_grad(split.backward_input(1, 1, mbs[1], dout[1], gs));
      EXPECT_THROW(split.forward(0, mbs[0], in[0]), std::logic_error);  // slot 0 held until its W
      EXPECT_THROW(split.backward_weight(0, 1), std::logic_error);      // wrong W stash
      split.backward_weight(0, 0);
      gz[2] = input_grad(split.backward_input(2, 2, mbs[2], dout[2], gs));
      split.backward_weight(1, 1);
      split.backward_weight(2, 2);
      EXPECT_THROW(split.backward_weight(2, 2), std::logic_error);
      for (int i = 0; i < 3; ++i) EXPECT_EQ(gf[i], gz[i]) << "input gradient of mb " << i;
      for (std::size_t k = 0; k < fused.params().size(); ++k) {
        const auto a = host_vec(fused.params()[k].grad), b = host_vec(split.params()[k].grad);
        EXPECT_EQ(a, b) << fused.params()[k].name;
      }
    }
}

// Fine-tuning loss masks (data/dataset.hpp /loss_mask): a masked next token is
// no target; the micro-batch counts only unmasked targets; the mask is applied
// in packed order, so a CP rank's local slice keeps the same labels.
TEST(ModelBatch, LossMaskDropsMaskedTargets) {
  const std::vector<token_t> ids = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22};
  //                                  doc 0 (5)       |d1| doc 2 (7)
  const std::vector<std::uint8_t> mask = {0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 0, 1};
  const auto h = build_host_micro_batch(kCu, ids, nullptr, &mask);
  const std::vector<std::int32_t> want = {-1, 12, 13, 14, -1, -1, -1, -1, 19, 20, -1, 22, -1};
  EXPECT_EQ(h.labels, want);
  EXPECT_EQ(h.target_tokens, 3 + 0 + 3);
  const std::vector<std::int64_t> local = {1, 8, 11, 12};  // a CP rank's slice
  const auto hl = build_host_micro_batch(kCu, ids, &local, &mask);
  EXPECT_EQ(hl.labels, (std::vector<std::int32_t>{12, 19, 22, -1}));
  EXPECT_EQ(hl.target_tokens, 3);
  const std::vector<std::uint8_t> short_mask(12, 1);
  EXPECT_THROW(build_host_micro_batch(kCu, ids, nullptr, &short_mask), std::invalid_argument);
  const std::vector<std::uint8_t> ones(13, 1);  // all ones = no mask
  EXPECT_EQ(build_host_micro_batch(kCu, ids, nullptr, &ones).labels, build_host_micro_batch(kCu, ids).labels);
}

// Masked targets get no gradient: the whole model's parameter gradients of a
// masked micro-batch match central finite differences of the masked loss;
// the masked loss is the sum of the one-target losses (a naive reference:
// one target at a time); a fully masked micro-batch gives loss 0 and zero
// gradients, never NaN.
TEST(ModelTransformer, LossMaskedGradientsMatchFiniteDifferencesAndOneTargetSums) {
  std::mt19937_64 rng(23);
  const auto cfg = tiny_model();
  Transformer<double> model(cfg, kVocab, ModelShard{}, comm::Communicator(), 1, 16);
  randomise(model.params(), rng);
  const auto ids = random_ids(13, kVocab, rng);
  const std::vector<std::uint8_t> mask = {0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 0, 1};
  MicroBatchInput mb;
  upload_micro_batch(mb, build_host_micro_batch(kCu, ids, nullptr, &mask));
  ASSERT_EQ(mb.target_tokens, 6);
  const double gs = 1.0 / double(mb.target_tokens);
  model.zero_grad();
  const double loss = model.forward(0, mb).loss;
  ASSERT_TRUE(std::isfinite(loss));
  model.backward(0, mb, {}, gs);
  auto f = [&] {
    const double l = model.forward(0, mb).loss;
    model.discard(0);
    return gs * l;
  };
  check_param_grads(model, f, rng, 8);

  // Naive reference: each unmasked target alone.
  double sum = 0;
  int singles = 0;
  for (std::size_t j = 1; j < mask.size(); ++j) {
    if (!mask[j]) continue;
    std::vector<std::uint8_t> one(13, 0);
    one[j] = 1;
    MicroBatchInput m1;
    upload_micro_batch(m1, build_host_micro_batch(kCu, ids, nullptr, &one));
    if (m1.target_tokens == 0) continue;  // the first token of a document is never a target
    sum += model.forward(0, m1).loss;
    model.discard(0);
    ++singles;
  }
  EXPECT_EQ(singles, 6);
  EXPECT_NEAR(sum, loss, 1e-12 * std::fabs(loss));
  // A masked token's id is read by no label: with only an earlier target
  // unmasked, changing it leaves the loss unchanged.
  {
    std::vector<std::uint8_t> first(13, 0);
    first[2] = 1;  // target of position 1 (doc 0)
    auto ids2 = ids;
    ids2[4] = token_t((ids2[4] + 1) % kVocab);  // a later, masked token of doc 0
    MicroBatchInput a, b;
    upload_micro_batch(a, build_host_micro_batch(kCu, ids, nullptr, &first));
    upload_micro_batch(b, build_host_micro_batch(kCu, ids2, nullptr, &first));
    const double la = model.forward(0, a).loss;
    model.discard(0);
    const double lb = model.forward(0, b).loss;
    model.discard(0);
    EXPECT_EQ(la, lb);
  }

  // Fully masked: loss 0, zero gradient (grad_scale 0, as the trainer passes for a zero-target step).
  const std::vector<std::uint8_t> none(13, 0);
  MicroBatchInput mz;
  upload_micro_batch(mz, build_host_micro_batch(kCu, ids, nullptr, &none));
  EXPECT_EQ(mz.target_tokens, 0);
  model.zero_grad();
  EXPECT_EQ(model.forward(0, mz).loss, 0.0);
  model.backward(0, mz, {}, 0.0);
  for (auto& p : model.params())
    for (double g : host_vec(p.grad)) ASSERT_EQ(g, 0.0) << p.name;
}
