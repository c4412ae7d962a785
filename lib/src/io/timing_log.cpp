#include "wlb4d/io/timing_log.hpp"

#include "wlb4d/core/error.hpp"

#include <hdf5.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sys/stat.h>

namespace wlb::io {

namespace {
constexpr int kFormatVersion = 2;
const char* const kNames[kNumCategories] = {"plan",     "data",     "forward",   "backward",
                                            "p2p_wait", "tp_comm",  "cp_comm",   "dp_reduce",
                                            "optimizer", "checkpoint", "eval",   "total"};

bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

// HDF5 compound types mirroring the POD structs field by field.
hid_t record_type() {
  hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(TimingRecord));
  H5Tinsert(t, "step", HOFFSET(TimingRecord, step), H5T_NATIVE_INT64);
  H5Tinsert(t, "rank", HOFFSET(TimingRecord, rank), H5T_NATIVE_INT32);
  H5Tinsert(t, "dp", HOFFSET(TimingRecord, dp), H5T_NATIVE_INT32);
  H5Tinsert(t, "pp", HOFFSET(TimingRecord, pp), H5T_NATIVE_INT32);
  H5Tinsert(t, "cp", HOFFSET(TimingRecord, cp), H5T_NATIVE_INT32);
  H5Tinsert(t, "tp", HOFFSET(TimingRecord, tp), H5T_NATIVE_INT32);
  for (int c = 0; c < kNumCategories; ++c)
    H5Tinsert(t, (std::string("t_") + kNames[c]).c_str(), HOFFSET(TimingRecord, time) + c * sizeof(double),
              H5T_NATIVE_DOUBLE);
#define WLB_FIELD(f, ty) H5Tinsert(t, #f, HOFFSET(TimingRecord, f), ty)
  WLB_FIELD(loss, H5T_NATIVE_DOUBLE);
  WLB_FIELD(val_loss, H5T_NATIVE_DOUBLE);
  WLB_FIELD(grad_norm, H5T_NATIVE_DOUBLE);
  WLB_FIELD(lr, H5T_NATIVE_DOUBLE);
  WLB_FIELD(tokens, H5T_NATIVE_INT64);
  WLB_FIELD(local_tokens, H5T_NATIVE_INT64);
  WLB_FIELD(gflops, H5T_NATIVE_DOUBLE);
  WLB_FIELD(attn_imbalance, H5T_NATIVE_DOUBLE);
  WLB_FIELD(latency_imbalance, H5T_NATIVE_DOUBLE);
  WLB_FIELD(cp_imbalance, H5T_NATIVE_DOUBLE);
  WLB_FIELD(delay_mean, H5T_NATIVE_DOUBLE);
  WLB_FIELD(delay_max, H5T_NATIVE_DOUBLE);
  WLB_FIELD(compute_cpu, H5T_NATIVE_DOUBLE);
#undef WLB_FIELD
  return t;
}

hid_t restart_type() {
  hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(RestartRecord));
  H5Tinsert(t, "step", HOFFSET(RestartRecord, step), H5T_NATIVE_INT64);
  H5Tinsert(t, "dp", HOFFSET(RestartRecord, dp), H5T_NATIVE_INT32);
  H5Tinsert(t, "pp", HOFFSET(RestartRecord, pp), H5T_NATIVE_INT32);
  H5Tinsert(t, "cp", HOFFSET(RestartRecord, cp), H5T_NATIVE_INT32);
  H5Tinsert(t, "tp", HOFFSET(RestartRecord, tp), H5T_NATIVE_INT32);
  H5Tinsert(t, "unix_time", HOFFSET(RestartRecord, unix_time), H5T_NATIVE_DOUBLE);
  H5Tinsert(t, "cost_a", HOFFSET(RestartRecord, cost_a), H5T_NATIVE_DOUBLE);
  H5Tinsert(t, "cost_b", HOFFSET(RestartRecord, cost_b), H5T_NATIVE_DOUBLE);
  H5Tinsert(t, "cost_c", HOFFSET(RestartRecord, cost_c), H5T_NATIVE_DOUBLE);
  H5Tinsert(t, "cost_calibrated", HOFFSET(RestartRecord, cost_calibrated), H5T_NATIVE_INT32);
  return t;
}

