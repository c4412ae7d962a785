// Checkpoint writer/reader on one rank: round trip, damage of every kind
// (checksum, truncation, missing dataset, not HDF5), deck mismatch messages,
// resume=auto|never|<path> with fallback, keep-N retention, atomicity, the
// writers' coverage rule, and the fixtures the wlb4d-ckpt / plot_timing.py
// tests read (ckpt_fixture/, timing_fixture.h5).
#include "ckpt_test_util.hpp"

#include "wlb4d/core/error.hpp"
#include "wlb4d/io/timing_log.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace wlb;
using namespace ckpt_test;
namespace fs = std::filesystem;

namespace {

struct OneRank {
  grid::ProcessGrid g{1, 1, 1, 1, comm::WaitMode::Yield, MPI_COMM_SELF};
  RankModel rm;
  std::unique_ptr<train::CheckpointState> st;
  OneRank(const core::ModelConfig& cfg, std::uint64_t seed, bool moments, int vstages = 1) {
    rm = make_rank_model(cfg, kVocab, g, vstages, seed, moments);
    st = std::make_unique<train::CheckpointState>(g, rm.ptrs(), rm.m, rm.v);
    st->pull();
  }
};

std::string fresh_dir(const std::string& name) {
  const std::string d = "unit_ckpt/" + name;
  fs::remove_all(d);
  return d;
}

std::string save(const std::string& dir, std::int64_t step, int keep = 3,
                 const core::ModelConfig& model = model_config()) {
  OneRank w(model, kSeed, true);
  core::CheckpointConfig cc;
  cc.dir = dir;
  cc.keep = keep;
  return io::save_checkpoint(cc, w.g, w.st->tensors(), sample_state(step), sample_info(model, kVocab));
}

/// Loads into a fresh 1-rank model (different seed); returns the error text, "" if none.
std::string load_error(const std::string& path, const core::ModelConfig& cfg = model_config()) {
  OneRank r(cfg, kSeed + 1, false);
  try {
    io::load_checkpoint(path, r.g, r.st->tensors(), cfg, kVocab);
  } catch (const core::CheckpointError& e) {
    return e.what();
  }
  return "";
}

std::string read_text(const std::string& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(Checkpoint, RoundTripRestoresValuesMomentsAndState) {
  const std::string dir = fresh_dir("roundtrip");
  const std::string path = save(dir, 42);
  EXPECT_EQ(path, dir + "/step_000042.h5");
  EXPECT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(read_text(dir + "/latest"), "step_000042.h5\n");
  // Read with two chunks on one rank (interleaved-style split) from a 1-chunk write.
  for (int vst : {1, 2}) {
    OneRank r(model_config(), kSeed + 1, false, vst);
    const auto loaded = io::load_checkpoint(path, r.g, r.st->tensors(), model_config(), kVocab);
    r.st->push();
    Registry full(model_config(), kVocab, model::ModelShard{});
    full.init_parameters(kSeed);
    std::int64_t checked = 0;
    EXPECT_EQ(mismatches(r.rm, full, &checked), 0);
    EXPECT_EQ(checked, 3 * full.local_numel());
    EXPECT_EQ(loaded.state, sample_state(42));
    EXPECT_EQ(loaded.info.step, 42);
    EXPECT_EQ(loaded.info.tokens_seen, sample_state(42).tokens_seen);
    EXPECT_EQ(loaded.info.deck, sample_info(model_config(), kVocab).deck);
    EXPECT_EQ(loaded.info.vocab, kVocab);
    EXPECT_EQ(loaded.info.model.ffn_hidden, 42);
    // The parsed deck is the deck that was stored.
    EXPECT_EQ(core::parse_deck_text(loaded.info.deck).model.layers, model_config().layers);
  }
  // The tensor list is the registry's fixed order.
  Registry full(model_config(), kVocab, model::ModelShard{});
  const auto info = io::read_checkpoint_info(path);
  ASSERT_EQ(info.tensors.size(), full.size());
  for (std::size_t i = 0; i < full.size(); ++i) EXPECT_EQ(info.tensors[i], full[i].name);
  EXPECT_EQ(info.cost_source, "");  // none given: no cost model attributes
}

// The balancing cost model a run planned with travels in the checkpoint,
// bit for bit, so a resume with balance.calibrate=true plans with it again.
TEST(Checkpoint, CostModelAttributesRoundTrip) {
  const std::string dir = fresh_dir("cost_model");
  OneRank w(model_config(), kSeed, true);
  core::CheckpointConfig cc;
  cc.dir = dir;
  auto in = sample_info(model_config(), kVocab);
  in.cost_source = "calibrated";
  in.cost_a = 1.2345678901234567e-7;
  in.cost_b = 3.0000000000000004e-11;
  in.cost_c = 0.1 + 0.2;
  const std::string path = io::save_checkpoint(cc, w.g, w.st->tensors(), sample_state(7), in);
  const auto info = io::read_checkpoint_info(path);
  EXPECT_EQ(info.cost_source, "calibrated");
  EXPECT_EQ(info.cost_a, in.cost_a);
  EXPECT_EQ(info.cost_b, in.cost_b);
  EXPECT_EQ(info.cost_c, in.cost_c);
  OneRank r(model_config(), kSeed + 1, false);
  const auto loaded = io::load_checkpoint(path, r.g, r.st->tensors(), model_config(), kVocab);
  EXPECT_EQ(loaded.info.cost_source, "calibrated");
  EXPECT_EQ(loaded.info.cost_b, in.cost_b);
}

// The training set's tokenizer travels with the checkpoint (export and
// sampling decode with it); a file without it (older) reads as "not stored".
TEST(Checkpoint, TokenizerRecordRoundTripsAndOlderFilesHaveNone) {
  const std::string dir = fresh_dir("tokenizer");
  OneRank w(model_config(), kSeed, true);
  core::CheckpointConfig cc;
  cc.dir = dir;
  auto in = sample_info(model_config(), kVocab);
  const std::string plain = io::save_checkpoint(cc, w.g, w.st->tensors(), sample_state(1), in);
  EXPECT_EQ(io::read_checkpoint_info(plain).tokenizer, "");
  EXPECT_EQ(io::read_checkpoint_tokenizer_model(plain), "");
  in.tokenizer = "sentencepiece";
  in.tokenizer_vocab = kVocab - 7;  // 7 padding rows
  in.eos_id = 2;
  in.bos_id = 1;
  std::string model(200000, '\0');  // > one 64 Ki chunk; every byte value
  for (std::size_t i = 0; i < model.size(); ++i) model[i] = char((i * 131 + i / 7) & 0xFF);
  in.tokenizer_model = model;
  const std::string path = io::save_checkpoint(cc, w.g, w.st->tensors(), sample_state(2), in);
  const auto info = io::read_checkpoint_info(path);
  EXPECT_EQ(info.tokenizer, "sentencepiece");
  EXPECT_EQ(info.tokenizer_vocab, kVocab - 7);
  EXPECT_EQ(info.eos_id, 2);
  EXPECT_EQ(info.bos_id, 1);
  EXPECT_EQ(io::read_checkpoint_tokenizer_model(path), model);
  io::verify_checkpoint(path);
  // A tokenizer record that contradicts the model record is damage.
  {
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    const std::int64_t big = kVocab + 1;
    hid_t at = H5Aopen(f, "tokenizer_vocab", H5P_DEFAULT);
    ASSERT_GE(H5Awrite(at, H5T_NATIVE_INT64, &big), 0);
    H5Aclose(at);
    H5Fclose(f);
  }
  try {
    io::read_checkpoint_info(path);
    ADD_FAILURE() << "tokenizer_vocab above vocab_size was accepted";
  } catch (const core::CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "attribute tokenizer_vocab = 98 is not in 1 .. vocab_size = 97")) << e.what();
  }
}

