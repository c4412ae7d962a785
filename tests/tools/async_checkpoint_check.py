#!/usr/bin/env python3
"""Asynchronous checkpoints (checkpoint.async) through the main executable.

  async_checkpoint_check.py SCENARIO --wlb4d BIN --ckpt WLB4D_CKPT --mpiexec MPIEXEC --deck DECK --workdir DIR

Scenarios (DECK is ci-tiny; 2 ranks at pp=2 unless said, so both stages write):
  same      the same 20 steps with a checkpoint every 5, synchronous and
            asynchronous: every checkpoint's datasets (/model, /optim, /state)
            equal bit for bit, both CSVs' losses equal, every async file
            verifies (wlb4d-ckpt verify) and `latest` lists the same files;
            the async run's step lines show the background write ("ckpt write
            N ms (background)") and its timing CSV the ckpt_write column; a
            resume from the async step-10 checkpoint reproduces steps 11..20
            of the uninterrupted run bit for bit.
  kill      the step-10 checkpoint's writer thread of rank 1 is killed by
            SIGKILL inside the write (WLB4D_FAULT=crash:rank=1:step=10:
            phase=ckpt_save): the job fails, `latest` still names step 5,
            which verifies; no step-10 file is committed.
  usr1      1 rank, 500 steps: the step-5 writer thread is held 3 s inside the
            write (WLB4D_FAULT=delay:rank=0:phase=ckpt_save:seconds=3:step=5),
            SIGUSR1 arrives meanwhile (a periodic save due meanwhile waits for
            the held one): the run finishes the writes, writes its stop
            checkpoint, exits 0; `latest` names the stop checkpoint of the
            last step run first and lists step 5; all verify.
  funneled  WLB4D_MPI_THREADS=funneled (MPI without MPI_THREAD_MULTIPLE): one
            message on rank 0 naming the level, checkpoints written
            synchronously and bit-identical to the sync run's.
Exit 0 when all hold; prints one line per check.
"""
import argparse
import csv
import os
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out


