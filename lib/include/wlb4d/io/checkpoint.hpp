#pragma once
/// \file checkpoint.hpp
/// \brief Layout-independent HDF5 checkpoints (DESIGN §3 "layout-independent
/// checkpoints", §7): one file per
/// checkpoint, written collectively with MPI-IO by the writer ranks, every tensor at its global
/// shape, readable by any (dp, pp, cp, tp) layout.
///
/// ## File layout (format "wlb4d-checkpoint", format_version 1)
///
/// `DIR/step_NNNNNN.h5` (NNNNNN = TrainState::step zero-padded to 6 digits;
/// more digits when the step needs them):
///
///   /model/<name>     float32 [global shape] (row-major, elements): parameter values
///   /optim/m/<name>   float32 [global shape]: AdamW first moment
///   /optim/v/<name>   float32 [global shape]: AdamW second moment
///                     All three: chunked, Fletcher32 checksum per chunk,
///                     attribute `shard_dim` (int: 0, 1 or -1 = replicated
///                     over TP; informational, reading never depends on it).
///                     Chunk: along shard_dim the finest TP shard of the
///                     writing layout (ceil(n/tp) elements), the whole extent
///                     along the other dimension; dimension 0 is then cut
///                     until a chunk holds at most 64 MiB.
///   /state/step            int64 [1]  optimizer steps completed (= next step to
///                                     run = LR schedule position)
///   /state/tokens_seen     int64 [1]  training tokens consumed so far
///   /state/stream_epoch    int64 [1]  data::DocumentStream::State::epoch
///   /state/stream_position int64 [1]  data::DocumentStream::State::position
///   /state/seed            uint64 [1] train.seed (init and data order; no other RNG
///                                     state exists in wlb4d)
///   /state/packer          int64 [n]  balance::Packer::save_state() (carry-over,
///                                     outlier queues, left-overs; n may be 0)
///   /state/last_loss       float64 [1] training loss of the last step run
///                                     (nats; NaN when none ran). Optional:
///                                     absent in older files.
///   /state/data_sources    int64 [1+4n] only when data.train blends n > 1 sources:
///                                     n, then per source epoch, position, tokens
///                                     and documents drawn (data::BlendedStream::save();
///                                     stream_epoch/position are source 0's)
///   /state/digest          uint64 [1] content digest of the whole state (below).
///                                     Optional: absent in older files, which
///                                     load and verify ("no digest").
///                     All /state datasets are chunked with Fletcher32 too.
///
/// ## Content digest (/state/digest)
/// Fletcher32 protects each chunk against damage but not against a
/// consistent rewrite (h5py writing one element recomputes the chunk's
/// checksum), so the whole content carries one digest: the sum modulo 2^64
/// of one 64-bit term per element — term = splitmix64(splitmix64(key(kind,
/// name) + global row-major index) XOR the float's 32 bits), key =
/// splitmix64(FNV-1a("/model/" | "/optim/m/" | "/optim/v/" + name)) — plus
/// splitmix64(FNV-1a of step, tokens_seen, stream_epoch, stream_position,
/// seed, the packer state and the bits of last_loss, little-endian). A sum of
/// per-element hashes (AdHash, Bellare & Micciancio, "A new paradigm for
/// collision-free hashing", EUROCRYPT 1997) can be computed shard by shard
/// and all-reduced, so it does not depend on the writing or reading layout.
/// It detects accidents (any single changed element changes it with
/// probability 1 - 2^-64), not an adversary who rewrites the digest too.
///   root attributes (strings are variable-length UTF-8):
///     format (string "wlb4d-checkpoint"), format_version (int 1),
///     step, tokens_seen (int64, copies of /state for h5dump readers),
///     deck (string: the resolved deck, core::to_ini()), writer_layout
///     (int32[4]: dp, pp, cp, tp of the writing run; informational only),
///     program_version, git_sha (strings, core/version.hpp), dataset_identity
///     (string, data::TokenDataset::identity()), model shape: vocab_size,
///     model_layers, model_d_model, model_heads, model_kv_heads,
///     model_ffn_hidden, model_tie_embeddings (int64; 1: no lm_head.weight,
///     the head is embed.weight; absent: 0), model_rope_theta, model_norm_eps (float64;
///     absent in files written before they joined the model identity),
///     model_rope_scaling (string none|llama3; absent: none) and with llama3
///     model_rope_factor, model_rope_low_freq_factor,
///     model_rope_high_freq_factor (float64), model_rope_original_max_position
///     (int64), tensors
///     (string: every parameter name, one per line, in the model's fixed
///     registry order), train_precision (string fp32|bf16: the writing
///     run's train.precision; absent in older files; the stored tensors are
///     fp32 master weights and fp32 state either way), cost_source (string)
///     and cost_a, cost_b, cost_c (float64): the balancing cost model the
///     writing run planned with (CheckpointInfo; absent in older files),
///     tokenizer (string "bytes" | "sentencepiece" | "hf-bpe"), tokenizer_vocab,
///     eos_id, bos_id (int64; -1: none): the training set's tokenizer, so
///     that a checkpoint can be exported, sampled and evaluated on its own
///     (absent in older files, which still load).
///   /tokenizer/model  uint8 [n]: the serialized sentencepiece model
///                     (tokenizer = sentencepiece) or the tokenizer.json text
///                     (hf-bpe); absent for bytes; chunked + Fletcher32.
///
/// ## Shapes before reads
/// Every reader (load, verify, inspect) first checks the model record (the
/// model_* attributes: positive, d_model % heads == 0, at most 2^31 each,
/// value + m + v of all its tensors no larger than the file) and that
/// `tensors` lists exactly core::param_shapes() of it; every dataset's shape
/// is then compared with the shape the record implies (and /state datasets'
/// element counts with the bytes stored) before any element is read, so a
/// damaged dimension (e.g. 2^61 + 1) is an error naming the dataset, never a
/// loop over it.
///
/// `DIR/latest`: text, one checkpoint file name (relative to DIR) per line,
/// newest first. The first line is the newest complete checkpoint; the list
/// is the retained set (checkpoint.keep entries at most). Written as
/// `latest.tmp` and renamed.
///
/// ## Atomic commit
/// The writer ranks (below) write `step_NNNNNN.h5.tmp` collectively over their
/// own communicator; H5Fflush + H5Fclose (collective over the writers) +
/// barrier of the world; rank 0 renames it to `step_NNNNNN.h5`, fsyncs DIR,
/// then rewrites `latest` and deletes checkpoints beyond the newest `keep`
/// (those listed in the old `latest`, and `step_*.h5` files found in DIR with
/// a smaller step that are not retained). Resume reads only `latest`, so a
/// leftover `.tmp` (a crash during a write) is never picked up; the next
/// successful save removes stale `.tmp` files.
///
/// ## Writers and readers
/// Writers: the ranks that own a shard (dp = 0, cp = 0 for TP-sharded
/// tensors, additionally tp = 0 for TP-replicated ones) plus world rank 0.
/// Only they open the file (MPI-IO over a communicator split off the world,
/// comm::Communicator::split); DP/CP replicas skip HDF5's blocking collectives
/// and wait politely for the agreed result. Every writer creates every
/// dataset in the same order (the full model's parameter list, including
/// stages it does not hold), and every write is a collective H5Dwrite
/// (H5FD_MPIO_COLLECTIVE; required for filtered datasets): exactly one rank
/// writes each element; the other writers select none. Reading: each rank reads the hyperslab its
/// CURRENT layout holds (independent reads, so a checksum failure on one
/// rank cannot desynchronise a collective), and all ranks agree on success
/// by an all-reduce before anyone returns. Hence a checkpoint written by any
/// layout resumes on any other.
///
/// ## Errors
/// Every failure throws wlb::core::CheckpointError on EVERY rank of the
/// world communicator (the message of the lowest failing rank is broadcast):
/// the message names the file, the dataset and the rule, e.g.
///   "checkpoint ck/step_000020.h5: /model/layers.0.attn.wq has shape [64][32]
///    but the deck's model needs [128][32]"
///   "checkpoint ck/step_000020.h5: /optim/m/embed.weight: cannot read data
///    (HDF5: data error detected by Fletcher32 checksum)"
/// Buffers are host memory; see train/checkpoint_state.hpp for the adapter from
/// model::ParamRegistry (device staging included).

