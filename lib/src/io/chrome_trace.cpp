// The traced step as Chrome trace-event JSON (chrome_trace.hpp).
#include "wlb4d/io/chrome_trace.hpp"

#include "wlb4d/core/error.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

namespace wlb::io {

namespace {

using nlohmann::json;

constexpr int kTidPhases = 1, kTidPipeline = 2, kTidTp = 3, kTidCp = 4;

std::vector<std::string> split_names(const std::string& s) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    const std::size_t c = s.find(',', pos);
    out.push_back(s.substr(pos, c == std::string::npos ? std::string::npos : c - pos));
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  return out;
}

bool is_message(const std::string& k) { return k.rfind("Send", 0) == 0 || k.rfind("Recv", 0) == 0; }

const char* category(const std::string& k, int tid) {
  switch (tid) {
    case kTidPhases: return "phase";
    case kTidTp: return "tp";
    case kTidCp: return "cp";
    default: return is_message(k) ? "p2p" : "compute";
  }
}

const char* track_name(int tid) {
  switch (tid) {
    case kTidPhases: return "step phases";
    case kTidTp: return "TP collectives";
    case kTidCp: return "CP exchange";
    default: return "pipeline";
  }
}

json metadata(const char* name, int pid, int tid, json args) {
  return json{{"name", name}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", std::move(args)}};
}

}  // namespace

int chrome_trace_tid(const std::string& k) {
  static const std::set<std::string> phases = {"plan",      "data", "forward_backward", "dp_reduce",
                                               "optimizer", "eval", "checkpoint",       "sample"};
  if (phases.count(k)) return kTidPhases;
  if (k == "tp_comm") return kTidTp;
  if (k == "cp_comm") return kTidCp;
  return kTidPipeline;
}

std::string chrome_trace_json(const std::vector<TraceRecord>& rows, const std::string& kind_names,
                              const std::vector<RankCoords>& ranks, const RunIdentity& id) {
  const auto names = split_names(kind_names);
  std::map<int, RankCoords> coords;
  for (const auto& r : ranks) coords[r.rank] = r;
  std::map<int, std::set<int>> tracks;  // rank -> tids used
  json events = json::array();
  std::int64_t step = -1;
  for (const auto& r : rows) {
    if (r.kind < 0 || std::size_t(r.kind) >= names.size())
      throw core::InternalError("chrome trace: /trace kind " + std::to_string(r.kind) + " has no name in '" +
                                kind_names + "'");
    const std::string& k = names[std::size_t(r.kind)];
    const int tid = chrome_trace_tid(k);
    tracks[r.rank].insert(tid);
    step = r.step;
    json args = {{"stage", r.stage}};
    if (r.micro_batch >= 0) args["micro_batch"] = r.micro_batch;
    if (r.virtual_stage >= 0 && tid != kTidPhases) args["virtual_stage"] = r.virtual_stage;
    if (r.peer >= 0) args["peer"] = r.peer;
    // dur as the difference of the two scaled ends: ts + dur is t1·1e6 to
    // the last bit a reader of /trace computes.
    const double ts = r.t0 * 1e6, end = r.t1 * 1e6;
    events.push_back(json{{"name", k},
                          {"cat", category(k, tid)},
                          {"ph", "X"},
                          {"ts", ts},
                          {"dur", std::max(0.0, end - ts)},
                          {"pid", r.rank},
                          {"tid", tid},
                          {"args", std::move(args)}});
  }
  json meta = json::array();
  for (const auto& [rank, tids] : tracks) {
    const auto it = coords.find(rank);
    const std::string pname =
        it == coords.end()
            ? "rank " + std::to_string(rank)
            : "rank " + std::to_string(rank) + " (dp " + std::to_string(it->second.dp) + ", pp " +
                  std::to_string(it->second.pp) + ", cp " + std::to_string(it->second.cp) + ", tp " +
                  std::to_string(it->second.tp) + ")";
    meta.push_back(metadata("process_name", rank, 0, {{"name", pname}}));
    meta.push_back(metadata("process_sort_index", rank, 0, {{"sort_index", rank}}));
    for (int tid : tids) {
      meta.push_back(metadata("thread_name", rank, tid, {{"name", track_name(tid)}}));
      meta.push_back(metadata("thread_sort_index", rank, tid, {{"sort_index", tid}}));
    }
  }
  for (auto& e : events) meta.push_back(std::move(e));
  json doc = {{"traceEvents", std::move(meta)},
              {"displayTimeUnit", "ms"},
              {"otherData",
               {{"program", "wlb4d"},
                {"step", step + 1},
                {"deck", id.deck},
                {"program_version", id.program_version},
                {"start_time", id.start_time},
                {"layout", id.layout},
                {"world_size", id.world_size}}}};
  // error_handler::replace: a deck path with invalid UTF-8 must not throw here.
  return doc.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

void write_chrome_trace(const std::string& path, const std::vector<TraceRecord>& rows, const std::string& kind_names,
                        const std::vector<RankCoords>& ranks, const RunIdentity& id) {
  const std::string text = chrome_trace_json(rows, kind_names, ranks, id);
  const std::string tmp = path + ".tmp";
  const auto fail = [&](const std::string& what) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw core::DataError("log.trace_json='" + path + "': cannot write " + what + ": " + why);
  };
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("'" + tmp + "'");
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) fail("'" + tmp + "'");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("(rename from '" + tmp + "')");
}

std::string default_trace_json_path(const std::string& timing_file) {
  if (timing_file.empty()) return "";
  const auto slash = timing_file.find_last_of('/');
  const auto dot = timing_file.find_last_of('.');
  if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) {
    std::string ext = timing_file.substr(dot);
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    if (ext == ".h5" || ext == ".hdf5" || ext == ".hdf") return timing_file.substr(0, dot) + ".trace.json";
  }
  return timing_file + ".trace.json";
}

}  // namespace wlb::io
