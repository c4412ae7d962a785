// Layout-independent HDF5 checkpoints (checkpoint.hpp; hpc-conventions §5).
#include "wlb4d/io/checkpoint.hpp"

#include "wlb4d/core/hash.hpp"
#include "wlb4d/core/error.hpp"
#include "wlb4d/core/version.hpp"
#include "wlb4d/data/h5util.hpp"

#include <hdf5.h>
#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <functional>
#include <sstream>
#include <utility>

namespace wlb::io {

using core::CheckpointError;

namespace {

constexpr std::int64_t kMaxChunkBytes = 64LL << 20;  // 64 MiB
constexpr std::int64_t kScanBlockElems = 16LL << 20; // verification reads ≤ 64 MiB at a time

// ---- HDF5 plumbing ------------------------------------------------------------------

using H = data::h5::Handle;

/// HDF5's innermost error descriptions as " (HDF5: ...)", or "" (clears the stack).
std::string h5_reason() {
  const std::string why = data::h5::last_error();
  return why.empty() ? "" : " (HDF5: " + why + ")";
}

/// Silences HDF5's automatic error printing for the lifetime of the object
/// (our messages carry the reason instead).
class QuietHdf5 {
 public:
  QuietHdf5() {
    H5Eget_auto2(H5E_DEFAULT, &fn_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, fn_, data_); }
  QuietHdf5(const QuietHdf5&) = delete;
  QuietHdf5& operator=(const QuietHdf5&) = delete;