// read_model_tensor (what an export streams) returns the stored tensor at its
// global shape, equal to what a load puts into the model.
TEST(Checkpoint, ReadModelTensorEqualsTheLoadedParameter) {
  const std::string path = save(fresh_dir("read_tensor"), 3);
  OneRank r(model_config(), kSeed + 1, false);
  io::load_checkpoint(path, r.g, r.st->tensors(), model_config(), kVocab);
  for (const auto& t : r.st->tensors()) {
    const auto x = io::read_model_tensor(path, t.name);
    ASSERT_EQ(std::int64_t(x.size()), t.count[0] * (t.count.size() > 1 ? t.count[1] : 1)) << t.name;
    for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], t.value[i]) << t.name << "[" << i << "]";
  }
  try {
    io::read_model_tensor(path, "layers.9.attn.wq");
    ADD_FAILURE() << "an unknown tensor name was read";
  } catch (const core::CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "holds no tensor 'layers.9.attn.wq'")) << e.what();
  }
}

TEST(Checkpoint, SummaryNormsMatchAnIndependentComputation) {
  const std::string path = save(fresh_dir("summary"), 5);
  Registry full(model_config(), kVocab, model::ModelShard{});
  full.init_parameters(kSeed);
  const auto sums = io::summarize_checkpoint(path);
  ASSERT_EQ(sums.size(), 3 * full.size());
  auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), full.values());
  for (std::size_t i = 0; i < full.size(); ++i) {
    const auto& p = full[i];
    double sv = 0, sm = 0, svv = 0;
    for (std::int64_t k = 0; k < p.global_numel(); ++k) {
      const double x = h(p.offset + std::size_t(k)), m = expected_m(p.name, k), v = expected_v(p.name, k);
      sv += x * x;
      sm += m * m;
      svv += v * v;
    }
    EXPECT_EQ(sums[i].dataset, "/model/" + p.name);
    EXPECT_EQ(sums[i].shape, p.global_shape);
    EXPECT_NEAR(sums[i].l2, std::sqrt(sv), 1e-9 * std::max(1.0, std::sqrt(sv)));
    EXPECT_EQ(sums[full.size() + i].dataset, "/optim/m/" + p.name);
    EXPECT_NEAR(sums[full.size() + i].l2, std::sqrt(sm), 1e-9);
    EXPECT_NEAR(sums[2 * full.size() + i].l2, std::sqrt(svv), 1e-9);
  }
}

