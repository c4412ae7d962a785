// Checkpoint file layout (checkpoint.hpp): root attributes, chunked
// Fletcher32 datasets per tensor kind, the /state table; reading, checking
// and verifying it. HDF5 plumbing: data/h5util.hpp.
#include "checkpoint_detail.hpp"

#include "wlb4d/core/hash.hpp"
#include "wlb4d/core/version.hpp"
#include "wlb4d/core/param_shapes.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

namespace wlb::io::ckpt {

namespace {
constexpr std::int64_t kMaxChunkBytes = 64LL << 20;  // 64 MiB
constexpr std::int64_t kScanBlockElems = 16LL << 20; // verification reads <= 64 MiB at a time
constexpr auto kW = h5::Wording::Checkpoint;

std::string attr_string(hid_t f, const char* name, const std::string& path) {
  return h5::read_attr_string<CheckpointError>(f, name, where(path), kW);
}
std::vector<std::int64_t> attr_i64s(hid_t f, const char* name, const std::string& path) {
  return h5::read_attr_i64s<CheckpointError>(f, name, where(path), kW);
}
std::int64_t attr_i64(hid_t f, const char* name, const std::string& path) {
  return h5::read_attr_i64<CheckpointError>(f, name, where(path), kW);
}
/// A scalar float attribute (model_rope_theta, model_norm_eps).
double attr_f64(hid_t f, const char* name, const std::string& path) {
  H a(need(H5Aopen(f, name, H5P_DEFAULT), path, std::string("cannot open attribute ") + name));
  H t(need(H5Aget_type(a.get()), path, "H5Aget_type"));
  H sp(need(H5Aget_space(a.get()), path, "H5Aget_space"));
  if (H5Tget_class(t.get()) != H5T_FLOAT || H5Sget_simple_extent_npoints(sp.get()) != 1)
    fail(path, std::string("attribute ") + name + " is not a scalar float");
  double v = 0;
  need_ok(H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v), path, std::string("cannot read attribute ") + name);
  return v;
}
}  // namespace

const char* const kKinds[3] = {"/model/", "/optim/m/", "/optim/v/"};
const char* const kStateNames[] = {"/state/step", "/state/tokens_seen", "/state/stream_epoch",
                                   "/state/stream_position", "/state/seed", "/state/packer"};
const char* const kGroups[5] = {"/model", "/optim", "/optim/m", "/optim/v", "/state"};

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(line);
  return out;
}

// ---- shapes and chunks ------------------------------------------------------------------

std::int64_t numel(const std::vector<std::int64_t>& s) {
  std::int64_t n = 1;
  for (auto e : s) n *= e;
  return n;
}

/// Chunk dims (see the file comment): finest TP shard along shard_dim, whole
/// extent elsewhere, dimension 0 (then 1) cut to ≤ 64 MiB. Same on every rank.
std::vector<hsize_t> chunk_dims(const std::vector<std::int64_t>& g, int shard_dim, int tp) {
  std::vector<std::int64_t> c = g;
  if (shard_dim >= 0 && shard_dim < int(g.size())) c[std::size_t(shard_dim)] = (g[std::size_t(shard_dim)] + tp - 1) / tp;
  const std::int64_t cap = kMaxChunkBytes / std::int64_t(sizeof(float));
  for (std::size_t d = 0; d < c.size() && numel(c) > cap; ++d) {
    const std::int64_t rest = numel(c) / c[d];
    const std::int64_t fit = std::max<std::int64_t>(1, cap / std::max<std::int64_t>(rest, 1));
    // Cut c[d] into equal parts of at most `fit` (keeps TP alignment when
    // d == shard_dim: parts divide the shard extent as evenly as possible).
    const std::int64_t parts = (c[d] + fit - 1) / fit;
    c[d] = (c[d] + parts - 1) / parts;
  }
  std::vector<hsize_t> out;
  for (auto e : c) out.push_back(hsize_t(std::max<std::int64_t>(e, 1)));
  return out;
}

std::string tensor_list_text(const std::vector<TensorRef>& t) {
  std::string s;
  for (const auto& x : t) s += x.name + "\n";
  return s;
}

std::string model_string(const core::ModelConfig& m, std::int64_t vocab) {
  return "vocab=" + std::to_string(vocab) + " layers=" + std::to_string(m.layers) +
         " d_model=" + std::to_string(m.d_model) + " heads=" + std::to_string(m.heads) +
         " kv_heads=" + std::to_string(m.kv_heads) + " ffn_hidden=" + std::to_string(m.ffn_hidden) +
         (m.tie_embeddings ? " tie_embeddings" : "");
}

