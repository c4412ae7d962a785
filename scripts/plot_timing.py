#!/usr/bin/env python3
"""plot_timing.py — summarise and plot a wlb4d timing log (log.timing_file).

Usage: scripts/plot_timing.py TIMING.h5 [-o OUT.png] [--trace-step N]

Reads the table io::TimingLog writes (lib/include/wlb4d/io/timing_log.hpp):
  /steps     one row per (step, rank): step, rank, dp, pp, cp, tp,
             t_<category> (seconds: plan, data, forward, backward, p2p_wait,
             tp_comm, cp_comm, dp_reduce, optimizer, checkpoint, eval, total),
             loss, val_loss (-1: none), grad_norm, lr, tokens (whole step),
             local_tokens, gflops (whole job, this step), attn_imbalance,
             latency_imbalance, cp_imbalance, delay_mean, delay_max,
             compute_cpu (process CPU seconds of forward+backward, comm excluded),
             elapsed, tokens_seen, rss_mib, mfu (-1: no log.peak_tflops).
             t_total is the step alone; t_eval, t_checkpoint and t_sample
             (train.sample_every) are outside it.
             mem_predicted, mem_measured (bytes: memory model, Kokkos high-water
             mark so far), dp_exposed, dp_in_flight, tp_exposed, tp_in_flight
             (seconds: overlappable communication waited / outstanding),
             ca_cost_before, ca_cost_after, ca_imbalance_before, ca_imbalance,
             ca_bytes, ca_exposed
             (balance.attention=disaggregated; format_version 5; t_sample: 6)
  /restarts  one row per start of the trainer: step, dp, pp, cp, tp, unix_time,
             cost_a, cost_b, cost_c, cost_calibrated (the balancing cost model)
  /trace     (log.trace_step) one row per interval of the traced step:
             step, rank, stage, virtual_stage, micro_batch, kind (named by the
             attribute kind_names), peer, t0, t1 (seconds from the step's start);
             the pipeline actions (F, B, W, SendAct, RecvAct, SendGrad,
             RecvGrad) are drawn here; the TP/CP collective and phase rows
             (tp_comm, cp_comm, plan, data, ...) are in the trace JSON
             (log.trace_json, for ui.perfetto.dev) and not drawn
  attributes deck, program_version, start_time, layout, world_size, peak_tflops
After a resume from an older checkpoint a step can appear twice; the last
rows written for a (step, rank) win.

Prints a summary:
  median step time   median over steps of the step's wall time (max over ranks of t_total)
  tokens/s           Σ tokens / Σ step time
  achieved GFLOP/s   Σ (gflops · step time) / Σ step time   (model FLOP, whole job)
  bubble share       Σ t_p2p_wait / Σ t_total over all ranks and steps
  compute imbalance  mean over steps of max/mean compute_cpu over ranks (measured)
  peak memory        max over ranks of mem_predicted and mem_measured (last step)
  cost model         per start: a [s/token], b [s/token²], c [s], calibrated, deck or FLOP counts
  pipeline timeline  (with /trace) the traced step, action count, ranks, and the
                     bubble share: idle time between a rank's first and last
                     compute action over that span, mean over ranks
and writes a PNG (default: TIMING with .png) titled with the run's identity
(deck, layout, version, start date), with five panels, legends beside the
axes: train and validation loss over tokens; step time over steps (max over
ranks, evaluation and checkpoint apart); the mean step-time breakdown per rank
as stacked bars ("other" = total minus its categories; eval and checkpoint on
top, outside the total); the planner's imbalance metrics over steps next to the
measured compute imbalance (max/mean compute_cpu over ranks); and the pipeline
timeline of the traced step: one row per rank, F and B actions as bars (the
micro-batch number on each), messages as thin grey bars, gaps = the bubble.
Exit status 1 with "plot_timing.py: error: ..." when the file is missing or not
a timing log.
"""
import argparse
import os
import sys

# A pyenv/conda python3 first on PATH often lacks these: say which interpreter
# has them instead of a bare ModuleNotFoundError.
try:
    import matplotlib
    import numpy as np  # noqa: E402
    import h5py  # noqa: E402
