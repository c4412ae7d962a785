// Checkpoint file-system layer (checkpoint.hpp): directories, fsync,
// tmp+rename commit, the `latest` list, retention, listing and the choice of
// the checkpoint to resume from.
#include "checkpoint_detail.hpp"
#include "wlb4d/core/fault.hpp"

#include <spdlog/spdlog.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>

namespace wlb::io {

namespace ckpt {

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

std::uint64_t free_bytes(const std::string& dir, bool injectable) {
  if (const long long injected = core::fault_free_bytes(); injectable && injected >= 0)  // tests (WLB4D_FAULT)
    return std::uint64_t(injected);
  struct statvfs sv {};
  if (::statvfs(dir.c_str(), &sv) != 0) return UINT64_MAX;  // unknown: do not refuse
  return std::uint64_t(sv.f_bavail) * std::uint64_t(sv.f_frsize);
}

std::string space_note(const std::string& dir) {
  const std::uint64_t f = free_bytes(dir, /*injectable=*/false);  // the cause of a failure: the real figure
  if (f == UINT64_MAX) return "";
  return " (" + std::to_string(f >> 10) + " KiB free in " + dir + (f < (1u << 20) ? ": no space left on device)" : ")");
}

void check_dir_for_checkpoints(const std::string& dir, std::uint64_t bytes) {
  mkdirs(dir);
  // Writable? Create and remove a probe file (access(W_OK) misses read-only mounts' EROFS on some systems).
  const std::string probe = join_path(dir, ".wlb4d-probe-" + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0)
    throw CheckpointError("checkpoint.dir='" + dir + "' is not writable: " + std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  const std::uint64_t f = free_bytes(dir, /*injectable=*/true);
  if (f != UINT64_MAX && f < bytes)
    throw CheckpointError("checkpoint.dir='" + dir + "': no space left on device for a checkpoint: it needs about " +
                          std::to_string((bytes + (1u << 20) - 1) >> 20) + " MiB, the file system has " +
                          std::to_string(f >> 20) + " MiB (" + std::to_string(f >> 10) + " KiB) free");
}

std::string reserve_space(const std::string& path, std::uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  if (fd < 0) return prefix(path) + "cannot open to reserve disk space: " + std::strerror(errno);
  struct stat st {};
  const off_t before = ::fstat(fd, &st) == 0 ? st.st_size : 0;
  int rc = 0;
  do {
    rc = ::fallocate(fd, 0, 0, off_t(bytes));
  } while (rc != 0 && errno == EINTR);
  const int e = rc == 0 ? 0 : errno;
  if (e != 0) (void)::ftruncate(fd, before);  // give back what a partial reservation took
  ::close(fd);
  if (e == 0 || e == EOPNOTSUPP || e == ENOSYS) return "";
  const auto slash = path.find_last_of('/');
  return prefix(path) + "cannot reserve " + std::to_string((bytes + (1u << 20) - 1) >> 20) +
         " MiB of disk space for the checkpoint: " +
         (e == ENOSPC ? std::string("no space left on device") : std::string(std::strerror(e))) +
         space_note(slash == std::string::npos ? "." : path.substr(0, slash));
}

namespace {
void fsync_path(const std::string& p, bool directory) {
  const int fd = ::open(p.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw CheckpointError("cannot open " + p + " to fsync: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0 && e != EINVAL) throw CheckpointError("fsync of " + p + " failed: " + std::strerror(e));
}

}  // namespace

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

namespace {
std::vector<std::string> read_latest_names(const std::string& dir) {
  std::ifstream in(join_path(dir, "latest"));
  std::vector<std::string> names;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty()) continue;
    // `latest` lists plain file names in DIR; anything else (an absolute path,
    // ../, a sub-folder) could resume another run's file.
    if (line.find('/') != std::string::npos || line == "." || line == "..")
      throw CheckpointError(join_path(dir, "latest") + " names '" + line +
                            "', which is not a file of checkpoint.dir (entries must be plain step_NNNNNN.h5 names)");
    names.push_back(line);
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

}  // namespace

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

namespace {
/// Rank 0's choice of resume candidates: 0 fresh start, 1 candidates in
/// *text (auto, newest first, one per line), 2 one explicit file in *text,
/// 3 error message in *text.
std::int64_t resume_candidates(const std::string& dir, const std::string& mode, std::string* out) {
  std::int64_t code = 0;
  std::string& text = *out;
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
  return code;
}
}  // namespace

}  // namespace ckpt

using namespace ckpt;

std::string checkpoint_path(const std::string& dir, std::int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "step_%06lld.h5", static_cast<long long>(step));
  return join_path(dir, buf);
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& n : ckpt::read_latest_names(dir)) out.push_back(join_path(dir, n));
  return out;
}

// ---- the checkpoint.dir lock -------------------------------------------------------------

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock (the kernel also does if the process dies)
}

void CheckpointDirLock::acquire(const std::string& dir, const comm::Communicator& world) {
  std::string err;
  if (world.rank() == 0) {
    try {
      ckpt::mkdirs(dir);
      path_ = join_path(dir, ".wlb4d.lock");
      fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT, 0644);
      if (fd_ < 0)
        throw CheckpointError("checkpoint.dir='" + dir + "' is not writable: cannot create " + path_ + ": " +
                              std::strerror(errno));
      struct flock fl {};
      fl.l_type = F_WRLCK;
      fl.l_whence = SEEK_SET;
      if (::fcntl(fd_, F_SETLK, &fl) != 0) {
        std::string holder(512, '\0');
        const ssize_t n = ::pread(fd_, &holder[0], holder.size(), 0);
        holder.resize(n > 0 ? std::size_t(n) : 0);
        while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
        ::close(fd_);
        fd_ = -1;
        throw CheckpointError("checkpoint.dir='" + dir + "' is in use by another run (" +
                              (holder.empty() ? std::string("holder unknown") : holder) +
                              "); two runs on one checkpoint.dir would overwrite each other's checkpoints and "
                              "`latest`: give this run its own checkpoint.dir, or stop the other one");
      }
      char host[256] = {0};
      ::gethostname(host, sizeof host - 1);
      const std::string me = "host " + std::string(host) + ", pid " + std::to_string(::getpid()) + ", started " +
                             std::to_string(std::time(nullptr)) + " (unix time)\n";
      if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != ssize_t(me.size()))
        spdlog::warn("checkpoint.dir lock {}: cannot record this run: {}", path_, std::strerror(errno));
    } catch (const CheckpointError& e) {
      err = e.what();
    }
  }
  err = comm::agree(world, err);
  if (!err.empty()) throw CheckpointError(err);
}

std::optional<std::string> resolve_resume(const std::string& dir, const std::string& mode,
                                          const comm::Communicator& world, std::vector<std::string>* skipped,
                                          const std::function<std::string(const std::string&)>& usable) {
  if (mode == "never") return std::nullopt;
  // Rank 0 decides the candidates: code 0 fresh start, 1 candidates (auto),
  // 2 one explicit file, 3 error.
  std::int64_t code = 0;
  std::string text;
  if (world.rank() == 0) {
    try {
      code = resume_candidates(dir, mode, &text);
    } catch (const CheckpointError& e) {  // e.g. a bad `latest`: every rank must hear it
      code = 3;
      text = e.what();
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
      if (usable) {
        std::string why;
        try {
          why = usable(cands[i]);
        } catch (const CheckpointError& e) {
          why = e.what();
        }
        why = comm::agree(world, why);
        if (!why.empty()) throw CheckpointError(why);
      }
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