// ---- writing ----------------------------------------------------------------------------

void write_root_attrs(hid_t f, const std::string& path, const std::int32_t layout[4],
                      const std::vector<TensorRef>& tensors, const TrainState& state, const CheckpointInfo& info) {
  const std::string w = where(path);
  auto str = [&](const char* name, const std::string& v) {
    h5::write_attr_string<CheckpointError>(f, name, v, w, h5::StrKind::VariableUtf8, kW);
  };
  auto i64 = [&](const char* name, std::int64_t v) { h5::write_attr_i64<CheckpointError>(f, name, v, w, kW); };
  str("format", kCheckpointFormat);
  const int ver = kCheckpointFormatVersion;
  h5::write_attr<CheckpointError>(f, "format_version", H5T_NATIVE_INT, &ver, 1, true, w, kW);
  i64("step", state.step);
  i64("tokens_seen", state.tokens_seen);
  str("deck", info.deck);
  h5::write_attr<CheckpointError>(f, "writer_layout", H5T_NATIVE_INT32, layout, 4, false, w, kW);
  str("program_version", core::kVersion);
  str("git_sha", core::kGitSha);
  str("dataset_identity", info.dataset_identity);
  i64("vocab_size", info.vocab);
  i64("model_layers", info.model.layers);
  i64("model_d_model", info.model.d_model);
  i64("model_heads", info.model.heads);
  i64("model_kv_heads", info.model.kv_heads);
  i64("model_ffn_hidden", info.model.ffn_hidden);
  i64("model_tie_embeddings", info.model.tie_embeddings ? 1 : 0);
  h5::write_attr<CheckpointError>(f, "model_rope_theta", H5T_NATIVE_DOUBLE, &info.model.rope_theta, 1, true, w, kW);
  h5::write_attr<CheckpointError>(f, "model_norm_eps", H5T_NATIVE_DOUBLE, &info.model.norm_eps, 1, true, w, kW);
  str("model_rope_scaling", info.model.rope_scaling);
  if (info.model.rope_scaling != "none") {
    const auto f64 = [&](const char* name, const double& v) {
      h5::write_attr<CheckpointError>(f, name, H5T_NATIVE_DOUBLE, &v, 1, true, w, kW);
    };
    f64("model_rope_factor", info.model.rope_factor);
    f64("model_rope_low_freq_factor", info.model.rope_low_freq_factor);
    f64("model_rope_high_freq_factor", info.model.rope_high_freq_factor);
    i64("model_rope_original_max_position", info.model.rope_original_max_position);
  }
  str("tensors", tensor_list_text(tensors));
  str("train_precision", info.precision);
  if (!info.cost_source.empty()) {  // the balancing cost model, reused on resume (balance.calibrate)
    str("cost_source", info.cost_source);
    h5::write_attr<CheckpointError>(f, "cost_a", H5T_NATIVE_DOUBLE, &info.cost_a, 1, true, w, kW);
    h5::write_attr<CheckpointError>(f, "cost_b", H5T_NATIVE_DOUBLE, &info.cost_b, 1, true, w, kW);
    h5::write_attr<CheckpointError>(f, "cost_c", H5T_NATIVE_DOUBLE, &info.cost_c, 1, true, w, kW);
  }
  if (info.weights_only) i64("weights_only", 1);  // no /optim: a start for checkpoint.init_from
  if (!info.tokenizer.empty()) {  // the training set's tokenizer (export, sampling)
    str("tokenizer", info.tokenizer);
    i64("tokenizer_vocab", info.tokenizer_vocab);
    i64("eos_id", info.eos_id);
    i64("bos_id", info.bos_id);
  }
}

hid_t create_f32(hid_t file, const std::string& name, const std::vector<std::int64_t>& g,
                 const std::vector<hsize_t>& chunk) {
  std::vector<hsize_t> dims(g.begin(), g.end());
  H space(H5Screate_simple(int(dims.size()), dims.data(), nullptr));
  H dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_chunk(dcpl.get(), int(chunk.size()), chunk.data());
  H5Pset_fletcher32(dcpl.get());
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);  // every element is written
  return H5Dcreate2(file, name.c_str(), H5T_NATIVE_FLOAT, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT);
}

