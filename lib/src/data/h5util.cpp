// The HDF5 helper layer (see h5util.hpp).
#include "wlb4d/data/h5util.hpp"

#include <sys/stat.h>

#include <cstdlib>

namespace wlb::data::h5 {

bool Handle::reset() noexcept {
  if (id_ < 0) return true;
  herr_t st = 0;
  H5E_BEGIN_TRY {
    switch (H5Iget_type(id_)) {
      case H5I_FILE: st = H5Fclose(id_); break;
      case H5I_GROUP: st = H5Gclose(id_); break;
      case H5I_DATASET: st = H5Dclose(id_); break;
      case H5I_DATASPACE: st = H5Sclose(id_); break;
      case H5I_DATATYPE: st = H5Tclose(id_); break;
      case H5I_ATTR: st = H5Aclose(id_); break;
      case H5I_GENPROP_LST: st = H5Pclose(id_); break;
      default: break;
    }
  }
  H5E_END_TRY;
  id_ = H5I_INVALID_HID;
  return st >= 0;
}

std::recursive_mutex& api_mutex() {
  static std::recursive_mutex m;
  return m;
}

Quiet::Quiet() {
  H5Eget_auto2(H5E_DEFAULT, &fn_, &data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}
Quiet::~Quiet() { H5Eset_auto2(H5E_DEFAULT, fn_, data_); }

namespace {
herr_t collect(unsigned, const H5E_error2_t* err, void* data) {
  if (err->desc && *err->desc) static_cast<std::vector<std::string>*>(data)->push_back(err->desc);
  return 0;
}
}  // namespace

std::string last_error() {
  std::vector<std::string> descs;  // outermost (API call) first, innermost last
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect, &descs);
  H5Eclear2(H5E_DEFAULT);
  // The innermost two reasons are the useful ones ("truncated file: eof = ...").
  std::string s;
  std::size_t first = descs.size() > 2 ? descs.size() - 2 : 0;
  for (std::size_t i = descs.size(); i-- > first;) {
    if (!s.empty()) s += "; ";
    s += descs[i];
  }
  return s;
}

std::string reason() {
  const std::string why = last_error();
  return why.empty() ? "" : " (HDF5: " + why + ")";
}

bool exists(hid_t loc, const std::string& name) {
  // Every component ("/optim/m/x": /optim, /optim/m, /optim/m/x), so a
  // missing parent group is "absent", not an HDF5 error.
  std::size_t pos = 0;
  while (true) {
    pos = name.find('/', pos + 1);
    const std::string part = name.substr(0, pos);
    if (!part.empty() && part != "/") {
      htri_t r = -1;
      H5E_BEGIN_TRY { r = H5Lexists(loc, part.c_str(), H5P_DEFAULT); }
      H5E_END_TRY;
      if (r <= 0) return false;
    }
    if (pos == std::string::npos) break;
  }
  htri_t r = -1;
  H5E_BEGIN_TRY { r = H5Oexists_by_name(loc, name.c_str(), H5P_DEFAULT); }
  H5E_END_TRY;
  return r > 0;
}

bool has_attr(hid_t loc, const std::string& name) {
  htri_t r = -1;
  H5E_BEGIN_TRY { r = H5Aexists(loc, name.c_str()); }
  H5E_END_TRY;
  return r > 0;
}

namespace detail {

namespace {

/// Raises "<file>: <what>" through the area's error factory.
[[noreturn]] void fail(Raise f, const std::string& file, const std::string& what) {
  f(file + ": " + what);
  std::abort();  // a Raise always throws
}
hid_t need(hid_t id, Raise f, const std::string& file, const std::string& what) {
  if (id < 0) fail(f, file, what + reason());
  return id;
}
void need_ok(herr_t st, Raise f, const std::string& file, const std::string& what) {
  if (st < 0) fail(f, file, what + reason());
}

std::string q(const std::string& name) { return "'" + name + "'"; }
std::string schema(Wording w) { return w == Wording::Data ? "wrong schema: " : ""; }

std::string write_failed(const std::string& name, Wording w, bool creating) {
  if (w == Wording::Checkpoint) return "cannot write attribute " + name;
  return (creating ? "cannot create attribute " : "cannot write attribute ") + q(name);
}
std::string wrong_class(const std::string& name, Wording w, const char* data_rule, const char* ckpt_rule) {
  return schema(w) + "attribute " + q(name) + (w == Wording::Data ? data_rule : ckpt_rule);
}
std::string not_scalar(const std::string& name, Wording w) {
  return schema(w) + "attribute " + q(name) + " must be a scalar";
}

Handle open_attr(hid_t loc, const std::string& name, const std::string& file, Wording w, Raise f) {
  if (!has_attr(loc, name)) fail(f, file, schema(w) + "missing root attribute " + q(name));
  return Handle(need(H5Aopen(loc, name.c_str(), H5P_DEFAULT), f, file, "cannot open attribute " + q(name)));
}

}  // namespace

void write_attr_string(hid_t loc, const std::string& name, const std::string& value, const std::string& file,
                       StrKind kind, Wording w, Raise f) {
  const bool vl = kind == StrKind::VariableUtf8;
  Handle type(need(H5Tcopy(H5T_C_S1), f, file, "H5Tcopy"));
  need_ok(H5Tset_size(type.get(), vl ? H5T_VARIABLE : (value.empty() ? 1 : value.size())), f, file, "H5Tset_size");
  if (kind == StrKind::FixedUtf8) need_ok(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), f, file, "H5Tset_strpad");
  if (kind != StrKind::FixedAscii) need_ok(H5Tset_cset(type.get(), H5T_CSET_UTF8), f, file, "H5Tset_cset");
  Handle space(need(H5Screate(H5S_SCALAR), f, file, "H5Screate"));
  Handle attr(need(H5Acreate2(loc, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), f, file,
                   write_failed(name, w, true)));
  herr_t st = -1;
  if (vl) {
    const char* p = value.c_str();
    st = H5Awrite(attr.get(), type.get(), &p);
  } else {
    const std::string buf = value.empty() ? std::string(1, '\0') : value;
    st = H5Awrite(attr.get(), type.get(), buf.data());
  }
  need_ok(st, f, file, write_failed(name, w, false));
}

void write_attr(hid_t loc, const std::string& name, hid_t type, const void* values, hsize_t n, bool scalar,
                const std::string& file, Wording w, Raise f) {
  Handle space(need(scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr), f, file, "H5Screate"));
  Handle attr(need(H5Acreate2(loc, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT), f, file,
                   write_failed(name, w, true)));
  need_ok(H5Awrite(attr.get(), type, values), f, file, write_failed(name, w, false));
}

