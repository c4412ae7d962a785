// Trainer inputs that used to give numbers instead of a message:
// a training set without target tokens (every document 1 token) trained with
// "loss 0.0000"; an empty validation set printed "val 0.0000"; resuming from a
// checkpoint past train.steps printed "done: 10 steps | final loss 0.0000".
#include "wlb4d/core/config.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/data/dataset.hpp"
#include "wlb4d/grid/process_grid.hpp"
#include "wlb4d/train/report.hpp"
#include "wlb4d/train/trainer.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <string>
#include <vector>

using namespace wlb;
namespace fs = std::filesystem;

namespace {

/// A byte-tokenizer dataset whose document d has lengths[d] tokens before EOS.
std::string dataset(const std::string& name, const std::vector<int>& lengths) {
  const std::string path = (fs::current_path() / ("trainer-inputs-" + name + ".h5")).string();
  data::TokenDatasetWriter w(path, "bytes", 257, 256, "test", "");
  for (std::size_t d = 0; d < lengths.size(); ++d) {
    std::vector<wlb::token_t> t(static_cast<std::size_t>(lengths[d]));
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = wlb::token_t((d * 7 + i * 13) % 250);
    w.append(t);
  }
  w.finish();
  return path;
}

core::Config deck(const std::string& train, const std::vector<std::string>& overrides = {}) {
  return core::parse_deck_text(
      "[model]\nlayers = 1\nd_model = 16\nheads = 2\nkv_heads = 1\nffn_hidden = 16\n"
      "[data]\ntrain = " + train + "\n"
      "[balance]\ncalibrate = false\ncost_a = 1e-6\n"
      "[train]\nsteps = 3\nmicro_batches = 1\nmax_seq_len = 16\neval_every = 0\nprint_every = 1\n"
      "[checkpoint]\nresume = never\nat_end = false\n"
      "[log]\ntiming_file =\nlevel = warn\n",
      overrides);
}

template <class F>
std::string data_error_of(F&& f) {
  try {
    f();
  } catch (const core::DataError& e) {
    return e.what();
  }
  return "(no DataError)";
}

const grid::ProcessGrid& one_rank() {
  static grid::ProcessGrid g(1, 1, 1, 1, comm::WaitMode::Yield, MPI_COMM_SELF);
  return g;
}

}  // namespace

TEST(TrainerInputs, ZeroTargetsIsAnError) {
  const auto path = dataset("ones", std::vector<int>(20, 0));  // each document is its EOS only
  const std::string msg = data_error_of([&] { train::Trainer t(deck(path), one_rank()); });
  EXPECT_NE(msg.find("data.train='" + path + "' has no target tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("all 20 documents used are 1 token long"), std::string::npos) << msg;
}

TEST(TrainerInputs, EmptyValidationSetIsAnError) {
  const auto train = dataset("train", std::vector<int>(20, 30));
  const auto val = dataset("val-ones", std::vector<int>(5, 0));
  const std::string msg = data_error_of(
      [&] { train::Trainer t(deck(train, {"--data.val=" + val, "--train.eval_every=1"}), one_rank()); });
  EXPECT_NE(msg.find("data.val='" + val + "' gives no target tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.eval_every=0"), std::string::npos) << msg;
  // Without evaluation the same validation set is not read for batches: no error.
  EXPECT_NO_THROW(train::Trainer t(deck(train, {"--data.val=" + val}), one_rank()));
}

TEST(TrainerInputs, ResumePastTheEndSaysTheRunIsComplete) {
  const auto train = dataset("resume", std::vector<int>(20, 30));
  const std::string dir = (fs::current_path() / "trainer-inputs-ck").string();
  fs::remove_all(dir);
  {
    train::Trainer t(deck(train, {"--checkpoint.dir=" + dir, "--checkpoint.at_end=true"}), one_rank());
    t.run();
    ASSERT_EQ(t.current_step(), 3);
  }
  auto cfg = deck(train, {"--checkpoint.dir=" + dir, "--checkpoint.resume=auto", "--checkpoint.at_end=true",
                         "--log.level=info"});
  cfg.train.steps = 2;
  train::Trainer t(cfg, one_rank());
  EXPECT_EQ(t.current_step(), 3);
  testing::internal::CaptureStdout();
  t.run();
  spdlog::default_logger()->flush();
  std::fflush(stdout);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("run already complete: checkpoint"), std::string::npos) << out;
  EXPECT_NE(out.find("is at step 3 (its last step), train.steps=2"), std::string::npos) << out;
  EXPECT_EQ(out.find("final loss 0.0000"), std::string::npos) << out;
  EXPECT_EQ(t.current_step(), 3);
  EXPECT_FALSE(fs::exists(dir + "/step_000002.h5"));
  fs::remove_all(dir);
}

// TP advice: the start-up advice against tp > 1 on one small host — exactly
// when tp > 1, every rank is on the host and it has < 4 cores per rank.
TEST(TrainerInputs, TpHostAdviceOnlyForTpOnASmallSharedHost) {
  const std::string w = train::tp_host_advice(2, 2, 2, 2);
  EXPECT_NE(w.find("parallel.tp=2 with all 2 ranks on one host of 2 cores"), std::string::npos) << w;
  EXPECT_NE(w.find("Prefer parallel.dp"), std::string::npos) << w;
  EXPECT_FALSE(train::tp_host_advice(2, 2, 2, 7).empty());   // 3.5 cores per rank: still few
  EXPECT_TRUE(train::tp_host_advice(2, 2, 2, 8).empty());    // 4 per rank: not advised against
  EXPECT_TRUE(train::tp_host_advice(1, 2, 2, 2).empty());    // tp = 1 (dp = 2): never
  EXPECT_TRUE(train::tp_host_advice(2, 4, 0, 2).empty());    // ranks on several hosts
  EXPECT_FALSE(train::tp_host_advice(4, 8, 8, 16).empty());  // 2 cores per rank
}