/// Collective write: `buf` null (or an empty count) selects none.
herr_t write_part(hid_t ds, hid_t mem_type, const std::vector<std::int64_t>& start,
                  const std::vector<std::int64_t>& count, const void* buf, hid_t dxpl) {
  H fs(H5Dget_space(ds));
  H ms;
  static const double dummy = 0;
  if (buf && numel(count) > 0) {
    std::vector<hsize_t> st(start.begin(), start.end()), ct(count.begin(), count.end());
    if (H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, st.data(), nullptr, ct.data(), nullptr) < 0) return -1;
    ms = H(H5Screate_simple(int(ct.size()), ct.data(), nullptr));
  } else {
    H5Sselect_none(fs.get());
    const hsize_t one = 1;
    ms = H(H5Screate_simple(1, &one, nullptr));
    H5Sselect_none(ms.get());
    buf = &dummy;
  }
  return H5Dwrite(ds, mem_type, ms.get(), fs.get(), dxpl, buf);
}

/// Creates a 1-D int64/uint64 /state dataset of n elements (n may be 0:
/// extendible), chunked + Fletcher32.
hid_t create_state(hid_t file, const char* name, hid_t type, hsize_t n) {
  const hsize_t maxd = H5S_UNLIMITED;
  H space(H5Screate_simple(1, &n, &maxd));
  H dcpl(H5Pcreate(H5P_DATASET_CREATE));
  const hsize_t ch = std::max<hsize_t>(1, std::min<hsize_t>(n, 1 << 16));
  H5Pset_chunk(dcpl.get(), 1, &ch);
  H5Pset_fletcher32(dcpl.get());
  return H5Dcreate2(file, name, type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT);
}

const void* state_buffer(const TrainState& state, int k, const std::int64_t scalars[4], hsize_t* n) {
  if (k == kPackerState) {
    *n = hsize_t(state.packer_state.size());
    return state.packer_state.data();
  }
  *n = 1;
  return k == kSeedState ? static_cast<const void*>(&state.seed) : static_cast<const void*>(&scalars[k]);
}

// ---- reading ------------------------------------------------------------------------

/// Opens a float dataset and returns its dims. \throws CheckpointError.
H open_dataset(hid_t file, const std::string& name, const std::string& path, std::vector<std::int64_t>* dims) {
  if (!h5::exists(file, name)) fail(path, "missing dataset " + name);
  H ds(need(H5Dopen2(file, name.c_str(), H5P_DEFAULT), path, "cannot open dataset " + name));
  H sp(need(H5Dget_space(ds.get()), path, name + ": cannot get dataspace"));
  const int r = H5Sget_simple_extent_ndims(sp.get());
  if (r < 0 || r > 8) fail(path, name + ": bad dataspace" + h5::reason());
  std::vector<hsize_t> d(std::size_t(r), 0);
  H5Sget_simple_extent_dims(sp.get(), d.data(), nullptr);
  dims->assign(d.begin(), d.end());
  return ds;
}

H open_expected(hid_t file, const std::string& name, const std::string& path, const std::vector<std::int64_t>& expected,
                const std::string& whose) {
  std::vector<std::int64_t> dims;
  H ds = open_dataset(file, name, path, &dims);
  if (dims != expected)
    fail(path, name + " has shape " + shape_string(dims) + " but " + whose + " implies " + shape_string(expected));
  return ds;
}

// ---- content digest ------------------------------------------------------------------

std::uint64_t digest_key(int k, const std::string& name) {
  return core::splitmix64(core::fnv1a(std::string(kKinds[k]) + name));
}

std::uint64_t digest_span(std::uint64_t key, std::uint64_t idx0, const float* x, std::size_t n) {
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    sum += core::splitmix64(core::splitmix64(key + idx0 + i) ^ bits);
  }
  return sum;
}

std::uint64_t digest_part(std::uint64_t key, const std::vector<std::int64_t>& g, const std::vector<std::int64_t>& start,
                          const std::vector<std::int64_t>& count, const float* x) {
  if (numel(count) == 0) return 0;
  if (g.size() == 1) return digest_span(key, std::uint64_t(start[0]), x, std::size_t(count[0]));
  std::uint64_t sum = 0;
  for (std::int64_t r = 0; r < count[0]; ++r)
    sum += digest_span(key, std::uint64_t((start[0] + r) * g[1] + start[1]), x + r * count[1], std::size_t(count[1]));
  return sum;
}