except ImportError as e:  # pragma: no cover
    sys.exit(f"plot_timing.py: error: {sys.executable} has no module '{e.name}'. Run it with Debian's Python, "
             "which scripts/install-deps.sh provides (python3-matplotlib python3-h5py):\n"
             f"  /usr/bin/python3 {sys.argv[0]} {' '.join(sys.argv[1:])}\n"
             "or install them into this Python: python3 -m pip install matplotlib h5py numpy")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402


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
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        trace = None
        if "trace" in f:
            trace = f["trace"][()]
            kinds = f["trace"].attrs.get("kind_names", "F,B,SendAct,RecvAct,SendGrad,RecvGrad")
            attrs["kind_names"] = (kinds.decode() if isinstance(kinds, bytes) else str(kinds)).split(",")
    if steps.size == 0:
        die(f"{path}: /steps is empty (no step recorded)")
    # Last row wins per (step, rank): walk backwards and keep first occurrences.
    keys = steps["step"].astype(np.int64) * (1 << 20) + steps["rank"].astype(np.int64)
    _, idx = np.unique(keys[::-1], return_index=True)
    keep = np.sort(len(keys) - 1 - idx)
    return steps[keep], restarts, attrs, trace


def summarise(rows):
    names = rows.dtype.names
    # Parts of t_total (the step alone); eval and checkpoint lie outside it.
    cats = [n for n in names if n.startswith("t_") and n not in ("t_total", "t_eval", "t_checkpoint", "t_sample")]
    extra = [n for n in ("t_eval", "t_checkpoint", "t_sample") if n in names]
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
        "extra": extra,
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


def title_of(attrs, path):
    """The run's identity from the log's attributes (older logs: the file name)."""
    deck = os.path.basename(attrs.get("deck", "") or "") or "(no deck file)"
    parts = [f"deck {deck}"]
    for key, label in (("layout", ""), ("program_version", "wlb4d "), ("start_time", "started ")):
        if attrs.get(key):
            parts.append(label + str(attrs[key]))
    if attrs.get("peak_tflops"):
        parts.append(f"peak {attrs['peak_tflops']:g} TFLOP/s/device")
    return f"{os.path.basename(path)}: " + " | ".join(parts)


# /trace kinds that are pipeline actions (the timeline's bars); the other
# kinds (tp_comm, cp_comm, the step phases) are left to the Chrome trace JSON.
PIPELINE_ACTIONS = ["F", "B", "W", "SendAct", "RecvAct", "SendGrad", "RecvGrad"]


def pick_trace(trace, want):
    """Rows of the traced step `want` (1-based; None: the first traced step)."""
    if trace is None or trace.size == 0:
        return None, None
    steps = np.unique(trace["step"])
    step0 = steps[0] if want is None else want - 1
    if step0 not in steps:
        die(f"step {want} was not traced (traced: {', '.join(str(x + 1) for x in steps)}; see log.trace_step)")
    return int(step0) + 1, trace[trace["step"] == step0]


def bubble_share(rows, kinds):
    """Mean over ranks of idle time between the first and last compute action / that span."""
    shares = []
    for r in np.unique(rows["rank"]):
        mine = rows[rows["rank"] == r]
        comp = mine[np.isin([kinds[k] for k in mine["kind"]], ["F", "B", "W"])]
        if comp.size == 0:
            continue
        span = comp["t1"].max() - comp["t0"].min()
        busy = (comp["t1"] - comp["t0"]).sum()
        shares.append(1 - busy / span if span > 0 else 0.0)
    return float(np.mean(shares)) if shares else 0.0


# One colour per pipeline action kind, in every panel: the timeline's F, B, W
# and send/recv bars, and the step-time categories that time them (t_forward,
# t_backward = B + W, t_p2p_wait). No other series uses these colours.
ACTION_COLORS = {"F": "tab:blue", "B": "tab:orange", "W": "tab:green", "msg": "0.55"}
CATEGORY_COLORS = {"t_forward": ACTION_COLORS["F"], "t_backward": ACTION_COLORS["B"],
                   "t_p2p_wait": ACTION_COLORS["msg"],
                   # the step's other parts, and what runs apart from it (panel 2 uses the same)
                   "t_plan": "tab:pink", "t_data": "tab:olive", "t_tp_comm": "tab:cyan", "t_cp_comm": "tab:purple",
                   "t_dp_reduce": "tab:brown", "t_optimizer": "gold", "other": "0.85",
                   "t_eval": "darkviolet", "t_checkpoint": "tab:red", "t_sample": "teal"}
