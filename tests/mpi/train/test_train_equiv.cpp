// Layout equivalence (DESIGN §3, issue [C]/[D]): for the same deck, seed and
// data, every 4D layout (dp, pp, cp, tp) must give the same per-step loss,
// global gradient norm and — after 10 steps — the same parameters as the
// 1-rank run. The 1-rank run is computed inside this test (rank 0, on a grid
// over MPI_COMM_SELF) and broadcast; never compared against stored numbers.
//
// One executable; tests are grouped by world size (Np2.*, Np4.*, Np16.*), and
// ctest entries select groups with --gtest_filter (tests/mpi/train/CMakeLists.txt).
// Tests whose world size differs from the run's are skipped.
#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/core/config.hpp"
#include "wlb4d/data/dataset.hpp"
#include "wlb4d/grid/process_grid.hpp"
#include "wlb4d/train/trainer.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <random>
#include <string>
#include <vector>

using namespace wlb;

namespace {

constexpr int kSteps = 10;
constexpr int kVocab = 97;  // uneven over tp = 2 and tp = 4

int wrank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int wsize() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
const comm::Communicator& world() {
  static comm::Communicator w = comm::Communicator::world(comm::WaitMode::Yield);
  return w;
}

/// Any exception on one rank would leave the others waiting in a collective:
/// print it and abort the whole job (the ctest entry fails at once).
template <class F>
auto or_abort(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[r%d] %s: %s\n", wrank(), what, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  std::abort();
}

/// Removes the datasets written by this run (rank 0) at exit.
struct Cleanup {
  std::vector<std::string> files;
  ~Cleanup() {
    for (const auto& f : files) std::remove(f.c_str());
  }
};
Cleanup& cleanup() {
  static Cleanup c;
  return c;
}

/// Token datasets with vocabulary 97 (EOS = 96), written by rank 0.
///  - "mixed": 400 documents, lengths 1..40 with some 41..120 (longer than
///    max_seq_len, so the fixed packer cuts them), including length-1 docs.
///  - "tiny":  600 documents of 1..3 tokens (shorter than 2·cp; many
///    micro-batch CP shards without target tokens).
std::string dataset(const std::string& kind) {
  static std::map<std::string, std::string> made;
  auto it = made.find(kind);
  if (it != made.end()) return it->second;
  long id = wrank() == 0 ? long(getpid()) : 0;
  world().broadcast(&id, 1, 0);
  const std::string path = "equiv_" + kind + "_" + std::to_string(id) + ".h5";
  if (wrank() == 0) {
    or_abort("writing the test dataset", [&] {
      data::TokenDatasetWriter w(path, "bytes", kVocab, kVocab - 1, "test_train_equiv " + kind, "");
      std::mt19937_64 rng(kind == "tiny" ? 11 : 5);
      const int docs = kind == "tiny" ? 600 : 400;
      for (int d = 0; d < docs; ++d) {
        std::int64_t len;  // tokens before EOS
        if (kind == "tiny")
          len = std::int64_t(rng() % 3);
        else
          len = (rng() % 8 == 0) ? 40 + std::int64_t(rng() % 80) : std::int64_t(rng() % 40);
        std::vector<token_t> t(static_cast<std::size_t>(len));
        for (auto& x : t) x = token_t(rng() % (kVocab - 1));
        w.append(t);
      }
      w.finish();
      return 0;
    });
    cleanup().files.push_back(path);
  }
  world().barrier();
  made[kind] = path;
  return path;
}

std::string base_deck(const std::string& data_path) {
  return "[model]\nlayers = 3\nd_model = 32\nheads = 4\nkv_heads = 2\nffn_hidden = 48\n"
         "[parallel]\ndp = 1\npp = 1\ncp = 1\ntp = 1\nschedule = 1f1b\n"
         "[data]\ntrain = " + data_path + "\nshuffle = true\n"
         "[balance]\npacker = fixed\nsharding = sequence\ncalibrate = false\ncost_a = 1e-6\ncost_b = 1e-9\n"
         "[optim]\nlr = 1e-2\nmin_lr = 1e-3\nwarmup_steps = 3\nweight_decay = 0.1\ngrad_clip = 0.5\n"
         "[train]\nsteps = " + std::to_string(kSteps) +
         "\nmicro_batches = 4\nmax_seq_len = 32\nseed = 7\neval_every = 0\nprint_every = 1000\n"
         "[checkpoint]\nresume = never\nat_end = false\n"
         "[log]\ntiming_file =\nlevel = warn\n";
}

struct RunResult {
  std::vector<double> loss, gnorm, lr, clip;
  std::vector<std::int64_t> targets;
  std::vector<std::string> names;
  std::vector<std::vector<float>> params;  // per name, global shape
  double seconds = 0;
};

RunResult run(const core::Config& cfg, const grid::ProcessGrid& g) {
  return or_abort("training", [&] {
    RunResult r;
    const auto t0 = std::chrono::steady_clock::now();
    train::Trainer t(cfg, g);
    for (int s = 0; s < kSteps; ++s) {
      const auto sr = t.step();
      r.loss.push_back(sr.loss);
      r.gnorm.push_back(sr.grad_norm);
      r.lr.push_back(sr.lr);
      r.targets.push_back(sr.target_tokens);
    }
    r.names = t.parameter_names();
    for (const auto& n : r.names) r.params.push_back(t.gather_parameter(n));
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  });
}

/// The 1-rank run of `ref_ini` (rank 0 computes, everyone receives), cached by deck text.
const RunResult& reference(const std::string& ref_ini, const core::Config& ref_cfg) {
  static std::map<std::string, RunResult> cache;
  auto it = cache.find(ref_ini);
  if (it != cache.end()) return it->second;
  RunResult r;
  if (wrank() == 0) {
    grid::ProcessGrid self(1, 1, 1, 1, comm::WaitMode::Yield, MPI_COMM_SELF);
    r = run(ref_cfg, self);
  }
  // Broadcast (politely: the other ranks yield while rank 0 computes).
  std::vector<double> hdr(r.loss.size() * 3);
  long n = long(r.loss.size()), np = long(r.params.size());
  world().broadcast(&n, 1, 0);
  world().broadcast(&np, 1, 0);
  r.loss.resize(std::size_t(n));
  r.gnorm.resize(std::size_t(n));
  r.lr.resize(std::size_t(n));
  r.targets.resize(std::size_t(n));
  world().broadcast(r.loss.data(), r.loss.size(), 0);
  world().broadcast(r.gnorm.data(), r.gnorm.size(), 0);
  world().broadcast(r.lr.data(), r.lr.size(), 0);
  world().broadcast(r.targets.data(), r.targets.size(), 0);
  world().broadcast(&r.seconds, 1, 0);
  r.names.resize(std::size_t(np));
  r.params.resize(std::size_t(np));
  for (long i = 0; i < np; ++i) {
    long len[2] = {long(r.names[std::size_t(i)].size()), long(r.params[std::size_t(i)].size())};
    world().broadcast(len, 2, 0);
    r.names[std::size_t(i)].resize(std::size_t(len[0]));
    r.params[std::size_t(i)].resize(std::size_t(len[1]));
    world().broadcast(&r.names[std::size_t(i)][0], r.names[std::size_t(i)].size(), 0);
    world().broadcast(r.params[std::size_t(i)].data(), r.params[std::size_t(i)].size(), 0);
  }
  return cache.emplace(ref_ini, std::move(r)).first->second;
}

struct Layout {
  int dp = 1, pp = 1, cp = 1, tp = 1;
  std::string schedule = "1f1b";
  int virtual_stages = 1;
};

std::string describe(const Layout& l) {
  return "dp=" + std::to_string(l.dp) + " pp=" + std::to_string(l.pp) + " cp=" + std::to_string(l.cp) +
         " tp=" + std::to_string(l.tp) + " " + l.schedule + (l.virtual_stages > 1 ? " v=" + std::to_string(l.virtual_stages) : "");
}

/// Runs `layout` on MPI_COMM_WORLD with deck `overrides` on dataset `kind`
/// and compares with the 1-rank run of the same deck.
void expect_equivalent(const Layout& L, const std::vector<std::string>& overrides, const std::string& kind = "mixed") {
  ASSERT_EQ(L.dp * L.pp * L.cp * L.tp, wsize());
  const std::string ini = base_deck(dataset(kind));
  const core::Config ref_cfg = core::parse_deck_text(ini, overrides);
  const RunResult& ref = reference(core::to_ini(ref_cfg), ref_cfg);

  std::vector<std::string> ov = overrides;
  ov.push_back("parallel.dp=" + std::to_string(L.dp));
  ov.push_back("parallel.pp=" + std::to_string(L.pp));
  ov.push_back("parallel.cp=" + std::to_string(L.cp));
  ov.push_back("parallel.tp=" + std::to_string(L.tp));
  ov.push_back("parallel.schedule=" + L.schedule);
  ov.push_back("parallel.virtual_stages=" + std::to_string(L.virtual_stages));
  const core::Config cfg = core::parse_deck_text(ini, ov);
  grid::ProcessGrid g(L.dp, L.pp, L.cp, L.tp, comm::WaitMode::Yield, MPI_COMM_WORLD);
  const RunResult got = run(cfg, g);
  const std::string what = describe(L);
  if (wrank() == 0)
    std::printf("[ layout ] %-34s ref %.2f s, layout %.2f s, loss %.6f -> %.6f, gnorm[0] %.5f\n", what.c_str(),
                ref.seconds, got.seconds, ref.loss.front(), ref.loss.back(), ref.gnorm.front());

  ASSERT_EQ(got.loss.size(), ref.loss.size());
  for (std::size_t s = 0; s < ref.loss.size(); ++s) {
    EXPECT_EQ(got.targets[s], ref.targets[s]) << what << " step " << s;
    EXPECT_NEAR(got.loss[s], ref.loss[s], 1e-5 * std::abs(ref.loss[s])) << what << " loss at step " << s;
    EXPECT_NEAR(got.gnorm[s], ref.gnorm[s], 1e-4 * std::abs(ref.gnorm[s])) << what << " grad norm at step " << s;
    EXPECT_DOUBLE_EQ(got.lr[s], ref.lr[s]) << what << " step " << s;
  }
  // Clipping must be active in these decks (the clipped update is compared).
  EXPECT_GT(ref.gnorm.front(), ref_cfg.optim.grad_clip) << "grad_clip too large to test clipping";
  ASSERT_EQ(got.names, ref.names);
  double worst = 0;
  std::string worst_name;
  for (std::size_t i = 0; i < ref.names.size(); ++i) {
    const auto& a = got.params[i];
    const auto& b = ref.params[i];
    ASSERT_EQ(a.size(), b.size()) << ref.names[i];
    int bad = 0;
    for (std::size_t j = 0; j < b.size(); ++j) {
      const double diff = std::abs(double(a[j]) - double(b[j]));
      const double rel = diff / (std::abs(double(b[j])) + 1e-2);
      if (rel > worst) {
        worst = rel;
        worst_name = ref.names[i];
      }
      if (diff > 1e-4 * std::abs(double(b[j])) + 1e-6 && bad++ < 3)
        ADD_FAILURE() << what << ": " << ref.names[i] << "[" << j << "] = " << a[j] << ", 1-rank " << b[j];
    }
  }
  if (wrank() == 0) std::printf("[ layout ] %-34s worst param diff %.2e (%s)\n", what.c_str(), worst, worst_name.c_str());
}

Layout lay(int dp, int pp, int cp, int tp, std::string sched = "1f1b", int v = 1) {
  Layout l;
  l.dp = dp;
  l.pp = pp;
  l.cp = cp;
  l.tp = tp;
  l.schedule = std::move(sched);
  l.virtual_stages = v;
  return l;
}

#define REQUIRE_WORLD(n)                                                   \
  if (wsize() != (n)) GTEST_SKIP() << "needs " << (n) << " ranks"

}  // namespace