TEST(Checkpoint, FlippedChunkByteNamesTheDataset) {
  const std::string path = save(fresh_dir("flip"), 7);
  flip_chunk_byte(path, "/model/layers.1.attn.wq");
  const std::string err = load_error(path);
  EXPECT_TRUE(contains(err, "checkpoint " + path)) << err;
  EXPECT_TRUE(contains(err, "/model/layers.1.attn.wq")) << err;
  EXPECT_TRUE(contains(err, "Fletcher32")) << err;
  try {
    io::verify_checkpoint(path);
    ADD_FAILURE() << "verify passed a corrupt file";
  } catch (const core::CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "/model/layers.1.attn.wq")) << e.what();
  }
  EXPECT_THROW(io::summarize_checkpoint(path), core::CheckpointError);
}

// Checkpoint integrity: the metadata must be checksummed (superblock v2+, v2 object
// headers, "OHDR"), so a flipped bit in an object header is detected — not
// silently read as other values. Every object header of the file is tried.
TEST(Checkpoint, MetadataIsChecksummedAndAFlippedHeaderBitIsDetected) {
  const std::string path = save(fresh_dir("meta"), 7);
  {
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    H5F_info2_t info{};
    ASSERT_GE(H5Fget_info2(f, &info), 0);
    EXPECT_GE(info.super.version, 2u) << "superblock v0/v1 carries no checksum";
    H5Fclose(f);
  }
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::size_t> headers;
  for (auto at = bytes.find("OHDR"); at != std::string::npos; at = bytes.find("OHDR", at + 4)) headers.push_back(at);
  ASSERT_GE(headers.size(), 10u) << "expected v2 object headers (OHDR) for the datasets";
  int undetected = 0;
  for (std::size_t i = 0; i < headers.size(); i += std::max<std::size_t>(1, headers.size() / 25)) {
    const std::string copy = path + ".flip";
    fs::copy_file(path, copy, fs::copy_options::overwrite_existing);
    {
      std::fstream io(copy, std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(std::streamoff(headers[i] + 12));  // inside the header, past signature/version/flags
      char c = bytes[headers[i] + 12];
      c = char(c ^ 0x10);
      io.write(&c, 1);
    }
    try {
      io::verify_checkpoint(copy);
      ++undetected;
    } catch (const core::CheckpointError&) {
    }
  }
  EXPECT_EQ(undetected, 0) << "object-header bit flips passed verify";
}

TEST(Checkpoint, TruncatedFileIsReported) {
  const std::string path = save(fresh_dir("trunc"), 7);
  fs::resize_file(path, fs::file_size(path) / 2);
  const std::string err = load_error(path);
  EXPECT_TRUE(contains(err, "checkpoint " + path)) << err;
  EXPECT_TRUE(contains(err, "truncated")) << err;
  EXPECT_THROW(io::verify_checkpoint(path), core::CheckpointError);
}

TEST(Checkpoint, MissingDatasetIsNamed) {
  const std::string path = save(fresh_dir("missing"), 7);
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(H5Ldelete(f, "/optim/m/layers.3.mlp.w_up", H5P_DEFAULT), 0);
  H5Fclose(f);
  const std::string err = load_error(path);
  EXPECT_TRUE(contains(err, "missing dataset /optim/m/layers.3.mlp.w_up")) << err;
  try {
    io::verify_checkpoint(path);
    ADD_FAILURE() << "verify passed a file with a missing dataset";
  } catch (const core::CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "missing dataset /optim/m/layers.3.mlp.w_up")) << e.what();
  }
}

// A tensor stored with an integer datatype (same name and shape) is refused
// by load and verify, naming the dataset and the expected type, before any
// value is converted (HDF5 would silently convert int32 to float).
TEST(Checkpoint, WrongDatatypeIsNamed) {
  const std::string path = save(fresh_dir("dtype"), 7);
  const char* name = "/model/layers.1.attn.wq";
  {
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    ASSERT_GE(ds, 0);
    hid_t sp = H5Dget_space(ds);
    H5Dclose(ds);
    ASSERT_GE(H5Ldelete(f, name, H5P_DEFAULT), 0);
    hid_t bad = H5Dcreate2(f, name, H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(bad, 0);
    std::vector<std::int32_t> zeros(std::size_t(H5Sget_simple_extent_npoints(sp)), 0);
    ASSERT_GE(H5Dwrite(bad, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros.data()), 0);
    H5Dclose(bad);
    H5Sclose(sp);
    H5Fclose(f);
  }
  const std::string want = std::string(name) + " has the wrong datatype (expected float32)";
  const std::string err = load_error(path);
  EXPECT_TRUE(contains(err, "checkpoint " + path)) << err;
  EXPECT_TRUE(contains(err, want)) << err;
  try {
    io::verify_checkpoint(path);
    ADD_FAILURE() << "verify passed a tensor stored as int32";
  } catch (const core::CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), want)) << e.what();
  }
}

