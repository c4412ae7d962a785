#!/usr/bin/python3
"""plot_timing.py — summarise and plot a wlb4d timing log (log.timing_file).

Usage: scripts/plot_timing.py TIMING.h5 [-o OUT.png]

Reads the table io::TimingLog writes (lib/include/wlb4d/io/timing_log.hpp):
  /steps     one row per (step, rank): step, rank, dp, pp, cp, tp,
             t_<category> (seconds: plan, data, forward, backward, p2p_wait,
             tp_comm, cp_comm, dp_reduce, optimizer, checkpoint, eval, total),
             loss, val_loss (-1: none), grad_norm, lr, tokens (whole step),
             local_tokens, gflops (whole job, this step), attn_imbalance,
             latency_imbalance, cp_imbalance, delay_mean, delay_max,
             compute_cpu (process CPU seconds of forward+backward, comm excluded),
             mem_predicted, mem_measured, mem_rss (bytes: memory model, Kokkos
             high-water mark so far, peak RSS so far; format_version 3)
  /restarts  one row per start of the trainer: step, dp, pp, cp, tp, unix_time,
             cost_a, cost_b, cost_c, cost_calibrated (the balancing cost model)
After a resume from an older checkpoint a step can appear twice; the last
rows written for a (step, rank) win.

Prints a summary:
  median step time   median over steps of the step's wall time (max over ranks of t_total)
  tokens/s           Σ tokens / Σ step time
  achieved GFLOP/s   Σ (gflops · step time) / Σ step time   (model FLOP, whole job)
  bubble share       Σ t_p2p_wait / Σ t_total over all ranks and steps
  compute imbalance  mean over steps of max/mean compute_cpu over ranks (measured)
  peak memory        max over ranks of mem_predicted and mem_measured (last step)
  cost model         per start: a [s/token], b [s/token²], c [s], calibrated or deck
and writes a PNG (default: TIMING with .png) with three panels: train and
validation loss over tokens; the mean step-time breakdown per rank as stacked
bars (one segment per category, "other" = total minus the categories); and the
imbalance metrics over steps.
Exit status 1 with "plot_timing.py: error: ..." when the file is missing or not
a timing log.
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

try:
    import h5py  # noqa: E402
except ImportError:  # pragma: no cover
    sys.exit("plot_timing.py: error: h5py is not installed (apt install python3-h5py)")


def die(msg):
    print(f"plot_timing.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def load(path):
    if not os.path.isfile(path):
        die(f"{path}: no such file")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        die(f"{path}: not an HDF5 file ({e})")
    with f:
        if "steps" not in f:
            die(f"{path}: no /steps table (not a wlb4d timing log)")
        steps = f["steps"][()]
        restarts = f["restarts"][()] if "restarts" in f else None
    if steps.size == 0:
        die(f"{path}: /steps is empty (no step recorded)")
    # Last row wins per (step, rank): walk backwards and keep first occurrences.
    keys = steps["step"].astype(np.int64) * (1 << 20) + steps["rank"].astype(np.int64)
    _, idx = np.unique(keys[::-1], return_index=True)
    keep = np.sort(len(keys) - 1 - idx)
    return steps[keep], restarts


def summarise(rows):
    names = rows.dtype.names
    cats = [n for n in names if n.startswith("t_") and n != "t_total"]
    step_ids = np.unique(rows["step"])
    ranks = np.unique(rows["rank"])
    step_time = np.array([rows["t_total"][rows["step"] == s].max() for s in step_ids])
    first = np.array([np.flatnonzero(rows["step"] == s)[0] for s in step_ids])
    tokens = rows["tokens"][first].astype(np.float64)
    gflops = rows["gflops"][first]
    total_time = step_time.sum()
    bubble = rows["t_p2p_wait"].sum() / rows["t_total"].sum() if rows["t_total"].sum() > 0 else 0.0
    return {
        "cats": cats,
        "steps": step_ids,
        "ranks": ranks,
        "step_time": step_time,
        "first": first,
        "median": float(np.median(step_time)),
        "tokens_per_s": tokens.sum() / total_time if total_time > 0 else 0.0,
        "gflops": float((gflops * step_time).sum() / total_time) if total_time > 0 else 0.0,
        "bubble": float(bubble),
        "tokens": tokens,
        "cpu_imbalance": cpu_imbalance(rows, step_ids),
    }


def cpu_imbalance(rows, step_ids):
    """Mean over steps of max/mean compute CPU time over ranks; None if not recorded."""
    if "compute_cpu" not in rows.dtype.names:
        return None
    r = []
    for s in step_ids:
        c = rows["compute_cpu"][rows["step"] == s]
        if c.mean() > 0:
            r.append(c.max() / c.mean())
    return float(np.mean(r)) if r else None


def plot(rows, s, out):
    fig, ax = plt.subplots(1, 3, figsize=(17, 4.8))
    # 1. Loss over tokens (cumulative tokens at the end of each step).
    tok = np.cumsum(s["tokens"])
    loss = rows["loss"][s["first"]]
    ax[0].plot(tok, loss, label="train", color="tab:blue")
    val = rows["val_loss"][s["first"]]
    has_val = val >= 0
    if has_val.any():
        ax[0].plot(tok[has_val], val[has_val], "o-", label="validation", color="tab:orange")
    ax[0].set_xlabel("tokens")
    ax[0].set_ylabel("loss (nats/token)")
    ax[0].set_title("loss")
    ax[0].legend()
    ax[0].grid(alpha=0.3)
    # 2. Mean step-time breakdown per rank, stacked.
    ranks = s["ranks"]
    bottom = np.zeros(len(ranks))
    cmap = plt.get_cmap("tab20")
    for k, c in enumerate(s["cats"] + ["other"]):
        if c == "other":
            summed = sum(rows[x] for x in s["cats"])
            vals = np.array([np.maximum(rows["t_total"] - summed, 0)[rows["rank"] == r].mean() for r in ranks])
        else:
            vals = np.array([rows[c][rows["rank"] == r].mean() for r in ranks])
        if not vals.any():
            continue
        ax[1].bar(ranks, vals, bottom=bottom, label=c[2:] if c != "other" else c, color=cmap(k % 20))
        bottom += vals
    ax[1].set_xlabel("rank")
    ax[1].set_ylabel("mean seconds per step")
    ax[1].set_title("step time by category")
    ax[1].set_xticks(ranks)
    ax[1].legend(fontsize=7, ncol=2)
    # 3. Imbalance over steps.
    for col in ("attn_imbalance", "latency_imbalance", "cp_imbalance"):
        ax[2].plot(s["steps"], rows[col][s["first"]], label=col.replace("_imbalance", ""))
    ax[2].xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax[2].set_xlabel("step")
    ax[2].set_ylabel("max / mean")
    ax[2].set_title("imbalance")
    ax[2].legend()
    ax[2].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Summarise and plot a wlb4d timing log.")
    ap.add_argument("timing", help="timing log (HDF5, log.timing_file)")
    ap.add_argument("-o", "--output", help="PNG to write (default: TIMING with .png)")
    a = ap.parse_args(argv)
    rows, restarts = load(a.timing)
    s = summarise(rows)
    out = a.output or os.path.splitext(a.timing)[0] + ".png"
    print(f"timing log         {a.timing}")
    print(f"steps              {len(s['steps'])} (ranks {len(s['ranks'])})")
    if restarts is not None and restarts.size:
        lay = ", ".join(f"step {r['step']}: dp={r['dp']} pp={r['pp']} cp={r['cp']} tp={r['tp']}" for r in restarts)
        print(f"starts             {restarts.size} ({lay})")
    print(f"median step time   {s['median']:.3f} s")
    print(f"tokens/s           {s['tokens_per_s']:.0f}")
    print(f"achieved GFLOP/s   {s['gflops']:.2f}")
    print(f"bubble share (p2p_wait / total)  {100 * s['bubble']:.1f} %")
    if s["cpu_imbalance"] is not None:
        print(f"compute imbalance  {s['cpu_imbalance']:.3f} (max/mean compute CPU time over ranks)")
    if "mem_measured" in rows.dtype.names:
        last = rows["step"] == rows["step"].max()
        print(f"peak memory        predicted {rows['mem_predicted'][last].max() / 2**20:.1f} MiB, measured "
              f"{rows['mem_measured'][last].max() / 2**20:.1f} MiB (Kokkos, max over ranks)")
    if restarts is not None and restarts.size and "cost_a" in restarts.dtype.names:
        for r in restarts:
            how = "calibrated" if r["cost_calibrated"] else "from deck"
            print(f"cost model         step {r['step']}: a={r['cost_a']:.3e} s/token b={r['cost_b']:.3e} s/token^2 "
                  f"c={r['cost_c']:.3e} s ({how})")
    plot(rows, s, out)
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