def losses(path):
    with open(path, newline="") as f:
        return {(int(r["step"]), int(r["rank"])): (r["loss"], r["grad_norm"], r.get("ckpt_write", "0"))
                for r in csv.DictReader(f)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=["same", "kill", "usr1", "funneled"])
    ap.add_argument("--wlb4d", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--deck", required=True)
    ap.add_argument("--workdir", default=".")
    ap.add_argument("--timeout", type=int, default=300)
    a = ap.parse_args()
    wd = os.path.join(a.workdir, f"async-{a.scenario}")
    shutil.rmtree(wd, ignore_errors=True)
    os.makedirs(wd)
    ok = True

    def check(cond, what):
        nonlocal ok
        print(("ok   " if cond else "FAIL ") + what)
        ok = ok and cond

    def run(name, extra, ranks=2, env=None, expect_ok=True):
        cmd = ([a.mpiexec, "-n", str(ranks)] if ranks > 1 else []) + [
            a.wlb4d, a.deck, "--data.train=" + os.path.abspath(os.path.join(a.workdir, "tiny-train.h5")),
            f"--parallel.pp={ranks}", "--train.steps=20", "--checkpoint.every=5", "--checkpoint.keep=10",
            f"--checkpoint.dir=ck-{name}", "--checkpoint.overwrite=true",
            "--log.timing_file=", f"--log.csv_file={name}.csv", "--train.print_every=1"] + extra
        if not any(x.startswith("--checkpoint.resume=") for x in extra):
            cmd.append("--checkpoint.resume=never")
        p = subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=a.timeout,
                           env=dict(os.environ, **(env or {})))
        log = p.stdout + p.stderr
        if expect_ok and p.returncode != 0:
            sys.exit(f"FAIL {name}: exit {p.returncode}\n{log[-4000:]}")
        return p.returncode, log

    def verify(path):
        return subprocess.run([a.ckpt, "verify", path], capture_output=True, text=True).returncode == 0

    def latest(name):
        with open(os.path.join(wd, f"ck-{name}", "latest")) as f:
            return f.read().split()

    def same_files(x, y, steps):
        bad = []
        for s in steps:
            p, q = (os.path.join(wd, f"ck-{n}", f"step_{s:06d}.h5") for n in (x, y))
            dp, dq = datasets(p), datasets(q)
            if dp.keys() != dq.keys() or any(not np.array_equal(dp[k], dq[k]) for k in dp):
                bad.append(s)
        return bad

    if a.scenario in ("same", "funneled"):
        run("sync", ["--checkpoint.async=false"])
        env = {"WLB4D_MPI_THREADS": "funneled"} if a.scenario == "funneled" else None
        _, log = run("async", ["--checkpoint.async=true"], env=env)
        bad = same_files("sync", "async", (5, 10, 15, 20))
        check(not bad, f"checkpoints of steps 5, 10, 15, 20 bit-identical to the synchronous run's (differ: {bad})")
        ls, la = losses(os.path.join(wd, "sync.csv")), losses(os.path.join(wd, "async.csv"))
        check(ls.keys() == la.keys() and all(ls[k][:2] == la[k][:2] for k in ls), "losses and grad norms equal")
        check(latest("sync") == latest("async"), f"`latest` lists the same files ({latest('async')})")
        if a.scenario == "funneled":
            check("checkpoint.async=true needs MPI_THREAD_MULTIPLE" in log and "MPI_THREAD_FUNNELED" in log
                  and log.count("needs MPI_THREAD_MULTIPLE") == 1, "one start-up message names the thread level")
            check("(background)" not in log, "no background write: synchronous saves")
            return 0 if ok else 1
        check(all(verify(os.path.join(wd, "ck-async", f"step_{s:06d}.h5")) for s in (5, 10, 15, 20)),
              "every asynchronous checkpoint verifies")
        import re
        secs = [float(x) for x in re.findall(r"written \(step \d+; in the background: ([0-9.]+) s", log)]
        csv_sum = sum(float(v[2]) for k, v in la.items() if k[1] == 0)
        # The log prints each write to 0.01 s: its sum is off the CSV's by at
        # most half of that per write.
        check(len(secs) == 4 and "ckpt write" in log and "(background)" in log and abs(csv_sum - sum(secs)) <= 0.005 * len(secs) + 1e-6,
              f"the log names 4 background writes ({sum(secs):.2f} s) and the CSV's ckpt_write sums to them "
              f"({csv_sum:.2f} s)")
        run("resumed", ["--checkpoint.async=true",
                        f"--checkpoint.resume={os.path.join(wd, 'ck-async', 'step_000010.h5')}"], expect_ok=True)
        # the resumed run wrote into ck-resumed; compare its steps 11..20 with the uninterrupted run
        lr = losses(os.path.join(wd, "resumed.csv"))
        check(sorted({s for s, _ in lr}) == list(range(10, 20)) and all(lr[k][:2] == la[k][:2] for k in lr),
              "resumed from the async step-10 checkpoint: steps 11..20 equal bit for bit")
        check(not same_files("async", "resumed", (15, 20)), "its checkpoints of steps 15 and 20 equal too")
    elif a.scenario == "kill":
        rc, log = run("kill", ["--checkpoint.async=true"], env={"WLB4D_FAULT": "crash:rank=1:step=10:phase=ckpt_save"},
                      expect_ok=False)
        check(rc != 0 and "crashing at step 10 (fault point ckpt_save)" in log,
              f"rank 1 killed inside the step-10 write, the job failed (exit {rc})")
        check(latest("kill")[0] == "step_000005.h5", f"`latest` still names step 5 ({latest('kill')})")
        check(verify(os.path.join(wd, "ck-kill", "step_000005.h5")), "the step-5 checkpoint verifies")
        check(not os.path.exists(os.path.join(wd, "ck-kill", "step_000010.h5")), "no step-10 file was committed")
    else:  # usr1
        cmd = [a.wlb4d, a.deck, "--data.train=" + os.path.abspath(os.path.join(a.workdir, "tiny-train.h5")),
               "--train.steps=500", "--checkpoint.every=5", "--checkpoint.keep=10", "--checkpoint.dir=ck-usr1",
               "--checkpoint.resume=never", "--checkpoint.at_end=false", "--checkpoint.async=true",
               "--log.timing_file=", "--train.print_every=1"]
        env = dict(os.environ, WLB4D_FAULT="delay:rank=0:phase=ckpt_save:seconds=3:step=5")
        with open(os.path.join(wd, "usr1.log"), "w") as out:
            p = subprocess.Popen(cmd, cwd=wd, stdout=out, stderr=subprocess.STDOUT, env=env)
            t0 = time.time()
            while time.time() - t0 < 60:
                with open(os.path.join(wd, "usr1.log")) as f:
                    if "delaying at step 5 (fault point ckpt_save)" in f.read():
                        break
                time.sleep(0.05)
            time.sleep(0.5)  # training goes on meanwhile
            p.send_signal(signal.SIGUSR1)
            rc = p.wait(timeout=a.timeout)
        with open(os.path.join(wd, "usr1.log")) as f:
            log = f.read()
        check("delaying at step 5 (fault point ckpt_save)" in log, "the step-5 write was held in the writer thread")
        check(rc == 0 and "stop requested" in log, f"SIGUSR1 during the write: graceful stop, exit {rc}")
        lt = latest("usr1")
        import re
        last = max(int(m) for m in re.findall(r"step +(\d+)/500", log))
        check(lt and lt[0] == f"step_{last:06d}.h5" and "step_000005.h5" in lt[1:],
              f"`latest` names the stop checkpoint of step {last} first, and step 5 ({lt})")
        check(all(verify(os.path.join(wd, "ck-usr1", n)) for n in lt), "every listed checkpoint verifies")
        check("step_000005.h5 written (step 5; in the background" in log, "the held write completed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
