// Layout-independent HDF5 checkpoints (checkpoint.hpp; hpc-conventions §5):
// the collective save / load / verify orchestration. The file layout is in
// checkpoint_format.cpp, the file-system layer in checkpoint_commit.cpp.
#include "checkpoint_detail.hpp"

#include "wlb4d/comm/phase_watch.hpp"
#include "wlb4d/core/fault.hpp"
#include "wlb4d/core/hash.hpp"
#include "wlb4d/core/param_shapes.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

#include <unistd.h>

namespace wlb::io {

using namespace ckpt;

namespace {

// ---- save, phase 1: arguments -------------------------------------------------------------

/// This rank's first problem with its tensor list ("" if none).
std::string argument_error(const std::vector<TensorRef>& tensors, const std::string& tmp) {
  for (const auto& t : tensors) {
    if (t.global_shape.empty() || t.global_shape.size() > 2)
      return prefix(tmp) + t.name + ": global shape " + shape_string(t.global_shape) + " must be 1-D or 2-D";
    if (t.held && (t.start.size() != t.global_shape.size() || t.count.size() != t.global_shape.size()))
      return prefix(tmp) + t.name + ": hyperslab rank differs from the global shape's";
    if (t.writer && (!t.held || !t.value || !t.m || !t.v))
      return prefix(tmp) + t.name + ": a writer must hold the shard and pass value, m and v";
    std::string err;
    if (t.held)
      for (std::size_t d = 0; d < t.global_shape.size(); ++d)
        if (t.start[d] < 0 || t.count[d] < 0 || t.start[d] + t.count[d] > t.global_shape[d])
          err = prefix(tmp) + t.name + ": hyperslab start " + shape_string(t.start) + " count " +
                shape_string(t.count) + " leaves the global shape " + shape_string(t.global_shape);
    if (!err.empty()) return err;
  }
  return "";
}

/// Collective: same tensor list everywhere, writers cover every element once.
void check_arguments(const comm::Communicator& w, const std::vector<TensorRef>& tensors, const std::string& tmp) {
  std::string listing;
  for (const auto& t : tensors) listing += t.name + shape_string(t.global_shape) + std::to_string(t.shard_dim) + ";";
  const std::uint64_t h = core::fnv1a(listing);
  const std::uint64_t hmin = w.allreduce_value(h, comm::ReduceOp::Min);
  const std::uint64_t hmax = w.allreduce_value(h, comm::ReduceOp::Max);
  if (hmin != hmax)
    throw CheckpointError(prefix(tmp) + "ranks passed different tensor lists (names, shapes or order differ)");
  const std::string err = comm::agree(w, argument_error(tensors, tmp));
  if (!err.empty()) throw CheckpointError(err);
  std::vector<std::int64_t> written(tensors.size(), 0);
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].writer) written[i] = numel(tensors[i].count);
  w.allreduce(written.data(), written.size());
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (written[i] != numel(tensors[i].global_shape))
      throw CheckpointError(prefix(tmp) + "writers cover " + std::to_string(written[i]) + " elements of " +
                            tensors[i].name + " but its global shape " + shape_string(tensors[i].global_shape) +
                            " has " + std::to_string(numel(tensors[i].global_shape)) +
                            " (exactly one rank must write each element)");
}

/// Collective: rank 0 runs `f`; a CheckpointError of it (prefixed with
/// `pre`) is thrown on every rank.
template <class F> void on_rank0_agreed(const comm::Communicator& w, const std::string& pre, F&& f) {
  std::string err;
  if (w.rank() == 0) {
    try {
      f();
    } catch (const CheckpointError& e) {
      err = pre + e.what();
    }
  }
  err = comm::agree(w, err);
  if (!err.empty()) throw CheckpointError(err);
}

// ---- save, phase 3: the collective writes --------------------------------------------------

/// The file writes over the writer communicator: every writer makes every
/// call; `err` keeps this rank's first error, and step_ok() agrees after each
/// step whether all writers are still fine, so they stop together.
struct CollectiveWrite {
  const comm::Communicator& wc;
  const std::string& tmp;
  int world_rank;
  std::uint64_t reserve_bytes;  // checkpoint_bytes_estimate: at least the file's size
  std::string err;
  H file, dxpl;
  std::vector<H> groups;
  bool lock_steps = false;  // a writer thread beside the training thread: h5::api_mutex() per step
  static inline std::uint64_t written_bytes = 0;  // this process's checkpoint tensor bytes (fault hook)

  /// f() under the HDF5 lock (and with HDF5's printing silenced) when
  /// lock_steps: the training thread's HDF5 calls may come between two steps.
  template <class F> bool locked(F&& f) {
    if (!lock_steps) return f();
    const h5::ApiLock lock(h5::api_mutex());
    const h5::Quiet quiet;
    return f();
  }

  bool step_ok(bool ok, const std::string& what) {
    if (!ok && err.empty()) {
      const auto slash = tmp.find_last_of('/');
      err = prefix(tmp) + what + h5::reason() + space_note(slash == std::string::npos ? "." : tmp.substr(0, slash));
    }
    return wc.allreduce_value(int(err.empty()), comm::ReduceOp::Min) == 1;
  }