std::uint64_t digest_state(const TrainState& s) {
  std::vector<std::uint64_t> v = {std::uint64_t(s.step), std::uint64_t(s.tokens_seen), std::uint64_t(s.stream_epoch),
                                  std::uint64_t(s.stream_position), s.seed};
  for (auto p : s.packer_state) v.push_back(std::uint64_t(p));
  for (auto p : s.data_sources) v.push_back(std::uint64_t(p));  // none without a blend: older digests hold
  std::uint64_t loss_bits;
  std::memcpy(&loss_bits, &s.last_loss, sizeof loss_bits);
  v.push_back(loss_bits);
  if (s.has_guard_state) {
    v.push_back(std::uint64_t(s.skipped_steps));
    for (double x : s.spike_window) {
      std::uint64_t b;
      std::memcpy(&b, &x, sizeof b);
      v.push_back(b);
    }
  }
  return core::splitmix64(core::fnv1a_u64_le(v.data(), v.size()));
}

void require_class(hid_t ds, H5T_class_t cls, const std::string& name, const std::string& path) {
  H t(H5Dget_type(ds));
  if (H5Tget_class(t.get()) != cls)
    fail(path, name + " has the wrong datatype (expected " + (cls == H5T_FLOAT ? "float32" : "integer") + ")");
}

/// Reads the hyperslab [start, start+count) of ds into buf (independent).
void read_part(hid_t ds, hid_t mem_type, const std::vector<std::int64_t>& start,
               const std::vector<std::int64_t>& count, void* buf, hid_t dxpl, const std::string& name,
               const std::string& path) {
  if (numel(count) == 0) return;
  H fs(H5Dget_space(ds));
  std::vector<hsize_t> st(start.begin(), start.end()), ct(count.begin(), count.end());
  need_ok(H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, st.data(), nullptr, ct.data(), nullptr), path,
          name + ": cannot select hyperslab start " + shape_string(start) + " count " + shape_string(count));
  H ms(H5Screate_simple(int(ct.size()), ct.data(), nullptr));
  need_ok(H5Dread(ds, mem_type, ms.get(), fs.get(), dxpl, buf), path, name + ": cannot read data");
}

/// Reads a whole float dataset block by block (rows along dim 0), calling f
/// on every block; checksums are verified by HDF5 on the way.
void scan_f32(hid_t file, const std::string& name, const std::string& path, const std::vector<std::int64_t>& expected,
              const std::function<void(const float*, std::size_t)>& f) {
  H ds = open_expected(file, name, path, expected);  // the loop below is bounded by the model record
  require_class(ds.get(), H5T_FLOAT, name, path);
  const std::vector<std::int64_t>& dims = expected;
  if (dims.empty()) fail(path, name + " is a scalar; tensors are 1-D or 2-D");
  const std::int64_t row = numel(dims) / std::max<std::int64_t>(dims[0], 1);
  std::int64_t rows_per = std::max<std::int64_t>(1, kScanBlockElems / std::max<std::int64_t>(row, 1));
  std::vector<float> buf;
  for (std::int64_t r0 = 0; r0 < dims[0]; r0 += rows_per) {
    std::vector<std::int64_t> start(dims.size(), 0), count = dims;
    start[0] = r0;
    count[0] = std::min(rows_per, dims[0] - r0);
    buf.resize(std::size_t(numel(count)));
    read_part(ds.get(), H5T_NATIVE_FLOAT, start, count, buf.data(), H5P_DEFAULT, name, path);
    f(buf.data(), buf.size());
  }
}

std::vector<std::int64_t> read_state_vec(hid_t file, const char* name, hid_t mem_type, const std::string& path,
                                         hid_t dxpl) {
  std::vector<std::int64_t> dims;
  H ds = open_dataset(file, name, path, &dims);
  require_class(ds.get(), H5T_INTEGER, name, path);
  if (dims.size() != 1) fail(path, std::string(name) + " must be 1-D");
  // Bound the element count by the bytes stored (every element is written)
  // before allocating: a damaged dimension must not allocate or loop for ever.
  const hsize_t stored = H5Dget_storage_size(ds.get());
  if (dims[0] < 0 || hsize_t(dims[0]) > stored / sizeof(std::int64_t))
    fail(path, std::string(name) + " has shape " + shape_string(dims) + " but only " + std::to_string(stored) +
                   " bytes are stored (" + std::to_string(stored / sizeof(std::int64_t)) + " elements at most)");
  std::vector<std::int64_t> v(std::size_t(dims[0]), 0);
  read_part(ds.get(), mem_type, {0}, dims, v.data(), dxpl, name, path);
  return v;
}

