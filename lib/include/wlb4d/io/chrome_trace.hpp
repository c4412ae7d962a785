#pragma once
/// \file chrome_trace.hpp
/// \brief The traced step (log.trace_step) as a Chrome trace-event JSON file
/// (log.trace_json) that ui.perfetto.dev and chrome://tracing open offline.
///
/// Format: the "JSON Object Format" of the Trace Event Format
/// (https://docs.google.com/document/d/1CvAClvFfyA2R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU;
/// Perfetto's importer: https://perfetto.dev/docs/getting-started/other-formats):
///
///   { "traceEvents": [ ... ], "displayTimeUnit": "ms",
///     "otherData": { "program": "wlb4d", "step": N (1-based), deck,
///                    program_version, start_time, layout, world_size } }
///
/// One process per world rank (pid = rank) named "rank R (dp d, pp p, cp c,
/// tp t)" by a "process_name" metadata event ("ph": "M"; "process_sort_index"
/// = R orders them), with up to four threads (tracks), named by
/// "thread_name" metadata events:
///   tid 1 "step phases"      plan, data, forward_backward, dp_reduce,
///                            optimizer, eval, checkpoint, sample
///   tid 2 "pipeline"         F, B, W and the messages SendAct, RecvAct,
///                            SendGrad, RecvGrad (every other kind name)
///   tid 3 "TP collectives"   tp_comm: each blocking TP collective, and the
///                            wait of each nonblocking one
///   tid 4 "CP exchange"      cp_comm: each K/V all-gather / dK,dV
///                            reduce-scatter (permutes included)
/// Every /trace row is one complete event ("ph": "X") named by its kind,
/// "ts" = t0·1e6 and "dur" = t1·1e6 − t0·1e6 (microseconds from the traced
/// step's start, which begins at a world barrier), "cat" = phase | compute |
/// p2p | tp | cp, "args" = { stage, and micro_batch / virtual_stage when
/// the row has them (>= 0), peer for messages }. Slices of one track never
/// overlap (each track is a sequence of one thread's work).

#include "wlb4d/io/timing_log.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace wlb::io {

/// A rank's grid coordinates (its process name).
struct RankCoords {
  std::int32_t rank = 0, dp = 0, pp = 0, cp = 0, tp = 0;
};

/// The track (tid, see the file comment) of a /trace kind name.
int chrome_trace_tid(const std::string& kind_name);

/// The JSON text of `rows` (any ranks, one traced step), `kind_names` the
/// comma-separated names of their kind codes (/trace's attribute), `ranks`
/// the coordinates of every rank with rows (a rank missing from it is named
/// "rank R"), `id` the run (otherData).
/// \throws core::InternalError if a row's kind has no name.
std::string chrome_trace_json(const std::vector<TraceRecord>& rows, const std::string& kind_names,
                              const std::vector<RankCoords>& ranks, const RunIdentity& id);

/// Writes chrome_trace_json(...) to `path` (as path.tmp, renamed when
/// complete, so a viewer never opens half a file).
/// \throws core::DataError "log.trace_json='P': cannot write: <errno text>".
void write_chrome_trace(const std::string& path, const std::vector<TraceRecord>& rows, const std::string& kind_names,
                        const std::vector<RankCoords>& ranks, const RunIdentity& id);

/// log.trace_json = auto: the timing file's name with its extension (.h5,
/// .hdf5, .hdf) replaced by ".trace.json" ("runs/a/timing.h5" ->
/// "runs/a/timing.trace.json"; no such extension: ".trace.json" appended);
/// "" when `timing_file` is empty (no file).
std::string default_trace_json_path(const std::string& timing_file);

}  // namespace wlb::io