  bool create() {
    comm::phase_progress("creating the file (collective MPI-IO open)");
    H fapl(H5Pcreate(H5P_FILE_ACCESS));
    H5Pset_fapl_mpio(fapl.get(), wc.mpi(), MPI_INFO_NULL);  // MPI-IO needs the raw communicator
    H5Pset_all_coll_metadata_ops(fapl.get(), 1);
    H5Pset_coll_metadata_write(fapl.get(), 1);
    // File format of HDF5 1.8 or later: superblock v2 and v2 object headers
    // carry checksums, so a flipped bit in the file's metadata is detected on
    // open instead of silently changing what is read (the v0 superblock and v1
    // headers of the earliest format have none; only chunk data had
    // Fletcher32).
    H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST);
    dxpl = H(H5Pcreate(H5P_DATASET_XFER));
    H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE);
    file = H(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
    if (!step_ok(file.valid(), "cannot create the file (MPI-IO)")) return false;
    // The whole file's disk space, reserved by one rank before HDF5 writes
    // anything: a full disk (ENOSPC) inside a collective HDF5 call leaves the
    // writers' HDF5 states different, and the collective close of the
    // discarded file then hangs (tp=2) or is left to MPI_Finalize, which
    // crashes in H5F__close_cb (1 rank). Failing here, no HDF5 call has failed.
    if (wc.rank() == 0) {
      comm::phase_progress("reserving the file's disk space");
      const std::string e = reserve_space(tmp, reserve_bytes);
      if (!e.empty()) err = e;
    }
    return step_ok(true, "");
  }

  bool root_attrs(const std::int32_t layout[4], const std::vector<TensorRef>& tensors, const TrainState& state,
                  const CheckpointInfo& info) {
    try {
      write_root_attrs(file.get(), tmp, layout, tensors, state, info);
    } catch (const CheckpointError& e) {
      err = e.what();
    }
    return step_ok(true, "");
  }

  bool create_groups() {
    for (const char* g : kGroups) {
      groups.emplace_back(H5Gcreate2(file.get(), g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      if (!step_ok(groups.back().valid(), std::string("cannot create group ") + g)) return false;
    }
    return true;
  }

  /// One tensor kind: create the dataset (with its shard_dim attribute), write the part.
  bool tensor_kind(const TensorRef& t, const std::string& name, const std::vector<hsize_t>& chunk, const float* buf,
                   bool first) {
    comm::phase_progress("writing " + name + " (collective HDF5)");
    H ds(create_f32(file.get(), name, t.global_shape, chunk));
    bool ok = ds.valid();
    if (ok) {
      try {
        const std::int32_t sd = t.shard_dim;
        h5::write_attr<CheckpointError>(ds.get(), "shard_dim", H5T_NATIVE_INT32, &sd, 1, true, where(tmp),
                                        h5::Wording::Checkpoint);
      } catch (const CheckpointError&) {
        ok = false;
      }
    }
    if (!step_ok(ok, "cannot create dataset " + name)) return false;
    // Test hook (WLB4D_FAULT=ckpt_write): this rank's write fails as on a
    // full disk; agreed before the collective H5Dwrite, so no writer waits in it alone.
    if (t.writer) written_bytes += std::uint64_t(numel(t.count)) * sizeof(float);
    if (!step_ok(!(t.writer && core::fault_write_fails(world_rank, written_bytes)),
                 name + ": write failed: no space left on device (ENOSPC injected by WLB4D_FAULT=ckpt_write)"))
      return false;
    const herr_t st = write_part(ds.get(), H5T_NATIVE_FLOAT, t.start, t.count, t.writer ? buf : nullptr, dxpl.get());
    if (st >= 0 && first) {  // say once (debug) if HDF5 broke collective I/O
      std::uint32_t local = 0, global = 0;
      H5Pget_mpio_no_collective_cause(dxpl.get(), &local, &global);
      if (global != 0 && wc.rank() == 0)
        spdlog::debug("checkpoint {}: HDF5 did not use collective I/O (cause mask {:#x})", tmp, global);
    }
    ds.reset();
    return step_ok(st >= 0, name + ": collective write failed");
  }

  bool write_tensors(const std::vector<TensorRef>& tensors, int tp) {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const auto& t = tensors[i];
      const auto chunk = chunk_dims(t.global_shape, t.shard_dim, tp);
      const float* bufs[3] = {t.value, t.m, t.v};
      for (int k = 0; k < 3; ++k)
        if (!locked([&] { return tensor_kind(t, kKinds[k] + t.name, chunk, bufs[k], i == 0 && k == 0); }))
          return false;
    }
    return true;
  }

  /// /state: rank 0 writes, the others select none.
  bool write_state(const TrainState& state, std::uint64_t digest) {
    const std::int64_t scalars[4] = {state.step, state.tokens_seen, state.stream_epoch, state.stream_position};
    for (int k = 0; k < kNumState; ++k) {
      hsize_t n = 0;
      const void* buf = state_buffer(state, k, scalars, &n);
      const hid_t type = k == kSeedState ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64;
      comm::phase_progress(std::string("writing ") + kStateNames[k] + " (collective HDF5)");
      H ds(create_state(file.get(), kStateNames[k], type, n));
      if (!step_ok(ds.valid(), std::string("cannot create dataset ") + kStateNames[k])) return false;
      const herr_t st =
          write_part(ds.get(), type, {0}, {std::int64_t(n)}, wc.rank() == 0 && n > 0 ? buf : nullptr, dxpl.get());
      ds.reset();
      if (!step_ok(st >= 0, std::string(kStateNames[k]) + ": collective write failed")) return false;
    }
    const struct {
      const char* name;
      hid_t type;
      const void* value;
    } extra[2] = {{kLastLossState, H5T_NATIVE_DOUBLE, &state.last_loss}, {kDigestState, H5T_NATIVE_UINT64, &digest}};
    for (const auto& e : extra) {
      H ds(create_state(file.get(), e.name, e.type, 1));
      if (!step_ok(ds.valid(), std::string("cannot create dataset ") + e.name)) return false;
      const herr_t st = write_part(ds.get(), e.type, {0}, {1}, wc.rank() == 0 ? e.value : nullptr, dxpl.get());
      ds.reset();
      if (!step_ok(st >= 0, std::string(e.name) + ": collective write failed")) return false;
    }
    // The loss-spike guard's count and window (every rank knows the length: agreed state).
    const struct {
      const char* name;
      hid_t type;
      const void* value;
      hsize_t n;
    } guard[2] = {{kSkippedState, H5T_NATIVE_INT64, &state.skipped_steps, 1},
                  {kSpikeWindowState, H5T_NATIVE_DOUBLE, state.spike_window.data(), state.spike_window.size()}};
    for (const auto& e : guard) {
      H ds(create_state(file.get(), e.name, e.type, e.n));
      if (!step_ok(ds.valid(), std::string("cannot create dataset ") + e.name)) return false;
      const herr_t st = write_part(ds.get(), e.type, {0}, {std::int64_t(e.n)},
                                   wc.rank() == 0 && e.n > 0 ? e.value : nullptr, dxpl.get());
      ds.reset();
      if (!step_ok(st >= 0, std::string(e.name) + ": collective write failed")) return false;
    }
    if (!state.data_sources.empty()) {
      const auto n = std::int64_t(state.data_sources.size());
      H ds(create_state(file.get(), kDataSourcesState, H5T_NATIVE_INT64, hsize_t(n)));
      if (!step_ok(ds.valid(), std::string("cannot create dataset ") + kDataSourcesState)) return false;
      const herr_t st = write_part(ds.get(), H5T_NATIVE_INT64, {0}, {n},
                                   wc.rank() == 0 ? state.data_sources.data() : nullptr, dxpl.get());
      ds.reset();
      if (!step_ok(st >= 0, std::string(kDataSourcesState) + ": collective write failed")) return false;
    }
    return true;
  }

  /// /tokenizer/model (sentencepiece only): rank 0 writes, the others select none.
  bool write_tokenizer(const CheckpointInfo& info) {
    if (info.tokenizer_model.empty()) return true;
    comm::phase_progress("writing /tokenizer/model (collective HDF5)");
    groups.emplace_back(H5Gcreate2(file.get(), kTokenizerGroup, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    if (!step_ok(groups.back().valid(), std::string("cannot create group ") + kTokenizerGroup)) return false;
    const auto n = std::int64_t(info.tokenizer_model.size());
    H ds(create_state(file.get(), kTokenizerModel, H5T_NATIVE_UINT8, hsize_t(n)));
    if (!step_ok(ds.valid(), std::string("cannot create dataset ") + kTokenizerModel)) return false;
    const herr_t st = write_part(ds.get(), H5T_NATIVE_UINT8, {0}, {n},
                                 wc.rank() == 0 ? info.tokenizer_model.data() : nullptr, dxpl.get());
    ds.reset();
    return step_ok(st >= 0, std::string(kTokenizerModel) + ": collective write failed");
  }

  /// Flush (if all went well) and the collective close.
  void finish(bool good) {
    comm::phase_progress("flushing and closing the file (collective HDF5)");
    if (good) step_ok(H5Fflush(file.get(), H5F_SCOPE_GLOBAL) >= 0, "H5Fflush failed");
    // A failed write (typically a full disk) is discarded: empty the file
    // first, so that HDF5's closing metadata flush has room and the close
    // completes (a half-closed file crashes HDF5's clean-up at MPI_Finalize).
    if (!good && file.valid() && wc.rank() == 0) (void)::truncate(tmp.c_str(), 0);
    groups.clear();
    if (file.valid()) {
      const bool closed = file.reset();  // collective
      step_ok(closed, "H5Fclose failed");
    }
    dxpl.reset();
  }
};

/// Phase 3: collective file creation and writes over the *writer* ranks
/// only: the ranks that own some tensor's shard (one replica of each; DP/CP
/// copies do not) and rank 0 (/state). Keeping replicas out of MPI-IO
/// matters: HDF5's internal collectives block (busy-poll), and with 8 ranks
/// on 2 cores an all-rank checkpoint of the quickstart model took 70 s.
/// Returns this rank's error ("" if none); not yet agreed over all ranks.
std::string write_file(const comm::Communicator& w, const std::int32_t layout[4],
                       const std::vector<TensorRef>& tensors, const TrainState& state, const CheckpointInfo& info,
                       const std::string& tmp, std::uint64_t digest, std::uint64_t bytes, bool lock_steps) {
  bool is_writer = w.rank() == 0;
  for (const auto& t : tensors) is_writer = is_writer || t.writer;
  std::optional<comm::Communicator> sub;
  try {
    sub = w.split(is_writer ? 0 : comm::Communicator::kNoColor, w.rank());  // rank 0 of w is rank 0 of sub
  } catch (const core::CommError&) {
    throw CheckpointError(prefix(tmp) + "MPI_Comm_split of the writer ranks failed");
  }
  if (!sub) return "";
  CollectiveWrite cw{*sub, tmp, w.rank(), bytes, "", H(), H(), {}, lock_steps};
  const bool good = cw.locked([&] { return cw.create(); }) &&
                    (core::fault_point("ckpt_save", w.rank(), state.step), true) &&
                    cw.locked([&] { return cw.root_attrs(layout, tensors, state, info); }) &&
                    cw.locked([&] { return cw.create_groups(); }) && cw.write_tensors(tensors, layout[3]) &&
                    cw.locked([&] { return cw.write_state(state, digest); }) &&
                    cw.locked([&] { return cw.write_tokenizer(info); });
  cw.locked([&] {
    cw.finish(good);
    return true;
  });
  return cw.err;
}

/// This rank's digest terms of the elements it writes (one writer per
/// element: the sum over the world covers every element once).
std::uint64_t local_digest(const std::vector<TensorRef>& tensors) {
  std::uint64_t sum = 0;
  for (const auto& t : tensors) {
    if (!t.writer) continue;
    const float* bufs[3] = {t.value, t.m, t.v};
    for (int k = 0; k < 3; ++k) sum += digest_part(digest_key(k, t.name), t.global_shape, t.start, t.count, bufs[k]);
  }
  return sum;
}

}  // namespace

// ---- public API -------------------------------------------------------------------------

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s;
  for (auto e : shape) s += "[" + std::to_string(e) + "]";
  return s.empty() ? "[]" : s;
}

