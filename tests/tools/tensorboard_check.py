#!/usr/bin/env python3
"""tensorboard_check.py — reads wlb4d's TensorBoard event files
(log.tensorboard_dir) without TensorFlow or protobuf, from the formats'
documentation, and checks them against the run's CSV timing log.

Usage: tensorboard_check.py TB_DIR CSV [--starts N] [--expect-tag TAG ...]
                             [--sources TIMING_H5 --source-tag TAG ...]

Written independently of lib/src/io/tensorboard.cpp, from:
  - TFRecord (https://www.tensorflow.org/tutorials/load_data/tfrecord,
    "TFRecords format details"): uint64 length, uint32 masked_crc32c(length),
    data, uint32 masked_crc32c(data), little-endian; masked_crc =
    ((crc >> 15) | (crc << 17)) + 0xa282ead8, crc = CRC-32C (Castagnoli,
    RFC 3720 §B.4; bitwise here, reflected polynomial 0x82F63B78);
  - protobuf's wire format (https://protobuf.dev/programming-guides/encoding/):
    a key varint (field << 3 | wire type), then a varint (0), 8 bytes (1), a
    varint length and bytes (2) or 4 bytes (5);
  - tensorboard/compat/proto/event.proto and summary.proto: Event {double
    wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
    SessionLog session_log = 7}, Summary {repeated Value value = 1}, Value
    {string tag = 1; float simple_value = 2}, SessionLog {status = 1; START = 1}.
Checked:
  - every file of TB_DIR named *tfevents*: every record's two CRCs, the
    length, every protobuf field decodable (no unknown wire types, no bytes
    left over), wall_time a plausible Unix time, non-decreasing;
  - each file starts with Event{file_version "brain.Event:2"}, then
    Event{session_log START} at the first step its start runs, then one
    Event{summary} per step with strictly increasing steps;
  - the files, in name order, merged as TensorBoard does (a START in a later
    file drops the points at steps >= its step), give exactly the CSV's steps
    (CSV step + 1), and each step's tags and float32 values equal the CSV's
    columns (rank rows of the step): train/loss, train/lr, train/grad_norm,
    train/tokens_per_s = tokens / max t_total, train/mfu (when mfu >= 0),
    val/loss (when val_loss >= 0), mem/peak_rss_mib = max rss_mib,
    balance/imbalance_attn, balance/imbalance_lat, balance/imbalance_cpu =
    max/mean compute_cpu, balance/core_attn_before/after (when
    ca_imbalance_before > 0), comm/{dp,tp}_{exposed,in_flight}_ms = max * 1e3,
    time/step_ms = max t_total * 1e3, time/{eval,checkpoint,sample}_ms when > 0,
    time/checkpoint_write_ms = max ckpt_write * 1e3 when > 0;
  - --starts N: N event files; --expect-tag: the tag appears at some step;
    --guard: the loss-spike guard was on, so every step also has
    guard/skipped_steps = the CSV's skipped_steps;
  - --sources TIMING_H5 with --source-tag T1 --source-tag T2 ... (a blended
    data.train, tags in source order): every step also has
    data/source/<Ti>/tokens = the HDF5 timing log's /sources tokens of
    source i at that step, and data/source/<Ti>/drawn_share = its
    drawn_tokens / the step's drawn_tokens summed over the sources (read
    with h5py); no other data/source/ tag.
If the `tensorboard` package is importable, its EventAccumulator also reads
TB_DIR and must give the same scalars; otherwise that part is skipped (said
so). Exit 0 when all hold, 1 with the failures, 77 without numpy.
"""
import argparse
import csv
import glob
import os
import struct
import sys

try:
    import numpy as np
