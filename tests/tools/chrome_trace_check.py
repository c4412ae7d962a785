#!/usr/bin/env python3
"""chrome_trace_check.py — checks wlb4d's Chrome trace JSON (log.trace_json)
against the Trace Event Format and against the timing log's /trace rows.

Usage: chrome_trace_check.py TRACE.json TIMING.h5 [--expect NAME ...]

Format rules (Trace Event Format, "JSON Object Format";
https://docs.google.com/document/d/1CvAClvFfyA2R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU):
  - the file is a JSON object with a "traceEvents" list;
  - every event has "name" (string), "ph", "pid" and "tid" (integers); "ph"
    is "X" (complete) or "M" (metadata), the only phases wlb4d writes;
  - an X event has "ts" and "dur" (numbers, microseconds), dur >= 0, and
    "cat" (string); "args", when present, is an object;
  - an M event is process_name / process_sort_index / thread_name /
    thread_sort_index with the matching "args" key (name / sort_index);
  - every pid has a process_name "rank R (dp d, pp p, cp c, tp t)" with
    R = pid and the grid coordinates of the HDF5's /steps rows of that rank;
    every (pid, tid) with slices has a thread_name;
  - per (pid, tid), slices do not overlap (a track is one thread's sequence).
Equality with /trace (read with h5py): the X events and the /trace rows of
the traced step are the same multiset of (rank = pid, kind name = name,
micro_batch, ts = t0 * 1e6, ts + dur = t1 * 1e6 to 1e-9 relative), the
micro_batch taken from args (absent for the step phases, -1 in /trace).
--expect NAME: at least one slice of that name on every rank.
Exit 0 when all hold, 1 with the failures, 77 without h5py.
"""
import argparse
import json
import re
import sys
from collections import Counter, defaultdict

try:
    import h5py
except ImportError:
    print("chrome_trace_check: h5py not installed: skipped")
    sys.exit(77)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("timing")
    ap.add_argument("--expect", action="append", default=[])
    a = ap.parse_args()
    bad = []
    with open(a.trace) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        print("chrome_trace_check: not a JSON object with a traceEvents list")
        return 1
    evs = doc["traceEvents"]
    slices, pnames, tnames = [], {}, set()
    for i, e in enumerate(evs):
        where = f"event {i} ({e.get('name')!r})"
        if not isinstance(e.get("name"), str) or e.get("ph") not in ("X", "M"):
            bad.append(f"{where}: name must be a string and ph X or M, got ph {e.get('ph')!r}")
            continue
        if not isinstance(e.get("pid"), int) or not isinstance(e.get("tid"), int):
            bad.append(f"{where}: pid and tid must be integers")
            continue
        if "args" in e and not isinstance(e["args"], dict):
            bad.append(f"{where}: args is not an object")
            continue
        if e["ph"] == "M":
            key = {"process_name": "name", "thread_name": "name", "process_sort_index": "sort_index",
                   "thread_sort_index": "sort_index"}.get(e["name"])
            if key is None or key not in e.get("args", {}):
                bad.append(f"{where}: metadata {e['name']} without args.{key}")
                continue
            if e["name"] == "process_name":
                pnames[e["pid"]] = e["args"]["name"]
            if e["name"] == "thread_name":
                tnames.add((e["pid"], e["tid"]))
            continue
        if not all(isinstance(e.get(k), (int, float)) for k in ("ts", "dur")) or not isinstance(e.get("cat"), str):
            bad.append(f"{where}: a complete event needs numeric ts, dur and a string cat")
            continue
        if e["dur"] < 0:
            bad.append(f"{where}: negative duration {e['dur']}")
        slices.append(e)
    # Process names against /steps' grid coordinates; thread names.
    with h5py.File(a.timing, "r") as f:
        t = f["trace"][()]
        names = f["trace"].attrs["kind_names"]
        names = (names.decode() if isinstance(names, bytes) else str(names)).split(",")
        steps = f["steps"][()]
    coords = {int(r["rank"]): (int(r["dp"]), int(r["pp"]), int(r["cp"]), int(r["tp"])) for r in steps}
    for pid in sorted({e["pid"] for e in slices}):
        m = re.fullmatch(r"rank (\d+) \(dp (\d+), pp (\d+), cp (\d+), tp (\d+)\)", pnames.get(pid, ""))
        if not m:
            bad.append(f"pid {pid}: process name {pnames.get(pid)!r}, expected 'rank R (dp d, pp p, cp c, tp t)'")
        elif int(m.group(1)) != pid or tuple(int(x) for x in m.groups()[1:]) != coords.get(pid):
            bad.append(f"pid {pid}: process name {pnames[pid]!r}, /steps has coordinates {coords.get(pid)}")
    for key in sorted({(e["pid"], e["tid"]) for e in slices}):
        if key not in tnames:
            bad.append(f"pid {key[0]} tid {key[1]}: no thread_name")
    track = defaultdict(list)
    for e in slices:
        track[(e["pid"], e["tid"])].append(e)
    for key, xs in track.items():
        xs.sort(key=lambda e: e["ts"])
        for x, y in zip(xs, xs[1:]):
            if y["ts"] < x["ts"] + x["dur"] - 1e-3:  # 1 ns: rounding of the µs values
                bad.append(f"pid {key[0]} tid {key[1]}: {x['name']} [{x['ts']}, +{x['dur']}] overlaps {y['name']} "
                           f"at {y['ts']}")
    # Equality with /trace, row for row.
    traced = sorted(set(t["step"].tolist()))
    if len(traced) != 1:
        bad.append(f"/trace holds steps {traced}; this check expects one traced step")
    if doc.get("otherData", {}).get("step") != (traced[-1] + 1 if traced else None):
        bad.append(f"otherData.step {doc.get('otherData', {}).get('step')}, /trace's step {traced}")
    rows = [r for r in t if traced and r["step"] == traced[-1]]

    def close(x, y):
        return abs(x - y) <= 1e-9 * max(1.0, abs(y))

    from_h5 = Counter((int(r["rank"]), names[int(r["kind"])], int(r["micro_batch"])) for r in rows)
    from_json = Counter((e["pid"], e["name"], e.get("args", {}).get("micro_batch", -1)) for e in slices)
    if from_h5 != from_json:
        bad.append(f"slices differ from /trace rows: only in /trace {dict(from_h5 - from_json)}, "
                   f"only in the JSON {dict(from_json - from_h5)}")
    pool = defaultdict(list)
    for e in slices:
        pool[(e["pid"], e["name"], e.get("args", {}).get("micro_batch", -1))].append(e)
    unmatched = 0
    for r in rows:
        key = (int(r["rank"]), names[int(r["kind"])], int(r["micro_batch"]))
        t0, t1 = float(r["t0"]) * 1e6, float(r["t1"]) * 1e6
        hit = next((e for e in pool.get(key, []) if close(e["ts"], t0) and close(e["ts"] + e["dur"], t1)), None)
        if hit is None:
            unmatched += 1
            if unmatched <= 5:
                bad.append(f"/trace row {key} [{t0}, {t1}] µs has no slice with that ts and end")
        else:
            pool[key].remove(hit)
    for want in a.expect:
        for pid in sorted({e["pid"] for e in slices}):
            if not any(e["name"] == want and e["pid"] == pid for e in slices):
                bad.append(f"rank {pid}: no {want} slice")
    for b in bad[:40]:
        print("chrome_trace_check: " + b)
    print(f"chrome_trace_check: {len(slices)} slices on {len(track)} tracks of {len({e['pid'] for e in slices})} "
          f"ranks, {len(rows)} /trace rows, {len(bad)} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