// ---- 2 ranks: every axis alone, schedules, uneven shapes ---------------------------

TEST(Np2Axes, DataParallel) {
  REQUIRE_WORLD(2);
  expect_equivalent(lay(2, 1, 1, 1), {});
}
TEST(Np2Axes, PipelineParallel) {
  REQUIRE_WORLD(2);
  expect_equivalent(lay(1, 2, 1, 1), {});
}
TEST(Np2Axes, ContextParallelSequence) {
  REQUIRE_WORLD(2);
  expect_equivalent(lay(1, 1, 2, 1), {"balance.sharding=sequence"});
}
TEST(Np2Axes, ContextParallelDocument) {
  REQUIRE_WORLD(2);
  expect_equivalent(lay(1, 1, 2, 1), {"balance.sharding=document"});
}
TEST(Np2Axes, TensorParallelUnevenVocab) {
  REQUIRE_WORLD(2);
  expect_equivalent(lay(1, 1, 1, 2), {});  // vocab 97 = 49 + 48, ffn 48 = 24 + 24
}
TEST(Np2Axes, TensorParallelUnevenFfn) {
  REQUIRE_WORLD(2);
  expect_equivalent(lay(1, 1, 1, 2), {"model.ffn_hidden=47"});
}

TEST(Np2Schedules, GPipe) {
  REQUIRE_WORLD(2);
  expect_equivalent(lay(1, 2, 1, 1, "gpipe"), {});
}
TEST(Np2Schedules, OneFOneBFiveLayers) {
  REQUIRE_WORLD(2);
  expect_equivalent(lay(1, 2, 1, 1, "1f1b"), {"model.layers=5"});  // 3 + 2 layers
}
TEST(Np2Schedules, Interleaved) {
  REQUIRE_WORLD(2);
  expect_equivalent(lay(1, 2, 1, 1, "interleaved", 2), {"model.layers=5"});
}
TEST(Np2Schedules, BreadthFirst) {
  REQUIRE_WORLD(2);
  expect_equivalent(lay(1, 2, 1, 1, "bfs", 2), {"model.layers=5"});
}

