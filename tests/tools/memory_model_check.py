#!/usr/bin/env python3
"""Memory model vs measured peak, through the real trainer.

Runs `wlb4d DECK` for each (layout, feature) case below with a timing CSV, and
compares, per rank, the memory model's predicted peak (column mem_predicted,
pipeline::predict_memory) with the measured high-water mark of Kokkos
allocations (mem_measured, Kokkos Tools callbacks). Passes when every rank is
within --rtol (10 %) and each recompute feature lowers the measured peak by at
least --saving (70 %) of what the model predicts it saves.

Adding a case is one line in CASES; adding a saving check one line in SAVINGS.

  memory_model_check.py --wlb4d EXE --mpiexec MPIEXEC --deck inputs/ci-base.ini [--only NAME...]
"""
import argparse
import csv
import os
import subprocess
import sys
import time

# Every case: 2 steps of 4 micro-batches of 256 tokens of the ci-base model.
COMMON = ["--train.steps=2", "--train.max_seq_len=256", "--train.print_every=1"]

# (name, ranks, overrides)
CASES = [
    ("r1-1f1b-none",            1, []),
    ("r1-gpipe-none",           1, ["--parallel.schedule=gpipe"]),
    ("r1-gpipe-selective",      1, ["--parallel.schedule=gpipe", "--model.recompute=selective"]),
    ("r1-gpipe-full",           1, ["--parallel.schedule=gpipe", "--model.recompute=full"]),
    ("r1-gpipe-full-1layer",    1, ["--parallel.schedule=gpipe", "--model.recompute=full", "--model.recompute_layers=1"]),
    ("r1-wlb-selective",        1, ["--balance.packer=wlb", "--balance.max_tokens=384", "--model.recompute=selective"]),
    ("r2-pp2-gpipe-none",       2, ["--parallel.pp=2", "--parallel.schedule=gpipe"]),
    ("r2-pp2-1f1b-selective",   2, ["--parallel.pp=2", "--model.recompute=selective"]),
    ("r2-pp2-interleaved-full", 2, ["--parallel.pp=2", "--parallel.schedule=interleaved", "--parallel.virtual_stages=2",
                                    "--model.layers=4", "--model.recompute=full"]),
    ("r4-pp4-1f1b-full",        4, ["--parallel.pp=4", "--model.layers=4", "--model.recompute=full"]),
    ("r2-cp2-none",             2, ["--parallel.cp=2"]),
    ("r2-tp2-selective",        2, ["--parallel.tp=2", "--model.recompute=selective"]),
    ("r4-dp2-tp2-gpipe",        4, ["--parallel.dp=2", "--parallel.tp=2", "--parallel.schedule=gpipe"]),
    ("r8-pp2-cp2-tp2-full",     8, ["--parallel.pp=2", "--parallel.cp=2", "--parallel.tp=2", "--model.recompute=full"]),
    ("r2-dp2-gpipe",            2, ["--parallel.dp=2", "--parallel.schedule=gpipe"]),
    ("r2-dp2-gpipe-zero1",      2, ["--parallel.dp=2", "--parallel.schedule=gpipe", "--parallel.zero=1"]),
    ("r4-dp2-cp2-zero1",        4, ["--parallel.dp=2", "--parallel.cp=2", "--parallel.zero=1"]),
    ("r2-tp2-gpipe",            2, ["--parallel.tp=2", "--parallel.schedule=gpipe"]),
    ("r2-tp2-gpipe-sp",         2, ["--parallel.tp=2", "--parallel.schedule=gpipe", "--parallel.sequence_parallel=true"]),
    ("r2-pp2-zb1-none",         2, ["--parallel.pp=2", "--parallel.schedule=zb1"]),
    ("r2-pp2-zb1-full",         2, ["--parallel.pp=2", "--parallel.schedule=zb1", "--model.recompute=full"]),
    ("r4-cp2-tp2-sp-full",      4, ["--parallel.cp=2", "--parallel.tp=2", "--parallel.sequence_parallel=true",
                                    "--model.recompute=full"]),
    # train.precision = bf16: weight copies and the rounded-operand workspace.
    ("r1-1f1b-bf16",            1, ["--train.precision=bf16"]),
    ("r2-pp2-bf16",             2, ["--parallel.pp=2", "--train.precision=bf16"]),
    ("r2-tp2-sp-bf16",          2, ["--parallel.tp=2", "--parallel.sequence_parallel=true", "--train.precision=bf16"]),
]

