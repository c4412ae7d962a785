#include "wlb4d/io/timing_log.hpp"

#include "wlb4d/core/error.hpp"
#include "wlb4d/data/h5util.hpp"

#include <spdlog/spdlog.h>

#include <hdf5.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>

namespace wlb::io {

namespace {
namespace h5 = data::h5;
using h5::Handle;
using core::DataError;

constexpr int kFormatVersion = 7;
const char* const kNames[kNumCategories] = {"plan",     "data",     "forward",   "backward",
                                            "p2p_wait", "tp_comm",  "cp_comm",   "dp_reduce",
                                            "optimizer", "checkpoint", "eval",   "sample", "total"};

bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

// ---- the record schemas, described once ---------------------------------------------
//
// One table per record: column name, byte offset in the POD struct, value
// type. The HDF5 compound type, the CSV header and every CSV row are all
// generated from it, so the three cannot drift apart (scripts/plot_timing.py
// and the tests read the names).

enum class Kind { I32, I64, F64 };
struct Field {
  std::string name;
  std::size_t offset;
  Kind kind;
};

hid_t hdf5_type(Kind k) {
  switch (k) {
    case Kind::I32: return H5T_NATIVE_INT32;
    case Kind::I64: return H5T_NATIVE_INT64;
    case Kind::F64: return H5T_NATIVE_DOUBLE;
  }
  return H5T_NATIVE_DOUBLE;
}

/// CSV text of one field: integers as integers, doubles with the stream's precision.
void write_csv_value(std::ostream& os, const void* record, const Field& f) {
  const char* p = static_cast<const char*>(record) + f.offset;
  switch (f.kind) {
    case Kind::I32: os << *reinterpret_cast<const std::int32_t*>(p); break;
    case Kind::I64: os << *reinterpret_cast<const std::int64_t*>(p); break;
    case Kind::F64: os << *reinterpret_cast<const double*>(p); break;
  }
}

template <class T> Kind kind_of() {
  static_assert(std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> || std::is_same_v<T, double>);
  return std::is_same_v<T, std::int32_t> ? Kind::I32 : std::is_same_v<T, std::int64_t> ? Kind::I64 : Kind::F64;
}
#define WLB_FIELD(Rec, m) Field{#m, offsetof(Rec, m), kind_of<decltype(Rec::m)>()}

/// /steps columns, in file and CSV order.
const std::vector<Field>& step_fields() {
  static const std::vector<Field> fields = [] {
    using R = TimingRecord;
    std::vector<Field> f = {WLB_FIELD(R, step), WLB_FIELD(R, rank), WLB_FIELD(R, dp), WLB_FIELD(R, pp),
                            WLB_FIELD(R, cp),   WLB_FIELD(R, tp)};
    for (int c = 0; c < kNumCategories; ++c)
      f.push_back({std::string("t_") + kNames[c], offsetof(R, time) + std::size_t(c) * sizeof(double), Kind::F64});
    for (Field x : {WLB_FIELD(R, loss), WLB_FIELD(R, val_loss), WLB_FIELD(R, grad_norm), WLB_FIELD(R, lr),
                    WLB_FIELD(R, tokens), WLB_FIELD(R, local_tokens), WLB_FIELD(R, gflops),
                    WLB_FIELD(R, attn_imbalance), WLB_FIELD(R, latency_imbalance), WLB_FIELD(R, cp_imbalance),
                    WLB_FIELD(R, delay_mean), WLB_FIELD(R, delay_max), WLB_FIELD(R, compute_cpu),
                    WLB_FIELD(R, elapsed), WLB_FIELD(R, tokens_seen), WLB_FIELD(R, rss_mib), WLB_FIELD(R, mfu),
                    WLB_FIELD(R, mem_predicted), WLB_FIELD(R, mem_measured), WLB_FIELD(R, dp_exposed),
                    WLB_FIELD(R, dp_in_flight), WLB_FIELD(R, tp_exposed), WLB_FIELD(R, tp_in_flight),
                    WLB_FIELD(R, ca_cost_before), WLB_FIELD(R, ca_cost_after), WLB_FIELD(R, ca_imbalance_before),
                    WLB_FIELD(R, ca_imbalance),
                    WLB_FIELD(R, ca_bytes), WLB_FIELD(R, ca_exposed), WLB_FIELD(R, skipped),
                    WLB_FIELD(R, skipped_steps), WLB_FIELD(R, ckpt_write)})
      f.push_back(x);
    return f;
  }();
  return fields;
}

/// /restarts columns, in file order.
const std::vector<Field>& restart_fields() {
  using R = RestartRecord;
  static const std::vector<Field> fields = {
      WLB_FIELD(R, step),      WLB_FIELD(R, dp),     WLB_FIELD(R, pp),     WLB_FIELD(R, cp),
      WLB_FIELD(R, tp),        WLB_FIELD(R, unix_time), WLB_FIELD(R, cost_a), WLB_FIELD(R, cost_b),
      WLB_FIELD(R, cost_c),    WLB_FIELD(R, cost_calibrated)};
  return fields;
}

/// /trace columns, in file order.
const std::vector<Field>& trace_fields() {
  using R = TraceRecord;
  static const std::vector<Field> fields = {
      WLB_FIELD(R, step),        WLB_FIELD(R, rank), WLB_FIELD(R, stage), WLB_FIELD(R, virtual_stage),
      WLB_FIELD(R, micro_batch), WLB_FIELD(R, kind), WLB_FIELD(R, peer),  WLB_FIELD(R, t0),
      WLB_FIELD(R, t1)};
  return fields;
}
/// /sources columns, in file order.
const std::vector<Field>& source_fields() {
  using R = SourceRecord;
  static const std::vector<Field> fields = {WLB_FIELD(R, step),         WLB_FIELD(R, source),
                                            WLB_FIELD(R, tokens),       WLB_FIELD(R, drawn_tokens),
                                            WLB_FIELD(R, drawn_docs),   WLB_FIELD(R, weight)};
  return fields;
}

#undef WLB_FIELD

/// The HDF5 compound type of a record of `size` bytes with these fields.
Handle compound_type(const std::vector<Field>& fields, std::size_t size) {
  Handle t(h5::check(H5Tcreate(H5T_COMPOUND, size), "timing log", "H5Tcreate"));
  for (const auto& f : fields)
    h5::check_status(H5Tinsert(t.get(), f.name.c_str(), f.offset, hdf5_type(f.kind)), "timing log",
                     "H5Tinsert " + f.name);
  return t;
}
Handle record_type() { return compound_type(step_fields(), sizeof(TimingRecord)); }
Handle restart_type() { return compound_type(restart_fields(), sizeof(RestartRecord)); }
Handle trace_type() { return compound_type(trace_fields(), sizeof(TraceRecord)); }
Handle source_type() { return compound_type(source_fields(), sizeof(SourceRecord)); }

/// A string attribute on `loc`, replacing an older one of the same name
/// (the identity attributes are rewritten at every start).
void set_attr_string(hid_t loc, const std::string& name, const std::string& value, const std::string& path) {
  {
    h5::Quiet quiet;
    if (H5Aexists(loc, name.c_str()) > 0) H5Adelete(loc, name.c_str());
  }
  h5::write_attr_string(loc, name, value, path, h5::StrKind::VariableUtf8);
}

void write_csv_header(std::ostream& os) {
  const auto& fields = step_fields();
  for (std::size_t i = 0; i < fields.size(); ++i) os << (i ? "," : "") << fields[i].name;
  os << '\n';
}
void write_csv_row(std::ostream& os, const TimingRecord& r) {
  const auto& fields = step_fields();
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i) os << ',';
    write_csv_value(os, &r, fields[i]);
  }
  os << '\n';
}