except ImportError:
    print("tensorboard_check: numpy not installed: skipped")
    sys.exit(77)


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    """Payloads of the TFRecord file, each CRC checked (ValueError otherwise)."""
    data = open(path, "rb").read()
    pos, out = 0, []
    while pos < len(data):
        if pos + 12 > len(data):
            raise ValueError(f"{path}: truncated record header at byte {pos}")
        head = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", head)
        (hcrc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if hcrc != masked(crc32c(head)):
            raise ValueError(f"{path}: record at byte {pos}: length CRC {hcrc:#010x}, computed "
                             f"{masked(crc32c(head)):#010x}")
        body = data[pos + 12:pos + 12 + length]
        if len(body) != length or pos + 16 + length > len(data):
            raise ValueError(f"{path}: record at byte {pos}: {length} bytes announced, file ends first")
        (dcrc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if dcrc != masked(crc32c(body)):
            raise ValueError(f"{path}: record at byte {pos}: data CRC {dcrc:#010x}, computed "
                             f"{masked(crc32c(body)):#010x}")
        out.append(body)
        pos += 16 + length
    return out


def varint(buf, pos):
    shift = value = 0
    while True:
        if pos >= len(buf):
            raise ValueError("varint runs past the message")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


def fields(buf):
    """[(field number, wire type, value)] of one message; value: int, bytes."""
    pos, out = 0, []
    while pos < len(buf):
        key, pos = varint(buf, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, pos = varint(buf, pos)
        elif wire == 1:
            v, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = varint(buf, pos)
            v, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            v, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"field {num}: wire type {wire} not used by Event")
        if pos > len(buf):
            raise ValueError(f"field {num} runs past the message")
        out.append((num, wire, v))
    return out


def decode_event(buf):
    """dict: wall_time, step, and one of file_version, session_status, scalars [(tag, float32)]."""
    ev = {"step": 0}
    for num, wire, v in fields(buf):
        if num == 1 and wire == 1:
            ev["wall_time"] = struct.unpack("<d", v)[0]
        elif num == 2 and wire == 0:
            ev["step"] = v - (1 << 64) if v >= 1 << 63 else v
        elif num == 3 and wire == 2:
            ev["file_version"] = v.decode()
        elif num == 5 and wire == 2:
            vals = []
            for n2, w2, value in fields(v):
                if (n2, w2) != (1, 2):
                    raise ValueError(f"Summary field {n2} (wire {w2}) is not `repeated Value value = 1`")
                tag, x = None, None
                for n3, w3, y in fields(value):
                    if (n3, w3) == (1, 2):
                        tag = y.decode()
                    elif (n3, w3) == (2, 5):
                        x = np.frombuffer(y, dtype="<f4")[0]
                    else:
                        raise ValueError(f"Value field {n3} (wire {w3}) is not tag = 1 / simple_value = 2")
                if tag is None or x is None:
                    raise ValueError("Value without tag or simple_value")
                vals.append((tag, x))
            ev["scalars"] = vals
        elif num == 7 and wire == 2:
            st = [y for n2, w2, y in fields(v) if (n2, w2) == (1, 0)]
            ev["session_status"] = st[0] if st else 0
        else:
            raise ValueError(f"Event field {num} (wire {wire}) not expected from wlb4d")
    if "wall_time" not in ev:
        raise ValueError("Event without wall_time")
    return ev


def source_expected(h5_path, tags):
    """{step (1-based): {tag: float32}} of a blend's per-source scalars, from /sources."""
    import h5py
    with h5py.File(h5_path, "r") as f:
        rows = f["sources"][:]
    out = {}
    for step in sorted(set(int(x) for x in rows["step"])):
        r = rows[rows["step"] == step]
        r = r[np.argsort(r["source"])]
        if [int(x) for x in r["source"]] != list(range(len(tags))):
            raise SystemExit(f"tensorboard_check: {h5_path} /sources step {step}: sources {list(r['source'])}, "
                             f"expected {len(tags)} (--source-tag)")
        drawn = int(r["drawn_tokens"].sum())
        e = {}
        for i, t in enumerate(tags):
            e[f"data/source/{t}/tokens"] = np.float32(float(r["tokens"][i]))
            e[f"data/source/{t}/drawn_share"] = np.float32(float(r["drawn_tokens"][i]) / drawn if drawn else 0.0)
        out[step + 1] = e
    return out


def expected(csv_path, guard=False):
    """{step (1-based): {tag: float32}} from the CSV timing log."""
    by_step = {}
    with open(csv_path) as f:
        for r in csv.DictReader(f):
            by_step.setdefault(int(r["step"]), []).append({k: float(v) for k, v in r.items()})
    out = {}
    for step, rows in sorted(by_step.items()):
        rows.sort(key=lambda r: r["rank"])
        r0 = rows[0]
        mx = lambda col: max(r.get(col, 0.0) for r in rows)
        ttot = mx("t_total")
        cpu = [r["compute_cpu"] for r in rows]
        csum = 0.0
        for c in cpu:
            csum += c
        e = {"train/loss": r0["loss"], "train/lr": r0["lr"], "train/grad_norm": r0["grad_norm"],
             "train/tokens_per_s": r0["tokens"] / ttot if ttot > 0 else 0.0,
             "mem/peak_rss_mib": mx("rss_mib"),
             "balance/imbalance_attn": r0["attn_imbalance"], "balance/imbalance_lat": r0["latency_imbalance"],
             "balance/imbalance_cpu": max(cpu) / (csum / len(cpu)) if csum > 0 else 1.0,
             "comm/dp_exposed_ms": mx("dp_exposed") * 1e3, "comm/dp_in_flight_ms": mx("dp_in_flight") * 1e3,
             "comm/tp_exposed_ms": mx("tp_exposed") * 1e3, "comm/tp_in_flight_ms": mx("tp_in_flight") * 1e3,
             "time/step_ms": ttot * 1e3}
        if r0["mfu"] >= 0:
            e["train/mfu"] = r0["mfu"]
        if guard:
            e["guard/skipped_steps"] = r0["skipped_steps"]
        if r0["val_loss"] >= 0:
            e["val/loss"] = r0["val_loss"]
        if mx("ca_imbalance_before") > 0:
            e["balance/core_attn_before"] = mx("ca_imbalance_before")
            e["balance/core_attn_after"] = mx("ca_imbalance")
        for col, tag in (("t_eval", "time/eval_ms"), ("t_checkpoint", "time/checkpoint_ms"),
                         ("ckpt_write", "time/checkpoint_write_ms"), ("t_sample", "time/sample_ms")):
            if mx(col) > 0:
                e[tag] = mx(col) * 1e3
        out[step + 1] = {k: np.float32(v) for k, v in e.items()}
    return out


def same(a, b):
    return (np.isnan(a) and np.isnan(b)) or a == b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tb_dir")
    ap.add_argument("csv")
    ap.add_argument("--starts", type=int)
    ap.add_argument("--expect-tag", action="append", default=[])
    ap.add_argument("--guard", action="store_true", help="train.skip_spike_z > 0: expect guard/skipped_steps")
    ap.add_argument("--sources", help="the run's HDF5 timing log: expect a blend's data/source/ scalars")
    ap.add_argument("--source-tag", action="append", default=[], help="the sources' tags, in source order")
    a = ap.parse_args()
    bad = []
    # The CRC itself, on RFC 3720's and the usual check value.
    for data, want in ((b"123456789", 0xE3069283), (bytes(32), 0x8A9136AA), (bytes([0xFF] * 32), 0x62A8AB43),
                       (bytes(range(32)), 0x46DD794E), (bytes(range(31, -1, -1)), 0x113FDB5C)):
        if crc32c(data) != want:
            print(f"tensorboard_check: this reader's CRC-32C is wrong on {data[:9]!r}...: {crc32c(data):#x}")
            return 1
    files = sorted(f for f in glob.glob(os.path.join(a.tb_dir, "*")) if "tfevents" in os.path.basename(f))
    if not files:
        print(f"tensorboard_check: no event file in {a.tb_dir}")
        return 1
    if a.starts is not None and len(files) != a.starts:
        bad.append(f"{len(files)} event files, expected {a.starts} (one per start)")
    merged, starts_seen, n_records = {}, 0, 0
    for path in files:
        name = os.path.basename(path)
        if not name.startswith("events.out.tfevents.") or not name.endswith(".wlb4d"):
            bad.append(f"{name}: not events.out.tfevents.<time>.<host>.<pid>.wlb4d")
        try:
            evs = [decode_event(p) for p in records(path)]
        except ValueError as e:
            bad.append(str(e))
            continue
        n_records += len(evs)
        if len(evs) < 2 or evs[0].get("file_version") != "brain.Event:2":
            bad.append(f"{name}: first record is not file_version brain.Event:2")
            continue
        if evs[1].get("session_status") != 1:
            bad.append(f"{name}: second record is not a SessionLog START")
            continue
        walls = [e["wall_time"] for e in evs]
        if any(w < 1.5e9 or w > 4.2e9 for w in walls) or walls != sorted(walls):
            bad.append(f"{name}: wall_time not increasing Unix seconds: {walls[:3]}...")
        start = evs[1]["step"]
        if starts_seen:  # TensorBoard ignores a run's first START; a later one is a restart
            merged = {s: v for s, v in merged.items() if s < start}
        starts_seen += 1
        prev = start - 1
        for e in evs[2:]:
            if "scalars" not in e:
                bad.append(f"{name}: step {e['step']}: an event without a summary after the START")
                continue
            if e["step"] <= prev:
                bad.append(f"{name}: step {e['step']} after step {prev}")
            prev = e["step"]
            merged[e["step"]] = dict(e["scalars"])
    want = expected(a.csv, a.guard)
    if a.sources:
        if not a.source_tag:
            print("tensorboard_check: --sources needs --source-tag for every source")
            return 1
        for step, e in source_expected(a.sources, a.source_tag).items():
            if step in want:
                want[step].update(e)
            else:
                bad.append(f"step {step} in {a.sources} /sources but not in the CSV")
    if sorted(merged) != sorted(want):
        bad.append(f"steps {sorted(merged)} in the event files, {sorted(want)} in the CSV (+1)")
    for step in sorted(set(merged) & set(want)):
        got, exp = merged[step], want[step]
        if set(got) != set(exp):
            bad.append(f"step {step}: tags {sorted(got)}, expected {sorted(exp)}")
        for tag in sorted(set(got) & set(exp)):
            if not same(got[tag], exp[tag]):
                bad.append(f"step {step}: {tag} = {got[tag]!r}, CSV gives {exp[tag]!r}")
    for tag in a.expect_tag:
        if not any(tag in v for v in merged.values()):
            bad.append(f"tag {tag} at no step")
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError:
        print("tensorboard_check: the tensorboard package is not importable: its own reader skipped")
    else:
        acc = event_accumulator.EventAccumulator(a.tb_dir, size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            for ev in acc.Scalars(tag):
                exp = merged.get(ev.step, {}).get(tag)
                if exp is None or not same(np.float32(ev.value), exp):
                    bad.append(f"tensorboard's reader: {tag} at step {ev.step} = {ev.value}, this reader {exp}")
        n_tb = sum(len(acc.Scalars(t)) for t in acc.Tags()["scalars"])
        if n_tb != sum(len(v) for v in merged.values()):
            bad.append(f"tensorboard's reader: {n_tb} points, this reader {sum(len(v) for v in merged.values())}")
        print(f"tensorboard_check: tensorboard's EventAccumulator read {n_tb} points")
    for b in bad[:40]:
        print("tensorboard_check: " + b)
    print(f"tensorboard_check: {len(files)} files, {n_records} records, {len(merged)} steps, "
          f"{sum(len(v) for v in merged.values())} scalars, {len(bad)} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