# (baseline case, feature case): measured saving >= --saving x predicted saving.
SAVINGS = [
    ("r1-gpipe-none", "r1-gpipe-selective"),
    ("r1-gpipe-none", "r1-gpipe-full"),
    ("r1-gpipe-none", "r1-gpipe-full-1layer"),
    ("r2-dp2-gpipe", "r2-dp2-gpipe-zero1"),
    ("r2-tp2-gpipe", "r2-tp2-gpipe-sp"),
]


def run_case(args, name, ranks, overrides):
    csv_path = os.path.join(args.workdir, f"mem-{name}.csv")
    if os.path.exists(csv_path):
        os.remove(csv_path)
    cmd = ([args.mpiexec, "-n", str(ranks)] if ranks > 1 else []) + [args.wlb4d, args.deck] + COMMON + overrides + [
        f"--log.csv_file={csv_path}"]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=args.workdir, capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        sys.stdout.write(p.stdout + p.stderr)
        raise SystemExit(f"{name}: wlb4d exited with {p.returncode}: {' '.join(cmd)}")
    rows = list(csv.DictReader(open(csv_path)))
    last = max(int(r["step"]) for r in rows)
    per_rank = {int(r["rank"]): (float(r["mem_predicted"]), float(r["mem_measured"]), int(r["pp"]), int(r["tp"]))
                for r in rows if int(r["step"]) == last}
    if len(per_rank) != ranks:
        raise SystemExit(f"{name}: {len(per_rank)} ranks in {csv_path}, expected {ranks}")
    return per_rank, time.time() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wlb4d", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--deck", required=True)
    ap.add_argument("--workdir", default=".")
    ap.add_argument("--rtol", type=float, default=0.10)
    ap.add_argument("--saving", type=float, default=0.70)
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    results, failures = {}, []
    print(f"{'case':<26} {'rank':>4} {'pp':>3} {'tp':>3} {'predicted_B':>12} {'measured_B':>12} {'error':>7}")
    for name, ranks, overrides in CASES:
        if args.only and name not in args.only:
            continue
        per_rank, secs = run_case(args, name, ranks, overrides)
        results[name] = per_rank
        for r, (pred, meas, pp, tp) in sorted(per_rank.items()):
            err = pred / meas - 1 if meas > 0 else float("inf")
            flag = "" if abs(err) <= args.rtol else "  <-- off by more than rtol"
            print(f"{name:<26} {r:>4} {pp:>3} {tp:>3} {pred:>12.0f} {meas:>12.0f} {err:>+7.1%}{flag}")
            if flag:
                failures.append(f"{name} rank {r}: predicted {pred:.0f} B, measured {meas:.0f} B ({err:+.1%})")
    for base, feat in SAVINGS:
        if base not in results or feat not in results:
            continue
        pred_s = results[base][0][0] - results[feat][0][0]
        meas_s = results[base][0][1] - results[feat][0][1]
        ok = pred_s > 0 and meas_s >= args.saving * pred_s
        print(f"saving {feat} vs {base}: predicted {pred_s:.0f} B, measured {meas_s:.0f} B "
              f"({meas_s / pred_s if pred_s else 0:.1%} of predicted){'' if ok else '  <-- too small'}")
        if not ok:
            failures.append(f"{feat}: measured saving {meas_s:.0f} B < {args.saving:.0%} of predicted {pred_s:.0f} B")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print(f"ok: {sum(len(v) for v in results.values())} rank results within {args.rtol:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