#include "wlb4d/comm/communicator.hpp"
#include "wlb4d/core/config.hpp"
#include "wlb4d/grid/process_grid.hpp"

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <memory>
#include <string>
#include <vector>

namespace wlb::io {

inline constexpr const char* kCheckpointFormat = "wlb4d-checkpoint";
inline constexpr int kCheckpointFormatVersion = 1;

/// One tensor of the FULL model as the checkpoint sees it, plus this rank's
/// part of it. Every rank passes the same list of names/shapes in the same
/// order (the model's fixed registry order); `held` and the pointers differ.
struct TensorRef {
  std::string name;                        ///< dataset name under /model, /optim/m, /optim/v
  std::vector<std::int64_t> global_shape;  ///< [n] or [rows][cols] (elements)
  int shard_dim = -1;                      ///< TP-sharded dimension (chunk alignment, attribute), -1 replicated
  bool held = false;                       ///< this rank holds a shard (its pipeline stage has the tensor)
  bool writer = false;                     ///< this rank writes its shard (exactly one writer per element)
  std::vector<std::int64_t> start;         ///< hyperslab start in global coordinates (held only)
  std::vector<std::int64_t> count;         ///< hyperslab extent = local shape (held only)
  float* value = nullptr;                  ///< host, row-major, prod(count) elements (held only)
  float* m = nullptr;                      ///< AdamW first moment, same layout
  float* v = nullptr;                      ///< AdamW second moment, same layout
};

/// Training state beside the tensors (/state).
struct TrainState {
  std::int64_t step = 0;             ///< optimizer steps completed; the next step to run
  std::int64_t tokens_seen = 0;      ///< training tokens consumed
  std::int64_t stream_epoch = 0;     ///< DocumentStream::State::epoch
  std::int64_t stream_position = 0;  ///< DocumentStream::State::position
  std::vector<std::int64_t> packer_state;  ///< Packer::save_state()
  /// data::BlendedStream::save() when data.train blends several sources
  /// (/state/data_sources; empty and absent otherwise).
  std::vector<std::int64_t> data_sources;
  std::uint64_t seed = 0;            ///< train.seed
  double last_loss = std::numeric_limits<double>::quiet_NaN();  ///< loss of the last step run (nats); NaN: none / not stored
  /// Loss-spike guard (train/guards.hpp): updates skipped so far
  /// (/state/skipped_steps, int64 [1]) and its running window as (loss, grad
  /// norm) pairs, oldest first, flattened (/state/spike_window, float64 [2n];
  /// empty with the guard off). Both are in the content digest.
  std::int64_t skipped_steps = 0;
  std::vector<double> spike_window;
  /// Save: always true (both datasets are written). Read: false for older
  /// files without them (skipped_steps 0, window empty; the digest then
  /// leaves them out, as those files' writers did).
  bool has_guard_state = true;
  bool operator==(const TrainState& o) const {
    const bool same_loss = last_loss == o.last_loss || (std::isnan(last_loss) && std::isnan(o.last_loss));
    return step == o.step && tokens_seen == o.tokens_seen && stream_epoch == o.stream_epoch &&
           stream_position == o.stream_position && packer_state == o.packer_state &&
           data_sources == o.data_sources && seed == o.seed && same_loss &&
           skipped_steps == o.skipped_steps && spike_window == o.spike_window;
  }
};

/// What the root attributes describe (written by save, returned by read/load).
struct CheckpointInfo {
  std::string deck;              ///< resolved deck text (core::to_ini(cfg))
  std::string dataset_identity;  ///< data::TokenDataset::identity() of the training set
  core::ModelConfig model;       ///< layers, d_model, heads, kv_heads, ffn_hidden, rope_theta, norm_eps are stored
  bool has_rope_norm = false;    ///< read: rope_theta/norm_eps were stored (older files lack them)
  std::int64_t vocab = 0;        ///< vocabulary size (from the dataset)
  /// train.precision of the writing run (root attribute train_precision);
  /// informational: the tensors are fp32 master weights and fp32 AdamW state
  /// in both, so either precision resumes the other. Read: "" if absent (older files).
  std::string precision = "fp32";
  /// The balancing cost model the writing run planned with (root attributes
  /// cost_source, cost_a [s/token], cost_b [s/token²], cost_c [s] per layer;
  /// balance::CostModel): source "flops", "deck", "calibrated" (timed at the
  /// run's first start) or "flops-fallback" (calibration degenerate). A resume
  /// with balance.calibrate=true reuses calibrated constants instead of timing
  /// again, so it plans as the uninterrupted run. Save: written when source is
  /// not empty. Read: "" when absent (older files).
  std::string cost_source;
  double cost_a = 0, cost_b = 0, cost_c = 0;
  /// The training set's tokenizer (data::Tokenizer): "bytes",
  /// "sentencepiece" or "hf-bpe"; "" when not stored (older files; save
  /// then writes none).
  std::string tokenizer;
  /// The dataset's vocabulary (token ids < it); vocab above it is the
  /// padding of model.vocab_size (rows an export trims). 0 when not stored.
  std::int64_t tokenizer_vocab = 0;
  std::int64_t eos_id = -1;  ///< end-of-document id (-1: not stored)
  std::int64_t bos_id = -1;  ///< beginning-of-sequence id (-1: none; the bytes tokenizer has none)
  /// Root attribute weights_only = 1: the file holds /model and /state but
  /// no /optim (wlb4d-ckpt import-hf, save_weights_checkpoint()). Such a
  /// file starts a run (checkpoint.init_from, fresh optimizer, step 0); a
  /// resume, which needs the moments, refuses it. Absent: false.
  bool weights_only = false;
  /// Save: the serialized sentencepiece model or tokenizer.json text
  /// (Tokenizer::model()), written to /tokenizer/model ("" for bytes). Read:
  /// left empty (read_checkpoint_tokenizer_model()).
  std::string tokenizer_model;
  // Filled by save/read; ignored on input to save_checkpoint():
  int layout[4] = {1, 1, 1, 1};  ///< writer's dp, pp, cp, tp
  std::string program_version;   ///< core::kVersion of the writer
  std::string git_sha;           ///< core::kGitSha of the writer
  std::int64_t step = 0;
  std::int64_t tokens_seen = 0;
  std::vector<std::string> tensors;  ///< parameter names in file order
  std::vector<std::vector<std::int64_t>> shapes;  ///< read: global shape of tensors[i] implied by the model record
};

/// What verify_checkpoint() found.
struct VerifyResult {
  bool has_digest = false;  ///< /state/digest present (false: an older file, "no digest")
  std::uint64_t digest = 0; ///< the stored digest, equal to the recomputed one
};

/// "[64][32]" (shape printing used in messages).
std::string shape_string(const std::vector<std::int64_t>& shape);

/// `DIR/step_NNNNNN.h5` of a step.
std::string checkpoint_path(const std::string& dir, std::int64_t step);

/// Writes the checkpoint of `state.step` into cc.dir (created if missing) and
/// commits it atomically (see the file comment); keeps the newest cc.keep.
/// Collective over grid.world(). tensors: the full model list (same names,
/// shapes and order on every rank). Returns the final path (every rank).
/// \throws core::CheckpointError (every rank) if the writers do not cover
///         every element exactly once (counted), the directory or file cannot
///         be created, an HDF5 call fails, or the rename/`latest` update
///         fails; the .tmp file is removed then.
/// Bytes a checkpoint of `tensors` takes on disk, about: value, m and v of
/// every element (float32) plus HDF5 metadata (4 KiB per dataset) and 1 MiB
/// for the deck, /state and the file's own structures. Same on every rank.
std::uint64_t checkpoint_bytes_estimate(const std::vector<TensorRef>& tensors);

/// Exclusive lock of a checkpoint.dir for the life of a run: two runs on one
/// directory would overwrite each other's files and `latest`. Rank 0 holds a
/// POSIX record lock (fcntl F_SETLK) on DIR/.wlb4d.lock and writes its host,
/// pid and start time into it; the kernel releases the lock when the process
/// ends, however it ends, so a crashed run leaves no stale lock (works on
/// local file systems and NFS/Lustre mounts with locking enabled).
class CheckpointDirLock {
 public:
  CheckpointDirLock() = default;
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;
  /// Collective over `world`. \throws core::CheckpointError on every rank if
  /// another process holds the lock, naming the directory and the holder
  /// (host, pid, start time), or if the directory cannot be created.
  void acquire(const std::string& dir, const comm::Communicator& world);