 private:
  H5E_auto2_t fn_ = nullptr;
  void* data_ = nullptr;
};

std::string prefix(const std::string& path) { return "checkpoint " + path + ": "; }

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw CheckpointError(prefix(path) + what);
}

hid_t need(hid_t id, const std::string& path, const std::string& what) {
  if (id < 0) fail(path, what + h5_reason());
  return id;
}
void need_ok(herr_t st, const std::string& path, const std::string& what) {
  if (st < 0) fail(path, what + h5_reason());
}

bool link_exists(hid_t loc, const std::string& name) {
  // Checks every component ("/optim/m/x": /optim, /optim/m, /optim/m/x).
  std::size_t pos = 0;
  while (true) {
    pos = name.find('/', pos + 1);
    const std::string part = name.substr(0, pos);
    if (!part.empty() && part != "/" && H5Lexists(loc, part.c_str(), H5P_DEFAULT) <= 0) return false;
    if (pos == std::string::npos) return true;
  }
}

/// Variable-length UTF-8 string attribute (h5py reads it as str; no size limit).
void write_attr_string(hid_t loc, const char* name, const std::string& value) {
  H type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  H space(H5Screate(H5S_SCALAR));
  H attr(H5Acreate2(loc, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
  const char* p = value.c_str();
  if (!attr.valid() || H5Awrite(attr.get(), type.get(), &p) < 0)
    throw CheckpointError(std::string("cannot write attribute ") + name + h5_reason());
}

template <class T>
void write_attr_array(hid_t loc, const char* name, hid_t mem_type, const T* values, hsize_t n, bool scalar) {
  H space(scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr));
  H attr(H5Acreate2(loc, name, mem_type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.valid() || H5Awrite(attr.get(), mem_type, values) < 0)
    throw CheckpointError(std::string("cannot write attribute ") + name + h5_reason());
}
void write_attr_i64(hid_t loc, const char* name, std::int64_t v) {
  write_attr_array(loc, name, H5T_NATIVE_INT64, &v, 1, true);
}

std::string read_attr_string(hid_t loc, const char* name, const std::string& path) {
  if (H5Aexists(loc, name) <= 0) fail(path, std::string("missing root attribute '") + name + "'");
  H attr(need(H5Aopen(loc, name, H5P_DEFAULT), path, std::string("cannot open attribute '") + name + "'"));
  H ftype(need(H5Aget_type(attr.get()), path, "attribute type"));
  if (H5Tget_class(ftype.get()) != H5T_STRING) fail(path, std::string("attribute '") + name + "' is not a string");
  if (H5Tis_variable_str(ftype.get()) > 0) {
    H mt(H5Tcopy(H5T_C_S1));
    H5Tset_size(mt.get(), H5T_VARIABLE);
    H5Tset_cset(mt.get(), H5Tget_cset(ftype.get()));
    char* s = nullptr;
    need_ok(H5Aread(attr.get(), mt.get(), &s), path, std::string("cannot read attribute '") + name + "'");
    std::string out = s ? s : "";
    H space(H5Aget_space(attr.get()));
    H5Dvlen_reclaim(mt.get(), space.get(), H5P_DEFAULT, &s);
    return out;
  }
  const std::size_t n = H5Tget_size(ftype.get());
  std::string buf(n + 1, '\0');
  H mt(H5Tcopy(ftype.get()));  // same character set as stored
  H5Tset_size(mt.get(), n + 1);
  H5Tset_strpad(mt.get(), H5T_STR_NULLTERM);
  need_ok(H5Aread(attr.get(), mt.get(), buf.data()), path, std::string("cannot read attribute '") + name + "'");
  return std::string(buf.c_str());
}

std::vector<std::int64_t> read_attr_i64s(hid_t loc, const char* name, const std::string& path) {
  if (H5Aexists(loc, name) <= 0) fail(path, std::string("missing root attribute '") + name + "'");
  H attr(need(H5Aopen(loc, name, H5P_DEFAULT), path, std::string("cannot open attribute '") + name + "'"));
  H space(H5Aget_space(attr.get()));
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  H ftype(H5Aget_type(attr.get()));
  if (n < 1 || H5Tget_class(ftype.get()) != H5T_INTEGER)
    fail(path, std::string("attribute '") + name + "' is not an integer attribute");
  std::vector<std::int64_t> v(std::size_t(n), 0);
  need_ok(H5Aread(attr.get(), H5T_NATIVE_INT64, v.data()), path,
          std::string("cannot read attribute '") + name + "'");
  return v;
}
std::int64_t read_attr_i64(hid_t loc, const char* name, const std::string& path) {
  return read_attr_i64s(loc, name, path).at(0);
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(line);
  return out;
}

// ---- file system ------------------------------------------------------------------------

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void mkdirs(const std::string& dir) {
  std::string cur;
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    cur = dir.substr(0, pos);
    if (cur.empty() || is_dir(cur)) continue;
    if (::mkdir(cur.c_str(), 0777) != 0 && errno != EEXIST)
      throw CheckpointError("checkpoint.dir='" + dir + "': cannot create directory " + cur + ": " +
                            std::strerror(errno));
  }
}

void fsync_path(const std::string& p, bool directory) {
  const int fd = ::open(p.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw CheckpointError("cannot open " + p + " to fsync: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0 && e != EINVAL) throw CheckpointError("fsync of " + p + " failed: " + std::strerror(e));
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::vector<std::string> read_latest_names(const std::string& dir) {
  std::ifstream in(join_path(dir, "latest"));
  std::vector<std::string> names;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) names.push_back(line);
  }
  return names;
}

/// step of "step_NNNNNN.h5" (suffix ".h5" or ".h5.tmp" per `tmp`), -1 otherwise.
std::int64_t parse_step_name(const std::string& name, bool tmp) {
  const std::string pre = "step_", suf = tmp ? ".h5.tmp" : ".h5";
  if (name.size() <= pre.size() + suf.size() || name.compare(0, pre.size(), pre) != 0 ||
      name.compare(name.size() - suf.size(), suf.size(), suf) != 0)
    return -1;
  const std::string digits = name.substr(pre.size(), name.size() - pre.size() - suf.size());
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoll(digits);
}

std::string base_name(const std::string& p) {
  const auto s = p.find_last_of('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

/// Rank 0's commit: rename tmp -> final, fsync, rewrite `latest`, retention.
void commit(const std::string& dir, const std::string& tmp, const std::string& final_path, std::int64_t step,
            int keep) {
  if (std::rename(tmp.c_str(), final_path.c_str()) != 0)
    throw CheckpointError("cannot rename " + tmp + " to " + final_path + ": " + std::strerror(errno));
  fsync_path(dir, true);
  const std::string me = base_name(final_path);
  std::vector<std::string> names{me};
  for (const auto& n : read_latest_names(dir))
    if (n != me && std::find(names.begin(), names.end(), n) == names.end() && is_file(join_path(dir, n)))
      names.push_back(n);
  const std::size_t k = std::size_t(std::max(keep, 1));
  std::vector<std::string> drop;
  if (names.size() > k) {
    drop.assign(names.begin() + std::ptrdiff_t(k), names.end());
    names.resize(k);
  }
  const std::string latest = join_path(dir, "latest"), latest_tmp = latest + ".tmp";
  {
    std::ofstream out(latest_tmp, std::ios::trunc);
    for (const auto& n : names) out << n << '\n';
    out.flush();
    if (!out) throw CheckpointError("cannot write " + latest_tmp);
  }
  fsync_path(latest_tmp, false);
  if (std::rename(latest_tmp.c_str(), latest.c_str()) != 0)
    throw CheckpointError("cannot rename " + latest_tmp + " to " + latest + ": " + std::strerror(errno));
  fsync_path(dir, true);
  // Retention: listed checkpoints beyond `keep`, older step files found in DIR
  // that are not retained, and stale .tmp leftovers of crashed writes.
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      const std::int64_t s = parse_step_name(n, false);
      if (s >= 0 && s < step && std::find(names.begin(), names.end(), n) == names.end()) drop.push_back(n);
      if (parse_step_name(n, true) >= 0) drop.push_back(n);
    }
    ::closedir(d);
  }
  for (const auto& n : drop) {
    if (std::find(names.begin(), names.end(), n) != names.end()) continue;
    const std::string p = join_path(dir, n);
    if (std::remove(p.c_str()) != 0 && errno != ENOENT)
      spdlog::warn("checkpoint retention: cannot remove {}: {}", p, std::strerror(errno));
  }
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

const char* const kKinds[3] = {"/model/", "/optim/m/", "/optim/v/"};

std::string tensor_list_text(const std::vector<TensorRef>& t) {
  std::string s;
  for (const auto& x : t) s += x.name + "\n";
  return s;
}

using core::fnv1a;

std::string model_string(const core::ModelConfig& m, std::int64_t vocab) {
  return "vocab=" + std::to_string(vocab) + " layers=" + std::to_string(m.layers) +
         " d_model=" + std::to_string(m.d_model) + " heads=" + std::to_string(m.heads) +
         " kv_heads=" + std::to_string(m.kv_heads) + " ffn_hidden=" + std::to_string(m.ffn_hidden);
}

// ---- dataset creation / writing --------------------------------------------------------

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

// ---- reading ------------------------------------------------------------------------

/// Opens a float dataset and returns its dims. \throws CheckpointError.
H open_dataset(hid_t file, const std::string& name, const std::string& path, std::vector<std::int64_t>* dims) {
  if (!link_exists(file, name)) fail(path, "missing dataset " + name);
  H ds(need(H5Dopen2(file, name.c_str(), H5P_DEFAULT), path, "cannot open dataset " + name));
  H sp(need(H5Dget_space(ds.get()), path, name + ": cannot get dataspace"));
  const int r = H5Sget_simple_extent_ndims(sp.get());
  if (r < 0 || r > 8) fail(path, name + ": bad dataspace" + h5_reason());
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
                                         hid_t dxpl = H5P_DEFAULT) {
  std::vector<std::int64_t> dims;
  H ds = open_dataset(file, name, path, &dims);
  require_class(ds.get(), H5T_INTEGER, name, path);
  if (dims.size() != 1) fail(path, std::string(name) + " must be 1-D");
  std::vector<std::int64_t> v(std::size_t(dims[0]), 0);
  read_part(ds.get(), mem_type, {0}, dims, v.data(), dxpl, name, path);
  return v;
}

const char* const kStateNames[] = {"/state/step", "/state/tokens_seen", "/state/stream_epoch",
                                   "/state/stream_position", "/state/seed", "/state/packer"};
constexpr int kNumState = 6;

std::int64_t one(const std::vector<std::int64_t>& v, const char* name, const std::string& path) {
  if (v.size() != 1) fail(path, std::string(name) + " must hold exactly 1 element, has " + std::to_string(v.size()));
  return v[0];
}

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
  if (is <= 0) fail(path, "not an HDF5 file (or truncated)" + h5_reason());
  return H(need(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path,
                "cannot open (truncated or damaged HDF5 file?)"));
}

CheckpointInfo read_info(hid_t f, const std::string& path) {
  const std::string fmt = read_attr_string(f, "format", path);
  if (fmt != kCheckpointFormat)
    fail(path, "attribute format='" + fmt + "' but a wlb4d checkpoint has '" + kCheckpointFormat + "'");
  const std::int64_t ver = read_attr_i64(f, "format_version", path);
  if (ver != kCheckpointFormatVersion)
    fail(path, "format_version " + std::to_string(ver) + " is not supported (this build reads version " +
                   std::to_string(kCheckpointFormatVersion) + ")");
  CheckpointInfo info;
  info.deck = read_attr_string(f, "deck", path);
  info.dataset_identity = read_attr_string(f, "dataset_identity", path);
  info.program_version = read_attr_string(f, "program_version", path);
  info.git_sha = read_attr_string(f, "git_sha", path);
  info.step = read_attr_i64(f, "step", path);
  info.tokens_seen = read_attr_i64(f, "tokens_seen", path);
  const auto lay = read_attr_i64s(f, "writer_layout", path);
  if (lay.size() != 4) fail(path, "attribute writer_layout must hold 4 integers (dp, pp, cp, tp)");
  for (int i = 0; i < 4; ++i) info.layout[i] = int(lay[std::size_t(i)]);
  info.vocab = read_attr_i64(f, "vocab_size", path);
  info.model.layers = int(read_attr_i64(f, "model_layers", path));
  info.model.d_model = int(read_attr_i64(f, "model_d_model", path));
  info.model.heads = int(read_attr_i64(f, "model_heads", path));
  info.model.kv_heads = int(read_attr_i64(f, "model_kv_heads", path));
  info.model.ffn_hidden = int(read_attr_i64(f, "model_ffn_hidden", path));
  info.tensors = split_lines(read_attr_string(f, "tensors", path));
  return info;
}

/// Verifies datasets i with i % size == rank of the file (tensors × 3 kinds,
/// then /state). Returns "" or the first error message.
std::string verify_part(const std::string& path, int rank, int size, const std::vector<std::string>& names) {
  QuietHdf5 quiet;
  try {
    H f = open_serial(path);
    const std::size_t nt = names.size() * 3;
    for (std::size_t i = std::size_t(rank); i < nt + kNumState; i += std::size_t(size)) {
      if (i < nt) {
        const std::string ds = kKinds[i % 3] + names[i / 3];
        scan_f32(f.get(), ds, path, [](const float*, std::size_t) {}, nullptr);
      } else {
        const char* n = kStateNames[i - nt];
        read_state_vec(f.get(), n, i - nt == 4 ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64, path);
      }
    }
    if (!f.reset()) fail(path, "cannot close" + h5_reason());
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// ---- public API -------------------------------------------------------------------------

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s;
  for (auto e : shape) s += "[" + std::to_string(e) + "]";
  return s.empty() ? "[]" : s;
}

std::string checkpoint_path(const std::string& dir, std::int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "step_%06lld.h5", static_cast<long long>(step));
  return join_path(dir, buf);
}

std::string save_checkpoint(const core::CheckpointConfig& cc, const grid::ProcessGrid& grid,
                            const std::vector<TensorRef>& tensors, const TrainState& state,
                            const CheckpointInfo& info) {
  const auto& w = grid.world();
  const std::string final_path = checkpoint_path(cc.dir, state.step);
  const std::string tmp = final_path + ".tmp";
  QuietHdf5 quiet;

  // 1. Arguments: same tensor list everywhere, writers cover every element once.
  std::string err;
  std::string listing;
  for (const auto& t : tensors) listing += t.name + shape_string(t.global_shape) + std::to_string(t.shard_dim) + ";";
  const std::uint64_t h = fnv1a(listing);
  const std::uint64_t hmin = w.allreduce_value(h, comm::ReduceOp::Min);
  const std::uint64_t hmax = w.allreduce_value(h, comm::ReduceOp::Max);
  if (hmin != hmax)
    throw CheckpointError(prefix(tmp) + "ranks passed different tensor lists (names, shapes or order differ)");
  std::vector<std::int64_t> written(tensors.size(), 0);
  for (std::size_t i = 0; i < tensors.size() && err.empty(); ++i) {
    const auto& t = tensors[i];
    if (t.global_shape.empty() || t.global_shape.size() > 2)
      err = prefix(tmp) + t.name + ": global shape " + shape_string(t.global_shape) + " must be 1-D or 2-D";
    else if (t.held && (t.start.size() != t.global_shape.size() || t.count.size() != t.global_shape.size()))
      err = prefix(tmp) + t.name + ": hyperslab rank differs from the global shape's";
    else if (t.writer && (!t.held || !t.value || !t.m || !t.v))
      err = prefix(tmp) + t.name + ": a writer must hold the shard and pass value, m and v";
    if (!err.empty()) break;
    if (t.held)
      for (std::size_t d = 0; d < t.global_shape.size(); ++d)
        if (t.start[d] < 0 || t.count[d] < 0 || t.start[d] + t.count[d] > t.global_shape[d])
          err = prefix(tmp) + t.name + ": hyperslab start " + shape_string(t.start) + " count " +
                shape_string(t.count) + " leaves the global shape " + shape_string(t.global_shape);
    if (t.writer) written[i] = numel(t.count);
  }
  err = comm::agree(w, err);
  if (!err.empty()) throw CheckpointError(err);
  w.allreduce(written.data(), written.size());
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (written[i] != numel(tensors[i].global_shape))
      throw CheckpointError(prefix(tmp) + "writers cover " + std::to_string(written[i]) + " elements of " +
                            tensors[i].name + " but its global shape " + shape_string(tensors[i].global_shape) +
                            " has " + std::to_string(numel(tensors[i].global_shape)) +
                            " (exactly one rank must write each element)");

  // 2. Directory (rank 0), agreed.
  if (w.rank() == 0) {
    try {
      mkdirs(cc.dir);
    } catch (const CheckpointError& e) {
      err = e.what();
    }
  }
  err = comm::agree(w, err);
  if (!err.empty()) throw CheckpointError(err);

  // 3. Collective file creation and writes over the *writer* ranks only: the
  //    ranks that own some tensor's shard (one replica of each; DP/CP copies
  //    do not) and rank 0 (/state). Every writer makes every call; an error
  //    anywhere is agreed on after each dataset, so all writers stop together,
  //    then with the rest below. Keeping replicas out of MPI-IO matters: HDF5's
  //    internal collectives block (busy-poll), and with 8 ranks on 2 cores an
  //    all-rank checkpoint of the quickstart model took 70 s.
  bool is_writer = w.rank() == 0;
  for (const auto& t : tensors) is_writer = is_writer || t.writer;
  std::optional<comm::Communicator> sub;
  try {
    sub = w.split(is_writer ? 0 : comm::Communicator::kNoColor, w.rank());  // rank 0 of w is rank 0 of sub
  } catch (const core::CommError&) {
    throw CheckpointError(prefix(tmp) + "MPI_Comm_split of the writer ranks failed");
  }
  if (sub) {
    const comm::Communicator& wc = *sub;
    H fapl(H5Pcreate(H5P_FILE_ACCESS));
    H5Pset_fapl_mpio(fapl.get(), wc.mpi(), MPI_INFO_NULL);
    H5Pset_all_coll_metadata_ops(fapl.get(), 1);
    H5Pset_coll_metadata_write(fapl.get(), 1);
    H dxpl(H5Pcreate(H5P_DATASET_XFER));
    H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE);
    H file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
    auto step_ok = [&](bool ok, const std::string& what) {
      if (!ok && err.empty()) err = prefix(tmp) + what + h5_reason();
      return wc.allreduce_value(int(err.empty()), comm::ReduceOp::Min) == 1;
    };
    bool good = step_ok(file.valid(), "cannot create the file (MPI-IO)");
    if (good) {
      try {
        const hid_t f = file.get();
        write_attr_string(f, "format", kCheckpointFormat);
        const int ver = kCheckpointFormatVersion;
        write_attr_array(f, "format_version", H5T_NATIVE_INT, &ver, 1, true);
        write_attr_i64(f, "step", state.step);
        write_attr_i64(f, "tokens_seen", state.tokens_seen);
        write_attr_string(f, "deck", info.deck);
        const std::int32_t lay[4] = {grid.dp_size(), grid.pp_size(), grid.cp_size(), grid.tp_size()};
        write_attr_array(f, "writer_layout", H5T_NATIVE_INT32, lay, 4, false);
        write_attr_string(f, "program_version", core::kVersion);
        write_attr_string(f, "git_sha", core::kGitSha);
        write_attr_string(f, "dataset_identity", info.dataset_identity);
        write_attr_i64(f, "vocab_size", info.vocab);
        write_attr_i64(f, "model_layers", info.model.layers);
        write_attr_i64(f, "model_d_model", info.model.d_model);
        write_attr_i64(f, "model_heads", info.model.heads);
        write_attr_i64(f, "model_kv_heads", info.model.kv_heads);
        write_attr_i64(f, "model_ffn_hidden", info.model.ffn_hidden);
        write_attr_string(f, "tensors", tensor_list_text(tensors));
      } catch (const CheckpointError& e) {
        err = prefix(tmp) + e.what();
      }
      good = step_ok(true, "");
    }
    std::vector<H> groups;
    for (const char* g : {"/model", "/optim", "/optim/m", "/optim/v", "/state"}) {
      if (!good) break;
      groups.emplace_back(H5Gcreate2(file.get(), g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      good = step_ok(groups.back().valid(), std::string("cannot create group ") + g);
    }
    for (std::size_t i = 0; i < tensors.size() && good; ++i) {
      const auto& t = tensors[i];
      const auto chunk = chunk_dims(t.global_shape, t.shard_dim, grid.tp_size());
      const float* bufs[3] = {t.value, t.m, t.v};
      for (int k = 0; k < 3 && good; ++k) {
        const std::string name = kKinds[k] + t.name;
        H ds(create_f32(file.get(), name, t.global_shape, chunk));
        bool ok = ds.valid();
        if (ok) {
          try {
            const std::int32_t sd = t.shard_dim;
            write_attr_array(ds.get(), "shard_dim", H5T_NATIVE_INT32, &sd, 1, true);
          } catch (const CheckpointError&) {
            ok = false;
          }
        }
        good = step_ok(ok, "cannot create dataset " + name);
        if (!good) break;
        const herr_t st = write_part(ds.get(), H5T_NATIVE_FLOAT, t.start, t.count, t.writer ? bufs[k] : nullptr,
                                     dxpl.get());
        if (st >= 0 && i == 0 && k == 0) {  // say once (debug) if HDF5 broke collective I/O
          std::uint32_t local = 0, global = 0;
          H5Pget_mpio_no_collective_cause(dxpl.get(), &local, &global);
          if (global != 0 && wc.rank() == 0)
            spdlog::debug("checkpoint {}: HDF5 did not use collective I/O (cause mask {:#x})", tmp, global);
        }
        ds.reset();
        good = step_ok(st >= 0, name + ": collective write failed");
      }
    }
    // /state: rank 0 writes, the others select none.
    if (good) {
      const std::int64_t scalars[4] = {state.step, state.tokens_seen, state.stream_epoch, state.stream_position};
      for (int k = 0; k < kNumState && good; ++k) {
        const bool packer = k == 5;
        const hsize_t n = packer ? hsize_t(state.packer_state.size()) : 1;
        const hid_t type = k == 4 ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64;
        H ds(create_state(file.get(), kStateNames[k], type, n));
        good = step_ok(ds.valid(), std::string("cannot create dataset ") + kStateNames[k]);
        if (!good) break;
        const void* buf = packer ? static_cast<const void*>(state.packer_state.data())
                                 : k == 4 ? static_cast<const void*>(&state.seed)
                                          : static_cast<const void*>(&scalars[k]);
        const herr_t st =
            write_part(ds.get(), type, {0}, {std::int64_t(n)}, wc.rank() == 0 && n > 0 ? buf : nullptr, dxpl.get());
        ds.reset();
        good = step_ok(st >= 0, std::string(kStateNames[k]) + ": collective write failed");
      }
    }
    if (good) good = step_ok(H5Fflush(file.get(), H5F_SCOPE_GLOBAL) >= 0, "H5Fflush failed");
    groups.clear();
    if (file.valid()) {
      const bool closed = file.reset();  // collective
      step_ok(closed, "H5Fclose failed");
    }
  }
  w.barrier();
  err = comm::agree(w, err);
  if (!err.empty()) {
    if (w.rank() == 0) std::remove(tmp.c_str());
    throw CheckpointError(err);
  }

  // 4. Commit (rank 0), agreed.
  if (w.rank() == 0) {
    try {
      commit(cc.dir, tmp, final_path, state.step, cc.keep);
    } catch (const CheckpointError& e) {
      err = prefix(final_path) + e.what();
    }
  }
  err = comm::agree(w, err);
  if (!err.empty()) throw CheckpointError(err);
  return final_path;
}

LoadedCheckpoint load_checkpoint(const std::string& path, const grid::ProcessGrid& grid,
                                 const std::vector<TensorRef>& tensors, const core::ModelConfig& model,
                                 std::int64_t vocab) {
  const auto& w = grid.world();
  QuietHdf5 quiet;
  // Rank 0 checks the file serially first so that every rank agrees before
  // the collective open (a damaged file fails the same way everywhere).
  std::string err;
  if (w.rank() == 0) {
    try {
      H f = open_serial(path);
      read_info(f.get(), path);
    } catch (const CheckpointError& e) {
      err = e.what();
    }
  }
  err = comm::agree(w, err);
  if (!err.empty()) throw CheckpointError(err);

  H fapl(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_fapl_mpio(fapl.get(), w.mpi(), MPI_INFO_NULL);
  H file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()));
  if (!file.valid()) err = prefix(path) + "cannot open with MPI-IO" + h5_reason();
  err = comm::agree(w, err);
  // The serial pre-check makes a divergent open (some ranks fail, some not)
  // practically impossible; were it to happen, the ranks holding a handle
  // would close it collectively without the others.
  if (!err.empty()) throw CheckpointError(err);

  LoadedCheckpoint out;
  H dxpl(H5Pcreate(H5P_DATASET_XFER));
  H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_INDEPENDENT);
  try {
    const hid_t f = file.get();
    out.info = read_info(f, path);
    const auto& im = out.info.model;
    const bool same_model = out.info.vocab == vocab && im.layers == model.layers && im.d_model == model.d_model &&
                            im.heads == model.heads && im.kv_heads == model.kv_heads &&
                            im.ffn_hidden == model.ffn_hidden;
    const std::string both = "checkpoint model: " + model_string(im, out.info.vocab) +
                             "; the deck's model: " + model_string(model, vocab);
    if (!same_model) {
      // Name the first tensor whose shape differs, as the user sees it.
      for (const auto& t : tensors) {
        const std::string name = std::string(kKinds[0]) + t.name;
        if (!link_exists(f, name))
          fail(path, "has no " + name + " but the deck's model needs " + shape_string(t.global_shape) + " (" +
                         both + ")");
        std::vector<std::int64_t> dims;
        open_dataset(f, name, path, &dims);
        if (dims != t.global_shape)
          fail(path, name + " has shape " + shape_string(dims) + " but the deck's model needs " +
                         shape_string(t.global_shape) + " (" + both + ")");
      }
      fail(path, "was written for another model (" + both + ")");
    }
    for (const auto& t : tensors) {
      if (!t.held) continue;
      float* bufs[3] = {t.value, t.m, t.v};
      for (int k = 0; k < 3; ++k) {
        const std::string name = kKinds[k] + t.name;
        std::vector<std::int64_t> dims;
        H ds = open_dataset(f, name, path, &dims);
        if (dims != t.global_shape)
          fail(path, name + " has shape " + shape_string(dims) + " but the deck's model needs " +
                         shape_string(t.global_shape));
        require_class(ds.get(), H5T_FLOAT, name, path);
        if (!bufs[k]) continue;  // a null pointer: not wanted (e.g. moments for evaluation)
        read_part(ds.get(), H5T_NATIVE_FLOAT, t.start, t.count, bufs[k], dxpl.get(), name, path);
      }
    }
    out.state = read_state(f, path, dxpl.get());
    if (out.state.step != out.info.step)
      fail(path, "/state/step = " + std::to_string(out.state.step) + " but the root attribute step = " +
                     std::to_string(out.info.step));
  } catch (const CheckpointError& e) {
    err = e.what();
  }
  dxpl.reset();
  if (!file.reset() && err.empty()) err = prefix(path) + "H5Fclose failed" + h5_reason();  // collective
  err = comm::agree(w, err);
  if (!err.empty()) throw CheckpointError(err);
  return out;
}

void verify_checkpoint(const std::string& path) {
  QuietHdf5 quiet;
  std::vector<std::string> names;
  {
    H f = open_serial(path);
    names = read_info(f.get(), path).tensors;
  }
  const std::string err = verify_part(path, 0, 1, names);
  if (!err.empty()) throw CheckpointError(err);
}

void verify_checkpoint(const std::string& path, const comm::Communicator& world) {
  std::string err, listing;
  if (world.rank() == 0) {
    QuietHdf5 quiet;
    try {
      H f = open_serial(path);
      for (const auto& n : read_info(f.get(), path).tensors) listing += n + "\n";
    } catch (const CheckpointError& e) {
      err = e.what();
    }
  }
  err = comm::agree(world, err);
  if (!err.empty()) throw CheckpointError(err);
  const auto names = split_lines(comm::bcast_string(world, listing, 0));
  err = comm::agree(world, verify_part(path, world.rank(), world.size(), names));
  if (!err.empty()) throw CheckpointError(err);
}

CheckpointInfo read_checkpoint_info(const std::string& path) {
  QuietHdf5 quiet;
  H f = open_serial(path);
  return read_info(f.get(), path);
}

std::vector<TensorSummary> summarize_checkpoint(const std::string& path) {
  QuietHdf5 quiet;
  H f = open_serial(path);
  const auto info = read_info(f.get(), path);
  std::vector<TensorSummary> out;
  for (int k = 0; k < 3; ++k)
    for (const auto& n : info.tensors) {
      TensorSummary s;
      s.dataset = kKinds[k] + n;
      double sum = 0;
      scan_f32(
          f.get(), s.dataset, path,
          [&](const float* x, std::size_t m) {
            for (std::size_t i = 0; i < m; ++i) sum += double(x[i]) * double(x[i]);
          },
          &s.shape);
      s.l2 = std::sqrt(sum);
      out.push_back(std::move(s));
    }
  return out;
}

TrainState read_train_state(const std::string& path) {
  QuietHdf5 quiet;
  H f = open_serial(path);
  read_info(f.get(), path);
  return read_state(f.get(), path, H5P_DEFAULT);
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& n : read_latest_names(dir)) out.push_back(join_path(dir, n));
  return out;
}

std::optional<std::string> resolve_resume(const std::string& dir, const std::string& mode,
                                          const comm::Communicator& world, std::vector<std::string>* skipped) {
  if (mode == "never") return std::nullopt;
  // Rank 0 decides the candidates: code 0 fresh start, 1 candidates (auto),
  // 2 one explicit file, 3 error.
  std::int64_t code = 0;
  std::string text;
  if (world.rank() == 0) {
    const bool is_auto = mode == "auto";
    const std::string d = is_auto ? dir : mode;
    if (!is_auto && is_file(mode)) {
      code = 2;
      text = mode;
    } else if (!is_auto && !is_dir(mode)) {
      code = 3;
      text = "checkpoint.resume='" + mode + "': no such checkpoint file or directory";
    } else if (!is_file(join_path(d, "latest"))) {
      code = is_auto ? 0 : 3;
      text = "checkpoint.resume='" + mode + "': directory has no 'latest' file (no complete checkpoint)";
    } else {
      code = 1;
      for (const auto& p : list_checkpoints(d)) text += p + "\n";
      if (text.empty()) {
        code = 3;
        text = "checkpoint directory " + d + ": 'latest' lists no checkpoint";
      }
    }
  }
  world.broadcast(&code, 1, 0);
  text = comm::bcast_string(world, text, 0);
  if (code == 0) return std::nullopt;
  if (code == 3) throw CheckpointError(text);
  if (code == 2) {
    verify_checkpoint(text, world);
    return text;
  }
  const auto cands = split_lines(text);
  std::vector<std::string> reasons;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    try {
      verify_checkpoint(cands[i], world);
      return cands[i];
    } catch (const CheckpointError& e) {
      reasons.push_back(e.what());
      if (skipped) skipped->push_back(e.what());
      if (world.rank() == 0) {
        if (i + 1 < cands.size())
          spdlog::warn("checkpoint {} is unusable ({}); falling back to the previous checkpoint {}", cands[i],
                       e.what(), cands[i + 1]);
        else
          spdlog::warn("checkpoint {} is unusable ({}); no older checkpoint is listed", cands[i], e.what());
      }
    }
  }
  std::string msg = "no usable checkpoint among the " + std::to_string(cands.size()) +
                    " listed in " + join_path(mode == "auto" ? dir : mode, "latest") + ":";
  for (const auto& r : reasons) msg += "\n  " + r;
  throw CheckpointError(msg);
}

}  // namespace wlb::io