// ---- HDF5 tables ------------------------------------------------------------------------

Handle create_table(hid_t file, const std::string& path, const char* name, hid_t type) {
  hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, chunk[1] = {256};
  Handle space(h5::check(H5Screate_simple(1, dims, maxdims), path, "H5Screate_simple"));
  Handle dcpl(h5::check(H5Pcreate(H5P_DATASET_CREATE), path, "H5Pcreate"));
  h5::check_status(H5Pset_chunk(dcpl.get(), 1, chunk), path, "H5Pset_chunk");
  return Handle(h5::check(H5Dcreate2(file, name, type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), path,
                          std::string("cannot create dataset ") + name));
}

void append_rows(hid_t ds, hid_t type, const void* rows, hsize_t n) {
  if (n == 0) return;
  herr_t st = -1;
  {
    h5::Quiet quiet;
    Handle space(H5Dget_space(ds));
    hsize_t cur[1] = {0};
    H5Sget_simple_extent_dims(space.get(), cur, nullptr);
    hsize_t next[1] = {cur[0] + n};
    H5Dset_extent(ds, next);
    Handle fs(H5Dget_space(ds));
    hsize_t start[1] = {cur[0]}, count[1] = {n};
    H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
    Handle ms(H5Screate_simple(1, count, nullptr));
    st = H5Dwrite(ds, type, ms.get(), fs.get(), H5P_DEFAULT, rows);
  }
  if (st < 0) throw DataError("timing log: appending rows failed");
}