TEST(Checkpoint, NotHdf5AndMissingFileAreReported) {
  const std::string dir = fresh_dir("nothdf5");
  fs::create_directories(dir);
  const std::string junk = dir + "/step_000001.h5";
  std::ofstream(junk) << "this is not an HDF5 file\n";
  EXPECT_TRUE(contains(load_error(junk), "not an HDF5 file")) << load_error(junk);
  EXPECT_TRUE(contains(load_error(dir + "/nope.h5"), "no such file"));
}

TEST(Checkpoint, DeckShapeMismatchNamesBothShapes) {
  const std::string path = save(fresh_dir("shape"), 7);
  auto bigger = model_config();
  bigger.d_model = 64;
  bigger.heads = 16;
  bigger.kv_heads = 8;  // head_dim 4 as before; every matrix changes shape
  const std::string err = load_error(path, bigger);
  EXPECT_TRUE(contains(err, "checkpoint " + path + ": /model/embed.weight has shape [97][32] but the deck's "
                                                   "model needs [97][64]"))
      << err;
  EXPECT_TRUE(contains(err, "d_model=32")) << err;
  EXPECT_TRUE(contains(err, "d_model=64")) << err;
  // More layers: the first tensor the checkpoint lacks is named.
  auto deeper = model_config();
  deeper.layers = 6;
  const std::string err2 = load_error(path, deeper);
  EXPECT_TRUE(contains(err2, "has no /model/layers.5.attn_norm.weight")) << err2;
  // Same shapes, other head split: caught by the model attributes.
  auto heads = model_config();
  heads.heads = 4;
  heads.kv_heads = 2;  // head_dim 8: wq [32][32], wk [16][32] as before
  const std::string err3 = load_error(path, heads);
  EXPECT_TRUE(contains(err3, "was written for another model")) << err3;
  EXPECT_TRUE(contains(err3, "heads=8")) << err3;
  EXPECT_TRUE(contains(err3, "heads=4")) << err3;
}

TEST(Checkpoint, ResumeModes) {
  const auto self = comm::Communicator::self();
  const std::string dir = fresh_dir("resume");
  EXPECT_FALSE(io::resolve_resume(dir, "never", self).has_value());
  EXPECT_FALSE(io::resolve_resume(dir, "auto", self).has_value());  // no directory yet: fresh start
  const std::string p1 = save(dir, 1), p2 = save(dir, 2);
  EXPECT_EQ(io::resolve_resume(dir, "auto", self).value(), p2);
  EXPECT_EQ(io::resolve_resume("elsewhere", p1, self).value(), p1);     // explicit file
  EXPECT_EQ(io::resolve_resume("elsewhere", dir, self).value(), p2);    // explicit directory
  EXPECT_FALSE(io::resolve_resume(dir, "never", self).has_value());
  try {
    io::resolve_resume(dir, dir + "/step_000099.h5", self);
    ADD_FAILURE() << "a missing explicit checkpoint was accepted";
  } catch (const core::CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "step_000099.h5")) << e.what();
  }
  EXPECT_THROW(io::resolve_resume(dir, fresh_dir("empty_explicit"), self), core::CheckpointError);
}

TEST(Checkpoint, AutoFallsBackToThePreviousCheckpointWhenTheNewestIsCorrupt) {
  const auto self = comm::Communicator::self();
  const std::string dir = fresh_dir("fallback");
  const std::string p10 = save(dir, 10), p20 = save(dir, 20);
  flip_chunk_byte(p20, "/optim/m/layers.0.attn.wk");
  std::vector<std::string> skipped;
  EXPECT_EQ(io::resolve_resume(dir, "auto", self, &skipped).value(), p10);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_TRUE(contains(skipped[0], p20)) << skipped[0];
  EXPECT_TRUE(contains(skipped[0], "/optim/m/layers.0.attn.wk")) << skipped[0];
  // Explicitly named: no fallback.
  EXPECT_THROW(io::resolve_resume(dir, p20, self), core::CheckpointError);
  // All listed checkpoints damaged: an error naming each.
  fs::resize_file(p10, 100);
  try {
    io::resolve_resume(dir, "auto", self);
    ADD_FAILURE() << "no usable checkpoint, but resolve_resume chose one";
  } catch (const core::CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "no usable checkpoint")) << e.what();
    EXPECT_TRUE(contains(e.what(), p10)) << e.what();
    EXPECT_TRUE(contains(e.what(), p20)) << e.what();
  }
}

