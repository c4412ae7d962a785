// Checkpoint file layout (checkpoint.hpp): root attributes, chunked
// Fletcher32 datasets per tensor kind, the /state table; reading, checking
// and verifying it. HDF5 plumbing: data/h5util.hpp.
#include "checkpoint_detail.hpp"

#include "wlb4d/core/version.hpp"

#include <algorithm>
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
         " kv_heads=" + std::to_string(m.kv_heads) + " ffn_hidden=" + std::to_string(m.ffn_hidden);
}

// ---- writing ----------------------------------------------------------------------------

void write_root_attrs(hid_t f, const std::string& path, const grid::ProcessGrid& grid,
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
  const std::int32_t lay[4] = {grid.dp_size(), grid.pp_size(), grid.cp_size(), grid.tp_size()};
  h5::write_attr<CheckpointError>(f, "writer_layout", H5T_NATIVE_INT32, lay, 4, false, w, kW);
  str("program_version", core::kVersion);
  str("git_sha", core::kGitSha);
  str("dataset_identity", info.dataset_identity);
  i64("vocab_size", info.vocab);
  i64("model_layers", info.model.layers);
  i64("model_d_model", info.model.d_model);
  i64("model_heads", info.model.heads);
  i64("model_kv_heads", info.model.kv_heads);
  i64("model_ffn_hidden", info.model.ffn_hidden);
  str("tensors", tensor_list_text(tensors));
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
void scan_f32(hid_t file, const std::string& name, const std::string& path,
              const std::function<void(const float*, std::size_t)>& f, std::vector<std::int64_t>* shape) {
  std::vector<std::int64_t> dims;
  H ds = open_dataset(file, name, path, &dims);
  require_class(ds.get(), H5T_FLOAT, name, path);
  if (dims.empty()) fail(path, name + " is a scalar; tensors are 1-D or 2-D");
  if (shape) *shape = dims;
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
  info.program_version = attr_string(f, "program_version", path);
  info.git_sha = attr_string(f, "git_sha", path);
  info.step = attr_i64(f, "step", path);
  info.tokens_seen = attr_i64(f, "tokens_seen", path);
  const auto lay = attr_i64s(f, "writer_layout", path);
  if (lay.size() != 4) fail(path, "attribute writer_layout must hold 4 integers (dp, pp, cp, tp)");
  for (int i = 0; i < 4; ++i) info.layout[i] = int(lay[std::size_t(i)]);
  info.vocab = attr_i64(f, "vocab_size", path);
  info.model.layers = int(attr_i64(f, "model_layers", path));
  info.model.d_model = int(attr_i64(f, "model_d_model", path));
  info.model.heads = int(attr_i64(f, "model_heads", path));
  info.model.kv_heads = int(attr_i64(f, "model_kv_heads", path));
  info.model.ffn_hidden = int(attr_i64(f, "model_ffn_hidden", path));
  info.tensors = split_lines(attr_string(f, "tensors", path));
  return info;
}

/// Verifies datasets i with i % size == rank of the file (tensors × 3 kinds,
/// then /state). Returns "" or the first error message.
std::string verify_part(const std::string& path, int rank, int size, const std::vector<std::string>& names) {
  h5::Quiet quiet;
  try {
    H f = open_serial(path);
    const std::size_t nt = names.size() * 3;
    for (std::size_t i = std::size_t(rank); i < nt + kNumState; i += std::size_t(size)) {
      if (i < nt) {
        const std::string ds = kKinds[i % 3] + names[i / 3];
        scan_f32(f.get(), ds, path, [](const float*, std::size_t) {}, nullptr);
      } else {
        const char* n = kStateNames[i - nt];
        read_state_vec(f.get(), n, i - nt == kSeedState ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64, path);
      }
    }
    if (!f.reset()) fail(path, "cannot close" + h5::reason());
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

}  // namespace wlb::io::ckpt