hid_t create_table(hid_t file, const char* name, hid_t type) {
  hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, chunk[1] = {256};
  hid_t space = H5Screate_simple(1, dims, maxdims);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 1, chunk);
  hid_t ds = H5Dcreate2(file, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Pclose(dcpl);
  H5Sclose(space);
  return ds;
}

void append_rows(hid_t ds, hid_t type, const void* rows, hsize_t n) {
  if (n == 0) return;
  hid_t space = H5Dget_space(ds);
  hsize_t cur[1];
  H5Sget_simple_extent_dims(space, cur, nullptr);
  H5Sclose(space);
  hsize_t next[1] = {cur[0] + n};
  H5Dset_extent(ds, next);
  hid_t fs = H5Dget_space(ds);
  hsize_t start[1] = {cur[0]}, count[1] = {n};
  H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, nullptr, count, nullptr);
  hid_t ms = H5Screate_simple(1, count, nullptr);
  herr_t st = H5Dwrite(ds, type, ms, fs, H5P_DEFAULT, rows);
  H5Sclose(ms);
  H5Sclose(fs);
  if (st < 0) throw core::DataError("timing log: appending rows failed");
}

template <class T> std::vector<T> read_table(const std::string& path, const char* name, hid_t type) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) throw core::DataError("timing log '" + path + "' cannot be opened");
  hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
  if (ds < 0) {
    H5Fclose(f);
    throw core::DataError("timing log '" + path + "' has no dataset " + name);
  }
  hid_t sp = H5Dget_space(ds);
  hsize_t n[1];
  H5Sget_simple_extent_dims(sp, n, nullptr);
  std::vector<T> rows(n[0]);
  if (n[0]) H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data());
  H5Sclose(sp);
  H5Dclose(ds);
  H5Fclose(f);
  return rows;
}
}  // namespace

const char* category_name(int c) { return (c >= 0 && c < kNumCategories) ? kNames[c] : "?"; }

struct TimingLog::Impl {
  comm::Communicator world;
  hid_t file = -1, steps = -1, restarts = -1, rtype = -1, stype = -1;
  std::ofstream csv;
};