 private:
  int fd_ = -1;
  std::string path_;
};

/// Start-up check of checkpoint.dir (collective over `world`; rank 0 looks):
/// it exists or can be created, a file can be created in it, and its file
/// system has at least `bytes` free — so a read-only or nearly full directory
/// fails before training, not at the first checkpoint.
/// \throws core::CheckpointError on every rank, naming checkpoint.dir and the
///         cause ("is not writable: Read-only file system", "no space left on
///         device for a checkpoint: it needs about N MiB, ... has M MiB free").
void check_checkpoint_dir(const std::string& dir, const comm::Communicator& world, std::uint64_t bytes);

std::string save_checkpoint(const core::CheckpointConfig& cc, const grid::ProcessGrid& grid,
                            const std::vector<TensorRef>& tensors, const TrainState& state,
                            const CheckpointInfo& info);

/// How save_checkpoint() runs (the overload on a communicator).
struct SaveOptions {
  /// Read the written file back (verify_checkpoint over the ranks: every
  /// checksum and the content digest) before the commit, so `latest` only
  /// ever names a verified file.
  bool verify = false;
  /// Called from a background thread while another thread of the process
  /// may call HDF5 (asynchronous checkpoints): every HDF5 step (the file's
  /// creation, one dataset, /state, the close, the read-back) runs under
  /// data::h5::api_mutex(), with HDF5's printing silenced per step.
  bool background = false;
};

/// save_checkpoint() over communicator `world` (every rank of the job,
/// e.g. a duplicate of the world for a writer thread: MPI_THREAD_MULTIPLE)
/// with the writing layout given as {dp, pp, cp, tp}. Same file, same
/// commit, same errors.
std::string save_checkpoint(const core::CheckpointConfig& cc, const comm::Communicator& world,
                            const std::int32_t layout[4], const std::vector<TensorRef>& tensors,
                            const TrainState& state, const CheckpointInfo& info, const SaveOptions& opt);

/// Asynchronous checkpoints (checkpoint.async; Megatron-LM's --async-save,
/// TorchTitan's DCP async_save): the trainer copies the state into host
/// buffers it owns (the blocking part) and hands them to this writer, whose
/// thread runs save_checkpoint() with SaveOptions{verify, background} on a
/// duplicate of the world communicator while training goes on (the hidden
/// part). The file, its checksums, its digest and the commit are those of a
/// synchronous save; `latest` moves only after the whole file was written,
/// closed and read back. One save at a time: the caller collects the
/// previous one with wait() before start() (start() with one in flight is a
/// programming error, see start()). Needs MPI_THREAD_MULTIPLE
/// (core::mpi_thread_multiple()): the thread calls MPI (the writers' MPI-IO,
/// the agreements) on its own communicator, so the training thread's
/// collectives on the world never interleave with the writer's.
/// Errors of the save itself are not thrown: the thread catches them and
/// wait() returns them in Result::error (the trainer reports them; a failed
/// save leaves `latest` on the previous checkpoint).
class AsyncCheckpointWriter {
 public:
  /// What a finished save did (the same on every rank).
  struct Result {
    std::int64_t step = 0;
    std::string path;     ///< the committed file ("" on error)
    std::string error;    ///< "" or the save's error (agreed by every rank)
    double seconds = 0;   ///< wall seconds of the thread's write, read-back and commit
  };
  /// Collective over `world`: duplicates it for the writer thread.
  /// \param layout dp, pp, cp, tp of the writing run (root attribute writer_layout)
  /// \throws core::CheckpointError when the communicator cannot be duplicated.
  AsyncCheckpointWriter(const comm::Communicator& world, const std::int32_t layout[4]);
  /// Waits for a save in flight (its result is dropped: call wait() first to see it).
  ~AsyncCheckpointWriter();
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;

