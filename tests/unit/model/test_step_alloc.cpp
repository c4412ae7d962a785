// Allocation-free training step: the steady state allocates nothing. After two
// warm-up steps, a third forward + backward over micro-batches of the warm-up
// sizes plus the AdamW update and the gradient norm must not allocate any
// Kokkos memory. Counted with a Kokkos::Tools allocate_data callback, which
// sees every View allocation (labelled or not) in every memory space
// (team scratch of a kernel included, when it has to grow).
#include "test_util.hpp"
#include "wlb4d/model/batch.hpp"
#include "wlb4d/model/transformer.hpp"
#include "wlb4d/optim/adamw.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

using namespace wlb;
using namespace wlb::model;

namespace {

int g_allocs = 0;
std::vector<std::string> g_labels;

void on_allocate(const Kokkos::Tools::SpaceHandle, const char* label, const void*, const uint64_t) {
  ++g_allocs;
  if (g_labels.size() < 32) g_labels.emplace_back(label);
}

std::vector<token_t> ids(std::int64_t T, std::int64_t V, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> u(0, int(V) - 1);
  std::vector<token_t> v(T);
  for (auto& i : v) i = token_t(u(rng));
  return v;
}

}  // namespace

/// One model, two micro-batches per step. split: B of both, then their W's
/// (the split backward of zero-bubble schedules, W stashes in use under recompute).
static void expect_no_step_allocations(bool split, const char* recompute, bool bf16 = false) {
  core::ModelConfig c = test::tiny_model(2, 64, 4, 2, 96);
  c.recompute = recompute;
  const std::int64_t vocab = 101;
  Transformer<float> model(c, vocab, ModelShard{}, comm::Communicator(), 2, 160, false, split ? 2 : 1, bf16);
  model.params().init_parameters(7);
  const auto& values = model.params().values();
  const auto& grads = model.params().grads();
  Vec m("m", values.extent(0)), v("v", values.extent(0));

  std::mt19937_64 rng(3);
  // Two micro-batches per step (two slots), different sizes and document splits.
  const std::vector<MicroBatchInput> mbs = {make_micro_batch({0, 70, 75, 150}, ids(150, vocab, rng)),
                                            make_micro_batch({0, 33, 120}, ids(120, vocab, rng))};
  auto step = [&](long t) {
    model.zero_grad();
    for (int s = 0; s < 2; ++s) model.forward(s, mbs[s]);
    if (split) {
      for (int s = 1; s >= 0; --s) model.backward_input(s, s, mbs[s], {}, 1.0 / 270);
      for (int s = 1; s >= 0; --s) model.backward_weight(s, s);
    } else {
      for (int s = 1; s >= 0; --s) model.backward(s, mbs[s], {}, 1.0 / 270);
    }
    const double norm = std::sqrt(optim::sum_of_squares(grads));
    optim::AdamWStep st;
    st.lr = 1e-3;
    st.weight_decay = 0.1;
    st.t = t;
    st.grad_scale = optim::clip_factor(norm, 1.0);
    optim::adamw_update(values, grads, m, v, st);
    Kokkos::fence();
  };
  step(1);
  step(2);

  Kokkos::Tools::Experimental::set_allocate_data_callback(&on_allocate);
  {  // the counter sees an allocation
    Vec probe("alloc_probe", 16);
  }
  ASSERT_EQ(g_allocs, 1);
  g_allocs = 0;
  g_labels.clear();
  step(3);
  Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
  std::string labels;
  for (const auto& l : g_labels) labels += " '" + l + "'";
  EXPECT_EQ(g_allocs, 0) << "allocations in the steady-state step:" << labels;
}

TEST(ModelStepAlloc, SteadyStateStepAllocatesNothing) { expect_no_step_allocations(false, "none"); }

// Zero-bubble pipeline: the split backward (B, then the delayed W's) allocates nothing
// either, with recompute (W stashes) and without.
TEST(ModelStepAlloc, SplitBackwardWithDelayedWeightAllocatesNothing) {
  expect_no_step_allocations(true, "none");
  expect_no_step_allocations(true, "selective");
  expect_no_step_allocations(true, "full");
}

// bf16 mixed precision: train.precision = bf16 (weight copies refreshed after each update,
// the 2-byte stored operands and their fp32 staging, the rounded-operand
// workspace) allocates nothing in the step either, fused and split.
TEST(ModelStepAlloc, Bf16StepAllocatesNothing) {
  expect_no_step_allocations(false, "none", true);
  expect_no_step_allocations(true, "none", true);
  expect_no_step_allocations(true, "full", true);
  expect_no_step_allocations(false, "selective", true);
}
