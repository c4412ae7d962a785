#pragma once
// Internal to lib/src/io: what the checkpoint files share.
//   checkpoint_format.cpp  HDF5 layout: datasets, attributes, chunking, /state, info
//   checkpoint_commit.cpp  file system: mkdirs, fsync, tmp+rename commit, `latest`,
//                          retention, listing, resolve_resume
//   checkpoint.cpp         save / load / verify orchestration (collective)
// HDF5 plumbing is the shared layer wlb4d/data/h5util.hpp; errors are
// core::CheckpointError("checkpoint <path>: <what>").

#include "wlb4d/io/checkpoint.hpp"

#include "wlb4d/core/error.hpp"
#include "wlb4d/data/h5util.hpp"

#include <hdf5.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace wlb::io::ckpt {

using core::CheckpointError;
using H = data::h5::Handle;
namespace h5 = data::h5;

// ---- messages -------------------------------------------------------------------------

/// How checkpoint messages name the file: "checkpoint <path>".
inline std::string where(const std::string& path) { return "checkpoint " + path; }
inline std::string prefix(const std::string& path) { return where(path) + ": "; }
[[noreturn]] inline void fail(const std::string& path, const std::string& what) {
  throw CheckpointError(prefix(path) + what);
}
/// h5::check / check_status with checkpoint errors.
inline hid_t need(hid_t id, const std::string& path, const std::string& what) {
  return h5::check<CheckpointError>(id, where(path), what);
}
inline void need_ok(herr_t st, const std::string& path, const std::string& what) {
  h5::check_status<CheckpointError>(st, where(path), what);
}

std::vector<std::string> split_lines(const std::string& s);

// ---- layout (checkpoint_format.cpp) ----------------------------------------------------

/// Dataset prefixes of the three kinds of every tensor: value, Adam m, Adam v.
extern const char* const kKinds[3];
/// /state datasets, in order; kStateNames[kSeedState] is uint64, the rest int64.
extern const char* const kStateNames[];
constexpr int kNumState = 6;
constexpr int kSeedState = 4;
constexpr int kPackerState = 5;
/// Optional /state datasets (absent in older files): float64 [1], uint64 [1].
inline constexpr const char* kLastLossState = "/state/last_loss";
inline constexpr const char* kDigestState = "/state/digest";
/// Optional /state datasets of the loss-spike guard (absent in older files):
/// int64 [1], float64 [2n] (TrainState::skipped_steps, spike_window).
inline constexpr const char* kSkippedState = "/state/skipped_steps";
inline constexpr const char* kSpikeWindowState = "/state/spike_window";
/// data::BlendedStream::save() (int64; only when data.train blends several sources).
inline constexpr const char* kDataSourcesState = "/state/data_sources";
/// The serialized sentencepiece model (optional: sentencepiece only; absent in older files).
inline constexpr const char* kTokenizerGroup = "/tokenizer";
inline constexpr const char* kTokenizerModel = "/tokenizer/model";
/// Groups created in a new file, parents first.
extern const char* const kGroups[5];

std::int64_t numel(const std::vector<std::int64_t>& s);
/// Chunk dims: finest TP shard along shard_dim, whole extent elsewhere,
/// dimension 0 (then 1) cut to <= 64 MiB. Same on every rank.
std::vector<hsize_t> chunk_dims(const std::vector<std::int64_t>& g, int shard_dim, int tp);
std::string tensor_list_text(const std::vector<TensorRef>& t);
std::string model_string(const core::ModelConfig& m, std::int64_t vocab);

/// Root attributes of a new checkpoint. \throws CheckpointError naming `path`.
/// layout: dp, pp, cp, tp of the writing run (1, 1, 1, 1 for a serial writer).
void write_root_attrs(hid_t f, const std::string& path, const std::int32_t layout[4],
                      const std::vector<TensorRef>& tensors, const TrainState& state, const CheckpointInfo& info);
/// Creates a chunked, Fletcher32 float dataset of global shape g (H5I_INVALID_HID on failure).
hid_t create_f32(hid_t file, const std::string& name, const std::vector<std::int64_t>& g,
                 const std::vector<hsize_t>& chunk);
/// Creates a 1-D int64/uint64 /state dataset of n elements (n may be 0:
/// extendible), chunked + Fletcher32 (H5I_INVALID_HID on failure).
hid_t create_state(hid_t file, const char* name, hid_t type, hsize_t n);
/// Collective write: `buf` null (or an empty count) selects none.
herr_t write_part(hid_t ds, hid_t mem_type, const std::vector<std::int64_t>& start,
                  const std::vector<std::int64_t>& count, const void* buf, hid_t dxpl);
/// The value of /state dataset k in `state` (its element count in *n).
const void* state_buffer(const TrainState& state, int k, const std::int64_t scalars[4], hsize_t* n);

/// Opens a dataset and returns its dims. \throws CheckpointError.
H open_dataset(hid_t file, const std::string& name, const std::string& path, std::vector<std::int64_t>* dims);
/// Opens a dataset and checks, before any read, that its shape is `expected`
/// ("<name> has shape A but <whose> implies B"). \throws CheckpointError.
H open_expected(hid_t file, const std::string& name, const std::string& path, const std::vector<std::int64_t>& expected,
                const std::string& whose = "the checkpoint's model record");

// ---- content digest (checkpoint.hpp "Content digest") ------------------------------------

