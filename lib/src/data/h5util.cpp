// Private HDF5 helpers of the data area (see h5util.hpp).
#include "wlb4d/data/h5util.hpp"

namespace wlb::data::h5 {

using core::DataError;

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

hid_t check(hid_t id, const std::string& file, const std::string& what) {
  if (id < 0) {
    std::string why = last_error();
    throw DataError(file + ": " + what + (why.empty() ? "" : " (HDF5: " + why + ")"));
  }
  return id;
}

void check_status(herr_t st, const std::string& file, const std::string& what) {
  if (st < 0) check(H5I_INVALID_HID, file, what);
}

bool exists(hid_t loc, const std::string& name) {
  htri_t r = -1;
  H5E_BEGIN_TRY { r = H5Lexists(loc, name.c_str(), H5P_DEFAULT); }
  H5E_END_TRY;
  if (r <= 0) return false;
  H5E_BEGIN_TRY { r = H5Oexists_by_name(loc, name.c_str(), H5P_DEFAULT); }
  H5E_END_TRY;
  return r > 0;
}

void write_attr_string(hid_t loc, const std::string& name, const std::string& value,
                       const std::string& file) {
  Handle type(check(H5Tcopy(H5T_C_S1), file, "H5Tcopy"));
  check_status(H5Tset_size(type.get(), value.empty() ? 1 : value.size()), file, "H5Tset_size");
  check_status(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), file, "H5Tset_strpad");
  check_status(H5Tset_cset(type.get(), H5T_CSET_UTF8), file, "H5Tset_cset");
  Handle space(check(H5Screate(H5S_SCALAR), file, "H5Screate"));
  Handle attr(check(H5Acreate2(loc, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                    file, "cannot create attribute '" + name + "'"));
  std::string buf = value.empty() ? std::string(1, '\0') : value;
  check_status(H5Awrite(attr.get(), type.get(), buf.data()), file,
               "cannot write attribute '" + name + "'");
}

void write_attr_i64(hid_t loc, const std::string& name, std::int64_t value, const std::string& file) {
  Handle space(check(H5Screate(H5S_SCALAR), file, "H5Screate"));
  Handle attr(check(H5Acreate2(loc, name.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                    file, "cannot create attribute '" + name + "'"));
  check_status(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value), file,
               "cannot write attribute '" + name + "'");
}

bool has_attr(hid_t loc, const std::string& name) {
  htri_t r = -1;
  H5E_BEGIN_TRY { r = H5Aexists(loc, name.c_str()); }
  H5E_END_TRY;
  return r > 0;
}

namespace {
Handle open_attr(hid_t loc, const std::string& name, const std::string& file) {
  if (!has_attr(loc, name))
    throw DataError(file + ": wrong schema: missing root attribute '" + name + "'");
  return Handle(check(H5Aopen(loc, name.c_str(), H5P_DEFAULT), file,
                      "cannot open attribute '" + name + "'"));
}
}  // namespace

std::string read_attr_string(hid_t loc, const std::string& name, const std::string& file) {
  Handle attr = open_attr(loc, name, file);
  Handle type(check(H5Aget_type(attr.get()), file, "H5Aget_type"));
  if (H5Tget_class(type.get()) != H5T_STRING)
    throw DataError(file + ": wrong schema: attribute '" + name + "' must be a string");
  Handle space(check(H5Aget_space(attr.get()), file, "H5Aget_space"));
  if (H5Sget_simple_extent_npoints(space.get()) != 1)
    throw DataError(file + ": wrong schema: attribute '" + name + "' must be a scalar");
  if (H5Tis_variable_str(type.get()) > 0) {
    Handle mem(check(H5Tcopy(H5T_C_S1), file, "H5Tcopy"));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* p = nullptr;
    check_status(H5Aread(attr.get(), mem.get(), &p), file, "cannot read attribute '" + name + "'");
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  std::size_t n = H5Tget_size(type.get());
  std::string s(n, '\0');
  check_status(H5Aread(attr.get(), type.get(), s.data()), file, "cannot read attribute '" + name + "'");
  auto end = s.find('\0');
  if (end != std::string::npos) s.resize(end);
  while (!s.empty() && s.back() == ' ') s.pop_back();  // H5T_STR_SPACEPAD
  return s;
}

std::int64_t read_attr_i64(hid_t loc, const std::string& name, const std::string& file) {
  Handle attr = open_attr(loc, name, file);
  Handle type(check(H5Aget_type(attr.get()), file, "H5Aget_type"));
  if (H5Tget_class(type.get()) != H5T_INTEGER)
    throw DataError(file + ": wrong schema: attribute '" + name + "' must be an integer");
  Handle space(check(H5Aget_space(attr.get()), file, "H5Aget_space"));
  if (H5Sget_simple_extent_npoints(space.get()) != 1)
    throw DataError(file + ": wrong schema: attribute '" + name + "' must be a scalar");
  std::int64_t v = 0;
  check_status(H5Aread(attr.get(), H5T_NATIVE_INT64, &v), file, "cannot read attribute '" + name + "'");
  return v;
}

}  // namespace wlb::data::h5
