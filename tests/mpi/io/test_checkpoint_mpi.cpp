// GridShape-independent checkpoints across ranks (DESIGN §3): a checkpoint
// written by one (dp, pp, cp, tp[, virtual stages]) layout is read by others —
// on the same ranks, on a subset, and on every rank alone — and every element
// of every value and AdamW moment matches the 1-rank model / the moments'
// defining formula. Failures (a corrupt chunk held by one rank, a wrong deck
// shape) reach every rank, and resume=auto falls back collectively.
#include "test_util.hpp"
#include "../../unit/io/ckpt_test_util.hpp"

#include "wlb4d/core/error.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>

using namespace wlb;
using namespace ckpt_test;
namespace fs = std::filesystem;

using wlb::test::world_rank;
using wlb::test::world_size;

namespace {


std::string base_dir() { return "np" + std::to_string(world_size()); }

/// Layouts of `n` ranks exercised here (uneven vocab/ffn/layer splits, CP and
/// DP replicas, interleaved virtual stages).
std::vector<GridShape> layouts_of(int n) {
  switch (n) {
    case 1: return {{1, 1, 1, 1, 1}, {1, 1, 1, 1, 2}};
    case 2: return {{1, 1, 1, 2, 1}, {1, 2, 1, 1, 1}, {2, 1, 1, 1, 1}, {1, 1, 2, 1, 1}, {1, 2, 1, 1, 2}};
    case 4: return {{1, 1, 1, 4, 1}, {1, 2, 1, 2, 1}, {2, 2, 1, 1, 1}, {1, 4, 1, 1, 1}, {1, 1, 2, 2, 1}};
    default: return {{1, 1, 1, n, 1}};
  }
}

/// Writes a checkpoint with layout L on world ranks [0, L.size()); returns its path.
std::string write_with(const GridShape& L, const std::string& dir, std::int64_t step) {
  MPI_Comm sub = MPI_COMM_NULL;
  const bool in = world_rank() < L.size();
  MPI_Comm_split(MPI_COMM_WORLD, in ? 0 : MPI_UNDEFINED, world_rank(), &sub);
  std::string path;
  if (in) {
    grid::ProcessGrid g(L.dp, L.pp, L.cp, L.tp, comm::WaitMode::Yield, sub);
    auto rm = make_rank_model(model_config(), kVocab, g, L.vstages, kSeed, /*fill_moments=*/true);
    train::CheckpointState st(g, rm.ptrs(), rm.m, rm.v);
    st.pull();
    core::CheckpointConfig cc;
    cc.dir = dir;
    cc.keep = 3;
    path = io::save_checkpoint(cc, g, st.tensors(), sample_state(step), sample_info(model_config(), kVocab));
    MPI_Comm_free(&sub);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return io::checkpoint_path(dir, step);
}

/// Reads `path` with layout L over `comm` and checks every local element.
void read_and_check(const std::string& path, const GridShape& L, MPI_Comm comm, std::int64_t step) {
  grid::ProcessGrid g(L.dp, L.pp, L.cp, L.tp, comm::WaitMode::Yield, comm);
  auto rm = make_rank_model(model_config(), kVocab, g, L.vstages, kSeed + 99, /*fill_moments=*/false);
  train::CheckpointState st(g, rm.ptrs(), rm.m, rm.v);
  const auto loaded = io::load_checkpoint(path, g, st.tensors(), model_config(), kVocab);
  st.push();
  Registry full(model_config(), kVocab, model::ModelShard{});
  full.init_parameters(kSeed);
  std::int64_t checked = 0;
  EXPECT_EQ(mismatches(rm, full, &checked), 0) << path << " read by " << L.str() << " (rank " << g.rank() << ")";
  EXPECT_GT(checked, 0);
  EXPECT_EQ(loaded.state, sample_state(step));
  EXPECT_EQ(loaded.info.deck, sample_info(model_config(), kVocab).deck);
  EXPECT_EQ(loaded.info.dataset_identity, sample_info(model_config(), kVocab).dataset_identity);
  EXPECT_EQ(loaded.info.tensors.size(), std::size_t(1 + 9 * model_config().layers + 2));
}

}  // namespace

TEST(CheckpointMpi, EveryWriterLayoutIsReadByEveryReaderLayout) {
  // Writes are collective and slow when ranks outnumber cores (every test
  // here), reads are independent: at 4 ranks write with two layouts only —
  // pp=2 x tp=2 on all ranks and tp=2 on 2 of the 4 — and read with all.
  const int n = world_size();
  std::vector<GridShape> writers = layouts_of(n);
  if (n == 4) writers = {{1, 2, 1, 2, 1}, {1, 1, 1, 2, 1}};
  std::vector<GridShape> readers = layouts_of(n);
  std::int64_t step = 1;
  for (const auto& W : writers) {
    const std::string dir = base_dir() + "/layouts/" + W.str();
    if (world_rank() == 0) fs::remove_all(dir);
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string path = write_with(W, dir, step);
    // The writer layout is recorded, informational only.
    const auto info = io::read_checkpoint_info(path);
    EXPECT_EQ(info.layout[0], W.dp);
    EXPECT_EQ(info.layout[1], W.pp);
    EXPECT_EQ(info.layout[2], W.cp);
    EXPECT_EQ(info.layout[3], W.tp);
    for (const auto& R : readers) {
      SCOPED_TRACE("written by " + W.str() + ", read by " + R.str());
      read_and_check(path, R, MPI_COMM_WORLD, step);
    }
    // Every rank alone (1-rank layout over MPI_COMM_SELF, all at once).
    read_and_check(path, GridShape{}, MPI_COMM_SELF, step);
    read_and_check(path, GridShape{1, 1, 1, 1, 2}, MPI_COMM_SELF, step);
    ++step;
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(CheckpointMpi, CorruptChunkOnOneRankFailsEveryRankAutoFallsBackAndShapesAreChecked) {
  const int n = world_size();
  const GridShape L{1, 1, 1, n, 1};
  const std::string dir = base_dir() + "/fallback";
  if (world_rank() == 0) fs::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string p10 = write_with(L, dir, 10);
  const std::string p20 = write_with(L, dir, 20);
  // The last chunk of lm_head's second moment: held by the last TP rank only.
  if (world_rank() == 0) {
    const hsize_t last = hsize_t(n - 1);  // chunks are one TP shard each here
    flip_chunk_byte(p20, "/optim/v/lm_head.weight", last);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  grid::ProcessGrid g(L.dp, L.pp, L.cp, L.tp);
  auto rm = make_rank_model(model_config(), kVocab, g, 1, kSeed + 5, false);
  train::CheckpointState st(g, rm.ptrs(), rm.m, rm.v);
  // Direct load of the damaged file: every rank throws, naming file and dataset.
  try {
    io::load_checkpoint(p20, g, st.tensors(), model_config(), kVocab);
    ADD_FAILURE() << "load of a corrupt checkpoint succeeded on rank " << g.rank();
  } catch (const core::CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p20), std::string::npos) << msg;
    EXPECT_NE(msg.find("/optim/v/lm_head.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Fletcher32"), std::string::npos) << msg;
  }
  // resume=auto: the verification pass rejects step 20 on every rank and takes step 10.
  std::vector<std::string> skipped;
  const auto chosen = io::resolve_resume(dir, "auto", g.world(), &skipped);
  ASSERT_TRUE(chosen.has_value());
  EXPECT_EQ(*chosen, p10);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("step_000020.h5"), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[0].find("/optim/v/lm_head.weight"), std::string::npos) << skipped[0];
  const auto loaded = io::load_checkpoint(*chosen, g, st.tensors(), model_config(), kVocab);
  st.push();
  EXPECT_EQ(loaded.state.step, 10);
  Registry full(model_config(), kVocab, model::ModelShard{});
  full.init_parameters(kSeed);
  EXPECT_EQ(mismatches(rm, full), 0);
  // An explicitly named corrupt file is an error (no fallback), on every rank.
  EXPECT_THROW(io::resolve_resume(dir, p20, g.world()), core::CheckpointError);

  // A deck whose model differs: every rank reports both shapes (the
  // mismatching tensor is held by every TP rank, the message is agreed).
  auto other = model_config();
  other.ffn_hidden = 44;
  auto rm2 = make_rank_model(other, kVocab, g, 1, kSeed, false);
  train::CheckpointState st2(g, rm2.ptrs(), rm2.m, rm2.v);
  try {
    io::load_checkpoint(p10, g, st2.tensors(), other, kVocab);
    ADD_FAILURE() << "shape mismatch not detected on rank " << g.rank();
  } catch (const core::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint " + p10 +
                                         ": /model/layers.0.mlp.w_gate has shape [42][32] but the deck's model "
                                         "needs [44][32]"),
              std::string::npos)
        << e.what();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
