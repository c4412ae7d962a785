#!/usr/bin/env python3
"""check_trace.py — checks the /trace table of a wlb4d timing log
(log.trace_step) against the pipeline's rules, recomputed here.

Usage: check_trace.py LOG.h5 --step N --pp P --micro-batches M

For a schedule without virtual stages (gpipe, 1f1b, zb1) on P stages with M
micro-batches per DP replica, pipeline rank s runs M forwards (F), M
input-gradient backwards (B) and M weight-gradient backwards (W); it sends activations and receives gradients M times unless it
is the last stage, and receives activations and sends gradients M times unless
it is the first. /trace also holds, besides the pipeline actions, the TP/CP collectives inside
them (tp_comm, cp_comm) and the step's phases (plan, data, forward_backward,
dp_reduce, optimizer, eval, checkpoint, sample); the action rules below look
at the actions only. Checked:
  - rows only of step N-1 (0-based in the log), every world rank present;
  - per rank, the count of every action kind equals that action list's;
  - per rank, actions do not overlap in time (each starts after the previous
    one ended) and start at t0 >= 0;
  - per rank, each micro-batch's B starts after its F ended, its W after its B;
  - across stages (same clock on one node): F of micro-batch i on stage s+1
    does not start before F of i on stage s ended (5 ms skew allowed);
  - per rank, the phases plan, data, forward_backward, dp_reduce, optimizer
    are each present once, in that order, without overlap, and every action
    lies inside forward_backward;
  - per rank, every tp_comm / cp_comm row lies inside an action of its
    micro-batch and virtual stage;
  - with --expect-comm tp|cp: at least one such row on every rank.
Exit 0 when all hold, 1 with the failures, 77 when h5py is not installed.
"""
import argparse
import sys
from collections import Counter, defaultdict

try:
    import h5py
except ImportError:
    print("check_trace: h5py not installed: skipped")
    sys.exit(77)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--step", type=int, required=True)
    ap.add_argument("--pp", type=int, required=True)
    ap.add_argument("--micro-batches", type=int, required=True)
    ap.add_argument("--expect-comm", choices=["tp", "cp"], action="append", default=[])
    a = ap.parse_args()
    with h5py.File(a.log, "r") as f:
        if "trace" not in f:
            print(f"check_trace: {a.log} has no /trace")
            return 1
        t = f["trace"][()]
        names = f["trace"].attrs["kind_names"]
        names = (names.decode() if isinstance(names, bytes) else str(names)).split(",")
        world = int(f.attrs["world_size"])
    bad = []
    if set(t["step"].tolist()) != {a.step - 1}:
        bad.append(f"steps in /trace {sorted(set(t['step'].tolist()))}, expected [{a.step - 1}]")
    ranks = sorted(set(t["rank"].tolist()))
    if ranks != list(range(world)):
        bad.append(f"ranks in /trace {ranks}, expected 0..{world - 1}")
    m, p = a.micro_batches, a.pp
    f_end = defaultdict(dict)  # stage -> mb -> latest F end over the stage's ranks
    actions = {"F", "B", "W", "SendAct", "RecvAct", "SendGrad", "RecvGrad"}
    phase_order = ["plan", "data", "forward_backward", "dp_reduce", "optimizer"]
    for r in ranks:
        everything = sorted((x for x in t if x["rank"] == r), key=lambda x: x["t0"])
        rows = [x for x in everything if names[int(x["kind"])] in actions]
        phases = [x for x in everything if names[int(x["kind"])] in phase_order]
        comm = [x for x in everything if names[int(x["kind"])] in ("tp_comm", "cp_comm")]
        if phases or "plan" in names:  # a log of a trainer that records phases
            got_order = [names[int(x["kind"])] for x in phases]
            if got_order != phase_order:
                bad.append(f"rank {r}: phases {got_order}, expected {phase_order}")
            for x, y in zip(phases, phases[1:]):
                if y["t0"] < x["t1"] - 1e-9:
                    bad.append(f"rank {r}: phase {names[y['kind']]} starts before {names[x['kind']]} ended")
            fb = [x for x in phases if names[int(x["kind"])] == "forward_backward"]
            if fb:
                out = [x for x in rows if x["t0"] < fb[0]["t0"] - 1e-9 or x["t1"] > fb[0]["t1"] + 1e-9]
                if out:
                    bad.append(f"rank {r}: {len(out)} actions outside the forward_backward phase")
        for c in comm:
            home = [x for x in rows if x["micro_batch"] == c["micro_batch"] and
                    x["virtual_stage"] == c["virtual_stage"] and x["t0"] - 1e-9 <= c["t0"] and
                    c["t1"] <= x["t1"] + 1e-9]
            if not home:
                bad.append(f"rank {r}: {names[c['kind']]} [{c['t0']:.6f}, {c['t1']:.6f}] (mb={c['micro_batch']}) "
                           f"lies in no action of its micro-batch")
        for want_comm in a.expect_comm:
            if not any(names[int(c["kind"])] == want_comm + "_comm" for c in comm):
                bad.append(f"rank {r}: no {want_comm}_comm rows")
        stage = int(rows[0]["stage"])
        want = Counter({"F": m, "B": m, "W": m})
        if stage < p - 1:
            want.update({"SendAct": m, "RecvGrad": m})
        if stage > 0:
            want.update({"RecvAct": m, "SendGrad": m})
        got = Counter(names[int(x["kind"])] for x in rows)
        if got != want:
            bad.append(f"rank {r} (stage {stage}): actions {dict(got)}, expected {dict(want)}")
        if rows[0]["t0"] < 0:
            bad.append(f"rank {r}: first action starts at {rows[0]['t0']}")
        for x, y in zip(rows, rows[1:]):
            if y["t0"] < x["t1"] - 1e-9:
                bad.append(f"rank {r}: {names[x['kind']]}(mb={x['micro_batch']}) [{x['t0']:.6f}, {x['t1']:.6f}] "
                           f"overlaps {names[y['kind']]}(mb={y['micro_batch']}) from {y['t0']:.6f}")
        fw = {int(x["micro_batch"]): x for x in rows if names[x["kind"]] == "F"}
        for x in rows:
            if names[x["kind"]] != "B":
                continue
            mb = int(x["micro_batch"])
            if mb not in fw or x["t0"] < fw[mb]["t1"]:
                bad.append(f"rank {r}: B(mb={mb}) at {x['t0']:.6f} before its F ended")
        bw = {int(x["micro_batch"]): x for x in rows if names[x["kind"]] == "B"}
        for x in rows:
            if names[x["kind"]] != "W":
                continue
            mb = int(x["micro_batch"])
            if mb not in bw or x["t0"] < bw[mb]["t1"]:
                bad.append(f"rank {r}: W(mb={mb}) at {x['t0']:.6f} before its B ended")
        for mb, x in fw.items():
            f_end[stage][mb] = max(f_end[stage].get(mb, 0.0), float(x["t1"]))
            if stage > 0 and mb in f_end.get(stage - 1, {}) and x["t0"] < f_end[stage - 1][mb] - 0.005:
                bad.append(f"rank {r}: F(mb={mb}) on stage {stage} starts at {x['t0']:.6f}, before stage "
                           f"{stage - 1} finished it at {f_end[stage - 1][mb]:.6f}")
    for b in bad:
        print("check_trace: " + b)
    print(f"check_trace: {len(t)} rows on {len(ranks)} ranks, {len(bad)} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