namespace {
std::int64_t one(const std::vector<std::int64_t>& v, const char* name, const std::string& path) {
  if (v.size() != 1) fail(path, std::string(name) + " must hold exactly 1 element, has " + std::to_string(v.size()));
  return v[0];
}
}  // namespace

TrainState read_state(hid_t file, const std::string& path, hid_t dxpl) {
  TrainState s;
  s.step = one(read_state_vec(file, kStateNames[0], H5T_NATIVE_INT64, path, dxpl), kStateNames[0], path);
  s.tokens_seen = one(read_state_vec(file, kStateNames[1], H5T_NATIVE_INT64, path, dxpl), kStateNames[1], path);
  s.stream_epoch = one(read_state_vec(file, kStateNames[2], H5T_NATIVE_INT64, path, dxpl), kStateNames[2], path);
  s.stream_position =
      one(read_state_vec(file, kStateNames[3], H5T_NATIVE_INT64, path, dxpl), kStateNames[3], path);
  s.seed = std::uint64_t(one(read_state_vec(file, kStateNames[4], H5T_NATIVE_UINT64, path, dxpl), kStateNames[4], path));
  s.packer_state = read_state_vec(file, kStateNames[5], H5T_NATIVE_INT64, path, dxpl);
  if (h5::exists(file, kDataSourcesState))
    s.data_sources = read_state_vec(file, kDataSourcesState, H5T_NATIVE_INT64, path, dxpl);
  if (h5::exists(file, kLastLossState)) {
    H ds = open_expected(file, kLastLossState, path, {1}, "the format");
    require_class(ds.get(), H5T_FLOAT, kLastLossState, path);
    read_part(ds.get(), H5T_NATIVE_DOUBLE, {0}, {1}, &s.last_loss, dxpl, kLastLossState, path);
  }
  s.has_guard_state = h5::exists(file, kSkippedState) && h5::exists(file, kSpikeWindowState);
  if (s.has_guard_state) {
    s.skipped_steps = one(read_state_vec(file, kSkippedState, H5T_NATIVE_INT64, path, dxpl), kSkippedState, path);
    std::vector<std::int64_t> dims;
    H ds = open_dataset(file, kSpikeWindowState, path, &dims);
    require_class(ds.get(), H5T_FLOAT, kSpikeWindowState, path);
    const hsize_t stored = H5Dget_storage_size(ds.get());
    if (dims.size() != 1 || dims[0] % 2 != 0 || hsize_t(dims[0]) > stored / sizeof(double) + (dims[0] == 0))
      fail(path, std::string(kSpikeWindowState) + " has shape " + shape_string(dims) +
                     " but holds (loss, grad norm) pairs: an even 1-D length within the " + std::to_string(stored) +
                     " bytes stored");
    s.spike_window.assign(std::size_t(dims[0]), 0.0);
    read_part(ds.get(), H5T_NATIVE_DOUBLE, {0}, dims, s.spike_window.data(), dxpl, kSpikeWindowState, path);
  }
  return s;
}

/// Opens a file serially (read-only, sec2 driver) after checking it exists and is HDF5.
H open_serial(const std::string& path) {
  if (!is_file(path)) fail(path, "no such file");
  const htri_t is = H5Fis_hdf5(path.c_str());
  if (is <= 0) fail(path, "not an HDF5 file (or truncated)" + h5::reason());
  return H(need(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path,
                "cannot open (truncated or damaged HDF5 file?)"));
}

