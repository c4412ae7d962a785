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
  // A commit renames its list over DIR/latest, which a directory refuses:
  // refused now, not after the first checkpoint's write.
  if (is_dir(join_path(dir, "latest")))
    throw CheckpointError("checkpoint.dir='" + dir + "': " + join_path(dir, "latest") +
                          " is a directory, not the list of checkpoints (a regular file): remove or rename it");
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
/// step of "step_NNNNNN.h5" (suffix ".h5" or ".h5.tmp" per `tmp`), -1 otherwise.
std::int64_t parse_step_name(const std::string& name, bool tmp);

/// `s` shortened to 60 characters, control bytes as '?': a garbage `latest`
/// line quoted in a message must stay one readable line.
std::string quoted(const std::string& s) {
  std::string q;
  for (const char c : s.substr(0, 60)) q += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  return "'" + q + (s.size() > 60 ? "...'" : "'");
}

std::string file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}
}  // namespace

Latest read_latest(const std::string& dir) {
  Latest out;
  const std::string path = join_path(dir, "latest");
  const auto unusable = [&](const std::string& why) {
    out.state = Latest::kUnusable;
    out.problem = path + " " + why;
    return out;
  };
  struct stat lst {};
  if (::lstat(path.c_str(), &lst) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) {  // ENOTDIR: DIR is a file (wlb4d-ckpt FILE)
      out.problem = path + " is missing";
      return out;
    }
    return unusable("cannot be examined: " + std::string(std::strerror(errno)));
  }
  // O_NONBLOCK: a FIFO (or a symlink to one) must not block the open; the
  // type and size are then checked on the opened file, so what is read is
  // what was checked.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int e = errno;
    if (S_ISLNK(lst.st_mode) && e == ENOENT) return unusable("is a symbolic link to a missing file");
    return unusable("cannot be read: " + std::string(std::strerror(e)));
  }
  struct stat st {};
  const int rc = ::fstat(fd, &st);
  std::string text;
  std::string why;
  if (rc != 0) {
    why = "cannot be examined: " + std::string(std::strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    out.directory = S_ISDIR(st.st_mode);
    why = "is " + file_kind(st.st_mode) + (S_ISLNK(lst.st_mode) ? " (through a symbolic link)" : "") +
          ", not the list of checkpoints (a regular file)";
  } else if (st.st_size > kMaxLatestBytes) {
    why = "is " + std::to_string(st.st_size) + " bytes, more than the " + std::to_string(kMaxLatestBytes) +
          " a list of checkpoint names can be";
  } else {
    // At most kMaxLatestBytes + 1 bytes, whatever the file has become since fstat.
    text.resize(std::size_t(kMaxLatestBytes) + 1);
    std::size_t got = 0;
    while (got < text.size()) {
      const ssize_t n = ::read(fd, &text[got], text.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        why = "cannot be read: " + std::string(std::strerror(errno));
        break;
      }
      if (n == 0) break;
      got += std::size_t(n);
    }
    text.resize(got);
    if (why.empty() && got > std::size_t(kMaxLatestBytes))
      why = "grew past " + std::to_string(kMaxLatestBytes) + " bytes while being read";
  }
  ::close(fd);
  if (!why.empty()) return unusable(why);
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty()) continue;
    // `latest` lists plain step file names of DIR; anything else (an absolute
    // path, ../, a sub-folder) could resume another run's file, and binary
    // garbage is no list at all.
    if (line.find('/') != std::string::npos || line == "." || line == "..")
      return unusable("names " + quoted(line) +
                      ", which is not a file of checkpoint.dir (entries must be plain step_NNNNNN.h5 names)");
    if (parse_step_name(line, false) < 0)
      return unusable("holds " + quoted(line) + ", not a step_NNNNNN.h5 name");
    out.names.push_back(line);
  }
  if (out.names.empty()) return unusable("lists no checkpoint");
  out.state = Latest::kOk;
  return out;
}

namespace {
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

/// Names of the step files this process has committed (rank 0 commits): a
/// step file found at a commit's target and not in here belongs to someone else.
std::vector<std::string>& written_by_this_run() {
  static std::vector<std::string> paths;
  return paths;
}

}  // namespace