template <class T> std::vector<T> read_table(const std::string& path, const char* name, hid_t type) {
  h5::Quiet quiet;
  Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!f.valid()) throw DataError("timing log '" + path + "' cannot be opened");
  Handle ds(H5Dopen2(f.get(), name, H5P_DEFAULT));
  if (!ds.valid()) throw DataError("timing log '" + path + "' has no dataset " + name);
  Handle sp(H5Dget_space(ds.get()));
  hsize_t n[1] = {0};
  H5Sget_simple_extent_dims(sp.get(), n, nullptr);
  std::vector<T> rows(n[0]);
  if (n[0] && H5Dread(ds.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()) < 0)
    throw DataError("timing log '" + path + "': cannot read " + name);
  return rows;
}

bool has_dataset(const std::string& path, const char* name) {
  h5::Quiet quiet;
  Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!f.valid()) throw DataError("timing log '" + path + "' cannot be opened");
  return H5Lexists(f.get(), name, H5P_DEFAULT) > 0;
}
}  // namespace

const char* category_name(int c) { return (c >= 0 && c < kNumCategories) ? kNames[c] : "?"; }

namespace {
/// Rows of /steps before the first one with step >= `from` (rows are in
/// step order: each start appends after dropping what it re-runs).
hsize_t rows_before(hid_t steps, std::int64_t from) {
  Handle sp(H5Dget_space(steps));
  hsize_t n[1] = {0};
  H5Sget_simple_extent_dims(sp.get(), n, nullptr);
  if (n[0] == 0) return 0;
  Handle t(h5::check(H5Tcreate(H5T_COMPOUND, sizeof(std::int64_t)), "timing log", "H5Tcreate"));
  h5::check_status(H5Tinsert(t.get(), "step", 0, H5T_NATIVE_INT64), "timing log", "H5Tinsert step");
  std::vector<std::int64_t> step(n[0]);
  if (H5Dread(steps, t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, step.data()) < 0)
    throw DataError("timing log: cannot read the step column of /steps");
  hsize_t i = 0;
  while (i < n[0] && step[i] < from) ++i;
  return i;
}

/// Keeps the header and the rows before the first with step >= `from`
/// (first CSV column); rewritten as .tmp + rename. Returns the rows dropped.
std::size_t truncate_csv(const std::string& path, std::int64_t from) {
  std::ifstream in(path);
  std::vector<std::string> keep;
  std::string line;
  std::size_t dropped = 0;
  bool cut = false;
  while (std::getline(in, line)) {
    if (keep.empty() || cut) {  // the header, or the rows after the cut
      if (keep.empty()) keep.push_back(line); else ++dropped;
      continue;
    }
    const long long step = std::strtoll(line.c_str(), nullptr, 10);
    if (!line.empty() && step >= from) {
      cut = true;
      ++dropped;
      continue;
    }
    keep.push_back(line);
  }
  in.close();
  if (dropped == 0) return 0;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const auto& l : keep) out << l << '\n';
    if (!out) throw DataError("timing CSV '" + path + "': cannot rewrite it (" + tmp + ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw DataError("timing CSV '" + path + "': cannot rename " + tmp + " over it");
  return dropped;
}
}  // namespace