CheckpointInfo read_info(hid_t f, const std::string& path) {
  const std::string fmt = attr_string(f, "format", path);
  if (fmt != kCheckpointFormat)
    fail(path, "attribute format='" + fmt + "' but a wlb4d checkpoint has '" + kCheckpointFormat + "'");
  const std::int64_t ver = attr_i64(f, "format_version", path);
  if (ver != kCheckpointFormatVersion)
    fail(path, "format_version " + std::to_string(ver) + " is not supported (this build reads version " +
                   std::to_string(kCheckpointFormatVersion) + ")");
  CheckpointInfo info;
  info.deck = attr_string(f, "deck", path);
  info.dataset_identity = attr_string(f, "dataset_identity", path);
  info.precision = h5::has_attr(f, "train_precision") ? attr_string(f, "train_precision", path) : std::string();
  if (h5::has_attr(f, "cost_source")) {
    info.cost_source = attr_string(f, "cost_source", path);
    info.cost_a = attr_f64(f, "cost_a", path);
    info.cost_b = attr_f64(f, "cost_b", path);
    info.cost_c = attr_f64(f, "cost_c", path);
  }
  if (h5::has_attr(f, "tokenizer")) {
    info.tokenizer = attr_string(f, "tokenizer", path);
    info.tokenizer_vocab = attr_i64(f, "tokenizer_vocab", path);
    info.eos_id = attr_i64(f, "eos_id", path);
    info.bos_id = attr_i64(f, "bos_id", path);
  }
  info.weights_only = h5::has_attr(f, "weights_only") && attr_i64(f, "weights_only", path) != 0;
  info.program_version = attr_string(f, "program_version", path);
  info.git_sha = attr_string(f, "git_sha", path);
  info.step = attr_i64(f, "step", path);
  info.tokens_seen = attr_i64(f, "tokens_seen", path);
  const auto lay = attr_i64s(f, "writer_layout", path);
  if (lay.size() != 4) fail(path, "attribute writer_layout must hold 4 integers (dp, pp, cp, tp)");
  for (int i = 0; i < 4; ++i) info.layout[i] = int(lay[std::size_t(i)]);
  info.vocab = attr_i64(f, "vocab_size", path);
  // The model record bounds every later loop and shape: check it first.
  const char* const keys[5] = {"model_layers", "model_d_model", "model_heads", "model_kv_heads", "model_ffn_hidden"};
  std::int64_t m[5];
  for (int i = 0; i < 5; ++i) {
    m[i] = attr_i64(f, keys[i], path);
    if (m[i] < 1 || m[i] > (std::int64_t(1) << 31) - 1)
      fail(path, std::string("attribute ") + keys[i] + " = " + std::to_string(m[i]) +
                     " is not a model size (1 .. 2^31-1): damaged model record");
  }
  if (info.vocab < 1 || info.vocab > (std::int64_t(1) << 40))
    fail(path, "attribute vocab_size = " + std::to_string(info.vocab) + " is not a vocabulary size (1 .. 2^40)");
  if (!info.tokenizer.empty()) {
    if (info.tokenizer != "bytes" && info.tokenizer != "sentencepiece" && info.tokenizer != "hf-bpe")
      fail(path, "attribute tokenizer = '" + info.tokenizer + "' is not bytes, sentencepiece or hf-bpe");
    if (info.tokenizer_vocab < 1 || info.tokenizer_vocab > info.vocab)
      fail(path, "attribute tokenizer_vocab = " + std::to_string(info.tokenizer_vocab) +
                     " is not in 1 .. vocab_size = " + std::to_string(info.vocab));
    for (const auto& [key, id] : {std::pair<const char*, std::int64_t>{"eos_id", info.eos_id}, {"bos_id", info.bos_id}})
      if (id < -1 || id >= info.tokenizer_vocab)
        fail(path, std::string("attribute ") + key + " = " + std::to_string(id) + " is not -1 or a token id below " +
                       "tokenizer_vocab = " + std::to_string(info.tokenizer_vocab));
  }
  if (m[1] % m[2] != 0)
    fail(path, "model record: model_d_model = " + std::to_string(m[1]) + " is not a multiple of model_heads = " +
                   std::to_string(m[2]));
  info.model.layers = int(m[0]);
  info.model.d_model = int(m[1]);
  info.model.heads = int(m[2]);
  info.model.kv_heads = int(m[3]);
  info.model.ffn_hidden = int(m[4]);
  // Files written before tied embeddings existed have an LM head of their own.
  info.model.tie_embeddings = h5::has_attr(f, "model_tie_embeddings") && attr_i64(f, "model_tie_embeddings", path) != 0;
  info.has_rope_norm = h5::has_attr(f, "model_rope_theta") && h5::has_attr(f, "model_norm_eps");
  if (info.has_rope_norm) {
    info.model.rope_theta = attr_f64(f, "model_rope_theta", path);
    info.model.norm_eps = attr_f64(f, "model_norm_eps", path);
  }
  // Files written before RoPE scaling joined the identity had none.
  info.model.rope_scaling = h5::has_attr(f, "model_rope_scaling") ? attr_string(f, "model_rope_scaling", path) : "none";
  if (info.model.rope_scaling == "llama3") {
    info.model.rope_factor = attr_f64(f, "model_rope_factor", path);
    info.model.rope_low_freq_factor = attr_f64(f, "model_rope_low_freq_factor", path);
    info.model.rope_high_freq_factor = attr_f64(f, "model_rope_high_freq_factor", path);
    info.model.rope_original_max_position = int(attr_i64(f, "model_rope_original_max_position", path));
  } else if (info.model.rope_scaling != "none") {
    fail(path, "attribute model_rope_scaling = '" + info.model.rope_scaling + "' is not none or llama3");
  }
  // Value, m and v of every element are stored (no fill, no compression):
  // a record implying more float32 than the file holds is damaged. long
  // double: no overflow for sizes up to 2^31.
  const long double d = m[1], kv = (long double)(m[3]) * (m[1] / m[2]), F = m[4];
  const long double per_layer = 2 * d + 2 * d * d + 2 * kv * d + 3 * F * d;
  const long double tables = info.model.tie_embeddings ? 1.0L : 2.0L;  // embedding (+ LM head)
  const long double elems = m[0] * per_layer + tables * (long double)(info.vocab) * d + d;
  const hsize_t fsize = [&] {
    hsize_t s = 0;
    return H5Fget_filesize(f, &s) >= 0 ? s : hsize_t(0);
  }();
  const int kinds = info.weights_only ? 1 : 3;  // value (+ AdamW m and v)
  if (elems * 4 * kinds > (long double)(fsize))
    fail(path, "model record (" + model_string(info.model, info.vocab) + ") needs " +
                   std::to_string((unsigned long long)(elems * 4 * kinds)) + " bytes of tensors but the file has " +
                   std::to_string(fsize) + ": damaged model record or truncated file");
  info.tensors = split_lines(attr_string(f, "tensors", path));
  const auto expected = core::param_shapes(info.model, info.vocab);
  bool same = expected.size() == info.tensors.size();
  for (std::size_t i = 0; same && i < expected.size(); ++i) same = expected[i].name == info.tensors[i];
  if (!same)
    fail(path, "attribute tensors lists " + std::to_string(info.tensors.size()) +
                   " names that are not the model record's " + std::to_string(expected.size()) + " tensors (" +
                   model_string(info.model, info.vocab) + ")");
  for (const auto& e : expected) info.shapes.push_back(e.global_shape);
  return info;
}