std::vector<std::string> step_files(const std::string& dir) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      const std::int64_t s = parse_step_name(n, false);
      if (s >= 0 && is_file(join_path(dir, n))) found.emplace_back(s, n);
    }
    ::closedir(d);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> names;
  for (auto& f : found) names.push_back(std::move(f.second));
  return names;
}

/// Rank 0's commit: rename tmp -> final, fsync, rewrite `latest`, retention.
void commit(const std::string& dir, const std::string& tmp, const std::string& final_path, std::int64_t step,
            int keep) {
  // A step file this run did not write (a newer checkpoint skipped as
  // unusable at resume, or one of the run an older checkpoint was resumed
  // from) is moved aside, not overwritten: it may be the only copy of that step.
  auto& mine = written_by_this_run();
  struct stat st {};
  if (::lstat(final_path.c_str(), &st) == 0 && std::find(mine.begin(), mine.end(), final_path) == mine.end()) {
    const std::string aside = final_path + ".replaced-" + std::to_string(std::time(nullptr));
    if (std::rename(final_path.c_str(), aside.c_str()) != 0)
      throw CheckpointError("cannot move " + final_path + " (not written by this run) aside to " + aside + ": " +
                            std::strerror(errno));
    spdlog::warn("checkpoint {} was not written by this run; it is kept as {} and this run's step {} takes its name",
                 final_path, aside, step);
  }
  if (std::rename(tmp.c_str(), final_path.c_str()) != 0)
    throw CheckpointError("cannot rename " + tmp + " to " + final_path + ": " + std::strerror(errno));
  mine.push_back(final_path);
  fsync_path(dir, true);
  const std::string me = base_name(final_path);
  std::vector<std::string> names{me};
  const Latest listed = read_latest(dir);
  // An unusable `latest` (this run fell back past it) lists nothing: the
  // older step files on disk are the retained ones, newest first.
  for (const auto& n : listed.state == Latest::kOk ? listed.names : step_files(dir))
    if (n != me && std::find(names.begin(), names.end(), n) == names.end() && is_file(join_path(dir, n)) &&
        (listed.state == Latest::kOk || parse_step_name(n, false) < step))
      names.push_back(n);
  const std::size_t k = std::size_t(std::max(keep, 1));
  std::vector<std::string> drop;
  if (names.size() > k) {
    drop.assign(names.begin() + std::ptrdiff_t(k), names.end());
    names.resize(k);
  }
  const std::string latest = join_path(dir, "latest"), latest_tmp = latest + ".tmp";
  ::unlink(latest_tmp.c_str());  // a leftover (or a symlink) is replaced, never written through
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
/// Rank 0's choice of resume candidates.
struct Candidates {
  std::int64_t code = 0;    ///< 0 fresh start, 1 candidates (newest first), 2 one explicit file, 3 error
  std::string text;         ///< 1: paths, one per line; 2: the file; 3: the message
  std::int64_t listed = 0;  ///< 1: how many of the candidates come from `latest` (the rest are step files found in DIR)
  std::string notice;       ///< 1: why `latest` was not used ("DIR/latest is missing", ...), "" when it was
};

Candidates resume_candidates(const std::string& dir, const std::string& mode) {
  Candidates c;
  const bool is_auto = mode == "auto";
  const std::string d = is_auto ? dir : mode;
  if (!is_auto && is_file(mode)) {
    c.code = 2;
    c.text = mode;
    return c;
  }
  if (!is_auto && !is_dir(mode)) {
    c.code = 3;
    c.text = "checkpoint.resume='" + mode + "': no such checkpoint file or directory";
    return c;
  }
  if (!is_dir(d)) return c;  // auto, no checkpoint.dir yet: a fresh start
  const Latest latest = read_latest(d);
  const std::vector<std::string> found = step_files(d);
  if (latest.state != Latest::kOk && !is_auto) {
    c.code = 3;
    c.text = "checkpoint.resume='" + mode + "': " +
             (latest.state == Latest::kMissing ? "directory has no 'latest' file (no complete checkpoint)"
                                               : latest.problem);
    return c;
  }
  if (latest.state == Latest::kOk) {
    for (const auto& n : latest.names) c.text += join_path(d, n) + "\n";
    c.listed = std::int64_t(latest.names.size());
  } else if (found.empty()) {
    // Nothing to lose: no step file. An unusable `latest` is replaced at the
    // first checkpoint (a directory is refused by check_dir_for_checkpoints).
    if (latest.state == Latest::kUnusable)
      spdlog::warn("checkpoint.resume=auto: {}; {} holds no step file: starting from step 0", latest.problem, d);
    return c;
  } else {
    c.notice = latest.problem;
  }
  // Step files `latest` does not list, newest first, after the listed ones:
  // a `latest` that is missing, unusable or names only damaged files does
  // not make resume=auto start over the checkpoints that are there.
  for (const auto& n : found)
    if (latest.state != Latest::kOk || std::find(latest.names.begin(), latest.names.end(), n) == latest.names.end())
      c.text += join_path(d, n) + "\n";
  c.code = 1;
  return c;
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
  const Latest latest = read_latest(dir);
  if (latest.state == Latest::kUnusable) throw CheckpointError(latest.problem);
  std::vector<std::string> out;
  for (const auto& n : latest.names) out.push_back(join_path(dir, n));
  return out;
}

std::vector<std::string> earlier_checkpoint_files(const std::string& dir) {
  std::vector<std::string> out;
  struct stat st {};
  if (::lstat(join_path(dir, "latest").c_str(), &st) == 0) out.push_back("latest");
  for (auto& n : step_files(dir)) out.push_back(std::move(n));
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
  // Rank 0 decides the candidates and broadcasts them: every rank takes the
  // same branch and hears the same error.
  Candidates c;
  if (world.rank() == 0) {
    try {
      c = resume_candidates(dir, mode);
    } catch (const CheckpointError& e) {
      c.code = 3;
      c.text = e.what();
    }
  }
  std::int64_t head[2] = {c.code, c.listed};
  world.broadcast(head, 2, 0);
  const std::int64_t code = head[0], listed = head[1];
  const std::string text = comm::bcast_string(world, c.text, 0);
  const std::string notice = comm::bcast_string(world, c.notice, 0);
  if (code == 0) return std::nullopt;
  if (code == 3) throw CheckpointError(text);
  if (code == 2) {
    verify_checkpoint(text, world);
    return text;
  }
  const std::string d = mode == "auto" ? dir : mode;
  const std::string latest_path = join_path(d, "latest");
  const auto cands = split_lines(text);
  const auto origin = [&](std::size_t i) {
    return std::int64_t(i) < listed ? std::string()
                                    : " (a step file of " + d + " that " + latest_path + " does not list)";
  };
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
      if (world.rank() == 0 && std::int64_t(i) >= listed)
        spdlog::warn("checkpoint.resume={}: {}; resuming from {}, the newest step file of {} that verifies", mode,
                     notice.empty() ? "no checkpoint listed in " + latest_path + " is usable" : notice, cands[i], d);
      return cands[i];
    } catch (const CheckpointError& e) {
      reasons.push_back(e.what());
      if (skipped) skipped->push_back(e.what());
      if (world.rank() == 0) {
        if (i + 1 < cands.size())
          spdlog::warn("checkpoint {} is unusable ({}); falling back to the previous checkpoint {}{}", cands[i],
                       e.what(), cands[i + 1], origin(i + 1));
        else
          spdlog::warn("checkpoint {} is unusable ({}); no older checkpoint is {}", cands[i], e.what(),
                       listed == std::int64_t(cands.size()) ? "listed" : "in " + d);
      }
    }
  }
  // Never a fresh start over step files that are there: the user decides.
  std::string msg = listed == std::int64_t(cands.size())
                        ? "no usable checkpoint among the " + std::to_string(cands.size()) + " listed in " + latest_path
                        : "no usable checkpoint among the " + std::to_string(cands.size()) + " step files of " + d +
                              (notice.empty() ? "" : " (" + notice + ")");
  msg += ":";
  for (const auto& r : reasons) msg += "\n  " + r;
  msg += "\n(move them out of " + d + " to start from step 0 there, or give this run another checkpoint.dir)";
  throw CheckpointError(msg);
}

}  // namespace wlb::io