SPARE_COLORS = ["navy", "maroon", "darkgreen", "salmon", "khaki", "slategray"]


def category_color(name, k=0):
    """The colour of a step-time category (an unknown one: a spare colour by its index)."""
    return CATEGORY_COLORS.get(name, SPARE_COLORS[k % len(SPARE_COLORS)])


def legend_beside(a):
    a.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, borderaxespad=0)


def plot_timeline(a, step, rows, kinds):
    if rows is None:
        a.text(0.5, 0.5, "no pipeline trace in this log (set log.trace_step = N)", ha="center", va="center",
               transform=a.transAxes)
        a.set_axis_off()
        return
    colors = {k: v for k, v in ACTION_COLORS.items() if k != "msg"}
    seen = set()
    t_min = rows["t0"].min()
    for x in rows:
        k = kinds[x["kind"]]
        y = int(x["rank"])
        ms0, ms = (x["t0"] - t_min) * 1e3, (x["t1"] - x["t0"]) * 1e3
        if k in colors:
            lab = {"F": "forward (F)", "B": "backward (B)", "W": "weight grad (W)"}[k] if k not in seen else None
            seen.add(k)
            a.broken_barh([(ms0, ms)], (y - 0.35, 0.7), facecolor=colors[k], edgecolor="black", lw=0.4, label=lab)
            if ms > 0:
                a.text(ms0 + ms / 2, y, str(x["micro_batch"]), ha="center", va="center", fontsize=6, clip_on=True)
        else:
            lab = "send/recv" if "msg" not in seen else None
            seen.add("msg")
            a.broken_barh([(ms0, ms)], (y - 0.08, 0.16), facecolor=ACTION_COLORS["msg"], label=lab)
    ranks = np.unique(rows["rank"])
    stage = {int(x["rank"]): int(x["stage"]) for x in rows}
    a.set_yticks(ranks)
    a.set_yticklabels([f"rank {r} (stage {stage[int(r)]})" for r in ranks], fontsize=7)
    a.set_ylim(ranks.max() + 0.6, ranks.min() - 0.6)
    a.set_xlabel("ms since the step's start")
    a.set_title(f"pipeline timeline, step {step} (bubble {100 * bubble_share(rows, kinds):.0f} % of the compute span)")
    a.grid(alpha=0.3, axis="x")
    legend_beside(a)


