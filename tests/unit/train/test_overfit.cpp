// A tiny model must memorise one fixed multi-document batch with AdamW:
// end-to-end evidence that forward, hand-written backward and the optimizer
// agree (a sign error anywhere stalls the loss).
#include "test_util.hpp"
#include "wlb4d/model/transformer.hpp"
#include "wlb4d/optim/adamw.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace wlb;

TEST(Overfit, TinyModelMemorisesFixedBatch) {
  const core::ModelConfig cfg = test::tiny_model(2, 64, 4, 2, 128);
  const std::int64_t vocab = 48;
  model::Transformer<float> m(cfg, vocab, model::ModelShard{}, comm::Communicator::self(), 1, 128);
  m.params().init_parameters(42);
  std::mt19937 rng(7);
  std::vector<token_t> ids(96);
  for (auto& t : ids) t = token_t(rng() % vocab);
  auto mb = model::make_micro_batch({0, 40, 41, 70, 96}, ids);  // 4 documents, one of length 1
  const auto n = m.params().local_numel();
  Vec mom("m", n), var("v", n);
  core::OptimConfig o;
  o.lr = 1e-2;
  o.min_lr = 1e-3;
  o.warmup_steps = 10;
  const int steps = 300;
  double first = 0, loss = 0;
  for (int s = 0; s < steps; ++s) {
    m.zero_grad();
    loss = m.forward(0, mb).loss / double(mb.target_tokens);
    m.backward(0, mb, {}, 1.0 / double(mb.target_tokens));
    if (s == 0) first = loss;
    double sq = 0;
    for (const auto& p : m.params()) sq += optim::sum_of_squares(p.grad);
    optim::AdamWStep st;
    st.lr = optim::lr_at(o, s, steps);
    st.grad_scale = optim::clip_factor(std::sqrt(sq), 1.0);
    st.t = s + 1;
    for (const auto& p : m.params()) {
      st.weight_decay = p.decay ? 0.01 : 0.0;
      auto r = std::make_pair(p.offset, p.offset + std::size_t(p.local_numel()));
      optim::adamw_update(p.value, p.grad, Kokkos::subview(mom, r), Kokkos::subview(var, r), st);
    }
    if (loss < 0.05) break;
  }
  EXPECT_NEAR(first, std::log(double(vocab)), 0.1);
  EXPECT_LT(loss, 0.05) << "started at " << first;
}