// Checkpoint integrity: a newest checkpoint that is intact but written for another model
// (here one layer more) is skipped by resume=auto like a corrupt one, with
// the reason; named explicitly, it is not skipped (load gives the shape error).
TEST(Checkpoint, AutoFallsBackWhenTheNewestWasWrittenForAnotherModel) {
  const auto self = comm::Communicator::self();
  const std::string dir = fresh_dir("fallback_model");
  auto other = model_config();
  other.layers += 1;
  const std::string p10 = save(dir, 10), p20 = save(dir, 20, 3, other);
  const auto usable = [](const std::string& p) { return io::checkpoint_model_mismatch(p, model_config(), kVocab); };
  EXPECT_EQ(io::checkpoint_model_mismatch(p10, model_config(), kVocab), "");
  std::vector<std::string> skipped;
  EXPECT_EQ(io::resolve_resume(dir, "auto", self, &skipped, usable).value(), p10);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_TRUE(contains(skipped[0], p20)) << skipped[0];
  EXPECT_TRUE(contains(skipped[0], "another model")) << skipped[0];
  EXPECT_EQ(io::resolve_resume(dir, p20, self, nullptr, usable).value(), p20);
  EXPECT_TRUE(contains(load_error(p20), "another model")) << load_error(p20);
}

// Checkpoint integrity: `latest` may only name files of checkpoint.dir itself. A
// `latest` that names anything else, or is no list at all (a directory,
// /dev/zero behind a symlink, binary garbage, missing), is never followed:
// resume=auto takes the newest step file of the directory that verifies.
TEST(Checkpoint, AnUnusableLatestFallsBackToTheStepFilesOfTheDirectory) {
  const auto self = comm::Communicator::self();
  const std::string dir = fresh_dir("latest_outside");
  const std::string other = fresh_dir("latest_outside_other");
  save(other, 10);
  const std::string p4 = save(dir, 4), p5 = save(dir, 5);
  const std::string latest = dir + "/latest";
  const auto make_latest = [&](const std::string& kind) {
    fs::remove_all(latest);
    if (kind == "dir") fs::create_directory(latest);
    else if (kind == "devzero") fs::create_symlink("/dev/zero", latest);
    else if (kind == "garbage") std::ofstream(latest) << std::string("\x7f" "ELF\x01\x02\0\0zz", 10) << "\n";
    else if (kind != "missing") std::ofstream(latest) << kind << "\n";
  };
  for (const std::string kind : {"../latest_outside_other/step_000010.h5", "/etc/passwd", "dir", "devzero",
                                 "garbage", "missing", "step_000099.h5"}) {
    make_latest(kind);
    EXPECT_EQ(io::resolve_resume(dir, "auto", self).value(), p5) << kind;
    if (kind != "missing" && kind != "step_000099.h5") {
      try {  // wlb4d-ckpt's reading of a directory argument names the file
        io::list_checkpoints(dir);
        ADD_FAILURE() << "latest " << kind << " was listed";
      } catch (const core::CheckpointError& e) {
        EXPECT_TRUE(contains(e.what(), latest)) << e.what();
      }
    }
  }
  // A newer damaged step file is skipped; all of them damaged is an error, not a fresh start.
  make_latest("devzero");
  fs::resize_file(p5, 100);
  EXPECT_EQ(io::resolve_resume(dir, "auto", self).value(), p4);
  fs::resize_file(p4, 100);
  try {
    io::resolve_resume(dir, "auto", self);
    ADD_FAILURE() << "no usable step file, but resolve_resume chose one or started fresh";
  } catch (const core::CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "no usable checkpoint among the 2 step files of " + dir)) << e.what();
  }
  // No step file at all: an unusable `latest` (not a directory) is a fresh start.
  const std::string empty = fresh_dir("latest_only");
  std::ofstream(empty + "/latest") << "garbage\n";
  EXPECT_FALSE(io::resolve_resume(empty, "auto", self).has_value());
}

// A commit never overwrites a step file this process did not write: a resume
// from step 4 past a damaged step 5 keeps the damaged file aside.
TEST(Checkpoint, AStepFileNotWrittenByThisRunIsKeptAside) {
  const std::string src = save(fresh_dir("aside_src"), 6);
  const std::string dir = fresh_dir("aside");
  save(dir, 5);
  fs::copy_file(src, dir + "/step_000006.h5");  // not written by this process at this path
  const std::string p6 = save(dir, 6);
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(dir))
    if (contains(e.path().filename().string(), "step_000006.h5.replaced-")) kept.push_back(e.path().string());
  EXPECT_EQ(kept.size(), 1u);
  EXPECT_TRUE(fs::exists(p6));
  save(dir, 6);  // this run's own step file: replaced, nothing more kept aside
  kept.clear();
  for (const auto& e : fs::directory_iterator(dir))
    if (contains(e.path().filename().string(), ".replaced-")) kept.push_back(e.path().string());
  EXPECT_EQ(kept.size(), 1u);
}

