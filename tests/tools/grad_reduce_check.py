#!/usr/bin/env python3
"""comm.grad_reduce_dtype through the main executable (bf16 gradient reduction).

  grad_reduce_check.py --wlb4d BIN --mpiexec MPIEXEC --deck DECK --workdir DIR [--steps N] [--key=value ...]

Runs DECK on 2 ranks at parallel.dp=2 in train.precision=bf16 three times:
no comm.grad_reduce_dtype key, comm.grad_reduce_dtype=fp32 and =bf16. Checks
  * the default is the fp32 reduction: its losses and grad norms equal the
    explicit fp32 run's bit for bit;
  * the bf16 run names the bf16 reduction in its start-up line and really
    rounds (some grad norm differs from the fp32 reduction's);
  * every step's loss within 1e-2 relative of the fp32-reduction run, and its
    grad norm within 1e-2 (bf16 tolerance, as the bf16 layout tests': rounding
    each rank's gradient and the pairwise sum adds ~2^-8 relative per element,
    the size of the bf16 GEMMs' own rounding; measured on ci-tiny, 12 steps:
    loss 2.1e-5, grad norm 3.3e-4).
Exit 0 when all hold; prints one line per check.
"""
import argparse
import csv
import os
import subprocess
import sys


def run(args, name, extra):
    cmd = [args.mpiexec, "-n", "2", args.wlb4d, args.deck, "--parallel.dp=2", "--parallel.pp=1", "--parallel.cp=1",
           "--parallel.tp=1", "--train.precision=bf16", f"--train.steps={args.steps}", f"--log.csv_file={name}.csv",
           "--log.timing_file=", "--checkpoint.at_end=false", "--checkpoint.resume=never"] + args.extra + extra
    p = subprocess.run(cmd, cwd=args.workdir, capture_output=True, text=True, timeout=args.timeout)
    log = p.stdout + p.stderr
    if p.returncode != 0:
        sys.exit(f"FAIL {name}: exit {p.returncode}\n{log[-4000:]}")
    out = {}
    with open(os.path.join(args.workdir, f"{name}.csv"), newline="") as f:
        for row in csv.DictReader(f):
            if int(row.get("rank", 0)) == 0:
                out[int(row["step"])] = (float(row["loss"]), float(row["grad_norm"]))
    return out, log


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wlb4d", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--deck", required=True)
    ap.add_argument("--workdir", default=".")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--timeout", type=int, default=300)
    args, args.extra = ap.parse_known_args()
    ok = True

    def check(cond, what):
        nonlocal ok
        print(("ok   " if cond else "FAIL ") + what)
        ok = ok and cond

    default, _ = run(args, "gradred-default", [])
    f32, _ = run(args, "gradred-fp32", ["--comm.grad_reduce_dtype=fp32"])
    b16, log = run(args, "gradred-bf16", ["--comm.grad_reduce_dtype=bf16"])
    check(sorted(default) == sorted(f32) == sorted(b16) and len(f32) == args.steps, f"{args.steps} steps each")
    check(all(default[s] == f32[s] for s in f32), "default = comm.grad_reduce_dtype=fp32 bit for bit")
    check("gradient reduction in bf16" in log, "the bf16 run names its reduction")
    check(any(b16[s][1] != f32[s][1] for s in f32), "bf16 reduction really rounds (grad norms differ)")
    wl = max(abs(b16[s][0] - f32[s][0]) / abs(f32[s][0]) for s in f32)
    wg = max(abs(b16[s][1] - f32[s][1]) / abs(f32[s][1]) for s in f32)
    check(wl <= 1e-2, f"loss within {wl:.2e} <= 1e-2 of the fp32 reduction at every step")
    check(wg <= 1e-2, f"grad norm within {wg:.2e} <= 1e-2 of the fp32 reduction at every step")
    last = max(f32)
    print(f"     step {last + 1}: loss fp32-reduce {f32[last][0]:.6f} bf16-reduce {b16[last][0]:.6f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