std::uint64_t checkpoint_bytes_estimate(const std::vector<TensorRef>& tensors) {
  std::uint64_t b = 1u << 20;
  for (const auto& t : tensors) b += 3 * (std::uint64_t(numel(t.global_shape)) * sizeof(float) + 4096);
  return b;
}

void check_checkpoint_dir(const std::string& dir, const comm::Communicator& world, std::uint64_t bytes) {
  on_rank0_agreed(world, "", [&] { check_dir_for_checkpoints(dir, bytes); });
}

std::string save_checkpoint(const core::CheckpointConfig& cc, const grid::ProcessGrid& grid,
                            const std::vector<TensorRef>& tensors, const TrainState& state,
                            const CheckpointInfo& info) {
  const std::int32_t layout[4] = {grid.dp_size(), grid.pp_size(), grid.cp_size(), grid.tp_size()};
  return save_checkpoint(cc, grid.world(), layout, tensors, state, info, SaveOptions{});
}

std::string save_checkpoint(const core::CheckpointConfig& cc, const comm::Communicator& w, const std::int32_t layout[4],
                            const std::vector<TensorRef>& tensors, const TrainState& state, const CheckpointInfo& info,
                            const SaveOptions& opt) {
  const std::string final_path = checkpoint_path(cc.dir, state.step);
  const std::string tmp = final_path + ".tmp";
  // The phase deadline (comm.timeout_s without progress): HDF5's collective
  // I/O blocks inside MPI, outside wlb::comm's watchdog, so a stopped writer
  // would otherwise hang the others silently. On the deadline the .tmp goes;
  // `latest` and the previous checkpoints are untouched until the commit.
  comm::PhaseWatch watch("checkpoint save", final_path, [tmp] {
    return std::remove(tmp.c_str()) == 0 ? "removed " + tmp + "; `latest` and the previous checkpoints are unchanged"
                                         : std::string("`latest` and the previous checkpoints are unchanged");
  });
  std::optional<h5::Quiet> quiet;
  if (!opt.background) quiet.emplace();  // in the background: per locked step (CollectiveWrite::locked)
  comm::phase_progress("checking the tensor list");
  // 1. Arguments: same tensor list everywhere, writers cover every element once.
  check_arguments(w, tensors, tmp);
  // 2. Directory and free space (rank 0), agreed: HDF5 running out of space
  //    inside a collective dataset creation deadlocks the writers, so a
  //    checkpoint that cannot fit is refused before the file exists.
  const std::uint64_t bytes = checkpoint_bytes_estimate(tensors) + info.tokenizer_model.size();
  comm::phase_progress("checking checkpoint.dir");
  on_rank0_agreed(w, "", [&] { check_dir_for_checkpoints(cc.dir, bytes); });
  // 3. The content digest (all ranks), then the file, written by the writer
  //    ranks; errors agreed by everyone.
  const std::uint64_t digest = w.allreduce_value(local_digest(tensors), comm::ReduceOp::Sum) + digest_state(state);
  std::string err = write_file(w, layout, tensors, state, info, tmp, digest, bytes, opt.background);
  comm::phase_progress("agreeing on the outcome of the write");
  w.barrier();
  err = comm::agree(w, err);
  if (!err.empty()) {
    if (w.rank() == 0) std::remove(tmp.c_str());
    throw CheckpointError(err);
  }
  // 3b. Read back before `latest` may name it (checkpoint.async): every
  //     checksum and the content digest, the datasets shared over the ranks.
  if (opt.verify) {
    comm::phase_progress("verifying the written file");
    try {
      verify_collective(tmp, w, opt.background);
    } catch (const CheckpointError& e) {
      if (w.rank() == 0) std::remove(tmp.c_str());
      throw CheckpointError(std::string(e.what()) + " (read back before the commit; `latest` is unchanged)");
    }
  }
  // 4. Commit (rank 0), agreed.
  comm::phase_progress("committing (rename, `latest`)");
  on_rank0_agreed(w, prefix(final_path), [&] { commit(cc.dir, tmp, final_path, state.step, cc.keep); });
  return final_path;
}