TEST(Checkpoint, KeepsTheNewestN) {
  const std::string dir = fresh_dir("keep");
  for (int s = 1; s <= 5; ++s) save(dir, s, /*keep=*/2);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"latest", "step_000004.h5", "step_000005.h5"}));
  EXPECT_EQ(read_text(dir + "/latest"), "step_000005.h5\nstep_000004.h5\n");
  EXPECT_EQ(io::list_checkpoints(dir), (std::vector<std::string>{dir + "/step_000005.h5", dir + "/step_000004.h5"}));
  // An older unlisted step file found in the directory is deleted too.
  fs::copy_file(dir + "/step_000004.h5", dir + "/step_000002.h5");
  save(dir, 6, 2);
  EXPECT_FALSE(fs::exists(dir + "/step_000002.h5"));
  EXPECT_FALSE(fs::exists(dir + "/step_000004.h5"));
  EXPECT_TRUE(fs::exists(dir + "/step_000005.h5"));
}

TEST(Checkpoint, LeftoverTmpIsNeverResumedAndIsCleanedUp) {
  const auto self = comm::Communicator::self();
  const std::string dir = fresh_dir("atomic");
  const std::string p20 = save(dir, 20);
  // A crash after writing step 30's data but before the rename: even a
  // complete-looking .tmp is not a checkpoint.
  fs::copy_file(p20, dir + "/step_000030.h5.tmp");
  EXPECT_EQ(io::resolve_resume(dir, "auto", self).value(), p20);
  save(dir, 25);
  EXPECT_FALSE(fs::exists(dir + "/step_000030.h5.tmp"));
  EXPECT_EQ(io::resolve_resume(dir, "auto", self).value(), dir + "/step_000025.h5");
}

TEST(Checkpoint, WritersMustCoverEveryElementOnce) {
  OneRank w(model_config(), kSeed, true);
  core::CheckpointConfig cc;
  cc.dir = fresh_dir("coverage");
  auto tensors = w.st->tensors();
  std::size_t wq = 0;
  while (tensors[wq].name != "layers.0.attn.wq") ++wq;
  tensors[wq].writer = false;  // nobody writes layers.0.attn.wq
  try {
    io::save_checkpoint(cc, w.g, tensors, sample_state(1), sample_info(model_config(), kVocab));
    ADD_FAILURE() << "an unwritten tensor was accepted";
  } catch (const core::CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "writers cover 0 elements of layers.0.attn.wq")) << e.what();
  }
  EXPECT_FALSE(fs::exists(cc.dir + "/latest"));
}

TEST(Checkpoint, LargeChunksAreCutTo64MiB) {
  // A [17000][1024] float tensor (66.4 MiB) written as one replicated tensor:
  // its chunk must be cut along dimension 0 to <= 64 MiB (m and v share the buffer).
  grid::ProcessGrid g(1, 1, 1, 1, comm::WaitMode::Yield, MPI_COMM_SELF);
  std::vector<float> val(17000 * 1024, 0.5f);
  io::TensorRef t;
  t.name = "big";
  t.global_shape = {17000, 1024};
  t.held = t.writer = true;
  t.start = {0, 0};
  t.count = t.global_shape;
  t.value = val.data();
  t.m = val.data();
  t.v = val.data();
  core::CheckpointConfig cc;
  cc.dir = fresh_dir("bigchunk");
  const auto path = io::save_checkpoint(cc, g, {t}, sample_state(1), sample_info(model_config(), kVocab));
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t ds = H5Dopen2(f, "/model/big", H5P_DEFAULT);
  hid_t dcpl = H5Dget_create_plist(ds);
  hsize_t chunk[2] = {0, 0};
  ASSERT_EQ(H5Pget_chunk(dcpl, 2, chunk), 2);
  EXPECT_EQ(chunk[1], 1024u);
  EXPECT_LE(chunk[0] * chunk[1] * 4, hsize_t(64) << 20);
  EXPECT_EQ(chunk[0], 8500u);  // two equal parts
  H5Pclose(dcpl);
  H5Dclose(ds);
  H5Fclose(f);
  // Read back through the cut chunks (verify/summarize refuse "big": it is no
  // tensor of the model record).
  std::vector<float> back(val.size(), 0.0f);
  f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ds = H5Dopen2(f, "/model/big", H5P_DEFAULT);
  ASSERT_GE(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, back.data()), 0);
  H5Dclose(ds);
  H5Fclose(f);
  EXPECT_EQ(back, val);
  try {
    io::verify_checkpoint(path);
    ADD_FAILURE() << "a tensor outside the model record verified";
  } catch (const core::CheckpointError& e) {
    EXPECT_TRUE(contains(e.what(), "are not the model record's")) << e.what();
  }
  fs::remove_all(cc.dir);
}