  /// Starts writing; returns at once. The tensors' buffers (host memory, the
  /// shapes and layout of save_checkpoint()'s TensorRef) belong to the
  /// caller and must stay unchanged until the save has finished (wait(), or
  /// done() true): the thread reads them without a copy, which is why the
  /// blocking part is only the trainer's copy into them. Call on every rank,
  /// with no save in flight.
  /// \throws core::InternalError when a save is still in flight (wait() first).
  void start(const core::CheckpointConfig& cc, std::vector<TensorRef> tensors, TrainState state, CheckpointInfo info);
  /// A save was started and not yet collected by wait().
  bool in_flight() const { return started_; }
  /// Collective over the world (one all-reduce): true when every rank's
  /// writer has finished the save in flight (false when none is).
  bool done(const comm::Communicator& world) const;
  /// Waits for the save in flight (local join; the save itself is
  /// collective, so every rank's thread ends) and returns its result;
  /// nothing when none is in flight.
  std::optional<Result> wait();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool started_ = false;
};

/// The result of load_checkpoint().
struct LoadedCheckpoint {
  TrainState state;
  CheckpointInfo info;  ///< the root attributes (writer layout, deck, dataset identity, ...)
};

/// Reads `path` into the held shards of `tensors` (value, m, v) resharding to
/// the current layout, and returns /state and the root attributes.
/// Collective over grid.world(). The expected model shape is given by the
/// tensors' global shapes (and model/vocab for the root-attribute check).
/// \throws core::CheckpointError (every rank): not a file / not HDF5 /
///         truncated; wrong format or version; model attributes differing from
///         `model`/`vocab` ("written for layers=2 d_model=64 ... vocab=97 but
///         the deck's model has ..."); a tensor missing; a dataset whose shape
///         differs from its TensorRef's global_shape (both shapes named);
///         a checksum or read failure (file and dataset named); a content
///         digest that differs from the one recomputed over the shards read
///         (checked when every held tensor has value, m and v). On failure
///         the held buffers may be partly overwritten: do not train on.
LoadedCheckpoint load_checkpoint(const std::string& path, const grid::ProcessGrid& grid,
                                 const std::vector<TensorRef>& tensors, const core::ModelConfig& model,
                                 std::int64_t vocab);

/// Serial check of one checkpoint file: opens it, checks format attributes,
/// the model record and every dataset's shape (see "Shapes before reads"),
/// reads every dataset listed (all /model, /optim/m, /optim/v tensors of the
/// `tensors` attribute and /state), so every Fletcher32 checksum is
/// verified, and recomputes the content digest when the file has one.
/// \throws core::CheckpointError naming the file and the dataset, or
///         "content digest mismatch" naming the file.
VerifyResult verify_checkpoint(const std::string& path);

/// Collective version: dataset i is verified by world rank i % size; all
/// ranks agree (the first failure's message is thrown on every rank).
VerifyResult verify_checkpoint(const std::string& path, const comm::Communicator& world);

/// Root attributes of a checkpoint (serial, any process; no dataset read).
/// \throws core::CheckpointError if the file is not a wlb4d checkpoint.
CheckpointInfo read_checkpoint_info(const std::string& path);

/// Global shape and L2 norm of one stored tensor (wlb4d-ckpt inspect).
struct TensorSummary {
  std::string dataset;  ///< "/model/<name>", "/optim/m/<name>", "/optim/v/<name>"
  std::vector<std::int64_t> shape;
  double l2 = 0;        ///< sqrt(Σ x²) accumulated in double
};
/// Reads every tensor dataset (serial; checksums verified on the way) and
/// returns its shape and L2 norm, in file order (/model, then /optim/m, /optim/v).
/// \throws core::CheckpointError as verify_checkpoint().
std::vector<TensorSummary> summarize_checkpoint(const std::string& path);

/// /state of a checkpoint (serial). \throws core::CheckpointError.
TrainState read_train_state(const std::string& path);

/// Fills `out` (empty on entry) with tensor `name` of global shape `shape`,
/// row-major fp32.
using TensorFill =
    std::function<void(const std::string& name, const std::vector<std::int64_t>& shape, std::vector<float>& out)>;

/// Writes a weights-only checkpoint (format above: /model, /state of step 0,
/// root attributes with weights_only = 1, no /optim; /tokenizer/model when
/// info.tokenizer_model is set) serially, one tensor in memory at a time:
/// fill() is called for every tensor of core::param_shapes(info.model,
/// info.vocab) in that order. writer_layout is 1 1 1 1. Written as
/// `path.tmp` and renamed when complete (nothing under `path` on failure).
/// wlb4d-ckpt import-hf writes its output with it; verify and inspect read
/// it, a run starts from it with checkpoint.init_from.
/// \throws core::CheckpointError naming the file and the tensor (a wrong
///         element count from fill, an HDF5 failure); fill's own exceptions pass through.
void save_weights_checkpoint(const std::string& path, CheckpointInfo info, const TensorFill& fill);

/// The tokenizer model stored in /tokenizer/model (serial;
/// Fletcher32 checked); "" when the checkpoint stores none (the bytes
/// tokenizer, or an older file). \throws core::CheckpointError naming the file.
std::string read_checkpoint_tokenizer_model(const std::string& path);

/// Reads parameter tensor /model/<name> at its global shape (row-major fp32,
/// serial, Fletcher32 checked), one tensor at a time: an export streams a
/// checkpoint through memory one tensor at once. `name` must be one of the
/// file's `tensors` list; its shape is checked against the model record
/// before the read. \throws core::CheckpointError naming the file and tensor.
std::vector<float> read_model_tensor(const std::string& path, const std::string& name);

/// The checkpoint files listed in DIR/latest, newest first, as paths
/// (DIR/name); empty if DIR/latest does not exist. Serial. `latest` is read
/// bounded: a regular file of at most 64 KiB of step_NNNNNN.h5 lines.
/// \throws core::CheckpointError naming DIR/latest when it is anything else
///         (a directory, a device such as /dev/zero, unreadable, too large,
///         a line that is no step file name of DIR).
std::vector<std::string> list_checkpoints(const std::string& dir);

/// What an earlier run left in DIR that a fresh start would replace: "latest"
/// (whatever it is) and the step_NNNNNN.h5 names, newest first. Serial.
std::vector<std::string> earlier_checkpoint_files(const std::string& dir);

/// Which checkpoint to resume from (checkpoint.resume). Collective over world.
///   "never"        -> nullopt.
///   "auto"         -> nullopt when DIR holds no step file and no usable
///                     `latest` (fresh start; an unusable `latest` is named
///                     in a warning); otherwise the first checkpoint listed in `latest`
///                     (newest first) that passes verify_checkpoint(path,
///                     world); every newer one that fails is reported (rank 0
///                     logs a warning "checkpoint A is unusable (...); falling
///                     back to the previous checkpoint B") and appended to
///                     *skipped when given.
///                     A checkpoint that verifies but for which `usable`
///                     (if given; called on every rank with the path)
///                     returns a reason — e.g. its model differs from the
///                     deck's — is skipped the same way.
///                     After the listed ones, or instead of them when
///                     `latest` is missing or unusable (list_checkpoints()),
///                     the step files of DIR it does not list, newest first;
///                     rank 0 warns naming `latest` and the file chosen.
///                     Never a fresh start while DIR holds step files.
///   <file path>    -> that file after verification (no fallback).
///   <directory>    -> as "auto" in that directory, but a missing `latest` is an error.
/// All ranks return the same answer (rank 0 reads `latest` and broadcasts).
/// \throws core::CheckpointError when an explicitly named file/directory is
///         missing or fails verification (or its `latest` is missing or
///         unusable), or when DIR holds checkpoints but none is usable
///         (every reason named).
/// "" when the checkpoint at `path` was written for this model and
/// (padded) vocabulary, else the reason naming both models; a differing
/// model.rope_theta or model.norm_eps is named with both values (files
/// that predate these attributes are not compared on them). Serial read.
/// \throws core::CheckpointError if the file cannot be read.
std::string checkpoint_model_mismatch(const std::string& path, const core::ModelConfig& model, std::int64_t vocab);

std::optional<std::string> resolve_resume(const std::string& dir, const std::string& mode,
                                          const comm::Communicator& world,
                                          std::vector<std::string>* skipped = nullptr,
                                          const std::function<std::string(const std::string&)>& usable = {});

}  // namespace wlb::io