struct TimingLog::Impl {
  comm::Communicator world;
  Handle file, steps, restarts, trace, sources, rtype, stype, ttype, srctype;  // closed in reverse order, file last
  std::string h5_path;
  std::ofstream csv;

  void open_existing(const std::string& h5_path);
  void create(const std::string& h5_path);
  void open_csv(const std::string& csv_path);
};

void TimingLog::Impl::open_existing(const std::string& h5_path) {
  h5::Quiet quiet;
  file = Handle(H5Fopen(h5_path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  if (!file.valid()) throw DataError("timing log '" + h5_path + "' exists but is not an HDF5 file");
  steps = Handle(H5Dopen2(file.get(), "/steps", H5P_DEFAULT));
  restarts = Handle(H5Dopen2(file.get(), "/restarts", H5P_DEFAULT));
  if (!steps.valid() || !restarts.valid())
    throw DataError("timing log '" + h5_path + "' exists but lacks /steps or /restarts");
  int ver = 0;
  Handle a(H5Aopen(file.get(), "format_version", H5P_DEFAULT));
  if (a.valid() && H5Aread(a.get(), H5T_NATIVE_INT, &ver) < 0) ver = 0;
  H5Eclear2(H5E_DEFAULT);
  if (ver != kFormatVersion)
    throw DataError("timing log '" + h5_path + "' has format_version " + std::to_string(ver) +
                    "; this wlb4d appends only to version " + std::to_string(kFormatVersion) +
                    " (set log.timing_file to a new file)");
}

void TimingLog::Impl::create(const std::string& h5_path) {
  {
    h5::Quiet quiet;
    file = Handle(H5Fcreate(h5_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  }
  if (!file.valid()) {
    // H5Fcreate leaves errno from its open(2): the cause, not HDF5's stack.
    const int e = errno;
    throw DataError("timing log '" + h5_path + "' cannot be created" + (e ? std::string(": ") + std::strerror(e) : ""));
  }
  steps = create_table(file.get(), h5_path, "/steps", rtype.get());
  restarts = create_table(file.get(), h5_path, "/restarts", stype.get());
  h5::write_attr_string(file.get(), "format", "wlb4d-timing", h5_path, h5::StrKind::FixedAscii);
  const int ver = kFormatVersion;
  h5::write_attr(file.get(), "format_version", H5T_NATIVE_INT, &ver, 1, true, h5_path);
}

void TimingLog::Impl::open_csv(const std::string& csv_path) {
  const bool fresh = !file_exists(csv_path);
  csv.open(csv_path, std::ios::app);
  if (!csv) throw DataError("timing CSV '" + csv_path + "' cannot be opened for writing");
  csv.precision(17);  // max_digits10 of double: the CSV round-trips to the HDF5 value
  if (fresh) write_csv_header(csv);
}

TimingLog::TimingLog(const std::string& h5_path, const std::string& csv_path, const comm::Communicator& world,
                     const RestartRecord& restart, const RunIdentity& id)
    : impl_(std::make_unique<Impl>()) {
  impl_->world = world;
  if (world.rank() != 0) return;
  if (!h5_path.empty()) {
    impl_->h5_path = h5_path;
    impl_->rtype = record_type();
    impl_->stype = restart_type();
    impl_->ttype = trace_type();
    if (file_exists(h5_path)) {
      impl_->open_existing(h5_path);
      // Steps this start runs again (a resume from a checkpoint older than
      // the last logged step) replace the earlier rows: each step once.
      Handle sp(H5Dget_space(impl_->steps.get()));
      hsize_t n[1] = {0};
      H5Sget_simple_extent_dims(sp.get(), n, nullptr);
      hsize_t keep[1] = {rows_before(impl_->steps.get(), restart.step)};
      if (keep[0] < n[0]) {
        if (H5Dset_extent(impl_->steps.get(), keep) < 0)
          throw DataError("timing log '" + h5_path + "': cannot drop the rows of the steps run again");
        spdlog::info("timing log {}: {} rows with step >= {} (run again by this start) dropped", h5_path,
                     n[0] - keep[0], restart.step);
      }
      {
        h5::Quiet quiet;
        if (H5Lexists(impl_->file.get(), "/sources", H5P_DEFAULT) > 0)
          impl_->sources = Handle(H5Dopen2(impl_->file.get(), "/sources", H5P_DEFAULT));
      }
      if (impl_->sources.valid()) {  // the same for the blend's rows
        hsize_t k[1] = {rows_before(impl_->sources.get(), restart.step)};
        if (H5Dset_extent(impl_->sources.get(), k) < 0)
          throw DataError("timing log '" + h5_path + "': cannot drop the /sources rows of the steps run again");
      }
    } else {
      impl_->create(h5_path);
    }
    append_rows(impl_->restarts.get(), impl_->stype.get(), &restart, 1);
    const hid_t root = impl_->file.get();
    set_attr_string(root, "deck", id.deck, h5_path);
    set_attr_string(root, "program_version", id.program_version, h5_path);
    set_attr_string(root, "start_time", id.start_time, h5_path);
    set_attr_string(root, "layout", id.layout, h5_path);
    for (const char* a : {"world_size", "peak_tflops"}) {
      h5::Quiet quiet;
      if (H5Aexists(root, a) > 0) H5Adelete(root, a);
    }
    h5::write_attr(root, "world_size", H5T_NATIVE_INT32, &id.world_size, 1, true, h5_path);
    h5::write_attr(root, "peak_tflops", H5T_NATIVE_DOUBLE, &id.peak_tflops, 1, true, h5_path);
    H5Fflush(impl_->file.get(), H5F_SCOPE_LOCAL);
  }
  if (!csv_path.empty()) {
    if (file_exists(csv_path)) {
      // Appending rows under another version's header would shift every column.
      std::ostringstream want;
      write_csv_header(want);
      std::string have;
      std::ifstream existing(csv_path);
      std::getline(existing, have);
      if (!have.empty() && have + "\n" != want.str())
        throw DataError("timing CSV '" + csv_path + "' has other columns than this wlb4d writes (a file of another "
                        "version): move it away or set log.csv_file to a new file");
      const std::size_t dropped = truncate_csv(csv_path, restart.step);
      if (dropped > 0)
        spdlog::info("timing CSV {}: {} rows with step >= {} (run again by this start) dropped", csv_path,
                     dropped, restart.step);
    }
    impl_->open_csv(csv_path);
  }
}

TimingLog::~TimingLog() = default;

namespace {
/// "" when `path` (deck key `key`) can be written, else the reason.
std::string log_path_problem(const char* key, const std::string& path) {
  if (path.empty()) return "";
  const std::string pre = std::string(key) + "='" + path + "': ";
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return pre + "is a directory (it names the log file)";
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND);
    if (fd < 0) return pre + "exists but cannot be written: " + std::strerror(errno);
    ::close(fd);
    return "";
  }
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  if (::stat(dir.c_str(), &st) != 0)
    return pre + "folder '" + dir + "' does not exist (the trainer does not create log files' folders): " +
           std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return pre + "'" + dir + "' is not a directory";
  const std::string probe = dir + "/.wlb4d-probe-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) return pre + "folder '" + dir + "' is not writable: " + std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}
}  // namespace

void check_log_file_paths(const std::vector<std::pair<std::string, std::string>>& key_paths,
                          const comm::Communicator& world) {
  std::string err;
  if (world.rank() == 0)
    for (const auto& [key, path] : key_paths)
      if (err.empty()) err = log_path_problem(key.c_str(), path);
  err = comm::agree(world, err);
  if (!err.empty()) throw DataError(err);
}

void check_timing_log_paths(const std::string& timing_file, const std::string& csv_file,
                            const comm::Communicator& world) {
  check_log_file_paths({{"log.timing_file", timing_file}, {"log.csv_file", csv_file}}, world);
}

std::vector<TimingRecord> TimingLog::append(const TimingRecord& mine) {
  const auto& w = impl_->world;
  std::vector<TimingRecord> all(w.size());
  w.allgather(reinterpret_cast<const char*>(&mine), reinterpret_cast<char*>(all.data()), sizeof(TimingRecord));
  if (w.rank() == 0) {
    if (impl_->file.valid()) {
      const h5::ApiLock lock(h5::api_mutex());  // an asynchronous checkpoint writer may be using HDF5
      append_rows(impl_->steps.get(), impl_->rtype.get(), all.data(), all.size());
      H5Fflush(impl_->file.get(), H5F_SCOPE_LOCAL);
    }
    if (impl_->csv.is_open()) {
      for (const auto& r : all) write_csv_row(impl_->csv, r);
      impl_->csv.flush();
    }
  }
  return all;
}

std::vector<TraceRecord> TimingLog::append_trace(const std::vector<TraceRecord>& mine, const std::string& kind_names) {
  const auto& w = impl_->world;
  // Bytes per rank: TraceRecord is POD, gathered like /steps' records.
  const int my_bytes = int(mine.size() * sizeof(TraceRecord));
  std::vector<int> counts(std::size_t(w.size()), 0), displs(std::size_t(w.size()), 0);
  w.allgather(&my_bytes, counts.data(), 1);
  int total = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    displs[r] = total;
    total += counts[r];
  }
  std::vector<TraceRecord> all(std::size_t(total) / sizeof(TraceRecord));
  w.allgatherv(reinterpret_cast<const char*>(mine.data()), std::size_t(my_bytes), reinterpret_cast<char*>(all.data()),
               counts, displs);
  if (w.rank() != 0) return {};
  if (impl_->file.valid() && !all.empty()) {
    const h5::ApiLock lock(h5::api_mutex());
    auto& I = *impl_;
    if (!I.trace.valid()) {
      h5::Quiet quiet;
      if (H5Lexists(I.file.get(), "/trace", H5P_DEFAULT) > 0) I.trace = Handle(H5Dopen2(I.file.get(), "/trace", H5P_DEFAULT));
    }
    if (!I.trace.valid()) I.trace = create_table(I.file.get(), I.h5_path, "/trace", I.ttype.get());
    set_attr_string(I.trace.get(), "kind_names", kind_names, I.h5_path);
    append_rows(I.trace.get(), I.ttype.get(), all.data(), all.size());
    H5Fflush(I.file.get(), H5F_SCOPE_LOCAL);
  }
  return all;
}

void TimingLog::append_sources(const std::vector<SourceRecord>& rows) {
  auto& I = *impl_;
  if (I.world.rank() != 0 || !I.file.valid() || rows.empty()) return;
  if (!I.srctype.valid()) I.srctype = source_type();
  if (!I.sources.valid()) I.sources = create_table(I.file.get(), I.h5_path, "/sources", I.srctype.get());
  append_rows(I.sources.get(), I.srctype.get(), rows.data(), rows.size());
}

std::vector<SourceRecord> TimingLog::read_sources(const std::string& path) {
  if (!has_dataset(path, "/sources")) return {};
  const Handle t = source_type();
  return read_table<SourceRecord>(path, "/sources", t.get());
}

std::vector<TraceRecord> TimingLog::read_trace(const std::string& path) {
  if (!has_dataset(path, "/trace")) return {};
  const Handle t = trace_type();
  return read_table<TraceRecord>(path, "/trace", t.get());
}

std::vector<TimingRecord> TimingLog::read_steps(const std::string& path) {
  const Handle t = record_type();
  return read_table<TimingRecord>(path, "/steps", t.get());
}

std::vector<RestartRecord> TimingLog::read_restarts(const std::string& path) {
  const Handle t = restart_type();
  return read_table<RestartRecord>(path, "/restarts", t.get());
}

}  // namespace wlb::io