std::string read_attr_string(hid_t loc, const std::string& name, const std::string& file, Wording w, Raise f) {
  Handle attr = open_attr(loc, name, file, w, f);
  Handle type(need(H5Aget_type(attr.get()), f, file, "H5Aget_type"));
  if (H5Tget_class(type.get()) != H5T_STRING)
    fail(f, file, wrong_class(name, w, " must be a string", " is not a string"));
  Handle space(need(H5Aget_space(attr.get()), f, file, "H5Aget_space"));
  if (H5Sget_simple_extent_npoints(space.get()) != 1) fail(f, file, not_scalar(name, w));
  if (H5Tis_variable_str(type.get()) > 0) {
    Handle mem(need(H5Tcopy(H5T_C_S1), f, file, "H5Tcopy"));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* p = nullptr;
    need_ok(H5Aread(attr.get(), mem.get(), &p), f, file, "cannot read attribute " + q(name));
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  std::size_t n = H5Tget_size(type.get());
  std::string s(n, '\0');
  need_ok(H5Aread(attr.get(), type.get(), s.data()), f, file, "cannot read attribute " + q(name));
  auto end = s.find('\0');
  if (end != std::string::npos) s.resize(end);
  while (!s.empty() && s.back() == ' ') s.pop_back();  // H5T_STR_SPACEPAD
  return s;
}

std::vector<std::int64_t> read_attr_i64s(hid_t loc, const std::string& name, const std::string& file, Wording w,
                                         Raise f) {
  Handle attr = open_attr(loc, name, file, w, f);
  Handle type(need(H5Aget_type(attr.get()), f, file, "H5Aget_type"));
  Handle space(need(H5Aget_space(attr.get()), f, file, "H5Aget_space"));
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  const char* data_rule = " must be an integer";
  const char* ckpt_rule = " is not an integer attribute";
  if (H5Tget_class(type.get()) != H5T_INTEGER) fail(f, file, wrong_class(name, w, data_rule, ckpt_rule));
  if (n < 1) fail(f, file, w == Wording::Data ? not_scalar(name, w) : wrong_class(name, w, data_rule, ckpt_rule));
  std::vector<std::int64_t> v(std::size_t(n), 0);
  need_ok(H5Aread(attr.get(), H5T_NATIVE_INT64, v.data()), f, file, "cannot read attribute " + q(name));
  return v;
}

std::int64_t read_attr_i64(hid_t loc, const std::string& name, const std::string& file, Wording w, Raise f) {
  const auto v = read_attr_i64s(loc, name, file, w, f);
  if (w == Wording::Data && v.size() != 1) fail(f, file, not_scalar(name, w));
  return v.at(0);
}

std::vector<std::uint64_t> read_1d_u64(hid_t loc, const std::string& name, const std::string& file, Raise f) {
  if (!exists(loc, name)) fail(f, file, "missing dataset " + q(name));
  Handle d(need(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), f, file, "cannot open dataset " + q(name)));
  Handle sp(need(H5Dget_space(d.get()), f, file, "H5Dget_space " + name));
  hsize_t n = 0;
  if (H5Sget_simple_extent_ndims(sp.get()) != 1 || H5Sget_simple_extent_dims(sp.get(), &n, nullptr) != 1)
    fail(f, file, "dataset " + q(name) + " must be 1-D");
  check_stored(d.get(), name, file, f);
  std::vector<std::uint64_t> v(n);
  if (n > 0)
    need_ok(H5Dread(d.get(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), f, file,
            "cannot read dataset " + q(name));
  return v;
}

void check_stored(hid_t dset, const std::string& name, const std::string& file, Raise f) {
  Handle sp(need(H5Dget_space(dset), f, file, "H5Dget_space " + name));
  const hssize_t npoints = H5Sget_simple_extent_npoints(sp.get());
  if (npoints <= 0) return;  // empty (or a null dataspace): nothing to back
  Handle type(need(H5Dget_type(dset), f, file, "H5Dget_type " + name));
  const auto n = static_cast<std::uint64_t>(npoints);
  const std::uint64_t size = H5Tget_size(type.get());
  const std::string head = "dataset " + q(name) + " declares " + std::to_string(n) + " elements";
  if (size == 0 || n > UINT64_MAX / size) fail(f, file, head + " of " + std::to_string(size) + " bytes: too large");
  const std::uint64_t declared = n * size;
  const std::string what = head + " (" + std::to_string(declared) + " bytes)";
  const std::string rule = ": a dataset's declared size must be backed by data stored in the file";

  Handle dcpl(need(H5Dget_create_plist(dset), f, file, "H5Dget_create_plist " + name));
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_COMPACT) return;  // in the object header: HDF5 has read it already (<= 64 KiB)
  const int filters = H5Pget_nfilters(dcpl.get());
  const std::uint64_t stored = H5Dget_storage_size(dset);  // bytes allocated in the file, after filters

  // The file HDF5 opened, and what it holds: its size and its allocated blocks.
  std::uint64_t file_bytes = 0, disk_bytes = 0;
  bool have_stat = false;
  {
    Handle fid(H5Iget_file_id(dset));
    const ssize_t len = fid.valid() ? H5Fget_name(fid.get(), nullptr, 0) : -1;
    if (len > 0) {
      std::string fname(static_cast<std::size_t>(len) + 1, '\0');
      H5Fget_name(fid.get(), fname.data(), fname.size());
      fname.resize(static_cast<std::size_t>(len));
      struct stat sb {};
      if (::stat(fname.c_str(), &sb) == 0 && S_ISREG(sb.st_mode)) {
        have_stat = true;
        file_bytes = static_cast<std::uint64_t>(sb.st_size);
        disk_bytes = static_cast<std::uint64_t>(sb.st_blocks) * 512;
      }
    }
  }
  if (stored == 0)
    fail(f, file, what + " but has no data stored in the file (never written)" + rule);
  if (have_stat && stored > file_bytes)
    fail(f, file, what + " and claims " + std::to_string(stored) + " bytes of storage, more than the file's " +
                      std::to_string(file_bytes) + " bytes (a corrupt chunk index?)" + rule);
  if (filters <= 0 && stored < declared)
    fail(f, file, what + " but only " + std::to_string(stored) +
                      " bytes are stored in the file (chunks never written: a sparse dataset)" + rule);
  if (filters > 0 && declared / kMaxStoredExpansion > stored)
    fail(f, file, what + " but only " + std::to_string(stored) + " compressed bytes are stored in the file: more than a " +
                      std::to_string(kMaxStoredExpansion) + "-fold expansion" + rule);
  if (filters > 0 && layout == H5D_CHUNKED) {
    hsize_t chunk = 0, nchunks = 0;
    const int rank = H5Pget_chunk(dcpl.get(), 1, &chunk);
    herr_t st = -1;
    H5E_BEGIN_TRY { st = rank == 1 && chunk > 0 ? H5Dget_num_chunks(dset, sp.get(), &nchunks) : -1; }  // 1.10: no H5S_ALL
    H5E_END_TRY;
    if (st >= 0) {
      const std::uint64_t need_chunks = (n + chunk - 1) / chunk;
      if (nchunks < need_chunks)
        fail(f, file, what + " but only " + std::to_string(nchunks) + " of its " + std::to_string(need_chunks) +
                          " chunks are stored in the file (a sparse dataset)" + rule);
    }
  }
  if (have_stat && disk_bytes > 0 && stored / kMaxStoredExpansion > disk_bytes)
    fail(f, file, what + " and stores " + std::to_string(stored) + " bytes, but the file occupies only " +
                      std::to_string(disk_bytes) + " bytes on disk (a sparse file: holes, not data; at most " +
                      std::to_string(kMaxStoredExpansion) + "-fold)" + rule);
}

}  // namespace detail

}  // namespace wlb::data::h5