def plot(rows, s, out, title, trace_step, trace_rows, kinds):
    fig = plt.figure(figsize=(19, 9.5))
    gs = fig.add_gridspec(2, 3)
    ax = [fig.add_subplot(gs[0, 0]), fig.add_subplot(gs[0, 1]), fig.add_subplot(gs[0, 2]),
          fig.add_subplot(gs[1, 0]), fig.add_subplot(gs[1, 1:])]
    fig.suptitle(title, fontsize=10)
    # 1. Loss over tokens (cumulative tokens at the end of each step).
    tok = np.cumsum(s["tokens"])
    loss = rows["loss"][s["first"]]
    ax[0].plot(tok, loss, label="train", color="black")
    val = rows["val_loss"][s["first"]]
    has_val = val >= 0
    if has_val.any():
        ax[0].plot(tok[has_val], val[has_val], "o-", label="validation", color=CATEGORY_COLORS["t_eval"])
    ax[0].set_xlabel("tokens")
    ax[0].set_ylabel("loss (nats/token)")
    ax[0].set_title("loss")
    legend_beside(ax[0])
    ax[0].grid(alpha=0.3)
    # 2. Step time over steps (max over ranks); evaluation and checkpoint apart.
    st_steps = s["steps"] + 1
    ax[1].plot(st_steps, s["step_time"] * 1e3, ".-", color="black", label="step (t_total)")
    for col, mk in (("t_eval", "v"), ("t_checkpoint", "s"), ("t_sample", "^")):
        colr = CATEGORY_COLORS[col]
        if col in rows.dtype.names:
            v = np.array([rows[col][rows["step"] == st].max() for st in s["steps"]])
            if v.any():
                ax[1].plot(st_steps[v > 0], v[v > 0] * 1e3, mk, color=colr, label=col[2:])
    ax[1].set_yscale("log")
    ax[1].xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax[1].set_xlabel("step")
    ax[1].set_ylabel("ms (max over ranks)")
    ax[1].set_title("step time")
    ax[1].grid(alpha=0.3)
    legend_beside(ax[1])
    ax = [ax[0], ax[2], ax[3], ax[4]]
    # 3. Mean step-time breakdown per rank, stacked.
    ranks = s["ranks"]
    bottom = np.zeros(len(ranks))
    for k, c in enumerate(s["cats"] + ["other"] + s["extra"]):
        if c == "other":
            summed = sum(rows[x] for x in s["cats"])
            vals = np.array([np.maximum(rows["t_total"] - summed, 0)[rows["rank"] == r].mean() for r in ranks])
        else:
            vals = np.array([rows[c][rows["rank"] == r].mean() for r in ranks])
        if not vals.any():
            continue
        ax[1].bar(ranks, vals, bottom=bottom, label=c[2:] if c != "other" else c, color=category_color(c, k))
        bottom += vals
    ax[1].set_xlabel("rank")
    ax[1].set_ylabel("mean seconds per step")
    ax[1].set_title("step time by category")
    ax[1].set_xticks(ranks)
    legend_beside(ax[1])
    # 4. Imbalance over steps: the planner's (cost model) next to the measured one.
    # The planner's three figures in black, told apart by marker and line
    # style: a colour would repeat one of the categories' (the palette is
    # full), and a reader would take it for that category.
    for col, style in (("attn_imbalance", "o-"), ("latency_imbalance", "s-."), ("cp_imbalance", "^:")):
        ax[2].plot(s["steps"] + 1, rows[col][s["first"]], style, color="black", ms=3, lw=0.8,
                   label="planner " + col.replace("_imbalance", ""))
    if "compute_cpu" in rows.dtype.names:
        meas = []
        for st in s["steps"]:
            c = rows["compute_cpu"][rows["step"] == st]
            meas.append(c.max() / c.mean() if c.mean() > 0 else np.nan)
        ax[2].plot(s["steps"] + 1, meas, "k--", label="measured compute\n(max/mean cpu over ranks)")
    ax[2].xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax[2].set_xlabel("step")
    ax[2].set_ylabel("max / mean")
    ax[2].set_title("imbalance")
    legend_beside(ax[2])
    ax[2].grid(alpha=0.3)
    # 5. Pipeline timeline of the traced step.
    plot_timeline(ax[3], trace_step, trace_rows, kinds)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Summarise and plot a wlb4d timing log.")
    ap.add_argument("timing", help="timing log (HDF5, log.timing_file)")
    ap.add_argument("-o", "--output", help="PNG to write (default: TIMING with .png)")
    ap.add_argument("--trace-step", type=int, help="traced step to draw (1-based; default: the first in /trace)")
    a = ap.parse_args(argv)
    rows, restarts, attrs, trace = load(a.timing)
    trace_step, trace_rows = pick_trace(trace, a.trace_step)
    s = summarise(rows)
    out = a.output or os.path.splitext(a.timing)[0] + ".png"
    print(f"timing log         {a.timing}")
    print(f"run                {title_of(attrs, a.timing)}")
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
            how = {1: "calibrated", 2: "FLOP counts"}.get(int(r["cost_calibrated"]), "from deck")
            print(f"cost model         step {r['step']}: a={r['cost_a']:.3e} s/token b={r['cost_b']:.3e} s/token^2 "
                  f"c={r['cost_c']:.3e} s ({how})")
    kinds = attrs.get("kind_names", [])
    if trace_rows is not None:
        # The timeline draws the pipeline actions; /trace's phase and TP/CP
        # collective rows are drawn by the trace JSON (log.trace_json).
        trace_rows = trace_rows[np.isin([kinds[k] for k in trace_rows["kind"]], PIPELINE_ACTIONS)]
        print(f"pipeline timeline  step {trace_step}: {trace_rows.size} actions on "
              f"{np.unique(trace_rows['rank']).size} ranks, bubble {100 * bubble_share(trace_rows, kinds):.1f} % "
              f"of the compute span")
    plot(rows, s, out, title_of(attrs, a.timing), trace_step, trace_rows, kinds)
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