TimingLog::TimingLog(const std::string& h5_path, const std::string& csv_path, const comm::Communicator& world,
                     const RestartRecord& restart)
    : impl_(std::make_unique<Impl>()) {
  impl_->world = world;
  if (world.rank() != 0) return;
  if (!h5_path.empty()) {
    impl_->rtype = record_type();
    impl_->stype = restart_type();
    if (file_exists(h5_path)) {
      H5E_BEGIN_TRY { impl_->file = H5Fopen(h5_path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT); }
      H5E_END_TRY;
      if (impl_->file < 0) throw core::DataError("timing log '" + h5_path + "' exists but is not an HDF5 file");
      H5E_BEGIN_TRY {
        impl_->steps = H5Dopen2(impl_->file, "/steps", H5P_DEFAULT);
        impl_->restarts = H5Dopen2(impl_->file, "/restarts", H5P_DEFAULT);
      }
      H5E_END_TRY;
      if (impl_->steps < 0 || impl_->restarts < 0)
        throw core::DataError("timing log '" + h5_path + "' exists but lacks /steps or /restarts");
      int ver = 0;
      H5E_BEGIN_TRY {
        hid_t a = H5Aopen(impl_->file, "format_version", H5P_DEFAULT);
        if (a >= 0) {
          H5Aread(a, H5T_NATIVE_INT, &ver);
          H5Aclose(a);
        }
      }
      H5E_END_TRY;
      if (ver != kFormatVersion)
        throw core::DataError("timing log '" + h5_path + "' has format_version " + std::to_string(ver) +
                              "; this wlb4d appends only to version " + std::to_string(kFormatVersion) +
                              " (set log.timing_file to a new file)");
    } else {
      impl_->file = H5Fcreate(h5_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
      if (impl_->file < 0) throw core::DataError("timing log '" + h5_path + "' cannot be created");
      impl_->steps = create_table(impl_->file, "/steps", impl_->rtype);
      impl_->restarts = create_table(impl_->file, "/restarts", impl_->stype);
      hid_t s = H5Screate(H5S_SCALAR);
      hid_t str = H5Tcopy(H5T_C_S1);
      const char* fmt = "wlb4d-timing";
      H5Tset_size(str, std::strlen(fmt));
      hid_t a = H5Acreate2(impl_->file, "format", str, s, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a, str, fmt);
      H5Aclose(a);
      int ver = kFormatVersion;
      a = H5Acreate2(impl_->file, "format_version", H5T_NATIVE_INT, s, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a, H5T_NATIVE_INT, &ver);
      H5Aclose(a);
      H5Tclose(str);
      H5Sclose(s);
    }
    append_rows(impl_->restarts, impl_->stype, &restart, 1);
    H5Fflush(impl_->file, H5F_SCOPE_LOCAL);
  }
  if (!csv_path.empty()) {
    const bool fresh = !file_exists(csv_path);
    impl_->csv.open(csv_path, std::ios::app);
    if (!impl_->csv) throw core::DataError("timing CSV '" + csv_path + "' cannot be opened for writing");
    impl_->csv.precision(12);
    if (fresh) {
      impl_->csv << "step,rank,dp,pp,cp,tp";
      for (int c = 0; c < kNumCategories; ++c) impl_->csv << ",t_" << kNames[c];
      impl_->csv << ",loss,val_loss,grad_norm,lr,tokens,local_tokens,gflops,attn_imbalance,latency_imbalance,"
                    "cp_imbalance,delay_mean,delay_max,compute_cpu\n";
    }
  }
}

TimingLog::~TimingLog() {
  if (impl_->steps >= 0) H5Dclose(impl_->steps);
  if (impl_->restarts >= 0) H5Dclose(impl_->restarts);
  if (impl_->rtype >= 0) H5Tclose(impl_->rtype);
  if (impl_->stype >= 0) H5Tclose(impl_->stype);
  if (impl_->file >= 0) H5Fclose(impl_->file);
}

std::vector<TimingRecord> TimingLog::append(const TimingRecord& mine) {
  const auto& w = impl_->world;
  std::vector<TimingRecord> all(w.size());
  w.allgather(reinterpret_cast<const char*>(&mine), reinterpret_cast<char*>(all.data()), sizeof(TimingRecord));
  if (w.rank() == 0) {
    if (impl_->file >= 0) {
      append_rows(impl_->steps, impl_->rtype, all.data(), all.size());
      H5Fflush(impl_->file, H5F_SCOPE_LOCAL);
    }
    if (impl_->csv.is_open()) {
      for (const auto& r : all) {
        impl_->csv << r.step << ',' << r.rank << ',' << r.dp << ',' << r.pp << ',' << r.cp << ',' << r.tp;
        for (int c = 0; c < kNumCategories; ++c) impl_->csv << ',' << r.time[c];
        impl_->csv << ',' << r.loss << ',' << r.val_loss << ',' << r.grad_norm << ',' << r.lr << ',' << r.tokens
                   << ',' << r.local_tokens << ',' << r.gflops << ',' << r.attn_imbalance << ','
                   << r.latency_imbalance << ',' << r.cp_imbalance << ',' << r.delay_mean << ',' << r.delay_max
                   << ',' << r.compute_cpu << '\n';
      }
      impl_->csv.flush();
    }
  }
  return all;
}

std::vector<TimingRecord> TimingLog::read_steps(const std::string& path) {
  hid_t t = record_type();
  auto rows = read_table<TimingRecord>(path, "/steps", t);
  H5Tclose(t);
  return rows;
}

std::vector<RestartRecord> TimingLog::read_restarts(const std::string& path) {
  hid_t t = restart_type();
  auto rows = read_table<RestartRecord>(path, "/restarts", t);
  H5Tclose(t);
  return rows;
}

}  // namespace wlb::io