namespace {

// ---- load phases ----------------------------------------------------------------------------

/// The deck's model differs from the checkpoint's: names the first tensor
/// whose shape differs, as the user sees it. Always throws.
[[noreturn]] void model_mismatch(hid_t f, const std::string& path, const std::vector<TensorRef>& tensors,
                                 const CheckpointInfo& info, const core::ModelConfig& model, std::int64_t vocab) {
  const std::string both = "checkpoint model: " + model_string(info.model, info.vocab) +
                           "; the deck's model: " + model_string(model, vocab);
  for (const auto& t : tensors) {
    const std::string name = std::string(kKinds[0]) + t.name;
    if (!h5::exists(f, name))
      fail(path, "has no " + name + " but the deck's model needs " + shape_string(t.global_shape) + " (" + both +
                     ")");
    std::vector<std::int64_t> dims;
    open_dataset(f, name, path, &dims);
    if (dims != t.global_shape)
      fail(path, name + " has shape " + shape_string(dims) + " but the deck's model needs " +
                     shape_string(t.global_shape) + " (" + both + ")");
  }
  fail(path, "was written for another model (" + both + ")");
}

bool same_model(const CheckpointInfo& info, const core::ModelConfig& model, std::int64_t vocab) {
  const auto& im = info.model;
  return info.vocab == vocab && im.layers == model.layers && im.d_model == model.d_model &&
         im.heads == model.heads && im.kv_heads == model.kv_heads && im.ffn_hidden == model.ffn_hidden &&
         im.tie_embeddings == model.tie_embeddings;
}

/// The model keys without a shape (RoPE base and scaling, RMSNorm epsilon) that differ
/// between the checkpoint and the deck: "model.rope_theta: the checkpoint
/// has 10000, the deck 500000"; "" when they agree or were not stored.
std::string identity_mismatch(const CheckpointInfo& info, const core::ModelConfig& model) {
  if (!info.has_rope_norm) return "";
  std::string out;
  auto key = [&](const char* k, double ck, double deck) {
    if (ck == deck) return;
    if (!out.empty()) out += "; ";
    out += fmt::format("{}: the checkpoint has {}, the deck {}", k, ck, deck);
  };
  key("model.rope_theta", info.model.rope_theta, model.rope_theta);
  key("model.norm_eps", info.model.norm_eps, model.norm_eps);
  if (info.model.rope_scaling != model.rope_scaling) {
    if (!out.empty()) out += "; ";
    out += fmt::format("model.rope_scaling: the checkpoint has {}, the deck {}", info.model.rope_scaling,
                       model.rope_scaling);
  } else if (model.rope_scaling != "none") {
    key("model.rope_factor", info.model.rope_factor, model.rope_factor);
    key("model.rope_low_freq_factor", info.model.rope_low_freq_factor, model.rope_low_freq_factor);
    key("model.rope_high_freq_factor", info.model.rope_high_freq_factor, model.rope_high_freq_factor);
    key("model.rope_original_max_position", info.model.rope_original_max_position,
        model.rope_original_max_position);
  }
  return out;
}

/// Reads this rank's shards of every held tensor (independent I/O).
void read_tensors(hid_t f, const std::string& path, const std::vector<TensorRef>& tensors, hid_t dxpl,
                  bool weights_only) {
  for (const auto& t : tensors) {
    if (!t.held) continue;
    float* bufs[3] = {t.value, t.m, t.v};
    if (weights_only && (t.m || t.v))
      fail(path, "is a weights-only checkpoint (no optimizer state, e.g. written by wlb4d-ckpt import-hf): start a "
                 "run from it with checkpoint.init_from, it cannot be resumed");
    for (int k = 0; k < (weights_only ? 1 : 3); ++k) {
      const std::string name = kKinds[k] + t.name;
      std::vector<std::int64_t> dims;
      H ds = open_dataset(f, name, path, &dims);
      if (dims != t.global_shape)
        fail(path, name + " has shape " + shape_string(dims) + " but the deck's model needs " +
                       shape_string(t.global_shape));
      require_class(ds.get(), H5T_FLOAT, name, path);
      if (!bufs[k]) continue;  // a null pointer: not wanted (e.g. moments for evaluation)
      read_part(ds.get(), H5T_NATIVE_FLOAT, t.start, t.count, bufs[k], dxpl, name, path);
    }
  }
}

/// Everything read from the open file. \throws CheckpointError.
LoadedCheckpoint read_loaded(hid_t f, const std::string& path, const std::vector<TensorRef>& tensors,
                             const core::ModelConfig& model, std::int64_t vocab, hid_t dxpl, bool* has_digest,
                             std::uint64_t* stored_digest) {
  LoadedCheckpoint out;
  out.info = read_info(f, path);
  if (!same_model(out.info, model, vocab)) model_mismatch(f, path, tensors, out.info, model, vocab);
  const std::string ident = identity_mismatch(out.info, model);
  if (!ident.empty()) fail(path, "was written for another model: " + ident);
  read_tensors(f, path, tensors, dxpl, out.info.weights_only);
  out.state = read_state(f, path, dxpl);
  if (out.state.step != out.info.step)
    fail(path, "/state/step = " + std::to_string(out.state.step) + " but the root attribute step = " +
                   std::to_string(out.info.step));
  if (h5::exists(f, kDigestState)) {
    H ds = open_expected(f, kDigestState, path, {1}, "the format");
    require_class(ds.get(), H5T_INTEGER, kDigestState, path);
    read_part(ds.get(), H5T_NATIVE_UINT64, {0}, {1}, stored_digest, dxpl, kDigestState, path);
    *has_digest = true;
  }
  return out;
}

/// Collective MPI-IO open (after the serial pre-check), agreed.
H open_collective(const comm::Communicator& w, const std::string& path) {
  H fapl(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_fapl_mpio(fapl.get(), w.mpi(), MPI_INFO_NULL);  // MPI-IO needs the raw communicator
  H file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()));
  std::string err;
  if (!file.valid()) err = prefix(path) + "cannot open with MPI-IO" + h5::reason();
  err = comm::agree(w, err);
  // The serial pre-check makes a divergent open (some ranks fail, some not)
  // practically impossible; were it to happen, the ranks holding a handle
  // would close it collectively without the others.
  if (!err.empty()) throw CheckpointError(err);
  return file;
}

}  // namespace