// Fixtures for the app tests of this folder (FIXTURES_SETUP ckpt_files).
TEST(Checkpoint, WritesFixturesForToolTests) {
  fs::remove_all("ckpt_fixture");
  const std::string good = save("ckpt_fixture", 7);
  fs::copy_file(good, "ckpt_fixture/corrupt.h5");
  flip_chunk_byte("ckpt_fixture/corrupt.h5", "/optim/v/layers.2.mlp.w_down");

  // A timing log with known numbers: 2 ranks (pp=2), 4 steps. Rank r of
  // step s: total = 0.5 + 0.1·s (median over steps of the max over ranks:
  // 0.65 s), p2p_wait = 0.05·(r+1), forward = 0.2, backward = 0.2, 1000
  // tokens per step, gflops 2.0, loss 5 - s, val_loss at step 3 only.
  fs::remove("timing_fixture.h5");
  io::RestartRecord rr;
  rr.pp = 2;
  rr.cost_a = 1.5e-6;
  rr.cost_b = 2.5e-9;
  rr.cost_c = 3e-4;
  rr.cost_calibrated = 1;
  io::TimingLog log("timing_fixture.h5", "", comm::Communicator::self(), rr);
  for (int s = 0; s < 4; ++s)
    for (int r = 0; r < 2; ++r) {
      io::TimingRecord rec;
      rec.step = s;
      rec.rank = r;
      rec.pp = r;
      rec.time[io::kForward] = 0.2;
      rec.time[io::kBackward] = 0.2;
      rec.time[io::kP2PWait] = 0.05 * (r + 1);
      rec.time[io::kTotal] = 0.5 + 0.1 * s;
      rec.loss = 5.0 - s;
      rec.val_loss = s == 3 ? 1.5 : -1;
      rec.tokens = 1000;
      rec.local_tokens = 500;
      rec.gflops = 2.0;
      rec.attn_imbalance = 1.0 + 0.1 * s;
      rec.latency_imbalance = 1.2;
      rec.cp_imbalance = 1.0;
      rec.compute_cpu = 0.1 * (r + 1);  // max/mean = 0.2 / 0.15 = 1.333
      log.append(rec);
    }
}

TEST(TimingLog, RoundTripsCostModelAndComputeCpu) {
  fs::remove("timing_rt.h5");
  io::RestartRecord rr;
  rr.step = 3;
  rr.cost_a = 1.25e-6;
  rr.cost_b = 4e-9;
  rr.cost_c = 7e-5;
  rr.cost_calibrated = 1;
  {
    io::TimingLog log("timing_rt.h5", "", comm::Communicator::self(), rr);
    io::TimingRecord rec;
    rec.step = 3;
    rec.compute_cpu = 0.375;
    log.append(rec);
  }
  const auto starts = io::TimingLog::read_restarts("timing_rt.h5");
  ASSERT_EQ(starts.size(), 1u);
  EXPECT_EQ(starts[0].step, 3);
  EXPECT_DOUBLE_EQ(starts[0].cost_a, 1.25e-6);
  EXPECT_DOUBLE_EQ(starts[0].cost_b, 4e-9);
  EXPECT_DOUBLE_EQ(starts[0].cost_c, 7e-5);
  EXPECT_EQ(starts[0].cost_calibrated, 1);
  const auto rows = io::TimingLog::read_steps("timing_rt.h5");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_DOUBLE_EQ(rows[0].compute_cpu, 0.375);
}

// Timing log: the CSV copy keeps every double exactly (it had 12 significant
// digits while the HDF5 log has full doubles).
TEST(TimingLog, CsvRoundTripsTheHdf5Values) {
  fs::remove("timing_csv.h5");
  fs::remove("timing_csv.csv");
  {
    io::TimingLog log("timing_csv.h5", "timing_csv.csv", comm::Communicator::self(), io::RestartRecord{});
    io::TimingRecord rec;
    rec.loss = 2.0 / 3.0 + 1e-15;
    rec.lr = 1.0 / 7.0;
    rec.compute_cpu = 0.1 + 0.2;
    log.append(rec);
  }
  const auto rows = io::TimingLog::read_steps("timing_csv.h5");
  ASSERT_EQ(rows.size(), 1u);
  std::ifstream in("timing_csv.csv");
  std::string header, row;
  std::getline(in, header);
  std::getline(in, row);
  auto column = [](const std::string& line, int k) {
    std::stringstream ss(line);
    std::string cell;
    for (int i = 0; i <= k; ++i) std::getline(ss, cell, ',');
    return cell;
  };
  auto index_of = [&](const std::string& name) {
    std::stringstream ss(header);
    std::string cell;
    for (int i = 0; std::getline(ss, cell, ','); ++i)
      if (cell == name) return i;
    return -1;
  };
  for (const auto& [name, value] : {std::pair<std::string, double>{"loss", rows[0].loss}, {"lr", rows[0].lr},
                                    {"compute_cpu", rows[0].compute_cpu}}) {
    const int k = index_of(name);
    ASSERT_GE(k, 0) << name << " not in " << header;
    EXPECT_EQ(std::stod(column(row, k)), value) << name << ": CSV '" << column(row, k) << "'";
  }
}