/// Verifies datasets i with i % size == rank of the file (tensors × 3 kinds,
/// then /state): shapes from the model record first, every chunk read, the
/// digest terms summed on the way.
VerifyPart verify_part(const std::string& path, int rank, int size) {
  h5::Quiet quiet;
  VerifyPart out;
  try {
    H f = open_serial(path);
    const CheckpointInfo info = read_info(f.get(), path);
    const std::size_t kinds = info.weights_only ? 1 : 3;  // value (+ AdamW m and v)
    const std::size_t nt = info.tensors.size() * kinds;
    for (std::size_t i = std::size_t(rank); i < nt + kNumState; i += std::size_t(size)) {
      if (i < nt) {
        const int k = int(i % kinds);
        const std::string& name = info.tensors[i / kinds];
        const std::uint64_t key = digest_key(k, name);
        std::uint64_t idx = 0;
        scan_f32(f.get(), kKinds[k] + name, path, info.shapes[i / kinds], [&](const float* x, std::size_t n) {
          out.sum += digest_span(key, idx, x, n);
          idx += n;
        });
      } else {
        const char* n = kStateNames[i - nt];
        read_state_vec(f.get(), n, i - nt == kSeedState ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64, path);
      }
    }
    if (rank == 0) {  // the /state term and the stored digest
      out.sum += digest_state(read_state(f.get(), path, H5P_DEFAULT));
      out.has_digest = h5::exists(f.get(), kDigestState);
      if (out.has_digest) {
        H ds = open_expected(f.get(), kDigestState, path, {1}, "the format");
        require_class(ds.get(), H5T_INTEGER, kDigestState, path);
        read_part(ds.get(), H5T_NATIVE_UINT64, {0}, {1}, &out.stored, H5P_DEFAULT, kDigestState, path);
      }
    }
    if (!f.reset()) fail(path, "cannot close" + h5::reason());
  } catch (const CheckpointError& e) {
    out.err = e.what();
  }
  return out;
}

}  // namespace wlb::io::ckpt