LoadedCheckpoint load_checkpoint(const std::string& path, const grid::ProcessGrid& grid,
                                 const std::vector<TensorRef>& tensors, const core::ModelConfig& model,
                                 std::int64_t vocab) {
  const auto& w = grid.world();
  comm::PhaseWatch watch("checkpoint load", path);  // as the save's (HDF5's collective open and close)
  core::fault_point("ckpt_load", w.rank(), -1);  // tests only (WLB4D_FAULT)
  h5::Quiet quiet;
  comm::phase_progress("checking the file (rank 0, serial)");
  // Rank 0 checks the file serially first so that every rank agrees before
  // the collective open (a damaged file fails the same way everywhere).
  on_rank0_agreed(w, "", [&] {
    H f = open_serial(path);
    read_info(f.get(), path);
  });
  comm::phase_progress("opening the file (collective MPI-IO)");
  H file = open_collective(w, path);
  comm::phase_progress("reading this rank's shards");
  LoadedCheckpoint out;
  std::string err;
  H dxpl(H5Pcreate(H5P_DATASET_XFER));
  H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_INDEPENDENT);
  bool has_digest = false;
  std::uint64_t stored = 0;
  try {
    out = read_loaded(file.get(), path, tensors, model, vocab, dxpl.get(), &has_digest, &stored);
  } catch (const CheckpointError& e) {
    err = e.what();
  }
  dxpl.reset();
  comm::phase_progress("closing the file (collective HDF5)");
  if (!file.reset() && err.empty()) err = prefix(path) + "H5Fclose failed" + h5::reason();  // collective
  err = comm::agree(w, err);
  if (!err.empty()) throw CheckpointError(err);
  // The digest over what was read: the current layout's writers cover every
  // element once. Skipped when a caller did not want some buffers.
  bool complete = true;
  for (const auto& t : tensors) complete = complete && (!t.writer || (t.value && t.m && t.v));
  if (has_digest && w.allreduce_value(int(complete), comm::ReduceOp::Min) == 1) {
    const std::uint64_t sum = w.allreduce_value(local_digest(tensors), comm::ReduceOp::Sum) + digest_state(out.state);
    if (sum != stored)
      throw CheckpointError(prefix(path) + fmt::format("content digest mismatch: /state/digest is {:#018x} but the "
                                                       "tensors and state read give {:#018x} (the file was changed "
                                                       "after it was written)",
                                                       stored, sum));
  }
  return out;
}