// A log of another format version is refused with the file and the rule named,
// not appended to with a mismatched row layout.
// A timing log that cannot be created: our message (the file and the cause),
// and none of HDF5's own error stack on stderr.
TEST(TimingLog, CreateFailureIsOurMessageWithoutTheHdf5Stack) {
  fs::remove_all("no_such_dir_tl");
  testing::internal::CaptureStderr();
  std::string what;
  try {
    io::TimingLog log("no_such_dir_tl/t.h5", "", comm::Communicator::self(), io::RestartRecord{});
  } catch (const core::DataError& e) {
    what = e.what();
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(what, "timing log 'no_such_dir_tl/t.h5' cannot be created: No such file or directory");
  EXPECT_EQ(err.find("HDF5-DIAG"), std::string::npos) << err;
  EXPECT_EQ(err, "");
}

// The start-up check names the key, the path and the cause.
TEST(TimingLog, StartupCheckNamesKeyPathAndCause) {
  const auto self = comm::Communicator::self();
  fs::remove_all("tl_check");
  fs::create_directories("tl_check/sub");
  std::ofstream("tl_check/file") << "x";
  const auto error = [&](const std::string& h5, const std::string& csv) {
    try {
      io::check_timing_log_paths(h5, csv, self);
    } catch (const core::DataError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error("", ""), "");
  EXPECT_EQ(error("tl_check/t.h5", "tl_check/t.csv"), "");
  EXPECT_FALSE(fs::exists("tl_check/t.h5")) << "the check must not create the log";
  EXPECT_TRUE(contains(error("tl_check/nope/t.h5", ""),
                       "log.timing_file='tl_check/nope/t.h5': folder 'tl_check/nope' does not exist"));
  EXPECT_TRUE(contains(error("", "tl_check/file/t.csv"), "log.csv_file='tl_check/file/t.csv': 'tl_check/file' is "
                                                         "not a directory"));
  EXPECT_TRUE(contains(error("tl_check/sub", ""), "log.timing_file='tl_check/sub': is a directory"));
  EXPECT_EQ(fs::directory_iterator("tl_check/sub") == fs::directory_iterator(), true) << "a probe file was left";
}

TEST(TimingLog, RefusesOtherFormatVersion) {
  fs::remove("timing_v1.h5");
  {
    io::TimingLog log("timing_v1.h5", "", comm::Communicator::self(), io::RestartRecord{});
  }
  hid_t f = H5Fopen("timing_v1.h5", H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
  const int one = 1;
  H5Awrite(a, H5T_NATIVE_INT, &one);
  H5Aclose(a);
  H5Fclose(f);
  try {
    io::TimingLog log("timing_v1.h5", "", comm::Communicator::self(), io::RestartRecord{});
    FAIL() << "expected DataError";
  } catch (const core::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("timing log 'timing_v1.h5' has format_version 1"), std::string::npos)
        << e.what();
  }
}

// Timing log: /trace rows (log.trace_step) and the run's identity attributes
// round-trip; a second start replaces the identity (no "attribute exists"
// error) and appends to the existing /trace.
TEST(TimingLog, TraceAndIdentityRoundTrip) {
  fs::remove("timing_trace.h5");
  io::RunIdentity id;
  id.deck = "inputs/ci-tiny.ini";
  id.program_version = "0.1.0 (git abc)";
  id.start_time = "2026-12-01T00:00:00Z";
  id.layout = "dp=1 pp=2 cp=1 tp=1 schedule=1f1b v=1";
  id.world_size = 2;
  id.peak_tflops = 0.5;
  std::vector<io::TraceRecord> rows(3);
  for (int i = 0; i < 3; ++i) {
    rows[i].step = 2;
    rows[i].stage = 1;
    rows[i].micro_batch = i;
    rows[i].kind = i % 2;
    rows[i].t0 = 0.1 * i;
    rows[i].t1 = 0.1 * i + 0.05;
  }
  {
    io::TimingLog log("timing_trace.h5", "", comm::Communicator::self(), io::RestartRecord{}, id);
    EXPECT_EQ(log.append_trace(rows, "F,B").size(), 3u);
  }
  id.layout = "dp=2 pp=1 cp=1 tp=1 schedule=1f1b v=1";
  {
    io::TimingLog log("timing_trace.h5", "", comm::Communicator::self(), io::RestartRecord{}, id);
    EXPECT_EQ(log.append_trace({rows[0]}, "F,B").size(), 1u);
  }
  const auto back = io::TimingLog::read_trace("timing_trace.h5");
  ASSERT_EQ(back.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(back[i].micro_batch, i);
    EXPECT_EQ(back[i].kind, i % 2);
    EXPECT_EQ(back[i].stage, 1);
    EXPECT_DOUBLE_EQ(back[i].t1 - back[i].t0, 0.05);
  }
  hid_t f = H5Fopen("timing_trace.h5", H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t a = H5Aopen(f, "layout", H5P_DEFAULT);
  ASSERT_GE(a, 0);
  hid_t t = H5Aget_type(a);
  char* s = nullptr;
  ASSERT_GE(H5Aread(a, t, &s), 0);
  EXPECT_STREQ(s, "dp=2 pp=1 cp=1 tp=1 schedule=1f1b v=1");
  H5free_memory(s);
  H5Tclose(t);
  H5Aclose(a);
  H5Fclose(f);
}