/// key(kind, name) of the digest terms of one tensor kind (k: 0 value, 1 m, 2 v).
std::uint64_t digest_key(int k, const std::string& name);
/// Σ terms of n contiguous floats whose first global row-major index is idx0.
std::uint64_t digest_span(std::uint64_t key, std::uint64_t idx0, const float* x, std::size_t n);
/// Σ terms of a hyperslab [start, start+count) of a 1-D/2-D tensor of global
/// shape g held row-major in x.
std::uint64_t digest_part(std::uint64_t key, const std::vector<std::int64_t>& g, const std::vector<std::int64_t>& start,
                          const std::vector<std::int64_t>& count, const float* x);
/// The /state term.
std::uint64_t digest_state(const TrainState& s);
void require_class(hid_t ds, H5T_class_t cls, const std::string& name, const std::string& path);
/// Reads the hyperslab [start, start+count) of ds into buf.
void read_part(hid_t ds, hid_t mem_type, const std::vector<std::int64_t>& start,
               const std::vector<std::int64_t>& count, void* buf, hid_t dxpl, const std::string& name,
               const std::string& path);
/// Reads a whole float dataset block by block (rows along dim 0), calling f
/// on every block; checksums are verified by HDF5 on the way.
/// The dataset's shape must be `expected` (checked before the first read).
void scan_f32(hid_t file, const std::string& name, const std::string& path, const std::vector<std::int64_t>& expected,
              const std::function<void(const float*, std::size_t)>& f);
std::vector<std::int64_t> read_state_vec(hid_t file, const char* name, hid_t mem_type, const std::string& path,
                                         hid_t dxpl = H5P_DEFAULT);
TrainState read_state(hid_t file, const std::string& path, hid_t dxpl);
/// Opens a file serially (read-only, sec2 driver) after checking it exists and is HDF5.
H open_serial(const std::string& path);
/// Reads and checks the root attributes (format, version, deck, layout, the
/// model record and its bounds, tensors == core::param_shapes of the record)
/// and fills info.shapes.
CheckpointInfo read_info(hid_t f, const std::string& path);
/// What one rank's share of a verification found.
struct VerifyPart {
  std::string err;           ///< "" or the first error message
  std::uint64_t sum = 0;     ///< digest terms of the datasets this rank read
  bool has_digest = false;   ///< (rank 0's share) the file has /state/digest
  std::uint64_t stored = 0;  ///< (rank 0's share) its value
};
/// Verifies datasets i with i % size == rank of the file (tensors x 3 kinds,
/// then /state).
VerifyPart verify_part(const std::string& path, int rank, int size);
/// verify_checkpoint(path, world); `lock`: this rank's reads under
/// h5::api_mutex() (from the asynchronous writer thread).
VerifyResult verify_collective(const std::string& path, const comm::Communicator& world, bool lock);

// ---- file system (checkpoint_commit.cpp) -----------------------------------------------

bool is_dir(const std::string& p);
bool is_file(const std::string& p);
/// mkdir -p. \throws CheckpointError naming checkpoint.dir.
void mkdirs(const std::string& dir);
/// Free bytes for an unprivileged writer in dir's file system (statvfs
/// f_bavail · f_frsize); UINT64_MAX when unknown. `injectable`: the
/// start-up/pre-write checks, which WLB4D_FAULT=ckpt_free may override
/// (fault.hpp); false for the figure that explains a failed write.
std::uint64_t free_bytes(const std::string& dir, bool injectable);
/// " (N KiB free in DIR[: no space left on device])", or "" when unknown:
/// appended to a failed write's message so it names the cause.
std::string space_note(const std::string& dir);
/// mkdir -p, a probe file created and removed, and at least `bytes` free.
/// \throws CheckpointError naming checkpoint.dir and the cause.
void check_dir_for_checkpoints(const std::string& dir, std::uint64_t bytes);
std::string join_path(const std::string& dir, const std::string& name);
/// Reserves `bytes` of disk space for the file `path` (fallocate; the file
/// grows to at least `bytes`, HDF5's close truncates it back to its end of
/// allocation): a disk that cannot take the checkpoint fails here, before
/// HDF5 writes anything, instead of inside a collective HDF5 call (whose
/// ranks then disagree and hang in the close). "" when reserved or when the
/// file system cannot reserve (EOPNOTSUPP: best effort); otherwise the
/// message, naming the file, the size and the cause.
std::string reserve_space(const std::string& path, std::uint64_t bytes);
/// Largest `latest` read: a list of keep-many "step_NNNNNN.h5" lines is far
/// smaller; anything bigger (or /dev/zero behind a symlink) is not read.
inline constexpr long long kMaxLatestBytes = 64 * 1024;
/// What DIR/latest holds, read bounded (a regular file of at most
/// kMaxLatestBytes, opened without blocking, checked after opening).
struct Latest {
  enum State { kMissing, kOk, kUnusable } state = kMissing;
  std::vector<std::string> names;  ///< kOk: the listed step file names, newest first
  std::string problem;             ///< kMissing, kUnusable: "DIR/latest <why>"
  bool directory = false;          ///< kUnusable: it is a directory (a commit cannot replace it)
};
/// Never throws for a bad `latest`; a bad entry makes the whole list kUnusable.
Latest read_latest(const std::string& dir);
/// The step_NNNNNN.h5 names found in DIR (.tmp leftovers excluded), newest step first.
std::vector<std::string> step_files(const std::string& dir);
/// Rank 0's commit: rename tmp -> final, fsync, rewrite `latest`, retention.
/// A step file already at final_path that this process did not write is kept
/// as final_path + ".replaced-<unix time>" (with a warning), never overwritten.
void commit(const std::string& dir, const std::string& tmp, const std::string& final_path, std::int64_t step,
            int keep);

}  // namespace wlb::io::ckpt