namespace {
/// The parts' digest sum against the stored one. \throws CheckpointError.
VerifyResult check_digest(const std::string& path, const VerifyPart& first, std::uint64_t sum) {
  VerifyResult r;
  r.has_digest = first.has_digest;
  r.digest = first.stored;
  if (first.has_digest && sum != first.stored)
    fail(path, fmt::format("content digest mismatch: /state/digest is {:#018x} but the datasets give {:#018x} (the "
                           "file was changed after it was written)",
                           first.stored, sum));
  return r;
}
}  // namespace

VerifyResult verify_checkpoint(const std::string& path) {
  const VerifyPart p = verify_part(path, 0, 1);
  if (!p.err.empty()) throw CheckpointError(p.err);
  return check_digest(path, p, p.sum);
}

VerifyResult verify_checkpoint(const std::string& path, const comm::Communicator& world) {
  return verify_collective(path, world, false);
}

VerifyResult ckpt::verify_collective(const std::string& path, const comm::Communicator& world, bool lock) {
  VerifyPart p;
  {
    std::optional<h5::ApiLock> l;
    if (lock) l.emplace(h5::api_mutex());
    p = verify_part(path, world.rank(), world.size());
  }
  const std::string err = comm::agree(world, p.err);
  if (!err.empty()) throw CheckpointError(err);
  const std::uint64_t sum = world.allreduce_value(p.sum, comm::ReduceOp::Sum);
  std::uint64_t head[2] = {std::uint64_t(p.has_digest), p.stored};  // rank 0's
  world.broadcast(head, 2, 0);
  p.has_digest = head[0] != 0;
  p.stored = head[1];
  return check_digest(path, p, sum);  // sum and head are agreed: every rank throws or none
}