TEST(Np2Uneven, TinyDocumentsContextParallel) {
  REQUIRE_WORLD(2);
  // Documents of 1-3 tokens (< 2·cp): shards with no targets, documents on one rank.
  expect_equivalent(lay(1, 1, 2, 1), {"balance.sharding=document"}, "tiny");
  expect_equivalent(lay(1, 1, 2, 1), {"balance.sharding=sequence", "train.max_seq_len=7"}, "tiny");
}
TEST(Np2Uneven, WlbTinyMicroBatchesContextParallel) {
  REQUIRE_WORLD(2);
  // Variable-length micro-batches of tiny documents: some CP shards hold 0 or 1 token.
  expect_equivalent(lay(1, 1, 2, 1), {"balance.packer=wlb", "balance.sharding=document", "train.max_seq_len=6"},
                    "tiny");
}

// ---- 4 ranks --------------------------------------------------------------------------

TEST(Np4Axes, TensorParallel4) {
  REQUIRE_WORLD(4);
  expect_equivalent(lay(1, 1, 1, 4), {"model.kv_heads=4", "model.ffn_hidden=50"});
}
TEST(Np4Axes, PipelineParallel4) {
  REQUIRE_WORLD(4);
  expect_equivalent(lay(1, 4, 1, 1), {"model.layers=5"});
}
TEST(Np4Axes, ContextParallel4Document) {
  REQUIRE_WORLD(4);
  expect_equivalent(lay(1, 1, 4, 1), {"balance.sharding=document"});
}
TEST(Np4Combined, DpPp) {
  REQUIRE_WORLD(4);
  expect_equivalent(lay(2, 2, 1, 1), {});
}
TEST(Np4Combined, CpTp) {
  REQUIRE_WORLD(4);
  expect_equivalent(lay(1, 1, 2, 2), {"balance.sharding=document"});
}
TEST(Np4Combined, DpCp) {
  REQUIRE_WORLD(4);
  expect_equivalent(lay(2, 1, 2, 1), {});
}
TEST(Np4Combined, PpTpInterleaved) {
  REQUIRE_WORLD(4);
  expect_equivalent(lay(1, 2, 1, 2, "interleaved", 2), {"model.layers=4"});
}

// Every packer × sharding on (1, 2, 2, 1) (issue [D]).
class Np4Packers : public ::testing::TestWithParam<std::tuple<const char*, const char*>> {};
TEST_P(Np4Packers, PpCp) {
  REQUIRE_WORLD(4);
  const std::string packer = std::get<0>(GetParam()), sharding = std::get<1>(GetParam());
  expect_equivalent(lay(1, 2, 2, 1), {"balance.packer=" + packer, "balance.sharding=" + sharding,
                                      "balance.max_tokens=48"});
}
INSTANTIATE_TEST_SUITE_P(All, Np4Packers,
                         ::testing::Combine(::testing::Values("fixed", "greedy", "wlb"),
                                            ::testing::Values("sequence", "document", "adaptive")));

// ---- 16 ranks --------------------------------------------------------------------------

TEST(Np16, AllFour) {
  REQUIRE_WORLD(16);
  expect_equivalent(lay(2, 2, 2, 2), {"balance.sharding=document"});
}