CheckpointInfo read_checkpoint_info(const std::string& path) {
  h5::Quiet quiet;
  H f = open_serial(path);
  return read_info(f.get(), path);
}

std::vector<TensorSummary> summarize_checkpoint(const std::string& path) {
  h5::Quiet quiet;
  H f = open_serial(path);
  const auto info = read_info(f.get(), path);
  std::vector<TensorSummary> out;
  for (int k = 0; k < (info.weights_only ? 1 : 3); ++k)
    for (const auto& n : info.tensors) {
      TensorSummary s;
      s.dataset = kKinds[k] + n;
      double sum = 0;
      s.shape = info.shapes[std::size_t(&n - info.tensors.data())];
      scan_f32(f.get(), s.dataset, path, s.shape, [&](const float* x, std::size_t m) {
        for (std::size_t i = 0; i < m; ++i) sum += double(x[i]) * double(x[i]);
      });
      s.l2 = std::sqrt(sum);
      out.push_back(std::move(s));
    }
  return out;
}

void save_weights_checkpoint(const std::string& path, CheckpointInfo info, const TensorFill& fill) {
  info.weights_only = true;
  const std::string tmp = path + ".tmp";
  std::vector<TensorRef> tensors;
  for (const auto& p : core::param_shapes(info.model, info.vocab)) {
    TensorRef t;
    t.name = p.name;
    t.global_shape = p.global_shape;
    t.shard_dim = p.shard_dim;
    tensors.push_back(std::move(t));
  }
  TrainState state;  // step 0, nothing consumed
  h5::Quiet quiet;
  const auto ok = [&](bool good, const std::string& what) {
    if (!good) throw CheckpointError(prefix(tmp) + what + h5::reason());
  };
  try {
    H fapl(H5Pcreate(H5P_FILE_ACCESS));
    H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST);  // checksummed metadata, as save_checkpoint
    H file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
    ok(file.valid(), "cannot create the file");
    const std::int32_t layout[4] = {1, 1, 1, 1};
    write_root_attrs(file.get(), tmp, layout, tensors, state, info);
    for (const char* g : {"/model", "/state"}) ok(H(H5Gcreate2(file.get(), g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)).valid(),
                                                std::string("cannot create group ") + g);
    std::uint64_t digest = 0;
    std::vector<float> x;
    for (const auto& t : tensors) {
      x.clear();
      fill(t.name, t.global_shape, x);
      if (std::int64_t(x.size()) != numel(t.global_shape))
        throw CheckpointError(prefix(tmp) + t.name + ": " + std::to_string(x.size()) + " values given for shape " +
                              shape_string(t.global_shape));
      const std::string name = kKinds[0] + t.name;
      H ds(create_f32(file.get(), name, t.global_shape, chunk_dims(t.global_shape, t.shard_dim, 1)));
      ok(ds.valid(), "cannot create dataset " + name);
      const std::int32_t sd = t.shard_dim;
      h5::write_attr<CheckpointError>(ds.get(), "shard_dim", H5T_NATIVE_INT32, &sd, 1, true, where(tmp),
                                      h5::Wording::Checkpoint);
      ok(H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data()) >= 0, name + ": write failed");
      digest += digest_part(digest_key(0, t.name), t.global_shape, std::vector<std::int64_t>(t.global_shape.size(), 0),
                            t.global_shape, x.data());
    }
    const std::int64_t scalars[4] = {state.step, state.tokens_seen, state.stream_epoch, state.stream_position};
    for (int k = 0; k < kNumState; ++k) {
      hsize_t n = 0;
      const void* buf = state_buffer(state, k, scalars, &n);
      const hid_t type = k == kSeedState ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64;
      H ds(create_state(file.get(), kStateNames[k], type, n));
      ok(ds.valid(), std::string("cannot create dataset ") + kStateNames[k]);
      if (n > 0) ok(H5Dwrite(ds.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0, kStateNames[k]);
    }
    digest += digest_state(state);
    const struct {
      const char* name;
      hid_t type;
      const void* value;
    } extra[2] = {{kLastLossState, H5T_NATIVE_DOUBLE, &state.last_loss}, {kDigestState, H5T_NATIVE_UINT64, &digest}};
    for (const auto& e : extra) {
      H ds(create_state(file.get(), e.name, e.type, 1));
      ok(ds.valid() && H5Dwrite(ds.get(), e.type, H5S_ALL, H5S_ALL, H5P_DEFAULT, e.value) >= 0,
         std::string("cannot write ") + e.name);
    }
    {
      H ds(create_state(file.get(), kSkippedState, H5T_NATIVE_INT64, 1));
      ok(ds.valid() && H5Dwrite(ds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &state.skipped_steps) >= 0,
         std::string("cannot write ") + kSkippedState);
      H dw(create_state(file.get(), kSpikeWindowState, H5T_NATIVE_DOUBLE, state.spike_window.size()));
      ok(dw.valid(), std::string("cannot write ") + kSpikeWindowState);
      if (!state.spike_window.empty())
        ok(H5Dwrite(dw.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, state.spike_window.data()) >= 0,
           std::string("cannot write ") + kSpikeWindowState);
    }
    if (!state.data_sources.empty()) {
      H ds(create_state(file.get(), kDataSourcesState, H5T_NATIVE_INT64, state.data_sources.size()));
      ok(ds.valid() && H5Dwrite(ds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                state.data_sources.data()) >= 0,
         std::string("cannot write ") + kDataSourcesState);
    }
    if (!info.tokenizer_model.empty()) {
      ok(H(H5Gcreate2(file.get(), kTokenizerGroup, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)).valid(),
         "cannot create group /tokenizer");
      H ds(create_state(file.get(), kTokenizerModel, H5T_NATIVE_UINT8, info.tokenizer_model.size()));
      ok(ds.valid() && H5Dwrite(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                info.tokenizer_model.data()) >= 0,
         "cannot write /tokenizer/model");
    }
    ok(H5Fflush(file.get(), H5F_SCOPE_GLOBAL) >= 0, "H5Fflush failed");
    ok(file.reset(), "H5Fclose failed");
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw CheckpointError(prefix(path) + "cannot rename " + tmp + ": " + std::strerror(errno));
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

std::string read_checkpoint_tokenizer_model(const std::string& path) {
  h5::Quiet quiet;
  H f = open_serial(path);
  read_info(f.get(), path);
  if (!h5::exists(f.get(), kTokenizerModel)) return {};
  std::vector<std::int64_t> dims;
  H ds = open_dataset(f.get(), kTokenizerModel, path, &dims);
  require_class(ds.get(), H5T_INTEGER, kTokenizerModel, path);
  // Bounded by the bytes stored before allocating (a damaged extent).
  const hsize_t stored = H5Dget_storage_size(ds.get());
  if (dims.size() != 1 || dims[0] < 1 || hsize_t(dims[0]) > stored)
    fail(path, std::string(kTokenizerModel) + " has shape " + shape_string(dims) + " but " + std::to_string(stored) +
                   " bytes are stored");
  std::string out(std::size_t(dims[0]), '\0');
  read_part(ds.get(), H5T_NATIVE_UINT8, {0}, dims, out.data(), H5P_DEFAULT, kTokenizerModel, path);
  return out;
}

std::vector<float> read_model_tensor(const std::string& path, const std::string& name) {
  h5::Quiet quiet;
  H f = open_serial(path);
  const auto info = read_info(f.get(), path);
  const auto it = std::find(info.tensors.begin(), info.tensors.end(), name);
  if (it == info.tensors.end()) fail(path, "holds no tensor '" + name + "' (see its `tensors` attribute)");
  const auto& shape = info.shapes[std::size_t(it - info.tensors.begin())];
  std::vector<float> out;
  out.reserve(std::size_t(numel(shape)));
  scan_f32(f.get(), kKinds[0] + name, path, shape, [&](const float* x, std::size_t n) { out.insert(out.end(), x, x + n); });
  return out;
}

TrainState read_train_state(const std::string& path) {
  h5::Quiet quiet;
  H f = open_serial(path);
  read_info(f.get(), path);
  return read_state(f.get(), path, H5P_DEFAULT);
}

std::string checkpoint_model_mismatch(const std::string& path, const core::ModelConfig& model, std::int64_t vocab) {
  const CheckpointInfo info = read_checkpoint_info(path);
  if (!same_model(info, model, vocab))
    return prefix(path) + "was written for another model (checkpoint model: " + model_string(info.model, info.vocab) +
           "; the deck's model: " + model_string(model, vocab) + ")";
  const std::string ident = identity_mismatch(info, model);
  return ident.empty() ? "" : prefix(path) + "was written for another model: " + ident;
}

}  // namespace wlb::io
